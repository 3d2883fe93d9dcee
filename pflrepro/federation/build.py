"""A federation from a config: the partition (which samples each client holds), the clients'
tensors, the public set and the models (`build_context`). Everything here decides results."""
from __future__ import annotations

import numpy as np
import torch

from ..core.context import Context
from ..core.seeds import derive_seed
from ..data.datasets import SPECS, load_dataset
from ..data.fed import FedData, normalise
from ..data.models import assign_models, build_model
from ..data.partition import PARTITIONERS, SPLITS
from ..params import ConfigError
from .config import RunConfig


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device='cuda' but no CUDA device is available; use device='cpu' or 'auto'")
    return torch.device(name)


# ---------------------------------------------------------------- building the federation
_RAW_CACHE: dict = {}


def raw_dataset(name: str):
    if name not in _RAW_CACHE:
        if len(_RAW_CACHE) >= 3:  # keep at most three datasets (uint8) in memory
            _RAW_CACHE.pop(next(iter(_RAW_CACHE)))
        _RAW_CACHE[name] = load_dataset(name)
    return _RAW_CACHE[name]


def build_partition(cfg: RunConfig) -> dict:
    """Deterministic client index arrays for a config (pure function of the config)."""
    raw = raw_dataset(cfg.dataset)
    if cfg.pool == "train+test":
        _, y_pool = raw.pooled()
    else:
        y_pool = raw.y_train
    y_pool = y_pool.numpy()
    pool_idx = np.arange(len(y_pool))
    if cfg.subsample < 1.0:
        pool_idx = _stratified_subsample(y_pool, cfg.subsample, derive_seed(cfg.stream_seed("partition"), 0x5B5))
    labels = y_pool[pool_idx]
    if cfg.n_clients > len(labels):  # one check for every partitioner, before any of them works on it
        raise ConfigError(f"n_clients={cfg.n_clients}: more clients than the {len(labels)} samples the run partitions "
                          f"({cfg.dataset}, pool={cfg.pool!r}, subsample={cfg.subsample}), so some would get no data; "
                          f"use n_clients <= {len(labels)}" + (" or a larger subsample" if cfg.subsample < 1.0 else ""))
    partitioner, extra = PARTITIONERS[cfg.partition], {}
    if getattr(partitioner, "uses_domains", False):   # one domain per client: each pool index's domain
        doms = raw.domains(cfg.pool)
        extra["domains"] = None if doms is None else doms.numpy()[pool_idx]
    try:
        parts = partitioner(labels, cfg.n_clients, seed=cfg.stream_seed("partition"), **cfg.partition_params, **extra)
    except ConfigError:
        raise
    except ValueError as e:   # a partition the settings cannot produce: one line, before any work (issue 33)
        raise ConfigError(f"partition={cfg.partition}: {e}") from None
    parts = [pool_idx[p] for p in parts]
    kw = dict(cfg.split_params)
    if cfg.split == "global_test_by_proportion":
        kw["test_labels"] = raw.y_test.numpy()
    if getattr(SPLITS[cfg.split], "uses_domains", False):   # each client's tests: its domain's test half
        kw["test_domains"] = None if raw.d_test is None else raw.d_test.numpy()
    try:
        split = SPLITS[cfg.split](y_pool, parts, seed=cfg.stream_seed("split"), **kw)
    except ValueError as e:   # a split the settings cannot make: one line, before any work (issue 33)
        raise ConfigError(f"split={cfg.split}: {e}") from None
    empty = [k for k, tr in enumerate(split["train"]) if len(tr) == 0]
    if empty:
        raise ConfigError(f"partition '{cfg.partition}' with {cfg.partition_params} left clients {empty[:10]} "
                         f"with no training data; use fewer clients or a different partition")
    return {"train": split["train"], "test": split["test"], "val": split.get("val", [np.array([], np.int64)] * len(parts))}


