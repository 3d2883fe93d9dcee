"""report.compare: reproduced mean/std over seeds beside the paper, with the difference and both rankings."""
import math

import pandas as pd

from pflrepro import report


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
