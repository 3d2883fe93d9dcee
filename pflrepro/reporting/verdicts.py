"""Verdicts whose error rates are measured: intervals over paired seeds and the decision rule (issues 31, 51).

A claim's form (`claims.py`) turns a table into one or more *comparisons*, each an effect per cell of the table
(a difference, a ratio, the ends of a series...) computed PER SEED where the values carry their seeds (seed s draws
one partition and one initialisation for every method, so the effect is paired), and a claimed *region* for that
effect (`a > b`: effect > 0; "within 0.9": effect in [-0.9, 0.9]). This module decides a comparison.

1. **A test per cell, at the seeds it has.** A cell's per-seed effects give a t interval with n - 1 degrees of
   freedom (`t_interval`). Its variance is the seeds' variance, but never below the cell's *floor*: the variance
   that the test images alone put on one seed's effect (an accuracy is a count over n test images; the floor is
   the smallest binomial variance consistent with the values, `floor_variance`), so three seeds that happen to agree
   exactly do not make a spread of zero, and a one-test-image gain on every seed is not certainty. A cell whose
   seeds agree exactly and that has no floor (a discrete quantity of unknown resolution) gets no interval. A cell
   with a seed that never reached a target (an infinite effect, `missing: worst`) is tested by signs alone: the
   distribution-free interval of its median (`sign_interval`; 3 seeds cannot make one, 5 can). Values without
   per-seed entries (a mean ± std over n seeds: a paper's printed numbers) get a Welch t interval from the
   delta-method standard error, and only when every value has at least MIN_SEEDS seeds. Exact quantities
   (`noise: none`) are their own interval.
2. **One-sided tests at ALPHA = 5 % a side.** A comparison *holds* when the one-sided (1 - alpha) bound on the
   claimed side clears the region (for a band, TOST: both bounds inside it), and *fails* when the bound on the
   other side lies outside it. The interval shown is therefore the two-sided 90 % interval whose ends are those
   bounds, and at the claim's boundary each of "holds" and "fails" happens at most 5 % of the time: measured,
   for every claim shape the claims files use, by `benchmarks/bench_calibration.py` (docs/evidence.md,
   "Calibrated verdicts"; `tests/test_calibration.py` runs a fast version).
3. **Cells and families.** `all` (the default quantifier) holds only when EVERY cell holds at alpha
   (intersection-union: no correction needed) and a cell without an interval (fewer than MIN_SEEDS seeds, zero
   spread) blocks it; it fails when one cell is against at the family-wise level (Holm over the cells and over
   the claim's other comparisons; for "is any rejected" Holm's first step, alpha / m, decides). `most` tests the
   mean over cells (per seed over the seeds every cell shares, else Welch over the cells' means). `any` holds
   when one cell holds at alpha / k (Bonferroni) and fails when every cell is against. A claim made of several
   comparisons (a `best` claim: one per competitor) holds when every one holds and fails when one is against at
   alpha / (the claim's number of such tests): the levels are set by `claims.py` (`hold_alpha`, `fail_alpha`).
4. **Power.** A comparison that neither holds nor fails is *underpowered* when the minimum detectable effect at
   this profile's seeds and spread, MDE = (t_{1-alpha, df} + t_{POWER, df}) * SE, exceeds the paper's own
   effect's distance from the boundary (the same comparison on the paper's printed numbers), and *inconclusive*
   otherwise: the profile could have seen the paper's effect and did not decide. No interval: underpowered. That
   is a comparison's label; a claim's is set from its power to hold the whole claim at the paper's own effects
   (`power`, noncentral t; `claims._undecided_by_power`: inconclusive at >= 80 %).

Nothing here reads files or knows about papers: numbers in, a `Decision` out.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

VERDICTS = ("holds", "partial", "fails", "inconclusive", "underpowered", "by design", "not run")
SUPPORT = ("holds", "partial")          # verdicts that count as support for the paper
DECIDED = ("holds", "partial", "fails")
MIN_SEEDS = 3
ALPHA = 0.05              # per side: P(holds) and P(fails) at a claim's boundary, each at most this
CONFIDENCE = 1 - 2 * ALPHA    # the interval shown: its ends are the one-sided (1 - ALPHA) bounds
POWER = 0.80
INTERVAL_NAME = f"{round(100 * CONFIDENCE)} % CI"   # what the report calls the interval shown: "90 % CI"


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
        """'in', 'out' or 'straddle' for an interval [lo, hi] of the effect. A band is 'in' only when the whole
        interval lies inside it (equivalence, two one-sided tests) and 'out' only when the whole interval lies
        outside it."""
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
        return "in" if self.lo <= lo and hi <= self.hi else "straddle"

    def inside(self, effect: float) -> float:
        """How far an effect lies inside the region, from its nearest boundary (<= 0: outside)."""
        if self.op in (">", ">="):
            return effect - self.t
        if self.op in ("<", "<="):
            return self.t - effect
        d = min(effect - self.lo, self.hi - effect)
        if self.null is not None:
            d = min(d, (effect - self.null) if self.above else (self.null - effect))
        return d

    def gap(self, effect: float) -> float:
        """How far an effect is from the boundary the claim must clear (what a test must be able to detect)."""
        if self.op == "band":
            inside = min(effect - self.lo, self.hi - effect)
            return max(inside, 0.0) if inside == inside else float("nan")
        return abs(effect - self.t)

    def boundary(self) -> list[float]:
        """The values the claim's boundary runs through (for plots and the calibration benchmark)."""
        if self.op != "band":
            return [self.t]
        return [x for x in (self.lo, self.hi) if math.isfinite(x)]


