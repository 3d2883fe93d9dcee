"""Issue 52's defects of the run store, one named test each (numbered as in the issue): every one fails against the
store of a100f42 (checked by running this file in a worktree of it, with tests/storetools.py and tests/faultfs.py) and
passes now. The fault-injection sweep over every write and rename is tests/test_store_writes.py."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from pflrepro.cli import main
from pflrepro.federation import build
from pflrepro.federation.config import RunConfig
from pflrepro.paths import REPO_ROOT
from pflrepro.pipeline import store as S
from tests.conftest import FMNIST_AVAILABLE, small_cfg
from tests.faultfs import Layer, installed
from tests.storetools import edit_checkpoint, nudge_first_weight

pytestmark = pytest.mark.skipif(not FMNIST_AVAILABLE, reason="needs offline Fashion-MNIST")

CFG = small_cfg(subsample=0.02, n_clients=4, rounds=3, checkpoint_every=1, model="mlp")
ARGS = [f"{k}={json.dumps(v) if isinstance(v, (dict, list)) else v}" for k, v in CFG.items()]


def _numbers(path):
    stored = S.load_result(path)
    return S.read_metrics(path), stored.per_client, stored.summary


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    return _numbers(S.run(CFG, root=tmp_path_factory.mktemp("clean") / "runs", progress=False).path)


def _killed_after_round(store, rnd: int, cfg=CFG):
    """An unfinished run: the CLI SIGKILLed right after round `rnd`'s checkpoint."""
    args = [f"{k}={json.dumps(v) if isinstance(v, (dict, list)) else v}" for k, v in cfg.items()]
    env = {**os.environ, "PFLREPRO_RESULTS": str(store), "PFLREPRO_DIE_AFTER_ROUND": str(rnd)}
    p = subprocess.run([sys.executable, "-m", "pflrepro", "run", "--quiet", *args], env=env, cwd=REPO_ROOT,
                       capture_output=True, text=True, check=False)
    assert p.returncode == -9, p.stderr
    return S.run_dir(RunConfig.from_dict(cfg), store / "runs")


# ------------------------------------------------------------------------------------------------------------ 1
def _tamper_cache(folder):
    """A tensor cache at `folder` whose training labels are shifted by one class."""
    from pflrepro.data import datasets as D
    good = build.raw_dataset("fmnist")
    D.save_tensor_cache(D.RawDataset(good.spec, good.x_train, (good.y_train + 1) % 10, good.x_test, good.y_test,
                                     source="tampered"), folder / "fmnist.pt")


@pytest.mark.parametrize("entry", ("cli run", "cli partition, then run", "grid", "store"))
def test_1_a_bad_tensor_cache_changes_no_stored_result_by_any_entry(tmp_path, monkeypatch, clean, entry, capsys):
    """Defect 1: the CLI (and a grid's dataset check) loaded the cache into memory before the store checked it, and the
    run trained on its wrong labels under the right address. Now the cache is checked as it is read."""
    from pflrepro.pipeline import executors
    cache = tmp_path / "cache"
    monkeypatch.setenv("PFLREPRO_TENSOR_CACHE", str(cache))
    monkeypatch.setenv("PFLREPRO_RESULTS", str(tmp_path / "store"))
    monkeypatch.setattr(build, "_RAW_CACHE", {})
    _tamper_cache(cache)
    monkeypatch.setattr(build, "_RAW_CACHE", {})
    check = getattr(getattr(__import__("pflrepro.pipeline", fromlist=["x"]), "datacache", None), "check", None)
    if check is not None:   # the older store's once-per-process check
        check.cache_clear()
    cfg = RunConfig.from_dict(CFG)
    if entry == "cli run":
        assert main(["run", "--quiet", *ARGS]) == 0
        path = S.run_dir(cfg)
    elif entry == "cli partition, then run":
        assert main(["partition", *ARGS, "--out", str(tmp_path / "p.png")]) == 0
        path = S.run(cfg, progress=False).path
    elif entry == "grid":
        executors.check_datasets([cfg])
        path = S.run(cfg, progress=False).path
    else:
        path = S.run(cfg, progress=False).path
    assert _numbers(path) == clean
    assert "tensor cache" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------------------ 2
