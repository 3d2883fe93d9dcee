"""The batched engine's round: `batched_round` is the round loop's batched branch: it asks the algorithm for every selected
client's `Plan`, groups clients whose plans can be trained together (same architecture, loss
term, trainable set, settings, tensor shapes), trains each group in chunks that fit
`cfg.memory_budget_mb`, and hands each trained state to `Algorithm.finish`.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import torch
from torch import nn

from ..clock import model_forward_flops
from ..context import Context, Plan, Then, train_one
from ..seeds import derive_seed
from ..training import is_batchable
from . import forked, grouped, together
from .many import NotBatchable, _signature, local_train_many
from .memory import MemoryBudgetError, _need, _too_big, chunk_size


def uses_plans(algo) -> bool:
    """True for algorithms whose client step is plan -> train -> finish (they do not override
    `client_update`): those can be batched."""
    return bool(getattr(algo, "uses_plans", False))


def check_memory(ctx: Context, algo, first: int, server: dict, clients: dict) -> None:
    """Before round 1 (or the resumed round): with engine='batched', the algorithm must describe
    its client step as a Plan and one client of every architecture must fit `memory_budget_mb`;
    otherwise stop now, saying why. With 'auto', such clients are trained per client."""
    cfg = ctx.cfg
    if not uses_plans(algo):
        if cfg.engine == "batched":
            raise NotBatchable(f"engine='batched': algorithm {cfg.algorithm!r} overrides client_update, so its "
                               f"clients train one by one; use engine='auto' or 'per_client'")
        return
    seen = set()
    for k in range(ctx.data.n_clients):
        a = ctx.arch(k)
        if a in seen:
            continue
        seen.add(a)
        plan = algo.plan(first, k, server, clients.get(k))
        if cfg.engine == "batched" and not is_batchable(plan.loss):
            raise NotBatchable(f"engine='batched': algorithm {cfg.algorithm!r} gives an older-form loss term "
                               f"(not training.batchable); use engine='auto' or 'per_client'")
        need = _need(ctx, k, plan)
        if need["total"] > cfg.memory_budget_mb * 2**20:
            if cfg.engine == "batched":
                raise MemoryBudgetError(_too_big(ctx, k, need))
            warnings.warn(_too_big(ctx, k, need) + " (engine='auto': these clients train one by one)",
                          stacklevel=2)


# ---------------------------------------------------------------- the round loop's batched branch
def group_key(ctx: Context, k: int, plan: Plan):
    """Clients with equal keys can be trained together; None: this plan trains per client."""
    if not is_batchable(plan.loss):
        return None
    names = [n for n, _ in ctx.model(k).named_parameters()]
    tr = None if plan.trainable is None else frozenset(n for n in names if plan.trainable(n))
    try:
        return (ctx.arch(k), plan.loss, tr, plan.epochs, plan.lr, plan.purpose,   # steps and rows may differ per client
                _signature(plan.start), _signature(plan.aux), _signature(plan.per_sample, rows=True),
                plan.shuffle, plan.update, _signature(plan.update_state))
    except NotBatchable:
        return None


BATCHED_CONV_MAX_BATCH = 32   # from this batch size on a CPU, a convolutional model batches only through `grouped`,
BATCHED_CONV_MIN_CLIENTS = 10  # and with at least this many clients training together (measured: 6 lose, 10 win)
BATCHED_MAX_PARAMS = 200_000  # above it, the clients' stacked weights, gradients and momentum leave the CPU's caches


def slower_batched(module: nn.Module, device: torch.device, batch_size: int = 0, clients: int = 0) -> bool:
    """engine='auto' trains this architecture per client (at this batch size, `clients` training together). Measured
    on CPUs only (one thread, whole mini runs, `benchmarks/bench_engine_choice.py`; no GPU has been lent for it), so a
    GPU always batches:
    - a grouped convolution (MobileNetV2's depthwise layers): `vmap` over stacked client weights makes one
      convolution with clients x groups groups, which oneDNN runs slower than a loop over the clients (pFedSD
      Table 8 mini, MobileNetV2, 6 clients: 20.4 s batched vs 14.6 s per client, 2026-11-23);
    - more than BATCHED_MAX_PARAMS parameters: DC-PFL's cnn1 (2.0 M parameters, B = 16, 10 clients) trained
      2.37-2.44x faster client by client (FedAvg, Local, LG-FedAvg), FedBSD Table 1's MLP (0.54 M, B = 10, 8 clients)
      3.24x (FedRep; sixteenth session): ten clients' weights, gradients and momentum are 245 MB a step for cnn1,
      against 25 MB for one client, which stays in this CPU's 32 MB L3. The LeNet-size CNNs (44-78 k) batch faster;
      between 78 k and 536 k nothing was measured, and pFedSD's FMNIST CNN (244 k, the paper row's model) keeps the
      per-client path its comparison with the authors' code measured;
    - a convolution at batch size >= BATCHED_CONV_MAX_BATCH, unless `grouped` runs every layer (`grouped.covers`) and
      at least BATCHED_CONV_MIN_CLIENTS clients train together. Until the fourteenth session this held for every
      such model (the per-client path feeds its batches channels-last, `training.cpu_layout`, which `vmap` cannot);
      with `grouped`'s layers out of `vmap` the batched engine wins there with 20 clients (sixteenth session, per-
      client speed over batched, fastest of 2: SCD 0.92, Ditto 0.79, FedAvg 0.88, FedProx 0.84, FedAvgM 0.87,
      FedBABU 0.91, FedDyn 0.79, FedRep 0.82, FedGen 0.84 on SCD's LeNet at B = 32; FedAvg with 10 clients 0.89)
      and loses with 6 (SCD's FedAvg 1.06; PerFed-CKT's CNN: FedAvg 1.09, Ditto 1.23, Local 1.20) and without
      `grouped` (FedBSD Fig. 3's BN CNN, 5 clients: FedAvg 1.30, FedBSD 1.35). Not captured: PerFed-CKT's CNN with 20
      clients of 4-94 images (E = 5) trained 1.11x faster client by client; its mini runs train 6 a round. Below
      B = 32 the batched engine wins (B = 16: FedAvg 0.61x, pFedSD 0.57x; docs/performance.md, "The engine rule,
      remeasured")."""
    if torch.device(device).type != "cpu":
        return False
    convs = [m for m in module.modules() if isinstance(m, nn.Conv2d)]
    if any(m.groups > 1 for m in convs) or sum(p.numel() for p in module.parameters()) > BATCHED_MAX_PARAMS:
        return True
    if convs and batch_size >= BATCHED_CONV_MAX_BATCH:
        return not (grouped.covers(module) and clients >= BATCHED_CONV_MIN_CLIENTS)
    return False


def batched_round(ctx: Context, algo, rnd: int, selected: list[int], server: dict, clients: dict) -> list:
    """One round's local updates with batching (`local_round`'s branch for plan-based algorithms):
    results equal the per-client path's up to float rounding; clients' states are stored in
    `selected` order, as the per-client loop stores them. A `finish` that answers `Then` (a second
    training phase: Ditto's PM, FedRep's body) has those plans batched in turn, all clients' at once."""
    results = {}

    def first(k, state, stats):
        results[k] = algo.finish(rnd, k, server, clients.get(k), state, stats)

    train_plans(ctx, rnd, {k: algo.plan(rnd, k, server, clients.get(k)) for k in selected}, first)
    while pending := {k: r for k, r in results.items() if isinstance(r, Then)}:
        def then(k, state, stats):
            results[k] = pending[k].done(state, stats)
        train_plans(ctx, rnd, {k: t.plan for k, t in pending.items()}, then)
    updates = []
    for k in selected:
        up, new_state = results[k]
        if new_state is not None:
            clients[k] = new_state
        updates.append(up)
    return updates


def train_plans(ctx: Context, rnd: int, plans: dict, on_trained) -> None:
    """Train every client's `Plan` (clients whose plans match in groups, in chunks that fit the memory
    budget; the rest one by one, as `Context.train_plan`) and call `on_trained(k, state, stats)` for each
    right away (`state` is valid until the next training: clone what is kept)."""
    cfg = ctx.cfg
    groups: dict = {}
    singles = []
    for k, plan in plans.items():
        key = group_key(ctx, k, plan)
        if key is None:
            if cfg.engine == "batched":
                raise NotBatchable(f"engine='batched': client {k}'s loss term is not batchable")
            singles.append(k)
        else:
            groups.setdefault(key, []).append(k)
    for ks in groups.values():
        if cfg.engine == "auto" and (len(ks) == 1 or slower_batched(ctx.model(ks[0]), ctx.device, cfg.batch_size,
                                                                             len(ks))):
            singles += ks
            continue
        need = _need(ctx, ks[0], plans[ks[0]])
        size = chunk_size(need["total"], cfg.memory_budget_mb, len(ks))
        if size < 1:
            if cfg.engine == "batched":
                raise MemoryBudgetError(_too_big(ctx, ks[0], need))
            singles += ks
            continue
        if (stacker := together.current()) is not None:    # trained with other runs' clients (together.py)
            calls = [(ks, lambda ks=ks: stacker.train(together.Request(
                ctx, rnd, ks, [plans[k] for k in ks], size, need["total"], stack_key(ctx, ks[0], plans[ks[0]]),
                lambda items: train_items(items), chunk_size)))]
        else:
            calls = [(c, lambda c=c: _train_chunk(ctx, rnd, c, [plans[k] for k in c]))
                     for c in (ks[i:i + size] for i in range(0, len(ks), size))]
        for chunk, call in calls:
            try:
                outs = call()
            except NotBatchable:
                if cfg.engine == "batched":
                    raise
                singles += chunk
                continue
            for k, (state, stats) in zip(chunk, outs):
                on_trained(k, state, stats)
            del outs
    _train_singles(ctx, rnd, singles, plans, on_trained)


def _train_singles(ctx: Context, rnd: int, singles: list[int], plans: dict, on_trained) -> None:
    """The per-client path, as Algorithm.client_update runs it: client by client, or, on a CPU run with more than
    one thread and at least two such clients, at one thread a client (`forked.train_each`): side by side in forked
    processes where the round's work pays a fork, here one after another otherwise; `on_trained` in order either way.
    A state trained in this process is its module's own: cloned when it must outlive the next client's training."""
    forked.train_each(lambda k: train_one(ctx, k, rnd, plans[k]), singles, lambda k: _work_seconds(ctx, k, plans[k]),
                      forked.client_procs(ctx.device, len(singles)), lambda k, r: on_trained(k, *r),
                      keep=lambda r: ({n: t.detach().clone() for n, t in r[0].items()}, r[1]))


def _work_seconds(ctx: Context, k: int, plan: Plan) -> float:
    """Client k's training under `plan` at one thread, estimated (`forked.work_seconds`)."""
    n, B, spec = len(plan_rows(ctx, k, plan)), ctx.cfg.batch_size, ctx.data.spec
    epochs = plan.settings(ctx.cfg)[0]
    steps = math.ceil(n / B) * epochs if plan.steps is None else plan.steps
    flops = model_forward_flops(ctx.arch(k), spec.channels, spec.num_classes, spec.size)
    return forked.work_seconds(steps, min(B, n), flops)


def stack_key(ctx: Context, k: int, plan: Plan) -> tuple:
    """Groups of several runs with equal keys train in one call (core/engines/together.py): their configs equal but for seeds
    and data (`together.config_signature`), their plans the same loss code (each run's algorithm instance binds its
    own; merging requires its hyperparameters equal), trainable set, epochs and learning rate, their data tensors the
    same shape, dtype and device."""
    gk = list(group_key(ctx, k, plan))
    gk[1] = getattr(gk[1], "__func__", gk[1])     # the loss's code
    gk[5] = None                                  # purpose: a seed stream, per client
    gk[10] = getattr(gk[10], "__func__", gk[10])  # the custom step's code
    x = ctx.data.x
    return (together.config_signature(ctx.cfg), tuple(gk), str(x.device), x.dtype, tuple(x.shape[1:]),
            *plan.settings(ctx.cfg))


def _train_chunk(ctx: Context, rnd: int, ks: list[int], plans: list[Plan]):
    return train_items([(ctx, rnd, k, p) for k, p in zip(ks, plans)])


def train_items(items: list[tuple]) -> list:
    """`local_train_many` of (ctx, rnd, k, plan) items: one run's chunk, or clients of several runs whose plans
    merge (`stack_key`: the first item's model, loss term and settings are every item's). Each client keeps
    its own seed, start, rows and aux; rows of runs with different data tensors are gathered into one."""
    ctx, rnd, k0, p0 = items[0]
    c = ctx.cfg
    if len({id(it[0].data.x) for it in items}) == 1:
        x, y, index = ctx.data.x, ctx.data.y, [plan_rows(ctx, k, p) for _, _, k, p in items]
    else:
        rows = [plan_rows(it[0], it[2], it[3]) for it in items]
        x = torch.cat([it[0].data.x[r] for it, r in zip(items, rows)])
        y = torch.cat([it[0].data.y[r] for it, r in zip(items, rows)])
        ends = np.cumsum([0] + [len(r) for r in rows])
        index = [torch.arange(a, b, device=x.device) for a, b in zip(ends[:-1], ends[1:])]
    return local_train_many(
        ctx.model(k0), [p.start for *_, p in items], x, y, index,
        epochs=p0.settings(c)[0], batch_size=c.batch_size, lr=p0.settings(c)[1], momentum=c.momentum, weight_decay=c.weight_decay, bias_decay=c.bias_decay,
        grad_clip=c.grad_clip, loss=p0.loss, trainable=p0.trainable,
        seeds=[derive_seed(it.cfg.seed, r, k, p.purpose) for it, r, k, p in items], steps=[p.steps for *_, p in items],
        aux=[p.aux for *_, p in items], per_sample=[p.sample_rows() for *_, p in items], shuffle=p0.shuffle,
        update=p0.update, update_state=[p.update_state for *_, p in items])


def plan_rows(ctx: Context, k: int, plan: Plan) -> torch.Tensor:
    """The rows of the run's data tensors that client k's `plan` trains on (`Plan.rows` of its training data)."""
    return plan.take(ctx.data.train[k])
