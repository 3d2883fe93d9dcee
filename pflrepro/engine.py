"""The one round loop, the local-training primitive, aggregation and evaluation.

Nothing else in the code base loops over rounds or over batches. An algorithm
(`pflrepro.algorithms.base.Algorithm`) only says what differs from FedAvg: the loss
term it feeds `Context.train`, which parameters are trainable, what it keeps per
client, what it uploads and how the server aggregates.

State is explicit and made of tensors only, so a checkpoint is a plain
`torch.save` of {round, server, clients, history} that `torch.load(weights_only=True)`
reads back:
- server state: dict[str, Tensor | dict] (e.g. {"params": global state_dict})
- client state: dict[int, dict[str, Tensor | dict]] (personal models, teachers, ...)
"""
from __future__ import annotations

import contextlib
import time
import zlib
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .config import RunConfig
from .data import FedData

LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


class Divergence(RuntimeError):
    """Training produced a NaN/inf loss."""


# ---------------------------------------------------------------- loss terms
def batchable(fn):
    """Mark `fn` as a *batchable* loss term, `fn(m, x, y, aux) -> Tensor`:
    - `m` is a `ModelView`: `m(x)` runs the model being trained, `m.params` are its current
      parameters by name (for proximal terms), `m.run(state, x, train=...)` runs the same
      architecture with another state (a teacher);
    - `aux` is a dict of this client's tensors (the `Plan`'s `aux`, plus the batch's rows of its
      `per_sample` tensors).
    It must reach per-client tensors only through `aux` (never through Python objects it closes
    over), so that the batched engine (`pflrepro.batched`) can run it for many clients at once
    under `torch.func.vmap`; closing over plain numbers (lambda, tau) is fine. Unmarked loss
    terms keep the older form `loss(net, x, y)` and train client by client."""
    fn.batchable = True
    return fn


def is_batchable(fn) -> bool:
    return bool(getattr(fn, "batchable", False))


@batchable
def ce_loss(net, x: torch.Tensor, y: torch.Tensor, aux: dict | None = None) -> torch.Tensor:
    """Cross-entropy: both a plain loss term (`ce_loss(net, x, y)`) and a batchable one."""
    return F.cross_entropy(net(x), y)


@contextlib.contextmanager
def train_mode(module: nn.Module, train: bool = True):
    """Every submodule in train (or eval) mode for the block; each one's own flag restored after."""
    was = [m.training for m in module.modules()]
    module.train(train)
    try:
        yield module
    finally:
        for m, w in zip(module.modules(), was):
            m.training = w


class ModelView:
    """The model as a batchable loss term sees it.

    Per client (`params=None`): a thin wrapper over the module being trained, so `m(x)` is
    exactly `net(x)`. Batched: `params`/`buffers` are one client's tensors inside `vmap`, and
    `m(x)` is `functional_call(module, (params, buffers), x)`."""

    def __init__(self, module: nn.Module, params: dict | None = None, buffers: dict | None = None):
        self.module = module
        self._params = params
        self._buffers = buffers
        self._buffer_names: set | None = None

    @property
    def params(self) -> dict:
        """Current parameters by name, in `named_parameters()` order (trainable and frozen)."""
        if self._params is None:
            self._params = dict(self.module.named_parameters())
        return self._params

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self._buffers is None:       # per client: the module itself
            return self.module(x)
        return torch.func.functional_call(self.module, (self._params, self._buffers), (x,))

    def run(self, state: dict, x: torch.Tensor, *, train: bool = False) -> torch.Tensor:
        """Forward of the same architecture with `state` (parameters and buffers, e.g. a teacher's),
        in train mode (dropout active, BN on batch statistics) or eval mode. `state` is never
        modified (BN running statistics, updated in train mode, go to copies)."""
        if self._buffer_names is None:
            self._buffer_names = {n for n, _ in self.module.named_buffers()}
        with train_mode(self.module, train):
            st = {n: (t.clone() if (train and n in self._buffer_names) else t) for n, t in state.items()}
            return torch.func.functional_call(self.module, st, (x,))


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


