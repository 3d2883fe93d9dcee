"""What an algorithm may use (`Context`: config, data, model construction, the training primitive)
and how it asks for local training (`Plan`, `Then`, `ModelView`)."""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from ..data.fed import FedData
from ..settings import RunSettings
from .seeds import derive_seed
from .training import LossFn, TrainStats, ce_loss, local_train


@dataclass
class Plan:
    """What one client's local training is, as data: the batched engine trains many clients'
    plans at once, the per-client path one (`Context.train_plan`). Built by `Algorithm.plan`."""
    start: dict                                     # state the client starts from (not modified)
    loss: Callable = ce_loss                        # batchable term (or an older-form loss: per client)
    trainable: Callable[[str], bool] | None = None  # None: all parameters
    aux: dict = field(default_factory=dict)         # this client's tensors the term needs (nested dicts ok)
    per_sample: dict = field(default_factory=dict)  # tensors with one row per training sample (e.g. stored
    #                                                 teacher logits): the batch's rows are merged into aux
    epochs: int | None = None                       # None: cfg.local_epochs
    lr: float | None = None                         # None: cfg.lr
    steps: int | None = None
    purpose: int = 0                                # seed stream (derive_seed(seed, rnd, k, purpose))
    # For methods whose client step is not FedAvg's (docs/architecture.md, "Methods that do not fit"):
    rows: torch.Tensor | None = None                # positions in the client's training data this plan trains on
    #                                                 (FedALA's sample of it); None: all of them
    shuffle: bool = True                            # False: batches in row order every epoch (no reshuffle)
    update: Callable | None = None                  # a custom step replacing SGD (training.py, "a custom optimiser
    #                                                 step"; e.g. a projected one); None: the run's SGD
    update_state: dict = field(default_factory=dict)  # the custom step's tensors at the start (stats.update_state:
    #                                                 at the end)

    def settings(self, cfg: "RunSettings") -> tuple[int, float]:
        """(epochs, lr) this plan trains with: its own where set, else the run's (the one place the rule is written:
        every engine reads it here)."""
        return (cfg.local_epochs if self.epochs is None else self.epochs, cfg.lr if self.lr is None else self.lr)

    def take(self, t: torch.Tensor) -> torch.Tensor:
        """`t` (one row per training sample of the client) at the rows this plan trains on: `rows`, or all (the one
        place the restriction is written: every engine takes the client's data and per-sample tensors here)."""
        return t if self.rows is None else t[self.rows.to(t.device)]

    def sample_rows(self) -> dict:
        """The plan's per-sample tensors at its rows."""
        return {n: self.take(t) for n, t in self.per_sample.items()}



@dataclass
class Then:
    """`Algorithm.finish`'s answer when the client trains once more before it replies (Ditto's and SCD's PM
    after the GM, FedRep's body after the head): the engine trains `plan` (with other clients' second plans
    when batched) and calls `done(state, stats)`, which returns the (Update, client state) pair, or another
    `Then`. `state` is reused by the engine afterwards: clone what is kept."""
    plan: Plan
    done: Callable


def train_chain(ctx: "Context", k: int, rnd: int, plan: Plan, done: Callable):
    """The per-client path of a client step: train `plan`, call `done(state, stats)`, and train every `Then`
    it answers, until the (Update, client state) pair."""
    while True:
        out = done(*train_one(ctx, k, rnd, plan))
        if not isinstance(out, Then):
            return out
        plan, done = out.plan, out.done


def train_one(ctx: "Context", k: int, rnd: int, plan: Plan) -> tuple:
    """Client k's `plan` trained on its own module: (state, TrainStats); `state` is valid until k's module trains
    again (clone what is kept)."""
    net = ctx.model(k, plan.start)
    return net.state_dict(), ctx.train_plan(net, k, rnd, plan)


# ---------------------------------------------------------------- context given to algorithms

