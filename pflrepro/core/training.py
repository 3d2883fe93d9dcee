"""The local-training primitive and evaluation helpers.

Nothing else in the code base loops over batches: `local_train` is the one SGD loop (the batched
engine, pflrepro.core.engines.batched, trains many clients with the same steps and seeds)."""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..data.models import SplitModel

LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


class Divergence(RuntimeError):
    """Training produced a NaN/inf loss."""


# ---------------------------------------------------------------- loss terms
def batchable(fn):
    """Mark `fn` as a *batchable* loss term, `fn(m, x, y, aux) -> Tensor`:
    - `m` is a `ModelView`: `m(x)` runs the model being trained, `m.params` are its current
      parameters by name (for proximal terms), `m.run(state, x, train=...)` runs the same
      architecture with another state (a teacher);
    - `aux` is a dict of this client's tensors (the `Plan`'s `aux`, plus the batch's rows of its
      `per_sample` tensors).
    It must reach per-client tensors only through `aux` (never through Python objects it closes
    over), so that the batched engine (`pflrepro.core.engines.batched`) can run it for many clients at once
    under `torch.func.vmap`; closing over plain numbers (lambda, tau) is fine. Unmarked loss
    terms keep the older form `loss(net, x, y)` and train client by client."""
    fn.batchable = True
    return fn


def is_batchable(fn) -> bool:
    return bool(getattr(fn, "batchable", False))


@batchable
def ce_loss(net, x: torch.Tensor, y: torch.Tensor, aux: dict | None = None) -> torch.Tensor:
    """Cross-entropy: both a plain loss term (`ce_loss(net, x, y)`) and a batchable one."""
    return F.cross_entropy(net(x), y)


@contextlib.contextmanager
def train_mode(module: nn.Module, train: bool = True):
    """Every submodule in train (or eval) mode for the block; each one's own flag restored after."""
    was = [m.training for m in module.modules()]
    module.train(train)
    try:
        yield module
    finally:
        for m, w in zip(module.modules(), was):
            m.training = w


class ModelView:
    """The model as a batchable loss term sees it.

    Per client (`params=None`): a thin wrapper over the module being trained, so `m(x)` is
    exactly `net(x)`. Batched: `params`/`buffers` are one client's tensors inside `vmap`, and
    `m(x)` is `functional_call(module, (params, buffers), x)`."""

    def __init__(self, module: nn.Module, params: dict | None = None, buffers: dict | None = None):
        self.module = module
        self._params = params
        self._buffers = buffers
        self._buffer_names: set | None = None

    @property
    def params(self) -> dict:
        """Current parameters by name, in `named_parameters()` order (trainable and frozen)."""
        if self._params is None:
            self._params = dict(self.module.named_parameters())
        return self._params

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self._buffers is None:       # per client: the module itself
            return self.module(x)
        return torch.func.functional_call(self.module, (self._params, self._buffers), (x,))

    def run(self, state: dict, x: torch.Tensor, *, train: bool = False) -> torch.Tensor:
        """Forward of the same architecture with `state` (parameters and buffers, e.g. a teacher's),
        in train mode (dropout active, BN on batch statistics) or eval mode. `state` is never
        modified (BN running statistics, updated in train mode, go to copies)."""
        if self._buffer_names is None:
            self._buffer_names = {n for n, _ in self.module.named_buffers()}
        with train_mode(self.module, train):
            st = {n: (t.clone() if (train and n in self._buffer_names) else t) for n, t in state.items()}
            return torch.func.functional_call(self.module, st, (x,))


def has_conv(net: nn.Module) -> bool:
    """Whether `net` has a 2-D convolution (the only layers channels-last speeds up)."""
    return any(isinstance(m, nn.Conv2d) for m in net.modules())


