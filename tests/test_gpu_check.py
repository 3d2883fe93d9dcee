"""scripts/gpu_check.py, the device check (issue 32): its CPU `--tiny` mode runs every step here, so the check a GPU
machine runs cannot rot between the chances to run it; its paper slices are the paper's own configs; `--merge` joins
two calls' evidence."""
from __future__ import annotations

import csv
import subprocess
import sys

import pytest

from pflrepro.algorithms import ALGORITHMS
from pflrepro.paths import REPO_ROOT
from pflrepro.pipeline import experiments
from tests.conftest import FMNIST_AVAILABLE, load_script

SCRIPT = REPO_ROOT / "scripts" / "gpu_check.py"


def _module():
    return load_script(SCRIPT)


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.mark.skipif(not FMNIST_AVAILABLE, reason="needs offline Fashion-MNIST")
def test_tiny_cpu_check_runs_every_step_and_writes_at_most_8_files(tmp_path):
    """What a GPU machine runs, at seconds' scale on the CPU: every algorithm's two rounds pass, the engines agree on
    round 1, the same run twice is bit-identical (CPU: with and without the deterministic settings), one benchmark
    workload measures all three engines, and the first paper slice trains and is read back beside the paper."""
    out = tmp_path / "out"
    # about 2 minutes on an idle 2-core machine; the budget is where the check stops itself, not what it takes, so it
    # leaves room for a loaded one (a CI run beside a background job once ran out of 400 s)
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--device", "cpu", "--tiny",
                           "--budget-s", "1200"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=1500,
                          check=False, env={**__import__("os").environ, "PFLREPRO_RESULTS": str(tmp_path / "res")})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and {"gpu_check.md", "correctness.csv", "evidence.csv", "log.txt", "runs.tar.gz"} <= set(files)
    checks = _rows(out / "correctness.csv")
    assert {r["what"] for r in checks if r["check"] == "smoke round"} == set(ALGORITHMS)
    assert all(r["ok"] == "True" for r in checks), [r for r in checks if r["ok"] != "True"]
    assert {r["check"] for r in checks} == {"smoke round", "engines agree", "stacked = alone",
                                            "same run twice (default)", "same run twice (deterministic)"}
    stacked = [r for r in checks if r["check"] == "stacked = alone"]
    assert [r["clients_per_call"] for r in stacked] == ["12", "12"]     # 3 seeds x 4 clients in every call
    bench = _rows(out / "bench_engines.csv")
    assert {r["engine"] for r in bench if r.get("bench") != "stacked"} == {"conventional", "per_client", "batched"}
    assert {r["workload"] for r in bench if r.get("bench") == "stacked"} == {"mlp_fedavg", "lenet_pfedsd"}
    ev = _rows(out / "evidence.csv")
    # the plan reaches every paper (tiny: the first slice of each paper table, two methods, two seeds)
    assert {r["table"] for r in ev} == {"pfedsd_table2", "fedbsd_table1", "dcpfl_table1", "perfed_ckt_table1",
                                        "scd_table1"}
    assert all(r["finished"] == "True" and r["rounds_done"] == "2" and r["dataset"] == "fmnist" for r in ev)
    pf = [r for r in ev if r["table"] == "pfedsd_table2"]
    assert pf and all(float(r["paper"]) > 70 for r in pf)    # read beside pFedSD Table 2's printed FMNIST cells
    assert {r["paper_dataset"] for r in ev if r["table"] != "pfedsd_table2"} == {"cifar10"}
    import tarfile
    with tarfile.open(out / "runs.tar.gz") as tar:
        manifests = [n for n in tar.getnames() if n.endswith("manifest.json")]
        assert len(manifests) == len(ev)          # every finished run, as its store's verified record
        tar.extractall(tmp_path / "unpacked", filter="data")
    # the report reads them back as the paper-scale tier: every record verified, every paper's comparison decided
    from pflrepro.reporting import tier
    (tmp_path / "leases").mkdir()
    (tmp_path / "unpacked").rename(tmp_path / "leases" / "tiny")
    settings, refused = tier.read_tier(tmp_path / "leases")
    assert not refused and sum(len(st.rows) for st in settings) == len(ev)
    assert {st.table for st in settings} == {r["table"] for r in ev}
    md = tier.tier_markdown(tmp_path / "leases")
    for claim in _rows(out / "evidence_claims.csv"):
        assert claim["claim"] in md          # the same comparisons the check wrote, recomputed from the records
    report = (out / "gpu_check.md").read_text()
    for step in ("## 1. Correctness", "## 2. Engine benchmark", "## 3. Paper-scale evidence"):
        assert step in report


