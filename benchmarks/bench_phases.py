"""Where a mini run's wall time goes, phase by phase, against a baseline commit measured in the same invocation.

    python benchmarks/bench_phases.py [--baseline REF] [--repeats R] [--sample pfedsd,fedavg,...] [--out DIR]
                                      [--threads 1] [--quick]

The sample (`SAMPLE`): one typical run of each paper's most expensive training stage, at its default (`mini`)
profile, seed 0, plus FedAvg (the simplest run) on pFedSD's Table 2. Each side (this checkout, and `--baseline`
checked out with `git worktree` into a temporary folder) runs the whole sample in ONE child process at `--threads`
torch threads (a `dvc repro` worker: 2 workers x 1 thread on 2 cores), each run into a fresh run store, so it
trains; sides alternate (baseline, current, baseline, ...) `--repeats` times (default 2) and each run's fastest
repeat counts. The child times phases from outside the code, by wrapping functions it calls (nothing in the
package is changed to be measured):

| phase | what is timed |
|---|---|
| start | the child's `import torch, pflrepro` (a worker process pays it once for all its runs) |
| data | the run's partition and federation (`store.build_partition`, `store.build_context`) |
| train | local training and aggregation of the selected clients (`core.loop.local_round`) |
| eval | evaluation (`core.loop.evaluate`) |
| ckpt | checkpoints (`torch.save`) |
| io | metrics, summary and provenance files (`store._write_metrics`, `store.provenance`) |
| other | the rest of the run's wall time (aggregation, clock, schedule, algorithm setup, the loop itself) |

Also per run: wall seconds, training FLOPs (the run's provenance: 3 x forward FLOPs x samples) and the achieved
GFLOP/s over the whole run and over the train phase, the final personalized accuracy (both sides must compute the
same thing, or say why not), and the ratio baseline / current of the wall time. Writes <out>/bench_phases.csv and
bench_phases.md (default out: benchmarks/out/). Run it on an idle machine.
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

T_START = time.perf_counter()
HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from _git import worktree as git_worktree  # noqa: E402

# (label, params file, method, setting or None for the first, seed)
SAMPLE = [
    ("pfedsd", "pfedsd_table2", "pfedsd", None, 0),
    ("fedavg", "pfedsd_table2", "fedavg", None, 0),
    ("dcpfl", "dcpfl_table1", "dcpfl", None, 0),
    ("scd", "scd_table1", "scd", None, 0),
    ("fedbsd", "fedbsd_table1", "fedbsd", None, 0),
    ("perfed_ckt", "perfed_ckt_table1", None, None, 0),
]
PHASES = ("start", "data", "train", "eval", "ckpt", "io", "other")
COLUMNS = ("run", "side", "commit", "wall_s", *[f"{p}_s" for p in PHASES[1:]], "train_gflop", "gflops_wall",
           "gflops_train", "final_pm", "ratio_base_over_current")


# ---------------------------------------------------------------- child: one side, the whole sample
def _timer(acc: dict, key: str, fn):
    def wrapped(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            acc[key] = acc.get(key, 0.0) + time.perf_counter() - t
    return wrapped


def sample_config(params: str, method: str | None, setting: str | None, seed: int, quick: bool):
    """(grid key, RunConfig) of a SAMPLE entry: the first run of its table's mini grid with that method (None: any),
    setting (None: any) and seed; 2 rounds when `quick`."""
    from pflrepro.pipeline import experiments
    configs = experiments.grid(experiments.load_profile(params))
    key = next(k for k in configs if (method is None or k[0] == method) and (setting is None or k[1] == setting)
               and k[2] == seed)
    cfg = configs[key]
    return key, (type(cfg).from_dict({**cfg.to_dict(), "rounds": 2}) if quick else cfg)


def child(sample: list, threads: int, quick: bool) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    import torch

    import pflrepro  # noqa: F401
    from pflrepro.core import loop
    from pflrepro.pipeline import store
    t_import = time.perf_counter() - T_START
    torch.set_num_threads(threads)
    acc: dict = {}
    for mod, name, key in ((store, "build_partition", "data"), (store, "build_context", "data"),
                           (loop, "local_round", "train"), (loop, "evaluate", "eval"),
                           (store, "_write_metrics", "io"), (store, "provenance", "io")):
        if hasattr(mod, name):
            setattr(mod, name, _timer(acc, key, getattr(mod, name)))
    torch.save = _timer(acc, "ckpt", torch.save)
    print(json.dumps({"start": t_import}), flush=True)
    for label, params, method, setting, seed in sample:
        key, cfg = sample_config(params, method, setting, seed, quick)
        acc.clear()
        with tempfile.TemporaryDirectory(prefix="bench-phases-") as root:
            t = time.perf_counter()
            res = store.run(cfg, root=root, progress=False)
            wall = time.perf_counter() - t
        prov = res.provenance
        print(json.dumps({"run": label, "key": list(key), "wall": wall, **acc,
                          "train_flops": prov.get("train_flops_estimate"),
                          "final_pm": res.summary["pm_acc_mean"]["final"]}), flush=True)


# ---------------------------------------------------------------- parent: both sides, interleaved
def _commit(path: Path) -> str:
    out = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=path, capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=path, capture_output=True,
                           text=True).stdout.strip()
    return out.strip() + ("+dirty" if dirty else "")


def run_side(path: Path, sample: list, threads: int, quick: bool) -> dict:
    env = {**os.environ, "PYTHONPATH": str(path), "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    cmd = [sys.executable, str(HERE / "bench_phases.py"), "--child", json.dumps(sample), "--threads", str(threads)]
    out = subprocess.run(cmd + (["--quick"] if quick else []), cwd=path, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"child failed on {path}:\n{out.stderr[-3000:]}")
    lines = [json.loads(ln) for ln in out.stdout.splitlines() if ln.startswith("{")]
    return {"start": lines[0]["start"], "runs": {r["run"]: r for r in lines[1:]}}


def _row(label: str, side: str, commit: str, r: dict) -> dict:
    wall = r["wall"]
    known = sum(r.get(p, 0.0) for p in PHASES[1:-1])
    flops = r.get("train_flops") or float("nan")
    return {"run": label, "side": side, "commit": commit, "wall_s": round(wall, 3),
            **{f"{p}_s": round(r.get(p, 0.0), 3) for p in PHASES[1:-1]}, "other_s": round(wall - known, 3),
            "train_gflop": round(flops / 1e9, 2), "gflops_wall": round(flops / 1e9 / wall, 2),
            "gflops_train": round(flops / 1e9 / max(r.get("train", 0.0), 1e-9), 2),
            "final_pm": round(100 * r["final_pm"], 3), "ratio_base_over_current": ""}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", help="git ref measured beside this checkout (default: none)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--sample", help="comma-separated labels of SAMPLE (default: all)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="2 rounds a run (what the test runs)")
    ap.add_argument("--out", default=str(HERE / "out"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        child([tuple(s) for s in json.loads(a.child)], a.threads, a.quick)
        return 0
    labels = a.sample.split(",") if a.sample else [s[0] for s in SAMPLE]
    unknown = sorted(set(labels) - {s[0] for s in SAMPLE})
    if unknown:
        ap.error(f"unknown sample label(s) {', '.join(unknown)}; known: {', '.join(s[0] for s in SAMPLE)}")
    sample = [s for s in SAMPLE if s[0] in labels]
    sides = ([("baseline", git_worktree(a.baseline)[0])] if a.baseline else []) + [("current", REPO)]
    best: dict = {}
    starts: dict = {}
    for rep in range(a.repeats):
        for side, path in sides:
            got = run_side(path, sample, a.threads, a.quick)
            starts[side] = min(starts.get(side, 1e9), got["start"])
            for label, r in got["runs"].items():
                if (side, label) not in best or r["wall"] < best[(side, label)]["wall"]:
                    best[(side, label)] = r
            print(f"[bench_phases] repeat {rep + 1}/{a.repeats}, {side}: "
                  + ", ".join(f"{k} {v['wall']:.2f}s" for k, v in got["runs"].items()), flush=True)
    rows = []
    for label in labels:
        for side, path in sides:
            rows.append(_row(label, side, _commit(path), best[(side, label)]))
        if a.baseline:
            rows[-1]["ratio_base_over_current"] = round(best[("baseline", label)]["wall"] / best[("current", label)]["wall"], 2)
    tot = {side: sum(best[(side, lb)]["wall"] for lb in labels) for side, _ in sides}
    footer = (f"Fastest of {a.repeats} repeat(s) per run, {a.threads} torch thread(s), one child process per side; "
              f"start (import torch + pflrepro): " + ", ".join(f"{s} {v:.2f} s" for s, v in starts.items())
              + "; sample total: " + ", ".join(f"{s} {v:.1f} s" for s, v in tot.items())
              + (f"; baseline / current = {tot['baseline'] / tot['current']:.2f}" if a.baseline else "")
              + f". Load average at the end: {os.getloadavg()[0]:.2f}.")
    from _table import write_table
    write_table(Path(a.out), "bench_phases", list(COLUMNS), rows, footer)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
