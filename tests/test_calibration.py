"""The claims ledger's error rates, measured (issue 51): a fast, fixed-seed part of benchmarks/bench_calibration.py.

Simulated tables with known effects go through `claims.judge` (the code that judges the reproduced tables) at
each shape's boundary: P(holds) and P(fails) must each stay within 3 Monte Carlo standard errors of 5 %
(`calibration.bound`). The shapes are those where a100f42's rule was measured wrong (one cell at 3 seeds: the
seeds' range; `all` and `any` over 6 cells; a `best` claim level with 7 rivals; bands that held on overlap; one-
test-image steps) and one of every other claim form the claims files use. The full grid (the grid, 3, 5 and 10
seeds, five noises) and the power table: docs/evidence.md, "Calibrated verdicts"."""
from __future__ import annotations

import pytest

from pflrepro.reporting import calibration
from pflrepro.reporting.calibration import Shape

DRAWS = 300

SHAPES = [
    Shape("order"),                                   # a100f42: holds 13.8 %, fails 11.9 %
    Shape("order", noise="t3"),
    Shape("order", noise="binom7"),                   # accuracies over 7 test images: steps of 14 points
    Shape("order", "all", cells=6),                   # a100f42: fails 55.9 %
    Shape("order", "any", cells=6),                   # a100f42: holds 56.2 %
    Shape("order", "most", cells=3, seeds=5),
    Shape("best", rivals=7),                          # a100f42: fails 45.1 %
    Shape("order_list", rivals=3, cells=3),
    Shape("order_all", rivals=3),
    Shape("order_all_any", "any", rivals=3, cells=3),
    Shape("order_all_any", "all", rivals=3, cells=3),  # one pair at the boundary in every cell, the others against
    Shape("trend", rivals=2, cells=3),
    Shape("trend_ends", rivals=4),
    Shape("peak", rivals=4, cells=3),                 # every series with one interior point level with its ends
    Shape("near_diff"),                               # bands held on overlap
    Shape("near_diff_side", noise="binom30"),
    Shape("near_value", cells=3),
    Shape("near_margin", rivals=3),
    Shape("near_margin", "most", cells=3, rivals=3),  # leaders chosen per cell and pooled: 9 % before the two bounds
    Shape("ratio", seeds=10),
    Shape("ratio_band"),
    Shape("near_ratio", "most", cells=3),
]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_error_rates_at_the_boundary_are_at_most_five_percent(shape):
    for variant, bounded in calibration.checks(shape).items():
        r = calibration.rates(shape, variant, DRAWS, seed=51)
        for what in bounded:
            assert r[f"p_{what}"] <= calibration.bound(DRAWS), (variant, what, r)


def test_the_simulation_can_see_a_miscalibrated_rule(monkeypatch):
    """The check has teeth: the same simulation flags a rule that decides at 80 % one-sided confidence."""
    from pflrepro.reporting import verdicts
    monkeypatch.setattr(verdicts, "ALPHA", 0.2)
    r = calibration.rates(Shape("order"), "boundary", DRAWS, seed=51)
    assert r["p_holds"] > calibration.bound(DRAWS) and r["p_fails"] > calibration.bound(DRAWS)


def test_power_rises_with_the_effect_and_the_seeds():
    """Not a bound, a sanity check of the simulation: at 2 noise sds a claim holds more often than at 1, and with
    10 seeds more often than with 3."""
    p = {(n, v): calibration.rates(Shape("order", seeds=n), v, 200, seed=51)["p_holds"]
         for n in (3, 10) for v in ("power1", "power2")}
    assert p[(3, "power1")] < p[(3, "power2")] and p[(3, "power1")] < p[(10, "power1")]
    assert p[(10, "power2")] > 0.95
