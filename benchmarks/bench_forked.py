"""Clients side by side (`pflrepro.core.forked`) and the evaluation's chunk of rows (`training.EVAL_ROWS`), each
against the code path it replaced, in the same run.

- `train`: one round's client-by-client training (C clients, each `local_train` on its own n samples, E epochs,
  batch B, its own seed, as `train_one` trains them) at T torch threads in this process (`serial`, what a T-thread
  run did before) against `fork_map` over T processes of one thread (`forked`, what it does now); ratio = serial /
  forked (above 1: forking is faster). `same_bits`: the forked clients' states equal the same clients trained here
  at one thread (what a one-thread run, e.g. a `dvc repro` worker, trains).
- `score`: `predict` on N images at 2,048 rows a chunk (the former default) against `EVAL_ROWS`, at T threads;
  ratio = 2048 / EVAL_ROWS; `same_bits`: the logits are equal.
Each timing is the fastest of R repeats.

    python benchmarks/bench_forked.py --threads 2      # pFedSD's FMNIST CNN (10 clients x 560, B = 64) and LeNet
    python benchmarks/bench_forked.py --quick          # small (tests/test_benchmarks.py)
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from pflrepro.core import forked
from pflrepro.core.training import EVAL_ROWS, local_train, outputs, predict
from pflrepro.data.models import build_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cli import parser, torch_threads  # noqa: E402
from _table import write_table  # noqa: E402

COLUMNS = ("kind", "model", "setting", "threads", "before_s", "after_s", "ratio", "same_bits")
# (model, clients, samples a client, epochs, batch): pFedSD's paper row's round (10 of 100 clients, 560 training
# images each, E = 5 there: one epoch here), and the mini profiles' LeNet at B = 32
TRAIN = (("cnn_fmnist", 10, 560, 1, 64), ("cnn_cifar10", 10, 200, 1, 32))
SCORE = (("cnn_fmnist", 14000), ("cnn_cifar10", 14000))


def _clients(name: str, clients: int, n: int):
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    init = build_model(name, 1, 10, 28).state_dict()
    data = [(torch.randn(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)) for _ in range(clients)]
    return init, data


def _train_round(name: str, init: dict, data: list, epochs: int, batch: int, procs: int) -> list:
    net = build_model(name, 1, 10, 28)

    def one(k):
        net.load_state_dict(init)
        local_train(net, *data[k], epochs=epochs, batch_size=batch, lr=0.01, momentum=0.9, seed=1000 + k)
        return {n: t.detach().clone() for n, t in net.state_dict().items()}
    return forked.fork_map(one, list(range(len(data))), [float(len(d[1])) for d in data], procs)


def _timed(fn, repeats: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def train_row(spec: tuple, threads: int, repeats: int) -> dict:
    name, clients, n, epochs, batch = spec
    init, data = _clients(name, clients, n)
    with torch_threads(1):
        reference = _train_round(name, init, data, epochs, batch, 1)
    with torch_threads(threads):
        serial, _ = _timed(lambda: _train_round(name, init, data, epochs, batch, 1), repeats)
        fork_s, states = _timed(lambda: _train_round(name, init, data, epochs, batch, threads), repeats)
    same = all(torch.equal(a[k], b[k]) for a, b in zip(states, reference) for k in a)
    return {"kind": "train", "model": name, "setting": f"{clients} clients x {n}, E={epochs}, B={batch}",
            "threads": threads, "before_s": round(serial, 3), "after_s": round(fork_s, 3),
            "ratio": round(serial / fork_s, 2), "same_bits": same}


def score_row(spec: tuple, threads: int, repeats: int) -> dict:
    name, n = spec
    torch.manual_seed(0)
    net = build_model(name, 1, 10, 28).eval()
    x = torch.randn(n, 1, 28, 28)
    with torch_threads(threads):
        before, _ = _timed(lambda: predict(net, x, 2048), repeats)
        after, _ = _timed(lambda: predict(net, x, EVAL_ROWS), repeats)
        same = bool(torch.equal(outputs(net, x, 2048), outputs(net, x, EVAL_ROWS)))
    return {"kind": "score", "model": name, "setting": f"{n} images, 2048 vs {EVAL_ROWS} rows", "threads": threads,
            "before_s": round(before, 3), "after_s": round(after, 3), "ratio": round(before / after, 2),
            "same_bits": same}


def main(argv: list[str] | None = None) -> list[dict]:
    a = parser(__doc__, "two small clients, 1,000 images", 3).parse_args(argv)
    train, score = ((("cnn_cifar10", 2, 64, 1, 32),), (("cnn_cifar10", 1000),)) if a.quick else (TRAIN, SCORE)
    rows = [train_row(s, a.threads, a.repeats) for s in train] + [score_row(s, a.threads, a.repeats) for s in score]
    write_table(Path(a.out), "bench_forked", list(COLUMNS), rows,
                f"torch {torch.__version__}, {a.threads} thread(s), fastest of {a.repeats}; ratio = before / after "
                f"(train: {a.threads}-thread loop / {a.threads} forked processes of 1 thread; score: 2048 / "
                f"{EVAL_ROWS} rows a chunk)")
    return rows


if __name__ == "__main__":
    main()
