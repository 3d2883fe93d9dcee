"""Fault injection into the run store (issue 34): every file kind of a finished and of an unfinished run damaged five
ways, a kill before every write of a run's completion, and two processes on one config. Each time: the damage is
detected (the run is moved to `<store>-quarantine/`, nothing deleted), nothing wrong is served, and the run is
recomputed to metrics bit-identical to an undamaged run's."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from pflrepro.federation.config import RunConfig
from pflrepro.paths import REPO_ROOT
from pflrepro.pipeline import store as S
from tests.conftest import FMNIST_AVAILABLE, small_cfg
from tests.storetools import edit_checkpoint, nudge_first_weight

pytestmark = pytest.mark.skipif(not FMNIST_AVAILABLE, reason="needs offline Fashion-MNIST")

CFG = small_cfg(subsample=0.02, n_clients=4, rounds=3, checkpoint_every=1, model="mlp")
DAMAGES = ("truncate", "empty", "garbage", "delete", "edit")


def _edit(path):
    """A plausible edit: the file still parses, one value differs."""
    name = path.name
    if name == "config.json":
        d = json.loads(path.read_text())
        d["lr"] = d["lr"] * 10
        path.write_text(json.dumps(d))
    elif name in ("summary.json", "provenance.json", "manifest.json"):
        d = json.loads(path.read_text())
        key = {"summary.json": "pm_acc_mean", "provenance.json": "wall_seconds", "manifest.json": "files"}[name]
        if name == "summary.json":
            d[key]["best"] += 0.01
        elif name == "manifest.json":
            d[key]["metrics.csv"]["size"] += 1
        else:
            d[key] += 1.0
        path.write_text(json.dumps(d))
    elif name.endswith(".csv"):
        text = path.read_text()
        i = max(i for i, c in enumerate(text) if c.isdigit() and text[i - 1] != ",")
        path.write_text(text[:i] + str((int(text[i]) + 1) % 10) + text[i + 1:])
    elif name == "partition.npz":
        z = dict(np.load(path))
        k = sorted(z)[0]
        z[k] = z[k].copy()
        z[k][0], z[k][-1] = z[k][-1] + 1, z[k][0]
        with open(path, "wb") as f:
            np.savez_compressed(f, **z)
    elif name == "checkpoint.pt":
        edit_checkpoint(path, nudge_first_weight)
    else:
        raise AssertionError(name)


def damage(path, how):
    if how == "truncate":
        path.write_bytes(path.read_bytes()[: max(1, path.stat().st_size // 2)])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "garbage":
        path.write_bytes(os.urandom(max(64, min(path.stat().st_size, 4096))))
    elif how == "delete":
        path.unlink()
    else:
        _edit(path)


def _numbers(res):
    """What a table reads of a run, from its files."""
    stored = S.load_result(res.path)
    return S.read_metrics(res.path), stored.per_client, stored.summary


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """The undamaged result every recomputation must equal, bit for bit."""
    return _numbers(S.run(CFG, root=tmp_path_factory.mktemp("clean"), progress=False))


FINISHED_FILES = ("config.json", "metrics.csv", "per_client.csv", "summary.json", "provenance.json",
                  "partition.npz", "manifest.json")


@pytest.mark.parametrize("what", FINISHED_FILES)
def test_a_damaged_finished_run_is_never_served_and_is_recomputed(tmp_path, clean, what, capsys):
    """A finished run with one file damaged each of five ways: served only if it still verifies (a deleted manifest
    leaves nothing that vouches for the files: issue 52), else moved aside whole, said in one line, and recomputed to
    the same bits."""
    root = tmp_path / "runs"
    ref = S.run(CFG, root=root, progress=False)
    for how in DAMAGES:
        damage(ref.path / what, how)
        before = set(S.quarantine_root(ref.path).glob("*")) if S.quarantine_root(ref.path).exists() else set()
        res = S.run(CFG, root=root, progress=False)
        assert _numbers(res) == clean, (what, how)
        moved = set(S.quarantine_root(ref.path).glob("*")) - before if S.quarantine_root(ref.path).exists() else set()
        assert len(moved) == 1, (what, how)
        (m,) = moved
        assert (m / "config.json").exists() or what == "config.json" and how == "delete", (what, how)
        err = capsys.readouterr().err
        assert f"run {ref.path.name}: " in err and "recomputing" in err and err.count("\n") == 1, err
        assert S.verify(ref.path, RunConfig.from_dict(CFG))       # what is left verifies


def test_without_a_manifest_nothing_is_served(tmp_path, clean):
    """A finished run whose manifest is gone is not served on any weaker check (issue 52: legacy adoption checked only
    the config and the summary, and served an edited per_client.csv): it is moved aside and recomputed."""
    root = tmp_path / "runs"
    ref = S.run(CFG, root=root, progress=False)
    (ref.path / S.MANIFEST).unlink()
    (ref.path / "partition.npz").write_bytes(b"not a zip")
    assert not S.is_finished(ref.path)
    res = S.run(CFG, root=root, progress=False)
    assert _numbers(res) == clean
    assert len(list(S.quarantine_root(ref.path).glob("*"))) == 1 and (ref.path / S.MANIFEST).exists()


@pytest.fixture(scope="module")
def unfinished(tmp_path_factory):
    """A run SIGKILLed after round 2 (checkpoint every round): a checkpoint, a partition, no manifest."""
    store = tmp_path_factory.mktemp("killed")
    env = {**os.environ, "PFLREPRO_RESULTS": str(store), "PFLREPRO_DIE_AFTER_ROUND": "2"}
    p = subprocess.run([sys.executable, "-m", "pflrepro", "run", "--quiet", *_cli_args()], env=env, cwd=REPO_ROOT,
                       capture_output=True, text=True, check=False)
    assert p.returncode == -9, p.stderr
    (path,) = [d for d in (store / "runs").iterdir() if d.is_dir()]
    assert (path / "checkpoint.pt").exists() and not S.is_finished(path)
    return path


def _cli_args():
    return [f"{k}={json.dumps(v) if isinstance(v, (dict, list)) else v}" for k, v in CFG.items()]


@pytest.mark.parametrize("what", ("checkpoint.pt", "partition.npz", "config.json"))
def test_a_damaged_unfinished_run_resumes_or_restarts_to_the_same_bits(tmp_path, clean, unfinished, what):
    """An unfinished run with its checkpoint, partition or config damaged: the damaged state is set aside (a deleted
    one is simply absent) and the run starts from round 1 (or resumes, when what is left verifies): the same bits."""
    for how in DAMAGES:
        root = tmp_path / how / "runs"
        path = root / unfinished.name
        shutil.copytree(unfinished, path)
        damage(path / what, how)
        res = S.run(CFG, root=root, progress=False)
        assert _numbers(res) == clean, (what, how)
        if how != "delete":
            assert any(S.quarantine_root(path).iterdir()), (what, how)        # set aside, not deleted
        assert not (path / "checkpoint.pt").exists()


@pytest.mark.parametrize("step", ("metrics.csv", "per_client.csv", "provenance.json", "summary.json",
                                  "manifest.json", "checkpoint"))
def test_a_kill_at_every_completion_write_ends_in_the_same_bits(tmp_path, clean, step):
    """SIGKILL just before each write of a run's completion: the next call finishes it (resumes from the checkpoint,
    or serves what was all written) with the same metrics, a manifest, and no checkpoint left."""
    env = {**os.environ, "PFLREPRO_RESULTS": str(tmp_path), "PFLREPRO_DIE_BEFORE": step}
    cmd = [sys.executable, "-m", "pflrepro", "run", "--quiet", *_cli_args()]
    p = subprocess.run(cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    assert p.returncode == -9, p.stderr
    res = S.run(CFG, root=tmp_path / "runs", progress=False)
    assert _numbers(res) == clean
    assert (res.path / "manifest.json").exists() and not (res.path / "checkpoint.pt").exists()
    assert S.verify(res.path, RunConfig.from_dict(CFG))


def test_two_processes_on_one_config_train_it_once(tmp_path, clean):
    """Two `run`s of one config at once: one trains, the other waits for it (saying so) and serves its result."""
    env = {**os.environ, "PFLREPRO_RESULTS": str(tmp_path)}
    cmd = [sys.executable, "-m", "pflrepro", "run", "--quiet", *_cli_args(), "rounds=6"]
    # >= 18 s of training: the second process must start (import torch, build its config) while the first still
    # trains, also on a loaded machine (at 1 s a round, a CI run beside two background jobs found it finished)
    first = subprocess.Popen(cmd, env={**env, "PFLREPRO_PAUSE_AFTER_CHECKPOINT": "3"}, cwd=REPO_ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lock = S.run_dir(RunConfig.from_dict({**CFG, "rounds": 6}), tmp_path / "runs")
    deadline = time.monotonic() + 120
    while not (lock / "progress.json").exists() and time.monotonic() < deadline:   # the first is in round 1
        time.sleep(0.05)
    second = subprocess.run(cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    out1, err1 = first.communicate(timeout=120)
    assert first.returncode == 0 and second.returncode == 0, err1 + second.stderr
    assert "is being trained by another process: waiting for it" in second.stderr
    assert json.loads(out1) == json.loads(second.stdout)
    prov = json.loads((lock / "provenance.json").read_text())
    assert prov["resumed_from_round"] in (None, 0)          # trained once, straight through


def _nan_accuracy(monkeypatch, seeds):
    """Runs with these seeds score NaN (what a split leaving no client a test set gave, before issue 33 refused such a
    split up front): the store's last defence against a non-finite result is still tested."""
    from pflrepro.core import loop
    real = loop.evaluate

    def evaluate(ctx, *a, **k):
        row, accs = real(ctx, *a, **k)
        return ({**row, "pm_acc_mean": float("nan")} if ctx.cfg.seed in seeds else row), accs
    monkeypatch.setattr(loop, "evaluate", evaluate)


