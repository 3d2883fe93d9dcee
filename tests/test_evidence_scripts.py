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
