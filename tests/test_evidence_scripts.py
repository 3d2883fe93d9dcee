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
