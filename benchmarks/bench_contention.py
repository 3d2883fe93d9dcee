"""One run's speed on a shared machine: torch's threads against one other busy process, same machine, one run.

    python benchmarks/bench_contention.py [--rounds 3] [--subsample 0.05] [--out DIR]

A fixed FedAvg run (Fashion-MNIST, pFedSD's FMNIST CNN, 10 IID clients, all of them every round, batch 64, seed 0,
CPU) is timed in a fresh process per mode; `busy` modes start one single-threaded busy loop (a pure-Python spin,
what a second job on one core looks like to the scheduler) before it and stop it after. Modes:

- `T threads alone` (T = every core, and 1): the reference;
- `T threads + 1 busy`: the same run beside one busy core;
- `... OMP_WAIT_POLICY=PASSIVE`: OpenMP's idle threads sleep instead of spinning (libgomp's default spins for a
  while at every parallel region's end, which is what a busy neighbour turns into lost time slices).

Each mode runs `--repeats` times, interleaved with the others (a slow minute of the VM hits every mode alike); the
fastest counts. Reported: seconds, slowdown against the same thread count alone (default wait policy), and whether
the metrics equal that reference's (a busy neighbour or the wait policy must not change a number; the thread count
itself may change low bits, as a convolution's sums split differently). Written to <out>/bench_contention.csv and
.md (printed).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _table import write_table  # noqa: E402

COLUMNS = ["mode", "threads", "busy", "wait_policy", "seconds", "slowdown", "same_metrics"]


def child(rounds: int, subsample: float, threads: int, store: str) -> None:
    import torch

    from pflrepro.pipeline.store import read_metrics, run
    torch.set_num_threads(threads)
    cfg = dict(algorithm="fedavg", dataset="fmnist", subsample=subsample, n_clients=10, partition="iid",
               split="random", split_params={"fractions": [0.8, 0.2]}, model="cnn_fmnist", rounds=rounds,
               local_epochs=1, batch_size=64, lr=0.01, momentum=0.9, seed=0, engine="per_client", device="cpu")
    t = time.perf_counter()
    res = run(cfg, root=store, progress=False)
    seconds = time.perf_counter() - t
    print(json.dumps({"seconds": seconds, "metrics": read_metrics(res.path)}))


def measure(args, threads: int, busy: bool, passive: bool) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("OMP_WAIT_POLICY", None)
    if passive:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        with tempfile.TemporaryDirectory() as store:
            job = json.dumps({"rounds": args.rounds, "subsample": args.subsample, "threads": threads, "store": store})
            proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", job], env=env,
                                  capture_output=True, text=True, check=True)
    finally:
        if spinner:
            spinner.kill()
            spinner.wait()
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--subsample", type=float, default=0.05)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "out"))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child is not None:
        child(**json.loads(a.child))
        return 0
    from pflrepro.pipeline.parallel import cpu_cores
    cores = cpu_cores()
    modes = [(t, busy, passive) for t in sorted({cores, 1}, reverse=True)
             for busy, passive in ((False, False), (True, False), (True, True), (False, True))]
    seconds: dict = {m: [] for m in modes}
    metrics: dict = {m: [] for m in modes}
    for _ in range(a.repeats):
        for m in modes:
            r = measure(a, *m)
            seconds[m].append(r["seconds"])
            metrics[m].append(r["metrics"])
    rows = []
    for threads, busy, passive in modes:
        m, ref = (threads, busy, passive), (threads, False, False)
        rows.append({"mode": f"{threads} threads" + (" + 1 busy" if busy else " alone")
                     + (" OMP_WAIT_POLICY=PASSIVE" if passive else ""),
                     "threads": threads, "busy": busy, "wait_policy": "PASSIVE" if passive else "default",
                     "seconds": round(min(seconds[m]), 2), "slowdown": round(min(seconds[m]) / min(seconds[ref]), 2),
                     "same_metrics": all(x == metrics[ref][0] for x in metrics[m])})   # every repeat, not one
    write_table(Path(a.out), "bench_contention", COLUMNS, rows,
                f"{cores} cores; fastest of {a.repeats}; slowdown = seconds / the same thread count alone (default "
                "wait policy)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
