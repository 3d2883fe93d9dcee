"""Run configuration validated up front: `RunConfig` is `pflrepro.settings.RunSettings` (the fields, declared once by
RUN_SCHEMA) with the checks that need the registries.

Every field is a plain value (str/int/float/bool/dict of those) so papermill, DVC and
YAML can set it. `RunConfig.from_dict` rejects unknown keys, wrong types and
out-of-range values before any work, with one message naming key, value and what is allowed.
"""
from __future__ import annotations

import math

from .. import algorithms
from ..core import clock, schedule
from ..data import datasets as data
from ..data import models, partition
from ..params import ConfigError, check_params, did_you_mean
from ..settings import PUBLIC_SCHEMA, RUN_SCHEMA, SEED_STREAMS, RunSettings

__all__ = ["RunConfig", "RUN_SCHEMA", "PUBLIC_SCHEMA", "SEED_STREAMS"]


class RunConfig(RunSettings):
    """Run settings validated against the registries (`from_dict`): the only way configs are built."""
    __slots__ = ()

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
        top["seeds"] = {k: v for k, v in check_params("seeds", top["seeds"], SEED_STREAMS).items() if v is not None}
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

    def replace(self, **kw) -> "RunConfig":
        return RunConfig.from_dict({**self.to_dict(), **kw})


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
        raise ConfigError(f"{key}={value!r}: unknown{did_you_mean(value, registry)}; allowed: "
                          + ", ".join(sorted(registry)))