def test_a_run_whose_metrics_are_not_finite_fails_in_one_line_and_stores_nothing(tmp_path, monkeypatch, capsys):
    """The accuracies are NaN: the run ends as failed with one line (exit 2), and no folder is left in the store as
    if it had finished."""
    from pflrepro.cli import main
    monkeypatch.setenv("PFLREPRO_RESULTS", str(tmp_path))
    _nan_accuracy(monkeypatch, {7})
    args = [a for a in _cli_args() if not a.startswith("seed")] + ["seed=7", "rounds=1"]
    assert main(["run", "--quiet", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not finite" in err, err
    assert not (tmp_path / "runs").exists() or not [d for d in (tmp_path / "runs").iterdir() if d.is_dir()]


@pytest.mark.parametrize("how", ("labels", "garbage"))
def test_a_bad_fmnist_tensor_cache_is_set_aside_and_rebuilt_before_a_run_reads_it(tmp_path, monkeypatch, clean, how,
                                                                                   capsys):
    """The tensor cache is read before the hash-checked IDX files: one with wrong labels (or not loadable at all) is
    detected by the source's digests as it is read, moved aside, rebuilt, said in one line; the run trains on the real
    data (the same bits as with a good cache), and `python -m pflrepro data fmnist` reports the check."""
    from pflrepro.cli import main
    from pflrepro.data import datasets as D
    from pflrepro.federation import build
    monkeypatch.setenv("PFLREPRO_TENSOR_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "_RAW_CACHE", {})
    monkeypatch.setattr(D, "CACHE_REBUILT", {})
    good = D.load_dataset("fmnist")
    bad = tmp_path / "cache" / "fmnist.pt"
    if how == "labels":
        D.save_tensor_cache(D.RawDataset(good.spec, good.x_train, (good.y_train + 1) % 10, good.x_test, good.y_test,
                                         source="tampered"), bad)
    else:
        bad.parent.mkdir(parents=True)
        bad.write_bytes(os.urandom(4096))
    res = S.run(CFG, root=tmp_path / "runs", progress=False)
    err = capsys.readouterr().err
    assert f"tensor cache {bad}: " in err and "rebuilt from the checked source" in err, err
    assert _numbers(res) == clean
    assert len(list(bad.parent.glob("fmnist.pt.bad-*"))) == 1 and not list(bad.parent.glob("*.tmp"))
    monkeypatch.setattr(D, "CACHE_REBUILT", {})
    assert main(["data", "fmnist"]) == 0
    assert json.loads(capsys.readouterr().out)["tensor_cache"] == "checked"


def test_a_grid_names_its_failed_runs_and_trains_the_others(tmp_path, capsys, monkeypatch):
    """Two runs of a grid of four fail (their accuracies are NaN): the grid says so per run, trains the other two
    (stored, served after), and raises one GridFailed naming both failed runs' folders; with keep_going=False the
    first failure stops it."""
    from pflrepro.pipeline.experiments import run_grid
    from pflrepro.pipeline.parallel import GridFailed
    _nan_accuracy(monkeypatch, {2, 3})
    # the failing runs first in the grid (runs of equal cost start in grid order): keep_going=False stops at once
    grid = {("bad", "-", s): RunConfig.from_dict({**CFG, "rounds": 1, "seed": s}) for s in (2, 3)}
    grid |= {("ok", "-", s): RunConfig.from_dict({**CFG, "rounds": 1, "seed": s}) for s in (0, 1)}
    with pytest.raises(GridFailed) as e:
        run_grid(grid, root=tmp_path / "a", progress=False, jobs=1)
    assert str(e.value).startswith("2 of 4 runs failed: ") and "\n" not in str(e.value)
    for (kind, _, _), cfg in grid.items():
        path = S.run_dir(cfg, tmp_path / "a")
        assert (path.name in str(e.value)) == (kind == "bad") and S.is_finished(path) == (kind == "ok")
    assert capsys.readouterr().err.count("failed (RunFailed); the others go on") == 2
    with pytest.raises(S.RunFailed):
        run_grid(grid, root=tmp_path / "b", progress=False, jobs=1, keep_going=False)
    assert sum(S.is_finished(S.run_dir(c, tmp_path / "b")) for c in grid.values()) < 2
