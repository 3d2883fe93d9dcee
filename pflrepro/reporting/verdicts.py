"""Verdicts from measured uncertainty: intervals over paired seeds, power, and the decision rule (issue 31).

A claim's form (`claims.py`) turns a table into one or more *comparisons*, each an effect per cell of the table
(a difference, a margin over the best competitor, a ratio, the ends of a series...) computed PER SEED where the
values carry their seeds (seed s draws one partition and one initialisation for every method, so the effect is
paired), and a claimed *region* for that effect (`a > b`: effect > 0; "by 1.22 %": within 1.22 ± tolerance and
above 0). This module decides a comparison:

1. **Interval.** A 95 % confidence interval for the effect pooled over the claim's cells (the mean over cells of
   each cell's mean over seeds), by a stratified percentile bootstrap over seeds: `scipy.stats.bootstrap` with one
   sample per cell (each cell's seeds resampled within the cell), 9,999 resamples, a fixed generator (the same
   table always gives the same interval). Cells with fewer than MIN_SEEDS = 3 seeds are left out of the pool; a
   comparison with no such cell gets no interval. Values without per-seed entries (a table column that only has a
   mean ± std over n seeds, or the papers' printed mean ± std over `paper_seeds`) get a t interval from the
   delta-method standard error (`scipy.stats.t`), unpaired, which is wider. Exact quantities (`noise: none`:
   bytes, MACs) are their own interval.
   With 3 seeds a percentile bootstrap interval of a mean is the range of the seeds' effects: a claim holds
   only when every seed agrees, fails only when every seed is against it. It undercovers at so few seeds;
   more seeds or cells narrow it.
2. **Region.** holds: the interval lies inside the claimed region (for a magnitude: on the claimed side of the
   null AND overlapping the claimed magnitude ± tolerance); fails: it lies outside (on the other side, or
   excluding the claimed magnitude); otherwise it straddles.
3. **Cells.** `all` (the default quantifier) also needs every cell's own estimate on the claimed side to hold (a
   magnitude: every cell's interval consistent with it), and
   checks each cell alone at the Bonferroni level 1 - 0.05 / k: one cell decidedly against the claim fails it. `most` is the pooled interval alone (the average effect);
   `any` holds when one cell holds at the Bonferroni level, fails when the pooled interval is against and no cell
   holds.
4. **Power.** A straddling comparison is *underpowered* when the minimum detectable effect at this profile's seeds
   and spread, MDE = (t_{0.975, df} + t_{0.80, df}) * SE (a paired t test at 80 % power; SE the pooled standard
   error of the effect, df the seeds' degrees of freedom), exceeds the paper's own effect's distance from the
   null (the same comparison on the paper's printed numbers), and *inconclusive* otherwise: the profile could have
   seen the paper's effect and did not decide. No interval (fewer than 3 seeds): underpowered.

Nothing here reads files or knows about papers: numbers in, a `Decision` out.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

VERDICTS = ("holds", "partial", "fails", "inconclusive", "underpowered", "by design", "not run")
SUPPORT = ("holds", "partial")          # verdicts that count as support for the paper
DECIDED = ("holds", "partial", "fails")
MIN_SEEDS = 3
CONFIDENCE = 0.95
POWER = 0.80
N_RESAMPLES = 9999
_RNG_SEED = 0


@dataclass(frozen=True)
class Region:
    """Where the claim puts its effect. One-sided: `op` in >, >=, <, <= against `t`. Two-sided (a magnitude):
    `op` = "band", the closed interval [lo, hi], and, where the claim also has a side, `null` (the effect must be
    above it when the band is above it, below when below: "DC-PFL surpasses by 1.22 %" is null 0, band around 1.22)."""
    op: str
    t: float = 0.0
    lo: float = -math.inf
    hi: float = math.inf
    null: float | None = None
    above: bool | None = None     # with `null`: the claimed side (True: effect > null)

    def __str__(self) -> str:
        if self.op != "band":
            return f"{self.op} {_fmt(self.t)}"
        side = "" if self.null is None else f", {'above' if self.above else 'below'} {_fmt(self.null)}"
        return f"in [{_fmt(self.lo)}, {_fmt(self.hi)}]{side}"

    def side(self, lo: float, hi: float) -> str:
        """'in', 'out' or 'straddle' for an interval [lo, hi] of the effect."""
        if lo != lo or hi != hi:
            return "straddle"
        if self.op == ">":
            return "in" if lo > self.t else ("out" if hi <= self.t else "straddle")
        if self.op == ">=":
            return "in" if lo >= self.t else ("out" if hi < self.t else "straddle")
        if self.op == "<":
            return "in" if hi < self.t else ("out" if lo >= self.t else "straddle")
        if self.op == "<=":
            return "in" if hi <= self.t else ("out" if lo > self.t else "straddle")
        if hi < self.lo or lo > self.hi:
            return "out"
        if self.null is not None:
            above = bool(self.above)
            if (hi <= self.null) if above else (lo >= self.null):
                return "out"
            if not ((lo > self.null) if above else (hi < self.null)):
                return "straddle"
        return "in"

    def gap(self, effect: float) -> float:
        """How far an effect is from the boundary the claim must clear (what a test must be able to detect)."""
        if self.op == "band":
            return abs(effect - self.null) if self.null is not None else (self.hi - self.lo) / 2
        return abs(effect - self.t)


@dataclass
class Sample:
    """One cell's effect: per-seed values (paired), or a point with a standard error (from a mean ± std over
    `n` seeds: the papers' printed numbers, or a column without per-seed entries), or an exact point."""
    name: str
    point: float
    values: np.ndarray | None = None      # per-seed effects
    se: float | None = None               # standard error of `point` (when no per-seed values)
    df: float | None = None               # its degrees of freedom
    exact: bool = False
    text: str = ""

    @property
    def n(self) -> int:
        return 0 if self.values is None else int(len(self.values))


