"""Verdicts that float rounding moves (issue 54): scripts/evidence/kernel_paths.py compares two repros' table values
and verdicts, and the report marks a claim whose verdict differs on the other kernel path
(pflrepro/reporting/claims/kernel.py), only where the claim's current numbers are those of one recorded path."""
from __future__ import annotations

import json

from pflrepro.reporting import claims, forest, replication
from pflrepro.reporting.claims import kernel
from tests.test_evidence_scripts import _script


def _side(verdict, effect, interval=""):
    return {"verdict": verdict, "effect": effect, "interval": interval, "seeds": 3}


def _check(tmp_path, pairs):
    p = tmp_path / "claims.json"
    p.write_text(json.dumps({"a": "AVX512", "b": "avx2", "commit": "abc", "claims": pairs}))
    return p


def _row(i, verdict, effect, interval=""):
    return {"paper": "p", "id": i, "verdict": verdict, "effect": effect, "interval": interval,
            "kernel": None, "kernel_sensitive": False}


def test_mark_flags_a_verdict_the_other_path_moves_and_only_on_the_recorded_runs(tmp_path):
    path = _check(tmp_path, [
        {"paper": "p", "id": "moved", "a": _side("holds", 1.5, "1.5 [0.2, 2.8]"), "b": _side("underpowered", 1.1, "x")},
        {"paper": "p", "id": "same", "a": _side("fails", -2.0, "i"), "b": _side("fails", -2.1, "j")},
        {"paper": "p", "id": "stale", "a": _side("holds", 1.0, "k"), "b": _side("fails", -1.0, "l")},
        {"paper": "p", "id": "onb", "a": _side("inconclusive", 0.3, "m"), "b": _side("holds", 0.9, "n")},
        {"paper": "p", "id": "off", "a": _side("not run", None), "b": _side("not run", None)}])
    rows = [_row("moved", "holds", 1.5, "1.5 [0.2, 2.8]"), _row("same", "fails", -2.0, "i"),
            _row("stale", "holds", 1.0000001, "k"),           # other runs: not the recorded effect
            _row("onb", "holds", 0.9, "n"),                    # checked on path B's runs: compared with A
            _row("off", "not run", None), _row("absent", "holds", 2.0)]
    kernel.mark(rows, path)
    got = {r["id"]: (r["kernel_sensitive"], (r["kernel"] or {}).get("verdict")) for r in rows}
    assert got == {"moved": (True, "underpowered"), "same": (False, "fails"), "stale": (False, None),
                   "onb": (True, "inconclusive"), "off": (False, None), "absent": (False, None)}
    assert rows[0]["kernel"]["path"] == "avx2" and rows[3]["kernel"]["path"] == "AVX512"
    assert rows[0]["kernel"]["interval"] == "x" and rows[0]["kernel"]["commit"] == "abc"
    kernel.mark(rows, tmp_path / "missing.json")         # no check recorded: nothing marked, nothing raised


def test_a_marked_claim_is_said_in_the_flags_forest_and_summary(tmp_path):
    rows = [_row("moved", "holds", 1.5)]
    kernel.mark(rows, _check(tmp_path, [{"paper": "p", "id": "moved", "a": _side("holds", 1.5),
                                          "b": _side("underpowered", 1.1, "1.1 [-0.5, 2.7]")}]))
    r = {**claims.EMPTY_ROW, **rows[0]}
    assert "kernel-sensitive: on avx2 (same machine and seeds), underpowered (1.1 [-0.5, 2.7])" in claims._flags(r)
    assert "kernel-sensitive (underpowered on the other path)" in forest._qualifiers(r)
    s = replication.summarize({"p": []}, [{**r, "stage": "t"}], {})
    assert s[-1]["kernel"] == 1 and "kernel-sensitive" in replication.summary_markdown(s)
    assert replication.verdict_metrics(s)[next(iter(replication.verdict_metrics(s)))]["kernel_sensitive"] == 1


def test_kernel_paths_script_counts_moved_values_and_verdicts(tmp_path):
    mod = _script("kernel_paths")
    for side, vals in (("a", {"m": {"best": 90.0, "last10": 85.0}, "n": 3}), ("b", {"m": {"best": 90.0,
                                                                                         "last10": 84.5}, "n": 3})):
        (tmp_path / side / "metrics").mkdir(parents=True)
        (tmp_path / side / "metrics" / "t.json").write_text(json.dumps({"profile": "mini", "s": vals}))
        (tmp_path / side / "metrics" / "report.json").write_text(json.dumps({"p": {"holds": 1}}))
    va, vb = mod.table_values(tmp_path / "a"), mod.table_values(tmp_path / "b")
    assert va == {("t", "s/m/best"): 90.0, ("t", "s/m/last10"): 85.0, ("t", "s/n"): 3.0}
    values = mod.compare_values(va, vb)
    a = [{"paper": "p", "id": "x", "verdict": "holds", "effect": 1.0, "interval": "i", "group": "x"},
         {"paper": "p", "id": "y", "verdict": "fails", "effect": -1.0, "interval": "j", "group": "x"},
         {"paper": "p", "id": "z", "verdict": "underpowered", "effect": 0.1, "interval": "k", "group": "z"}]
    b = [{**a[0], "verdict": "inconclusive"}, a[1], {**a[2], "verdict": "inconclusive"}]
    pairs = mod.claim_pairs(a, b)
    mod.write(tmp_path / "out", values, pairs, "A", "B", "c0")
    text = (tmp_path / "out" / "summary.md").read_text()
    assert "Table values on both paths: 3; moved: 1 (median |B - A| 0.5" in text
    assert "verdicts that moved: 2, of which 1 decided on one path" in text
    assert "Independent tests decided: 1 on A, 1 on B, 1 decided the same on both." in text
    assert "| t | s/m/last10 | 85 | 84.5 | -0.5 |" in text and "| p | x |  | holds | inconclusive |" in text
    doc = json.loads((tmp_path / "out" / "claims.json").read_text())
    assert doc["commit"] == "c0" and doc["claims"][0]["b"]["verdict"] == "inconclusive"
