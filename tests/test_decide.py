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


def test_gpu_time_and_paper_scale_are_priced_at_the_device_checks_measured_rates(tmp_path, monkeypatch):
    """`claims.scale`: the seeds still to run at the fastest CUDA engine's rate on mini's workload (a CPU row and a
    slower engine ignored), from the runs' own FLOP estimates; the paper's scale at the paper-scale workload's rate.
    By hand: 3 runs of 6e11 FLOPs over 3 seeds = 6e11 a seed; 9 seeds to run at 2e9 FLOP/s = 2,700 s; the paper
    profile's 8e15 FLOPs at 4e9 FLOP/s = 2e6 s = 556 h."""
    from pflrepro.reporting.claims import scale
    lease = tmp_path / "device" / "2026-01-01-h200" / "call1"
    lease.mkdir(parents=True)
    pd.DataFrame({"workload": ["a_mini", "a_mini", "a_mini", "b_paper_b64"],
                  "engine": ["conventional", "batched", "batched", "batched"],
                  "device": ["cuda", "cuda", "cpu", "cuda"],
                  "achieved_flops": [1e9, 2e9, 9e9, 4e9]}).to_csv(lease / "bench_engines.csv", index=False)
    older = tmp_path / "device" / "2025-06-01-h100" / "call1"     # an older lease's faster engine: the newest counts
    older.mkdir(parents=True)
    pd.DataFrame({"workload": ["a_mini"], "engine": ["batched"], "device": ["cuda"],
                  "achieved_flops": [5e10]}).to_csv(older / "bench_engines.csv", index=False)
    monkeypatch.setattr(scale, "DEVICE_ROOT", tmp_path / "device")
    assert scale.measured_rates(tmp_path / "device") == {"a_mini": (2e9, "2026-01-01-h200"),
                                                         "b_paper_b64": (4e9, "2026-01-01-h200")}
    res = tmp_path / "results"
    (res / "toy_table").mkdir(parents=True)
    pd.DataFrame({"method": ["a"] * 3, "seed": [0, 1, 2], "run": ["r0", "r1", "r2"],
                  "wall_s": [60.0] * 3}).to_csv(res / "toy_table" / "runs.csv", index=False)
    for r in ("r0", "r1", "r2"):
        (res / "runs" / r).mkdir(parents=True)
        (res / "runs" / r / "provenance.json").write_text('{"train_flops_estimate": 6e11}')
    asked = []
    monkeypatch.setattr(scale, "paper_flops", lambda stage, methods: asked.append((stage, methods)) or 8e15)
    rows = [_row()]
    claims.what_would_decide(rows, res)
    assert math.isclose(rows[0]["decide_gpu_s"], 2700.0)
    assert asked == [("toy_table", ("a",))]
    assert math.isclose(rows[0]["paper_scale"]["gpu_s"], 2e6) and rows[0]["paper_scale"]["tflops"] == 8000
    md = replication.decide_markdown(rows)
    assert "| 9.0 min | 45.0 min | 8,000 TFLOPs: 556 h GPU |" in md, md
    assert "2026-01-01-h200" in md
    monkeypatch.setattr(scale, "DEVICE_ROOT", tmp_path / "none")    # no lease on record: neither figure
    rows = [_row()]
    claims.what_would_decide(rows, res)
    assert "decide_gpu_s" not in rows[0] and "paper_scale" not in rows[0]


def test_the_methods_a_claim_read_are_parsed_from_its_uses_once_for_every_reader():
    """`loading.used_keys` / `used_methods`: each `uses` key parsed to its fields; the methods sorted, each once, and a
    cell without a method column adds none."""
    from pflrepro.reporting.claims.loading import used_keys, used_methods
    row = {"uses": ['{"method": "fedper", "setting": "a"}', '{"method": "fedavg", "setting": "a"}',
                    '{"method": "fedper", "setting": "b"}', '{"setting": "a"}']}
    assert used_keys(row)['{"setting": "a"}'] == {"setting": "a"}
    assert used_methods(row) == ("fedavg", "fedper")
    assert used_methods({"uses": []}) == () and used_methods({}) == ()


def test_paper_flops_are_the_paper_profiles_runs_of_the_claims_methods():
    """Every seed and setting of the stage's paper profile for those methods, by budget.run_flops (no data needed); a
    stage without a paper profile has none."""
    from pflrepro.pipeline import budget
    from pflrepro.pipeline.experiments import grid, load_profile
    from pflrepro.reporting.claims import scale
    g = grid(load_profile("pfedsd_table2", "paper"))
    want = sum(budget.run_flops(c) for (m, _, _), c in g.items() if m == "fedper")
    assert len({k[2] for k in g if k[0] == "fedper"}) == 3 and want > 0
    assert scale.paper_flops("pfedsd_table2", ("fedper",)) == want
    assert scale.paper_flops("no_such_stage", ("fedper",)) is None