def cpu_layout(x: torch.Tensor, net: nn.Module | None = None) -> torch.Tensor:
    """Image batches in channels-last memory order on the CPU (the same values, strided NHWC), everything else as
    it is; given `net`, only for a model with a convolution (an MLP only pays the copy: 0.88x in the repro).
    oneDNN then runs the convolutions and max-pooling of every layer in NHWC, which measured 1.05-1.63x per
    training step and 1.36-2.76x per scored batch for the CNNs of the repo (docs/performance.md, "Channels-last
    batches"); the sums are ordered differently, so results move at float rounding (1e-7 on logits). Not on CUDA:
    unmeasured. Row indexing keeps the layout, so a client's data is converted once, not each batch."""
    if x.dim() != 4 or x.device.type != "cpu" or (net is not None and not has_conv(net)):
        return x
    return x.to(memory_format=torch.channels_last)


# Rows a forward pass without gradients reads at once (`outputs`, `predict`, `body_features`). Small enough that a
# conv net's activations stay in the allocator's reused memory and the last-level cache: with 2,048 rows pFedSD's
# FMNIST CNN wrote a 295 MB conv1 output per chunk into freshly mapped pages, and scored 14,000 images 2.6x slower
# (docs/performance.md, "Clients side by side"). The logits are the same bits at 2,048, 128 and 64 rows for every
# registered model on this CPU (tests/test_forked.py checks a few).
EVAL_ROWS = 128


def _chunks(x: torch.Tensor, batch: int, net: nn.Module):
    """Rows of x in chunks of `batch`, each in the layout `net` runs fastest (`cpu_layout`, decided once per call;
    chunk by chunk, so a large test set is never copied whole)."""
    conv = has_conv(net)
    for i in range(0, len(x), batch):
        yield cpu_layout(x[i:i + batch]) if conv else x[i:i + batch]


# ---------------------------------------------------------------- a frozen body's features, computed once
# Layers whose output is a fixed function of each sample in train mode as in eval mode (no dropout draws, no
# batch statistics, no buffers): a body made of them gives the same features at every step of a call.
_FIXED = (nn.Conv2d, nn.Linear, nn.ReLU, nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.Flatten,
          nn.Sequential, nn.Identity, nn.Tanh)


def head_only(net: nn.Module, trainable: Callable[[str], bool] | None, loss, per_sample: dict | None = None):
    """`net.head` when a training call moves exactly the head's parameters of a `SplitModel` (forward =
    head(body(x))), with the plain cross-entropy and no per-sample tensors, and the body is made of `_FIXED`
    layers only; otherwise None. Then every step's forward through the frozen body computes the same features,
    so they can be computed once per call (FedRep's and FedBSD's head phase, the "+FT" baselines' head
    fine-tuning). The head sees the same samples in the same order, with the same optimiser; only the body's
    sums may round differently (its batch is the client's data instead of one mini-batch)."""
    if trainable is None or loss is not ce_loss or per_sample or not isinstance(net, SplitModel):
        return None
    if type(net).forward is not SplitModel.forward or type(net).features is not SplitModel.features:
        return None
    moved = {n for n, _ in net.named_parameters() if trainable(n)}
    if not moved or moved != {f"head.{n}" for n, _ in net.head.named_parameters()}:
        return None
    if any(not isinstance(m, _FIXED) for m in net.body.modules()) or next(net.body.buffers(), None) is not None:
        return None
    return net.head


@torch.no_grad()
def body_features(net: nn.Module, x: torch.Tensor, batch: int = EVAL_ROWS, state: dict | None = None) -> torch.Tensor:
    """The body's features of every row of x (`state`: the body's parameters to use instead of its own)."""
    body = net.body
    run = body if state is None else (lambda v: torch.func.functional_call(body, state, (v,)))
    return torch.cat([run(v) for v in _chunks(x, batch, net)])


# ---------------------------------------------------------------- local training
@dataclass
class TrainStats:
    loss: float                     # mean over every sample trained on
    steps: int
    samples: int
    last: float = float("nan")      # the last step's loss (FedALA's convergence test reads it)
    update_state: dict | None = None  # a custom step's tensors at the end (`Step`; None: SGD)