def test_the_first_slice_is_pfedsd_table2s_fmnist_row_at_the_papers_settings():
    """The most decisive evidence first: the methods that complete pFedSD's headline row, at exactly the paper
    profile's 100-client FMNIST configs
    (E = 5, B = 64, 10 % of 100 clients, 100 rounds), only the device and the checkpoint interval set by the check."""
    m = _module()
    name, setting, methods, rounds, over = m.SLICES[0]
    assert (name, setting, rounds, over) == ("pfedsd_table2", "fmnist 100 clients", None, {})
    assert set(methods) == {"fedprox", "pfedme", "fedfomo"}      # the three the 2026-11-28 lease did not reach
    got = m.slice_configs(name, setting, methods, rounds, False, "cuda", over)
    want = experiments.grid(experiments.load_profile(name, "paper"))
    assert {k[0] for k in got} == set(methods) and {k[1] for k in got} == {0, 1, 2}
    for (method, seed), cfg in got.items():
        ref = want[(method, setting, seed)]
        assert cfg.to_dict() == {**ref.to_dict(), "device": "cuda", "checkpoint_every": 5}
        assert (cfg.n_clients, cfg.participation, cfg.local_epochs, cfg.batch_size, cfg.rounds) == (100, 0.1, 5, 64, 100)


def test_merge_keeps_the_run_that_got_furthest_and_recomputes_the_claims(tmp_path):
    """Two calls: the first stopped pFedSD's seeds 1 and 2 at round 3 of 4, the second finished them; the merged
    evidence compares every pair at all 4 rounds, and a run that only the first call has stays."""
    m = _module()
    for call, runs in (("a", {("pfedsd", s): (3 if s else 4) for s in range(3)} | {("fedavg", s): 4 for s in range(3)}),
                       ("b", {("pfedsd", 1): 4, ("pfedsd", 2): 4})):
        rows, curves = [], []
        for (method, seed), done in runs.items():
            acc = [50 + r + (5 if method == "pfedsd" else 0) + (call == "b") for r in range(1, done + 1)]
            rows.append({"table": "t", "setting": "s", "method": method, "seed": seed, "rounds_done": done, "rounds": 4,
                         "finished": done == 4, "best_pm_acc_mean": max(acc), "best_round": done, "paper": 1.0})
            curves += [{"table": "t", "setting": "s", "method": method, "seed": seed, "round": r + 1,
                        "pm_acc_mean": v} for r, v in enumerate(acc)]
        (tmp_path / call).mkdir()
        m.write_csv(tmp_path / call / "evidence.csv", rows)
        m.write_csv(tmp_path / call / "evidence_curves.csv", curves)
    assert m.merge([tmp_path / "a", tmp_path / "b"], tmp_path / "m") == 0
    merged = {(r["method"], r["seed"]): r for r in _rows(tmp_path / "m" / "evidence.csv")}
    assert merged[("pfedsd", "1")]["from"] == "b" and merged[("pfedsd", "0")]["from"] == "a"
    assert all(r["finished"] == "True" for r in merged.values())
    claim, = _rows(tmp_path / "m" / "evidence_claims.csv")
    assert claim["at"] == "4 rounds" and claim["per_seed"] == "+5.00 +6.00 +6.00" and claim["verdict"] == "holds"


