"""Image batches in NCHW against channels-last (`pflrepro.core.training.cpu_layout`), per training step and per
scored batch, for the registry's models that the mini profiles train, in the same run.

Since 2026-11-28 `local_train`, `predict` and `outputs` hand the model CPU image batches in channels-last memory
order (the same values, strided NHWC): oneDNN then runs every convolution and max-pooling in NHWC. This script
times, at one torch thread (a `dvc repro` worker's), for each model and batch size:
- `step`: one SGD step (forward, cross-entropy, backward, momentum update) on a batch, as `local_train` takes it;
- `score`: one forward pass under `no_grad` and the argmax, as `predict` scores a client's test set;
each with the batch as it comes (`nchw`) and through `cpu_layout` (`cl`), fastest of R repeats of N calls, and the
ratio nchw / cl (above 1: channels-last is faster). It also reports whether the two layouts gave the same
predictions (they may differ in the last bits of a logit, so an argmax can flip where two logits tie that closely).

    python benchmarks/bench_layout.py             # the mini's models, B in {10, 16, 32, 64}, score on {20, 200, 2048}
    python benchmarks/bench_layout.py --quick     # one model, one size each (tests/test_benchmarks.py)
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from pflrepro.core.training import cpu_layout
from pflrepro.data.models import build_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cli import parser, torch_threads  # noqa: E402
from _table import write_table  # noqa: E402
from bench_bounds import best_of  # noqa: E402

MODELS = ("cnn_cifar10", "cnn_ckt", "cnn1", "cnn_bn", "cnn_fmnist", "mlp2")
COLUMNS = ("model", "kind", "batch", "nchw_ms", "cl_ms", "ratio", "same_predictions")


def _fastest(fn, repeats: int, calls: int) -> float:
    """Milliseconds a call, fastest of `repeats` runs of `calls` calls (bench_bounds.best_of)."""
    return best_of(fn, repeats, calls) * 1e3


def _step_fn(name: str, batch: int, layout):
    torch.manual_seed(0)
    net = build_model(name, 1, 10, 28)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(net(layout(x)), y).backward()
        opt.step()
    return step


LAYOUTS = (("nchw", lambda v: v), ("cl", cpu_layout))


def _row(name: str, kind: str, batch: int, t: dict, same) -> dict:
    return {"model": name, "kind": kind, "batch": batch, "nchw_ms": round(t["nchw"], 3), "cl_ms": round(t["cl"], 3),
            "ratio": round(t["nchw"] / t["cl"], 2), "same_predictions": same}


def measure(name: str, steps: list[int], scores: list[int], repeats: int, calls: int) -> list[dict]:
    rows = [_row(name, "step", b, {lbl: _fastest(_step_fn(name, b, lay), repeats, calls) for lbl, lay in LAYOUTS}, "")
            for b in steps]
    torch.manual_seed(0)
    net = build_model(name, 1, 10, 28).eval()
    for n in scores:
        x = torch.randn(n, 1, 28, 28)
        with torch.no_grad():
            same = bool(torch.equal(net(x).argmax(1), net(cpu_layout(x)).argmax(1)))
            t = {lbl: _fastest(lambda lay=lay, x=x: net(lay(x)).argmax(1), repeats, max(1, calls * 20 // n))
                 for lbl, lay in LAYOUTS}
        rows.append(_row(name, "score", n, t, same))
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    a = parser(__doc__, "one model, one batch size each (seconds)", 3).parse_args(argv)
    models, steps, scores, calls = ((MODELS[:1], [16], [200], 5) if a.quick
                                    else (MODELS, [10, 16, 32, 64], [20, 200, 2048], 30))
    with torch_threads(a.threads):   # in-process callers (the test) get their thread count back
        rows = [r for m in models for r in measure(m, steps, scores, a.repeats, calls)]
    write_table(Path(a.out), "bench_layout", list(COLUMNS), rows,
                f"torch {torch.__version__}, {a.threads} thread(s), fastest of {a.repeats}; ratio = nchw / cl "
                f"(above 1: channels-last faster)")
    return rows


if __name__ == "__main__":
    main()
