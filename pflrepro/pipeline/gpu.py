"""A run's share of one GPU: capping its memory, and refusing up front a run that cannot fit in the share.

$PFLREPRO_GPU_FRACTION = f (0 < f <= 1) says a run may use the fraction f of its GPU's memory. The Ray executor sets it
in a task that reserves a fraction of a GPU (executor "ray:,gpus=0.25": four runs share one GPU, each with f = 0.25);
a local user may set it too (two notebooks sharing one GPU: 0.5 each). Unset, a run may use the whole GPU and nothing
here runs. It is an execution setting, never part of a run's address.

When the run's device is CUDA and f is set, `store.run`, after building the federation (the clients' data on the
device) and before round 1, calls `fit`:
- f < 1 caps this process's CUDA allocator at f (torch.cuda.set_per_process_memory_fraction): a run that outgrows its
  share then fails with CUDA's out-of-memory error instead of starving the runs beside it on the GPU;
- the run must fit in f x the GPU's memory: what is already allocated (the clients' data and the models), plus one
  client's training (pflrepro.core.engines.memory.client_bytes on the algorithm's plan for client 0; weights, gradients,
  momentum and activations at `batch_size`), plus every client's state as if each kept one model on the GPU (an upper
  bound: many algorithms keep none, or only a head). A run that does not is refused with a ConfigError giving the
  numbers, and store.run leaves nothing in the store for it.
"""
from __future__ import annotations

import contextlib
import os

import torch

from ..core.context import Plan
from ..core.engines import client_bytes, uses_plans
from ..federation.build import resolve_device
from ..params import ConfigError

FRACTION_ENV = "PFLREPRO_GPU_FRACTION"


def fraction() -> float | None:
    """The run's share of its GPU's memory from $PFLREPRO_GPU_FRACTION; None when unset (the whole GPU)."""
    raw = os.environ.get(FRACTION_ENV, "").strip()
    if not raw:
        return None
    try:
        f = float(raw)
    except ValueError:
        f = float("nan")
    if not 0 < f <= 1:
        raise ConfigError(f"{FRACTION_ENV}={raw!r}: a share of one GPU's memory, a number with 0 < f <= 1")
    return f


def device(name: str) -> torch.device:
    """A run's `device` resolved (federation.build.resolve_device: 'auto' is CUDA where available, else the CPU), with
    'cuda' on a machine without CUDA refused as a one-line ConfigError before anything is written."""
    try:
        return resolve_device(name)
    except RuntimeError:
        raise ConfigError(f"device={name!r}, but no CUDA device is available here: use device='auto' (CUDA where "
                          "available, else the CPU) or 'cpu'") from None


def is_cuda(device) -> bool:
    return torch.device(device).type == "cuda"


def apply_fraction(f: float | None, device=None) -> bool:
    """Cap this process's CUDA allocator at f of `device`'s memory (None: the current device) when 0 < f < 1 and
    CUDA is available; True when it did."""
    if f is None or not 0 < f < 1 or not torch.cuda.is_available():
        return False
    index = None if device is None else torch.device(device).index   # 'cuda' without an index: the current device
    torch.cuda.set_per_process_memory_fraction(float(f), index)
    return True


@contextlib.contextmanager
def share(f: float):
    """In a Ray task that reserves the fraction f of a GPU (0 < f < 1): the allocator is capped at f and the run sees
    $PFLREPRO_GPU_FRACTION = f (so store.run checks the fit); the variable is restored afterwards (Ray reuses its
    workers). A whole GPU or none (f = 0 or f >= 1) changes nothing."""
    if not 0 < f < 1:
        yield
        return
    old = os.environ.get(FRACTION_ENV)
    os.environ[FRACTION_ENV] = repr(float(f))
    apply_fraction(f)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(FRACTION_ENV, None)
        else:
            os.environ[FRACTION_ENV] = old


def _tensor_bytes(tree, cuda_only: bool = False) -> int:
    if isinstance(tree, torch.Tensor):
        return tree.numel() * tree.element_size() if (tree.is_cuda or not cuda_only) else 0
    if isinstance(tree, dict):
        return sum(_tensor_bytes(v, cuda_only) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return sum(_tensor_bytes(v, cuda_only) for v in tree)
    return 0


def need(ctx, algo, start: dict | None = None) -> dict:
    """Bytes the run needs on its GPU before round 1 (module doc): `data` (allocated now, less a resumed
    checkpoint's tensors), `training` (one client, client 0), `states` (n_clients x one model's state, an upper
    bound) and `total`. Measured on a fresh module under torch.random.fork_rng: the run's random streams and its
    cached modules are untouched, so its results do not change."""
    dev = ctx.device
    data = max(0, torch.cuda.memory_allocated(dev) - _tensor_bytes(start, cuda_only=True))
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        module = ctx.make_model(0).to(dev)
        state = {n: t.detach() for n, t in module.state_dict().items()}
        if uses_plans(algo):
            server = start["server"] if start else algo.server_init()
            first = int(start["round"]) + 1 if start else 1
            plan = algo.plan(first, 0, server, (start["clients"] if start else {}).get(0))
        else:   # a client_update of its own: plain training of client 0's model
            plan = Plan(start=state)
        training = client_bytes(module, plan, ctx.cfg.batch_size, ctx.data.x, ctx.data.y, ctx.data.train[0])["total"]
    states = ctx.data.n_clients * _tensor_bytes(state)
    del module, plan
    return {"data": data, "training": int(training), "states": states, "total": int(data + training + states)}


def _size(b: float) -> str:
    return f"{b / 2**30:.1f} GiB" if b >= 0.1 * 2**30 else f"{b / 2**20:.1f} MiB"


def fit(ctx, algo, start: dict | None = None) -> None:
    """store.run's check before round 1 (module doc): with a CUDA device and $PFLREPRO_GPU_FRACTION set, cap the
    allocator and refuse a run that needs more than its share, with the numbers."""
    f = fraction()
    if f is None or not is_cuda(ctx.device):
        return
    apply_fraction(f, ctx.device)
    total = torch.cuda.get_device_properties(ctx.device).total_memory
    cap, n = f * total, need(ctx, algo, start)
    if n["total"] > cap:
        raise ConfigError(
            f"GPU share {f:g} of {_size(total)} = {_size(cap)}, but this run needs about {_size(n['total'])} before "
            f"round 1 (data and models {_size(n['data'])} on the GPU, one client's training {_size(n['training'])} "
            f"at batch_size={ctx.cfg.batch_size}, {ctx.data.n_clients} clients' states at most {_size(n['states'])}):"
            f" raise gpus= (or ${FRACTION_ENV}), lower batch_size, or use fewer runs per GPU")
