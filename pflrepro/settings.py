"""Run settings, declared once: `RUN_SCHEMA` (type, default, range, help of every setting) and `RunSettings`, the
frozen dataclass generated from it, which core code reads. The bottom layer (it imports only `params`): the
validation that needs the registries (algorithms, datasets, models, partitioners, the clock's and schedule's
schemas) is `pflrepro.federation.config.RunConfig.from_dict`, a subclass that adds nothing but validation."""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json

from .params import MAX_EPOCHS, Param

PUBLIC_SCHEMA: dict[str, Param] = {
    "dataset": Param(str, "", "dataset the unlabeled public set is drawn from ('' = the run's own dataset)"),
    "split": Param(str, "train", "which half of it: 'train' or 'test'", choices=("train", "test")),
    "size": Param(int, 0, "number of public samples |P| (0 = no public set); drawn uniformly without replacement, "
                  "never from samples the run's clients or test sets use", low=0),
}

# Random streams a run may pin apart from its `seed` (`seeds`), to vary one source of noise with the others held fixed
# (scripts/evidence/noise.py); a stream not named follows `seed`, which drives everything else (the order of SGD
# batches, client sampling, dropout and each algorithm's own draws).
SEED_STREAMS: dict[str, Param] = {
    "partition": Param(int, None, "the data the clients hold: pool subsample, partition, public set, model assignment",
                       low=0),
    "split": Param(int, None, "each client's split of its data into train/val/test, and the global test subsample",
                   low=0),
    "init": Param(int, None, "the initial weights", low=0),
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
    "seeds": Param(dict, {}, "streams pinned apart from `seed` (noise studies): partition, split, init (see "
                   "pflrepro.federation.config.SEED_STREAMS); {} = every stream follows `seed`"),
    "device": Param(str, "cpu", "'cpu', 'cuda' or 'auto'", choices=("cpu", "cuda", "auto")),
    "engine": Param(str, "auto", "local training: 'batched' trains the selected clients together (pflrepro.core.engines.batched; "
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


def _field(p: Param) -> dataclasses.Field:
    if isinstance(p.default, (dict, list)):
        return dataclasses.field(default_factory=lambda d=p.default: copy.deepcopy(d))
    return dataclasses.field(default=p.default)


class _Methods:
    """What a run's settings answer beside their values (the fields come from RUN_SCHEMA)."""

    def stream_seed(self, stream: str) -> int:
        """The seed of one random stream (SEED_STREAMS): pinned by `seeds`, else the run's `seed`."""
        if stream not in SEED_STREAMS:
            raise KeyError(stream)
        return self.seeds.get(stream, self.seed)

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


RunSettings = dataclasses.make_dataclass(
    "RunSettings", [(k, p.type, _field(p)) for k, p in RUN_SCHEMA.items()], bases=(_Methods,), frozen=True)
RunSettings.__module__ = __name__     # pickled by name (make_dataclass's `module=` is Python 3.12+)
RunSettings.__doc__ = ("One run's settings, every field declared by RUN_SCHEMA (a flat, plain-data description of an "
                       "experiment); built validated by pflrepro.federation.config.RunConfig.from_dict.")


def _jsonable(o):
    if isinstance(o, tuple):
        return list(o)
    raise TypeError(type(o))
