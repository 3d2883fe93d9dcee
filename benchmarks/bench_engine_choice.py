"""Whole mini runs trained by the batched engine against client by client, in the same run: the measurements behind
`engine: auto`'s rule on a CPU (`pflrepro.core.engines.batched.slower_batched`).

For each run of the sample (one seed-0 run of a mini table, as `dvc repro` trains it), at one torch thread (a
`dvc repro` worker's), each into a fresh run store, engines alternating (batched, per_client, batched, ...) R times
(default 1; the runs are 10-40 s each), fastest repeat counts. Reports the batch size, the clients a round, the
wall seconds of each engine, per_client speed over batched (above 1: client by client is faster), what `auto`
picks for the run's model and batch size, and the final personalized accuracy of each (the engines agree up to float
rounding, which a run's chaos can amplify by a few points).

    python benchmarks/bench_engine_choice.py            # the sample below (~6 minutes)
    python benchmarks/bench_engine_choice.py --quick    # one run, 2 rounds (tests/test_benchmarks.py)
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

from pflrepro.core.engines import slower_batched
from pflrepro.data.models import build_model
from pflrepro.pipeline import experiments, store

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cli import parser, torch_threads  # noqa: E402
from _table import write_table  # noqa: E402

# (label, params file, method): the first seed-0 run of that method in the table's mini grid
SAMPLE = [
    ("scd B=32", "scd_table1", "scd"),
    ("ditto B=32", "scd_table1", "ditto"),
    ("fedavg B=32", "scd_table1", "fedavg"),
    ("fedavg B=16", "pfedsd_table2", "fedavg"),
    ("pfedsd B=16", "pfedsd_table2", "pfedsd"),
    ("fedrep B=10", "fedbsd_table1", "fedrep"),
]
COLUMNS = ("run", "model", "batch", "clients_per_round", "batched_s", "per_client_s", "per_client_speedup",
           "auto_picks", "batched_pm", "per_client_pm")


def config(params: str, method: str, quick: bool):
    configs = experiments.grid(experiments.load_profile(params))
    key = next(k for k in configs if k[0] == method and k[2] == 0)
    cfg = configs[key].to_dict()
    return {**cfg, "rounds": 2} if quick else cfg


def timed(cfg: dict, engine: str) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix="bench-engine-") as root:
        t = time.perf_counter()
        res = store.run({**cfg, "engine": engine}, root=root, progress=False)
        return time.perf_counter() - t, res.summary["pm_acc_mean"]["final"]


def main(argv: list[str] | None = None) -> list[dict]:
    a = parser(__doc__, "one run of 2 rounds (seconds)", 1).parse_args(argv)
    rows = []
    with torch_threads(a.threads):   # in-process callers (the test) get their thread count back
        for label, params, method in SAMPLE[-1:] if a.quick else SAMPLE:
            cfg = config(params, method, a.quick)
            best: dict = {}
            for _ in range(a.repeats):
                for engine in ("batched", "per_client"):
                    wall, pm = timed(cfg, engine)
                    if engine not in best or wall < best[engine][0]:
                        best[engine] = (wall, pm)
            picks = slower_batched(build_model(cfg["model"], 1, 10, 28), torch.device("cpu"), cfg["batch_size"],
                                   round(cfg["n_clients"] * cfg["participation"]))
            rows.append({"run": label, "model": cfg["model"], "batch": cfg["batch_size"],
                         "clients_per_round": round(cfg["n_clients"] * cfg["participation"]),
                         "batched_s": round(best["batched"][0], 2), "per_client_s": round(best["per_client"][0], 2),
                         "per_client_speedup": round(best["batched"][0] / best["per_client"][0], 2),
                         "auto_picks": "per_client" if picks else "batched",
                         "batched_pm": round(100 * best["batched"][1], 2),
                         "per_client_pm": round(100 * best["per_client"][1], 2)})
    write_table(Path(a.out), "bench_engine_choice", list(COLUMNS), rows,
                f"torch {torch.__version__}, {a.threads} thread(s), fastest of {a.repeats}; per_client_speedup = "
                f"batched_s / per_client_s (above 1: client by client is faster)")
    return rows


if __name__ == "__main__":
    main()
