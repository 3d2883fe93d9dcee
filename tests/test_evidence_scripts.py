"""scripts/evidence/scd_scale.py builds the configs its docs/evidence.md table says it ran (no training here)."""
from __future__ import annotations

import importlib.util

from pflrepro.paths import REPO_ROOT
from pflrepro.pipeline import experiments


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "scripts" / "evidence" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_scd_scale_e1_is_the_mini_and_e5_changes_only_the_epochs():
    grids = _script("scd_scale").grids()
    mini = experiments.grid(experiments.load_profile("scd_table1", "mini"))
    e1, e5 = grids["E=1 (mini)"], grids["E=5"]
    for m in ("fedavg", "feddyn", "ditto", "fedrep", "scd"):      # the same run addresses as dvc repro's: reused
        for s in ("alpha=1", "alpha=0.1"):
            assert e1[(m, s, 0)].key() == mini[(m, s, 0)].key()
            assert e5[(m, s, 0)].to_dict() == {**e1[(m, s, 0)].to_dict(), "local_epochs": 5}
    assert e1[("scd_no_pm", "alpha=1", 0)].hparams["lam_p"] == 0.0
    assert e1[("scd_prox5", "alpha=0.1", 0)].hparams["code_prox"] == 5.0
    assert ("scd_prox5", "alpha=1", 0) not in e5 and len(e1) == 16 and len(e5) == 14


def test_verdict_changes_lists_what_moved_and_the_counts(tmp_path):
    """scripts/evidence/verdict_changes.py (issue 51's before/after table): the counts per paper, every claim whose
    verdict moved, the flagged ones and the per-seed spread."""
    import json
    row = {"paper": "p", "interval": "", "evidence": "a > b: effect 1 [0, 2] (paired t): holds", "seeds": 3}
    before = [{**row, "id": "x", "verdict": "holds"}, {**row, "id": "y", "verdict": "fails"}]
    after = [{**row, "id": "x", "verdict": "underpowered", "power": 0.06, "seed_sd": 1.0},
             {**row, "id": "y", "verdict": "fails", "metric_sensitive": True, "robust_verdict": "inconclusive",
              "seed_sd": 4.0}]
    (tmp_path / "b.json").write_text(json.dumps(before))
    (tmp_path / "a.json").write_text(json.dumps(after))
    mod = _script("verdict_changes")
    assert mod.main([str(tmp_path / "b.json"), str(tmp_path / "a.json"), "--out", str(tmp_path / "c.md")]) == 0
    text = (tmp_path / "c.md").read_text()
    assert "| p | 1 -> 0 | 0 -> 0 | 1 -> 1 |" in text and "Verdicts that moved (1):" in text
    assert "| p | x | holds | underpowered |" in text and "| p | y | fails | inconclusive" in text
    assert "| p | x | underpowered | 6 % |" in text and "| p | 2 | 1 | 2.5 | 4 | 16 |" in text


def test_noise_draws_move_one_stream_each_from_a_shared_base():
    noise = _script("noise")
    grid = noise.draws(noise.SOURCES, 3, 1000)
    base = {(d.seed, d.seeds) for d in grid if d.draw == 0}
    assert len(base) == 1                                   # draw 0: one config for every source
    b = next(d for d in grid if d.draw == 0)
    assert b.seed == 1000 and dict(b.seeds) == {"partition": 1000, "split": 1000, "init": 1000}
    for d in grid:
        if d.draw == 0:
            continue
        moved = {k for k, v in d.seeds if v != 1000} | ({"seed"} if d.seed != 1000 else set())
        want = {"partition": {"partition"}, "split": {"split"}, "init": {"init"}, "order": {"seed"},
                "all": {"partition", "split", "init", "seed"}}[d.source]
        assert moved == want, d


