"""One batched training step through `core.engines.grouped` (convolutions and max-pooling of all clients as one channels-last
kernel) against the same step as `vmap` runs the plain layers, in the same run: the measurements behind
`grouped.GROUPED_MIN_CLIENTS`, `grouped.GROUPED_MIN_ROWS` and `grouped.MEASURED_LAYERS`.

For each model and (clients, batch size), at one torch thread (a `dvc repro` worker's): per-client gradients and
losses of a cross-entropy step (ordinary autograd over `vmap(loss)`, what the batched engine calls each step) through
the module (`vmap_ms`) and through `grouped.twin(module)` (`grouped_ms`), fastest of R blocks of 10 steps, the ratio
vmap / grouped (above 1: the grouped kernels are faster), what `grouped.pays` decides there, and each path's gradient
error against the same gradients computed client by client in float64 (`_error`; float32 rounding is about 1e-6).

    python benchmarks/bench_grouped.py            # the mini's CNNs over the grid below (~1 minute)
    python benchmarks/bench_grouped.py --quick    # LeNet, two sizes (tests/test_benchmarks.py)
"""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

from pflrepro.core.engines import grouped
from pflrepro.core.engines.many import losses_and_grads
from pflrepro.data.models import build_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cli import parser, torch_threads  # noqa: E402
from _table import write_table  # noqa: E402
from bench_bounds import best_of  # noqa: E402

MODELS = ("cnn_cifar10", "cnn_ckt", "cnn1")
# (clients, batch size): FedBSD's 4 clients at B = 10, pFedSD's 20 at B = 16, SCD's and PerFed-CKT's B = 32, and
# the sizes around the thresholds (one client; the smallest steps)
GRID = ((1, 10), (1, 32), (2, 5), (2, 10), (4, 10), (8, 10), (4, 32), (8, 16), (20, 10), (10, 16), (20, 16), (10, 32),
        (20, 32), (20, 64))
COLUMNS = ("model", "clients", "batch", "rows", "vmap_ms", "grouped_ms", "ratio", "pays", "vmap_err", "grouped_err")


def _step(net):
    """One step as `batched._Gradients` takes it: ordinary autograd over the `vmap`ped per-client losses."""
    losses = vmap(lambda p, xb, yb: F.cross_entropy(functional_call(net, p, (xb,)), yb))

    def step(params, x, y):
        g, _, v = losses_and_grads(losses, params, x, y)
        return g, v
    return step


def _error(g: dict, net, params: dict, x, y) -> float:
    """The median over clients of a client's largest gradient error against the same gradients in float64 (relative
    to that parameter's largest float64 gradient). The median, because at a kink (a ReLU at 0, tied maxima of a
    pooling window) float32 and float64 may take different subgradients, in either path, for a rare client."""
    ref_net = copy.deepcopy(net).double()
    errs = []
    for k in range(len(x)):
        p = {n: t[k].double() for n, t in params.items()}
        ref = grad(lambda p: F.cross_entropy(functional_call(ref_net, p, (x[k].double(),)), y[k]))(p)
        errs.append(max(((g[n][k].double() - ref[n]).abs().max() / ref[n].abs().max()).item() for n in ref))
    return float(torch.tensor(errs).median())


def measure(name: str, clients: int, batch: int, repeats: int) -> dict:
    torch.manual_seed(0)
    net = build_model(name, 1, 10, 28)
    params = {n: p.detach() + 0.01 * torch.randn(clients, *p.shape) for n, p in net.named_parameters()}
    x, y = torch.randn(clients, batch, 1, 28, 28), torch.randint(0, 10, (clients, batch))
    plain, twin = _step(net), _step(grouped.twin(net))
    a, b = plain(params, x, y)[0], twin(params, x, y)[0]
    t_plain = best_of(lambda: plain(params, x, y), repeats, 10)
    t_twin = best_of(lambda: twin(params, x, y), repeats, 10)
    return {"model": name, "clients": clients, "batch": batch, "rows": clients * batch,
            "vmap_ms": round(t_plain * 1e3, 2), "grouped_ms": round(t_twin * 1e3, 2),
            "ratio": round(t_plain / t_twin, 2), "pays": grouped.pays(net, x, clients, batch),
            "vmap_err": f"{_error(a, net, params, x, y):.1e}", "grouped_err": f"{_error(b, net, params, x, y):.1e}"}


def main(argv: list[str] | None = None) -> list[dict]:
    a = parser(__doc__, "LeNet at two sizes (seconds)", 3).parse_args(argv)
    models, grid = (MODELS[:1], ((4, 10), (20, 16))) if a.quick else (MODELS, GRID)
    with torch_threads(a.threads):
        rows = [measure(m, c, b, a.repeats) for m in models for c, b in grid]
    write_table(Path(a.out), "bench_grouped", list(COLUMNS), rows,
                f"torch {torch.__version__}, {a.threads} thread(s), fastest of {a.repeats} blocks of 10 steps; "
                f"ratio = vmap / grouped (above 1: grouped is faster); "
                f"GROUPED_MIN_CLIENTS = {grouped.GROUPED_MIN_CLIENTS}, GROUPED_MIN_ROWS = {grouped.GROUPED_MIN_ROWS}")
    return rows


if __name__ == "__main__":
    main()
