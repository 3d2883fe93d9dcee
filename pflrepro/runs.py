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
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from . import __version__
from .algorithms import ALGORITHMS
from .config import ConfigError, RunConfig
from .data import SPECS, FedData, load_dataset, normalise
from .engine import Context, derive_seed, run_rounds
from .models import assign_models, build_model
from .partition import PARTITIONERS, SPLITS
from .progress import HEARTBEAT, Heartbeat

REPO_ROOT = Path(__file__).resolve().parent.parent
METRICS = ("gm_acc", "pm_acc_mean", "pm_acc_weighted", "pm_acc_std", "pm_acc_min")
OPTIONAL_METRICS = ("gm_local_acc_mean",)     # present when the config asks for them (`eval_gm_local`)


def results_root() -> Path:
    return Path(os.environ.get("PFLREPRO_RESULTS", REPO_ROOT / "results"))


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device='cuda' but no CUDA device is available; use device='cpu' or 'auto'")
    return torch.device(name)


# ---------------------------------------------------------------- building the federation
_RAW_CACHE: dict = {}


def _raw(name: str):
    if name not in _RAW_CACHE:
        if len(_RAW_CACHE) >= 3:  # keep at most three datasets (uint8) in memory
            _RAW_CACHE.pop(next(iter(_RAW_CACHE)))
        _RAW_CACHE[name] = load_dataset(name)
    return _RAW_CACHE[name]


def build_partition(cfg: RunConfig) -> dict:
    """Deterministic client index arrays for a config (pure function of the config)."""
    raw = _raw(cfg.dataset)
    if cfg.pool == "train+test":
        _, y_pool = raw.pooled()
    else:
        y_pool = raw.y_train
    y_pool = y_pool.numpy()
    pool_idx = np.arange(len(y_pool))
    if cfg.subsample < 1.0:
        pool_idx = _stratified_subsample(y_pool, cfg.subsample, derive_seed(cfg.seed, 0x5B5))
    labels = y_pool[pool_idx]
    if cfg.n_clients > len(labels):  # one check for every partitioner, before any of them works on it
        raise ConfigError(f"n_clients={cfg.n_clients}: more clients than the {len(labels)} samples the run partitions "
                          f"({cfg.dataset}, pool={cfg.pool!r}, subsample={cfg.subsample}), so some would get no data; "
                          f"use n_clients <= {len(labels)}" + (" or a larger subsample" if cfg.subsample < 1.0 else ""))
    partitioner, extra = PARTITIONERS[cfg.partition], {}
    if getattr(partitioner, "uses_domains", False):   # one domain per client: each pool index's domain
        doms = raw.domains(cfg.pool)
        extra["domains"] = None if doms is None else doms.numpy()[pool_idx]
    parts = partitioner(labels, cfg.n_clients, seed=cfg.seed, **cfg.partition_params, **extra)
    parts = [pool_idx[p] for p in parts]
    kw = dict(cfg.split_params)
    if cfg.split == "global_test_by_proportion":
        kw["test_labels"] = raw.y_test.numpy()
    if getattr(SPLITS[cfg.split], "uses_domains", False):   # each client's tests: its domain's test half
        kw["test_domains"] = None if raw.d_test is None else raw.d_test.numpy()
    split = SPLITS[cfg.split](y_pool, parts, seed=cfg.seed, **kw)
    empty = [k for k, tr in enumerate(split["train"]) if len(tr) == 0]
    if empty:
        raise ValueError(f"partition '{cfg.partition}' with {cfg.partition_params} left clients {empty[:10]} "
                         f"with no training data; use fewer clients or a different partition")
    return {"train": split["train"], "test": split["test"], "val": split.get("val", [np.array([], np.int64)] * len(parts))}


