"""pFedSD and FedAvg beside the authors' code over a grid of lr x B x E (issue 53): `pfedsd_authors.py` once per
point, then one table of the whole grid.

Each point runs `pfedsd_authors.py` in a subprocess with its own output folder (<out>/lr<lr>_B<B>_E<E>/), at the
stress base setting (10 clients, every client every round, subsample 0.05 of the pooled 70,000 images: 350 a client,
280 to train; 8 rounds; the last 3 averaged) and the point's lr, B and E; both sides on our partition and initial
weights, a seed drawing one of each. The script reuses every finished run (theirs: its records; ours: its store),
so the grid resumes where it was stopped: kill it at any time and start it again with the same arguments. Points
run corners first (E in {1, 5} x B in {16, 64}, every lr), then the rest, so an interrupted grid has covered its
range. A divergence on either side is a result (`pfedsd_authors.py` records it and goes on).

    nohup nice -n 19 .venv/bin/python scripts/crosscheck/pfedsd_grid.py --authors /tmp/pfedsd_authors \
        --out /work/xgrid > /work/xgrid.log 2>&1 &
    .venv/bin/python scripts/crosscheck/pfedsd_grid.py --out /work/xgrid --summarize   # the table so far
    ... --summarize --test-seeds 3-9    # also the divergence test on those seeds alone (fixed before they ran)
    .venv/bin/python scripts/crosscheck/pfedsd_grid.py --power 7   # that test's power at 7 seeds a point

Written to --out: `grid_summary.csv` (per point and algorithm: seeds with both sides, each side's diverged count,
the paired difference ours - theirs of the final metric (mean of the last 3 rounds) and of the best round, each with
its 90 % interval under the report's calibrated rule (`verdicts.cell_interval`: paired t over the seeds, floored by
the test-set resolution of 700 test images), and the first round where the curves part: the seed-mean of ours -
theirs per round beyond PART points, or a side diverging) and `grid_summary.md` (the same as a table).
"""
from __future__ import annotations

import argparse
import csv
import itertools
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
HERE = Path(__file__).resolve().parent
BASE = ["--n-clients", "10", "--rounds", "8", "--subsample", "0.05", "--last", "3"]
SUMMARY_COLUMNS = ("lr", "B", "E", "algorithm", "seeds", "both", "ours_final", "theirs_final", "diff_final", "final_lo",
                   "final_hi", "diverged_ours", "diverged_theirs", "ours_best", "theirs_best", "diff_best", "best_lo",
                   "best_hi", "part_round")
PART = 3.0           # points: where the seed-mean per-round difference first exceeds this, the curves have parted
N_TEST = 700         # test images of the base setting (10 clients x 70): the floor of a paired difference


def points(lrs, bs, es) -> list[tuple]:
    """(lr, B, E), corners of B and E first (every lr), then the rest, each block in (E, B, lr) order."""
    every = [(lr, b, e) for e, b, lr in itertools.product(es, bs, lrs)]
    corner = [p for p in every if p[1] in (min(bs), max(bs)) and p[2] in (min(es), max(es))]
    return corner + [p for p in every if p not in corner]


def tag(p) -> str:
    return f"lr{p[0]:g}_B{p[1]}_E{p[2]}"


def run_point(p, opts) -> int:
    cmd = [sys.executable, str(HERE / "pfedsd_authors.py"), "--authors", opts.authors, "--out",
           str(Path(opts.out) / tag(p)), "--seeds", opts.seeds, "--algorithms", opts.algorithms, *BASE,
           "--lr", str(p[0]), "--batch-size", str(p[1]), "--local-epochs", str(p[2])]
    print(f"== {tag(p)}: {' '.join(cmd[2:])}", flush=True)
    return subprocess.call(cmd)


