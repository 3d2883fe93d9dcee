"""report.compare: reproduced mean/std over seeds beside the paper, with the difference and both rankings."""
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pflrepro.reporting import tables as report


def _runs():
    return pd.DataFrame({"method": ["a", "a", "b", "b"], "setting": ["s"] * 4, "seed": [0, 1, 0, 1],
                         "best": [80.0, 82.0, 90.0, 90.0], "last10": [79.0, 81.0, 89.0, 89.0]})


def test_compare_with_paper_std():
    paper = pd.DataFrame({"method": ["a", "b"], "setting": ["s", "s"], "value": [85.0, 88.0], "std": [0.5, 0.1]})
    out = report.compare(_runs(), paper).set_index("method")
    assert out.loc["a", "reproduced"] == 81.0 and math.isclose(out.loc["a", "repro_std"], math.sqrt(2.0))
    assert out.loc["a", "diff"] == -4.0 and out.loc["b", "diff"] == 2.0
    assert out.loc["a", "paper_std"] == 0.5
    assert (out.loc["b", "rank"], out.loc["b", "paper_rank"]) == (1.0, 1.0)


def test_compare_paper_without_std_column():
    """DC-PFL prints single numbers: no std column in its paper file."""
    paper = pd.DataFrame({"method": ["a", "b"], "setting": ["s", "s"], "value": [91.0, 88.0]})
    out = report.compare(_runs(), paper).set_index("method")
    assert math.isnan(out.loc["a", "paper_std"])
    assert out.loc["a", "diff"] == -10.0
    assert (out.loc["a", "rank"], out.loc["a", "paper_rank"]) == (2.0, 1.0)   # orderings disagree, side by side


def test_compare_keeps_each_seeds_value_for_the_claims_checker():
    """`repro_seeds`: "seed:value" per group, seeds in order whatever the row order, aligned with its group
    (the checker pairs seeds with it); a machine column, left out of the markdown a reader sees."""
    runs = _runs().iloc[[3, 0, 2, 1]].reset_index(drop=True)        # b1, a0, b0, a1
    runs.loc[runs.method == "b", "best"] = [91.5, 90.0]               # b seed 1 = 91.5, seed 0 = 90.0
    out = report.compare(runs, None).set_index("method")
    assert out.loc["a", "repro_seeds"] == "0:80;1:82"
    assert out.loc["b", "repro_seeds"] == "0:90;1:91.5"
    md = report.to_markdown(out.reset_index(), "t", "b")
    assert "repro_seeds" not in md and "0:80" not in md and "reproduced" in md


def test_compare_to_paper_sets_each_setting_beside_its_own_paper_column():
    """A mini profile on other data: every setting beside the one paper column `paper_column` names, or the
    column its `per_setting` maps (FedBSD's MLP setting stands in for FEMNIST's column); on the paper's own
    datasets the paper's rows match by dataset and setting, and no column is named."""
    paper = pd.DataFrame({"dataset": ["cifar10", "cifar10", "femnist", "femnist"],
                          "setting": ["N=100 S=2"] * 2 + ["N=150 S=3"] * 2, "method": ["a", "b", "a", "b"],
                          "value": [85.0, 88.0, 70.0, 75.0]})
    runs = pd.concat([_runs().assign(dataset="fmnist", setting="N=20 S=2"),
                      _runs().assign(dataset="fmnist", setting="N=40 S=3 MLP")], ignore_index=True)
    ref = {"dataset": "cifar10", "setting": "N=100 S=2", "per_setting": {"N=40 S=3 MLP": {"dataset": "femnist",
                                                                                        "setting": "N=150 S=3"}}}
    table, cols, got = report.compare_to_paper(runs, paper, ref, value="best")
    t = table.set_index(["setting", "method"])
    assert t.loc[("N=20 S=2", "a"), "paper"] == 85.0 and t.loc[("N=40 S=3 MLP", "b"), "paper"] == 75.0
    assert t.loc[("N=40 S=3 MLP", "a"), "diff"] == 81.0 - 70.0 and len(table) == 4
    assert set(cols.dataset) == {"cifar10", "femnist"} and got is ref
    assert report.paper_column_note(got) == ("Paper column: cifar10 N=100 S=2; N=40 S=3 MLP: femnist N=150 S=3 "
                                            "(this profile ran other data).")
    single = {"dataset": "cifar10", "setting": "N=100 S=2"}
    t = report.compare_to_paper(runs, paper, single)[0].set_index(["setting", "method"])
    assert t.loc[("N=40 S=3 MLP", "b"), "paper"] == 88.0                 # no per_setting: the one column
    same = report.compare_to_paper(_runs().assign(dataset="cifar10", setting="N=100 S=2"), paper, single)
    assert same[2] is None and same[0].set_index("method").loc["b", "paper"] == 88.0