def _stratified_subsample(y: np.ndarray, frac: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    keep = []
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        keep.append(rng.choice(idx, size=max(1, int(round(frac * len(idx)))), replace=False))
    return np.sort(np.concatenate(keep))


def build_data(cfg: RunConfig, device: torch.device, split: dict | None = None) -> FedData:
    raw = _raw(cfg.dataset)
    split = build_partition(cfg) if split is None else split
    x_pool, y_pool = raw.pooled() if cfg.pool == "train+test" else (raw.x_train, raw.y_train)
    t = lambda arrs: [torch.as_tensor(a, dtype=torch.long, device=device) for a in arrs]  # noqa: E731
    x_test, y_test = raw.x_test, raw.y_test
    local = None
    if cfg.pool == "train" and cfg.subsample < 1.0:
        # a subsampled run scores its GM on the same stratified fraction of the official test set (the whole
        # 10,000-image set cost more than the training of a mini run: DC-PFL, CNN_1); SCD's local tests
        # (`global_test_by_proportion`) still draw from the whole set
        keep = torch.as_tensor(_gm_test_keep(cfg, raw))
        if _tests_from_test_half(cfg):
            local = (normalise(x_test, raw.spec, device), y_test.to(device))
        x_test, y_test = x_test[keep], y_test[keep]
    if cfg.pool == "train+test":
        # the official test set is inside the partitioned pool: the held-out "global test
        # set" for GM accuracy is then the union of the clients' local test sets
        union = torch.as_tensor(np.concatenate(split["test"]), dtype=torch.long)
        x_test, y_test = x_pool[union], y_pool[union]
    public = None
    if cfg.public.get("size", 0) > 0:
        praw = _raw(cfg.public["dataset"] or cfg.dataset)
        px = praw.x_train if cfg.public["split"] == "train" else praw.x_test
        public = normalise(px[torch.as_tensor(public_indices(cfg, split))], raw.spec, device)
    return FedData(raw.spec, normalise(x_pool, raw.spec, device), y_pool.to(device),
                   normalise(x_test, raw.spec, device), y_test.to(device),
                   t(split["train"]), t(split["test"]), t(split["val"]),
                   local_test_from_global=_tests_from_test_half(cfg), source=raw.source,
                   x_local_test=local[0] if local else None, y_local_test=local[1] if local else None,
                   x_public=public)


def _tests_from_test_half(cfg: RunConfig) -> bool:
    """Whether the split's local test sets index the official test half (not the partitioned pool)."""
    return cfg.split == "global_test_by_proportion" or getattr(SPLITS[cfg.split], "tests_from_test_half", False)


def _gm_test_keep(cfg: RunConfig, raw) -> np.ndarray:
    """The official test set's indices a subsampled `pool='train'` run scores its GM on."""
    return _stratified_subsample(raw.y_test.numpy(), cfg.subsample, derive_seed(cfg.seed, 0x5B6))


def _used_indices(cfg: RunConfig, split: dict, half: str) -> np.ndarray:
    """Indices of the run's own dataset, in its `half` ('train' or 'test'), that any client split or the
    GM's test set uses."""
    raw = _raw(cfg.dataset)
    n_tr = len(raw.y_train)
    cat = lambda names: np.concatenate([np.asarray(a, np.int64) for n in names for a in split[n]]  # noqa: E731
                                       + [np.empty(0, np.int64)])
    tests_global = _tests_from_test_half(cfg)   # local tests index the official test set
    pool = cat(("train", "val") if tests_global else ("train", "val", "test"))
    if cfg.pool == "train+test":       # pooled index space: [train; test]
        return pool[pool < n_tr] if half == "train" else pool[pool >= n_tr] - n_tr
    if half == "train":
        return pool
    gm_test = _gm_test_keep(cfg, raw) if cfg.subsample < 1.0 else np.arange(len(raw.y_test))
    return np.concatenate([gm_test, cat(("test",))]) if tests_global else gm_test


def public_indices(cfg: RunConfig, split: dict | None = None) -> np.ndarray:
    """The unlabeled public set (`cfg.public`): `size` indices of `public.dataset`'s `public.split`, drawn
    uniformly without replacement from the samples the run does not use (from the run's own dataset:
    none of its clients' train/val/test samples and none of its GM test set), from the run's seed."""
    pub = cfg.public
    name = pub["dataset"] or cfg.dataset
    n = len(_raw(name).y_train if pub["split"] == "train" else _raw(name).y_test)
    free = np.arange(n)
    if name == cfg.dataset:
        split = build_partition(cfg) if split is None else split
        free = np.setdiff1d(free, _used_indices(cfg, split, pub["split"]))
    if len(free) < pub["size"]:
        raise ValueError(f"public.size={pub['size']}: only {len(free)} samples of {name}/{pub['split']} are left "
                         f"after the run's clients and test sets take theirs; lower public.size or subsample, or "
                         f"draw from another split or dataset (public.split / public.dataset)")
    rng = np.random.default_rng(derive_seed(cfg.seed, 0x9B1))
    return np.sort(rng.choice(free, size=pub["size"], replace=False))


def client_archs(cfg: RunConfig, sizes) -> tuple:
    """Each client's architecture (`models` assigned by `model_assign`, from the training-set sizes); () when
    every client has `model`."""
    if not cfg.models:
        return ()
    return tuple(assign_models(cfg.models, sizes, cfg.model_assign, arch_params(cfg), derive_seed(cfg.seed, 0xA55)))


def arch_params(cfg: RunConfig) -> dict:
    """Parameter count of each architecture a run uses (`model` and `models`) on its dataset."""
    spec = SPECS[cfg.dataset]
    return {m: sum(p.numel() for p in build_model(m, spec.channels, spec.num_classes, spec.size).parameters())
            for m in {cfg.model, *cfg.models}}


def build_context(cfg: RunConfig, device: torch.device, split: dict | None = None) -> Context:
    data = build_data(cfg, device, split)
    spec = data.spec
    archs = client_archs(cfg, [len(t) for t in data.train])

    def make_model(k: int):
        return build_model(archs[k] if (archs and k >= 0) else cfg.model, spec.channels, spec.num_classes, spec.size)

    torch.manual_seed(derive_seed(cfg.seed, 0x1A17))
    init = {n: t.detach().clone() for n, t in make_model(-1).to(device).state_dict().items()}
    return Context(cfg, data, device, make_model, init, archs=archs)


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


_RESULT_CODE = ("batched.py", "clock.py", "config.py", "data.py", "engine.py", "models.py", "partition.py", "runs.py",
                "schedule.py", "schemas.py", "spectral.py")
_NO_RESULT_EFFECT = ("progress.py",)   # reached by `run`, but only writes the heartbeat a progress line reads


def _algorithm_files(algorithm: str | None) -> list[Path]:
    """The algorithm package files a run of `algorithm` executes: the modules defining its class
    and its bases, plus the package modules those import (e.g. shared statistics helpers).
    Adding or editing another algorithm does not invalidate this one's stored results."""
    import re
    from . import algorithms
    folder = Path(algorithms.__file__).resolve().parent
    if algorithm is None or algorithm not in algorithms.ALGORITHMS:
        return sorted(folder.glob("*.py"))
    todo = [Path(c.__module__.replace(".", "/") + ".py").name for c in algorithms.ALGORITHMS[algorithm].__mro__
            if c.__module__.startswith("pflrepro.algorithms.")]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or not (folder / name).exists():
            continue
        seen.add(name)
        todo += [m + ".py" for m in re.findall(r"^from \.(\w+) import", (folder / name).read_text(), re.M)]
    return sorted(folder / n for n in seen)


def code_fingerprint(algorithm: str | None = None) -> str:
    """sha256 of the source files that can change a run's numbers (not reporting/CLI code): the
    engine and, for `algorithm`, its own modules (all algorithm files when None). Part of the
    content address, so a stored result is never reused across a change of the code it ran."""
    pkg = Path(__file__).resolve().parent
    files = [pkg / f for f in _RESULT_CODE] + _algorithm_files(algorithm)
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes())
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


def run(cfg: RunConfig | dict, *, root: Path | str | None = None, progress: bool = True,
        force: bool = False) -> RunResult:
    """Run one config, or return its stored result. Resumes from a checkpoint if one exists."""
    cfg = cfg if isinstance(cfg, RunConfig) else RunConfig.from_dict(cfg)
    path = run_dir(cfg, root)
    if (path / "summary.json").exists() and not force:
        return load_result(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2, sort_keys=True))
    device = resolve_device(cfg.device)
    ckpt_path = path / "checkpoint.pt"
    start = None
    if ckpt_path.exists() and not force:
        start = torch.load(ckpt_path, map_location=device, weights_only=True)
        split = _load_partition(path)
    else:
        split = build_partition(cfg)
        _save_partition(path, split)
    ctx = build_context(cfg, device, split)
    algo = ALGORITHMS[cfg.algorithm](ctx, **cfg.hparams)
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
    return RunResult(cfg, path, res.history, res.per_client, summary, prov)


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
    from .clock import forward_flops
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
