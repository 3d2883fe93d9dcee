"""Run configuration: one flat, plain-data description of an experiment, validated up front.

Every field is a plain value (str/int/float/bool/dict of those) so papermill, DVC and
YAML can set it. `RunConfig.from_dict` rejects unknown keys, wrong types and
out-of-range values before any work, with one message naming key, value and what is allowed.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field

from .. import algorithms
from ..core import clock, schedule
from ..data import datasets as data
from ..data import models, partition
from ..params import MAX_EPOCHS, ConfigError, Param, check_params

PUBLIC_SCHEMA: dict[str, Param] = {
    "dataset": Param(str, "", "dataset the unlabeled public set is drawn from ('' = the run's own dataset)"),
    "split": Param(str, "train", "which half of it: 'train' or 'test'", choices=("train", "test")),
    "size": Param(int, 0, "number of public samples |P| (0 = no public set); drawn uniformly without replacement, "
                  "never from samples the run's clients or test sets use", low=0),
}

# Top-level run settings. Algorithm, partition and split settings live in nested dicts
# validated against the schema each algorithm/partitioner declares.
RUN_SCHEMA: dict[str, Param] = {
    "algorithm": Param(str, "fedavg", "algorithm name (see pflrepro.algorithms.ALGORITHMS)"),
    "hparams": Param(dict, {}, "algorithm-specific hyperparameters"),
    "dataset": Param(str, "fmnist", "dataset name (see pflrepro.data.datasets.DATASETS)"),
    "pool": Param(str, "train", "what gets partitioned: 'train' (test set stays global) or "
                  "'train+test' (pFedSD: union, then per-client splits)", choices=("train", "train+test")),
    "subsample": Param(float, 1.0, "fraction of the pool used (stratified, deterministic); <1 for quick runs",
                       low=0.0, high=1.0, low_open=True),
    "partition": Param(str, "iid", "partitioner name (see pflrepro.data.partition.PARTITIONERS)"),
    "partition_params": Param(dict, {}, "partitioner keyword arguments"),
    "split": Param(str, "random", "per-client split rule (see pflrepro.data.partition.SPLITS)"),
    "split_params": Param(dict, {}, "split keyword arguments"),
    "n_clients": Param(int, 20, "number of clients K", low=1),
    "new_clients": Param(int, 0, "the last N clients never train; they join after the last round (SCD Fig. 3: "
                         "80 training + 20 new clients, pflrepro.papers.newclients)", low=0),
    "participation": Param(float, 1.0, "fraction of clients per round", low=0.0, high=1.0, low_open=True),
    "sampling": Param(str, "uniform", "client sampling: 'uniform' or 'data_share' (PerFed-CKT: by p_k)",
                      choices=("uniform", "data_share")),
    "model": Param(str, "cnn_fmnist", "model name (see pflrepro.data.models.MODELS)"),
    "models": Param(tuple, (), "heterogeneous models, assigned to clients by `model_assign`; empty = all `model`"),
    "model_assign": Param(str, "cycle", "how clients get `models` (see pflrepro.data.models.ASSIGNERS): 'cycle' (client k "
                          "gets models[k % len(models)]) or 'size' (a larger dataset draws a larger model: PerFed-CKT "
                          "Table 2)"),
    "rounds": Param(int, 10, "communication rounds T", low=1),
    "local_epochs": Param(int, 1, "local epochs E", low=0, high=MAX_EPOCHS),
    "batch_size": Param(int, 64, "local batch size B", low=1),
    "lr": Param(float, 0.01, "client learning rate", low=0.0, low_open=True),
    "momentum": Param(float, 0.0, "SGD momentum", low=0.0, high=1.0),
    "weight_decay": Param(float, 0.0, "SGD weight decay", low=0.0),
    "bias_decay": Param(bool, True, "weight decay on biases too; false exempts every parameter whose name contains "
                        "'bias' (FedRep's code, whose setup FedBSD's experiments follow)"),
    "grad_clip": Param(float, 0.0, "max gradient norm (0 = off)", low=0.0),
    "eval_gm_local": Param(bool, False, "also score the global model on every client's local test set (metric "
                           "gm_local_acc_mean: PerFed-CKT's 'Ditto (GM)', 'Per-FedAvg (GM)')"),
    "eval_every": Param(int, 1, "evaluate every N rounds (the last round is always evaluated)", low=1),
    "checkpoint_every": Param(int, 5, "checkpoint every N rounds", low=1),
    "seed": Param(int, 0, "seed for partition, init, sampling and data order", low=0),
    "device": Param(str, "cpu", "'cpu', 'cuda' or 'auto'", choices=("cpu", "cuda", "auto")),
    "engine": Param(str, "auto", "local training: 'batched' trains the selected clients together (pflrepro.core.batched; "
                    "algorithms whose client step is a Plan), 'per_client' one after another (the reference), "
                    "'auto' batched wherever it applies (on a CPU, models with grouped convolutions train per client: "
                    "faster there)", choices=("auto", "batched", "per_client")),
    "public": Param(dict, {}, "unlabeled public set for distillation methods (PerFed-CKT, FedDF): dataset, split, "
                    "size (see pflrepro.federation.config.PUBLIC_SCHEMA)"),
    "clock": Param(dict, {}, "simulated clock: protocol, client compute rate and bandwidths (see pflrepro.core.clock)"),
    "schedule": Param(dict, {}, "server schedule: synchronous rounds, or FedAsync / FedBuff (see pflrepro.core.schedule)"),
    "memory_budget_mb": Param(float, 4096.0, "batched engine: memory for one chunk of clients trained together "
                              "(estimated: stacked weights, gradients, momentum, activations); clients are chunked "
                              "to fit, and a run where one client cannot fit stops before round 1 ('auto': falls "
                              "back to per-client)", low=0.0, low_open=True),
}


@dataclass(frozen=True)
class RunConfig:
    algorithm: str = "fedavg"
    hparams: dict = field(default_factory=dict)
    dataset: str = "fmnist"
    pool: str = "train"
    subsample: float = 1.0
    partition: str = "iid"
    partition_params: dict = field(default_factory=dict)
    split: str = "random"
    split_params: dict = field(default_factory=dict)
    n_clients: int = 20
    new_clients: int = 0
    participation: float = 1.0
    sampling: str = "uniform"
    model: str = "cnn_fmnist"
    models: tuple = ()
    model_assign: str = "cycle"
    rounds: int = 10
    local_epochs: int = 1
    batch_size: int = 64
    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0
    bias_decay: bool = True
    grad_clip: float = 0.0
    eval_every: int = 1
    eval_gm_local: bool = False
    checkpoint_every: int = 5
    seed: int = 0
    device: str = "cpu"
    engine: str = "auto"
    memory_budget_mb: float = 4096.0
    public: dict = field(default_factory=dict)
    clock: dict = field(default_factory=dict)
    schedule: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict) -> "RunConfig":
        """Validate everything (top level, algorithm hparams, partition, split, model names)."""
        top = check_params("", dict(d), RUN_SCHEMA)
        _choice("algorithm", top["algorithm"], algorithms.ALGORITHMS)
        _choice("dataset", top["dataset"], data.SPECS)
        _choice("partition", top["partition"], partition.PARTITIONERS)
        _choice("split", top["split"], partition.SPLITS)
        for key, m in [("model", top["model"]), *(("models", m) for m in top["models"])]:
            if not isinstance(m, str):   # a list or dict entry was unhashable in the registry lookup
                raise ConfigError(f"{key}={m!r}: expected a model name")
            _choice(key, m, models.MODELS)
        _choice("model_assign", top["model_assign"], models.ASSIGNERS)
        top["hparams"] = check_params("hparams", top["hparams"], algorithms.ALGORITHMS[top["algorithm"]].HPARAMS)
        top["partition_params"] = check_params("partition_params", top["partition_params"],
                                               partition.PARTITION_SCHEMAS[top["partition"]])
        top["split_params"] = check_params("split_params", top["split_params"], partition.SPLIT_SCHEMAS[top["split"]])
        top["public"] = _check_public(top, data.SPECS, algorithms.ALGORITHMS[top["algorithm"]])
        top["clock"] = check_params("clock", top["clock"], clock.CLOCK_SCHEMA)
        top["schedule"] = check_params("schedule", top["schedule"], schedule.SCHEDULE_SCHEMA)
        _check_train_choices(top["split_params"])
        fr = top["split_params"].get("fractions")
        if fr is not None and not all(isinstance(f, (int, float)) and not isinstance(f, bool) and math.isfinite(f)
                                      for f in fr):
            raise ConfigError(f"split_params.fractions={list(fr)!r}: every fraction must be a finite number")
        if fr is not None and (len(fr) not in (2, 3) or any(f < 0 for f in fr) or sum(fr) > 1 + 1e-9):
            raise ConfigError(f"split_params.fractions={list(fr)!r}: 2 or 3 non-negative fractions summing to <= 1")
        pp = top["partition_params"]
        if "low" in pp and pp["low"] > pp["high"]:
            raise ConfigError(f"partition_params.low={pp['low']!r}: must be <= high={pp['high']!r}")
        if top["new_clients"] >= top["n_clients"]:
            raise ConfigError(f"new_clients={top['new_clients']!r}: must be below n_clients={top['n_clients']!r} "
                              "(at least one client trains)")
        if top["models"] and top["model"] not in top["models"]:
            raise ConfigError(f"model={top['model']!r} must be one of models={list(top['models'])!r}: the server's "
                              "initial state (shared head, global means) is built with `model`")
        cfg = cls(**top)
        if cfg.heterogeneous and not algorithms.ALGORITHMS[cfg.algorithm].heterogeneous:
            raise ConfigError(f"algorithm={top['algorithm']!r} averages whole models: it cannot run with heterogeneous "
                              f"models={list(top['models'])!r} (an algorithm class declares `heterogeneous = True` when it can); "
                              "algorithms that can: " + ", ".join(
                                  sorted(a for a, c in algorithms.ALGORITHMS.items() if c.heterogeneous)))
        algo_cls = algorithms.ALGORITHMS[cfg.algorithm]
        if cfg.schedule["mode"] != "sync" and algo_cls.aggregate is not algorithms.Algorithm.aggregate:
            raise ConfigError(f"schedule.mode={cfg.schedule['mode']!r}: the asynchronous servers mix uploaded models "
                              f"(FedAsync/FedBuff rules); algorithm={cfg.algorithm!r} aggregates its own way")
        if top["split"] in ("global_test_by_proportion", "domain_test") and top["pool"] != "train":
            raise ConfigError(f"split={top['split']!r} takes local tests from the global test set: it needs pool='train'")
        return cfg

    @property
    def heterogeneous(self) -> bool:
        """Clients of different architectures: no whole model can be averaged (the one place this is decided)."""
        return len(set(self.models)) > 1

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["models"] = list(self.models)
        return d

    def key(self) -> str:
        """Content address: sha256 of the canonical JSON of the full validated config."""
        blob = json.dumps(self.to_dict(), sort_keys=True, default=_jsonable)
        return hashlib.sha256(blob.encode()).hexdigest()

    def replace(self, **kw) -> "RunConfig":
        return RunConfig.from_dict({**self.to_dict(), **kw})


def _jsonable(o):
    if isinstance(o, tuple):
        return list(o)
    raise TypeError(type(o))


def _check_public(top: dict, specs: dict, algo_cls) -> dict:
    """The public set's settings: a known dataset whose images have the run's shape; required (size > 0)
    by algorithms that declare `needs_public`."""
    pub = check_params("public", top["public"], PUBLIC_SCHEMA)
    if pub["dataset"]:
        _choice("public.dataset", pub["dataset"], specs)
        a, b = specs[pub["dataset"]], specs[top["dataset"]]
        if (a.channels, a.size) != (b.channels, b.size):
            raise ConfigError(f"public.dataset={pub['dataset']!r}: images {a.channels}x{a.size}x{a.size}, but the run's "
                              f"dataset {top['dataset']!r} has {b.channels}x{b.size}x{b.size}; the clients' models read both")
    if getattr(algo_cls, "needs_public", False) and pub["size"] == 0:
        raise ConfigError(f"public.size=0: algorithm={top['algorithm']!r} distils on an unlabeled public set; "
                          "set public.size (and public.dataset / public.split), e.g. public={'size': 2000}")
    return pub


def _check_train_choices(sp: dict) -> None:
    """PerFed-CKT's split: each client's train fraction is drawn from `train_choices`; with the validation and test
    fractions it must fit in the client's data (issue 33: a string, nan or [] reached the split)."""
    if "train_choices" not in sp:
        return
    tc = sp["train_choices"]
    if not tc or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 < v < 1
                         for v in tc):
        raise ConfigError(f"split_params.train_choices={list(tc)!r}: a non-empty list of fractions in (0, 1)")
    if max(tc) + sp["val_fraction"] + sp["test_fraction"] > 1 + 1e-9:
        raise ConfigError(f"split_params.train_choices={list(tc)!r}: the largest, with val_fraction="
                          f"{sp['val_fraction']!r} and test_fraction={sp['test_fraction']!r}, exceeds 1")


def _choice(key, value, registry):
    if value not in registry:
        raise ConfigError(f"{key}={value!r}: unknown; allowed: {', '.join(sorted(registry))}")
