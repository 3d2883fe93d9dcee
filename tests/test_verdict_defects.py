"""Issue 51's defect classes of the claims ledger at a100f42, one named test each: every one of them passed a
claim (or failed one) that the evidence does not decide, or hid what it should show, and each test below failed
on a100f42's rule (checked by running this file against a100f42's reporting layer). The rates themselves:
tests/test_calibration.py."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pflrepro.reporting import claims, replication
from tests.test_claims import DOC, acc, run, seeded, table


def test_three_seeds_are_not_decided_by_their_range(tmp_path):
    # every seed's difference above 0 (+0.6, +2.2, +0.4): the percentile bootstrap's 95 % interval was the range,
    # [0.4, 2.2], and "holds"; at 3 seeds a 95 % one-sided bound needs t_.95,2 = 2.92 standard errors
    root = table(tmp_path, "t_table", [seeded("x", [93.8, 90.8, 85.4]), seeded("y", [93.2, 88.6, 85.0])])
    r = run(root, {"form": "order", "a": "x", "b": "y"})
    assert r["verdict"] not in ("holds", "fails") and r["ci"][0] < 0.4


def test_all_over_six_cells_does_not_fail_on_one_cell_at_an_uncorrected_level(tmp_path):
    # six cells of true effect 0; one cell's three seeds happen to be below 0 (-0.5, -1.5, -0.2): its range excludes
    # 0 at every Bonferroni level, which failed the claim; a t bound at 5 % / 6 does not
    rows = []
    for i in range(6):
        y = [80.0, 81.0, 79.0]
        d = [-0.5, -1.5, -0.2] if i == 0 else [0.4, -0.6, 0.3]
        rows += [seeded("x", [a + b for a, b in zip(y, d)], f"s{i}"), seeded("y", y, f"s{i}")]
    r = run(table(tmp_path, "t_table", rows), {"form": "order", "a": "x", "b": "y"})
    assert r["verdict"] != "fails", r["evidence"]


def test_any_over_six_cells_does_not_hold_on_one_cell_at_an_uncorrected_level(tmp_path):
    rows = []
    for i in range(6):
        y = [80.0, 81.0, 79.0]
        d = [0.5, 1.5, 0.2] if i == 0 else [-0.4, 0.6, -0.3]
        rows += [seeded("x", [a + b for a, b in zip(y, d)], f"s{i}"), seeded("y", y, f"s{i}")]
    r = run(table(tmp_path, "t_table", rows), {"form": "order", "a": "x", "b": "y", "quantifier": "any"})
    assert r["verdict"] != "holds", r["evidence"]


def test_best_level_with_seven_rivals_does_not_fail_on_one_lucky_rival(tmp_path):
    # "ours" level with 7 rivals; one rival is ahead on each of the 3 seeds by a little (0.3, 1.2, 0.2)
    ours = [85.0, 86.0, 84.0]
    rows = [seeded("ours", ours)]
    for j in range(7):
        d = [0.3, 1.2, 0.2] if j == 0 else [(-1) ** (j + k) * 0.4 * (k + 1) for k in range(3)]
        rows.append(seeded(f"r{j}", [a + b for a, b in zip(ours, d)]))
    r = run(table(tmp_path, "t_table", rows), {"form": "best", "a": "ours"})
    assert r["verdict"] != "fails", r["evidence"]


def test_zero_spread_does_not_decide(tmp_path):
    # one test image more on each of 3 seeds (clients of 7 images, 10 clients: 1.43 points of the mean): the spread
    # over seeds is 0 and the interval was [1.43, 1.43]; the test images alone give such a difference a variance
    rows = [seeded("x", [81.43, 75.43, 78.43], min_test=7, test_n=70.0),
            seeded("y", [80.0, 74.0, 77.0], min_test=7, test_n=70.0)]
    r = run(table(tmp_path, "t_table", rows), {"form": "order", "a": "x", "b": "y"})
    assert r["verdict"] not in ("holds", "fails") and r["ci"][0] < 0 < r["ci"][1], r["evidence"]
    assert "test-set floor" in r["evidence"]
    rows = [seeded("x", [81.43, 75.43, 78.43]), seeded("y", [80.0, 74.0, 77.0])]      # no test set known: no interval
    r = run(table(tmp_path, "t_table", rows), {"form": "order", "a": "x", "b": "y"})
    assert r["verdict"] == "underpowered" and r["ci"] is None and "zero spread" in r["evidence"]


def test_a_band_holds_only_when_the_interval_is_inside_it(tmp_path):
    # per-seed differences -6, 1.9, 10 "within 0 ± 2": the interval overlaps the band, so it held
    rows = [seeded("x", [74.0, 81.9, 90.0]), seeded("y", [80.0, 80.0, 80.0])]
    r = run(table(tmp_path, "t_table", rows), {"form": "near", "quantity": "diff", "a": "x", "b": "y", "target": 0.0,
                                               "tolerance": 2.0})
    assert r["verdict"] in ("inconclusive", "underpowered"), r["evidence"]


def test_fewer_than_three_seeds_never_decide_a_mean_std_column(tmp_path):
    # only mean ± std over 2 seeds: a t interval with 1 + 1 degrees of freedom held "x > y"
    rows = [acc("x", 90.0, 0.5, seeds=2), acc("y", 80.0, 0.5, seeds=2)]
    r = run(table(tmp_path, "t_table", rows), {"form": "order", "a": "x", "b": "y"})
    assert r["verdict"] == "underpowered" and r["ci"] is None, r["evidence"]


def test_all_does_not_drop_a_thin_cell_that_is_against_it(tmp_path):
    # s1: three seeds, x ahead; s2: one seed, x 9 points behind. "Left out", the claim held on s1 alone
    rows = [seeded("x", [90.0, 91.0, 89.5], "s1"), seeded("y", [85.0, 86.5, 84.0], "s1"),
            seeded("x", [70.0], "s2"), seeded("y", [79.0], "s2")]
    r = run(table(tmp_path, "t_table", rows), {"form": "order", "a": "x", "b": "y"})
    assert r["verdict"] == "underpowered" and "s2" in r["evidence"], r["evidence"]


def test_a_blank_competitor_is_absent_not_beaten(tmp_path):
    rows = [seeded("ours", [90.0, 91.0, 89.0]), seeded("b1", [80.0, 81.5, 79.0]), acc("b2", float("nan"))]
    r = run(table(tmp_path, "t_table", rows), {"form": "best", "a": "ours"})
    assert r["verdict"] == "partial" and r["absent"] == ["b2"], r


def test_by_design_keeps_the_quantity_result_visible(tmp_path):
    rows = [{"dataset": "d", "method": m, "mb": v} for m, v in (("fedavg", 2.0), ("fomo", 7.0))]
    r = run(table(tmp_path, "t_table", rows), {"form": "ratio", "column": "mb", "noise": "none", "num": "fomo",
                                               "den": "fedavg", "at_most": 1.0, "by_design": "bytes counted"})
    assert r["verdict"] == "by design" and r["quantity_verdict"] == "fails"      # the sentence is contradicted
    assert any("the quantity itself: fails" in f for f in claims._flags(r))
    assert claims.summary([r])["toy"]["holds"] == 0                             # never support


def test_the_papers_own_numbers_are_checked_when_the_report_runs(tmp_path, monkeypatch):
    paper = tmp_path / "paper_numbers"
    paper.mkdir()
    (paper / "t_table.csv").write_text("# toy\ndataset,setting,method,value,std\n"
                                       "cifar10,s1,x,80.0,0.1\ncifar10,s1,y,90.0,0.1\n")     # x is BELOW y in print
    monkeypatch.setattr(claims.loading, "CLAIMS_DIR", paper)
    claims._paper_table_name.cache_clear()
    try:
        root = table(tmp_path, "t_table", [seeded("x", [85.0, 86.0, 84.5]), seeded("y", [80.0, 81.5, 79.0])])
        r = run(root, {"form": "order", "a": "x", "b": "y"})
        assert r["paper_verdict"] == "fails" and "contradict" in r["paper_check"]
        assert any("contradict" in f for f in claims._flags(r))
        marked = run(root, {"form": "order", "a": "x", "b": "y", "paper_inconsistent": "Table 1 prints y above x"})
        assert "(not marked)" not in marked["paper_check"]
    finally:
        claims._paper_table_name.cache_clear()      # the next test reads the real paper_numbers/ again


def test_a_verdict_that_the_best_round_alone_gives_is_flagged_metric_sensitive(tmp_path):
    # best round: x ahead on every seed; the mean of the last tenth of the rounds: x behind on every seed
    rows = [seeded("x", [90.0, 91.0, 89.5], last_tenth=80.27, last_tenth_seeds="0:80;1:81.2;2:79.6"),
            seeded("y", [85.0, 86.5, 84.0], last_tenth=85.1, last_tenth_seeds="0:85;1:86.1;2:84.2")]
    root = table(tmp_path, "t_table", rows)
    r = run(root, {"form": "order", "a": "x", "b": "y"})
    assert r["verdict"] == "holds" and r["robust_verdict"] == "fails" and r["metric_sensitive"]
    assert any("metric-sensitive" in f for f in claims._flags(r))
    summary = replication.summarize({"toy": []}, [{**r, "paper": "toy"}], {})
    assert summary[0]["sensitive"] == 1
    rows[0]["last_tenth_seeds"] = "0:89.8;1:91.1;2:89.0"                      # the same verdict both ways
    r = run(table(tmp_path, "t_table", rows), {"form": "order", "a": "x", "b": "y"})
    assert r["robust_verdict"] == "holds" and not r["metric_sensitive"]
