"""A paper's notebooks rendered one stage each (papermill one after another, as dvc.yaml ran them before 2026-11-28)
against `python -m pflrepro render` (several at a time, what the `render_<paper>` stages run), in the same invocation.

    python benchmarks/bench_render.py [--paper pfedsd | --names a,b,...] [--jobs 2] [--repeats 1] [--quick] [--out DIR]

Both sides render the same notebooks of this checkout's HEAD, in a `git worktree` of it (so the repository's own
results/ and figures/ are never written), from the run store of this checkout (`results/runs`, linked read-only
into the worktree with `data/`): run `dvc repro` first, or the notebooks train their missing runs and the benchmark
times that too (it says how many runs the store holds). Sides alternate, one side's repeats each timed whole; the
fastest repeat of each counts. The per-notebook side is each old stage's command,
`mkdir -p results/NAME && papermill notebooks/NAME.ipynb results/NAME/NAME.ipynb --no-progress-bar -p progress log`,
one after another, sources first as DVC ordered them; DVC's own time per stage (hashing, the lock: about 1.4 s a
stage, measured 2026-11-28) is in neither side. `--quick`: two notebooks that train nothing (pFedSD Fig. 5,
PerFed-CKT Fig. 2), one repeat (the test).
Writes <out>/bench_render.csv and bench_render.md (default out: benchmarks/out/). Run it on an idle machine.
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from _git import worktree as git_worktree  # noqa: E402

PYTHON = os.path.abspath(sys.executable)   # absolute (a relative PATH entry leaves it relative), the venv kept
QUICK = ["pfedsd_fig5", "perfed_ckt_fig2"]
COLUMNS = ("side", "commit", "notebooks", "jobs", "wall_s", "per_notebook_s", "ratio_per_notebook_over_render")


def _names(a) -> list[str]:
    if a.quick:
        return QUICK
    if a.names:
        return a.names.split(",")
    return sorted(p.stem for p in (REPO / "notebooks").glob(f"{a.paper}_*.ipynb"))


def stage_order(names: list[str]) -> list[str]:
    """Sources before the notebooks that read them, as DVC ran the per-notebook stages (Table 11 before Table 10,
    which otherwise measures the costs itself: 25 s of work the stages never did)."""
    from pflrepro.pipeline.notebooks import plan
    after, _ = plan(names, REPO)
    out: list[str] = []
    while len(out) < len(names):
        out += [n for n in names if n not in out and after[n] <= set(out)]
    return out


def worktree() -> tuple[Path, str]:
    """A detached worktree of HEAD with data/ and results/runs linked from this checkout; (path, short commit)."""
    path, sha = git_worktree("HEAD", Path(tempfile.mkdtemp(prefix="bench-render-")) / "tree")
    (path / "results").mkdir(exist_ok=True)
    (REPO / "results" / "runs").mkdir(parents=True, exist_ok=True)
    (path / "results" / "runs").symlink_to(REPO / "results" / "runs")
    (path / "data").mkdir(exist_ok=True)
    for f in (REPO / "data").glob("*.pt"):
        (path / "data" / f.name).symlink_to(f)
    return path, sha[:10]


def per_notebook(tree: Path, names: list[str], env: dict) -> float:
    t = time.perf_counter()
    for n in names:
        cmd = (f"mkdir -p results/{n} && {shlex.quote(PYTHON)} -m papermill notebooks/{n}.ipynb "
               f"results/{n}/{n}.ipynb --no-progress-bar -p progress log")
        out = subprocess.run(cmd, shell=True, cwd=tree, env=env, capture_output=True, text=True)
        if out.returncode:
            raise SystemExit(f"papermill failed on {n}:\n{out.stderr[-3000:]}")
    return time.perf_counter() - t


def render(tree: Path, names: list[str], jobs: int, env: dict) -> float:
    t = time.perf_counter()
    out = subprocess.run([PYTHON, "-m", "pflrepro", "render", *names, "--jobs", str(jobs)], cwd=tree, env=env,
                         capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"pflrepro render failed:\n{out.stderr[-3000:]}")
    return time.perf_counter() - t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--paper", default="pfedsd", help="render all of this paper's notebooks (default: pfedsd)")
    ap.add_argument("--names", help="comma-separated notebook names instead of a paper's")
    ap.add_argument("--jobs", type=int, default=2, help="notebooks at once on the render side (default 2)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="two notebooks that train nothing, one repeat (the test)")
    ap.add_argument("--out", default=str(HERE / "out"))
    a = ap.parse_args(argv)
    names = stage_order(_names(a))
    tree, commit = worktree()
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("PFLREPRO_RESULTS", None)
    stored = sum(1 for d in (REPO / "results" / "runs").glob("*/manifest.json"))
    print(f"{len(names)} notebooks at {commit}; the store holds {stored} finished runs", file=sys.stderr)
    best = {"per_notebook": float("inf"), "render": float("inf")}
    try:
        for _ in range(1 if a.quick else a.repeats):
            best["per_notebook"] = min(best["per_notebook"], per_notebook(tree, names, env))
            best["render"] = min(best["render"], render(tree, names, a.jobs, env))
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, capture_output=True)
        shutil.rmtree(tree.parent, ignore_errors=True)
    ratio = best["per_notebook"] / best["render"]
    rows = [{"side": side, "commit": commit, "notebooks": len(names), "jobs": 1 if side == "per_notebook" else a.jobs,
             "wall_s": round(s, 2), "per_notebook_s": round(s / len(names), 2),
             "ratio_per_notebook_over_render": "" if side == "per_notebook" else round(ratio, 2)}
            for side, s in best.items()]
    from _table import write_table
    write_table(Path(a.out), "bench_render", list(COLUMNS), rows,
                f"Notebooks: {', '.join(names)}. Fastest of {1 if a.quick else a.repeats} repeat(s) per side; load "
                f"average at the end: {os.getloadavg()[0]:.2f}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
