"""pflrepro.reporting.replication: the one report, on a hand-made results tree (two stages of a fake paper, one
planned stage without outputs, a stage of a paper without a claims file) and a fake claims file."""
from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import matplotlib
import pandas as pd
import pytest
import yaml

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from pflrepro.__main__ import main  # noqa: E402
from pflrepro.paths import REPO_ROOT  # noqa: E402
from pflrepro.reporting import claims, replication  # noqa: E402

GIT = {"commit": "abcdef0123456789", "dirty": False}
CLAIMS = {"paper": "fake", "planned_stages": ["fake_table3"],
          "scale_notes": {"mini": "Method two needs ten times the data."}, "claims": [
    {"id": "m1-beats-m2", "quote": "Method one beats method two.", "where": {"stage": "fake_table1", "table": "table"},
     "form": "order", "a": "m1", "b": "m2"},                                       # 80 vs 70: holds
    {"id": "m2-beats-m1", "quote": "Method two beats method one.", "where": {"stage": "fake_table1", "table": "table"},
     "form": "order", "a": "m2", "b": "m1"},                                       # fails
    {"id": "m1-beats-m3", "quote": "Method one beats method three.", "where": {"stage": "fake_table1", "table": "table"},
     "form": "order", "a": "m1", "b": "m3", "headline": True},                    # paired +0.5, -0.5, +1.5: inconclusive
    {"id": "fig-m1-best", "quote": "Method one is best in the figure.", "where": {"stage": "fake_fig2", "table": "table"},
     "form": "best", "a": "m1"},                                                   # holds
    {"id": "planned", "quote": "A table nobody has reproduced yet.", "where": {"stage": "fake_table3", "table": "table"},
     "form": "order", "a": "m1", "b": "m2"},                                       # not run
]}


def png(path: Path) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(1.5, 1))
    ax.plot([0, 1], [0, 1])
    fig.savefig(path, dpi=40)
    plt.close(fig)
    return path.read_bytes()


def stage(results: Path, name: str, values: dict, runs: dict[str, float], profile: str = "mini") -> Path:
    """results/<name>/ as notebook.Experiment writes it: table.md/.csv, runs.csv, provenance.json (and
    each run's own provenance.json in the store results/runs/)."""
    d = results / name
    d.mkdir(parents=True)
    # three seeds each, all moved by the partition (+1, -1 on seeds 1, 2); m3's own noise moves against m1's (so m1
    # vs m3 straddles), m1's and m2's by a few tenths
    jitter = {"m1": (0.0, 0.4, -0.3), "m2": (0.0, -0.2, 0.1), "m3": (0.0, 2.0, -2.0)}
    t = pd.DataFrame({"dataset": "fmnist", "setting": "s1", "method": list(values), "reproduced": list(values.values()),
                      "repro_std": 1.0, "seeds": 3, "paper": 90.0,
                      "repro_seeds": [";".join(f"{s}:{v + j + (s == 1) - (s == 2)}" for s, j in
                                               enumerate(jitter.get(m, (0.0, 0.0, 0.0)))) for m, v in values.items()]})
    t["diff"] = t["reproduced"] - t["paper"]
    t.to_csv(d / "table.csv", index=False)
    rows = "\n".join(f"| {m} | {v:.2f} | 90.00 | {v - 90:.2f} |" for m, v in values.items())
    (d / "table.md").write_text(f"## {name.upper()} (accuracy %)\n\n> profile={profile} | dataset=fmnist | seeds=[0]\n\n"
                                f"| method | reproduced | paper | diff |\n|---|---|---|---|\n{rows}\n")
    runs_rows, prov = [], {}
    for path, wall in runs.items():
        runs_rows.append({"method": path.split("-")[0], "dataset": "fmnist", "setting": "s1", "seed": 0, "best": 1.0,
                          "wall_s": wall, "run": path})
        prov[f"{path}/s1/0"] = {"path": path, "seed": 0, "dataset": "fmnist", "device": "cpu", "wall_seconds": wall,
                                "git": GIT, "torch": "9.9.9", "code_sha256": "c0de"}
        store = results / "runs" / path
        store.mkdir(parents=True, exist_ok=True)
        (store / "provenance.json").write_text(json.dumps({"wall_seconds": wall, "torch": "9.9.9", "numpy": "7.7.7",
                                                           "python": "3.99", "pflrepro": "0.1.0"}))
    pd.DataFrame(runs_rows).to_csv(d / "runs.csv", index=False)
    (d / "provenance.json").write_text(json.dumps({"notebook": name, "profile": profile, "banner": "fake", "runs": prov}))
    return d