@dataclass
class Sample:
    """One cell's effect: per-seed values (paired; `seeds` names them, so that cells pair by seed), or a point with
    a standard error (from a mean ± std over `n_seeds` seeds: the papers' printed numbers, or a column without
    per-seed entries), or an exact point. `floor`: the smallest variance one seed's effect can have (test-set
    sampling), 0 when unknown."""
    name: str
    point: float
    values: np.ndarray | None = None      # per-seed effects
    se: float | None = None               # standard error of `point` (when no per-seed values)
    df: float | None = None               # its degrees of freedom
    exact: bool = False
    text: str = ""
    seeds: tuple | None = None            # the seed of each of `values`
    floor: float = 0.0                    # per-seed variance floor of the effect (test images), in its units squared
    n_seeds: int | None = None            # with `se`: the fewest seeds behind a value

    @property
    def n(self) -> int:
        if self.values is not None:
            return int(len(self.values))
        return int(self.n_seeds or 0)


@dataclass
class Decision:
    verdict: str                           # holds / fails / inconclusive / underpowered
    point: float                           # the pooled effect (mean over cells of each cell's mean)
    ci: tuple[float, float] | None         # its 90 % interval (ends: the one-sided 95 % bounds); None: no interval
    method: str                            # how the interval was made
    seeds: int                             # the fewest seeds of a cell (0: none per seed)
    mde: float | None = None               # minimum detectable effect (80 % power)
    cells_against: list = field(default_factory=list)   # cells against the claim at the family-wise level
    cells_for: list = field(default_factory=list)       # cells for it at the level a holding claim needs
    left_out: list = field(default_factory=list)        # cells without an interval (too few seeds, zero spread)
    why: str = ""
    cell_ci: dict = field(default_factory=dict)         # cell name -> its own 90 % interval (None: none)
    power: float | None = None             # P(it holds) were the true effect the paper's own, at this spread
    power_at: object = field(default=None, repr=False, compare=False)   # n seeds -> that power at n seeds

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


@functools.lru_cache(maxsize=4096)
def t_quantile(q: float, df: float) -> float:
    """stats.t.ppf(q, df), remembered (a claims check asks for the same few quantiles thousands of times)."""
    return float(stats.t.ppf(q, df))