def test_plot_vs_paper_draws_paper_ticks_only_where_the_paper_has_a_number():
    """mini runs on Fashion-MNIST, the paper printed CIFAR numbers only: an all-missing paper column
    (and a missing cell) must plot the bars and skip the ticks, not fail (dvc repro did, 2026-11-23)."""
    import matplotlib
    matplotlib.use("Agg")
    table = report.compare(_runs(), pd.DataFrame({"method": ["a", "b"], "setting": ["s", "s"],
                                                   "value": [float("nan")] * 2}))
    fig = report.plot_vs_paper(table, "t")
    ax = fig.axes[0]
    assert len(ax.patches) == 2                                      # the two bars
    assert not [c for c in ax.collections if c.get_label() == "paper"]   # and no paper ticks
    table = report.compare(_runs(), pd.DataFrame({"method": ["a"], "setting": ["s"], "value": [85.0]}))
    ax = report.plot_vs_paper(table, "t").axes[0]
    ticks = [c for c in ax.collections if c.get_label() == "paper"]
    assert len(ticks) == 1 and ticks[0].get_offsets().shape == (1, 2) and ticks[0].get_offsets()[0, 1] == 85.0


def test_single_seed_has_no_std_rather_than_zero():
    one = _runs().query("seed == 0")
    out = report.compare(one, None).set_index("method")
    assert out["seeds"].tolist() == [1, 1] and out["repro_std"].isna().all()
    md = report.to_markdown(out.reset_index(), "t", "b").splitlines()
    header = [c.strip() for c in md[4].split("|")]
    row = [c.strip() for c in md[6].split("|")]
    assert row[header.index("repro_std")] == ""               # printed blank, not as a zero spread
    assert "±" not in report.wide(out.reset_index()).iloc[0, 1]


def _fake_run(history, dataset="fmnist"):
    from types import SimpleNamespace

    from pflrepro.pipeline.store import summarise
    return SimpleNamespace(config=SimpleNamespace(dataset=dataset), history=history, summary=summarise(history),
                           provenance={"wall_seconds": 1.0}, path=Path("run"))


def test_compare_metrics_gm_pm_and_paper_rows_not_run():
    from pflrepro.reporting.tables import compare_metrics
    h = [{"round": 1, "gm_acc": 0.5, "pm_acc_weighted": 0.7, "pm_acc_mean": 0.7, "pm_acc_std": 0.0, "pm_acc_min": 0.7}]
    results = {("scd", "alpha=1", 0): _fake_run(h)}
    paper = pd.DataFrame({"setting": ["alpha=1"] * 4, "method": ["scd", "scd", "fedgen", "fedgen"],
                          "metric": ["gm", "pm", "gm", "pm"], "value": [86.37, 92.25, 86.17, 85.24],
                          "std": [0.15, 0.21, 0.32, 0.47]})
    t = compare_metrics(results, paper, {"gm": "gm_acc", "pm": "pm_acc_weighted"})
    scd = t[t.method == "scd"].set_index("metric")
    assert scd.loc["gm", "reproduced"] == 50.0 and scd.loc["pm", "reproduced"] == 70.0
    assert scd.loc["pm", "paper"] == 92.25 and scd.loc["pm", "diff"] == pytest.approx(70.0 - 92.25)
    fedgen = t[t.method == "fedgen"]                 # printed by the paper, not run here: listed, reproduced empty
    assert len(fedgen) == 2 and fedgen["reproduced"].isna().all() and set(fedgen["paper"]) == {86.17, 85.24}


def test_times_to_targets_and_speedups_hand_computed():
    from pflrepro.reporting.tables import speedups, times_to_targets

    def hist(accs, step_cw, step_wf):
        return [{"round": i + 1, "gm_acc": a, "pm_acc_weighted": a, "pm_acc_mean": a, "pm_acc_std": 0.0, "pm_acc_min": a,
                 "sim_time": step_cw * (i + 1), "sim_time_cw": step_cw * (i + 1), "sim_time_wf": step_wf * (i + 1)}
                for i, a in enumerate(accs)]
    results = {("ditto", "alpha=0.1", 0): _fake_run(hist([0.3, 0.5, 0.9], 10.0, 4.0)),
               ("ditto WF", "alpha=0.1", 0): _fake_run(hist([0.2, 0.45, 0.6], 5.0, 5.0))}
    times = times_to_targets(results, "pm_acc_weighted", [40, 80])
    pick = times.set_index(["method", "target", "timeline"])["time"]
    assert pick[("ditto", 40, "sim_time")] == 20.0 and pick[("ditto", 80, "sim_time_wf")] == 12.0
    assert np.isnan(pick[("ditto WF", 80, "sim_time")])               # never reached
    sp = speedups(times, [{"row": "ditto", "pm_epochs": 3, "slow": ["ditto", "sim_time"], "fast": ["ditto WF", "sim_time"]},
                          {"row": "overlap", "slow": ["ditto", "sim_time_cw"], "fast": ["ditto", "sim_time_wf"]}])
    got = sp.set_index(["method", "target"])["speedup"]
    assert got[("ditto", 40)] == pytest.approx(20.0 / 10.0) and np.isnan(got[("ditto", 80)])
    assert got[("overlap", 80)] == pytest.approx(30.0 / 12.0)


