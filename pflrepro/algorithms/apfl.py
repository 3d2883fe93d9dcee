"""APFL (Deng, Kamani and Mahdavi 2020, "Adaptive personalized federated learning"), a baseline of FedBSD's
Table 1 (FedRep's numbers).

Client i keeps a personal model v_i and a mixing weight alpha_i; its personalized model is the mixture of
parameters v_bar_i = alpha_i v_i + (1 - alpha_i) w. Each local step on a batch (Algorithm 1):
    w     <- w     - eta grad f_i(w)                       (the local copy of the global model, uploaded)
    v_i   <- v_i   - eta grad_v f_i(v_bar_i)                = alpha_i grad f_i(v_bar_i)
    alpha <- alpha - eta grad_alpha f_i(v_bar_i)            = <v_i - w, grad f_i(v_bar_i)>   (adaptive APFL)
Ours does the three in one step of the training primitive: the loss CE(w(x)) + CE(v_bar(x)), with w held
constant inside v_bar, gives exactly these gradients (alpha clipped to [0, 1] in the mixture, as the common
implementations clip it). The server averages w by n_i. Unstated by FedBSD: alpha's start 0.25 (one of APFL's
reported values) and adaptive alpha on; the optimiser's momentum and weight decay act on all three.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from ..core.aggregation import clone_state
from ..core.training import TrainStats
from ..params import Param
from .base import Algorithm


class Mixture(nn.Module):
    """w, v and alpha as one module, so one call of the primitive takes APFL's step on all three."""

    def __init__(self, w: nn.Module, v: nn.Module, alpha: float):
        super().__init__()
        self.w, self.v = w, v
        self.alpha = nn.Parameter(torch.tensor(float(alpha)))

    def mixed(self, detach_w: bool = True) -> dict:
        a = self.alpha.clamp(0.0, 1.0)
        w = dict(self.w.named_parameters())
        return {n: a * p + (1 - a) * (w[n].detach() if detach_w else w[n]) for n, p in self.v.named_parameters()}

    def personal(self, x):
        return torch.func.functional_call(self.v, {**self.mixed(), **dict(self.v.named_buffers())}, (x,))


def apfl_loss(m: Mixture, x, y):
    return F.cross_entropy(m.w(x), y) + F.cross_entropy(m.personal(x), y)


class APFL(Algorithm):
    name = "apfl"
    generic = False
    HPARAMS = {"alpha": Param(float, 0.25, "mixing weight alpha's start (APFL reports 0.25, 0.5, 0.75)", low=0.0, high=1.0),
               "adaptive": Param(bool, True, "learn alpha (adaptive APFL, Algorithm 1); False: alpha fixed")}

    @classmethod
    def relative_cost(cls, hparams):
        return 2.0   # two forward-backward passes a step

    def client_update(self, rnd, k, server, cstate):
        own = cstate or {"v": self.ctx.initial(k), "alpha": torch.tensor(self.hp["alpha"])}
        v = copy.deepcopy(self.ctx.model(k, own["v"]))           # ctx.model reuses one module per architecture
        pair = Mixture(self.ctx.model(k, server["params"]), v, float(own["alpha"]))
        fixed = None if self.hp["adaptive"] else (lambda n: n != "alpha")
        stats: TrainStats = self.ctx.train(pair, k, rnd, loss=apfl_loss, trainable=fixed)
        alpha = pair.alpha.detach().clamp(0.0, 1.0).clone()
        up = self.upload(k, pair.w, stats, server)
        return up, {"v": clone_state(pair.v.state_dict()), "alpha": alpha}

    def personal_model(self, k, server, cstate):
        if not cstate:
            return self.ctx.model(k, server["params"])        # alpha v + (1 - alpha) w before v exists: w
        a, w = float(cstate["alpha"]), server["params"]
        return self.ctx.model(k, {n: a * t + (1 - a) * w[n] if t.is_floating_point() else t
                                  for n, t in cstate["v"].items()})
