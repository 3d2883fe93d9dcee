"""A notebook's grid on the local executor against the same grid on Ray, same machine, same run.

    python benchmarks/bench_executors.py [--notebook dcpfl_fig3] [--profile mini] [--out DIR]

Each mode runs in a subprocess of its own with an empty run store, timed around `experiments.run_grid` (imports
and the params file outside the clock, as in a notebook whose kernel is already up):

- `local`: jobs = CPU cores, one thread per run (pflrepro.pipeline.parallel).
- `ray_local_instance`: executor="ray" with no cluster running: Ray starts a local instance for the grid and
  stops it after (its start-up and shutdown are inside the clock: what a user pays), one CPU per run.
- `ray_running_cluster`: a Ray head started before the clock (`ray start --head`): what a grid costs on a
  cluster that is already up. One CPU per run; each checkpoint shipped to the driver's store (no shared store).
- `ray_running_cluster_shared`: the same with `shared` (tasks write into the store themselves): the difference
  to the previous row is what shipping checkpoints costs.

Every mode trains at one thread per run, so the runs' metrics must equal `local`'s bit for bit (checked here).
Reported: seconds, the ratio to `local`, whether the metrics match. Written to <out>/bench_executors.csv and .md.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

COLUMNS = ["notebook", "profile", "mode", "runs", "seconds", "ratio_to_local", "same_metrics"]


def child(notebook: str, profile: str, executor: str, store: str) -> None:
    import time

    from pflrepro.pipeline import experiments, parallel
    configs = experiments.grid(experiments.load_profile(notebook, profile))
    t = time.perf_counter()
    experiments.run_grid(configs, root=store, progress=False, jobs=parallel.cpu_cores(), executor=executor)
    print(json.dumps({"seconds": time.perf_counter() - t, "runs": len(configs)}))


def _metrics(store: Path) -> dict:
    from pflrepro.pipeline.store import read_metrics
    return {d.name: read_metrics(d) for d in sorted(store.iterdir()) if d.is_dir()}


def _ray(*args) -> None:
    subprocess.run([str(Path(sys.executable).with_name("ray")), *args], check=True, capture_output=True)


def main(argv=None) -> int:
    from pflrepro.pipeline import parallel
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--notebook", default="dcpfl_fig3")
    ap.add_argument("--profile", default="mini")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "out"))
    a = ap.parse_args(argv)
    cores = parallel.cpu_cores()
    rows, ref = [], None
    with tempfile.TemporaryDirectory() as tmp:
        for mode, executor in (("local", "local"), ("ray_local_instance", "ray:,cpus=1"),
                               ("ray_running_cluster", "ray:auto,cpus=1"),
                               ("ray_running_cluster_shared", "ray:auto,cpus=1,shared")):
            if mode.startswith("ray_running_cluster"):
                _ray("start", "--head", f"--num-cpus={cores}", "--include-dashboard=false", "--disable-usage-stats")
            store = Path(tmp) / mode
            try:
                out = subprocess.run([sys.executable, __file__, "--child", a.notebook, a.profile, executor, str(store)],
                                     capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
            except subprocess.CalledProcessError as e:
                sys.stderr.write(e.stderr[-3000:])
                raise
            finally:
                if mode.startswith("ray_running_cluster"):
                    _ray("stop", "--force")
            res = json.loads(out.stdout.strip().splitlines()[-1])
            metrics = _metrics(store)
            ref = ref or (res["seconds"], metrics)
            rows.append({"notebook": a.notebook, "profile": a.profile, "mode": mode, "runs": res["runs"],
                         "seconds": round(res["seconds"], 1), "ratio_to_local": round(res["seconds"] / ref[0], 3),
                         "same_metrics": metrics == ref[1]})
    Path(a.out).mkdir(parents=True, exist_ok=True)
    with open(Path(a.out) / "bench_executors.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    md = "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS) + "\n" + \
        "".join("| " + " | ".join(str(r[c]) for c in COLUMNS) + " |\n" for r in rows)
    (Path(a.out) / "bench_executors.md").write_text(md)
    print(md)
    return 0 if all(r["same_metrics"] for r in rows) else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(*sys.argv[2:6])
    else:
        sys.exit(main())