def derive_seed(*parts: int) -> int:
    """A 63-bit seed from integers (run seed, round, client, purpose): independent of
    call order, so a resumed run draws exactly what an uninterrupted one draws."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(2, np.uint64)[0] >> np.uint64(1))


# ---------------------------------------------------------------- local training
@dataclass
class TrainStats:
    loss: float
    steps: int
    samples: int


def local_train(net: nn.Module, x: torch.Tensor, y: torch.Tensor, *, epochs: int, batch_size: int,
                lr: float, momentum: float = 0.0, weight_decay: float = 0.0, grad_clip: float = 0.0,
                bias_decay: bool = True, loss: LossFn = ce_loss, trainable: Callable[[str], bool] | None = None,
                seed: int = 0, steps: int | None = None,
                aux: dict | None = None, per_sample: dict | None = None) -> TrainStats:
    """The local-training primitive: SGD on (x, y) minimising `loss(net, xb, yb)`.

    `trainable(name)` selects the parameters that move (others are frozen for this call);
    `seed` fixes the data order and dropout draws; `steps` (optional) caps the number of
    mini-batch steps instead of whole epochs; `bias_decay=False` exempts parameters named `*bias*` from
    `weight_decay` (FedRep's code). Batches are index slices of the client's
    tensors: no DataLoader. The last partial batch of an epoch is kept.
    A batchable loss term (`batchable`) is called `loss(ModelView(net), xb, yb, aux_b)` instead,
    with aux_b = `aux` plus the batch's rows of each `per_sample` tensor.
    `pflrepro.batched.local_train_many` is the same primitive for many clients at once.
    """
    named = [(n, p) for n, p in net.named_parameters() if trainable is None or trainable(n)]
    params = [p for _, p in named]
    frozen = [p for n, p in net.named_parameters() if trainable is not None and not trainable(n)]
    for p in frozen:
        p.requires_grad_(False)
    groups = params
    if not bias_decay and weight_decay != 0:   # FedRep's code: no weight decay on biases
        groups = [g for g in ({"params": [p for n, p in named if "bias" not in n]},
                              {"params": [p for n, p in named if "bias" in n], "weight_decay": 0.0}) if g["params"]]
    opt = torch.optim.SGD(groups, lr=lr, momentum=momentum, weight_decay=weight_decay)
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # dropout / stochastic layers: per-client, per-round stream
    net.train()
    n = len(y)
    total, count, done = 0.0, 0, 0
    view = ModelView(net) if is_batchable(loss) else None
    aux, per_sample = aux or {}, per_sample or {}
    try:
        for _ in range(epochs if steps is None else 10**9):
            order = torch.randperm(n, generator=gen).to(x.device)
            for s in range(0, n, batch_size):
                idx = order[s:s + batch_size]
                xb, yb = x[idx], y[idx]
                opt.zero_grad(set_to_none=True)
                if view is not None:
                    value = loss(view, xb, yb, {**aux, **{n_: t[idx] for n_, t in per_sample.items()}}
                                 if per_sample else aux)
                else:
                    value = loss(net, xb, yb)
                if not torch.isfinite(value):
                    raise Divergence(f"loss became {value.item()} at local step {done}: the run diverged "
                                     f"(lower the learning rate, or check the loss term)")
                value.backward()
                if grad_clip > 0:
                    nn.utils.clip_grad_norm_(params, grad_clip)
                opt.step()
                total += value.item() * len(yb)
                count += len(yb)
                done += 1
                if steps is not None and done >= steps:
                    return TrainStats(total / max(count, 1), done, count)
            if steps is not None and n == 0:
                break
    finally:
        for p in frozen:
            p.requires_grad_(True)
    return TrainStats(total / max(count, 1), done, count)


@torch.no_grad()
def outputs(net: nn.Module, x: torch.Tensor, batch: int = 2048) -> torch.Tensor:
    """The model's raw outputs (logits) for every row of x, in eval mode, batched; the module's modes restored
    after (soft decisions on a public set, server-side distillation targets, losses of candidate models)."""
    with train_mode(net, False):
        return torch.cat([net(x[i:i + batch]) for i in range(0, len(x), batch)])


@torch.no_grad()
def predict(net: nn.Module, x: torch.Tensor, batch: int = 2048) -> torch.Tensor:
    net.eval()
    return torch.cat([net(x[i:i + batch]).argmax(1) for i in range(0, len(x), batch)]) if len(x) else \
        torch.empty(0, dtype=torch.long, device=x.device)


def accuracy(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    if len(y) == 0:
        return float("nan")
    return (predict(net, x) == y).float().mean().item()


# ---------------------------------------------------------------- aggregation
def weighted_average(states: list[dict], weights, keys=None) -> dict:
    """sum_k w_k * state_k / sum_k w_k over `keys` (default: all). Integer entries
    (BN's num_batches_tracked) are not averaged: the first client's value is kept."""
    w = torch.as_tensor(weights, dtype=torch.float64)
    if len(states) != len(w) or len(states) == 0:
        raise ValueError(f"weighted_average: {len(states)} states, {len(w)} weights")
    if float(w.sum()) <= 0:
        raise ValueError("weighted_average: weights sum to zero")
    w = w / w.sum()
    keys = list(states[0]) if keys is None else list(keys)
    out = {}
    for k in keys:
        t0 = states[0][k]
        if not torch.is_floating_point(t0):
            out[k] = t0.clone()
            continue
        acc = torch.zeros_like(t0, dtype=torch.float64)
        for wi, s in zip(w, states):
            acc += wi.item() * s[k].double()
        out[k] = acc.to(t0.dtype)
    return out


def plain_average(states: list[dict], keys=None) -> dict:
    return weighted_average(states, [1.0] * len(states), keys)


def select_keys(state: dict, *, include: Callable[[str], bool] | None = None,
                exclude: Callable[[str], bool] | None = None) -> list[str]:
    """Names of a state dict kept by include/exclude predicates (e.g. backbone only, BN excluded)."""
    return [k for k in state if (include is None or include(k)) and (exclude is None or not exclude(k))]


def state_bytes(state: dict, keys=None) -> int:
    keys = state.keys() if keys is None else keys
    return int(sum(state[k].numel() * state[k].element_size() for k in keys))


def clone_state(state: dict) -> dict:
    return {k: v.detach().clone() for k, v in state.items()}


# ---------------------------------------------------------------- context given to algorithms
@dataclass
class Context:
    """What an algorithm may use: the config, the data, model construction and the
    training primitive. Holds no training state."""
    cfg: RunConfig
    data: FedData
    device: torch.device
    make_model: Callable[[int], nn.Module]     # client id (-1 = server/global) -> fresh model
    init_state: dict                           # the common initial global weights (seeded)
    clock: object = None                       # the run's simulated clock (pflrepro.clock), set by run_rounds:
    #                                            algorithms only ask it how many PM steps fit (`pm_steps`)
    archs: tuple = ()                          # client k's architecture name (runs.client_archs); () = all cfg.model
    _work: dict = field(default_factory=dict)  # reusable module per architecture name
    _inits: dict = field(default_factory=dict)  # initial weights per other architecture (heterogeneous runs)

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
            self._inits[a] = self.fresh_state(k, derive_seed(self.cfg.seed, 0x1A17, zlib.crc32(a.encode())))
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
              aux: dict | None = None, per_sample: dict | None = None, batch_size: int | None = None) -> TrainStats:
        """Train `net` on client k's training data with the run's optimiser settings (`batch_size`: samples a
        step reads, default the run's; Per-FedAvg's step reads two or three batches)."""
        c = self.cfg
        x, y = self.data.client_train(k) if data is None else data
        return local_train(net, x, y, epochs=c.local_epochs if epochs is None else epochs,
                           batch_size=c.batch_size if batch_size is None else batch_size,
                           lr=c.lr if lr is None else lr, momentum=c.momentum,
                           weight_decay=c.weight_decay, bias_decay=c.bias_decay, grad_clip=c.grad_clip, loss=loss,
                           trainable=trainable, seed=derive_seed(c.seed, rnd, k, purpose), steps=steps,
                           aux=aux, per_sample=per_sample)

    def train_plan(self, net: nn.Module, k: int, rnd: int, plan: Plan) -> TrainStats:
        """The per-client path of a `Plan` (`net` already holds `plan.start`)."""
        return self.train(net, k, rnd, loss=plan.loss, trainable=plan.trainable, epochs=plan.epochs,
                          lr=plan.lr, steps=plan.steps, purpose=plan.purpose, aux=plan.aux,
                          per_sample=plan.per_sample)


# ---------------------------------------------------------------- the round loop
def sample_clients(cfg: RunConfig, rnd: int, n_train: np.ndarray) -> list[int]:
    """The round's clients, among the K - `new_clients` that take part in training (SCD Fig. 3 holds the last
    `new_clients` out: they join after training, pflrepro.newclients)."""
    K = cfg.n_clients - cfg.new_clients
    m = max(1, int(round(cfg.participation * K)))
    rng = np.random.default_rng(derive_seed(cfg.seed, rnd, 0x5A3))
    if m >= K:
        return list(range(K))
    n_train = n_train[:K]
    p = None if cfg.sampling == "uniform" else n_train / n_train.sum()
    return sorted(int(k) for k in rng.choice(K, size=m, replace=False, p=p))


def evaluate(ctx: Context, algo, server: dict, clients: dict) -> tuple[dict, list[float]]:
    """Evaluation protocol (docs/evaluation.md): GM on the global test set, every client's
    PM on its own local test set; plain and sample-weighted means, std across clients."""
    data = ctx.data
    gm = algo.global_model(server)
    if gm is None:
        gm = algo.averaged_personal_model(server, clients)  # SCD Remark 4.1 (None if heterogeneous)
    gm_acc = accuracy(gm, data.x_test, data.y_test) if gm is not None else float("nan")
    accs = [float("nan")] * data.n_clients
    generic = []
    for k in range(data.n_clients - ctx.cfg.new_clients):   # new clients (never trained) are not scored here
        pm = algo.personal_model(k, server, clients.get(k))
        if pm is None:  # generic method: PM = GM on the local test set (Remark 4.1)
            generic.append(k)
            continue
        accs[k] = accuracy(pm, *data.client_test(k))
    if generic:
        gm = algo.global_model(server)  # loaded once, after any personal model reused its module
        for k in generic:
            accs[k] = accuracy(gm, *data.client_test(k))
    a = np.array(accs, dtype=np.float64)
    w = data.n_train().numpy()
    extra = {}
    if ctx.cfg.eval_gm_local:    # the global model on every client's local test (PerFed-CKT's "Ditto (GM)")
        gm = algo.global_model(server)
        extra["gm_local_acc_mean"] = float("nan") if gm is None else float(np.nanmean(
            [accuracy(gm, *data.client_test(k)) for k in range(data.n_clients - ctx.cfg.new_clients)]))
    ok = ~np.isnan(a)
    row = {
        "gm_acc": gm_acc,
        "pm_acc_mean": float(a[ok].mean()) if ok.any() else float("nan"),
        "pm_acc_weighted": float((a[ok] * w[ok]).sum() / w[ok].sum()) if ok.any() else float("nan"),
        "pm_acc_std": float(a[ok].std()) if ok.any() else float("nan"),
        "pm_acc_min": float(a[ok].min()) if ok.any() else float("nan"),
        **extra,
    }
    return row, accs


@dataclass
class LoopResult:
    history: list            # one dict per evaluated round
    per_client: list         # per evaluated round: list of client PM accuracies
    server: dict
    clients: dict
    bytes_up: int
    bytes_down: int
    samples: int
    resumed_from: int


def local_round(ctx: Context, algo, rnd: int, selected: list[int], server: dict, clients: dict) -> list:
    """The selected clients' local updates of one round, in `selected` order; new client states
    are stored in `clients`. `cfg.engine` picks how: `per_client` calls `algo.client_update` client
    by client; `auto`/`batched` train the clients of algorithms that describe their client step as
    a `Plan` (`Algorithm.plan`/`finish`) together (`pflrepro.batched`), same primitive, same seeds."""
    if ctx.cfg.engine != "per_client":
        from .batched import batched_round, uses_plans
        if uses_plans(algo):
            return batched_round(ctx, algo, rnd, selected, server, clients)
    updates = []
    for k in selected:
        up, new_state = algo.client_update(rnd, k, server, clients.get(k))
        if new_state is not None:
            clients[k] = new_state
        updates.append(up)
    return updates


def run_rounds(ctx: Context, algo, *, start: dict | None = None,
               on_checkpoint: Callable[[dict], None] | None = None, progress: bool = True,
               on_round: Callable[[int], None] | None = None) -> LoopResult:
    """THE round loop: sample, local updates, aggregate, evaluate, log, checkpoint (`on_round(rnd)` after
    every round: the run's heartbeat, pflrepro.progress)."""
    cfg = ctx.cfg
    n_train = ctx.data.n_train().numpy()
    if start is None:
        server, clients, history, per_client, first = algo.server_init(), {}, [], [], 1
        counters = {"bytes_up": 0, "bytes_down": 0, "samples": 0}
    else:
        server, clients, history, per_client = start["server"], start["clients"], start["history"], start["per_client"]
        first, counters = int(start["round"]) + 1, dict(start["counters"])
    if cfg.engine != "per_client":
        from .batched import check_memory
        check_memory(ctx, algo, first, server, clients)  # a run that cannot fit says so before round 1
    clock = ctx.clock = make_clock(ctx)
    from .schedule import make_schedule
    sched = make_schedule(cfg, n_train)     # synchronous rounds, or FedAsync / FedBuff on the clock
    if start is not None and "clock" in start:
        clock.load(start["clock"])
        sched.load(start.get("schedule", {}))
    bar = _progress(cfg, first, progress)
    t_last = time.perf_counter()
    for rnd in range(first, cfg.rounds + 1):
        selected = sched.dispatch(rnd)      # who starts from the current global model
        clock.begin_round(selected, {k: cfg.local_epochs * int(n_train[k]) for k in selected})
        updates = local_round(ctx, algo, rnd, selected, server, clients) if selected else []
        for up in updates:
            counters["bytes_up"] += up.bytes_up
            counters["bytes_down"] += up.bytes_down
            counters["samples"] += up.samples
        sched.launch(rnd, selected, updates, server, clock)
        arrived, sim = sched.collect(rnd, clock)   # what the server folds in at this step, and when
        losses = [u["loss"] if isinstance(u, dict) else u.loss for u in arrived]
        server = sched.aggregate(algo, rnd, server, arrived, clients)
        if rnd % cfg.eval_every == 0 or rnd == cfg.rounds:
            t_eval = time.perf_counter()
            row, accs = evaluate(ctx, algo, server, clients)
            now = time.perf_counter()
            row = {"round": rnd, "train_loss": float(np.mean(losses)), **row,   # wall times last (not results)
                   "bytes_up": counters["bytes_up"], "bytes_down": counters["bytes_down"],
                   **sim, "seconds": now - t_last, "eval_seconds": now - t_eval}
            t_last = now
            history.append(row)
            per_client.append(accs)
            if bar is not None:
                bar.set_postfix(pm=f"{row['pm_acc_mean']:.3f}", gm=f"{row['gm_acc']:.3f}", loss=f"{row['train_loss']:.3f}")
        if bar is not None:
            bar.update(1)
        if on_round is not None:
            on_round(rnd)
        if on_checkpoint is not None and (rnd % cfg.checkpoint_every == 0 or rnd == cfg.rounds):
            on_checkpoint({"round": rnd, "server": server, "clients": clients, "history": history,
                           "per_client": per_client, "counters": counters, "clock": clock.state(),
                           "schedule": sched.state()})
    if bar is not None:
        bar.close()
    return LoopResult(history, per_client, server, clients, counters["bytes_up"], counters["bytes_down"],
                      counters["samples"], first - 1)


def make_clock(ctx: Context):
    """The run's simulated clock (`cfg.clock`): model FLOPs counted once, outside the run's RNG streams."""
    from .clock import Clock, model_forward_flops
    spec = ctx.data.spec
    flops = model_forward_flops(ctx.cfg.model, spec.channels, spec.num_classes, spec.size)
    return Clock(ctx.cfg.clock, ctx.cfg.n_clients, ctx.cfg.seed, flops, state_bytes(ctx.init_state))


def _progress(cfg: RunConfig, first: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm
    return tqdm(total=cfg.rounds, initial=first - 1, desc=f"{cfg.algorithm}/{cfg.dataset} s{cfg.seed}",
                unit="round", leave=False, dynamic_ncols=True)