@pytest.fixture
def tree(tmp_path, monkeypatch):
    claims_dir = tmp_path / "paper_numbers"
    claims_dir.mkdir()
    (claims_dir / "fake_claims.yaml").write_text(yaml.safe_dump(CLAIMS))
    monkeypatch.setattr(claims.loading, "CLAIMS_DIR", claims_dir)            # only the fake paper's claims
    monkeypatch.setattr(replication, "DVC_FILE", tmp_path / "dvc.yaml")  # no dvc.yaml: stages from outputs + claims
    results, figures = tmp_path / "results", tmp_path / "figures"
    stage(results, "fake_table1", {"m1": 80.0, "m2": 70.0, "m3": 79.5}, {"m1-a": 10.0, "m2-b": 20.0})
    stage(results, "fake_fig2", {"m1": 85.0, "m2": 60.0}, {"m1-a": 10.0, "m3-c": 5.0})   # shares run m1-a
    stage(results, "other_table1", {"m1": 50.0}, {"m1-z": 1.0}, profile="smoke")          # a paper without claims
    (results / "fake_table1" / "fake_table1.ipynb").write_text("{}")              # papermill's executed notebook
    pngs = {"table1": png(figures / "fake_table1" / "vs_paper.png"),               # figures/<stage>/ (dvc repro)
            "fig2": png(results / "fake_fig2" / "figures" / "curves.png")}         # <out_dir>/figures/ (a sweep point)
    return results, figures, pngs


def test_report_files_figures_embedded_and_nothing_external(tree):
    results, figures, pngs = tree
    out = replication.write_report(results, figures, results / "report")
    for key in ("html", "markdown", "summary_csv", "summary_md"):
        assert out[key].is_file() and out[key].stat().st_size > 0
    page = out["html"].read_text()
    for data in pngs.values():                                    # each PNG, byte for byte, as a data URI
        assert f'src="data:image/png;base64,{base64.b64encode(data).decode()}"' in page
    assert len(re.findall(r"<img\b", page)) == 3                 # the two figures and the paper's forest plot
    assert (results / "report" / "forest_fake.png").is_file() and "![fake: claims](forest_fake.png)" in \
        out["markdown"].read_text()
    assert 'src="http' not in page and 'href="http' not in page
    assert re.findall(r'(?:src|href)="(?!data:image/png;base64,|#)', page) == []   # no file, no host
    assert '<span class="path">fake_table1.ipynb</span>' in page   # the executed notebook: named, not linked
    md = out["markdown"].read_text()
    assert "](../../figures/fake_table1/vs_paper.png)" in md      # results/report/ -> figures/<stage>/
    assert "](../fake_fig2/figures/curves.png)" in md
    assert "[fake_table1.ipynb](../fake_table1/fake_table1.ipynb)" in md
    assert "FAKE_TABLE1 (accuracy %)" in md and "| m2 | 70.00 | 90.00 | -20.00 |" in md   # title, table as written
    assert "<td>-20.00</td>" in page and '<td class="v-holds">holds</td>' in page


def test_summary_counts_match_the_claims_checker(tree):
    results, figures, _ = tree
    expected = claims.summary(claims.check(results))
    assert expected["fake"] == {"holds": 2, "partial": 0, "fails": 1, "inconclusive": 1, "underpowered": 0,
                                "by design": 0, "not run": 1}   # the fixture decides each way
    out = replication.write_report(results, figures, results / "report")
    rows = [r for r in out["summary"] if r["paper"] == "fake"]
    assert {r["profile"] for r in rows} == {"mini", replication.NOT_REPRODUCED}
    for v in claims.VERDICTS:
        assert sum(r[v] for r in rows) == expected["fake"][v]
    mini = next(r for r in rows if r["profile"] == "mini")
    assert (mini["stages"], mini["holds"], mini["fails"], mini["inconclusive"], mini["not run"]) == (2, 2, 1, 1, 0)
    assert mini["independent"] == 1           # every decided claim reads run m1-a: one independent test
    assert mini["headline"].startswith("1 inconclusive of 1 (m1-beats-m3: inconclusive)")
    assert mini["compute_s"] == 35.0                               # run m1-a counted once: 10 + 20 + 5
    csv = pd.read_csv(out["summary_csv"])
    assert csv.query("paper == 'fake' and profile == 'mini'")["holds"].item() == 2
    other = next(r for r in out["summary"] if r["paper"] == "other")
    assert (other["profile"], other["note"]) == ("smoke", "no claims file yet")
    assert mini["note"] == "Method two needs ten times the data."          # the claims file's scale note, its profile only
    assert next(r for r in rows if r["profile"] != "mini")["note"] == ""
    md = out["markdown"].read_text()
    assert "commit** abcdef0123" in md and "numpy 7.7.7" in md and "**seeds** 0" in md   # provenance, from the store
    assert "**compute** 30.0 s" in md                              # fake_table1: its two runs
    assert "**Scale (mini):** Method two needs ten times the data." in md