def test_every_papers_slice_is_its_headline_setting_on_fashion_mnist():
    """The plan's other papers: the paper profile's own setting (model, clients, E, B, participation) with the data
    swapped to Fashion-MNIST, three paired seeds (DC-PFL's paper profile runs one), rounds cut only where said."""
    m = _module()
    for name, setting, methods, rounds, over in m.SLICES[1:5]:
        got = m.slice_configs(name, setting, methods, rounds, False, "cuda", over)
        want = experiments.grid(experiments.load_profile(name, "paper"))
        assert {k[1] for k in got} == {0, 1, 2} and {k[0] for k in got} == set(methods)
        assert m.PAPER_METHOD[name] in methods
        for (method, seed), cfg in got.items():
            ref = next(c for (mm, st, _), c in want.items() if mm == method and st == setting)
            for f in ("model", "n_clients", "participation", "local_epochs", "batch_size", "lr", "partition"):
                assert getattr(cfg, f) == getattr(ref, f), (name, f)
            assert cfg.dataset == "fmnist" and cfg.seed == seed and cfg.device == "cuda"
            assert cfg.rounds == (min(rounds, ref.rounds) if rounds else ref.rounds)


@pytest.mark.skipif(not FMNIST_AVAILABLE, reason="needs offline Fashion-MNIST")
def test_store_keeps_the_evidence_runs_so_a_second_call_reuses_them(tmp_path):
    """`--store DIR` (the paper-scale tier on a CPU, over several sittings): the second call with the same store trains
    nothing again (each finished record is untouched and read back with the same numbers); without it, every call
    trains in a fresh temporary store. A stopped run resumes from its checkpoint through the store (test_store)."""
    def call(out, *extra, store="store"):
        proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / out), "--device", "cpu", "--tiny",
                               "--steps", "3", "--slices", "0", "--store", str(tmp_path / store), "--budget-s", "600",
                               *extra], cwd=REPO_ROOT, capture_output=True, text=True, timeout=900, check=False)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        found = tmp_path / out / "evidence.csv"
        return _rows(found) if found.exists() else []

    first = call("a", "--records", str(tmp_path / "kept" / "cpu"))
    records = sorted((tmp_path / "store").glob("*/*/provenance.json"))
    assert len(records) == len(first) == 4 and all(r["finished"] == "True" for r in first)
    stamps = [p.read_text() for p in records]
    second = call("b")
    assert [p.read_text() for p in sorted((tmp_path / "store").glob("*/*/provenance.json"))] == stamps
    keep = ("method", "seed", "best_pm_acc_mean", "final_pm_acc_mean", "run_cpu_seconds")
    assert [{k: r[k] for k in keep} for r in second] == [{k: r[k] for k in keep} for r in first]
    # --records: the finished records, verified, in the tier's layout (what a wiped machine's session commits), read
    # back by the report's tier with the same numbers
    from pflrepro.reporting import tier
    settings, refused = tier.read_tier(tmp_path / "kept")
    assert not refused and len(settings) == 1 and len(settings[0].rows) == 4
    assert sorted((r["method"], r["seed"], f"{r['best']:.6g}") for r in settings[0].rows) == sorted(
        (r["method"], int(r["seed"]), f"{float(r['best_pm_acc_mean']):.6g}") for r in first)
    # --collect trains nothing: it reads what the store finished; --records leaves a record already there as it is
    kept = sorted(p for p in (tmp_path / "kept").rglob("*") if p.is_file())
    before = [p.read_bytes() for p in kept]
    third = call("c", "--collect", "--records", str(tmp_path / "kept" / "cpu"))
    assert [{k: r[k] for k in keep} for r in third] == [{k: r[k] for k in keep} for r in first]
    assert sorted(p for p in (tmp_path / "kept").rglob("*") if p.is_file()) == kept
    assert [p.read_bytes() for p in kept] == before
    assert [p.read_text() for p in sorted((tmp_path / "store").glob("*/*/provenance.json"))] == stamps
    (tmp_path / "empty").mkdir()
    assert call("d", "--collect", store="empty") == []       # an existing store with nothing finished: no rows
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "e"), "--collect", "--steps", "3",
                           "--store", str(tmp_path / "nowhere")], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 2 and "--collect reads an existing --store DIR" in proc.stderr
    assert not (tmp_path / "e").exists() and not (tmp_path / "nowhere").exists()
