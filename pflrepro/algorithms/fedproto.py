"""FedProto (Tan et al., AAAI 2022): federated prototype learning across heterogeneous clients.

Client k keeps its whole (possibly heterogeneous) model and minimises
    L = CE(F_k(x), y) + lambda * L_R(f_k(x), p_y)
where p_c are the global prototypes (no prototypes yet, round 1: CE only); then uploads its local
prototypes C_k^(c) = mean_{x in D_k^c} f_k(x) with the class counts.
Server: p_c = sum_k |D_k^c| C_k^(c) / sum_k |D_k^c| over the clients holding c (`weighting: count`;
`plain` = unweighted mean, the public code's `proto_aggregation`); a class absent from a round keeps
its last prototype.
Personal model: the client's own model and classifier (`inference: classifier`, what DC-PFL compares),
or nearest global prototype in representation space (`inference: prototype`, FedProto's code).
"""
from __future__ import annotations

import torch
from torch import nn

from ..core.aggregation import clone_state, plain_average, state_bytes
from ..params import Param
from .base import Algorithm, Update
from .fedgh import shared_head_init_states
from .stats import aligned_ce, carry_targets, class_stats, features, pool_means, targets_bytes


class NearestPrototype(nn.Module):
    """Logits = -||f(x) - p_c||^2 over the classes that have a global prototype (others -inf)."""

    def __init__(self, net: nn.Module, protos: torch.Tensor, has: torch.Tensor):
        super().__init__()
        self.net, self.protos, self.has = net, protos, has

    def forward(self, x):
        d2 = torch.cdist(self.net.features(x), self.protos.to(x.dtype)) ** 2
        return (-d2).masked_fill(~self.has, float("-inf"))


class FedProto(Algorithm):
    name = "fedproto"
    generic = False
    heterogeneous = True  # only prototypes are exchanged
    HPARAMS = {
        "lam": Param(float, 1.0, "lambda, weight of the prototype distance (code's --ld default 1)", low=0.0),
        "align": Param(str, "mse", "L_R: 'mse' ||.||^2 / d (code's nn.MSELoss), 'sq' ||.||^2, 'l2' ||.||",
                       choices=("mse", "sq", "l2")),
        "weighting": Param(str, "count", "prototype averaging: by class 'count', or 'plain' (code)",
                           choices=("count", "plain")),
        "inference": Param(str, "classifier", "personal model's prediction: 'classifier' or nearest "
                           "global 'prototype'", choices=("classifier", "prototype")),
    }

    def __init__(self, ctx, **hparams):
        super().__init__(ctx, **hparams)
        self.init = shared_head_init_states(ctx, "fedproto: prototypes need one representation size")

    def server_init(self):
        C, d = self.init[self.ctx.arch(0)]["head.weight"].shape
        dev = self.ctx.device
        return {"protos": torch.zeros(C, d, device=dev), "has_proto": torch.zeros(C, dtype=torch.bool, device=dev)}

    def params(self, k, cstate):
        return cstate["params"] if cstate else self.init[self.ctx.arch(k)]

    # ---- client side
    def loss(self, rnd, k, server, cstate):
        return aligned_ce(self.hp["lam"], server["protos"], server["has_proto"], self.hp["align"])

    def client_update(self, rnd, k, server, cstate):
        net = self.ctx.model(k, self.params(k, cstate))
        stats = self.ctx.train(net, k, rnd, loss=self.loss(rnd, k, server, cstate))
        x, y = self.ctx.data.client_train(k)
        sent = class_stats(features(net, x), y, cov=False)
        down = targets_bytes(server["protos"], server["has_proto"])
        up = Update(weight=float(len(y)), payload=sent, loss=stats.loss, samples=stats.samples,
                    bytes_up=state_bytes(sent), bytes_down=down)
        return up, {"params": clone_state(net.state_dict())}

    # ---- server side
    def aggregate(self, rnd, server, updates, clients):
        n, p = pool_means([u.payload for u in updates], server["protos"].shape[0],
                          weighted=self.hp["weighting"] == "count")
        protos, has = carry_targets(server["protos"], server["has_proto"], n, p)
        return {"protos": protos, "has_proto": has}

    # ---- evaluation
    def global_model(self, server):
        return None

    def personal_model(self, k, server, cstate):
        net = self.ctx.model(k, self.params(k, cstate))
        if self.hp["inference"] == "prototype" and bool(server["has_proto"].any()):
            return NearestPrototype(net, server["protos"], server["has_proto"])
        return net

    def averaged_personal_model(self, server, clients):
        """Homogeneous runs: plain average of the personal models (SCD Remark 4.1); heterogeneous: None."""
        if len({self.ctx.arch(k) for k in range(self.ctx.cfg.n_clients)}) > 1:
            return None
        states = [c["params"] for c in clients.values() if c]
        return self.ctx.model(0, plain_average(states)) if states else None
