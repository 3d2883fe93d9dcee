"""The report's paper-scale tier (pflrepro.reporting.tier): device-check run records read back verified, a record
that does not verify named and left out, and the paired comparisons computed from what remains."""
from __future__ import annotations

import json
import shutil

from pflrepro.federation.config import RunConfig
from pflrepro.pipeline.store import run, run_dir
from pflrepro.reporting import tier

from .conftest import small_cfg


def _lease(root, store, seeds=(0, 1, 2)):
    """A lease folder laid out as the device check's runs.tar.gz: pFedSD and FedAvg on one setting of Table 2."""
    where = root / "lease" / "runs" / "pfedsd_table2" / "fmnist_20_clients"
    where.mkdir(parents=True)
    (where / "tier.json").write_text(json.dumps({"table": "pfedsd_table2", "setting": "fmnist 20 clients",
                                                 "paper_dataset": "fmnist", "metric": "pm_acc_mean"}))
    for method in ("pfedsd", "fedavg"):
        for s in seeds:
            cfg = RunConfig.from_dict(small_cfg(algorithm=method, seed=s, model="mlp", rounds=2, subsample=0.02,
                                                n_clients=6))
            run(cfg, root=store, progress=False)
            shutil.copytree(run_dir(cfg, store), where / method / run_dir(cfg, store).name)
    return where


def test_no_records_says_so(tmp_path):
    assert "No run records yet" in tier.tier_markdown(tmp_path)


def test_records_are_verified_and_compared_paired_by_seed(tmp_path):
    where = _lease(tmp_path / "docs", tmp_path / "store")
    bad = next((where / "fedavg").iterdir())
    (bad / "metrics.csv").write_text((bad / "metrics.csv").read_text().replace("0.", "0.9", 1))   # edited
    settings, refused = tier.read_tier(tmp_path / "docs")
    assert len(refused) == 1 and bad.name in refused[0] and "differs from its manifest" in refused[0]
    (st,) = settings
    assert sorted((r["method"], r["seed"]) for r in st.rows) == sorted(
        [("pfedsd", s) for s in (0, 1, 2)] + [("fedavg", s) for s in (0, 1, 2) if s != json.loads(
            (bad / "config.json").read_text())["seed"]])
    assert {r["paper"] for r in st.rows if r["method"] == "pfedsd"} == {96.57}   # Table 2's printed cell
    (claim,) = tier.paired_claims(st.rows, st.curves, st.metric)
    assert claim["claim"].startswith("pfedsd > fedavg") and claim["seeds"] == 2    # the refused seed is not paired
    assert claim["paper_effect"] == 96.57 - 90.15
    md = tier.tier_markdown(tmp_path / "docs")
    assert "pfedsd > fedavg" in md and "did not verify" in md and bad.name in md


def test_the_committed_cpu_tier_records_verify():
    """The paper-scale tier trained on these CPUs over several sessions (issue 54; DEVELOPERS.md: `gpu_check.py
    --records docs/paper_tier/cpu`) is committed record by record, since the machines are wiped between sessions:
    every record there verifies as the store would serve it, sits under its own method, and is pFedSD Table 2's
    Fashion-MNIST row at the paper's settings (100 clients, 100 rounds)."""
    from pflrepro.paths import REPO_ROOT
    settings, refused = tier.read_tier(REPO_ROOT / "docs" / "paper_tier")
    assert not refused, refused
    rows = [r for st in settings for r in st.rows]
    assert rows, "docs/paper_tier/ holds no records"
    assert {(st.table, st.setting) for st in settings} == {("pfedsd_table2", "fmnist 100 clients")}
    for st in settings:
        for folder in sorted(p for p in (REPO_ROOT / "docs" / "paper_tier").glob(f"{st.lease}/runs/*/*/*/*")):
            cfg = json.loads((folder / "config.json").read_text())
            assert folder.name.startswith(cfg["algorithm"]) and folder.parent.name == cfg["algorithm"]
            assert (cfg["n_clients"], cfg["rounds"], cfg["dataset"]) == (100, 100, "fmnist")
    assert all(r["rounds_done"] == r["rounds"] == 100 for r in rows)