@dataclass
class Decision:
    verdict: str                           # holds / fails / inconclusive / underpowered
    point: float                           # the pooled effect (mean over cells of each cell's mean)
    ci: tuple[float, float] | None         # its 95 % interval (None: no interval)
    method: str                            # how the interval was made
    seeds: int                             # the fewest seeds of a cell in the pool (0: none per seed)
    mde: float | None = None               # minimum detectable effect (80 % power)
    cells_against: list = field(default_factory=list)   # cells decidedly against (Bonferroni)
    cells_for: list = field(default_factory=list)
    left_out: list = field(default_factory=list)          # cells with fewer than MIN_SEEDS seeds
    why: str = ""

    def interval_text(self) -> str:
        if self.ci is None:
            return f"{_fmt(self.point)} (no interval: {self.why})" if self.why else _fmt(self.point)
        return f"{_fmt(self.point)} [{_fmt(self.ci[0])}, {_fmt(self.ci[1])}]"


def _fmt(x: float) -> str:
    if x is None or x != x:
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return f"{x:.2f}" if abs(x) >= 10 else f"{x:.3g}"


# ------------------------------------------------------------------ intervals
def _mean_of_means(*xs, axis=-1):
    return np.mean([np.mean(x, axis=axis) for x in xs], axis=0)


def bootstrap_ci(samples: list[np.ndarray], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Stratified percentile bootstrap of the mean over cells of each cell's mean (one array of per-seed effects
    a cell; each resampled within itself), by scipy.stats.bootstrap with a fixed generator."""
    arrays = [np.asarray(s, dtype=np.float64) for s in samples]
    point = float(_mean_of_means(*arrays))
    if all(np.ptp(a) == 0 for a in arrays if np.all(np.isfinite(a))) and all(np.all(np.isfinite(a)) for a in arrays):
        return point, point                        # no spread: the bootstrap distribution is one point
    if not all(np.all(np.isfinite(a)) for a in arrays):   # a never-reached target counted as worst (±inf)
        lows = [np.min(a) for a in arrays]
        highs = [np.max(a) for a in arrays]
        return float(np.mean(lows)), float(np.mean(highs))
    res = stats.bootstrap(tuple(arrays), _mean_of_means, n_resamples=N_RESAMPLES, confidence_level=confidence,
                          method="percentile", vectorized=True, rng=np.random.default_rng(_RNG_SEED))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def pooled_se(samples: list[Sample]) -> tuple[float, float]:
    """Standard error of the pooled effect and its degrees of freedom: from the per-seed spread (std with ddof 1
    over n seeds, df n - 1 per cell) or from each sample's own se and df."""
    k = len(samples)
    var, df = 0.0, 0.0
    for s in samples:
        if s.values is not None and s.n >= 2:
            if not np.all(np.isfinite(s.values)):   # a never-reached target (inf): no spread to size a test with
                continue
            var += float(np.var(s.values, ddof=1)) / s.n
            df += s.n - 1
        elif s.se is not None:
            var += s.se ** 2
            df += s.df or 0.0
    return math.sqrt(var) / k, df


def t_ci(samples: list[Sample], confidence: float = CONFIDENCE) -> tuple[float, float]:
    point = float(np.mean([s.point for s in samples]))
    se, df = pooled_se(samples)
    if se == 0:
        return point, point
    h = float(stats.t.ppf(0.5 + confidence / 2, max(df, 1.0))) * se
    return point - h, point + h


def mde(samples: list[Sample], confidence: float = CONFIDENCE, power: float = POWER) -> float | None:
    """Minimum detectable effect of the pooled comparison: (t_{1-alpha/2, df} + t_{power, df}) * SE."""
    se, df = pooled_se(samples)
    if df < 1:
        return None
    return float((stats.t.ppf(0.5 + confidence / 2, df) + stats.t.ppf(power, df)) * se)