@functools.lru_cache(maxsize=1024)
def _sign_rank(n: int, alpha: float) -> int:
    r = 0
    while r < n and stats.binom.cdf(r, n, 0.5) <= alpha:
        r += 1
    return r


# ------------------------------------------------------------------ test-set sampling
def floor_variance(kind: str, means: list[float], n_test: list[float], scale: float = 100.0) -> float:
    """The smallest variance that the test images alone give one seed's effect, in the effect's units squared.
    Accuracies are in % (`scale` 100) over `n_test` effective test images (for a mean over clients of each
    client's accuracy: K^2 / sum(1 / n_k)). `kind`:
    - 'value' (one accuracy p): p (1 - p) / n;
    - 'diff' (a - b): the two models' disagreements on the test images are at least |a - b| of them, so the
      variance of the difference is at least (|d| - d^2) / n (with n the smaller of the two; on disjoint test sets it
      is larger still: p_a q_a / n_a + p_b q_b / n_b >= (|d| - d^2) / n);
    - 'ratio' (a / b): the difference's floor over b^2.
    0 when any `n_test` is unknown (no floor)."""
    if not n_test or any(not (n == n and n > 0) for n in n_test):
        return 0.0
    p = [m / scale for m in means]
    n = min(n_test)
    if kind == "value":
        return scale ** 2 * max(p[0] * (1 - p[0]), 0.0) / n
    d = abs(p[0] - p[1])
    var = max(d - d * d, 0.0) / n
    if kind == "diff":
        return scale ** 2 * var
    if kind == "ratio":
        return var / p[1] ** 2 if p[1] else 0.0
    raise ValueError(f"floor_variance: unknown kind {kind!r}")


