"""The one round loop: sample, local updates, aggregate, evaluate, log, checkpoint.

Nothing else in the code base loops over rounds. An algorithm (`pflrepro.algorithms.base.Algorithm`)
only says what differs from FedAvg: the loss term it feeds `Context.train`, which parameters are
trainable, what it keeps per client, what it uploads and how the server aggregates.

State is explicit and made of tensors only, so a checkpoint is a plain `torch.save` of
{round, server, clients, history} that `torch.load(weights_only=True)` reads back:
- server state: dict[str, Tensor | dict] (e.g. {"params": global state_dict})
- client state: dict[int, dict[str, Tensor | dict]] (personal models, teachers, ...)
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ..settings import RunSettings
from .aggregation import state_bytes
from .clock import Clock, model_forward_flops
from .context import Context
from .engines import check_memory, local_round
from .schedule import make_schedule
from .training import accuracy, predict

_ARCHITECTURES = "pflrepro.data.models."   # the package whose modules' forward reads nothing but their state_dict
# A fingerprint (sha256 of the weights: about 2 GB/s here) is taken only where it costs under a quarter of the
# scoring it may save (a forward pass at about 30 GFLOP/s): bytes < forward FLOPs x test images / 60 (measured
# 2026-11-28 on this 2-core machine: sha256 of 8 MB 4.0 ms; cnn1 scoring 60 images 8.5 ms, the LeNet 2.4 ms)
_HASH_BYTES_PER_FLOP = 1 / 60


def _fingerprint(state: dict) -> bytes:
    """Every tensor of a state (name, dtype, shape and bytes), hashed: equal fingerprints, equal weights."""
    h = hashlib.sha256()
    for name, t in state.items():
        t = t.detach()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).contiguous().view(torch.uint8).cpu().numpy().data)
    return h.digest()


def _scorer(ctx: Context):
    """accuracy(net, x, y) under a name for the images (a client id, or 'gm' for the global test set), reusing the
    score of the same name and the same weights from this or the previous evaluation: a model that has not changed
    since it was last scored (a personal model of a client not selected since, the global model on a client's test
    set when the personal model is the global one) is not scored again. Bit-identical by construction (the same
    module, weights and images give the same predictions); only modules of pflrepro's architectures, whose forward
    reads their state alone, are reused (an algorithm's wrapper module, e.g. APFL's mixture, is always scored), and
    only where the fingerprint is cheap beside the scoring (_HASH_BYTES_PER_FLOP)."""
    last, seen, flops = ctx.eval_scores, {}, ctx.forward_flops
    spec = ctx.data.spec

    def worth_it(k, state, n) -> bool:
        arch = ctx.arch(k if isinstance(k, int) else -1)
        if arch not in flops:
            flops[arch] = model_forward_flops(arch, spec.channels, spec.num_classes, spec.size)
        return sum(t.numel() * t.element_size() for t in state.values()) < flops[arch] * n * _HASH_BYTES_PER_FLOP

    def score(name, net, x, y) -> float:
        if not type(net).__module__.startswith(_ARCHITECTURES):
            return accuracy(net, x, y)
        state = net.state_dict()
        if not worth_it(name, state, len(y)):
            return accuracy(net, x, y)
        key = (name, _fingerprint(state))
        if key in seen or key in last:
            if len(y):
                net.eval()          # the state `accuracy` leaves the module in
            seen[key] = seen.get(key, last.get(key))
        else:
            seen[key] = accuracy(net, x, y)
        return seen[key]

    def done():
        ctx.eval_scores = seen      # what was scored this evaluation; the rest goes
    return score, done


def _hits(pred: torch.Tensor, y: torch.Tensor) -> float:
    """Accuracy from predictions, as `accuracy` computes it (NaN without images)."""
    return (pred == y).float().mean().item() if len(y) else float("nan")


def evaluate(ctx: Context, algo, server: dict, clients: dict) -> tuple[dict, list[float]]:
    """Evaluation protocol (docs/evaluation.md): GM on the global test set, every client's
    PM on its own local test set; plain and sample-weighted means, std across clients.

    Where the global test set is the clients' local tests (`FedData.test_offsets`: pooled train+test), the GM's
    predictions on it are made once and also give the GM's score on each client's local test (the PM of a generic
    method, of a client not trained yet, and PerFed-CKT's `eval_gm_local`): the same images in the same model, so
    the same predictions up to float rounding (on this CPU a batch of one image gave logits up to 5e-8 from the
    same image's in a larger batch: docs/evaluation.md, "Each model scored once")."""
    data, n_scored = ctx.data, ctx.data.n_clients - ctx.cfg.new_clients   # new clients (never trained) not scored
    score, done = _scorer(ctx)
    gm = algo.global_model(server)
    offsets, pred = data.test_offsets, None
    if gm is not None and offsets is not None:
        pred = predict(gm, data.x_test)
        gm_acc = _hits(pred, data.y_test)
    else:
        if gm is None:
            gm = algo.averaged_personal_model(server, clients)  # SCD Remark 4.1 (None if heterogeneous)
        gm_acc = score("gm", gm, data.x_test, data.y_test) if gm is not None else float("nan")

    def gm_on(k: int, net) -> float:      # the global model (`net`) on client k's local test
        if pred is not None:
            y = data.y_test[offsets[k]:offsets[k + 1]]   # client k's test labels (`pooled_tests` checked them)
            if len(y):
                net.eval()          # the state `accuracy` leaves the module in
            return _hits(pred[offsets[k]:offsets[k + 1]], y)
        return score(k, net, *data.client_test(k))

    accs = [float("nan")] * data.n_clients
    generic = []
    for k in range(n_scored):
        pm = algo.personal_model(k, server, clients.get(k))
        if pm is None:  # generic method: PM = GM on the local test set (Remark 4.1)
            generic.append(k)
            continue
        accs[k] = score(k, pm, *data.client_test(k))
    if generic:
        gm = algo.global_model(server)  # loaded once, after any personal model reused its module
        for k in generic:
            accs[k] = gm_on(k, gm)
    a = np.array(accs, dtype=np.float64)
    w = data.n_train().numpy()
    extra = {}
    if ctx.cfg.eval_gm_local:    # the global model on every client's local test (PerFed-CKT's "Ditto (GM)")
        gm = algo.global_model(server)
        extra["gm_local_acc_mean"] = float("nan") if gm is None else float(np.nanmean(
            [gm_on(k, gm) for k in range(n_scored)]))
    done()
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


def run_rounds(ctx: Context, algo, *, start: dict | None = None,
               on_checkpoint: Callable[[dict], None] | None = None, progress: bool = True,
               on_round: Callable[[int], None] | None = None) -> LoopResult:
    """THE round loop: sample, local updates, aggregate, evaluate, log, checkpoint (`on_round(rnd)` after
    every round: the run's heartbeat, pflrepro.pipeline.progress)."""
    cfg = ctx.cfg
    n_train = ctx.data.n_train().numpy()
    if start is None:
        server, clients, history, per_client, first = algo.server_init(), {}, [], [], 1
        counters = {"bytes_up": 0, "bytes_down": 0, "samples": 0}
    else:
        server, clients, history, per_client = start["server"], start["clients"], start["history"], start["per_client"]
        first, counters = int(start["round"]) + 1, dict(start["counters"])
    if cfg.engine != "per_client":
        check_memory(ctx, algo, first, server, clients)  # a run that cannot fit says so before round 1
    clock = ctx.clock = make_clock(ctx)
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
    spec = ctx.data.spec
    flops = model_forward_flops(ctx.cfg.model, spec.channels, spec.num_classes, spec.size)
    return Clock(ctx.cfg.clock, ctx.cfg.n_clients, ctx.cfg.seed, flops, state_bytes(ctx.init_state))


def _progress(cfg: RunSettings, first: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm
    return tqdm(total=cfg.rounds, initial=first - 1, desc=f"{cfg.algorithm}/{cfg.dataset} s{cfg.seed}",
                unit="round", leave=False, dynamic_ncols=True)
