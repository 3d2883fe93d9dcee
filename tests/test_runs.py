"""Runs end to end on real Fashion-MNIST: learning, determinism, the content-addressed
store, resume after SIGKILL, and the evaluation protocol."""
import os
import subprocess
import sys

import numpy as np
import pytest

from pflrepro.data.partition import PARTITIONERS
from pflrepro.federation.build import build_partition
from pflrepro.federation.config import RunConfig
from pflrepro.params import ConfigError
from pflrepro.paths import REPO_ROOT
from pflrepro.pipeline.store import code_fingerprint, read_metrics, result_key, run, run_dir, summarise
from tests.conftest import FMNIST_AVAILABLE, MANY_PROCESSES, small_cfg

pytestmark = pytest.mark.skipif(not FMNIST_AVAILABLE, reason="needs offline Fashion-MNIST")


def test_fedavg_learns_on_fmnist(store):
    res = run(small_cfg(rounds=4, subsample=0.1), progress=False)
    gm = res.metric("gm_acc")
    assert gm[-1] > 0.6, gm             # chance is 0.10 (scored on 10 % of the test set, as subsample=0.1)
    assert res.metric("pm_acc_mean")[-1] == pytest.approx(res.metric("pm_acc_weighted")[-1], abs=0.05)
    p = res.provenance
    assert p["seed"] == 0 and p["device"] == "cpu" and p["bytes_up"] > 0 and p["train_flops_estimate"] > 0
    assert "commit" in p["git"]
    # what evaluation costs is visible: each evaluated round's share of its wall time, and the run's total
    assert all(0 < r["eval_seconds"] < r["seconds"] for r in res.history)
    assert p["eval_seconds"] == pytest.approx(sum(r["eval_seconds"] for r in res.history))
    assert 0 < p["eval_seconds"] < p["wall_seconds"]


@pytest.mark.parametrize("algorithm, hparams, partition, floor", [
    ("fedprox", {"mu": 0.01}, "iid", 0.5),     # 3 short rounds on 10% data; chance is 0.10
    ("local", {}, "shards", 0.7),               # 2 classes per client: local models do well
    ("fedavg_ft", {"ft_epochs": 2}, "shards", 0.7),
])
def test_each_algorithm_learns(store, algorithm, hparams, partition, floor):
    kw = {"partition": partition, "partition_params": {"s": 2}} if partition == "shards" else {}
    res = run(small_cfg(algorithm=algorithm, hparams=hparams, subsample=0.1, **kw), progress=False)
    assert res.metric("pm_acc_mean")[-1] > floor, res.metric("pm_acc_mean")


def test_same_config_same_metrics_and_store_reuse(tmp_path):
    cfg = RunConfig.from_dict(small_cfg(rounds=2))
    a = run(cfg, root=tmp_path / "a", progress=False)
    b = run(cfg, root=tmp_path / "b", progress=False)
    assert read_metrics(a.path) == read_metrics(b.path)                     # determinism on CPU
    again = run(cfg, root=tmp_path / "a", progress=False)           # content-addressed: not rerun
    assert again.provenance["finished"] == a.provenance["finished"]
    assert run_dir(cfg, tmp_path / "a").name.endswith(result_key(cfg)[:12])
    assert a.provenance["code_sha256"] == code_fingerprint(cfg.algorithm)
    other = run(cfg.replace(seed=1), root=tmp_path / "a", progress=False)
    assert read_metrics(other.path) != read_metrics(a.path)


