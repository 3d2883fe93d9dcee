"""A notebook's grid trained one run after another against side by side (`jobs`), same machine, one run.

    python benchmarks/bench_jobs.py [--quick] [--notebook pfedsd_table2] [--profile mini] [--jobs auto]
                                    [--out DIR]

Modes, each in a subprocess of its own with an empty run store, timed around `experiments.run_grid`
only (imports and the params file are outside the clock; loading the dataset is inside, as in a
notebook):

- `one_after_another`: jobs=1 at torch's default threads (every core): what a grid did before `jobs`.
- `one_after_another_same_threads`: jobs=1 at the thread count a side-by-side run gets
  (cores // jobs), on that many cores (the process's CPU affinity: `run_grid` sets a jobs=1 run to every
  core it may use, so `torch.set_num_threads` alone would not hold): the reference whose metrics side_by_side must equal bit for bit (checked here
  on the runs' metrics.csv, and in tests/test_parallel.py).
- `side_by_side`: jobs=N (default: what `auto` picks on this machine).

Reported: seconds, runs/minute, threads per run, the speedup against `one_after_another`, and
whether side_by_side's metrics equal the same-threads reference. Written to <out>/bench_jobs.csv
and bench_jobs.md (printed). --quick: the example notebook's smoke profile (three runs, seconds; the
tests run it).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _table import write_table  # noqa: E402

COLUMNS = ["notebook", "profile", "mode", "jobs", "threads_per_run", "runs", "seconds", "runs_per_min",
           "speedup", "same_metrics"]


def child(notebook: str, profile: str, jobs: int, threads: int, store: str) -> None:
    import time

    import torch

    from pflrepro.pipeline import experiments
    if threads:
        import os
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:threads])
        torch.set_num_threads(threads)
    configs = experiments.grid(experiments.load_profile(notebook, profile))
    t = time.perf_counter()
    experiments.run_grid(configs, root=store, progress=False, jobs=jobs)
    seconds = time.perf_counter() - t
    print(json.dumps({"seconds": seconds, "runs": len(configs), "threads": torch.get_num_threads()}))


def _metrics(store: Path) -> dict:
    from pflrepro.pipeline.store import read_metrics
    return {d.name: read_metrics(d) for d in sorted(store.iterdir())}


def main(argv=None) -> int:
    from pflrepro.pipeline import parallel
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke profile of the example notebook (seconds)")
    ap.add_argument("--notebook", default=None, help="default: pfedsd_table2 (example with --quick)")
    ap.add_argument("--profile", default=None, help="default: mini (smoke with --quick)")
    ap.add_argument("--jobs", default="auto")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child is not None:  # one mode, in a process of its own (as bench_engines.py --child)
        child(**json.loads(a.child))
        return 0
    profile = a.profile or ("smoke" if a.quick else "mini")
    a.notebook = a.notebook or ("example" if a.quick else "pfedsd_table2")
    jobs = parallel.resolve_jobs(a.jobs, [])
    if jobs == 1:
        print(f"jobs resolves to 1 on this machine ({parallel.cpu_cores()} cores): nothing to compare")
        return 0
    threads = parallel.threads_per_run(jobs)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, stores = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode, j, thr in (("one_after_another", 1, 0), ("one_after_another_same_threads", 1, threads),
                             ("side_by_side", jobs, 0)):
            stores[mode] = Path(tmp) / mode
            job = {"notebook": a.notebook, "profile": profile, "jobs": j, "threads": thr, "store": str(stores[mode])}
            proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(job)],
                                  cwd=REPO, capture_output=True, text=True)
            if proc.returncode != 0:
                sys.stderr.write(proc.stderr)
                return proc.returncode
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            rows.append({"notebook": a.notebook, "profile": profile, "mode": mode, "jobs": j,
                         "threads_per_run": threads if j > 1 else r["threads"], "runs": r["runs"],
                         "seconds": round(r["seconds"], 2), "runs_per_min": round(60 * r["runs"] / r["seconds"], 2)})
        same = _metrics(stores["side_by_side"]) == _metrics(stores["one_after_another_same_threads"])
    for r in rows:
        r["speedup"] = round(rows[0]["seconds"] / r["seconds"], 2)
        r["same_metrics"] = same if r["mode"] == "side_by_side" else ""
    write_table(out, "bench_jobs", COLUMNS, rows,
                f"{parallel.cpu_cores()} cores; side_by_side metrics equal the same-threads reference: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
