"""pflrepro.reporting.verdicts: the intervals, power and decision rule of the claims ledger, on hand-computed cases
(issue 31: no verdict from an assumed noise, fewer than 3 seeds decide nothing; issue 51: one-sided t tests at
5 % a side, a test-set floor under the seeds' spread, intersection-union for `all`, Bonferroni/Holm for failing,
two one-sided tests for bands). The measured error rates: tests/test_calibration.py."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from pflrepro.reporting import verdicts
from pflrepro.reporting.verdicts import Region, Sample, decide


def s(name, *values, floor=0.0):
    return Sample(name, float(np.mean(values)), values=np.array(values, dtype=float),
                  seeds=tuple(range(len(values))), floor=floor)


def t_interval(values, alpha=0.05):
    v = np.array(values, dtype=float)
    h = stats.t.ppf(1 - alpha, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v))
    return v.mean() - h, v.mean() + h


# ------------------------------------------------------------------ regions
@pytest.mark.parametrize("region, lo, hi, side", [
    (Region(">", 0.0), 0.1, 2.0, "in"),
    (Region(">", 0.0), 0.0, 2.0, "straddle"),       # touching the null is not above it
    (Region(">", 0.0), -2.0, 0.0, "out"),            # a tie does not hold "a > b"
    (Region(">=", 1.0), 1.0, 1.0, "in"),             # at least 1: exactly 1 holds
    (Region(">=", 1.0), 0.5, 0.99, "out"),
    (Region("<", 0.0), -3.0, -1.0, "in"),
    (Region("<=", 1.0), 1.5, 2.0, "out"),
    (Region("band", lo=2.0, hi=4.0), 2.5, 3.5, "in"),          # inside the claimed magnitude: equivalence shown
    (Region("band", lo=2.0, hi=4.0), 3.5, 6.0, "straddle"),    # overlapping it is not enough (issue 51)
    (Region("band", lo=2.0, hi=4.0), 4.5, 6.0, "out"),         # excludes it
    (Region("band", lo=-2.0, hi=2.0), -6.0, 10.0, "straddle"),  # the issue's -6, 1.9, 10 do not hold "0 ± 2"
    # "surpasses by 1.22 (tolerance 2)": band [-0.78, 3.22], and above 0
    (Region("band", lo=-0.78, hi=3.22, null=0.0, above=True), 0.3, 2.0, "in"),
    (Region("band", lo=-0.78, hi=3.22, null=0.0, above=True), -0.5, 2.0, "straddle"),
    (Region("band", lo=-0.78, hi=3.22, null=0.0, above=True), -0.5, -0.1, "out"),   # slightly BELOW: fails
    (Region("band", lo=0.9, hi=1.1, null=1.0, above=False), 0.92, 0.98, "in"),
])
def test_region_sides(region, lo, hi, side):
    assert region.side(lo, hi) == side


def test_region_gap_is_what_a_test_must_detect():
    assert Region(">", 0.0).gap(1.5) == 1.5
    assert Region(">", 2.0).gap(1.5) == 0.5                   # a margin claim: the distance to the margin
    assert Region("band", lo=2.46, hi=6.46, null=0.0, above=True).gap(4.46) == pytest.approx(2.0)   # to the nearer edge
    assert Region("band", lo=-1.0, hi=1.0).gap(0.3) == pytest.approx(0.7)
    assert Region("band", lo=-1.0, hi=1.0).gap(3.0) == 0.0    # outside the band: nothing inside to detect


# ------------------------------------------------------------------ intervals
def test_three_seeds_get_a_t_interval_not_their_range():
    # seeds 0.5, 2.0, 1.0: mean 1.1667, sd 0.7638, se 0.441; t_.95,2 = 2.920: [-0.121, 2.455], wider than [0.5, 2.0]
    c, how = verdicts.cell_interval(s("c", 0.5, 2.0, 1.0))
    assert c == pytest.approx((1.1667 - 2.920 * 0.441, 1.1667 + 2.920 * 0.441), abs=2e-3)
    assert c[0] < 0.5 and c[1] > 2.0 and "paired t over 3 seeds" in how


def test_floor_replaces_a_smaller_spread_and_zero_spread_without_one_has_no_interval():
    same = s("c", 1.43, 1.43, 1.43)
    assert verdicts.cell_interval(same)[0] is None                      # no spread, no known resolution
    floored = s("c", 1.43, 1.43, 1.43, floor=2.0)                       # sd sqrt(2), se sqrt(2/3)
    c, how = verdicts.cell_interval(floored)
    h = stats.t.ppf(0.95, 2) * math.sqrt(2.0 / 3.0)
    assert c == pytest.approx((1.43 - h, 1.43 + h)) and "test-set floor" in how
    wide = s("c", 0.0, 2.0, 4.0, floor=0.5)                             # its own variance 4 > the floor: kept
    assert verdicts.cell_interval(wide)[0] == pytest.approx(t_interval([0.0, 2.0, 4.0]))


def test_floor_variance_hand_computed():
    # one accuracy of 80 % over 100 images: 0.8 * 0.2 / 100 = 0.0016 -> 16 points^2
    assert verdicts.floor_variance("value", [80.0], [100.0]) == pytest.approx(16.0)
    # a difference of 1.43 points over 70 images: at least (0.0143 - 0.0143^2) / 70, in points^2
    assert verdicts.floor_variance("diff", [91.43, 90.0], [70.0, 70.0]) == pytest.approx(1e4 * (0.0143 - 0.0143 ** 2) / 70)
    # the smaller of two test sets counts; equal accuracies have a floor of 0 (they may agree on every image)
    assert verdicts.floor_variance("diff", [90.0, 90.0], [70.0, 700.0]) == 0.0
    # a ratio: the difference's floor over b^2 (in proportions)
    assert verdicts.floor_variance("ratio", [60.0, 50.0], [100.0, 100.0]) == pytest.approx((0.1 - 0.01) / 100 / 0.25)
    assert verdicts.floor_variance("diff", [90.0, 80.0], [float("nan"), 10.0]) == 0.0     # unknown: no floor


def test_sign_interval_for_a_target_never_reached():
    inf = math.inf
    assert verdicts.sign_interval(np.array([inf, inf, inf])) == (-inf, inf)     # 3 signs: P = 1/8 > 5 %
    lo, hi = verdicts.sign_interval(np.array([2.0, inf, 5.0, inf, 1.0]))       # 5: P(all one sign) = 1/32
    assert (lo, hi) == (1.0, inf)


def test_mde_hand_computed():
    # one cell, seeds 1, 2, 3: sd 1, se 1/sqrt(3), df 2; MDE = (t_.95,2 + t_.80,2) * se = (2.920 + 1.061) / 1.732
    m = verdicts.mde(s("c", 1.0, 2.0, 3.0))
    assert m == pytest.approx((stats.t.ppf(0.95, 2) + stats.t.ppf(0.8, 2)) / math.sqrt(3))
    assert m == pytest.approx(2.298, abs=1e-3)


def test_pool_pairs_cells_by_seed():
    # two cells, seeds 0..2: the pooled sample is each seed's mean over the cells, t with 2 df
    p, _ = verdicts.pool([s("a", 1.0, 2.0, 3.0), s("b", 5.0, 6.0, 10.0)])
    assert list(p.values) == [3.0, 4.0, 6.5] and p.seeds == (0, 1, 2)
    # cells without common seeds: Welch over their means
    q, _ = verdicts.pool([Sample("a", 2.0, values=np.array([1.0, 2.0, 3.0])), Sample("b", 6.0, values=np.array([5.0, 6.0, 7.0]))])
    assert q.se == pytest.approx(math.sqrt(2 * (1 / 3)) / 2) and q.df == pytest.approx(4.0)


# ------------------------------------------------------------------ decisions
def test_fewer_than_three_seeds_decide_nothing():
    d = decide([s("c", 5.0)], Region(">", 0.0))             # one seed, 5 points ahead: still no verdict
    assert d.verdict == "underpowered" and d.ci is None and "1 seed" in d.why
    d = decide([s("c", 5.0, 6.0)], Region(">", 0.0))         # two seeds: no interval either
    assert d.verdict == "underpowered" and d.ci is None and "2 seeds" in d.why
    # a mean ± std over 2 seeds (no per-seed values) decides nothing either
    d = decide([Sample("c", 5.0, se=0.1, df=2, n_seeds=2)], Region(">", 0.0))
    assert d.verdict == "underpowered" and d.ci is None


def test_three_seeds_hold_fail_or_straddle():
    holds = s("c", 1.0, 0.8, 0.6)                 # mean 0.8, se 0.115: lower bound 0.46
    assert decide([holds], Region(">", 0.0)).verdict == "holds"
    assert decide([s("c", -1.0, -0.8, -0.6)], Region(">", 0.0)).verdict == "fails"
    # every seed above 0, but spread: the percentile bootstrap's [0.2, 1.0] held; the t interval straddles
    d = decide([s("c", 1.0, 0.2, 0.6)], Region(">", 0.0), paper_effect=10.0)
    assert d.verdict == "inconclusive" and d.ci == pytest.approx(t_interval([1.0, 0.2, 0.6]))


def test_underpowered_when_the_paper_effect_is_below_what_the_profile_detects():
    cell = [s("c", 1.0, 0.2, -0.6)]                        # sd 0.8, se 0.46, MDE (2.92 + 1.06) * 0.46 = 1.84
    assert decide(cell, Region(">", 0.0), paper_effect=0.5).verdict == "underpowered"
    assert decide(cell, Region(">", 0.0), paper_effect=3.0).verdict == "inconclusive"
    assert decide(cell, Region(">", 0.0), paper_effect=None).verdict == "inconclusive"


def test_most_pools_a_consistent_small_deficit():
    # a method 0.4 points behind in 6 of 6 cells with the same seeds: each cell alone straddles, the per-seed means
    # over the cells (-0.4, -0.4 + e, ...) are decidedly behind
    cells = [s(f"c{i}", -1.0 + 0.01 * i, -0.6, 0.1) for i in range(6)]
    assert all(decide([c], Region(">", 0.0)).verdict != "fails" for c in cells)
    d = decide(cells, Region(">", 0.0), quantifier="most")
    assert d.verdict != "holds"
    cells = [s(f"c{i}", -0.5 + 0.01 * i, -0.45, -0.4) for i in range(6)]
    assert decide(cells, Region(">", 0.0), quantifier="most").verdict == "fails"


def test_all_needs_every_cell_at_alpha_and_fails_on_one_at_alpha_over_k():
    good = [s(f"c{i}", 2.0, 2.5, 3.0) for i in range(3)]
    assert decide(good, Region(">", 0.0)).verdict == "holds"
    # one cell that straddles: not "all", whatever the pool says
    mixed = good + [s("weak", 1.0, -0.2, 0.5)]
    d = decide(mixed, Region(">", 0.0), paper_effect=5.0)
    assert d.verdict == "inconclusive" and d.cells_for == ["c0", "c1", "c2"]
    # one cell decidedly against at alpha / 4: fails
    against = good + [s("bad", -20.0, -21.0, -19.0)]
    d = decide(against, Region(">", 0.0))
    assert d.verdict == "fails" and d.cells_against == ["bad"]
    # against at 5 % but not at 5 % / 4 = 1.25 %: alone it fails, as one of four cells it does not
    edge = s("edge", -1.5, -1.0, -0.5)        # se 0.289: upper bounds -1 + 2.92 se = -0.16, -1 + 6.21 se = 0.79
    assert decide([edge], Region(">", 0.0)).verdict == "fails"
    assert decide(good + [edge], Region(">", 0.0)).verdict != "fails"


def test_all_does_not_drop_a_thin_cell():
    # the old rule left the one-seed cell out and held on the other; a cell that cannot be tested blocks "all"
    d = decide([s("three", 1.0, 2.0, 1.5), s("one", -9.0)], Region(">", 0.0))
    assert d.verdict == "underpowered" and d.left_out == ["one"] and "one" in d.why


def test_any_holds_on_one_cell_at_alpha_over_k_and_fails_when_every_cell_is_against():
    cells = [s("a", -1.0, -0.5, -0.8), s("b", 3.0, 4.0, 3.5)]
    assert decide(cells, Region(">", 0.0), quantifier="any").verdict == "holds"
    cells = [s("a", -1.0, -0.5, -0.8), s("b", -3.0, -4.0, -3.5)]
    assert decide(cells, Region(">", 0.0), quantifier="any").verdict == "fails"
    # a cell that holds at 5 % but not at 5 % / 2: not enough for "any" over two cells
    marginal = s("m", 1.0, 0.5, 1.7)        # mean 1.07, se 0.35: lower 95 % bound 0.05, lower 97.5 % bound -0.43
    assert decide([marginal], Region(">", 0.0)).verdict == "holds"
    assert decide([marginal, s("z", -1.0, 0.0, 1.0)], Region(">", 0.0), quantifier="any").verdict != "holds"


def test_guard_only_fails():
    steps = [s("a->b", 1.0, 2.0, 1.5), s("b->c", -0.1, 0.3, 0.1)]
    assert decide(steps, Region(">", 0.0), guard=True).verdict == "holds"
    steps.append(s("c->d", -5.0, -6.0, -5.5))
    assert decide(steps, Region(">", 0.0), guard=True).verdict == "fails"


def test_exact_and_delta_samples():
    assert decide([Sample("bytes", 1.0, exact=True)], Region("<=", 1.0)).verdict == "holds"
    assert decide([Sample("bytes", 1.01, exact=True)], Region("<=", 1.0)).verdict == "fails"
    # a mean ± std over 5 seeds without per-seed values: a Welch t interval
    d = decide([Sample("c", 2.0, se=0.2, df=4, n_seeds=5)], Region(">", 0.0))
    h = stats.t.ppf(0.95, 4) * 0.2
    assert d.verdict == "holds" and d.ci == pytest.approx((2.0 - h, 2.0 + h))


def test_band_holds_only_inside_and_fails_only_outside():
    band = Region("band", lo=-2.0, hi=2.0)
    d = decide([s("c", -6.0, 1.9, 10.0)], band, paper_effect=0.0)      # the case: held on overlap before
    assert d.verdict in ("inconclusive", "underpowered")
    assert decide([s("c", -0.3, 0.1, 0.2)], band).verdict == "holds"
    assert decide([s("c", 5.0, 5.5, 6.0)], band).verdict == "fails"


def test_magnitude_claim_slightly_below_fails():
    # DC-PFL "surpasses the best baseline by 1.22 %" while every seed has it 0.1-0.3 below
    region = Region("band", lo=1.22 - 1.0, hi=1.22 + 1.0, null=0.0, above=True)
    assert decide([s("c", -0.1, -0.3, -0.2)], region).verdict == "fails"
    assert decide([s("c", 1.0, 1.2, 0.9)], region).verdict == "holds"
    assert decide([s("c", 4.0, 5.0, 4.5)], region).verdict == "fails"          # far more than claimed


def test_levels_a_claim_sets():
    # a comparison that holds at 5 % but not at 5 % / 3 (a best-of-three union) is not held at that level
    c = [s("c", 1.0, 0.5, 1.7)]
    assert decide(c, Region(">", 0.0)).verdict == "holds"
    assert decide(c, Region(">", 0.0), hold_alpha=0.05 / 3).verdict != "holds"
    assert verdicts.default_levels("all", 4) == (0.05, 0.0125)
    assert verdicts.default_levels("any", 4) == (0.0125, 0.05)
    assert verdicts.default_levels("most", 4) == (0.05, 0.05)


def test_combine():
    assert verdicts.combine(["holds", "holds"]) == "holds"
    assert verdicts.combine(["holds", "fails"]) == "fails"
    assert verdicts.combine(["holds", "inconclusive"]) == "inconclusive"
    assert verdicts.combine(["inconclusive", "underpowered"]) == "inconclusive"   # part of it was detectable
    assert verdicts.combine(["holds", "underpowered"]) == "underpowered"
    assert verdicts.combine(["fails", "holds"], "any") == "holds" and verdicts.combine(["fails", "fails"], "any") == "fails"
    assert verdicts.combine([]) == "not run"


def test_power_at_the_papers_effect():
    # seeds 1, 2, 3: se 1/sqrt(3), df 2; the true effect 2 beyond the boundary: P(T'(2, ncp 2 sqrt(3)) > t_.95,2)
    c = s("c", 1.0, 2.0, 3.0)
    expected = stats.nct.sf(stats.t.ppf(0.95, 2), 2, 2.0 * math.sqrt(3))
    assert verdicts.power(c, 2.0) == pytest.approx(expected) and 0.5 < expected < 0.9
    assert verdicts.power(c, 2.0, alpha=0.01) < expected                      # a stricter level: less power
    assert verdicts.power(c, -1.0) is None                                     # the paper's effect is not inside
    d = decide([c, c], Region(">", 0.0), paper_effect=2.0)                     # `all` over two cells: both must hold
    assert d.power == pytest.approx(expected ** 2)
    d = decide([c], Region("band", lo=-1.0, hi=3.0), paper_effect=2.0)         # a band: the nearer edge, 1 inside
    assert d.power == pytest.approx(stats.nct.sf(stats.t.ppf(0.95, 2), 2, 1.0 * math.sqrt(3)))
