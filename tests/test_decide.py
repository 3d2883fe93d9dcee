"""What would decide an undecided headline claim (issue 54): the seeds at which the whole claim would hold with 80 %
power were the paper's effects true (`claims.seeds_needed`, from `verdicts.power` at n seeds), their CPU time from the
runs the claim read (`claims.what_would_decide`), and the report's table (`replication.decide_markdown`)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

from pflrepro.reporting import claims, replication, verdicts


def _sample(values):
    v = np.asarray(values, dtype=float)
    return verdicts.Sample("cell", float(v.mean()), values=v, seeds=tuple(range(len(v))))


def test_power_at_the_seeds_it_has_is_its_power_and_grows_with_seeds():
    s = _sample([0.4, 1.1, 0.7])
    assert verdicts.power(s, 0.8, n=3) == verdicts.power(s, 0.8)
    ps = [verdicts.power(s, 0.8, n=n) for n in (3, 5, 10, 30)]
    assert ps == sorted(ps) and ps[-1] > 0.99


def test_power_at_n_seeds_is_the_noncentral_t_by_hand():
    """sd 1, effect 0.5 beyond the boundary, 12 seeds: df 11, noncentrality 0.5 * sqrt(12), one-sided 5 %."""
    s = _sample([-1.0, 0.0, 1.0])                   # sd exactly 1
    want = stats.nct.sf(stats.t.ppf(0.95, 11), 11, 0.5 * math.sqrt(12))
    assert math.isclose(verdicts.power(s, 0.5, n=12), want, rel_tol=1e-9)


def test_seeds_needed_is_the_first_n_with_80_percent_power():
    s = _sample([-1.0, 0.0, 1.0])
    n = claims.seeds_needed(lambda k: verdicts.power(s, 0.5, n=k))
    assert verdicts.power(s, 0.5, n=n) >= 0.8 > verdicts.power(s, 0.5, n=n - 1)
    assert n == 27        # (z_.95 + z_.8)^2 / 0.5^2 = 24.7, plus the t's heavier tails
    assert claims.seeds_needed(lambda k: None) is None
    assert claims.seeds_needed(lambda k: 0.1) == claims.MAX_SEEDS + 1


def test_a_claim_needing_two_comparisons_needs_more_seeds_than_either():
    a, b = _sample([-1.0, 0.0, 1.0]), _sample([-1.0, 0.0, 1.0])
    one = claims.seeds_needed(lambda k: verdicts.power(a, 0.5, n=k))
    both = claims.seeds_needed(lambda k: claims._claim_power([verdicts.power(a, 0.5, n=k),
                                                               verdicts.power(b, 0.5, n=k)], False))
    assert both > one


def _row(**kw):
    base = {"paper": "toy", "id": "best", "stage": "toy_table", "headline": True, "verdict": "underpowered",
            "seeds": 3, "power": 0.3, "seeds_for_power": 12, "uses": ['{"method": "a"}'], "mde": 2.0, "seed_sd": 1.0,
            "paper_gap": 0.9, "table": "table"}
    return {**base, **kw}


def test_what_would_decide_prices_the_missing_seeds_from_the_runs_it_read(tmp_path):
    (tmp_path / "toy_table").mkdir()
    pd.DataFrame({"method": ["a", "a", "a"], "seed": [0, 1, 2], "run": ["r0", "r1", "r2"],
                  "wall_s": [60.0, 60.0, 60.0]}).to_csv(tmp_path / "toy_table" / "runs.csv", index=False)
    rows = [_row(), _row(id="decided", verdict="holds"), _row(id="side", headline=False),
            _row(id="seen", verdict="inconclusive", power=0.9), _row(id="one", seeds=1, power=None,
                                                                     seeds_for_power=None)]
    claims.what_would_decide(rows, tmp_path)
    main, decided, side, seen, one = rows
    assert "decide_seeds" not in decided and "decide_seeds" not in side
    assert main["decide_seeds"] == 12
    assert math.isclose(main["decide_cpu_hours"], 9 * 60 / 3600)   # 9 more seeds of 60 s (180 s over 3 seeds)
    assert seen["decide_seeds"] == 3 and "had the power" in seen["decide_note"]
    assert one["decide_seeds"] is None and "at least 3" in one["decide_note"]
    md = replication.decide_markdown(rows)
    assert "What would decide the undecided headline claims" in md
    assert "| best | underpowered | 3 | 1 | 2 | 0.9 | 12 | 9.0 min |" in md, md
    assert replication.decide_markdown([_row(verdict="holds")]) == ""