# ------------------------------------------------------------------ intervals
def sign_interval(values: np.ndarray, alpha: float = ALPHA) -> tuple[float, float]:
    """The distribution-free interval of the median whose ends are one-sided (1 - alpha) bounds: order statistics
    r and n + 1 - r with P(Binomial(n, 1/2) <= r - 1) <= alpha (the sign test's interval). Infinite values (a
    target never reached) are ordered like any other. With n too small for any r: (-inf, inf)."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    n = len(x)
    r = _sign_rank(n, alpha)
    if r == 0:
        return -math.inf, math.inf
    return float(x[r - 1]), float(x[n - r])


def _spread(s: Sample) -> tuple[float, float] | tuple[None, str]:
    """(variance of one seed's effect, df) of a per-seed sample, or (None, why not)."""
    if s.n < MIN_SEEDS:
        return None, f"{s.n} seed{'s' if s.n != 1 else ''} (an interval needs {MIN_SEEDS})"
    own = float(np.var(s.values, ddof=1))
    if own <= 1e-24 * max(1.0, float(np.mean(s.values)) ** 2):    # equal seeds up to float rounding: no spread
        own = 0.0
    var = max(own, float(s.floor or 0.0))
    if var <= 0:
        return None, f"no spread over {s.n} seeds and no known test-set resolution (zero spread is not certainty)"
    return var, s.n - 1.0


def cell_interval(s: Sample, alpha: float = ALPHA) -> tuple[tuple[float, float] | None, str]:
    """A cell's interval whose ends are one-sided (1 - alpha) bounds, and how it was made (or why there is none)."""
    if s.exact:
        return (s.point, s.point), "exact"
    if s.values is not None:
        v = np.asarray(s.values, dtype=np.float64)
        if s.n >= MIN_SEEDS and not np.all(np.isfinite(v)):
            return sign_interval(v, alpha), f"sign test ({s.n} seeds, a target never reached)"
        var, df = _spread(s)
        if var is None:
            return None, df
        h = t_quantile(1 - alpha, df) * math.sqrt(var / s.n)
        floor = " (test-set floor)" if s.floor and s.floor >= var else ""
        return (s.point - h, s.point + h), f"paired t over {s.n} seeds{floor}"
    if s.se is not None and s.se == s.se:
        if s.n < MIN_SEEDS:
            return None, f"a mean ± std over {s.n} seed{'s' if s.n != 1 else ''} (an interval needs {MIN_SEEDS})"
        if s.se == 0:
            return None, "a mean ± std with no spread"
        h = t_quantile(1 - alpha, max(s.df or 1.0, 1.0)) * s.se
        return (s.point - h, s.point + h), "Welch t from mean ± std (unpaired)"
    return None, "no per-seed values and no spread"


def pool(samples: list[Sample]) -> tuple[Sample | None, str]:
    """The mean over cells as one sample: per seed over the seeds every cell has (cells pair by seed: seed s of
    every cell drew from the same generator), else Welch over the cells' own means and spreads. None (and why)
    when a cell has no interval of its own."""
    if len(samples) == 1:
        return samples[0], ""
    k = len(samples)
    point = float(np.mean([s.point for s in samples]))
    if all(s.exact for s in samples):
        return Sample("pooled", point, exact=True), ""
    per_seed = [s for s in samples if s.values is not None and not s.exact]
    if len(per_seed) == k and all(s.seeds is not None for s in samples):
        common = sorted(set.intersection(*(set(s.seeds) for s in samples)))
        if len(common) >= MIN_SEEDS:
            idx = [{sd: i for i, sd in enumerate(s.seeds)} for s in samples]
            vals = np.array([np.mean([s.values[ix[sd]] for s, ix in zip(samples, idx)]) for sd in common])
            return Sample("pooled", float(np.mean(vals)), values=vals, seeds=tuple(common),
                          floor=sum(s.floor for s in samples) / k ** 2), ""
    var, num, den = 0.0, 0.0, 0.0
    for s in samples:
        if s.exact:
            continue
        if s.values is not None:
            if not np.all(np.isfinite(s.values)):
                return None, f"{s.name}: a target never reached (signs only, and the cells share no seeds)"
            v, df = _spread(s)
            if v is None:
                return None, f"{s.name}: {df}"
            v /= s.n
        elif s.se is not None and s.se == s.se and s.n >= MIN_SEEDS:
            v, df = s.se ** 2, max(s.df or 1.0, 1.0)
        else:
            return None, f"{s.name}: no interval"
        var += v / k ** 2
        num += v / k ** 2
        den += (v / k ** 2) ** 2 / df
    if var == 0:
        return Sample("pooled", point, exact=True), ""
    return Sample("pooled", point, se=math.sqrt(var), df=num ** 2 / den if den else 1.0,
                  n_seeds=min(s.n for s in samples if not s.exact)), ""


def standard_error(s: Sample) -> tuple[float, float] | None:
    """(SE of the sample's mean, df), or None without one."""
    if s.exact:
        return 0.0, math.inf
    if s.values is not None:
        if not np.all(np.isfinite(s.values)):
            return None
        var, df = _spread(s)
        return None if var is None else (math.sqrt(var / s.n), df)
    if s.se is not None and s.se == s.se and s.n >= MIN_SEEDS:
        return s.se, max(s.df or 1.0, 1.0)
    return None


def mde(s: Sample, alpha: float = ALPHA, power: float = POWER) -> float | None:
    """Minimum detectable effect of a one-sided test at level alpha with the given power:
    (t_{1-alpha, df} + t_{power, df}) * SE."""
    se = standard_error(s)
    if se is None or se[0] == 0 or se[1] < 1:
        return None
    return float((t_quantile(1 - alpha, se[1]) + t_quantile(power, se[1])) * se[0])


def power(s: Sample, inside: float, alpha: float = ALPHA, n: int | None = None) -> float | None:
    """P(a one-sided test at alpha clears the boundary) when the true effect lies `inside` beyond it, at the sample's
    spread: the noncentral t's tail (for a band, the nearer edge's test alone: an upper bound of TOST's power). With
    `n`: the same at n seeds of the same per-seed spread (the SE scaled by sqrt(seeds / n), n - 1 degrees of
    freedom; a mean ± std sample's Welch df scaled alike): planning, `claims.seeds_needed`."""
    se = standard_error(s)
    if se is None or se[0] == 0 or inside is None or inside != inside or inside <= 0:
        return None             # exact quantities have no power to speak of; nor has an effect outside the region
    if n is not None and s.n >= 1:
        se = (se[0] * math.sqrt(s.n / n), (n - 1) if s.values is not None else se[1] * (n - 1) / max(s.n - 1, 1))
    tc = t_quantile(1 - alpha, se[1])
    return float(stats.nct.sf(tc, se[1], inside / se[0])) if math.isfinite(se[1]) else \
        float(stats.norm.sf(tc - inside / se[0]))


def _power(samples: list[Sample], pooled: Sample | None, region: Region, quantifier: str, paper_effect, a_hold,
           n: int | None = None):
    """The comparison's power at the paper's own effect: every cell must hold (`all`: the product of the cells'),
    the pool (`most`), or one cell at alpha / k (`any`); at n seeds when `n` is given (`power`)."""
    if paper_effect is None or paper_effect != paper_effect:
        return None
    inside = region.inside(paper_effect)
    if quantifier == "most":
        return power(pooled, inside, a_hold, n) if pooled is not None else None
    ps = [power(s, inside, a_hold, n) for s in samples]
    if any(p is None for p in ps):
        return None
    if quantifier == "any":
        return 1.0 - float(np.prod([1.0 - p for p in ps]))
    return float(np.prod(ps))


# ------------------------------------------------------------------ decisions
def default_levels(quantifier: str, k: int, guard: bool = False) -> tuple[float, float]:
    """(hold_alpha, fail_alpha) of one comparison over k cells decided alone: `all` holds at alpha in every cell
    (intersection-union) and fails on one cell at alpha / k; `any` holds on one cell at alpha / k and fails when every
    cell is against at alpha; `most` tests the pooled mean at alpha both ways; a guard only fails, at alpha / k."""
    if quantifier == "all" or (guard and quantifier != "most"):
        return ALPHA, ALPHA / k
    if quantifier == "any":
        return ALPHA / k, ALPHA
    return ALPHA, ALPHA


def decide(samples: list[Sample], region: Region, quantifier: str = "all", paper_effect: float | None = None,
           guard: bool = False, hold_alpha: float | None = None, fail_alpha: float | None = None,
           hold_only: bool = False) -> Decision:
    """One comparison over its cells (module docstring). `guard`: a check that can only fail a claim (a trend's
    steps): 'holds' unless it is against the region (some cell; with `most`, the pool). `hold_only`: a check that can
    only make a claim hold (a bound that is valid one way only): never 'fails'. `hold_alpha`, `fail_alpha`: the level
    of each test that would make the comparison hold / fail (default: `default_levels`; a claim of several
    comparisons sets them for its family)."""
    k = max(len(samples), 1)
    d_hold, d_fail = default_levels(quantifier, k, guard)
    a_hold = d_hold if hold_alpha is None else hold_alpha
    a_fail = d_fail if fail_alpha is None else fail_alpha
    point = float(np.mean([s.point for s in samples])) if samples else float("nan")
    pooled, why_pool = pool(samples) if samples else (None, "no cells")
    ci, method = cell_interval(pooled, ALPHA) if pooled is not None else (None, why_pool)
    cells = {s.name: (cell_interval(s, a_hold)[0], cell_interval(s, a_fail)[0]) for s in samples}
    bare = {s.name: cell_interval(s, ALPHA) for s in samples}
    left_out = [n for n, (c, _) in bare.items() if c is None]
    against = [n for n, (_, c) in cells.items() if c is not None and region.side(*c) == "out"]
    for_ = [n for n, (c, _) in cells.items() if c is not None and region.side(*c) == "in"]
    seeds = min((s.n for s in samples if not s.exact), default=0)
    d = Decision("", point, ci, method if ci is not None else "", seeds, None, against, for_, left_out,
                 cell_ci={n: c for n, (c, _) in bare.items()})
    if not guard:
        d.power = _power(samples, pooled, region, quantifier, paper_effect, a_hold)
        d.power_at = lambda n: _power(samples, pooled, region, quantifier, paper_effect, a_hold, n)
    if ci is None:
        d.why = why_pool or method
    if quantifier == "most":
        hold_ci = cell_interval(pooled, a_hold)[0] if pooled is not None else None
        fail_ci = cell_interval(pooled, a_fail)[0] if pooled is not None else None
        pooled_out = bool(fail_ci and region.side(*fail_ci) == "out")
        d.verdict = "holds" if hold_ci and region.side(*hold_ci) == "in" else ("fails" if pooled_out else "")
        if guard:
            d.verdict = "fails" if pooled_out else "holds"
            return d
    elif guard:
        d.verdict = "fails" if against and (quantifier != "any" or len(against) == len(samples)) else "holds"
        return d
    elif quantifier == "any":
        d.verdict = "holds" if for_ else ("fails" if len(against) == len(samples) and samples else "")
    else:
        d.verdict = "fails" if against else ("holds" if samples and len(for_) == len(samples) else "")
    if hold_only and d.verdict == "fails":
        d.verdict, d.cells_against = "", []
    if d.verdict:
        return d
    return _undecided(d, samples, pooled, region, quantifier, paper_effect, a_hold)


def _undecided(d: Decision, samples: list[Sample], pooled: Sample | None, region: Region, quantifier: str,
               paper_effect: float | None, a_hold: float) -> Decision:
    """Neither holds nor fails: underpowered when the profile could not have detected the paper's own effect (or
    there is no interval), inconclusive when it could have."""
    if d.left_out and quantifier != "most":
        d.why = f"no interval for {', '.join(d.left_out)}: {_no_interval_reason(samples, d.left_out[0])}"
        d.verdict = "underpowered"
        return d
    if quantifier == "all":     # every cell must clear the boundary: the hardest cell's detectable effect
        mdes = [mde(s, a_hold) for s in samples]
        d.mde = None if any(m is None for m in mdes) else max(mdes, default=None)
    elif quantifier == "any":
        mdes = [m for m in (mde(s, a_hold) for s in samples) if m is not None]
        d.mde = min(mdes) if mdes else None
    else:
        d.mde = mde(pooled, a_hold) if pooled is not None else None
    if d.ci is not None and len(samples) > 1 and quantifier != "most" and region.side(*d.ci) in ("in", "out"):
        d.why = (f"the mean over the cells is {'for' if region.side(*d.ci) == 'in' else 'against'} the claim, but "
                 + ("not every cell holds" if region.side(*d.ci) == "in" else
                    "no cell is against it at the family-wise level"))
    lead = f"{d.why}; " if d.why and d.ci is not None else ""
    if d.mde is None:
        d.verdict = "underpowered"
        d.why = d.why or "no spread to size a test"
    elif paper_effect is None or paper_effect != paper_effect:
        d.verdict, d.why = "inconclusive", lead + "the paper's own effect is not known here"
    elif d.mde > region.gap(paper_effect):
        d.verdict = "underpowered"
        d.why = lead + f"detectable effect {_fmt(d.mde)} > the paper's {_fmt(region.gap(paper_effect))}"
    else:
        d.verdict = "inconclusive"
        d.why = lead + f"detectable effect {_fmt(d.mde)} <= the paper's {_fmt(region.gap(paper_effect))}: could have seen it"
    return d


def _no_interval_reason(samples: list[Sample], name: str) -> str:
    s = next(x for x in samples if x.name == name)
    return cell_interval(s)[1]


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