def test_missing_stage_is_not_reproduced_yet(tree, monkeypatch):
    results, figures, _ = tree
    monkeypatch.setitem(replication.PAPERS, "ghost", "Ghost (a paper with no stage)")
    out = replication.write_report(results, figures, results / "report")
    assert out["stages"]["fake_table3"] == replication.NOT_REPRODUCED
    assert out["stages"]["fake_table1"] == "mini"
    row = next(r for r in out["summary"] if r["paper"] == "fake" and r["profile"] == replication.NOT_REPRODUCED)
    assert (row["stages"], row["not run"]) == (1, 1)
    md = out["markdown"].read_text()
    assert "**Not reproduced yet:** `fake_table3`" in md
    assert "## Ghost (a paper with no stage) (`ghost`)\n\n**Not reproduced yet:** no notebook stage" in md
    assert "## PerFed-CKT (`perfed_ckt`)" in md and "(`perfedckt`)" not in md    # its claims file's id


def test_cli(tree, capsys):
    results, figures, _ = tree
    assert main(["report", "--results", str(results), "--figures", str(figures), "--out", str(results / "r")]) == 0
    assert (results / "r" / "report.html").is_file()
    assert "| fake | mini | 2 | 2 | 0 | 1 | 1 | 0 | 0 | 0 | 1 | 0 |" in capsys.readouterr().out


def test_readme_block_gets_the_summary_and_its_stamp():
    from pflrepro.reporting.replication import README_END, README_START, readme_with_summary
    row = {"paper": "x", "title": "Paper X", "profile": "mini", "stages": "2 of 2", "holds": 3, "partial": 0, "fails": 1,
           "inconclusive": 2, "underpowered": 0, "by design": 0, "not run": 0, "independent": 3, "compute_s": 65.0,
           "note": ""}
    text = f"# R\n\nintro\n{README_START}\nold table\n{README_END}\nafter\n"
    out = readme_with_summary(text, [{**row, "headline": "1 fails of 1 (best: fails)"}], "Measured at commit abc.")
    assert "- **Paper X** (mini): 1 fails of 1 (best: fails)" in out        # the headline claims, apart
    assert out.startswith("# R\n\nintro\n" + README_START) and out.endswith(README_END + "\nafter\n")
    assert "old table" not in out and "| Paper X | mini | 2 of 2 | 3 | 0 | 1 | 2 | 0 | 0 | 0 | 3 | 0 |" in out \
        and "Measured at commit abc." in out
    assert readme_with_summary(out, [{**row, "headline": "1 fails of 1 (best: fails)"}],
                               "Measured at commit abc.") == out          # idempotent
    with pytest.raises(ValueError, match="report-summary"):
        readme_with_summary("# no markers\n", [row], "")


def test_run_health_lists_each_flagged_run_once_with_its_stages(tree):
    results, figures, _ = tree
    for name in ("fake_table1", "fake_fig2"):          # m1-a is in both stages; m2-b, m3-c are healthy
        df = pd.read_csv(results / name / "runs.csv")
        df["health"] = ["fall: last evaluation 28.0 points under the best" if r == "m1-a" else "" for r in df["run"]]
        df.to_csv(results / name / "runs.csv", index=False)
    md = replication.write_report(results, figures, results / "report")["markdown"].read_text()
    assert md.count("**Run health:** 1 of 3 runs flagged") == 1               # the fake paper: m1-a, m2-b, m3-c
    assert re.search(r"\| \[fake\]\(#paper-fake\) \| mini \| 2 \| 2 \| 0 \| 1 \| 1 \| 0 \| 0 \| 0 \| 1 \| 0 \| 0 \| 35.0 s \| 1 \|",
                     md)  # runs flagged
    assert re.search(r"\| \[other\]\(#paper-other\) \| smoke \| 1 \|( \d+ \|){10} 1.0 s \| — \|", md)  # not checked
    assert "| `m1-a` | m1 / s1 / 0 | `fake_table1`, `fake_fig2` | fall: last evaluation 28.0 points under the best |" in md
    assert re.search(r"Run health: 1 run flagged \(fake: 1; listed under each paper\) \(2 stages checked; collapse = ", md)
    assert "other_table1" in md and md.count("**Run health:**") == 1          # a runs.csv without the column: not checked


