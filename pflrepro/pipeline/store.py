"""Runs: build the federation from a config, execute the round loop, store results.

Results are content-addressed: `results_root()/runs/<algorithm>-<dataset>-<sha12>/` (sha of the
full validated config and of the result-affecting source code) holds
- config.json      the full validated config
- metrics.csv      one row per evaluation (round, gm_acc, pm_acc_mean, ...)
- per_client.csv   per evaluation, every client's PM accuracy
- summary.json     best round and mean of the last 10 evaluations, per metric
- provenance.json  git commit, package versions, seed, device, wall time, bytes, FLOPs
- partition.npz    the client index arrays actually used
- checkpoint.pt    the latest state (tensors only; read with weights_only=True) in one record bound to its run: a
                   header with the state's sha256, the run's address (config and code) and its round, then the
                   state (`checkpoint_bytes`, `load_checkpoint`). A finished run drops it unless a later stage
                   reads it (`keeps_checkpoint`)
- manifest.json    written last, by rename: every result file with its size and sha256. A run is finished
                   exactly when its manifest exists; before that it is an unfinished run that resumes.
Running the same config again returns the stored result, verified first (`verify`: the manifest's sizes and
hashes, config.json equal to the requested config, the summary recomputable from the metrics). Verifying only
reads; a run that fails it is moved aside to `<store>-quarantine/` (nothing is deleted) under the run's training
lock, after a second check there, the user is told in one line, and it is recomputed (from its checkpoint when that
is bound to this run). A folder without a manifest is an unfinished run: it resumes from a bound checkpoint, or is
recomputed from round 1 (a run whose manifest was deleted is moved aside first: no file of it is served without
its hash). A killed run resumes from its checkpoint and ends with exactly the metrics of an uninterrupted one; a
checkpoint or partition that cannot be used is set aside the same way and the run starts afresh. One process trains
a run at a time (`train_lock`): a second one on the same run waits for it, then serves its result. A disk that is
full or read-only is one line (`StoreUnwritable`), with no temporary file left behind.
"""
from __future__ import annotations

import csv
import errno
import hashlib
import io
import json
import math
import os
import shutil
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..algorithms import ALGORITHMS
from ..core import engines
from ..core.engines import MemoryBudgetError, NotBatchable
from ..core.loop import run_rounds
from ..federation.build import build_context, build_partition
from ..federation.config import RunConfig
from ..params import ConfigError
from ..paths import results_root, sweep_stale_tmp, write_atomic
from . import gpu
from .address import code_fingerprint, PACKAGE, RESULT_CODE, result_code, result_key, run_dir  # noqa: F401
from .locks import lock, unlock
from .progress import HEARTBEAT, Heartbeat
from .provenance import git_commit, PIPELINE_OUTPUTS, provenance  # noqa: F401

METRICS = ("gm_acc", "pm_acc_mean", "pm_acc_weighted", "pm_acc_std", "pm_acc_min")
OPTIONAL_METRICS = ("gm_local_acc_mean",)     # present when the config asks for them (`eval_gm_local`)


# ---------------------------------------------------------------- result store
@dataclass
class RunResult:
    config: RunConfig
    path: Path
    history: list
    per_client: list
    summary: dict
    provenance: dict

    def metric(self, name: str) -> np.ndarray:
        return np.array([r[name] for r in self.history], dtype=np.float64)


def summarise(history: list, last: int = 10) -> dict:
    """Per metric: best value and its round, and the mean of the last `last` evaluations."""
    out = {}
    for m in METRICS + tuple(m for m in OPTIONAL_METRICS if history and m in history[0]):
        v = np.array([r[m] for r in history], dtype=np.float64)
        if len(v) == 0 or np.all(np.isnan(v)):
            out[m] = {"best": float("nan"), "best_round": None, "last_mean": float("nan"), "final": float("nan")}
            continue
        i = int(np.nanargmax(v))
        out[m] = {"best": float(v[i]), "best_round": int(history[i]["round"]),
                  "last_mean": float(np.nanmean(v[-last:])), "final": float(v[-1])}
    return out