# ---------------------------------------------------------------- a custom optimiser step
# `update(params, grads, state, aux) -> (params, state)` replaces SGD for a call (`local_train(update=...)`,
# `Plan.update`): `params` and `grads` are one client's trainable parameters and their gradients by name, `state`
# the step's own tensors (`Plan.update_state`, e.g. FedALA's aggregation weights), `aux` the plan's aux. It returns
# the new parameters (the same names) and the new state, and owns the whole step: the run's momentum and weight decay
# do not apply (gradient clipping does, before it). Written as pure tensor code (no in-place change of its inputs,
# no `.item()`, no Python branch on a tensor's value), the batched engine runs it for many clients at once under
# `torch.func.vmap`; a projection (a clamp, a norm ball) is such code.


def decay_groups(names: list[str], weight_decay: float, bias_decay: bool) -> list[tuple[list[str], float]]:
    """Parameter names grouped by the weight decay SGD gives them: one group (every name, `weight_decay`)
    unless `bias_decay=False` exempts the parameters named `*bias*` (FedRep's code); empty groups dropped.
    Both training paths (`local_train`, `batched.local_train_many`) take their groups from here."""
    if bias_decay or weight_decay == 0:
        return [(list(names), weight_decay)]
    return [(g, wd) for g, wd in (([n for n in names if "bias" not in n], weight_decay),
                                  ([n for n in names if "bias" in n], 0.0)) if g]


def sgd_kernel(params: list) -> dict:
    """The SGD kernel `local_train` asks torch for: `fused` (one pass over each tensor per step: weight decay,
    momentum and the update in one kernel, what the batched engine's `sgd_update` calls) where torch has it for
    these tensors' device, else `foreach`. On the CPU `fused` measured 2.9x faster per update than `foreach`
    (DC-PFL's cnn1, momentum and weight decay); it rounds differently from the three-pass `foreach` form
    (docs/performance.md, "One pass per SGD update")."""
    dev = params[0].device.type if params else "cpu"
    return {"fused": True} if dev in FUSED_SGD_DEVICES else {"foreach": True}


FUSED_SGD_DEVICES = ("cpu", "cuda")


