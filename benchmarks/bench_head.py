"""Head-only training on the body's features computed once (`pflrepro.core.training.head_only`) against every step
through the whole model, per training call, in the same run.

FedRep's and FedBSD's head phase and the "+FT" baselines' head fine-tuning train only the last layer of a body that
has no dropout and no BatchNorm. Since 2026-11-28 such a call runs the body once over the client's data and trains
the head on those features (the same batches, order and optimiser). This script times, at one torch thread (a
`dvc repro` worker's), for each model one head-only call as the mini profiles make it:
- `per_client`: `local_train` (one client);
- `batched`: `local_train_many` (4 clients, FedBSD Table 1 mini's clients a round);
each through the fast path (`features`) and through the whole model (`full`: the same cross-entropy under another
name, which `head_only` does not recognise), fastest of R, the ratio full / features (above 1: the features path
is faster), and the largest difference between the two paths' trained heads (float rounding of the body's sums).

    python benchmarks/bench_head.py            # the mini's models, 5 head epochs of 200 samples at B = 10
    python benchmarks/bench_head.py --quick    # LeNet only, 1 epoch (tests/test_benchmarks.py)
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from pflrepro.core.engines import local_train_many
from pflrepro.core.training import batchable, ce_loss, local_train
from pflrepro.data.models import build_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cli import parser, torch_threads  # noqa: E402
from _table import write_table  # noqa: E402
from bench_bounds import best_of  # noqa: E402

MODELS = ("cnn_cifar10", "cnn_ckt", "cnn1", "mlp2")
BATCH, CLIENTS = 10, 4   # FedBSD Table 1 mini: B = 10, 4 clients a round
COLUMNS = ("model", "path", "clients", "steps", "full_ms", "features_ms", "ratio", "max_abs_diff")


@batchable
def full_ce(m, x, y, aux=None):
    """The cross-entropy under another name: training takes the whole-model path."""
    return F.cross_entropy(m(x), y)


def _is_head(name: str) -> bool:
    return name.startswith("head.")


def measure(name: str, n: int, epochs: int, repeats: int) -> list[dict]:
    torch.manual_seed(0)
    net = build_model(name, 1, 10, 28)
    starts = [{k: v + 0.01 * torch.randn_like(v) for k, v in net.state_dict().items()} for _ in range(CLIENTS)]
    x, y = torch.randn(CLIENTS * n, 1, 28, 28), torch.randint(0, 10, (CLIENTS * n,))
    kw = dict(epochs=epochs, batch_size=BATCH, lr=0.05, momentum=0.9, weight_decay=1e-4, trainable=_is_head)
    index = [torch.arange(i * n, (i + 1) * n) for i in range(CLIENTS)]

    def one(loss):
        net.load_state_dict(starts[0])
        local_train(net, x[:n], y[:n], loss=loss, seed=1, **kw)
        return {k: v.clone() for k, v in net.head.state_dict().items()}

    def many(loss):
        out = local_train_many(net, starts, x, y, index, loss=loss, seeds=list(range(1, CLIENTS + 1)), **kw)
        return {k: torch.stack([s[f"head.{k}"] for s, _ in out]) for k in ("weight", "bias")}

    rows = []
    for path, fn, clients in (("per_client", one, 1), ("batched", many, CLIENTS)):
        t = {lbl: best_of(lambda loss=loss: fn(loss), repeats, 1) * 1e3
             for lbl, loss in (("full", full_ce), ("features", ce_loss))}
        a, b = fn(full_ce), fn(ce_loss)
        diff = max((a[k] - b[k]).abs().max().item() for k in a)
        rows.append({"model": name, "path": path, "clients": clients, "steps": epochs * -(-n // BATCH),
                     "full_ms": round(t["full"], 2), "features_ms": round(t["features"], 2),
                     "ratio": round(t["full"] / t["features"], 2), "max_abs_diff": f"{diff:.1e}"})
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    a = parser(__doc__, "LeNet only, one epoch (seconds)", 3).parse_args(argv)
    models, epochs = (MODELS[:1], 1) if a.quick else (MODELS, 5)
    with torch_threads(a.threads):   # in-process callers (the test) get their thread count back
        rows = [r for m in models for r in measure(m, 200, epochs, a.repeats)]
    write_table(Path(a.out), "bench_head", list(COLUMNS), rows,
                f"torch {torch.__version__}, {a.threads} thread(s), fastest of {a.repeats}; ratio = full / features "
                f"(above 1: the features path is faster); 200 samples a client at B = {BATCH}")
    return rows


if __name__ == "__main__":
    main()