def test_noise_configs_pin_pilot_streams_and_share_the_base_run():
    noise = _script("noise")
    cfgs = noise.configs("pfedsd_table2", "pfedsd", ["fedavg"], ["partition", "order"], 2, 1000, profile="smoke")
    assert {k[0] for k in cfgs} == {"pfedsd", "fedavg"}
    assert cfgs[("pfedsd", "partition", 0)].key() == cfgs[("pfedsd", "order", 0)].key()
    assert cfgs[("fedavg", "partition", 1)].seeds == {"partition": 1001, "split": 1000, "init": 1000}
    assert cfgs[("fedavg", "order", 1)].seed == 1001 and cfgs[("fedavg", "order", 1)].stream_seed("init") == 1000
    assert all(c.seed >= 1000 for c in cfgs.values())       # pilot seeds: no verdict's


def test_noise_decomposition_reads_paired_differences():
    """Hand-made runs: the reference leads by 1 point at every `partition` draw except one (+3), so that source's SD of
    the difference is the SD of (1, 1, 3); the `order` draws differ by exactly 1 (SD 0)."""
    import numpy as np
    import pandas as pd
    noise = _script("noise")
    rows = []
    for src, lead in (("partition", [1, 1, 3]), ("order", [1, 1, 1])):
        for i, d in enumerate(lead):
            base = 80.0 + 5 * i                      # the draw moves both methods together (pairing removes it)
            rows += [{"method": "a", "source": src, "draw": i, "best": base + d, "last": base + d - 0.5,
                      "curve": np.array([base + d, base + d - 1]), "n_eff": 400.0, "wall_s": 10.0},
                     {"method": "b", "source": src, "draw": i, "best": base, "last": base - 0.5,
                      "curve": np.array([base, base]), "n_eff": 400.0, "wall_s": 10.0}]
    t = noise.decompose(pd.DataFrame(rows), "a").set_index("source")
    assert abs(t.loc["partition", "sd_best"] - np.std([1, 1, 3], ddof=1)) < 1e-12
    assert t.loc["order", "sd_best"] == 0 and t.loc["order", "mean_best"] == 1
    assert abs(t.loc["order", "sd_within_last"] - np.std([1, 0], ddof=1)) < 1e-12
    # the test images: binomial SD of a difference of two ~0.8 accuracies over 400 images, in points
    p, q = 0.81, 0.80
    assert abs(t.loc["order", "sd_test_binomial"] - 100 * np.sqrt((p * (1 - p) + q * (1 - q)) / 400)) < 1e-9
    assert abs(noise.detectable(1.0, 3) - (2.919986 + 1.060660) / np.sqrt(3)) < 1e-4