@MANY_PROCESSES   # a resumed run equal to a straight one stays in `make test`: in-process (FedRoD, SCAFFOLD) and
# killed for real (FedBuff, test_schedule.py)
def test_resume_after_sigkill_gives_identicalread_metrics(tmp_path):
    args = ["algorithm=fedprox", "hparams.mu=0.01", "subsample=0.03", "n_clients=10", "participation=0.5",
            "model=cnn_fmnist", "rounds=3", "checkpoint_every=1", "batch_size=32", "lr=0.05", "momentum=0.9"]
    cmd = [sys.executable, "-m", "pflrepro", "run", "--quiet", *args]
    env = {**os.environ, "PFLREPRO_RESULTS": str(tmp_path / "killed"), "PFLREPRO_DIE_AFTER_ROUND": "2"}
    killed = subprocess.run(cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr             # really SIGKILLed mid-run
    (run_path,) = [p for p in (tmp_path / "killed" / "runs").iterdir() if p.is_dir()]   # a killed trainer leaves its .lock
    assert (run_path / "checkpoint.pt").exists() and not (run_path / "summary.json").exists()
    env.pop("PFLREPRO_DIE_AFTER_ROUND")
    resumed = subprocess.run(cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    env["PFLREPRO_RESULTS"] = str(tmp_path / "clean")
    clean = subprocess.run(cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True)
    assert clean.returncode == 0, clean.stderr
    (clean_path,) = (tmp_path / "clean" / "runs").iterdir()
    assert read_metrics(run_path) == read_metrics(clean_path)
    import json
    assert json.loads((run_path / "provenance.json").read_text())["resumed_from_round"] == 2


def test_generic_pm_is_gm_on_local_tests_and_local_gm_is_average(store):
    """SCD Remark 4.1 conventions."""
    fa = run(small_cfg(rounds=1), progress=False)
    # generic method: every client's PM accuracy is the GM scored on its local test set,
    # so the sample-weighted PM equals pooled accuracy of the GM over all local tests
    assert not np.isnan(fa.metric("pm_acc_mean")).any()
    lo = run(small_cfg(algorithm="local", rounds=1), progress=False)
    assert np.isfinite(lo.metric("gm_acc")).all()  # GM = averaged PMs on the global test set


def test_summarise_best_and_last10():
    hist = [{"round": r, "gm_acc": v, "pm_acc_mean": v, "pm_acc_weighted": v, "pm_acc_std": 0.0, "pm_acc_min": v}
            for r, v in enumerate([0.1, 0.5, 0.3] + [0.4] * 10, start=1)]
    s = summarise(hist)
    assert s["pm_acc_mean"]["best"] == 0.5 and s["pm_acc_mean"]["best_round"] == 2
    assert s["pm_acc_mean"]["last_mean"] == pytest.approx(0.4)
    assert s["pm_acc_mean"]["final"] == 0.4


def test_git_dirty_ignores_what_the_pipeline_rewrites(tmp_path, monkeypatch):
    """`dvc repro` rewrites dvc.lock, metrics/ and README's summary: a checkout is not called dirty for those,
    but is for any other tracked change (code, params, notebooks)."""
    import pflrepro.pipeline.provenance as runs_mod   # git_commit lives there (store re-exports it)

    def git(*a):
        subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *a], cwd=tmp_path, check=True,
                       capture_output=True)
    for f in ("dvc.lock", "README.md", "metrics/a.json", "pflrepro/x.py"):
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("0\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "init")
    monkeypatch.setattr(runs_mod, "REPO_ROOT", tmp_path)
    assert runs_mod.git_commit()["dirty"] is False
    for f in ("dvc.lock", "README.md", "metrics/a.json"):
        (tmp_path / f).write_text("1\n")
    (tmp_path / "new_untracked.py").write_text("1\n")
    g = runs_mod.git_commit()
    assert g["dirty"] is False and len(g["commit"]) == 40
    (tmp_path / "pflrepro/x.py").write_text("1\n")
    assert runs_mod.git_commit()["dirty"] is True


@pytest.mark.parametrize("partition", sorted(PARTITIONERS))
def test_more_clients_than_samples_is_refused_before_any_partitioner(partition):
    """n_clients above the samples a run partitions (600 at subsample=0.01) is one ConfigError, from the one check
    every partitioner shares: dirichlet, n_by_s and classes_uniform_shares spent minutes on n_clients=10**7."""
    cfg = RunConfig.from_dict(small_cfg(partition=partition, subsample=0.01, n_clients=601))
    with pytest.raises(ConfigError) as e:
        build_partition(cfg)
    assert str(e.value) == ("n_clients=601: more clients than the 600 samples the run partitions (fmnist, "
                            "pool='train', subsample=0.01), so some would get no data; use n_clients <= 600 or a "
                            "larger subsample")


def test_cli_prints_a_config_error_found_at_partitioning_as_one_line(store, capsys):
    from pflrepro.__main__ import main
    assert main(["run", "n_clients=10000000", "subsample=0.01", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("config error: n_clients=10000000: more clients than the 600 samples") and \
        err.count("\n") == 1, err
    assert main(["run", "lr=nan", "--quiet"]) == 2 and capsys.readouterr().err == \
        "config error: lr=nan: must be a finite number\n"


def test_a_config_the_data_refuses_leaves_nothing_in_the_store(tmp_path):
    """Issue 33: more clients than samples is refused after the run's folder would exist; the folder goes too (it
    held config.json and nothing else), so a refused config never looks like an unfinished run."""
    with pytest.raises(ConfigError, match="more clients than"):
        run(small_cfg(n_clients=10**9), root=tmp_path, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_cli_refuses_a_missing_or_malformed_config_file_in_one_line(tmp_path, capsys):
    from pflrepro.cli import main
    bad = tmp_path / "bad.yaml"
    bad.write_text("lr: [0.1\n")
    listed = tmp_path / "list.yaml"
    listed.write_text("- lr\n")
    for path, says in ((tmp_path / "missing.yaml", "No such file"), (bad, "not valid YAML"),
                       (listed, "expected a mapping")):
        assert main(["run", "--config", str(path), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"config error: --config {path}: ") and says in err and err.count("\n") == 1, err


def test_cli_list_shows_every_algorithms_settings(capsys):
    """`list` shows each algorithm's hyperparameters with default, range and help (FedProx's mu was invisible)."""
    from pflrepro.algorithms import ALGORITHMS
    from pflrepro.cli import allowed, main
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "    mu                 default=0.01       float >= 0             proximal coefficient mu" in out
    for name, cls in ALGORITHMS.items():
        assert f"\n  {name}" in out
        for key, p in cls.HPARAMS.items():
            assert f"    {key:<18} default={p.default!r:<10} {allowed(p):<22} {p.help}" in out, (name, key)


def test_a_finished_run_drops_its_checkpoint_unless_a_later_stage_reads_it(tmp_path, monkeypatch):
    """Issue 33 (disk): a finished run keeps summary, metrics, per-client results and provenance; its checkpoint goes,
    except where a later stage reads its final states (SCD Fig. 3: `new_clients` > 0) or $PFLREPRO_KEEP_CHECKPOINTS=1
    asks. A stored result is served the same without it."""
    monkeypatch.delenv("PFLREPRO_KEEP_CHECKPOINTS", raising=False)
    cfg = small_cfg(rounds=2, subsample=0.02)
    a = run(cfg, root=tmp_path / "a", progress=False)
    assert not (a.path / "checkpoint.pt").exists()
    assert {"summary.json", "metrics.csv", "per_client.csv", "provenance.json", "partition.npz"} <= \
        {f.name for f in a.path.iterdir()}
    again = run(cfg, root=tmp_path / "a", progress=False)
    assert again.history == a.history and again.summary == a.summary
    kept = run(small_cfg(rounds=2, subsample=0.02, new_clients=2), root=tmp_path / "a", progress=False)
    assert (kept.path / "checkpoint.pt").exists()
    monkeypatch.setenv("PFLREPRO_KEEP_CHECKPOINTS", "1")
    b = run(cfg, root=tmp_path / "b", progress=False)
    assert (b.path / "checkpoint.pt").exists() and b.summary == a.summary


def test_prune_deletes_only_checkpoints_no_stage_reads(tmp_path, monkeypatch, capsys):
    """`python -m pflrepro prune`: finished runs lose their checkpoints (SCD Fig. 3's keep theirs); an unfinished
    run (a checkpoint, no summary) keeps it and still resumes."""
    from pflrepro.cli import main
    monkeypatch.setenv("PFLREPRO_KEEP_CHECKPOINTS", "1")
    done = run(small_cfg(rounds=2, subsample=0.02), root=tmp_path, progress=False)
    reads = run(small_cfg(rounds=2, subsample=0.02, new_clients=2), root=tmp_path, progress=False)
    unfinished = tmp_path / "fedavg-fmnist-unfinished"
    unfinished.mkdir()
    (unfinished / "checkpoint.pt").write_bytes(b"x")
    monkeypatch.delenv("PFLREPRO_KEEP_CHECKPOINTS")
    size = (done.path / "checkpoint.pt").stat().st_size
    assert main(["prune", "--results", str(tmp_path), "--dry-run"]) == 0 and (done.path / "checkpoint.pt").exists()
    assert f"would delete 1 checkpoints of finished runs, {size / 1e9:.2f} GB" in capsys.readouterr().out
    assert main(["prune", "--results", str(tmp_path)]) == 0
    assert not (done.path / "checkpoint.pt").exists()
    assert (reads.path / "checkpoint.pt").exists() and (unfinished / "checkpoint.pt").exists()



def test_cli_refuses_an_absurd_run_unless_told_yes_and_ctrl_c_is_one_line(store, capsys, monkeypatch):
    """Issue 33: rounds=1e9 ran for ever; `run` now says what a long run costs (pflrepro.pipeline.budget) and refuses
    one above 30 days without --yes, before anything is written. Ctrl-C prints one line and exits 130."""
    from pflrepro import cli
    assert cli.main(["run", "rounds=1000000000", "subsample=0.01", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "cost of 1 runs to train" in err and err.strip().splitlines()[-1].startswith(
        "config error: this run would train for at least") and "--yes" in err
    assert not store.exists() or not any((store / "runs").glob("*"))

    def interrupted(a):
        raise KeyboardInterrupt
    monkeypatch.setitem(cli.VERBS, "list", (cli._add_list, interrupted))
    assert cli.main(["list"]) == 130
    assert capsys.readouterr().err.startswith("interrupted: ")

def test_torch_imported_first_is_noticed_and_said_once(tmp_path):
    """Issue 35: `import torch` before pflrepro defeats OMP_WAIT_POLICY=PASSIVE (a round took 165 s instead of 46 s
    beside another busy process); a multi-threaded run then warns once, saying how to avoid it."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    code = ("import {0}; import {1}, warnings, pflrepro.pipeline.store as s, torch\n"
            "torch.set_num_threads(2)\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always'); s._warn_torch_first(); s._warn_torch_first()\n"
            "print(pflrepro.TORCH_FIRST, len(w))")
    out = subprocess.run([sys.executable, "-c", code.format("torch", "pflrepro")], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.split() == ["True", "1"], out.stderr
    out = subprocess.run([sys.executable, "-c", code.format("pflrepro", "torch")], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.split() == ["False", "0"], out.stderr