def test_at_rounds_reads_curves_at_fractions_of_the_evaluated_rounds():
    """FedBSD Fig. 4 (right): 4 evaluated rounds, fractions 0.5 and 1 -> rounds 4 and 8; mean and std over seeds."""
    c = pd.DataFrame({"dataset": "d", "round": [2, 4, 6, 8] * 3, "method": ["a"] * 8 + ["b"] * 4,
                      "seed": [0] * 4 + [1] * 4 + [0] * 4, "m": [10, 20, 30, 40, 12, 24, 36, 48, 5, 6, 7, 8]})
    t = report.at_rounds(c, "m", (0.5, 1.0))
    assert list(t.setting) == ["round 4", "round 4", "round 8", "round 8"] and list(t.method) == ["a", "b", "a", "b"]
    assert list(t.reproduced) == [22.0, 6.0, 44.0, 8.0] and list(t.seeds) == [2, 1, 2, 1]
    assert t.repro_std.iloc[0] == pytest.approx(2 ** 0.5 * 2) and t.repro_std.isna().tolist() == [False, True, False, True]


def test_markdown_prints_counts_and_ranks_as_whole_numbers():
    df = pd.DataFrame({"method": ["a", "b"], "reproduced": [62.0, 61.456], "seeds": [1.0, 2.0], "rank": [3.0, 2.5],
                       "paper_rank": [8.0, float("nan")], "target_round": [10.0, 20.0]})
    md = report.to_markdown(df, "t", "banner")
    rows = [line for line in md.splitlines() if line.startswith("| a") or line.startswith("| b")]
    assert rows[0] == "| a | 62.00 | 1 | 3 | 8 | 10 |"          # an accuracy keeps its decimals, counts do not
    assert rows[1] == "| b | 61.46 | 2 | 2.50 |  | 20 |"       # a mean rank over seeds keeps its fraction


def test_learning_curves_name_facets_by_value_tick_whole_rounds_and_tell_identical_methods_apart():
    rows = [{"method": m, "setting": "20 clients", "panel": "20 clients", "seed": 0, "round": r, "acc": 50.0 + r}
            for m in ("fedavg", "fedprox") for r in (1, 2, 3)]     # identical curves: FedProx at a tiny mu
    fig = report.plot_curves(pd.DataFrame(rows), metric="acc")
    ax = fig.axes[0]
    assert ax.get_title() == "20 clients"                           # not "panel = 20 clients"
    assert all(float(t).is_integer() for t in ax.get_xticks())
    lines = [ln for ln in ax.get_lines() if len(ln.get_xdata()) == 3]
    assert len(lines) == 2 and lines[0].get_linestyle() != lines[1].get_linestyle()   # solid vs dashed


def test_plot_vs_paper_draws_error_bars_only_where_seeds_spread():
    """A cell without a std (one seed, a measured cost) gets no error bar: its cap sat on the bar's top and read as
    a paper tick."""
    t = pd.DataFrame({"method": ["a", "b", "c"], "setting": "s", "reproduced": [80.0, 70.0, 60.0],
                      "repro_std": [2.0, float("nan"), 0.0], "paper": [float("nan")] * 3})
    ax = report.plot_vs_paper(t).axes[0]
    bars = [c for c in ax.containers if type(c).__name__ == "ErrorbarContainer"]
    assert len(bars) == 1
    (segments,) = [c.get_segments() for c in bars[0].lines[2]]
    assert len(segments) == 1 and segments[0][0][1] == 78.0 and segments[0][1][1] == 82.0   # a's 80 +- 2 only


def test_effective_test_images_and_last_tenth_hand_computed(tmp_path):
    """Issue 51: the claims' test-set floor needs the number of test images behind a score, and the metric-robustness
    reading the mean over the last tenth of the evaluations."""
    import numpy as np

    from pflrepro.reporting import tables
    np.savez(tmp_path / "partition.npz", **{f"test_{k}": np.arange(n) for k, n in enumerate((7, 12, 0, 30))},
             **{f"train_{k}": np.arange(n) for k, n in enumerate((10, 20, 5, 30))})
    # mean over the 3 clients with test images of each one's accuracy: K^2 / sum(1 / n_k) = 9 / (1/7 + 1/12 + 1/30)
    assert tables.effective_test_n(tmp_path, "pm_acc_mean") == pytest.approx(9 / (1 / 7 + 1 / 12 + 1 / 30))
    # weighted by training shares 10, 20, 30 of 60: 1 / sum(w_k^2 / n_k)
    w = np.array([10, 20, 30]) / 60
    assert tables.effective_test_n(tmp_path, "pm_acc_weighted") == pytest.approx(1 / np.sum(w ** 2 / np.array([7, 12, 30])))
    assert tables.effective_test_n(tmp_path, "gm_acc", "train+test") == 49.0      # the union of the local tests
    assert np.isnan(tables.effective_test_n(tmp_path, "gm_acc", "train"))        # the official test set: not stored
    assert np.isnan(tables.effective_test_n(tmp_path / "absent", "pm_acc_mean"))
    history = [{"pm_acc_mean": v / 100} for v in range(1, 26)]                   # 25 evaluations: the last 3
    assert tables.last_tenth(history) == pytest.approx(24.0)
    assert tables.last_tenth(history[:5]) == pytest.approx(5.0)                  # at least one
