"""The cost of every notebook's `paper` profile, as the markdown table of docs/performance.md ("What a paper
profile costs"): python scripts/cost_table.py [--profile paper] [--jobs 2]

Rates are measured on the machine that runs this (pflrepro.pipeline.budget); the GPU column uses budget.GPU_FLOPS.
A notebook that renders another's runs (`source:` in its params file) is listed with that one's cost.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from pflrepro.pipeline import budget  # noqa: E402
from pflrepro.pipeline.experiments import grid, load_profile, read_params  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default="paper")
    ap.add_argument("--jobs", type=int, default=None)
    a = ap.parse_args(argv)
    names = sorted(p.stem for p in (ROOT / "params").glob("*.yaml") if not p.stem.endswith("_common"))
    print(f"| notebook | runs | models on datasets | training TFLOPs | this machine, >= (wall) | {budget.GPU_NAME}, >= |")
    print("|---|---|---|---|---|---|")
    total = 0.0
    for name in names:
        source = read_params(name).get("source")
        if source:
            print(f"| {name} | the runs of {source} | | | | |")
            continue
        cost = budget.grid_cost(list(grid(load_profile(name, a.profile)).values()), jobs=a.jobs)
        t = cost["total"]
        total += t["tflops"]
        models = ", ".join(f"{r['model']} on {r['dataset']}" for r in cost["rows"])
        print(f"| {name} | {t['runs']} | {models} | {t['tflops']:,.0f} | {budget.hours(t['wall_hours'])} "
              f"({cost['jobs']} at once) | {budget.hours(t['gpu_hours'])} |", flush=True)
    print(f"\nAll notebooks: {total:,.0f} TFLOPs of training (runs shared between notebooks counted once per notebook).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