def load_result(path: Path) -> RunResult:
    cfg = RunConfig.from_dict(json.loads((path / "config.json").read_text()))
    with open(path / "metrics.csv") as f:
        history = [{k: (int(v) if k in ("round", "bytes_up", "bytes_down") else float(v)) for k, v in r.items()}
                   for r in csv.DictReader(f)]
    with open(path / "per_client.csv") as f:
        rows = list(csv.reader(f))[1:]
    per_client = [[float(v) for v in r[1:]] for r in rows]
    return RunResult(cfg, path, history, per_client, json.loads((path / "summary.json").read_text()),
                     json.loads((path / "provenance.json").read_text()))


MANIFEST = "manifest.json"
RESULT_FILES = ("config.json", "partition.npz", "metrics.csv", "per_client.csv", "provenance.json", "summary.json")


class Damaged(Exception):
    """A stored run (or one of its files) that cannot be served: the message says which file and why."""


class RunFailed(ConfigError):
    """A run that trained but whose metrics are not finite (no client with test data, an infinite clock): one line,
    and nothing stored as finished."""


class StoreUnwritable(RuntimeError):
    """The store cannot be written (a full disk, a read-only file system, no permission): one line, naming the run
    and the error; temporary files are removed and a run keeps its last checkpoint, so the same command resumes it."""


UNWRITABLE = (errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EDQUOT, errno.EIO)


def is_finished(path: Path) -> bool:
    """Whether `path` holds a finished run (its manifest): the cheap test a grid uses to plan; `verify` decides
    whether it is served."""
    return (Path(path) / MANIFEST).is_file()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _write_atomic(path: Path, text: str | bytes) -> None:
    """The store's one writer (paths.write_atomic: by rename, nothing half-written left behind)."""
    write_atomic(path, text)


def _pause(step: str) -> None:
    """Test hook (tests/test_store_defects.py): at `step`, when $PFLREPRO_PAUSE_AT is `step:seconds`, create the file
    $PFLREPRO_PAUSE_MARK (the test's signal that we got here) and sleep."""
    at, _, seconds = os.environ.get("PFLREPRO_PAUSE_AT", "").partition(":")
    if at == step:
        if os.environ.get("PFLREPRO_PAUSE_MARK"):
            Path(os.environ["PFLREPRO_PAUSE_MARK"]).touch()
        time.sleep(float(seconds))


def _die_before(step: str) -> None:
    """Test hook (tests/test_store_faults.py): SIGKILL this process just before completion step `step`."""
    if os.environ.get("PFLREPRO_DIE_BEFORE") == step:
        os.kill(os.getpid(), 9)


def write_manifest(path: Path, cfg: RunConfig) -> None:
    """The last write of a finished run: each result file present (and the kept checkpoint) with size and sha256."""
    names = RESULT_FILES + (("checkpoint.pt",) if keeps_checkpoint(cfg) else ())
    files = {f: {"size": (path / f).stat().st_size, "sha256": _sha256(path / f)} for f in names if (path / f).exists()}
    _die_before(MANIFEST)
    _write_atomic(path / MANIFEST, json.dumps({"config_sha256": cfg.key(), "files": files}, indent=1))


def _check_files(path: Path, cfg: RunConfig) -> dict:
    """The manifest's files against the folder: Damaged on a difference, or without a manifest."""
    try:
        cfg_on_disk = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise Damaged(f"config.json unreadable ({type(e).__name__})") from None
    if cfg_on_disk != json.loads(json.dumps(cfg.to_dict())):
        raise Damaged("config.json is not the requested config (edited, or another run's)")
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        files = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise Damaged(f"{MANIFEST} unreadable ({type(e).__name__})") from None
    if manifest.get("config_sha256") != cfg.key():
        raise Damaged(f"{MANIFEST} names another config")
    for f in RESULT_FILES:
        if f not in files:
            raise Damaged(f"{MANIFEST} does not list {f}")
    for f, want in files.items():
        p = path / f
        if not p.exists():
            raise Damaged(f"{f} is missing")
        if p.stat().st_size != want["size"] or _sha256(p) != want["sha256"]:
            raise Damaged(f"{f} differs from its manifest (size or sha256)")
    return manifest