def test_design_configs_change_one_thing_each_on_pilot_seeds():
    """scripts/evidence/design.py (issue 54's design table): every design is the setting with one change, at ordinary
    pilot seeds (no stream pinned); a design the setting already has is reported, not run."""
    design = _script("design")
    cfgs, skipped = design.configs("pfedsd_table2", "pfedsd", ["fedper"], list(design.DESIGNS), 2, 2000,
                                   profile="smoke")
    base = cfgs[("base", "fedper", 2000)]
    assert base.seed == 2000 and base.seeds == {} and cfgs[("base", "pfedsd", 2001)].seed == 2001
    for d, change in (("clients_x2", {"n_clients": 2 * base.n_clients}), ("rounds_x2", {"rounds": 2 * base.rounds}),
                      ("rounds_half", {"rounds": base.rounds // 2})):
        assert cfgs[(d, "fedper", 2000)].to_dict() == {**base.to_dict(), **change}
    assert ("full" in skipped) == (base.participation >= 1.0)
    more = cfgs[("tests_x4", "fedper", 2000)]
    assert more.to_dict() == {**base.to_dict(), "split_params": {**base.split_params, "extra_test":
                                                                  more.split_params["extra_test"]}}
    assert more.split_params["extra_test"] > 0 and base.split_params["extra_test"] == 0
    both = cfgs[("tests_x4_rounds_x2", "fedper", 2000)]
    assert both.to_dict() == {**more.to_dict(), "rounds": 2 * base.rounds}


def test_design_summary_pairs_by_seed_and_prices_a_seed():
    """Hand-made results: the reference leads by (1, 2, 3) at three seeds, each seed's two runs cost 30 + 30 s: SD 1,
    a seed 60 s, so a 3-minute budget buys 3 seeds and the detectable effect there is the 3-seed one."""
    import types

    import numpy as np
    design = _script("design")
    res = {}
    for s, lead in zip((7, 8, 9), (1, 2, 3)):
        for m, acc in (("a", 0.80 + lead / 100), ("b", 0.80)):
            res[("base", m, s)] = types.SimpleNamespace(metric=lambda _, acc=acc: np.array([acc - 0.1, acc]),
                                                        provenance={"wall_seconds": 30.0})
    t = design.summarize(res, "a", "pm_acc_mean", budget_min=3.0).iloc[0]
    assert t.comparison == "a - b" and t.seeds == 3 and abs(t.mean_diff - 2) < 1e-9 and abs(t.sd_diff - 1) < 1e-9
    assert t.cpu_s_per_seed == 60 and t.seeds_in_budget == 3 and t.mde_budget == t.mde_3 == design.noise.detectable(1.0, 3)
    assert t.priced_by == "wall"
    for r in res.values():          # the runs' own CPU time, where every run has it: 10 s each, not their wall's 30
        r.provenance["cpu_seconds"] = 10.0
    t = design.summarize(res, "a", "pm_acc_mean", budget_min=3.0).iloc[0]
    assert t.priced_by == "cpu" and t.cpu_s_per_seed == 20 and t.seeds_in_budget == 9


def test_stage_cost_counts_a_shared_run_once_and_prices_missing_seeds():
    """scripts/evidence/stage_cost.py: two stages reading the same run count it once; a claimed one-seed stage at a
    3-seed target adds two runs priced at its stored seed's wall time; an unclaimed stage adds nothing."""
    sc = _script("stage_cost")
    a, b = '{"algorithm": "a"}', '{"algorithm": "b"}'
    stages = {"t1": [(a, 0, 10.0, "r1"), (a, 1, 20.0, "r2"), (a, 2, 30.0, "r3")], "t2": [(a, 0, 10.0, "r1")],
              "f1": [(b, 0, 7.0, "r4")], "x": [('{"algorithm": "c"}', 0, 99.0, "r5")]}
    rows, tot = sc.cost_table(stages, {"t1", "t2", "f1"}, 3)
    assert tot["distinct_runs"] == 5 and tot["cpu_s_now"] == 10 + 20 + 30 + 7 + 99
    assert tot["runs_added"] == 2 and tot["cpu_s_added"] == 14.0
    assert {r["stage"]: r["cpu_s_per_seed"] for r in rows} == {"t1": 20.0, "t2": 10.0, "f1": 7.0, "x": 99.0}


def test_choose_design_groups_stages_that_share_a_run_and_prices_a_seed_once():
    """scripts/evidence/choose_design.py: stages reading one run share a group (and so a design and a seed count); a
    group's seed costs its distinct configs once."""
    cd = _script("choose_design")
    stages = {"t2": [("a", 0, 1.0, "r1"), ("b", 0, 1.0, "r2")], "t4": [("a", 0, 1.0, "r1")],
              "t3": [("c", 0, 1.0, "r3")]}
    gs = cd.groups(stages, {"a": 10.0, "b": 20.0, "c": 5.0})
    assert [sorted(g["stages"]) for g in gs] == [["t2", "t4"], ["t3"]]
    assert [g["cost"] for g in gs] == [30.0, 5.0] and [g["seeds"] for g in gs] == [1, 1]


def test_choose_design_sizes_a_claim_by_its_largest_comparison_and_prices_designs():
    """A claim is sized by the largest pilot SD of its comparisons (the pilot's largest where one was not run); a
    design's cost is the pilot's CPU ratio only when both were priced by CPU time, else what it changes."""
    cd, noise = _script("choose_design"), _script("noise")
    pilot = {"sd": {("r", "m1"): 1.0, ("r", "m2"): 2.0, ("r", "m3"): 4.0}, "cost": 10.0, "priced_by": "cpu"}
    assert cd.claim_sd({"points": {"r > m1": {}, "r > m2": {}}}, pilot) == 2.0
    assert cd.claim_sd({"points": {"m1 > r": {}}}, pilot) == 1.0        # the order of a pair does not matter
    assert cd.claim_sd({"points": {"r > other": {}}}, pilot) == 4.0     # not piloted: the pilot's largest
    assert cd.claim_sd({"points": {"diff near 0.5": {}}}, pilot) == 4.0   # a band whose methods are not known
    uses = ['{"dataset": "d", "method": "m1", "setting": "s"}', '{"dataset": "d", "method": "r", "setting": "s"}']
    assert cd.claim_sd({"points": {"diff near 0.5": {}}, "uses": uses}, pilot) == 1.0   # the two methods it reads
    assert cd.claim_sd({"points": {"decreasing along setting (ends)": {}}}, pilot) == 4.0   # not a pair
    assert cd.claim_sd({"points": {"tau=3 > tau=1": {}}}, pilot) == 4.0   # settings of one method, not a pair
    wall = {**pilot, "priced_by": "wall", "cost": 30.0}
    assert cd.cost_ratio("tests_x4", {**pilot, "cost": 12.0}, pilot) == 1.2
    assert cd.cost_ratio("tests_x4", wall, pilot) == 1.0 and cd.cost_ratio("rounds_x2", wall, pilot) == 2.0
    # hand-sized: at 3 seeds the detectable effect is (t_.95 + t_.80, 2 df) * SD / sqrt(3) = 2.298 SD (t_.95 = 2.920, t_.80 = 1.061)
    assert abs(noise.detectable(1.0, 3) - 3.9806 / 3 ** 0.5) < 1e-3
    claims = [{"points": {"r > m1": {}}, "paper_effect": 2.5}, {"points": {"r > m2": {}}, "paper_effect": -2.5}]
    opts = cd.options({"cost": 100.0}, claims, {"base": pilot}, noise.detectable, 4)
    assert [(o["n"], o["sized"], o["cost"]) for o in opts] == [(3, 1, 300.0), (4, 1, 400.0)]


def test_choose_design_maximises_sized_claims_in_budget_and_else_takes_three_cheapest_seeds():
    """Within the budget: the most claims sized (ties: fewer CPU-seconds). Over it, the amendment: every group at 3
    seeds and its cheapest design, one within 10 % counting as as cheap (then the most sized, then base)."""
    cd = _script("choose_design")
    o = lambda d, n, cost, sized, rel=1.0: {"design": d, "n": n, "cost": cost, "sized": sized, "rel": rel}  # noqa: E731
    g1 = [o("base", 3, 30, 0), o("base", 6, 60, 1), o("tests_x4", 3, 31, 1)]
    g2 = [o("base", 3, 50, 0), o("rounds_x2", 3, 100, 2)]
    picks, fits = cd.choose([g1, g2], budget=200)
    assert fits and [(p["design"], p["n"]) for p in picks] == [("tests_x4", 3), ("rounds_x2", 3)]
    picks, fits = cd.choose([g1, g2], budget=90)
    assert fits and [(p["design"], p["n"]) for p in picks] == [("tests_x4", 3), ("base", 3)]
    picks, fits = cd.choose([g1, g2], budget=60)                        # 3 seeds everywhere needs 80: over
    assert not fits and [(p["design"], p["n"]) for p in picks] == [("tests_x4", 3), ("base", 3)]
    g3 = [o("base", 3, 30, 0, 2.0), o("tests_x4", 3, 32, 0, 1.5), o("rounds_x2", 3, 60, 1, 0.5)]
    picks, _ = cd.choose([g3], budget=10)
    assert picks[0]["design"] == "tests_x4"                             # as cheap, the smaller detectable effect