def interval(samples: list[Sample], confidence: float = CONFIDENCE) -> tuple[tuple[float, float] | None, str]:
    """The interval of the pooled effect over `samples` and how it was made; None when there is none."""
    if not samples:
        return None, ""
    if all(s.exact for s in samples):
        p = float(np.mean([s.point for s in samples]))
        return (p, p), "exact"
    if all(s.values is not None for s in samples):
        return bootstrap_ci([s.values for s in samples], confidence), \
            f"stratified bootstrap over seeds ({min(s.n for s in samples)}+ seeds, {len(samples)} cell(s))"
    if all(s.se is not None and s.se == s.se for s in samples):
        return t_ci(samples, confidence), "t interval from mean ± std (unpaired)"
    return None, ""


# ------------------------------------------------------------------ decisions
def decide(samples: list[Sample], region: Region, quantifier: str = "all", paper_effect: float | None = None,
           guard: bool = False, family: int = 1, strict_in: bool = False) -> Decision:
    """One comparison over its cells (module docstring). `guard`: a check that can only fail a claim (a trend's
    steps): it 'holds' unless some cell is decidedly against at the Bonferroni level. `family`: how many such
    comparisons the claim makes at once (a `best` claim: one per competitor): a comparison fails the claim only when
    its interval at the Bonferroni level 1 - 0.05/family is against it (`strict_in`: and holds only at that level,
    for a claim that needs one comparison of many to hold)."""
    usable = [s for s in samples if s.exact or s.values is None or s.n >= MIN_SEEDS]
    usable = [s for s in usable if s.exact or s.values is not None or (s.se is not None and s.se == s.se)]
    left_out = [s.name for s in samples if s not in usable]
    point = float(np.mean([s.point for s in samples])) if samples else float("nan")
    if not usable:
        n = max((s.n for s in samples), default=0)
        why = f"{n} seed{'s' if n != 1 else ''} a cell (an interval needs {MIN_SEEDS})" if n else \
            "no per-seed values and no spread"
        return Decision("holds" if guard else "underpowered", point, None, "", n,
                        mde(samples) if n >= 2 else None, left_out=left_out, why=why)
    ci, method = interval(usable)
    wide = ci if family <= 1 else interval(usable, 1 - (1 - CONFIDENCE) / family)[0]
    point = float(np.mean([s.point for s in usable]))
    k = len(usable)
    per_cell = []
    if k > 1 or guard:
        for s in usable:
            c, _ = interval([s], 1 - (1 - CONFIDENCE) / (max(k, 1) * max(family, 1)))
            per_cell.append((s.name, region.side(*c) if c else "straddle"))
    against = [n for n, side in per_cell if side == "out"]
    for_ = [n for n, side in per_cell if side == "in"]
    seeds = min((s.n for s in usable if s.values is not None), default=0)
    d = Decision("inconclusive", point, ci, method, seeds, None, against, for_, left_out)
    pooled = region.side(*(wide if strict_in else ci))
    if pooled == "out" and region.side(*wide) != "out":   # against at 95 %, not at the family's level
        pooled = "straddle"
    if guard:
        d.verdict = "fails" if against else "holds"
        return d
    if quantifier == "any":
        d.verdict = "holds" if (for_ or (k == 1 and pooled == "in")) else ("fails" if pooled == "out" else "")
    elif quantifier == "most":
        d.verdict = {"in": "holds", "out": "fails"}.get(pooled, "")
    else:   # all: pooled on the claimed side and every cell's own estimate there too; one cell decidedly against fails
        every = region.op == "band" or all(region.side(s.point, s.point) == "in" for s in usable)
        d.verdict = "fails" if (pooled == "out" or against) else ("holds" if pooled == "in" and every else "")
        if pooled == "in" and not every:
            d.why = "some cell's own estimate is not on the claimed side"
    if d.verdict:
        return d
    d.mde = mde(usable) if not all(s.exact for s in usable) else None
    lead = f"{d.why}; " if d.why else ""
    if d.mde is None:
        d.verdict, d.why = "underpowered", lead + "no spread to size a test"
    elif paper_effect is None or paper_effect != paper_effect:
        d.verdict, d.why = "inconclusive", lead + "the paper's own effect is not known here"
    elif d.mde > region.gap(paper_effect):
        d.verdict = "underpowered"
        d.why = lead + f"detectable effect {_fmt(d.mde)} > the paper's {_fmt(region.gap(paper_effect))}"
    else:
        d.verdict = "inconclusive"
        d.why = lead + f"detectable effect {_fmt(d.mde)} <= the paper's {_fmt(region.gap(paper_effect))}: could have seen it"
    return d


def combine(decisions: list[str], mode: str = "all") -> str:
    """A claim made of several comparisons (a > b1 and a > b2; a trend's ends and its steps): all must hold
    (`mode` 'any': one must hold, and it fails only when all fail)."""
    if not decisions:
        return "not run"
    if mode == "any":
        if "holds" in decisions:
            return "holds"
        if all(v == "fails" for v in decisions):
            return "fails"
    elif "fails" in decisions:
        return "fails"
    elif all(v == "holds" for v in decisions):
        return "holds"
    if "inconclusive" in decisions:   # a part this profile could have seen and did not: evidence, not just power
        return "inconclusive"
    return "underpowered"