def verify(path: Path, cfg: RunConfig) -> RunResult:
    """A finished run's result, served only if it verifies: config.json is the requested config, every file matches
    the manifest, and the files parse and agree (the summary is the metrics' summary, one per-client row a metrics
    row). Damaged otherwise. It only reads: what it finds is moved aside under the run's lock (`_serve`)."""
    _check_files(path, cfg)
    try:
        res = load_result(path)
    except Exception as e:   # noqa: BLE001 - any parse failure of a stored file is damage, named here
        raise Damaged(f"a result file does not parse ({type(e).__name__}: {str(e)[:80]})") from None
    if json.dumps(summarise(res.history), sort_keys=True) != json.dumps(res.summary, sort_keys=True):   # NaN-safe
        raise Damaged("summary.json is not the summary of metrics.csv")
    if len(res.per_client) != len(res.history) or not res.history:
        raise Damaged("per_client.csv and metrics.csv disagree on the evaluated rounds")
    return res


def quarantine_root(path: Path) -> Path:
    return path.parent.with_name(path.parent.name + "-quarantine")


def quarantine(path: Path, why: str, files: tuple = ()) -> Path:
    """Move a damaged run (or some of its files) aside, never deleting anything; say so in one line. Called only
    under the run's training lock (`train_lock`), so it never moves a run another process is training."""
    _pause("quarantine")
    dest = quarantine_root(path) / f"{path.name}-{time.strftime('%Y%m%dT%H%M%S')}-{time.time_ns() % 10**9:09d}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    if files:
        dest.mkdir()
        for f in files:
            if (path / f).exists():
                shutil.move(str(path / f), str(dest / f))
    else:
        shutil.move(str(path), str(dest))
    print(f"[pflrepro] run {path.name}: {why}; {'those files' if files else 'the run'} moved to {dest}; recomputing",
          file=sys.stderr, flush=True)
    return dest


def _serve(path: Path, cfg: RunConfig) -> RunResult | None:
    """Under the run's training lock: the stored result if it verifies, else None, having moved aside whatever is
    there that is not an unfinished run of this config (a damaged finished run, a finished run without its manifest,
    a file where the run's folder belongs). A bound checkpoint is put back (`load_checkpoint` checks it on resume)."""
    if path.exists() and not path.is_dir():
        quarantine(path, "its folder is a file")
        return None
    if is_finished(path):
        try:
            res = verify(path, cfg)
        except Damaged as e:
            why = str(e)
        else:
            if not keeps_checkpoint(cfg):
                _drop_checkpoint(path)     # its trainer was killed between the manifest and this
            return res
    elif (path / "summary.json").exists() and not (path / "checkpoint.pt").exists():
        why = f"no {MANIFEST} vouches for its files (deleted?)"   # a finished run's, or one killed just before it
    else:
        return None                        # an unfinished run (or none): it resumes, or starts
    keep = (path / "checkpoint.pt").read_bytes() if (path / "checkpoint.pt").is_file() else None
    quarantine(path, why)
    if keep is not None:
        path.mkdir(parents=True)
        _write_atomic(path / "checkpoint.pt", keep)
    return None


