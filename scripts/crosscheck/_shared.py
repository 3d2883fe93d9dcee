"""What the cross-implementation scripts share: the paired-difference summary over seeds and the CSV writer."""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
from scipy import stats


def paired_t(diffs) -> tuple[float, float, float]:
    """Mean of per-seed differences (ours - theirs) and its 95 % t interval (nan with fewer than two seeds)."""
    d = np.asarray(diffs, dtype=float)
    mean, lo, hi = float(d.mean()), float("nan"), float("nan")
    if len(d) >= 2:
        sem = float(stats.sem(d))
        lo, hi = (mean, mean) if sem == 0 else map(float, stats.t.interval(0.95, len(d) - 1, loc=mean, scale=sem))
    return mean, lo, hi


def by_algorithm_and_metric(per_seed: list):
    """(key, rows, mean, lo, hi) per (algorithm, metric) of per-seed rows, in first-seen order."""
    for key in dict.fromkeys((r["algorithm"], r["metric"]) for r in per_seed):
        sel = [r for r in per_seed if (r["algorithm"], r["metric"]) == key]
        yield (key, sel, *paired_t([r["diff"] for r in sel]))


def write_csv(path: Path, rows: list[dict]) -> None:
    if not rows:
        return
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows({k: (f"{v:.6f}" if isinstance(v, float) else v) for k, v in r.items()} for r in rows)