def _edit_csv_value(path, column):
    rows = path.read_bytes().decode().split("\r\n")
    header = rows[0].split(",")
    j = header.index(column)
    cells = rows[1].split(",")
    cells[j] = str(float(cells[j]) + 0.125)
    rows[1] = ",".join(cells)
    path.write_bytes("\r\n".join(rows).encode())


EDITS = {
    "per_client.csv": lambda p: _edit_csv_value(p / "per_client.csv", "client_0"),
    "train_loss": lambda p: _edit_csv_value(p / "metrics.csv", "train_loss"),
    "provenance.json": lambda p: (p / "provenance.json").write_text(
        json.dumps({**json.loads((p / "provenance.json").read_text()), "seed": 99})),
    "partition.npz": lambda p: _swap_partition(p / "partition.npz"),
}


def _swap_partition(path):
    z = dict(np.load(path))
    z["train_0"], z["train_1"] = z["train_1"], z["train_0"]
    with open(path, "wb") as f:
        np.savez_compressed(f, **z)


@pytest.mark.parametrize("edits", (("per_client.csv",), ("train_loss",), ("provenance.json",), ("partition.npz",),
                                   ("per_client.csv", "partition.npz"), ("train_loss", "provenance.json")))
def test_2_without_its_manifest_no_edited_file_is_served(tmp_path, clean, edits):
    """Defect 2: deleting manifest.json turned the hash checks off (only the config and the summary were checked), and
    the manifest written on that read vouched for the edits. Now a run without its manifest is recomputed."""
    root = tmp_path / "runs"
    ref = S.run(CFG, root=root, progress=False)
    (ref.path / S.MANIFEST).unlink()
    for e in edits:
        EDITS[e](ref.path)
    res = S.run(CFG, root=root, progress=False)
    assert _numbers(res.path) == clean
    assert json.loads((res.path / "provenance.json").read_text())["seed"] == CFG.get("seed", 0)
    stored, want = S._load_partition(res.path), build.build_partition(RunConfig.from_dict(CFG))
    assert all(np.array_equal(a, b) for part in want for a, b in zip(stored[part], want[part]))


# ------------------------------------------------------------------------------------------------------------ 3
PAUSING = """
import json, os, sys, time
from pflrepro.pipeline import store as S
fn, secs, mark = os.environ["PAUSE_FN"], float(os.environ["PAUSE_S"]), os.environ["PAUSE_MARK"]
real = getattr(S, fn)
def paused(*a, **k):
    if fn == "verify":
        try:
            return real(*a, **k)
        finally:
            open(mark, "w").close(); time.sleep(secs)
    open(mark, "w").close(); time.sleep(secs)
    return real(*a, **k)
setattr(S, fn, paused)
res = S.run(json.loads(sys.argv[1]), root=sys.argv[2], progress=False)
print(json.dumps(S.read_metrics(res.path)))
"""


