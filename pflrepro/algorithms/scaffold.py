"""SCAFFOLD (Karimireddy et al., ICML 2020): stochastic controlled averaging, Algorithm 1 with option II.

Server state: model x and control variate c; client state: c_k (both init 0). Client k, from y = x:
    y <- y - lr (g_k(y) + c - c_k)                 (K local steps)
which is SGD on the loss term CE(y) + <c - c_k, y - x> (gradient g + c - c_k; the constant -<., x>
keeps the reported loss near CE). The correction is part of the gradient, so the run's optimiser sees
it before its momentum and weight decay (momentum = weight_decay = 0 gives Algorithm 1's step exactly).
Option II: c_k+ = c_k - c + (x - y_k) / (K lr), K = the local steps actually taken, lr = the client lr.
With momentum mu, (x - y_k) / (K lr) overestimates the mean corrected gradient by up to 1/(1 - mu), and
the estimate feeds back into the next round's correction: with mu = 0.9 the control variates grow round
after round. `cv_lr: effective` divides by K lr / (1 - mu) instead (not in the paper; default `lr`).
Client sends (Delta y, Delta c) = (y_k - x, c_k+ - c_k): twice a model up, and receives (x, c): twice down.
Server: x <- x + lr_g * mean(Delta y);  c <- c + (|S|/N) * mean(Delta c)  (plain means over S; N all clients).
Control variates cover the parameters; buffers (BN statistics) take the plain mean of the clients'.
"""
from __future__ import annotations

from ..core.aggregation import clone_state, plain_average, state_bytes
from ..core.training import batchable, ce_loss
from ..params import Param
from .base import Algorithm, Update
from .server_opt import zeros_like_params
from .simple import HeadFT


class Scaffold(Algorithm):
    name = "scaffold"
    weighted = False   # Algorithm 1: (1/|S|) sum over S
    HPARAMS = {"server_lr": Param(float, 1.0, "global step size eta_g (1: FedAvg's server step; FedDyn's "
                                  "SCAFFOLD code: global_learning_rate=1)", low=0.0, low_open=True),
               "cv_lr": Param(str, "lr", "option II's step: 'lr' (Algorithm 1: (x - y) / (K lr)) or 'effective' "
                              "(K lr / (1 - momentum), for runs with client momentum)", choices=("lr", "effective"))}

    def server_init(self):
        s = super().server_init()
        return {**s, "c": zeros_like_params(self.ctx, s["params"])}

    def loss(self, rnd, k, server, cstate):
        return self.corrected

    def aux(self, rnd, k, server, cstate):
        c = server["c"]
        ck = cstate["c"] if cstate else None
        return {"anchor": {n: server["params"][n].detach() for n in c},
                "corr": {n: c[n] - ck[n] for n in c} if ck is not None else dict(c)}

    @batchable
    def corrected(self, m, x, y, aux):
        a, d = aux["anchor"], aux["corr"]
        return ce_loss(m, x, y) + sum((d[n] * (p - a[n])).sum() for n, p in m.params.items())

    def finish(self, rnd, k, server, cstate, state, stats):
        x, c = server["params"], server["c"]
        ck = cstate["c"] if cstate else zeros_like_params(self.ctx, x)
        y = clone_state(state)
        if stats.steps > 0:   # option II
            lr = self.ctx.cfg.lr / ((1.0 - self.ctx.cfg.momentum) if self.hp["cv_lr"] == "effective" else 1.0)
            s = 1.0 / (stats.steps * lr)
            new = {n: ck[n] - c[n] + s * (x[n] - y[n]) for n in c}
        else:                 # no local data: nothing learnt, c_k kept
            new = {n: t.clone() for n, t in ck.items()}
        dc = {n: new[n] - ck[n] for n in c}
        up = Update(weight=float(len(self.ctx.data.train[k])), payload={"y": y, "dc": dc}, loss=stats.loss,
                    samples=stats.samples, bytes_up=state_bytes(y) + state_bytes(dc),
                    bytes_down=state_bytes(x) + state_bytes(c))
        return up, {"c": new}

    def aggregate(self, rnd, server, updates, clients):
        x, c, lr_g, N = server["params"], server["c"], self.hp["server_lr"], self.ctx.data.n_clients
        mean = plain_average([u.payload["y"] for u in updates])          # x + mean(Delta y)
        params = {**x, **mean, **{n: x[n] + lr_g * (mean[n] - x[n]) for n in c}}
        c_new = {n: c[n] + sum(u.payload["dc"][n] for u in updates) / N for n in c}
        return {**server, "params": params, "c": c_new}


class ScaffoldFT(HeadFT, Scaffold):
    """SCAFFOLD+FT (FedBSD Table 1): SCAFFOLD, its head fine-tuned per client at evaluation (HeadFT)."""
    name = "scaffold_ft"
    HPARAMS = {**Scaffold.HPARAMS, **HeadFT.FT_HPARAMS}
