"""pflrepro.reporting.health: the run-health rules on hand-made loss and accuracy histories, and the columns
report.tidy writes into every notebook's runs.csv."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from pflrepro.pipeline.store import summarise
from pflrepro.reporting import health
from pflrepro.reporting import tables as report


def test_loss_spike_is_against_the_lowest_earlier_round():
    # pFedSD at lr 0.01, B = 16 on Table 3's shards (docs/evidence.md): 1.07 -> 15.6 in round 2
    ratio, at = health.loss_spike([1.07, 15.6, 9.0, 3.0])
    assert (ratio, at) == (pytest.approx(15.6 / 1.07), 1)
    # the low so far is 0.5 (index 2), not the previous round: 0.5 -> 0.8 -> 3.0 is 6x that low at index 4
    assert health.loss_spike([2.0, 1.0, 0.5, 0.8, 3.0]) == (pytest.approx(6.0), 4)


def test_loss_spike_needs_a_nat_as_well_as_the_ratio():
    # partial participation: a well-fit round at 0.01, then new clients at 0.5 (50x, but 0.49 nat)
    assert math.isnan(health.loss_spike([0.3, 0.01, 0.5])[0])
    assert health.loss_spike([0.3, 0.01, 0.5])[1] is None
    assert health.loss_spike([2.3, 1.2, 0.7, 0.5]) == (pytest.approx(float("nan"), nan_ok=True), None)  # learning
    assert health.loss_spike([1.0, 2.0]) == (pytest.approx(2.0), 1)   # one nat, 2x: reported, below the ratio
    assert health.loss_spike([float("nan"), 1.0, float("inf"), 5.0]) == (pytest.approx(5.0), 3)   # non-finite skipped
    assert health.loss_spike([])[1] is None


def test_warnings_collapse_fall_and_the_spikes_that_are_not_flagged():
    collapse = health.warnings(15.6 / 1.07, 84.6, 50.0)               # the pFedSD run: spike, then one class a client
    assert len(collapse) == 1 and collapse[0].startswith("collapse:") and "14.6x" in collapse[0] and "34.6" in collapse[0]
    assert health.warnings(10.5, 74.0, 74.0) == []                    # FedGen: its generator terms start in round 2
    assert health.warnings(4.0, 60.0, 50.0)[0].startswith("collapse:")  # both thresholds met exactly
    assert health.warnings(3.99, 60.0, 45.0) == []                     # spike just under the ratio, fall under 20
    assert health.warnings(4.0, 60.0, 50.1) == []                      # fall just under 10 points
    fall = health.warnings(float("nan"), 74.0, 46.0)                   # HypCluster's swings: best 74, last 46
    assert len(fall) == 1 and fall[0].startswith("fall:") and "28.0" in fall[0]
    assert health.warnings(float("nan"), 74.0, 54.1) == []
    assert health.warnings(20.0, float("nan"), float("nan")) == []    # nothing evaluated: nothing to say


def _run(losses, accs):
    history = [{"round": i + 1, "train_loss": l, "gm_acc": a, "pm_acc_mean": a, "pm_acc_weighted": a,
                "pm_acc_std": 0.0, "pm_acc_min": a} for i, (l, a) in enumerate(zip(losses, accs))]
    return SimpleNamespace(config=SimpleNamespace(dataset="fmnist"), history=history, summary=summarise(history),
                           provenance={"wall_seconds": 1.0}, path=SimpleNamespace(name="run-x"))


def test_tidy_writes_each_runs_spike_and_flags():
    t = report.tidy({("pfedsd", "s", 0): _run([1.07, 15.6, 12.0, 11.0], [0.846, 0.5, 0.5, 0.5]),
                     ("fedper", "s", 0): _run([1.2, 0.8, 0.6, 0.5], [0.7, 0.8, 0.85, 0.86])}).set_index("method")
    assert t.loc["pfedsd", "loss_spike"] == pytest.approx(15.6 / 1.07, abs=1e-3)
    assert t.loc["pfedsd", "spike_round"] == 2                         # the history's round, not its index
    assert t.loc["pfedsd", "health"].startswith("collapse:")
    assert math.isnan(t.loc["fedper", "loss_spike"]) and t.loc["fedper", "health"] == ""