@pytest.mark.parametrize("step", ("verify", "quarantine", "at:checked", "at:locked", "at:quarantine"))
def test_3_a_reader_never_moves_a_run_being_trained(tmp_path, clean, step):
    """Defect 3: a reader verified and quarantined outside the training lock; paused between its check and its move, it
    moved the folder of a run another process had started training meanwhile (a FileNotFoundError traceback). Now a
    run is moved aside only under its lock, after a second check there. The reader pauses after a check (`verify`),
    before a move (`quarantine`), or at the store's own pause points (`at:`: store._pause, $PFLREPRO_PAUSE_AT)."""
    root = tmp_path / "runs"
    ref = S.run(CFG, root=root, progress=False)
    summary = json.loads((ref.path / "summary.json").read_text())
    summary["pm_acc_mean"]["best"] += 0.01
    (ref.path / "summary.json").write_text(json.dumps(summary))
    mark = tmp_path / "paused"
    cmd = [sys.executable, "-c", PAUSING, json.dumps(CFG), str(root)]
    env = {**os.environ, "PAUSE_FN": step, "PAUSE_S": "4", "PAUSE_MARK": str(mark)}
    if step.startswith("at:"):
        env.update(PAUSE_FN="summarise", PAUSE_S="0", PAUSE_MARK=str(tmp_path / "unused"),
                   PFLREPRO_PAUSE_AT=step[3:] + ":4", PFLREPRO_PAUSE_MARK=str(mark))
    reader = subprocess.Popen(cmd, env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not mark.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    trainer = subprocess.run(cmd, env={**env, "PAUSE_FN": "summarise", "PAUSE_S": "0", "PFLREPRO_PAUSE_AT": "",
                                       "PFLREPRO_PAUSE_AFTER_CHECKPOINT": "1"},
                             cwd=REPO_ROOT, capture_output=True, text=True, check=False, timeout=300)
    out, err = reader.communicate(timeout=300)
    assert reader.returncode == 0 and trainer.returncode == 0, err[-800:] + trainer.stderr[-800:]
    assert "Traceback" not in err + trainer.stderr
    assert json.loads(out) == json.loads(trainer.stdout) == [dict(r) for r in clean[0]]
    assert _numbers(ref.path) == clean and len(list(S.quarantine_root(ref.path).iterdir())) == 1


# ------------------------------------------------------------------------------------------------------------ 4
@pytest.fixture(scope="module")
def unfinished(tmp_path_factory):
    """Two unfinished runs, killed after round 2: this config's and another seed's."""
    store = tmp_path_factory.mktemp("killed")
    return _killed_after_round(store, 2), _killed_after_round(store, 2, {**CFG, "seed": 1})


def _resume_from(tmp_path, unfinished, change):
    mine, other = unfinished
    root = tmp_path / "runs"
    path = root / mine.name
    shutil.copytree(mine, path)
    change(path, other)
    return S.run(CFG, root=root, progress=False)


def _tampered_without_sha(path, other):
    edit_checkpoint(path / "checkpoint.pt", nudge_first_weight)
    (path / "checkpoint.sha256").unlink(missing_ok=True)


def _another_runs(path, other):
    for f in ("checkpoint.pt", "checkpoint.sha256"):
        if (other / f).exists():
            shutil.copy(other / f, path / f)


def _round_edited(path, other):
    edit_checkpoint(path / "checkpoint.pt", lambda state: state.update(round=1), rehash=True)


@pytest.mark.parametrize("change", (_tampered_without_sha, _another_runs, _round_edited),
                         ids=("tampered, its sha256 gone", "another config's, with its sha256", "round edited"))
def test_4_a_checkpoint_resumes_only_its_own_run(tmp_path, unfinished, clean, change, capsys):
    """Defect 4: a tampered checkpoint without its sha file resumed silently; another config's checkpoint (and sha)
    resumed and finished as this run; an edited round resumed there. Now a checkpoint is one record bound to its run's
    config and code, its round checked against its history: anything else is set aside in one line."""
    res = _resume_from(tmp_path, unfinished, change)
    assert _numbers(res.path) == clean
    err = capsys.readouterr().err
    assert "checkpoint.pt" in err and err.count("\n") == 1, err


# ------------------------------------------------------------------------------------------------------------ 5
def _ops_of_a_fresh_run(tmp_path):
    with installed(Layer(tmp_path / "count")) as layer:
        S.run(CFG, root=tmp_path / "count" / "runs", progress=False)
    return layer.ops


def test_5_a_kill_while_a_checkpoint_is_written_loses_at_most_that_round(tmp_path, clean):
    """Defect 5: the checkpoint and its sha256 were two writes; a kill (or a full disk) between them made the next run
    set a good checkpoint aside and start again from round 1. Now each of round 2's checkpoint writes and renames,
    killed, resumes from round 1 or 2."""
    ops = _ops_of_a_fresh_run(tmp_path)
    first = next(i for i, op in enumerate(ops) if op.endswith("/checkpoint.pt") and op.startswith("rename"))
    end = next(i for i, op in enumerate(ops) if "metrics.csv" in op)
    cases = [i for i in range(first + 1, end) if "checkpoint" in ops[i]]
    assert cases
    for i in cases:
        base = tmp_path / str(i)
        pid = os.fork()
        if pid == 0:
            try:
                with installed(Layer(base, i, "kill")):
                    S.run(CFG, root=base / "runs", progress=False)
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        res = S.run(CFG, root=base / "runs", progress=False)
        assert _numbers(res.path) == clean, ops[i]
        if os.WIFSIGNALED(status):
            assert (res.provenance["resumed_from_round"] or 0) >= 1, (ops[i], res.provenance["resumed_from_round"])


# ------------------------------------------------------------------------------------------------------------ 6
def _one_line(capsys, rc, want_rc, *words):
    err = capsys.readouterr().err
    assert rc == want_rc and err.count("\n") == 1 and "Traceback" not in err, err[-500:]
    assert all(w in err for w in words), err


def test_6a_a_fraction_that_is_not_a_number(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PFLREPRO_RESULTS", str(tmp_path))
    _one_line(capsys, main(["run", "--quiet", *ARGS, "split_params.fractions=[a,0.2]"]), 2, "config error",
              "fractions")


def test_6b_a_public_set_larger_than_the_data_leaves_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PFLREPRO_RESULTS", str(tmp_path))
    rc = main(["run", "--quiet", "--yes", *ARGS, "algorithm=feddf", "public.size=1000000000"])
    _one_line(capsys, rc, 2, "config error", "public.size")
    assert not list(tmp_path.rglob("*"))


@pytest.mark.parametrize("where", ("override", "file"))
def test_6c_settings_nested_thousands_deep(tmp_path, monkeypatch, capsys, where):
    monkeypatch.setenv("PFLREPRO_RESULTS", str(tmp_path / "store"))
    deep = "[" * 5000 + "]" * 5000
    if where == "override":
        rc = main(["run", "--quiet", *ARGS, f"lr={deep}"])
    else:
        (tmp_path / "deep.yaml").write_text(f"lr: {deep}\n")
        rc = main(["run", "--quiet", "--config", str(tmp_path / "deep.yaml"), *ARGS[1:]])
    _one_line(capsys, rc, 2, "config error", "deep")


def test_6d_partition_into_a_missing_folder(tmp_path, capsys):
    _one_line(capsys, main(["partition", *ARGS, "--out", str(tmp_path / "missing" / "p.png")]), 2, "missing")


@pytest.mark.parametrize("how", ("enospc", "erofs"))
def test_6e_a_full_or_read_only_disk(tmp_path, monkeypatch, capsys, how):
    """A full disk at the first write of a run, or a read-only store at its first mkdir: one line, no temporary file."""
    monkeypatch.setenv("PFLREPRO_RESULTS", str(tmp_path / "store"))
    (tmp_path / "store").mkdir()
    with installed(Layer(tmp_path / "store", 0 if how == "erofs" else None, how)) as layer:
        if how == "enospc":
            layer.at = 10**9
            assert main(["run", "--quiet", *ARGS]) == 0   # counts the operations
            shutil.rmtree(tmp_path / "store" / "runs")
            capsys.readouterr()
            writes = [i for i, op in enumerate(layer.ops) if op.startswith("write")]
            layer.ops.clear()
            layer.at = writes[0]
        rc = main(["run", "--quiet", *ARGS])
    _one_line(capsys, rc, 1, "storage error")
    assert not [p for p in (tmp_path / "store").rglob("*") if p.name.endswith(".tmp")]


def test_6f_a_run_folder_replaced_by_a_file(tmp_path, monkeypatch, clean, capsys):
    monkeypatch.setenv("PFLREPRO_RESULTS", str(tmp_path))
    path = S.run_dir(RunConfig.from_dict(CFG))
    path.parent.mkdir(parents=True)
    path.write_text("not a run")
    assert main(["run", "--quiet", *ARGS]) == 0
    assert _numbers(path) == clean
    assert "its folder is a file" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------------------ 7
def test_7_duplicate_yaml_keys_and_an_empty_config_path_are_refused(tmp_path, monkeypatch, capsys):
    """Defect 7: `lr: 0.05` then `lr: 0.5` trained at 0.5 (YAML keeps the last key silently); `--config ""` was
    ignored. Both are refused in one line, before any work."""
    monkeypatch.setenv("PFLREPRO_RESULTS", str(tmp_path / "store"))
    (tmp_path / "dup.yaml").write_text("lr: 0.05\nlr: 0.5\n")
    _one_line(capsys, main(["run", "--quiet", "--config", str(tmp_path / "dup.yaml"), *ARGS[:3]]), 2, "twice")
    _one_line(capsys, main(["run", "--quiet", "--config", "", *ARGS]), 2, "--config")
    assert not (tmp_path / "store").exists()


# ------------------------------------------------------------------------------------------------------------ 8
def test_8a_a_refused_config_leaves_no_store(tmp_path):
    with pytest.raises(Exception, match="more clients than"):
        S.run({**CFG, "n_clients": 5000}, root=tmp_path / "runs", progress=False)
    assert not (tmp_path / "runs").exists()


def test_8b_a_kill_while_a_finished_run_drops_its_checkpoint_leaves_no_stray_file(tmp_path, clean):
    """A kill right after the checkpoint's unlink (the older store then unlinked its sha file): the next call serves
    the run, and the folder holds exactly its manifest's files."""
    ops = _ops_of_a_fresh_run(tmp_path)
    i = max(i for i, op in enumerate(ops) if op.startswith("unlink") and op.endswith("/checkpoint.pt")) + 1
    pid = os.fork()
    if pid == 0:
        try:
            with installed(Layer(tmp_path / "k", i, "kill")):
                S.run(CFG, root=tmp_path / "k" / "runs", progress=False)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    res = S.run(CFG, root=tmp_path / "k" / "runs", progress=False)
    assert _numbers(res.path) == clean
    listed = set(json.loads((res.path / S.MANIFEST).read_text())["files"]) | {S.MANIFEST}
    assert {p.name for p in res.path.iterdir()} == listed
    assert not list((tmp_path / "k" / "runs").glob("*.lock"))


def test_8c_a_full_disk_at_any_write_leaves_no_temporary_file(tmp_path):
    ops = _ops_of_a_fresh_run(tmp_path)
    for i in [i for i, op in enumerate(ops) if op.startswith("write")]:
        base = tmp_path / str(i)
        with installed(Layer(base, i, "enospc")):
            try:
                S.run(CFG, root=base / "runs", progress=False)
            except OSError:          # the older store's raw error (a heartbeat's is not worth the run: it goes on)
                pass
            except S.ConfigError if not hasattr(S, "StoreUnwritable") else S.StoreUnwritable:
                pass
        assert not [p for p in base.rglob("*") if p.name.endswith(".tmp")], ops[i]


def test_8d_a_fresh_run_returns_what_a_served_one_does(tmp_path):
    fresh = S.run(CFG, root=tmp_path / "runs", progress=False)
    served = S.run(CFG, root=tmp_path / "runs", progress=False)
    assert fresh.per_client == served.per_client and fresh.history == served.history
    assert fresh.summary == served.summary and fresh.provenance == served.provenance