def clip_grad_norm(params: list, max_norm: float) -> None:
    """`nn.utils.clip_grad_norm_(params, max_norm)`, bit for bit, without its multiply by exactly 1.0 when the
    total norm is within `max_norm`: torch scales every gradient by min(max_norm / (norm + 1e-6), 1) on every
    step; x * 1.0 is x, so the pass is skipped when the factor is 1 (a NaN or infinite norm still scales)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    total = nn.utils.get_total_norm(grads, 2.0)
    if not bool(max_norm / (total + 1e-6) >= 1.0):
        nn.utils.clip_grads_with_norm_(params, max_norm, total)


def local_train(net: nn.Module, x: torch.Tensor, y: torch.Tensor, *, epochs: int, batch_size: int,
                lr: float, momentum: float = 0.0, weight_decay: float = 0.0, grad_clip: float = 0.0,
                bias_decay: bool = True, loss: LossFn = ce_loss, trainable: Callable[[str], bool] | None = None,
                seed: int = 0, steps: int | None = None, aux: dict | None = None, per_sample: dict | None = None,
                shuffle: bool = True, update=None, update_state: dict | None = None) -> TrainStats:
    """The local-training primitive: SGD on (x, y) minimising `loss(net, xb, yb)`.

    `trainable(name)` selects the parameters that move (others are frozen for this call);
    `seed` fixes the data order and dropout draws; `steps` (optional) caps the number of
    mini-batch steps instead of whole epochs; `bias_decay=False` exempts parameters named `*bias*` from
    `weight_decay` (FedRep's code). Batches are index slices of the client's
    tensors: no DataLoader. The last partial batch of an epoch is kept.
    A call that moves only the head over a fixed body (`head_only`) computes the body's features once and trains
    the head on them: the same batches, order and optimiser, one forward pass of the body instead of one a step.
    A batchable loss term (`batchable`) is called `loss(ModelView(net), xb, yb, aux_b)` instead,
    with aux_b = `aux` plus the batch's rows of each `per_sample` tensor.
    `shuffle=False` takes the batches in row order every epoch (a `DataLoader` without shuffling); `update` replaces
    SGD by a custom step (see "a custom optimiser step" above) starting from `update_state`; the stats carry its
    final state.
    `pflrepro.core.engines.many.local_train_many` is the same primitive for many clients at once.
    """
    head = head_only(net, trainable, loss, per_sample) if (shuffle and update is None) else None
    if head is not None and len(y):
        net.train()
        return local_train(head, body_features(net, x), y, epochs=epochs, batch_size=batch_size, lr=lr,
                           momentum=momentum, weight_decay=weight_decay, grad_clip=grad_clip, bias_decay=bias_decay,
                           seed=seed, steps=steps, aux=aux)
    named = [(n, p) for n, p in net.named_parameters() if trainable is None or trainable(n)]
    params = [p for _, p in named]
    frozen = [p for n, p in net.named_parameters() if trainable is not None and not trainable(n)]
    for p in frozen:
        p.requires_grad_(False)
    groups = [{"params": [p for n, p in named if n in g], "weight_decay": wd}
              for g, wd in decay_groups([n for n, _ in named], weight_decay, bias_decay)]
    opt = torch.optim.SGD(groups if params else params, lr=lr, momentum=momentum, weight_decay=weight_decay,
                          **sgd_kernel(params)) if update is None else None
    ustate = dict(update_state or {})
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # dropout / stochastic layers: per-client, per-round stream
    net.train()
    n = len(y)
    total, count, done, v = 0.0, 0, 0, float("nan")
    view = ModelView(net) if is_batchable(loss) else None
    aux, per_sample = aux or {}, per_sample or {}
    x = cpu_layout(x, net)
    try:
        for _ in range(epochs if steps is None else 10**9):
            order = (torch.randperm(n, generator=gen) if shuffle else torch.arange(n)).to(x.device)
            for s in range(0, n, batch_size):
                idx = order[s:s + batch_size]
                xb, yb = x[idx], y[idx]
                for p in params:
                    p.grad = None
                if view is not None:
                    value = loss(view, xb, yb, {**aux, **{n_: t[idx] for n_, t in per_sample.items()}}
                                 if per_sample else aux)
                else:
                    value = loss(net, xb, yb)
                v = value.item()
                if not math.isfinite(v):
                    raise Divergence(f"loss became {v} at local step {done}: the run diverged "
                                     f"(lower the learning rate, or check the loss term)")
                value.backward()
                if grad_clip > 0:
                    clip_grad_norm(params, grad_clip)
                if opt is not None:
                    opt.step()
                else:
                    ustate = _custom_step(update, named, ustate, aux)
                total += v * len(yb)
                count += len(yb)
                done += 1
                if steps is not None and done >= steps:
                    break
            if steps is not None and (n == 0 or done >= steps):
                break
    finally:
        for p in frozen:
            p.requires_grad_(True)
    return TrainStats(total / max(count, 1), done, count, v, ustate if update is not None else None)


@torch.no_grad()
def _custom_step(update, named: list, state: dict, aux: dict) -> dict:
    """One custom step (`update`) of the parameters `named` in place; returns the step's new state."""
    new, state = update({n: p.detach() for n, p in named},
                        {n: (p.grad if p.grad is not None else torch.zeros_like(p)) for n, p in named}, state, aux)
    for n, p in named:
        p.copy_(new[n])
    return state


@torch.no_grad()
def outputs(net: nn.Module, x: torch.Tensor, batch: int = EVAL_ROWS) -> torch.Tensor:
    """The model's raw outputs (logits) for every row of x, in eval mode, batched; the module's modes restored
    after (soft decisions on a public set, server-side distillation targets, losses of candidate models)."""
    with train_mode(net, False):
        return torch.cat([net(v) for v in _chunks(x, batch, net)])


@torch.no_grad()
def predict(net: nn.Module, x: torch.Tensor, batch: int = EVAL_ROWS) -> torch.Tensor:
    net.eval()
    return torch.cat([net(v).argmax(1) for v in _chunks(x, batch, net)]) if len(x) else \
        torch.empty(0, dtype=torch.long, device=x.device)


def accuracy(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    if len(y) == 0:
        return float("nan")
    return (predict(net, x) == y).float().mean().item()
