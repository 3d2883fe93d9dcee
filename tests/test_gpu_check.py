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
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--device", "cpu", "--tiny",
                           "--budget-s", "400"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
                          check=False, env={**__import__("os").environ, "PFLREPRO_RESULTS": str(tmp_path / "res")})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and {"gpu_check.md", "env.json", "correctness.csv", "evidence.csv", "log.txt"} <= set(files)
    checks = _rows(out / "correctness.csv")
    assert {r["what"] for r in checks if r["check"] == "smoke round"} == set(ALGORITHMS)
    assert all(r["ok"] == "True" for r in checks), [r for r in checks if r["ok"] != "True"]
    assert {r["check"] for r in checks} == {"smoke round", "engines agree", "same run twice (default)",
                                            "same run twice (deterministic)"}
    bench = _rows(out / "bench_engines.csv")
    assert {r["engine"] for r in bench} == {"conventional", "per_client", "batched"}
    ev = _rows(out / "evidence.csv")
    assert ev and all(r["finished"] == "True" and r["rounds_done"] == "2" for r in ev)
    assert all(float(r["paper"]) > 90 for r in ev)      # read beside pFedSD Table 2's printed FMNIST cells
    report = (out / "gpu_check.md").read_text()
    for step in ("## 1. Correctness", "## 2. Engine benchmark", "## 3. Paper-scale evidence"):
        assert step in report


def test_the_first_slice_is_pfedsd_table2s_fmnist_row_at_the_papers_settings():
    """The most decisive evidence first: the four methods at exactly the paper profile's 100-client FMNIST configs
    (E = 5, B = 64, 10 % of 100 clients, 100 rounds), only the device and the checkpoint interval set by the check."""
    m = _module()
    name, setting, methods, rounds = m.SLICES[0]
    assert (name, setting, rounds) == ("pfedsd_table2", "fmnist 100 clients", None)
    got = m.slice_configs(name, setting, methods, rounds, False, "cuda")
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
