"""System cost of a method, measured (pFedSD Tables 10 and 11).

`measure(cfg)` runs a config through the one round loop with the algorithm wrapped by
`Instrumented`, which records per client update: compute seconds, FLOPs of local training
(torch's FLOP counter, forward + backward), bytes down and up; and per round the server's
aggregation seconds. FLOPs are counted in a round of their own (counting slows execution), so
the timings are clean. `runtime_model` turns the measurements into Table 10's split with a stated
network model; nothing is estimated that could be measured.

Units, as the paper's numbers imply (docs/fidelity.md): pFedSD's Table 11 "MB" equal millions of
*parameters* exchanged (FedAvg 2.15 = 2 x 1,075,044 parameters of its CIFAR-100 CNN), and its
"FLOPs" are pytorch-OpCounter multiply-accumulates: 3 x forward MACs per training sample. We
report bytes (float32 as sent) and torch-counted FLOPs, plus the paper's units beside them.
"""
from __future__ import annotations

import time

import numpy as np
import pandas as pd
import torch

from ..algorithms import ALGORITHMS
from ..core.loop import run_rounds
from ..federation.build import build_context, resolve_device
from ..federation.config import RunConfig
from .provenance import model_flops


class Instrumented:
    """Transparent wrapper: the round loop sees the algorithm, we see every call. Updates of rounds
    in `count_rounds` are FLOP-counted (and not timed: counting slows execution)."""

    uses_plans = False   # it times each client_update call: clients train one by one

    def __init__(self, algo, count_rounds=()):
        self._algo = algo
        self._count = set(count_rounds)
        self.updates: list[dict] = []
        self.server: list[dict] = []

    def __getattr__(self, name):
        return getattr(self._algo, name)

    def client_update(self, rnd, k, server, cstate):
        flops, secs = None, float("nan")
        if rnd in self._count:
            from torch.utils.flop_counter import FlopCounterMode
            with FlopCounterMode(display=False) as fc:
                up, new = self._algo.client_update(rnd, k, server, cstate)
            flops = int(fc.get_total_flops())
        else:
            _sync(self._algo.ctx.device)
            t = time.perf_counter()
            up, new = self._algo.client_update(rnd, k, server, cstate)
            _sync(self._algo.ctx.device)
            secs = time.perf_counter() - t
        self.updates.append({"round": rnd, "client": k, "seconds": secs, "flops": flops,
                             "bytes_down": up.bytes_down, "bytes_up": up.bytes_up, "samples": up.samples})
        return up, new

    def aggregate(self, rnd, server, updates, clients):
        _sync(self._algo.ctx.device)
        t = time.perf_counter()
        out = self._algo.aggregate(rnd, server, updates, clients)
        _sync(self._algo.ctx.device)
        self.server.append({"round": rnd, "seconds": time.perf_counter() - t})
        return out


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(cfg: RunConfig) -> dict:
    """Cost per client and per round of `cfg`'s method: round 1 warms up (and gives pFedSD's clients
    their first v_k, FedFomo's clients their first uploads), rounds 2..R are timed (R = cfg.rounds), round
    R+1 is FLOP-counted; bytes are the mean over rounds 2..R+1.
    Evaluation, which the paper's timing excludes, runs once at the end."""
    R = max(cfg.rounds, 2)
    c = cfg.replace(rounds=R + 1, eval_every=R + 1, engine="per_client")  # time clients one by one
    ctx = build_context(c, resolve_device(c.device))
    algo = Instrumented(ALGORITHMS[c.algorithm](ctx, **c.hparams), count_rounds={R + 1})
    run_rounds(ctx, algo, progress=False)
    up = pd.DataFrame(algo.updates)
    timed, counted = up[(up["round"] > 1) & (up["round"] <= R)], up[up["round"] == R + 1]
    sv = pd.DataFrame(algo.server)
    sv = sv[(sv["round"] > 1) & (sv["round"] <= R)]
    steady = up[up["round"] > 1]   # round 1 warms up for bytes too: FedFomo has nothing to download yet
    per_client_bytes = float((steady.bytes_down + steady.bytes_up).mean())
    return {
        "algorithm": cfg.algorithm, "dataset": cfg.dataset, "model": cfg.model,
        "clients_per_round": float(timed.groupby("round").size().mean()),
        "client_seconds_mean": float(timed.seconds.mean()),
        "client_seconds_max_per_round": float(timed.groupby("round").seconds.max().mean()),
        "client_seconds_sum_per_round": float(timed.groupby("round").seconds.sum().mean()),
        "server_seconds": float(sv.seconds.mean()),
        "bytes_per_client": per_client_bytes, "mb_per_client": per_client_bytes / 1e6,
        "mparams_per_client": per_client_bytes / 4 / 1e6,  # the paper's "MB" (float32 -> elements)
        "gflops_per_client": float(counted.flops.mean()) / 1e9,
        "gmacs_per_client": float(counted.flops.mean()) / 2e9,  # the paper's (OpCounter) unit
        "samples_per_client": float(counted.samples.mean()),
        "forward_macs_per_sample": None if (f := model_flops(ctx)) is None else f // 2,
        "model_params": sum(p.numel() for p in ctx.make_model(0).parameters()),
    }




def runtime_model(costs: pd.DataFrame, bandwidth_mbps: float, parallel_clients: bool = True) -> pd.DataFrame:
    """Table 10's split of a round's time. Communication = bytes each client sends and receives over
    its own link of `bandwidth_mbps` (megabit/s); clients train in parallel on identical devices
    (round time = slowest client's comm + compute, plus the server), or one after another."""
    t = costs.copy()
    comm = t["bytes_per_client"] * 8 / (bandwidth_mbps * 1e6)
    if parallel_clients:
        client = t["client_seconds_max_per_round"]
        comm_total = comm
    else:
        client = t["client_seconds_sum_per_round"]
        comm_total = comm * t["clients_per_round"]
    total = comm_total + client + t["server_seconds"]
    t["time_s"] = total
    t["comm_pct"] = 100 * comm_total / total
    t["client_pct"] = 100 * client / total
    t["server_pct"] = 100 * t["server_seconds"] / total
    return t


def ratio_to(df: pd.DataFrame, col: str, ref: str = "fedavg", key: str = "method") -> np.ndarray:
    """df[col] / df[col] of the reference method (the paper's "+6.7%" style comparisons)."""
    base = float(df.loc[df[key] == ref, col].iloc[0])
    return (df[col] / base).to_numpy()