def test_run_health_says_none_flagged(tree):
    results, figures, _ = tree
    df = pd.read_csv(results / "fake_table1" / "runs.csv").assign(health="")
    df.to_csv(results / "fake_table1" / "runs.csv", index=False)
    md = replication.write_report(results, figures, results / "report")["markdown"].read_text()
    assert "**Run health:** 0 of 2 runs flagged" in md           # fake_fig2's runs.csv has no column: not checked
    assert "Run health: 0 runs flagged (1 stage checked; collapse = " in md


def test_verdict_metrics_are_a_compact_dvc_metrics_file():
    """Issue 33: `dvc metrics show` over every stage was one 8,912-character header; the report stage also writes
    the verdicts per paper as a small metrics file (declared in dvc.yaml). A paper with outputs of two profiles gets
    a row per profile; a paper with nothing reproduced and no claims none."""
    R = replication
    counts = {"holds": 2, "partial": 0, "fails": 1, "inconclusive": 0, "underpowered": 1, "by design": 0}
    row = dict(title="t", stages=1, claims=5, independent=2, compute_s=1.0, flagged=0, note="", **counts)
    summary = [{**row, "paper": "a", "profile": "mini", "not run": 1},
               {**row, "paper": "b", "profile": "mini", "not run": 1}, {**row, "paper": "b", "profile": "paper",
                                                                        "not run": 1, "flagged": 2},
               {**row, "paper": "c", "profile": R.NOT_REPRODUCED, "not run": 0, "claims": 0}]
    out = R.verdict_metrics(summary)
    metric = {"holds": 2, "partial": 0, "fails": 1, "inconclusive": 0, "underpowered": 1, "by_design": 0, "not_run": 1,
              "claims": 5, "independent_tests": 2, "metric_sensitive": 0, "kernel_sensitive": 0}
    assert out == {"a": {"profile": "mini", **metric, "runs_flagged": 0},
                   "b (mini)": {"profile": "mini", **metric, "runs_flagged": 0},
                   "b (paper)": {"profile": "paper", **metric, "runs_flagged": 2}}
    stage = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())["stages"]["report"]
    assert "--metrics metrics/report.json" in stage["cmd"]
    assert stage["metrics"] == [{"metrics/report.json": {"cache": False}}]


def test_forest_plot_draws_every_kind_of_interval_and_region():
    """Issue 51's forest plot: one row per claim with an effect (headline first), infinite ends (a sign test's) drawn
    as arrows at the axis, exact quantities, bands with a side, no interval at all; nothing to show gives no figure."""
    from pflrepro.reporting import forest
    base = {"stage": "s", "verdict": "inconclusive", "paper_effect": 1.0, "bounds": [0.0], "cell_ci": [],
            "region_spec": {"op": ">", "t": 0.0, "lo": float("-inf"), "hi": float("inf"), "null": None, "above": None}}
    rows = [{**base, "id": "signs", "effect": float("inf"), "ci": (float("-inf"), float("inf"))},
            {**base, "id": "exact", "effect": 1.25, "ci": (1.25, 1.25), "verdict": "by design", "quantity_verdict": "fails",
             "region_spec": {"op": "<=", "t": 1.0}, "bounds": [1.0]},
            {**base, "id": "band", "effect": 0.3, "ci": (-0.2, 0.8), "headline": True, "metric_sensitive": True,
             "robust_verdict": "fails", "bounds": [-1.0, 2.0], "cell_ci": [["a", [-0.5, 1.0]], ["b", [0.0, 0.9]]],
             "region_spec": {"op": "band", "t": 0.0, "lo": -1.0, "hi": 2.0, "null": 0.0, "above": True}},
            {**base, "id": "none", "effect": 2.0, "ci": None, "verdict": "underpowered"},
            {**base, "id": "skipped", "effect": None, "ci": None, "verdict": "not run"}]
    assert [r["id"] for r in forest.plotted(rows)] == ["band", "exact", "none", "signs"]
    fig = forest.figure(rows, "toy")
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert len(fig.axes) == 4 and "★ band" in texts and "quantity fails" in texts
    assert any(t.startswith("metric-sensitive") for t in texts)
    plt.close(fig)
    assert forest.figure([rows[-1]], "toy") is None
