"""Runs: build the federation from a config, execute the round loop, store results.

Results are content-addressed: `results_root()/runs/<algorithm>-<dataset>-<sha12>/` (sha of the
full validated config and of the result-affecting source code) holds
- config.json      the full validated config
- metrics.csv      one row per evaluation (round, gm_acc, pm_acc_mean, ...)
- per_client.csv   per evaluation, every client's PM accuracy
- summary.json     best round and mean of the last 10 evaluations, per metric
- provenance.json  git commit, package versions, seed, device, wall time, bytes, FLOPs
- partition.npz    the client index arrays actually used
- checkpoint.pt    the latest state (tensors only; read with weights_only=True)
Running the same config again returns the stored result; a killed run resumes from
its checkpoint and ends with exactly the metrics of an uninterrupted one.
"""
from __future__ import annotations

import csv
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..algorithms import ALGORITHMS
from ..core.context import Context
from ..core.loop import run_rounds
from ..federation.build import build_context, build_partition
from ..federation.config import RunConfig
from ..params import ConfigError
from ..paths import REPO_ROOT, results_root
from ..version import __version__
from . import gpu
from .progress import HEARTBEAT, Heartbeat

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


PACKAGE = Path(__file__).resolve().parents[1]
# What can change a run's numbers, by layer (docs/architecture.md): the settings vocabulary, the registries
# (datasets, partitions, models), the engine and the federation builder, whole; of algorithms/, the files the
# run's algorithm executes. pipeline/ (this store, executors, progress), reporting/, papers/ and the CLI are not
# in a run's address: they run configs and read results, and never change them.
RESULT_CODE = ("params.py", "data", "core", "federation")


def _algorithm_files(algorithm: str | None) -> list[Path]:
    """The algorithm package files a run of `algorithm` executes: the modules defining its class
    and its bases, plus the package modules those import (e.g. shared statistics helpers).
    Adding or editing another algorithm does not invalidate this one's stored results."""
    folder = PACKAGE / "algorithms"
    if algorithm is None or algorithm not in ALGORITHMS:
        return sorted(folder.glob("*.py"))
    todo = [Path(c.__module__.replace(".", "/") + ".py").name for c in ALGORITHMS[algorithm].__mro__
            if c.__module__.startswith("pflrepro.algorithms.")]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or not (folder / name).exists():
            continue
        seen.add(name)
        todo += [m + ".py" for m in re.findall(r"^from \.(\w+) import", (folder / name).read_text(), re.M)]
    return sorted(folder / n for n in seen)


def result_code(algorithm: str | None = None) -> list[Path]:
    """The source files in a run's content address (see RESULT_CODE), in hashing order."""
    files = []
    for part in RESULT_CODE:
        p = PACKAGE / part
        files += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    return files + _algorithm_files(algorithm)


