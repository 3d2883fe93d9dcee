"""pflrepro.reporting.verdicts: the interval, power and decision rule of the claims ledger, on hand-computed
cases (issue 31: no verdict from an assumed noise, fewer than 3 seeds decide nothing, a consistent deficit across
cells can fail, a straddling interval is underpowered exactly when the paper's effect is below what the profile
could detect)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from pflrepro.reporting import verdicts
from pflrepro.reporting.verdicts import Region, Sample, decide


def s(name, *values):
    return Sample(name, float(np.mean(values)), values=np.array(values, dtype=float))


# ------------------------------------------------------------------ regions
@pytest.mark.parametrize("region, lo, hi, side", [
    (Region(">", 0.0), 0.1, 2.0, "in"),
    (Region(">", 0.0), 0.0, 2.0, "straddle"),       # touching the null is not above it
    (Region(">", 0.0), -2.0, 0.0, "out"),            # a tie does not hold "a > b"
    (Region(">=", 1.0), 1.0, 1.0, "in"),             # at least 1: exactly 1 holds
    (Region(">=", 1.0), 0.5, 0.99, "out"),
    (Region("<", 0.0), -3.0, -1.0, "in"),
    (Region("<=", 1.0), 1.5, 2.0, "out"),
    (Region("band", lo=2.0, hi=4.0), 3.5, 6.0, "in"),          # overlaps the claimed magnitude
    (Region("band", lo=2.0, hi=4.0), 4.5, 6.0, "out"),         # excludes it
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
    assert Region("band", lo=2.46, hi=6.46, null=0.0, above=True).gap(4.46) == 4.46
    assert Region("band", lo=-1.0, hi=1.0).gap(0.3) == 1.0    # "within 1 of the paper": the tolerance


# ------------------------------------------------------------------ intervals
def test_three_seeds_percentile_interval_is_their_range():
    # P(a resample of 3 is all the smallest) = 1/27 = 3.7 % > 2.5 %: the percentile interval is [min, max]
    assert verdicts.bootstrap_ci([np.array([0.5, 2.0, 1.0])]) == (0.5, 2.0)


def test_bootstrap_is_deterministic_and_stratified():
    cells = [np.array([1.0, 2.0, 4.0, 3.0]), np.array([-1.0, 0.5, 0.0, 1.0])]
    a = verdicts.bootstrap_ci(cells)
    assert a == verdicts.bootstrap_ci(cells)                  # a fixed generator: same table, same interval
    point = (2.5 + 0.125) / 2
    assert a[0] < point < a[1]
    # stratified: each cell resampled within itself, so the pooled interval lies inside [mean of mins, mean of maxes]
    assert (1.0 - 1.0) / 2 <= a[0] and a[1] <= (4.0 + 1.0) / 2
    # equal values have no spread: the interval is the point
    assert verdicts.bootstrap_ci([np.array([1.5, 1.5, 1.5])]) == (1.5, 1.5)


def test_mde_hand_computed():
    # one cell, seeds 1, 2, 3: sd 1, se 1/sqrt(3), df 2; MDE = (t_.975,2 + t_.80,2) * se = (4.303 + 1.061) / 1.732
    m = verdicts.mde([s("c", 1.0, 2.0, 3.0)])
    assert m == pytest.approx((stats.t.ppf(0.975, 2) + stats.t.ppf(0.8, 2)) / math.sqrt(3))
    assert m == pytest.approx(3.097, abs=1e-3)
    # two such cells pooled: se = sqrt(2 * (1/3)) / 2, df 4
    m2 = verdicts.mde([s("a", 1.0, 2.0, 3.0), s("b", 5.0, 6.0, 7.0)])
    assert m2 == pytest.approx((stats.t.ppf(0.975, 4) + stats.t.ppf(0.8, 4)) * math.sqrt(2 / 3) / 2)


# ------------------------------------------------------------------ decisions
def test_fewer_than_three_seeds_decide_nothing():
    d = decide([s("c", 5.0)], Region(">", 0.0))             # one seed, 5 points ahead: still no verdict
    assert d.verdict == "underpowered" and d.ci is None and "1 seed" in d.why
    d = decide([s("c", 5.0, 6.0)], Region(">", 0.0))         # two seeds: no interval either
    assert d.verdict == "underpowered" and d.ci is None and "2 seeds" in d.why


def test_three_seeds_hold_fail_or_straddle():
    assert decide([s("c", 1.0, 0.2, 0.6)], Region(">", 0.0)).verdict == "holds"
    assert decide([s("c", -1.0, -0.2, -0.6)], Region(">", 0.0)).verdict == "fails"
    d = decide([s("c", 1.0, 0.2, -0.6)], Region(">", 0.0), paper_effect=10.0)
    assert d.verdict == "inconclusive" and d.ci == (-0.6, 1.0)        # could have seen the paper's 10 points


def test_underpowered_when_the_paper_effect_is_below_what_the_profile_detects():
    cell = [s("c", 1.0, 0.2, -0.6)]                        # sd 0.8, se 0.46, MDE 2.48
    assert decide(cell, Region(">", 0.0), paper_effect=0.5).verdict == "underpowered"
    assert decide(cell, Region(">", 0.0), paper_effect=3.0).verdict == "inconclusive"
    assert decide(cell, Region(">", 0.0), paper_effect=None).verdict == "inconclusive"


def test_a_consistent_small_deficit_across_cells_fails():
    # a method 0.4 points behind in 6 of 6 cells; each cell alone straddles 0, pooled they are decidedly behind
    cells = [s(f"c{i}", -1.0, -0.6, 0.4) for i in range(6)]
    assert all(decide([c], Region(">", 0.0)).verdict != "fails" for c in cells)
    d = decide(cells, Region(">", 0.0))
    assert d.verdict == "fails" and d.ci[1] < 0, d


def test_all_needs_every_cell_and_fails_on_one_decidedly_against():
    good = [s(f"c{i}", 2.0, 2.5, 3.0) for i in range(3)]
    assert decide(good, Region(">", 0.0)).verdict == "holds"
    # pooled above 0, but one cell's own estimate is below: not "all"
    mixed = good + [s("bad", -0.5, 0.2, -0.1)]
    d = decide(mixed, Region(">", 0.0), paper_effect=5.0)
    assert d.verdict == "inconclusive" and "some cell" in d.why
    # one cell decidedly against (every seed far below): fails even though the pool is above 0
    against = good * 3 + [s("bad", -20.0, -21.0, -19.0)]
    d = decide(against, Region(">", 0.0))
    assert d.verdict == "fails" and d.cells_against == ["bad"]
    # the average reading ("most") takes the pool alone
    assert decide(mixed, Region(">", 0.0), quantifier="most").verdict == "holds"


def test_any_holds_on_one_cell_and_fails_when_all_are_against():
    cells = [s("a", -1.0, -0.5, -0.8), s("b", 3.0, 4.0, 3.5)]
    assert decide(cells, Region(">", 0.0), quantifier="any").verdict == "holds"
    cells = [s("a", -1.0, -0.5, -0.8), s("b", -3.0, -4.0, -3.5)]
    assert decide(cells, Region(">", 0.0), quantifier="any").verdict == "fails"


def test_cells_with_fewer_seeds_are_left_out_of_the_pool():
    d = decide([s("three", 1.0, 2.0, 1.5), s("one", -9.0)], Region(">", 0.0))
    assert d.verdict == "holds" and d.left_out == ["one"]


def test_guard_only_fails():
    steps = [s("a->b", 1.0, 2.0, 1.5), s("b->c", -0.1, 0.3, 0.1)]
    assert decide(steps, Region(">", 0.0), guard=True).verdict == "holds"
    steps.append(s("c->d", -5.0, -6.0, -5.5))
    assert decide(steps, Region(">", 0.0), guard=True).verdict == "fails"


def test_exact_and_delta_samples():
    assert decide([Sample("bytes", 1.0, exact=True)], Region("<=", 1.0)).verdict == "holds"
    assert decide([Sample("bytes", 1.01, exact=True)], Region("<=", 1.0)).verdict == "fails"
    # a mean ± std without seeds: a t interval, wider than nothing, narrower than nothing at all
    d = decide([Sample("c", 2.0, se=0.2, df=4)], Region(">", 0.0))
    h = stats.t.ppf(0.975, 4) * 0.2
    assert d.verdict == "holds" and d.ci == pytest.approx((2.0 - h, 2.0 + h))


def test_magnitude_claim_slightly_below_fails():
    # DC-PFL "surpasses the best baseline by 1.22 %" while every seed has it 0.1-0.3 below
    region = Region("band", lo=1.22 - 1.0, hi=1.22 + 1.0, null=0.0, above=True)
    assert decide([s("c", -0.1, -0.3, -0.2)], region).verdict == "fails"
    assert decide([s("c", 1.0, 1.5, 0.8)], region).verdict == "holds"
    assert decide([s("c", 4.0, 5.0, 4.5)], region).verdict == "fails"          # far more than claimed


def test_combine():
    assert verdicts.combine(["holds", "holds"]) == "holds"
    assert verdicts.combine(["holds", "fails"]) == "fails"
    assert verdicts.combine(["holds", "inconclusive"]) == "inconclusive"
    assert verdicts.combine(["inconclusive", "underpowered"]) == "inconclusive"   # part of it was detectable
    assert verdicts.combine(["holds", "underpowered"]) == "underpowered"
    assert verdicts.combine(["fails", "holds"], "any") == "holds" and verdicts.combine(["fails", "fails"], "any") == "fails"
    assert verdicts.combine([]) == "not run"
