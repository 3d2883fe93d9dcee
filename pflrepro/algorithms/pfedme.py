"""pFedMe (Dinh, Tran & Nguyen, NeurIPS 2020): personalized FL with Moreau envelopes.

Client i minimises the Moreau envelope F_i(w) = min_theta f_i(theta) + lambda/2 ||theta - w||^2.
Algorithm 1, per local step r on a batch D_i:
  - inner problem h_i: theta_hat = argmin_theta f_i(theta; D_i) + lambda/2 ||theta - w_{i,r}||^2,
    solved approximately by K gradient steps of size `personal_lr` (the code's `pFedMeOptimizer`);
  - local update: w_{i,r+1} = w_{i,r} - eta * lambda (w_{i,r} - theta_hat),
    a step along grad F_i(w) = lambda (w - theta_hat(w)).
The outer step goes through the engine's primitive: the loss term is lambda/2 ||w - theta_hat.detach()||^2,
whose gradient w.r.t. w is lambda (w - theta_hat); theta_hat is computed inside the loss on a second module
(warm-started from the previous step's theta_hat, as the code does; `inner_init: w` restarts it from w).
The outer optimiser is the run's SGD (lr = eta, momentum, weight decay): pFedSD trains "all methods" with
SGD momentum 0.9 and weight decay 1e-5; momentum = weight_decay = 0 gives Algorithm 1's step exactly.
Server (Algorithm 1): w^{t+1} = (1 - beta) w^t + beta * mean_{i in S^t} w_i (plain mean, as printed).
Personalized model (evaluated): the last theta_hat of the client's last round (the code's
`persionalized_model_bar`). Reported training loss: the CE of theta on the batches (the code's
personalized training loss), not the value of the proximal term.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..core.aggregation import clone_state
from ..params import MAX_EPOCHS, MAX_STEPS, Param
from .base import Algorithm


class PFedMe(Algorithm):
    name = "pfedme"
    generic = False
    weighted = False  # Algorithm 1: beta/S * sum_i w_i (the code weights by n_i; equal on balanced splits)
    HPARAMS = {
        "lam": Param(float, 15.0, "lambda, Moreau-envelope regularisation (pFedSD grid [15, 20, 30])", low=0.0,
                     low_open=True),
        "K": Param(int, 5, "gradient steps on the inner problem per local step (pFedMe: K = 5)", low=1, high=MAX_EPOCHS),
        "personal_lr": Param(float, 0.01, "inner step size (pFedMe README, CNN on CIFAR-10: 0.01)", low=0.0,
                             low_open=True),
        "beta": Param(float, 1.0, "server mixing beta (pFedMe code default and comparison runs: 1)", low=0.0,
                      low_open=True),
        "mu": Param(float, 0.0, "L2 on theta inside the inner problem (paper: none; pFedMe code: 0.001)", low=0.0),
        "R": Param(int, 0, "local steps: 0 = E epochs of mini-batches (pFedSD: E = 5); R > 0 = R mini-batches, "
                   "as pFedMe's code (R = 20)", low=0, high=MAX_STEPS),
        "inner_init": Param(str, "warm", "inner solve starts from the previous theta_hat ('warm', code) or "
                            "from the current w ('w')", choices=("warm", "w")),
    }

    @classmethod
    def relative_cost(cls, hparams):
        return float(hparams.get("K", cls.HPARAMS["K"].default))  # K inner passes per batch

    def client_update(self, rnd, k, server, cstate):
        net = self.ctx.model(k, server["params"])
        theta = self.ctx.make_model(k).to(self.ctx.device)   # the personalized model, theta = w^t at start
        theta.load_state_dict(server["params"])
        theta.train()
        stats = self.ctx.train(net, k, rnd, loss=self.moreau_loss(theta), steps=self.hp["R"] or None)
        # net never runs a forward pass: its buffers (BN statistics) are theta's, as in the code
        net.load_state_dict({**net.state_dict(), **dict(theta.named_buffers())})
        up = self.upload(k, net, stats, server)
        up.samples = stats.samples * self.hp["K"]          # every sample goes through K inner steps
        return up, {"params": clone_state(theta.state_dict())}

    def moreau_loss(self, theta: nn.Module):
        """Loss term for w: value = CE of theta on the batch, gradient = lambda (w - theta_hat)."""
        lam, K, plr, mu = self.hp["lam"], self.hp["K"], self.hp["personal_lr"], self.hp["mu"]
        tp = dict(theta.named_parameters())
        ps = list(tp.values())

        def loss(net, xb, yb):
            w = [p.detach() for p in net.parameters()]
            if self.hp["inner_init"] == "w":
                with torch.no_grad():
                    torch._foreach_copy_(ps, w)
            for _ in range(K):  # inner problem h_i: gradient steps on f(theta; batch) + lambda/2 ||theta - w||^2
                ce = F.cross_entropy(theta(xb), yb)
                grads = torch.autograd.grad(ce, ps)
                with torch.no_grad():   # theta -= plr * (g + lam (theta - w) + mu theta), every tensor at once
                    d = torch._foreach_sub(ps, w)
                    torch._foreach_mul_(d, lam)
                    torch._foreach_add_(d, grads)
                    if mu:
                        torch._foreach_add_(d, torch._foreach_mul(ps, mu))
                    torch._foreach_mul_(d, plr)
                    torch._foreach_sub_(ps, d)
            prox = 0.5 * lam * sum(((p - tp[n].detach()) ** 2).sum() for n, p in net.named_parameters())
            return prox - prox.detach() + ce.detach()  # d/dw = lambda (w - theta_hat): the local update
        return loss

    def aggregate(self, rnd, server, updates, clients):
        mean = super().aggregate(rnd, server, updates, clients)["params"]
        b, old = self.hp["beta"], server["params"]
        mixed = {n: ((1 - b) * old[n] + b * t).to(t.dtype) if torch.is_floating_point(t) else t
                 for n, t in mean.items()}
        return {**server, "params": mixed}

    def personal_model(self, k, server, cstate):
        # theta_k; a client never selected has none and is scored with the global model w
        return self.ctx.model(k, cstate["params"]) if cstate else None