@dataclass
class Context:
    """What an algorithm may use: the config, the data, model construction and the
    training primitive. Holds no training state."""
    cfg: RunSettings
    data: FedData
    device: torch.device
    make_model: Callable[[int], nn.Module]     # client id (-1 = server/global) -> fresh model
    init_state: dict                           # the common initial global weights (seeded)
    clock: object = None                       # the run's simulated clock (pflrepro.core.clock), set by run_rounds:
    #                                            algorithms only ask it how many PM steps fit (`pm_steps`)
    archs: tuple = ()                          # client k's architecture name (runs.client_archs); () = all cfg.model
    _work: dict = field(default_factory=dict)  # reusable module per architecture name
    _inits: dict = field(default_factory=dict)  # initial weights per other architecture (heterogeneous runs)
    eval_scores: dict = field(default_factory=dict)  # (test set, weights' fingerprint) -> accuracy, of the last
    #                                            evaluation (pflrepro.core.loop.evaluate: an unchanged model is not
    #                                            scored twice); a memo of results, not training state
    forward_flops: dict = field(default_factory=dict)  # architecture name -> FLOPs of one image's forward pass
    #                                            (the evaluation's hash-or-score rule; computed once per run)

    def arch(self, k: int) -> str:
        """Client k's architecture name; k = -1 (the server) and homogeneous runs: `cfg.model`."""
        return self.archs[k] if (self.archs and k >= 0) else self.cfg.model

    def initial(self, k: int) -> dict:
        """Client k's initial weights: the common `init_state` when k has the run's `model`; in
        heterogeneous runs another architecture gets one init of its own, drawn from a generator
        seeded by (seed, architecture name) (global RNG untouched), the same for all its clients
        (as FedGH's code: client i starts from net_set[i % 5]). Cached; do not modify."""
        a = self.arch(k)
        if a == self.cfg.model:
            return self.init_state
        if a not in self._inits:
            self._inits[a] = self.fresh_state(k, derive_seed(self.cfg.stream_seed("init"), 0x1A17, zlib.crc32(a.encode())))
        return self._inits[a]

    def fresh_state(self, k: int, seed: int) -> dict:
        """Freshly initialised weights of client k's architecture (k = -1: the server's), drawn from `seed`
        with the global RNG left untouched (HypCluster's extra cluster models use it too)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            net = self.make_model(k)
        return {n: t.detach().to(self.device).clone() for n, t in net.state_dict().items()}

    def model(self, k: int, state: dict | None = None) -> nn.Module:
        """A module of client k's architecture loaded with `state` (reused across calls:
        valid until the next call for the same architecture)."""
        a = self.arch(k)
        if a not in self._work:
            self._work[a] = self.make_model(k).to(self.device)
        net = self._work[a]
        if state is not None:
            net.load_state_dict(state)
        return net

    def train(self, net: nn.Module, k: int, rnd: int, *, loss: LossFn = ce_loss,
              trainable: Callable[[str], bool] | None = None, epochs: int | None = None,
              lr: float | None = None, steps: int | None = None, data=None, purpose: int = 0,
              aux: dict | None = None, per_sample: dict | None = None, batch_size: int | None = None,
              shuffle: bool = True, update=None, update_state: dict | None = None) -> TrainStats:
        """Train `net` on client k's training data with the run's optimiser settings (`batch_size`: samples a
        step reads, default the run's; Per-FedAvg's step reads two or three batches)."""
        c = self.cfg
        x, y = self.data.client_train(k) if data is None else data
        return local_train(net, x, y, epochs=c.local_epochs if epochs is None else epochs,
                           batch_size=c.batch_size if batch_size is None else batch_size,
                           lr=c.lr if lr is None else lr, momentum=c.momentum,
                           weight_decay=c.weight_decay, bias_decay=c.bias_decay, grad_clip=c.grad_clip, loss=loss,
                           trainable=trainable, seed=derive_seed(c.seed, rnd, k, purpose), steps=steps,
                           aux=aux, per_sample=per_sample, shuffle=shuffle, update=update,
                           update_state=update_state)

    def train_plan(self, net: nn.Module, k: int, rnd: int, plan: Plan) -> TrainStats:
        """The per-client path of a `Plan` (`net` already holds `plan.start`)."""
        epochs, lr = plan.settings(self.cfg)
        data = None if plan.rows is None else tuple(plan.take(t) for t in self.data.client_train(k))
        return self.train(net, k, rnd, loss=plan.loss, trainable=plan.trainable, epochs=epochs,
                          lr=lr, steps=plan.steps, purpose=plan.purpose, aux=plan.aux, data=data,
                          per_sample=plan.sample_rows(), shuffle=plan.shuffle, update=plan.update,
                          update_state=plan.update_state)