def code_fingerprint(algorithm: str | None = None) -> str:
    """sha256 of the source files that can change a run's numbers (`result_code`). Part of the content
    address, so a stored result is never reused across a change of the code it ran."""
    h = hashlib.sha256()
    for f in result_code(algorithm):
        h.update(f.relative_to(PACKAGE).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def result_key(cfg: RunConfig) -> str:
    return hashlib.sha256((cfg.key() + code_fingerprint(cfg.algorithm)).encode()).hexdigest()


def run_dir(cfg: RunConfig, root: Path | str | None = None) -> Path:
    """Where a config's result lives: <root>/<algorithm>-<dataset>-<sha12>, the hash covering
    the full validated config and the result-affecting code (root defaults to
    $PFLREPRO_RESULTS/runs, i.e. results/runs)."""
    base = Path(root) if root is not None else results_root() / "runs"
    return base / f"{cfg.algorithm}-{cfg.dataset}-{result_key(cfg)[:12]}"


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


def _prepare(cfg: RunConfig, path: Path, force: bool):
    """(checkpoint to resume from or None, context, algorithm) of a run whose folder is `path` (created here)."""
    device = gpu.device(cfg.device)   # 'cuda' without CUDA: refused before the folder exists
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2, sort_keys=True))
    start = None
    if (path / "checkpoint.pt").exists() and not force:
        start = torch.load(path / "checkpoint.pt", map_location=device, weights_only=True)
        split = _load_partition(path)
    else:
        split = build_partition(cfg)
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
    """Run one config, or return its stored result. Resumes from a checkpoint if one exists."""
    cfg = cfg if isinstance(cfg, RunConfig) else RunConfig.from_dict(cfg)
    path = run_dir(cfg, root)
    if (path / "summary.json").exists() and not force:
        return load_result(path)
    _warn_torch_first()
    created = not path.exists()
    # a setting the data refuses (more clients than samples), or a GPU share ($PFLREPRO_GPU_FRACTION) the run cannot
    # fit in (gpu.fit, before round 1), is refused here: leave no folder behind
    try:
        start, ctx, algo = _prepare(cfg, path, force)
        gpu.fit(ctx, algo, start)
    except ConfigError:
        if created:
            shutil.rmtree(path, ignore_errors=True)
        raise
    ckpt_path = path / "checkpoint.pt"
    git_at_start = git_commit()  # the code that runs is the code loaded now
    t0 = time.perf_counter()
    wall_before = float(start["wall_seconds"]) if start else 0.0

    def save(state: dict):
        state = {**state, "wall_seconds": wall_before + time.perf_counter() - t0}
        tmp = ckpt_path.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, ckpt_path)  # atomic: a kill never leaves a half-written checkpoint
        die = os.environ.get("PFLREPRO_DIE_AFTER_ROUND")  # test hook: SIGKILL ourselves here
        if die is not None and int(die) == int(state["round"]):
            os.kill(os.getpid(), 9)

    beat = Heartbeat(path / HEARTBEAT, cfg.rounds)
    res = run_rounds(ctx, algo, start=start, on_checkpoint=save, progress=progress, on_round=beat)
    beat.clear()
    wall = wall_before + time.perf_counter() - t0
    _write_metrics(path, res.history, res.per_client)
    summary = summarise(res.history)
    (path / "summary.json").write_text(json.dumps(summary, indent=2))
    prov = provenance(cfg, ctx, wall, res, git_at_start)
    (path / "provenance.json").write_text(json.dumps(prov, indent=2))
    if not keeps_checkpoint(cfg):
        ckpt_path.unlink(missing_ok=True)
    return RunResult(cfg, path, res.history, res.per_client, summary, prov)


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
    dropped them; unfinished runs keep theirs (they resume from it). Returns (files, bytes)."""
    base = Path(root) if root is not None else results_root() / "runs"
    n = size = 0
    for d in sorted(p for p in base.iterdir() if p.is_dir()) if base.exists() else []:
        ckpt = d / "checkpoint.pt"
        if not ((d / "summary.json").exists() and ckpt.exists() and (d / "config.json").exists()):
            continue
        if keeps_checkpoint(json.loads((d / "config.json").read_text())):
            continue
        n, size = n + 1, size + ckpt.stat().st_size
        if not dry_run:
            ckpt.unlink()
    return n, size


def _save_partition(path: Path, split: dict):
    arrays = {f"{part}_{k}": np.asarray(a, dtype=np.int64) for part, lst in split.items() for k, a in enumerate(lst)}
    np.savez_compressed(path / "partition.npz", **arrays)


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
    if history:
        with open(path / "metrics.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(history[0]))
            w.writeheader()
            w.writerows(history)
    with open(path / "per_client.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["round"] + [f"client_{k}" for k in range(len(per_client[0]) if per_client else 0)])
        for r, accs in zip(history, per_client):
            w.writerow([r["round"]] + [f"{a:.6f}" for a in accs])


# Tracked files that `dvc repro` itself rewrites (the lock, the metrics, README's summary block): a checkout
# is not "dirty" because the pipeline ran in it, or every stage after the first would say so.
PIPELINE_OUTPUTS = ("dvc.lock", "metrics", "README.md")


def git_commit() -> dict:
    """HEAD and whether tracked files other than PIPELINE_OUTPUTS differ from it."""
    def git(*a):
        try:
            return subprocess.run(["git", *a], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
        except Exception:
            return ""
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".",
                  *(f":(exclude){p}" for p in PIPELINE_OUTPUTS))
    return {"commit": git("rev-parse", "HEAD") or "unknown", "dirty": bool(changed)}


def model_flops(ctx: Context) -> int | None:
    """Forward FLOPs of one sample through the (first) model, by torch's FLOP counter."""
    from ..core.clock import forward_flops
    try:
        return forward_flops(ctx.make_model(0).to(ctx.device), ctx.data.x[:1])
    except Exception:
        return None


def provenance(cfg: RunConfig, ctx: Context, wall: float, res, git: dict) -> dict:
    import numpy
    fwd = model_flops(ctx)
    return {
        "config_sha256": cfg.key(), "code_sha256": code_fingerprint(cfg.algorithm), "seed": cfg.seed, "dataset": cfg.dataset, "dataset_source": ctx.data.source,
        "device": str(ctx.device), "torch_threads": torch.get_num_threads(),
        "git": git, "pflrepro": __version__, "python": platform.python_version(),
        "torch": torch.__version__, "numpy": numpy.__version__, "platform": platform.platform(),
        "wall_seconds": wall, "resumed_from_round": res.resumed_from,
        # of which evaluation (every `eval_every` rounds: GM on the global test set, every PM on its local test)
        "eval_seconds": sum(r.get("eval_seconds", 0.0) for r in res.history),
        "bytes_up": res.bytes_up, "bytes_down": res.bytes_down,
        "train_samples": res.samples, "forward_flops_per_sample": fwd,
        # training FLOPs ~ 3x forward (forward + backward wrt inputs and weights)
        "train_flops_estimate": (3 * fwd * res.samples) if fwd else None,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