def _train_lock_file(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


def train_lock(path: Path) -> int | None:
    """Hold the run's training lock (one trainer per run, whichever process or driver started it): wait, saying so
    once, while another process trains it."""
    fd = lock(_train_lock_file(path), block=False)
    if fd is None:
        print(f"[pflrepro] run {path.name} is being trained by another process: waiting for it", file=sys.stderr,
              flush=True)
        fd = lock(_train_lock_file(path), block=True)
    return fd


CKPT_MAGIC = b"pflrepro-checkpoint/1\n"   # then one JSON line (the header), then the state as torch.save wrote it


def checkpoint_bytes(state: dict, run_key: str) -> bytes:
    """One record of a run's state, bound to the run: a header with the state's sha256, the run's address
    (`result_key`: its config and code) and round, then the state. Written in one rename, it cannot be half of a
    pair, nor resume another run."""
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    header = {"sha256": hashlib.sha256(payload).hexdigest(), "run": run_key, "round": int(state["round"])}
    return CKPT_MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + payload


def load_checkpoint(path: Path, cfg: RunConfig, device="cpu") -> dict:
    """The state in `path` (a checkpoint.pt), loaded only if its record is whole and bound to `cfg`'s run (config
    and code): Damaged, naming what is wrong, otherwise."""
    blob = Path(path).read_bytes()
    if not blob.startswith(CKPT_MAGIC) or b"\n" not in blob[len(CKPT_MAGIC):]:
        raise Damaged("checkpoint.pt is not a pflrepro checkpoint record")
    line, _, payload = blob[len(CKPT_MAGIC):].partition(b"\n")
    try:
        header = json.loads(line)
        want, run_key, rnd = header["sha256"], header["run"], header["round"]
    except (ValueError, KeyError, TypeError):
        raise Damaged("checkpoint.pt's header does not parse") from None
    if hashlib.sha256(payload).hexdigest() != want:
        raise Damaged("checkpoint.pt differs from its sha256")
    if run_key != result_key(cfg):
        raise Damaged("checkpoint.pt is another run's (config or code)")
    state = torch.load(io.BytesIO(payload), map_location=device, weights_only=True)
    if not isinstance(state, dict) or not {"round", "server", "clients", "history", "per_client"} <= set(state):
        raise Damaged("checkpoint.pt is not a pflrepro checkpoint")
    if int(state["round"]) != rnd or any(int(r["round"]) > rnd for r in state["history"]):
        raise Damaged("checkpoint.pt's round is not its state's")
    return state


def _resume_point(cfg: RunConfig, path: Path, device, split: dict) -> tuple[dict | None, dict]:
    """(checkpoint, partition) to resume an unfinished run from. The partition is rebuilt from the config (it is
    deterministic) and must equal the stored one where there is one; the checkpoint must be a whole record bound to
    this run (`load_checkpoint`). Either failing: both are set aside (quarantine) and the run starts from round 1."""
    if not (path / "checkpoint.pt").exists():
        return None, split
    try:
        start = load_checkpoint(path / "checkpoint.pt", cfg, device)
        if (path / "partition.npz").exists():
            stored = _load_partition(path)
            if [len(stored[p]) for p in split] != [len(split[p]) for p in split] or not all(
                    np.array_equal(a, b) for p in split for a, b in zip(stored[p], split[p])):
                raise Damaged("partition.npz is not this config's partition")
    except Exception as e:   # noqa: BLE001 - whatever stops a resume (torch's unpickler, zip, numpy): start afresh
        why = str(e) if isinstance(e, Damaged) else f"cannot resume from checkpoint.pt/partition.npz ({type(e).__name__})"
        quarantine(path, why + "; the run starts from round 1", ("checkpoint.pt", "partition.npz"))
        return None, split
    if not (path / "partition.npz").exists():   # moved aside with a damaged run: the checkpoint's run decides it
        _save_partition(path, split)
    return start, split


def _prepare(cfg: RunConfig, path: Path, force: bool):
    """(checkpoint to resume from or None, context, algorithm) of a run whose folder is `path` (created here)."""
    device = gpu.device(cfg.device)   # 'cuda' without CUDA: refused before the folder exists
    if (path / "config.json").exists():
        try:
            same = json.loads((path / "config.json").read_text()) == json.loads(json.dumps(cfg.to_dict()))
        except (OSError, ValueError):
            same = False
        if not same:
            quarantine(path, "the unfinished run's config.json is not the requested config")
    split = build_partition(cfg)      # a setting the data refuses: before the folder exists
    path.mkdir(parents=True, exist_ok=True)
    sweep_stale_tmp(path)             # a killed writer's temporaries (we hold the run's lock: no one writes here)
    _write_atomic(path / "config.json", json.dumps(cfg.to_dict(), indent=2, sort_keys=True))
    if force:
        for f in (MANIFEST, "summary.json", "checkpoint.pt"):
            (path / f).unlink(missing_ok=True)
    start, split = _resume_point(cfg, path, device, split)
    if start is None:
        _save_partition(path, split)
    ctx = build_context(cfg, device, split)
    return start, ctx, ALGORITHMS[cfg.algorithm](ctx, **cfg.hparams)


def _warn_torch_first() -> None:
    """Once: torch was imported before pflrepro, so OpenMP's idle threads spin (OMP_WAIT_POLICY=PASSIVE, set by
    `import pflrepro`, is read when torch loads); with one thread there is nothing to spin."""
    first = getattr(sys.modules.get("pflrepro"), "TORCH_FIRST", False)   # set by `import pflrepro` (no import cycle)
    if first and torch.get_num_threads() > 1 and not getattr(_warn_torch_first, "done", False):
        _warn_torch_first.done = True
        warnings.warn("torch was imported before pflrepro, so OMP_WAIT_POLICY=PASSIVE could not take effect: beside "
                      "another busy process a multi-threaded run can take 3x as long. Import pflrepro first, or "
                      "`export OMP_WAIT_POLICY=PASSIVE` before Python starts, or torch.set_num_threads(1).",
                      RuntimeWarning, stacklevel=3)


def run(cfg: RunConfig | dict, *, root: Path | str | None = None, progress: bool = True,
        force: bool = False) -> RunResult:
    """Run one config, or return its stored result (verified: module doc). Resumes from a checkpoint if one exists.
    One process trains a run at a time: another on the same run waits, then serves what it stored. Whatever is
    moved aside or written is done under that lock; a verified result is served without it."""
    cfg = cfg if isinstance(cfg, RunConfig) else RunConfig.from_dict(cfg)
    path = run_dir(cfg, root)
    if not force and is_finished(path):
        try:
            res = verify(path, cfg)
        except (Damaged, OSError):
            res = None             # decided again under the lock, where it may be moved aside
        _pause("checked")
        if res is not None and (keeps_checkpoint(cfg) or not (path / "checkpoint.pt").exists()) and not \
                _train_lock_file(path).exists():   # else: tidied under the lock (a stray checkpoint, a lock file)
            return res
    _warn_torch_first()
    store_existed = path.parent.exists()
    try:
        return _locked(cfg, path, progress, force)
    except BaseException as e:
        if not store_existed:   # a refused run leaves no empty store behind
            try:
                path.parent.rmdir()
            except OSError:
                pass
        if not isinstance(e, OSError) or e.errno not in UNWRITABLE:
            raise
        raise StoreUnwritable(f"run {path.name}: cannot write the store ({os.strerror(e.errno)}"
                              f"{': ' + str(e.filename) if e.filename else ''}); nothing half-written is left, and "
                              "the same command resumes from the run's last checkpoint") from None


def _locked(cfg: RunConfig, path: Path, progress: bool, force: bool) -> RunResult:
    fd = train_lock(path)
    try:
        _pause("locked")
        if not force and (res := _serve(path, cfg)) is not None:
            return res          # it verified (the process we waited for trained it)
        return _train(cfg, path, progress, force)
    finally:
        unlock(_train_lock_file(path), fd)


def _cpu_seconds() -> float:
    """CPU time of this process and its reaped children (forked client trainers): what a run costs, whatever else
    shares the cores (wall time under load, or niced, is mostly waiting)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _train(cfg: RunConfig, path: Path, progress: bool, force: bool) -> RunResult:
    created = not path.exists()
    # a setting the data refuses (more clients than samples), or a GPU share ($PFLREPRO_GPU_FRACTION) the run cannot
    # fit in (gpu.fit, before round 1), is refused here: leave no folder behind
    try:
        engines.env_cap()          # a malformed $PFLREPRO_CLIENT_PROCS: refused in one line, before any work
        start, ctx, algo = _prepare(cfg, path, force)
        gpu.fit(ctx, algo, start)
    except BaseException:
        if created:
            shutil.rmtree(path, ignore_errors=True)
        raise
    ckpt_path = path / "checkpoint.pt"
    git_at_start = git_commit()  # the code that runs is the code loaded now
    t0, c0 = time.perf_counter(), _cpu_seconds()
    wall_before = float(start["wall_seconds"]) if start else 0.0
    cpu_before = float(start.get("cpu_seconds", math.nan)) if start else 0.0   # a checkpoint older than the field: nan
    run_key = result_key(cfg)

    def spent() -> dict:
        """Wall and CPU seconds of the run so far, every segment."""
        return {"wall_seconds": wall_before + time.perf_counter() - t0, "cpu_seconds": cpu_before + _cpu_seconds() - c0}

    def save(state: dict):
        state = {**state, **spent()}
        _write_atomic(ckpt_path, checkpoint_bytes(state, run_key))   # one record: a kill never splits it
        die = os.environ.get("PFLREPRO_DIE_AFTER_ROUND")  # test hook: SIGKILL ourselves here
        if die is not None and int(die) == int(state["round"]):
            os.kill(os.getpid(), 9)
        time.sleep(float(os.environ.get("PFLREPRO_PAUSE_AFTER_CHECKPOINT", 0)))   # test hook: a slow trainer

    beat = Heartbeat(path / HEARTBEAT, cfg.rounds)
    try:
        res = run_rounds(ctx, algo, start=start, on_checkpoint=save, progress=progress, on_round=beat)
    except (ConfigError, NotBatchable, MemoryBudgetError):   # refused before round 1 (engine='batched' that cannot
        if created and not ckpt_path.exists():             # batch or fit): nothing to resume, leave no folder behind
            shutil.rmtree(path, ignore_errors=True)
        raise           # (a Divergence keeps its folder: tune finds the runs that diverged by it)
    finally:
        beat.clear()
    _check_finite(cfg, path, res.history, created)
    now = spent()
    prov = provenance(cfg, ctx, now["wall_seconds"], res, git_at_start, cpu=now["cpu_seconds"])
    _complete(cfg, path, res, prov)
    return load_result(path)   # what a later serve returns, to the digit (per_client.csv holds 6 decimals)


FINITE = ("pm_acc_mean", "pm_acc_weighted", "sim_time")   # gm_acc is NaN by design where there is no global model


def _check_finite(cfg: RunConfig, path: Path, history: list, created: bool) -> None:
    """A run whose personalized accuracy or simulated time is not finite is not stored as finished (issue 34:
    `split_params.fractions=[1.0, 0.0]` leaves no client a test set, `clock.sigma=1e300` an infinite clock)."""
    for row in history:
        for k in FINITE:
            if k in row and not math.isfinite(row[k]):
                shutil.rmtree(path, ignore_errors=True) if created else _drop_checkpoint(path)
                raise RunFailed(f"run {path.name}: {k}={row[k]} at round {row['round']}: the run's metrics are not "
                                "finite (a client without test data? an infinite clock?); nothing was stored")


def _drop_checkpoint(path: Path) -> None:
    (path / "checkpoint.pt").unlink(missing_ok=True)


def _complete(cfg: RunConfig, path: Path, res, prov: dict) -> dict:
    """Completion: the result files, each by rename, then the manifest (the run is finished from that rename on),
    then the checkpoint goes unless kept. A kill anywhere before the manifest leaves an unfinished run that resumes
    from its checkpoint."""
    _write_metrics(path, res.history, res.per_client)
    _die_before("provenance.json")
    _write_atomic(path / "provenance.json", json.dumps(prov, indent=2))
    summary = summarise(res.history)
    _die_before("summary.json")
    _write_atomic(path / "summary.json", json.dumps(summary, indent=2))
    write_manifest(path, cfg)
    _die_before("checkpoint")
    if not keeps_checkpoint(cfg):
        _drop_checkpoint(path)
    return summary


KEEP_ENV = "PFLREPRO_KEEP_CHECKPOINTS"


def keeps_checkpoint(cfg: RunConfig | dict) -> bool:
    """Whether a finished run keeps its final checkpoint: when a later stage reads its final states (SCD Fig. 3's
    new clients fine-tune the final GM: `new_clients` > 0, pflrepro.papers.newclients), or when
    $PFLREPRO_KEEP_CHECKPOINTS=1 asks for every run's. A finished run is served from its summary, metrics and
    per-client results; its checkpoint was there to resume it (checkpoints were 6.2 of the 6.3 GB of a default
    repro's store)."""
    new = cfg["new_clients"] if isinstance(cfg, dict) else cfg.new_clients
    return new > 0 or os.environ.get(KEEP_ENV, "") not in ("", "0")


def prune_checkpoints(root: Path | str | None = None, dry_run: bool = False) -> tuple[int, int]:
    """Delete the checkpoints finished runs do not keep (`keeps_checkpoint`), e.g. in a store written before runs
    dropped them; unfinished runs keep theirs (they resume from it), and so does a run another process holds (its
    training lock: it may be training it again). Returns (files, bytes)."""
    base = Path(root) if root is not None else results_root() / "runs"
    n = size = 0
    for d in sorted(p for p in base.iterdir() if p.is_dir()) if base.exists() else []:
        ckpt = d / "checkpoint.pt"
        if not (is_finished(d) and ckpt.exists() and (d / "config.json").exists()):
            continue
        if keeps_checkpoint(json.loads((d / "config.json").read_text())):
            continue
        fd = None if dry_run else lock(_train_lock_file(d), block=False)
        if fd is None and not dry_run:
            continue
        try:
            if is_finished(d) and ckpt.exists():
                n, size = n + 1, size + ckpt.stat().st_size
                if not dry_run:
                    ckpt.unlink()
        finally:
            if fd is not None:
                unlock(_train_lock_file(d), fd)
    return n, size


def _save_partition(path: Path, split: dict):
    arrays = {f"{part}_{k}": np.asarray(a, dtype=np.int64) for part, lst in split.items() for k, a in enumerate(lst)}
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    _write_atomic(path / "partition.npz", buf.getvalue())


def _load_partition(path: Path) -> dict:
    z = np.load(path / "partition.npz", allow_pickle=False)
    out: dict = {"train": [], "test": [], "val": []}
    for part in out:
        n = sum(1 for f in z.files if f.startswith(part + "_"))
        out[part] = [z[f"{part}_{k}"] for k in range(n)]
    return out


WALL_COLUMNS = ("seconds", "eval_seconds")   # a round's wall time, and the part of it its evaluation took


def read_metrics(path: Path) -> list[dict]:
    """A stored run's metrics.csv as rows of strings, without its wall-time columns (`seconds`, `eval_seconds`):
    what two runs must share, to the last digit, to have computed the same thing."""
    with open(Path(path) / "metrics.csv", newline="") as f:
        return [{k: v for k, v in r.items() if k not in WALL_COLUMNS} for r in csv.DictReader(f)]


def _write_metrics(path: Path, history: list, per_client: list):
    """metrics.csv and per_client.csv, each written by rename."""
    _die_before("metrics.csv")
    buf = io.StringIO(newline="")
    if history:
        w = csv.DictWriter(buf, fieldnames=list(history[0]), lineterminator="\r\n")
        w.writeheader()
        w.writerows(history)
        _write_atomic(path / "metrics.csv", buf.getvalue())
    _die_before("per_client.csv")
    buf = io.StringIO(newline="")
    w = csv.writer(buf, lineterminator="\r\n")
    w.writerow(["round"] + [f"client_{k}" for k in range(len(per_client[0]) if per_client else 0)])
    for r, accs in zip(history, per_client):
        w.writerow([r["round"]] + [f"{a:.6f}" for a in accs])
    _write_atomic(path / "per_client.csv", buf.getvalue())