def _stratified_subsample(y: np.ndarray, frac: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    keep = []
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        keep.append(rng.choice(idx, size=max(1, int(round(frac * len(idx)))), replace=False))
    return np.sort(np.concatenate(keep))


def _compact(split: dict, tests_in_pool: bool) -> tuple[np.ndarray, dict]:
    """The pool indices a run's clients use (sorted), and the split re-indexed into them: a run normalises and
    holds only its own images (a mini run uses 2,100 of the 70,000; normalising all of them cost more than its
    evaluation). A client's rows, and their order, are the same images as before."""
    parts = [*split["train"], *split["val"], *(split["test"] if tests_in_pool else [])]
    used = np.unique(np.concatenate([np.asarray(a, np.int64) for a in parts] + [np.empty(0, np.int64)]))
    remap = lambda arrs: [np.searchsorted(used, np.asarray(a, np.int64)) for a in arrs]  # noqa: E731
    return used, {"train": remap(split["train"]), "val": remap(split["val"]),
                  "test": remap(split["test"]) if tests_in_pool else split["test"]}


def build_data(cfg: RunConfig, device: torch.device, split: dict | None = None) -> FedData:
    raw = raw_dataset(cfg.dataset)
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
        praw = raw_dataset(cfg.public["dataset"] or cfg.dataset)
        px = praw.x_train if cfg.public["split"] == "train" else praw.x_test
        public = normalise(px[torch.as_tensor(public_indices(cfg, split))], raw.spec, device)
    used, own = _compact(split, not _tests_from_test_half(cfg))
    keep = torch.as_tensor(used, dtype=torch.long)
    data = FedData(raw.spec, normalise(x_pool[keep], raw.spec, device), y_pool[keep].to(device),
                   normalise(x_test, raw.spec, device), y_test.to(device),
                   t(own["train"]), t(own["test"]), t(own["val"]),
                   local_test_from_global=_tests_from_test_half(cfg), source=raw.source,
                   x_local_test=local[0] if local else None, y_local_test=local[1] if local else None,
                   x_public=public)
    return data.pooled_tests() if cfg.pool == "train+test" else data


def _tests_from_test_half(cfg: RunConfig) -> bool:
    """Whether the split's local test sets index the official test half (not the partitioned pool)."""
    return cfg.split == "global_test_by_proportion" or getattr(SPLITS[cfg.split], "tests_from_test_half", False)


def _gm_test_keep(cfg: RunConfig, raw) -> np.ndarray:
    """The official test set's indices a subsampled `pool='train'` run scores its GM on."""
    return _stratified_subsample(raw.y_test.numpy(), cfg.subsample, derive_seed(cfg.stream_seed("split"), 0x5B6))


def _used_indices(cfg: RunConfig, split: dict, half: str) -> np.ndarray:
    """Indices of the run's own dataset, in its `half` ('train' or 'test'), that any client split or the
    GM's test set uses."""
    raw = raw_dataset(cfg.dataset)
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
    n = len(raw_dataset(name).y_train if pub["split"] == "train" else raw_dataset(name).y_test)
    free = np.arange(n)
    if name == cfg.dataset:
        split = build_partition(cfg) if split is None else split
        free = np.setdiff1d(free, _used_indices(cfg, split, pub["split"]))
    if len(free) < pub["size"]:
        raise ConfigError(f"public.size={pub['size']}: only {len(free)} samples of {name}/{pub['split']} are left "
                         f"after the run's clients and test sets take theirs; lower public.size or subsample, or "
                         f"draw from another split or dataset (public.split / public.dataset)")
    rng = np.random.default_rng(derive_seed(cfg.stream_seed("partition"), 0x9B1))
    return np.sort(rng.choice(free, size=pub["size"], replace=False))


def client_archs(cfg: RunConfig, sizes) -> tuple:
    """Each client's architecture (`models` assigned by `model_assign`, from the training-set sizes); () when
    every client has `model`."""
    if not cfg.models:
        return ()
    return tuple(assign_models(cfg.models, sizes, cfg.model_assign, arch_params(cfg), derive_seed(cfg.stream_seed("partition"), 0xA55)))


def arch_params(cfg: RunConfig) -> dict:
    """Parameter count of each architecture a run uses (`model` and `models`) on its dataset."""
    spec = SPECS[cfg.dataset]
    return {m: sum(p.numel() for p in build_model(m, spec.channels, spec.num_classes, spec.size).parameters())
            for m in {cfg.model, *cfg.models}}


def build_context(cfg: RunConfig, device: torch.device, split: dict | None = None) -> Context:
    data = build_data(cfg, device, split)
    if not any(len(t) for t in data.test[:cfg.n_clients - cfg.new_clients]):
        # every PM accuracy would be NaN: refused before round 1 (a run where SOME client has no test sample runs)
        given = ", ".join(f"split_params.{k}={v!r}" for k, v in sorted(cfg.split_params.items()))
        raise ConfigError(f"split={cfg.split}" + (f" with {given}" if given else "") + ": no client gets a local "
                          "test sample, so no personalized accuracy could be scored (too few samples for the split)")
    spec = data.spec
    archs = client_archs(cfg, [len(t) for t in data.train])

    def make_model(k: int):
        return build_model(archs[k] if (archs and k >= 0) else cfg.model, spec.channels, spec.num_classes, spec.size)

    torch.manual_seed(derive_seed(cfg.stream_seed("init"), 0x1A17))
    init = {n: t.detach().clone() for n, t in make_model(-1).to(device).state_dict().items()}
    return Context(cfg, data, device, make_model, init, archs=archs)
