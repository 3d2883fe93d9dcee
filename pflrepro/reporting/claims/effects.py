"""Values and effects: a table cell's value with its per-seed entries, and the per-seed effect of a comparison."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .. import verdicts
from ..verdicts import Region, Sample


@dataclass
class Val:
    """One ref's value in one cell: the mean over seeds `x`, its std over seeds `sd` (nan: unknown), the number of
    seeds `n`, each seed's value where the table has them (a blank seed: nan), and the row's keys (its runs)."""
    label: str
    x: float
    sd: float = float("nan")
    n: int = 1
    per_seed: dict | None = None
    exact: bool = False
    keys: dict = field(default_factory=dict)
    min_test: float = float("nan")
    n_test: float = float("nan")          # effective test images behind one seed's value (accuracies only)

    def __str__(self):
        seeds = f" (seeds {', '.join(f'{s}:{_fmt(v)}' for s, v in self.per_seed.items())})" if self.per_seed else ""
        spread = f"±{_fmt(self.sd)}" if self.sd == self.sd and not self.per_seed and not self.exact else ""
        return f"{self.label} {_fmt(self.x)}{spread}{seeds}"


def _parse_seeds(cell) -> dict | None:
    """`repro_seeds` ("0:93.81;1:90.83;2:nan") -> {0: 93.81, 1: 90.83, 2: nan}; None when blank or malformed."""
    if not isinstance(cell, str) or not cell.strip():
        return None
    out = {}
    for part in cell.split(";"):
        seed, _, v = part.partition(":")
        try:
            out[int(seed)] = float(v)
        except ValueError:
            return None
    return out


def _fmt(x: float) -> str:
    return verdicts._fmt(x)


def _delta_se(f, vals: list[Val]) -> tuple[float | None, float | None]:
    """Standard error of f at the means from each value's std over its seeds (delta method, numerical
    derivatives), and its Welch-Satterthwaite degrees of freedom; None when a value f depends on has no spread."""
    xs = np.array([v.x for v in vals], dtype=np.float64)
    var, den = 0.0, 0.0
    for i, v in enumerate(vals):
        if v.exact:
            continue
        h = 1e-4 * max(1.0, abs(xs[i]))
        up, dn = xs.copy(), xs.copy()
        up[i] += h
        dn[i] -= h
        g = (f(list(up)) - f(list(dn))) / (2 * h)
        if g == 0:
            continue
        if v.sd != v.sd or v.n < 2:
            return None, None
        c = g * g * v.sd ** 2 / v.n
        var += c
        den += c * c / (v.n - 1)
    return math.sqrt(var), (var * var / den if den else math.inf)    # Welch-Satterthwaite degrees of freedom


def _floor(kind: str | None, vals: list[Val], means: list[float]) -> float:
    """The test-set floor of one seed's effect (verdicts.floor_variance) for an effect of `kind` over accuracies
    with known test sets; 0 otherwise."""
    if kind is None or any(not (v.n_test == v.n_test) for v in vals) or not all(map(math.isfinite, means)):
        return 0.0
    return verdicts.floor_variance(kind, means, [v.n_test for v in vals])


def effect(name: str, vals: list[Val], f, text: str = "", kind: str | None = None) -> Sample:
    """The effect f([value of each of `vals`]) in one cell: per seed over the seeds all of them share (paired),
    else at the means with a delta-method standard error, or exact where every value is. `kind` ('diff', 'value',
    'ratio'): what the effect is of accuracies, for its test-set floor (verdicts.floor_variance)."""
    xs = [v.x for v in vals]
    if all(v.exact for v in vals):
        return Sample(name, float(f(xs)), exact=True, text=text)
    if all(v.per_seed for v in vals):
        common = sorted(set.intersection(*(set(v.per_seed) for v in vals)))
        if common:
            rows = [[v.per_seed[s] for v in vals] for s in common]
            per = np.array([f(r) for r in rows], dtype=np.float64)
            tie = np.array([all(math.isinf(x) for x in r) for r in rows])
            per[np.isnan(per) & tie] = 0.0          # both never reached the target on that seed: a tie
            means = [float(np.mean([r[i] for r in rows])) for i in range(len(vals))]
            return Sample(name, float(np.mean(per)), values=per, text=text, seeds=tuple(common),
                          floor=_floor(kind, vals, means))
    point = float(f(xs))
    if not math.isfinite(point):          # a method that never reached a target: decided by that alone
        return Sample(name, point, exact=True, text=text)
    se, df = _delta_se(f, vals)
    n = min((v.n for v in vals if not v.exact), default=0)
    return Sample(name, point, se=se, df=df, text=text, n_seeds=n)


@dataclass
class Comparison:
    """One effect over the claim's cells and the region the claim puts it in (a claim: one or several)."""
    label: str
    region: Region
    cells: list = field(default_factory=list)       # [Sample]
    skipped: list = field(default_factory=list)     # [(cell, why)]
    used: list = field(default_factory=list)        # [Val] read (their runs and test sets)
    guard: bool = False                             # can only fail the claim (a trend's steps)
    hold_only: bool = False                         # can only make the claim hold (a bound valid one way only)
    fail_union: int = 1                             # it fails for one of this many candidates chosen by their means
    family: int = 1                                 # comparisons of one kind made at once (a competitor each)
    hold_union: int = 1                             # it holds for one of this many candidates chosen by their
    #                                                 means (the best of a list, a peak's interior point): Bonferroni
    display: bool = False                           # the comparison the claim's effect is shown by
    absent: set = field(default_factory=set)        # competitors blank in a cell (not run there)

    def add(self, name: str, vals: list[Val], f, text: str = "", kind: str | None = None) -> None:
        self.cells.append(effect(name, vals, f, text or "; ".join(str(v) for v in vals), kind))
        self.used += vals
