"""How often the claims ledger decides wrongly: P(holds) and P(fails) at every claim shape's boundary, and its power.

Simulated tables with known effects go through the code that judges the reproduced tables (`claims.judge`), for
every claim form and quantifier the claims files use (`pflrepro/reporting/calibration.py` says how the tables are
drawn and which worst cases each shape is checked at). Three parts (`calibration.grid`):
- `structure`: every form x its quantifiers x 1, 3, 6 cells x 1, 3, 7 competitors (its own), 3 seeds, normal noise;
- `noise`: every form x 3, 5, 10 seeds x normal, t(3), and accuracies counted over 7, 30 and 200 test images;
- `extremes`: every form at 6 cells and its most competitors, 3 seeds, t(3) and 7-image noise.

Each checked rate must be at most ALPHA = 5 %; a row is `ok` when the observed rate is within 3 Monte Carlo standard
errors of that (at the bound). Power: P(holds) with every cell and comparison 1 and 2 noise sds inside the claimed
region. Output: <out>/calibration.csv (one row per shape and variant), calibration.md (the summary tables).

    python benchmarks/bench_calibration.py                   # all parts, 1000 draws a check, 300 for power, 2 processes
    python benchmarks/bench_calibration.py --quick           # a few shapes, 200 draws (tests/test_benchmarks.py)
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path

import pandas as pd

from pflrepro.reporting import calibration, verdicts

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _table import write_table  # noqa: E402

QUICK = [calibration.Shape("order"), calibration.Shape("best", rivals=3, cells=3),
         calibration.Shape("near_diff", noise="binom7"), calibration.Shape("order", "any", cells=3)]


def _one(args) -> list[dict]:
    shape, draws, power_draws, seed = args
    rows = calibration.evaluate_shape(shape, draws, power_draws, seed)
    for r in rows:
        r.update(form=shape.form, quantifier=shape.quantifier, seeds=shape.seeds, cells=shape.cells,
                 rivals=shape.rivals, noise=shape.noise)
    return rows


def run(shapes: list, draws: int, power_draws: int, procs: int, seed: int = 0) -> pd.DataFrame:
    jobs = [(s, draws, power_draws, seed) for s in shapes]
    t0, rows = time.time(), []
    if procs > 1:
        with mp.get_context("fork").Pool(procs) as pool:
            for i, r in enumerate(pool.imap_unordered(_one, jobs, chunksize=1), 1):
                rows += r
                if i % 20 == 0 or i == len(jobs):
                    print(f"[calibration] {i}/{len(jobs)} shapes, {time.time() - t0:.0f} s", flush=True)
    else:
        for job in jobs:
            rows += _one(job)
    return pd.DataFrame(rows)


def summary(df: pd.DataFrame) -> str:
    """The Markdown the docs take: the worst rates per form at the boundary, and the power by seeds and noise."""
    checked = df[df["bounds"] != ""]
    lines = [f"{len(checked)} checks of {checked['shape'].nunique()} shapes; "
             f"{int((~checked['ok']).sum())} outside ALPHA + 3 Monte Carlo SE.", ""]
    worst = []
    for form, g in checked.groupby("form", sort=False):
        h = g[g["bounds"].str.contains("holds")]
        f = g[g["bounds"].str.contains("fails")]
        worst.append({"form": form, "shapes": g["shape"].nunique(), "checks": len(g),
                      "max P(holds)": f"{h['p_holds'].max():.3f}" if len(h) else "",
                      "max P(fails)": f"{f['p_fails'].max():.3f}" if len(f) else "",
                      "mean P(holds)": f"{h['p_holds'].mean():.3f}" if len(h) else "",
                      "mean P(fails)": f"{f['p_fails'].mean():.3f}" if len(f) else "",
                      "all ok": bool(g["ok"].all())})
    lines += [_md(pd.DataFrame(worst)), ""]
    power = df[df["variant"].isin(["power1", "power2"])]
    if len(power):
        one = power[(power["noise"] == "normal")].pivot_table(index=["form", "quantifier", "cells", "rivals"],
                                                             columns=["variant", "seeds"], values="p_holds")
        lines += ["Power (P(holds)) with every test 1 or 2 noise sds inside the region, normal noise:", "",
                  _md(one.round(2).reset_index()), ""]
    return "\n".join(lines)


def _md(df: pd.DataFrame) -> str:
    cols = [" ".join(map(str, c)) if isinstance(c, tuple) else str(c) for c in df.columns]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join("" if v != v else str(v) for v in r) + " |" for r in df.itertuples(index=False)]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="four shapes, 200 draws (what the test runs)")
    ap.add_argument("--parts", default="structure,noise,extremes")
    ap.add_argument("--draws", type=int, default=1000, help="simulated tables per checked variant")
    ap.add_argument("--power-draws", type=int, default=300)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "out"))
    a = ap.parse_args(argv)
    if a.quick:
        shapes, a.draws, a.power_draws, a.procs = QUICK, 200, 50, 1
    else:
        shapes = [s for part in a.parts.split(",") for s in calibration.grid(part)]
    t0 = time.time()
    df = run(shapes, a.draws, a.power_draws, a.procs, a.seed)
    out = Path(a.out)
    cols = ["form", "quantifier", "seeds", "cells", "rivals", "noise", "variant", "draws", "p_holds", "se_holds",
            "p_fails", "se_fails", "bounds", "ok"]
    rows = [{c: (round(v, 4) if isinstance(v, float) else v) for c, v in r.items() if c in cols}
            for r in df[cols].to_dict("records")]
    write_table(out, "calibration", cols, rows,
                f"ALPHA = {verdicts.ALPHA}; a check is ok when its rate <= ALPHA + 3 MC SE "
                f"({calibration.bound(a.draws):.3f} at {a.draws} draws); {time.time() - t0:.0f} s")
    (out / "calibration_summary.md").write_text(summary(df) + "\n")
    print(summary(df))
    return 0 if bool(df["ok"].all()) else 1


if __name__ == "__main__":
    sys.exit(main())
