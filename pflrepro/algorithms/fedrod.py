"""FedRoD (Chen & Chao, ICLR 2022, "On bridging generic and personalized federated learning for image
classification"), a baseline of SCD: the "two-loss, two-predictor" framework.

- Generic predictor: the shared body f and generic head g (the model), trained with the balanced
  softmax (BSM, Ren et al. 2020), CE(g(f(x)) + log pi_k) with pi_k client k's training label
  distribution, and averaged by the server like FedAvg. A class absent from k's data has pi = 0,
  i.e. logit -inf: it drops out of k's softmax, exactly the BSM formula (N_c weights the class).
- Personal predictor: generic logits + a personal linear head p_k on the same features,
  g(f(x)) + p_k(f(x)), trained with plain CE on k's data; p_k stays on the client. The personal
  loss sees the features and the generic logits detached, so it moves p_k only, and the BSM loss
  never reaches p_k: one primitive call on a module holding both heads (`RoD`) trains both in the
  same mini-batch steps, each from its own loss (as PFLlib's reimplementation does; the authors'
  repository holds no code).
- `pm_epochs` (SCD Table 4's "PM epochs", 3 or 5): extra epochs of personal-head-only training
  after the joint epochs (own seed stream, `purpose` 1). 0 = FedRoD's own procedure. `joint: false`
  trains the personal head only in those epochs (the generic steps then use the BSM loss alone).
GM = body + generic head on the global test set; PM = the personal predictor on local tests.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from ..core.aggregation import clone_state
from ..params import MAX_EPOCHS, Param
from .base import Algorithm


class RoD(nn.Module):
    """The model (body + generic head) and one client's personal head; calling it gives the
    personalized prediction (generic + personal logits)."""

    def __init__(self, net: nn.Module, phead: nn.Module):
        super().__init__()
        self.net, self.phead = net, phead

    def logits(self, x):
        """(generic logits, personalized logits with the generic part and the features detached)."""
        z = self.net.features(x)
        g = self.net.head(z)
        return g, g.detach() + self.phead(z.detach())

    def forward(self, x):
        z = self.net.features(x)
        return self.net.head(z) + self.phead(z)


def bsm_loss(logits: torch.Tensor, y: torch.Tensor, log_prior: torch.Tensor) -> torch.Tensor:
    """Balanced softmax: cross-entropy of logits + log(class prior) (absent classes: log 0 = -inf)."""
    return F.cross_entropy(logits + log_prior, y)


def rod_losses(pair: RoD, x, y, log_prior) -> tuple[torch.Tensor, torch.Tensor]:
    """(BSM loss of the generic predictor, CE of the personalized predictor) on one batch."""
    g, p = pair.logits(x)
    return bsm_loss(g, y, log_prior), F.cross_entropy(p, y)


class FedRoD(Algorithm):
    name = "fedrod"
    generic = False
    HPARAMS = {
        "pm_epochs": Param(int, 0, "extra epochs of personal-head-only training after the joint epochs "
                           "(SCD Table 4: 3 or 5; 0 = FedRoD)", low=0, high=MAX_EPOCHS),
        "joint": Param(bool, True, "train the personal head in the joint steps too (FedRoD); False: only in the "
                       "pm_epochs after the generic training (a PM phase of its own)"),
        "phead_init": Param(str, "init", "personal head's start: 'init' (the common initial head, as PFLlib) "
                            "or 'zeros' (PM = GM at first)", choices=("init", "zeros")),
    }

    def __init__(self, ctx, **hparams):
        super().__init__(ctx, **hparams)
        self._phead = copy.deepcopy(ctx.model(0).head)   # work buffer, loaded before each use

    def phead(self, cstate: dict | None) -> nn.Module:
        if cstate:
            state = cstate["phead"]
        else:
            init = {n[len("head."):]: t for n, t in self.ctx.init_state.items() if n.startswith("head.")}
            state = init if self.hp["phead_init"] == "init" else {n: torch.zeros_like(t) for n, t in init.items()}
        self._phead.load_state_dict(state)
        return self._phead

    def log_prior(self, k: int) -> torch.Tensor:
        y = self.ctx.data.client_train(k)[1]
        n = torch.bincount(y, minlength=self.ctx.data.spec.num_classes).float()
        return (n / n.sum().clamp_min(1)).log()

    def client_update(self, rnd, k, server, cstate):
        pair = RoD(self.ctx.model(k, server["params"]), self.phead(cstate))
        lp = self.log_prior(k)
        if self.hp["joint"]:
            stats = self.ctx.train(pair, k, rnd, loss=lambda m, x, y: sum(rod_losses(m, x, y, lp)))
        else:
            stats = self.ctx.train(pair, k, rnd, loss=lambda m, x, y: rod_losses(m, x, y, lp)[0],
                                   trainable=lambda n: n.startswith("net."))
        up = self.upload(k, pair.net, stats, server)              # body + generic head
        if self.hp["pm_epochs"]:
            more = self.ctx.train(pair, k, rnd, loss=lambda m, x, y: rod_losses(m, x, y, lp)[1], purpose=1,
                                  trainable=lambda n: n.startswith("phead."), epochs=self.hp["pm_epochs"])
            up.samples += more.samples
            up.overlap_samples = more.samples                     # a PM phase after the GM (pflrepro.core.clock)
        return up, {"phead": clone_state(pair.phead.state_dict())}

    def personal_model(self, k, server, cstate):
        return RoD(self.ctx.model(k, server["params"]), self.phead(cstate))
