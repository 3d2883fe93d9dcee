"""Clients side by side (`pflrepro.core.engines.forked`) and the evaluation's chunk of rows (`training.EVAL_ROWS`), each
against the code path it replaced, in the same run.

- `train`: one round's client-by-client training (C clients, each `local_train` on its own n samples, E epochs,
  batch B, its own seed, as `train_one` trains them) at T torch threads in this process (what a T-thread run did
  before) against what it does now: `fork_map` over T processes of one thread where the round's estimated work pays
  a fork (`forks`: `forked.pays`), else the same loop here at one thread; ratio = before / after (above 1: now is
  faster). `same_bits`: the clients' states equal the same clients trained here at one thread (what a one-thread
  run, e.g. a `dvc repro` worker, trains).
- `score`: `predict` on N images at 2,048 rows a chunk (the former default) against `EVAL_ROWS`, at T threads;
  ratio = 2048 / EVAL_ROWS; `same_bits`: the logits are equal.
Each timing is the fastest of R repeats, before and after interleaved.

    python benchmarks/bench_forked.py --threads 2      # pFedSD's FMNIST CNN (10 clients x 560, E = 5, B = 64), LeNet
    python benchmarks/bench_forked.py --quick          # small (tests/test_benchmarks.py)
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import torch

from pflrepro.core.engines import forked
from pflrepro.core.clock import model_forward_flops
from pflrepro.core.training import EVAL_ROWS, local_train, outputs, predict
from pflrepro.data.models import build_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cli import parser, torch_threads  # noqa: E402
from _table import write_table  # noqa: E402

COLUMNS = ("kind", "model", "setting", "threads", "forks", "before_s", "after_s", "ratio", "same_bits")
# (model, clients, samples a client, epochs, batch): pFedSD's paper row's round (10 of 100 clients, 560 training
# images each, E = 5), the mini profiles' LeNet at B = 32 (a round too small to pay a fork) and at 5 epochs
TRAIN = (("cnn_fmnist", 10, 560, 5, 64), ("cnn_cifar10", 10, 200, 1, 32), ("cnn_cifar10", 10, 200, 5, 32))
SCORE = (("cnn_fmnist", 14000), ("cnn_cifar10", 14000))


def _clients(name: str, clients: int, n: int):
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    init = build_model(name, 1, 10, 28).state_dict()
    data = [(torch.randn(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)) for _ in range(clients)]
    return init, data


def _train_round(name: str, init: dict, data: list, epochs: int, batch: int, procs: int) -> list:
    """The round as `batched._train_singles` trains it at `procs` processes (1: this process, its threads)."""
    net = build_model(name, 1, 10, 28)

    def one(k):
        net.load_state_dict(init)
        local_train(net, *data[k], epochs=epochs, batch_size=batch, lr=0.01, momentum=0.9, seed=1000 + k)
        return {n: t.detach().clone() for n, t in net.state_dict().items()}
    states: list = []
    work = _work(name, data, epochs, batch)
    forked.train_each(one, list(range(len(data))), work.__getitem__, procs, lambda k, s: states.append(s))
    return states


def _work(name: str, data: list, epochs: int, batch: int) -> list[float]:
    flops = model_forward_flops(name, 1, 10, 28)
    return [forked.work_seconds(math.ceil(len(y) / batch) * epochs, min(batch, len(y)), flops) for _, y in data]


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
    with torch_threads(threads):    # interleaved: before, after, before, after, ...
        serial, fork_s, states = float("inf"), float("inf"), None
        for _ in range(repeats):
            serial = min(serial, _timed(lambda: _train_round(name, init, data, epochs, batch, 1), 1)[0])
            t, states = _timed(lambda: _train_round(name, init, data, epochs, batch, threads), 1)
            fork_s = min(fork_s, t)
    same = all(torch.equal(a[k], b[k]) for a, b in zip(states, reference) for k in a)
    forks = threads > 1 and forked.pays(sum(_work(name, data, epochs, batch)), threads)
    return {"kind": "train", "model": name, "setting": f"{clients} clients x {n}, E={epochs}, B={batch}",
            "threads": threads, "forks": forks, "before_s": round(serial, 3), "after_s": round(fork_s, 3),
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
            "forks": "", "before_s": round(before, 3), "after_s": round(after, 3), "ratio": round(before / after, 2),
            "same_bits": same}


def main(argv: list[str] | None = None) -> list[dict]:
    a = parser(__doc__, "two clients of pFedSD's FMNIST CNN (forked at 2 threads), 1,000 images", 3).parse_args(argv)
    train, score = ((("cnn_fmnist", 2, 300, 1, 64),), (("cnn_cifar10", 1000),)) if a.quick else (TRAIN, SCORE)
    rows = [train_row(s, a.threads, a.repeats) for s in train] + [score_row(s, a.threads, a.repeats) for s in score]
    write_table(Path(a.out), "bench_forked", list(COLUMNS), rows,
                f"torch {torch.__version__}, {a.threads} thread(s), fastest of {a.repeats}; ratio = before / after "
                f"(train: {a.threads}-thread loop / now: forked where `forks`, else 1 thread; score: 2048 / "
                f"{EVAL_ROWS} rows a chunk)")
    return rows


if __name__ == "__main__":
    main()
