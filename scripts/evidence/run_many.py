"""Run one base config for several algorithms, each in its own process, and summarise.

    python scripts/evidence/run_many.py CONFIG.yaml ALGO [ALGO ...] [--set key=value ...] [--jobs N]

Every run goes through `python -m pflrepro run` (results store, checkpoints, resume), so an
interrupted call resumes; the summary (best-round and last-10 mean of `pm_acc_mean`) is printed as
markdown and written to `evidence_summary.json` in the results store.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("algorithms", nargs="+")
    ap.add_argument("--set", nargs="*", default=[], help="extra key=value overrides for every run")
    ap.add_argument("--jobs", type=int, default=None, help="parallel runs (default: all at once)")
    ap.add_argument("--metric", default="pm_acc_mean")
    a = ap.parse_args()
    a.jobs = a.jobs or len(a.algorithms)
    logs = Path(os.environ.get("PFLREPRO_RESULTS", REPO / "results")) / "evidence_logs"
    logs.mkdir(parents=True, exist_ok=True)
    procs, pending, t0 = {}, list(a.algorithms), time.time()
    while pending or procs:
        while pending and len(procs) < a.jobs:
            algo = pending.pop(0)
            cmd = [sys.executable, "-m", "pflrepro", "run", "--quiet", "--config", a.config, f"algorithm={algo}", *a.set]
            procs[algo] = subprocess.Popen(cmd, cwd=REPO, stdout=open(logs / f"{algo}.out", "w"), stderr=subprocess.STDOUT)
        for algo, p in list(procs.items()):
            if p.poll() is not None:
                print(f"[{time.time() - t0:6.0f}s] {algo}: exit {p.returncode}", flush=True)
                del procs[algo]
        time.sleep(5)
    rows = []
    for algo in a.algorithms:
        text = (logs / f"{algo}.out").read_text()
        try:
            res = json.loads(text[text.rindex('{\n  "path"'):])
        except ValueError:
            print(f"{algo}: no result\n{text[-2000:]}")
            continue
        s = res["summary"][a.metric]
        rows.append({"algorithm": algo, "best": s["best"], "best_round": s["best_round"], "last10": s["last_mean"],
                     "final": s["final"], "path": res["path"]})
    print(f"| algorithm | best {a.metric} | round | last-10 mean |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['algorithm']} | {100 * r['best']:.2f} | {r['best_round']} | {100 * r['last10']:.2f} |")
    (logs / "evidence_summary.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
