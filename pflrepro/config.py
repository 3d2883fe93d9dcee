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
from typing import Any


class ConfigError(ValueError):
    """A bad configuration value; the message names the key, the value and what is allowed."""


@dataclass(frozen=True)
class Param:
    """Declaration of one setting: type, default, allowed range/choices, help text."""
    type: type
    default: Any
    help: str = ""
    low: float | None = None          # inclusive unless low_open
    high: float | None = None         # inclusive
    low_open: bool = False
    choices: tuple | None = None

    def check(self, key: str, value: Any) -> Any:
        t = self.type
        if t is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if t is float and isinstance(value, str):  # YAML 1.1 reads "1e-5" as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if t is tuple and isinstance(value, list):
            value = tuple(value)
        if not isinstance(value, t) or (t in (int, float) and isinstance(value, bool)):
            raise ConfigError(f"{key}={value!r}: expected {t.__name__}, got {type(value).__name__}")
        if t is float and not math.isfinite(value):  # nan passes every range check (its comparisons are False)
            raise ConfigError(f"{key}={value!r}: must be a finite number")
        if self.choices is not None and value not in self.choices:
            raise ConfigError(f"{key}={value!r}: allowed values are {', '.join(map(repr, self.choices))}")
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            raise ConfigError(f"{key}={value!r}: must be {'>' if self.low_open else '>='} {self.low}")
        if self.high is not None and value > self.high:
            raise ConfigError(f"{key}={value!r}: must be <= {self.high}")
        return value


def check_params(prefix: str, given: dict, schema: dict[str, Param]) -> dict:
    """Validate a dict of settings against a schema; fill defaults."""
    if not isinstance(given, dict):
        raise ConfigError(f"{prefix}={given!r}: expected a mapping")
    unknown = sorted(set(given) - set(schema))
    if unknown:
        allowed = ", ".join(sorted(schema)) or "(none)"
        name = f"{prefix}.{unknown[0]}" if prefix else unknown[0]
        raise ConfigError(f"{name}={given[unknown[0]]!r}: unknown key; allowed: {allowed}")
    out = {}
    for k, p in schema.items():
        # a setting whose default is None ("not set") may be given as None: a validated config re-validates
        out[k] = p.check(f"{prefix}.{k}" if prefix else k, given[k]) if k in given and not (
            given[k] is None and p.default is None) else p.default
    return out


# Top-level run settings. Algorithm, partition and split settings live in nested dicts
# validated against the schema each algorithm/partitioner declares.
RUN_SCHEMA: dict[str, Param] = {
    "algorithm": Param(str, "fedavg", "algorithm name (see pflrepro.algorithms.ALGORITHMS)"),
    "hparams": Param(dict, {}, "algorithm-specific hyperparameters"),
    "dataset": Param(str, "fmnist", "dataset name (see pflrepro.data.DATASETS)"),
    "pool": Param(str, "train", "what gets partitioned: 'train' (test set stays global) or "
                  "'train+test' (pFedSD: union, then per-client splits)", choices=("train", "train+test")),
    "subsample": Param(float, 1.0, "fraction of the pool used (stratified, deterministic); <1 for quick runs",
                       low=0.0, high=1.0, low_open=True),
    "partition": Param(str, "iid", "partitioner name (see pflrepro.partition.PARTITIONERS)"),
    "partition_params": Param(dict, {}, "partitioner keyword arguments"),
    "split": Param(str, "random", "per-client split rule (see pflrepro.partition.SPLITS)"),
    "split_params": Param(dict, {}, "split keyword arguments"),
    "n_clients": Param(int, 20, "number of clients K", low=1),
    "new_clients": Param(int, 0, "the last N clients never train; they join after the last round (SCD Fig. 3: "
                         "80 training + 20 new clients, pflrepro.newclients)", low=0),
    "participation": Param(float, 1.0, "fraction of clients per round", low=0.0, high=1.0, low_open=True),
    "sampling": Param(str, "uniform", "client sampling: 'uniform' or 'data_share' (PerFed-CKT: by p_k)",
                      choices=("uniform", "data_share")),
    "model": Param(str, "cnn_fmnist", "model name (see pflrepro.models.MODELS)"),
    "models": Param(tuple, (), "heterogeneous models, assigned to clients by `model_assign`; empty = all `model`"),
    "model_assign": Param(str, "cycle", "how clients get `models` (see pflrepro.models.ASSIGNERS): 'cycle' (client k "
                          "gets models[k % len(models)]) or 'size' (a larger dataset draws a larger model: PerFed-CKT "
                          "Table 2)"),
    "rounds": Param(int, 10, "communication rounds T", low=1),
    "local_epochs": Param(int, 1, "local epochs E", low=0),
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
    "engine": Param(str, "auto", "local training: 'batched' trains the selected clients together (pflrepro.batched; "
                    "algorithms whose client step is a Plan), 'per_client' one after another (the reference), "
                    "'auto' batched wherever it applies (on a CPU, models with grouped convolutions train per client: "
                    "faster there)", choices=("auto", "batched", "per_client")),
    "public": Param(dict, {}, "unlabeled public set for distillation methods (PerFed-CKT, FedDF): dataset, split, "
                    "size (see pflrepro.schemas.PUBLIC_SCHEMA)"),
    "clock": Param(dict, {}, "simulated clock: protocol, client compute rate and bandwidths (see pflrepro.clock)"),
    "schedule": Param(dict, {}, "server schedule: synchronous rounds, or FedAsync / FedBuff (see pflrepro.schedule)"),
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
        from . import algorithms, clock, data, models, partition, schedule, schemas

        top = check_params("", dict(d), RUN_SCHEMA)
        _choice("algorithm", top["algorithm"], algorithms.ALGORITHMS)
        _choice("dataset", top["dataset"], data.SPECS)
        _choice("partition", top["partition"], partition.PARTITIONERS)
        _choice("split", top["split"], partition.SPLITS)
        for m in (top["model"], *top["models"]):
            _choice("model", m, models.MODELS)
        _choice("model_assign", top["model_assign"], models.ASSIGNERS)
        top["hparams"] = check_params("hparams", top["hparams"], algorithms.ALGORITHMS[top["algorithm"]].HPARAMS)
        top["partition_params"] = check_params("partition_params", top["partition_params"],
                                               schemas.PARTITION_SCHEMAS[top["partition"]])
        top["split_params"] = check_params("split_params", top["split_params"], schemas.SPLIT_SCHEMAS[top["split"]])
        top["public"] = _check_public(top, data.SPECS, algorithms.ALGORITHMS[top["algorithm"]])
        top["clock"] = check_params("clock", top["clock"], clock.CLOCK_SCHEMA)
        top["schedule"] = check_params("schedule", top["schedule"], schedule.SCHEDULE_SCHEMA)
        fr = top["split_params"].get("fractions")
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
    from . import schemas
    pub = check_params("public", top["public"], schemas.PUBLIC_SCHEMA)
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


def _choice(key, value, registry):
    if value not in registry:
        raise ConfigError(f"{key}={value!r}: unknown; allowed: {', '.join(sorted(registry))}")