def _read(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def _num(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def interval(diffs: list, means: list) -> tuple:
    """The paired difference's mean and 90 % interval under the report's rule (nan without one)."""
    from pflrepro.reporting.verdicts import Sample, cell_interval, floor_variance
    d = np.array([x for x in diffs if np.isfinite(x)])
    if not len(d):
        return float("nan"), float("nan"), float("nan")
    floor = floor_variance("diff", [float(np.mean(means[0])), float(np.mean(means[1]))], [N_TEST]) if means[0] else 0
    ci, _ = cell_interval(Sample("grid", float(d.mean()), values=d, floor=floor))
    return float(d.mean()), *(ci if ci else (float("nan"), float("nan")))


def parting_round(rows: list) -> int | str:
    """The first round where a side diverged or the seed-mean of ours - theirs (pm_mean) is beyond PART points."""
    rounds = sorted({int(r["round"]) for r in rows})
    for rnd in rounds:
        at = [r for r in rows if int(r["round"]) == rnd]
        if any(_num(r["diverged"]) > 0 for r in at):
            return rnd
        by_seed = {}
        for r in at:
            by_seed.setdefault(r["seed"], {})[r["side"]] = _num(r["pm_mean"])
        d = [100 * (v["ours"] - v["theirs"]) for v in by_seed.values() if len(v) == 2]
        if d and abs(np.mean(d)) > PART:
            return rnd
    return ""


def point_rows(p, folder: Path) -> list[dict]:
    per_seed, per_round = folder / "per_seed.csv", folder / "per_round.csv"
    if not per_seed.exists():
        return []
    seeds, rounds = _read(per_seed), _read(per_round)
    out = []
    for algo in dict.fromkeys(r["algorithm"] for r in seeds):
        row = {"lr": p[0], "B": p[1], "E": p[2], "algorithm": algo}
        mine = [r for r in seeds if r["algorithm"] == algo]
        for metric, name in (("pm_mean", "final"), ("pm_best", "best")):
            sel = [r for r in mine if r["metric"] == metric]
            ok = [r for r in sel if np.isfinite(_num(r["diff"]))]
            row["seeds"] = len(sel)
            row["both"] = len(ok)
            row[f"ours_{name}"] = 100 * np.mean([_num(r["ours"]) for r in ok]) if ok else float("nan")
            row[f"theirs_{name}"] = 100 * np.mean([_num(r["theirs"]) for r in ok]) if ok else float("nan")
            m, lo, hi = interval([100 * _num(r["diff"]) for r in ok],
                                 ([100 * _num(r["ours"]) for r in ok], [100 * _num(r["theirs"]) for r in ok]))
            row.update({f"diff_{name}": m, f"{name}_lo": lo, f"{name}_hi": hi})
        row["part_round"] = parting_round([r for r in rounds if r["algorithm"] == algo])
        row["diverged_by_seed"] = {int(r["seed"]): (r["ours_diverged_round"] != "", r["theirs_diverged_round"] != "")
                                   for r in mine if r["metric"] == "pm_mean"}
        row["diverged_ours"] = sum(o for o, _ in row["diverged_by_seed"].values())
        row["diverged_theirs"] = sum(t for _, t in row["diverged_by_seed"].values())
        out.append(row)
    return out


def stratified_exact(strata: list[tuple[int, int, int, int]]) -> tuple[float, float]:
    """Are ours' divergences more (or less) frequent than theirs, each grid point a stratum with its own rate?
    `strata`: (ours diverged, ours seeds, theirs diverged, theirs seeds) per point. Conditional on each point's total
    divergences, ours' count is hypergeometric under equal rates; their sum over the points has the convolution of
    those laws (the exact conditional test of the Mantel-Haenszel setting). Returns (one-sided p for ours diverging
    more often, two-sided p: the probability of a sum no more likely than the one seen). A point where every run or
    none diverged has one possible count and changes nothing."""
    from math import comb
    law, seen = {0: 1.0}, 0
    for x1, n1, x2, n2 in strata:
        t = x1 + x2
        here = {k: comb(n1, k) * comb(n2, t - k) / comb(n1 + n2, t) for k in range(max(0, t - n2), min(n1, t) + 1)}
        nxt: dict = {}
        for a, pa in law.items():
            for k, pk in here.items():
                nxt[a + k] = nxt.get(a + k, 0.0) + pa * pk
        law, seen = nxt, seen + x1
    one = sum(p for a, p in law.items() if a >= seen)
    two = sum(p for p in law.values() if p <= law[seen] * (1 + 1e-9))
    return min(one, 1.0), min(two, 1.0)


def power(rates: list[tuple[float, float]], n: int, draws: int = 2000, alpha: float = 0.05, seed: int = 0) -> float:
    """How often `stratified_exact` (two-sided) rejects at `alpha` when each point's runs diverge at its (ours, theirs)
    rate, n runs a side a point: by simulation (`draws` grids, numpy seed `seed`)."""
    rng = np.random.default_rng(seed)
    hits = sum(stratified_exact([(rng.binomial(n, a), n, rng.binomial(n, b), n) for a, b in rates])[1] < alpha
               for _ in range(draws))
    return hits / draws


POWER_CASES = {   # the alternatives docs/evidence.md sizes the confirmatory test by (three points, E = 5)
    "as seeds 0-2 showed": [(1.0, 1 / 3), (1.0, 1 / 3), (1 / 3, 0.0)],
    "half that gap": [(5 / 6, 0.5), (5 / 6, 0.5), (1 / 6, 0.0)],
    "0.6 against 0.3": [(0.6, 0.3)] * 3,
    "equal, 0.45": [(0.45, 0.45)] * 3,
}


def _pair(a: float, b: float) -> str:
    return "—" if not (np.isfinite(a) and np.isfinite(b)) else f"{a:.1f} / {b:.1f}"


def _diff(r: dict, name: str) -> str:
    """ours - theirs with its interval; with fewer than 3 seeds both sides finished, the mean alone and why."""
    m, lo, hi = r[f"diff_{name}"], r[f"{name}_lo"], r[f"{name}_hi"]
    if not np.isfinite(m):
        return "— (no seed finished on both sides)"
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return f"{m:+.1f} ({r['both']} seed{'s' * (r['both'] != 1)} on both sides: no interval)"
    return f"{m:+.1f} [{lo:+.1f}, {hi:+.1f}]"


def seed_set(text: str) -> set[int]:
    """"3-9" (a range, both ends in) or "3,5" (a list) as a set of seeds; ValueError on anything else."""
    if "-" in text:
        lo, hi = (int(x) for x in text.split("-"))
        if lo > hi:
            raise ValueError(f"{text!r}: the range runs backwards")
        return set(range(lo, hi + 1))
    return {int(x) for x in text.split(",")}


def _strata(rows: list[dict], seeds: str = "") -> list[tuple[str, list]]:
    """Per algorithm, each point's (ours diverged, runs, theirs diverged, runs) over the named seeds ("3-9" or "3,4";
    empty: every seed) that finished on both sides' records."""
    keep = seed_set(seeds) if seeds else None
    out = []
    for algo in dict.fromkeys(r["algorithm"] for r in rows):
        st = []
        for r in rows:
            if r["algorithm"] == algo:
                got = [v for s, v in r["diverged_by_seed"].items() if keep is None or s in keep]
                st.append((sum(o for o, _ in got), len(got), sum(t for _, t in got), len(got)))
        out.append((algo, st))
    return out


def _divergence_line(algo: str, st: list) -> str:
    one, two = stratified_exact(st)
    return (f"- {algo}: diverged ours {sum(x[0] for x in st)}, theirs {sum(x[2] for x in st)} of "
            f"{sum(x[1] for x in st)} runs a side over {len(st)} points; exact test stratified by point: "
            f"one-sided p (ours more often) {one:.3f}, two-sided {two:.3f}")


def summarize(opts, grid: list) -> list[dict]:
    rows = [r for p in grid for r in point_rows(p, Path(opts.out) / tag(p))]
    if not rows:
        print("no finished point yet")
        return rows
    sys.path.insert(0, str(HERE))
    from _shared import write_csv
    write_csv(Path(opts.out) / "grid_summary.csv", [{k: r[k] for k in SUMMARY_COLUMNS} for r in rows])
    lines = ["| lr | B | E | method | seeds | diverged ours / theirs | final ours / theirs | ours - theirs final [90 %] "
             "| best: ours - theirs [90 %] | curves part at round |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['lr']:g} | {r['B']} | {r['E']} | {r['algorithm']} | {r['seeds']} | "
                     f"{r['diverged_ours']} / {r['diverged_theirs']} | {_pair(r['ours_final'], r['theirs_final'])} "
                     f"| {_diff(r, 'final')} | {_diff(r, 'best')} | {r['part_round'] or '-'} |")
    lines.append("")
    lines += [_divergence_line(algo, st) for algo, st in _strata(rows)]
    if opts.test_seeds:
        lines += ["", f"Confirmatory test on seeds {opts.test_seeds} only (fixed before they ran; the seeds that chose "
                  "the points are left out):"] + [_divergence_line(a, st) for a, st in _strata(rows, opts.test_seeds)]
    (Path(opts.out) / "grid_summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--authors", help="CGCL-codes/pFedSD checkout (not needed with --summarize)")
    ap.add_argument("--out", default="/work/xgrid", help="output folder (outside the repository)")
    ap.add_argument("--lrs", default="0.005,0.01,0.02,0.05")
    ap.add_argument("--batch-sizes", default="16,32,64")
    ap.add_argument("--epochs", default="1,3,5")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--algorithms", default="pfedsd,fedavg")
    ap.add_argument("--summarize", action="store_true", help="only write the table of what has finished")
    ap.add_argument("--test-seeds", default="", help="also test the divergence rates on these seeds alone (\"3-9\"): "
                    "a confirmatory test fixed before they ran")
    ap.add_argument("--power", type=int, default=0, metavar="N",
                    help="only print the test's power at N seeds a point for the alternatives in POWER_CASES")
    opts = ap.parse_args(argv)
    try:
        seed_set(opts.test_seeds) if opts.test_seeds else None
    except ValueError:
        ap.error(f"--test-seeds={opts.test_seeds!r}: a range such as 3-9 or a list such as 3,5")
    if opts.power:
        for name, rates in POWER_CASES.items():
            print(f"{name}: {power(rates, opts.power):.3f}")
        return 0
    grid = points([float(x) for x in opts.lrs.split(",")], [int(x) for x in opts.batch_sizes.split(",")],
                  [int(x) for x in opts.epochs.split(",")])
    if not opts.summarize:
        if not opts.authors:
            ap.error("--authors is needed to train (or pass --summarize)")
        for p in grid:
            if run_point(p, opts) != 0:
                print(f"   {tag(p)}: the point's script failed; going on", flush=True)
            summarize(opts, grid)
    summarize(opts, grid)
    return 0


if __name__ == "__main__":
    sys.exit(main())
