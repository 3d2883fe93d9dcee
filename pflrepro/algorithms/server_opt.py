"""Generic-FL baselines that change the server step (and, for FedDyn, the local objective).

FedAvgM (Hsu, Qi & Brown 2019): FedAvg's sample-weighted mean, then server momentum on the pseudo-gradient
    Delta = w^t - avg_k(w_k);  v <- beta v + Delta;  w^{t+1} = w^t - server_lr * v
(the paper's w <- w - v is server_lr = 1). The momentum buffer v is server state.

FedDyn (Acar et al., ICLR 2021), Algorithm 1: client k keeps grad L_k (init 0) and minimises
    L_k(theta) - <grad L_k^{t-1}, theta> + alpha/2 ||theta - theta^{t-1}||^2
from theta^{t-1}; then grad L_k^t = grad L_k^{t-1} - alpha (theta_k^t - theta^{t-1}). Server:
    h^t = h^{t-1} - alpha/m sum_{k in P_t} (theta_k^t - theta^{t-1})   (m: all clients)
    theta^t = mean_{k in P_t} theta_k^t - h^t / alpha                  (plain mean)
The loss term writes the linear part as -<grad L_k, theta - theta^{t-1}> (same gradient, a constant off,
so the reported loss stays near CE).

Both act on the model's parameters; buffers (BN running statistics, counters) take the plain average,
as running statistics are not optimised by gradients (momentum or the h-correction could push a
running variance below zero).
"""
from __future__ import annotations

import torch

from ..core.aggregation import plain_average
from ..core.training import batchable, ce_loss
from ..params import Param
from .base import Algorithm


def param_names(ctx) -> list[str]:
    """Names of the (global) model's parameters, in `named_parameters` order (no buffers)."""
    return [n for n, _ in ctx.model(-1).named_parameters()]


def zeros_like_params(ctx, state: dict) -> dict:
    return {n: torch.zeros_like(state[n]) for n in param_names(ctx)}


class FedAvgM(Algorithm):
    name = "fedavgm"
    HPARAMS = {
        "beta": Param(float, 0.9, "server momentum beta (Hsu et al. sweep beta; 0.9 the usual value)", low=0.0,
                      high=1.0),
        "server_lr": Param(float, 1.0, "server step size (paper: w <- w - v, i.e. 1)", low=0.0, low_open=True),
    }

    def server_init(self):
        s = super().server_init()
        return {**s, "momentum": zeros_like_params(self.ctx, s["params"])}

    def aggregate(self, rnd, server, updates, clients):
        avg = super().aggregate(rnd, server, updates, clients)["params"]   # FedAvg's weighted mean
        w, beta, lr = server["params"], self.hp["beta"], self.hp["server_lr"]
        v = {n: beta * b + (w[n] - avg[n]) for n, b in server["momentum"].items()}
        return {**server, "params": {**avg, **{n: w[n] - lr * v[n] for n in v}}, "momentum": v}


class FedDyn(Algorithm):
    name = "feddyn"
    weighted = False   # Algorithm 1: theta^t = (1/|P_t|) sum theta_k^t - h^t / alpha
    HPARAMS = {"alpha": Param(float, 0.01, "alpha (FedDyn code's example: alpha_coef = 1e-2)", low=0.0,
                              low_open=True)}

    def server_init(self):
        s = super().server_init()
        return {**s, "h": zeros_like_params(self.ctx, s["params"])}

    def loss(self, rnd, k, server, cstate):
        return self.dyn_loss

    def aux(self, rnd, k, server, cstate):
        theta = server["params"]
        grad = cstate["grad"] if cstate else zeros_like_params(self.ctx, theta)
        return {"anchor": {n: theta[n].detach() for n in grad}, "grad": grad}

    @batchable
    def dyn_loss(self, m, x, y, aux):
        a, g = aux["anchor"], aux["grad"]
        lin = sum((g[n] * (p - a[n])).sum() for n, p in m.params.items())
        quad = sum(((p - a[n]) ** 2).sum() for n, p in m.params.items())
        return ce_loss(m, x, y) - lin + 0.5 * self.hp["alpha"] * quad

    def finish(self, rnd, k, server, cstate, state, stats):
        up = self.upload(k, state, stats, server)
        theta, a = server["params"], self.hp["alpha"]
        old = cstate["grad"] if cstate else zeros_like_params(self.ctx, theta)
        return up, {"grad": {n: g - a * (up.payload[n] - theta[n]) for n, g in old.items()}}

    def aggregate(self, rnd, server, updates, clients):
        theta, a, m = server["params"], self.hp["alpha"], self.ctx.data.n_clients
        mean = plain_average([u.payload for u in updates])
        h = {n: hn - a / m * sum(u.payload[n] - theta[n] for u in updates) for n, hn in server["h"].items()}
        return {**server, "params": {**theta, **mean, **{n: mean[n] - h[n] / a for n in h}}, "h": h}
