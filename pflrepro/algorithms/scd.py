"""Spectral co-distillation (Chen, Yang, Quek, Chong, NeurIPS 2023), Algorithm 1.

PFL+: every client keeps a personalized model w_p (PM) beside the shared generic model w_G (GM).
Per round, client i
  GMUPDATE: from the latest global model, E_G epochs on
      L^G = CE(w_G) + lambda_G * D( s_hat(w_G) || s_hat(w_p^{t-1}) )            (eq. 5, truncated, tau)
    and uploads the result w_G,i^t;
  PMUPDATE: from its previous PM, E_p epochs on
      L^p = CE(w_p) + lambda_p * D( s(w_p) || s(w_G,i^t) )                     (eq. 4, full spectrum)
The server averages the uploaded GMs as FedAvg (Sec. 3.1: p_i = n_i / sum n_k).
s = |DFT| of the weight vector, D(p || q) = sum p log p - p log q (pflrepro.algorithms.spectral). The second
argument of each D is the teacher: computed once per phase from a fixed model, detached; the first is
the model being trained, differentiable through torch.fft.

Structurally this is Ditto's round (GM first, then PM; `Ditto.personal_plan`) with both loss terms
replaced. The protocol (compute-and-wait or wait-free, Sec. 3.4) changes only when the PM trains, which
the run's simulated clock accounts for (`clock: {protocol: wait_free}`, pflrepro.core.clock).
`code_prox` adds the authors' code's un-squared proximal term to the PM loss (the paper does not mention it;
the code's spectral terms carry no gradient, so in the code this term is the only link from PM to GM).
Ablations (Table 5): lambda_G = 0 is "w/o SCD-GM" (the GM step is then exactly FedAvg's), lambda_p = 0
is "w/o SCD-PM" (PM trained on CE alone); tau = 0 is Table 6's "no spectral distillation for GM".
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..core.training import batchable, ce_loss
from ..params import MAX_EPOCHS, Param
from .ditto import Ditto
from .spectral import INCLUDE, MODES, spectral_names, spectral_target, spectral_term


class SCD(Ditto):
    name = "scd"
    HPARAMS = {
        "lam_g": Param(float, 0.05, "lambda_G, weight of the truncated-spectrum term in GM training (paper: 0.05; "
                       "code: 0.3)", low=0.0),
        "lam_p": Param(float, 0.01, "lambda_p, weight of the full-spectrum term in PM training (paper: 0.01; "
                       "code: 0.4)", low=0.0),
        "tau": Param(float, 0.4, "truncation ratio: s_hat keeps the first ceil(tau d) entries (paper: 0.4)",
                     low=0.0, high=1.0),
        "pm_epochs": Param(int, 0, "E_p, PM epochs per round; 0 = local_epochs (E_G) (Table 4: 3 or 5)", low=0, high=MAX_EPOCHS),
        "spectrum": Param(str, "dft1d", "'dft1d': the paper's 1-D DFT of the concatenated weights; 'fft2d_layer': "
                          "the code's 2-D FFT per layer", choices=MODES),
        "include": Param(str, "weights", "tensors in the spectrum: 'weights' (the code: every module's weight) or "
                         "'all' parameters", choices=INCLUDE),
        "code_prox": Param(float, 0.0, "the SCD code's extra PM term code_prox * ||w_p - w_G^{t-1}|| (un-squared, toward the "
                           "global model received this round; not in the paper): 0 = the paper", low=0.0),
    }

    def __init__(self, ctx, **hparams):
        super().__init__(ctx, **hparams)
        self.names = spectral_names((n for n, _ in ctx.model(-1).named_parameters()), self.hp["include"])
        self.distil_gm = self.hp["lam_g"] > 0 and self.hp["tau"] > 0

    def target(self, state: dict, tau: float):
        return spectral_target(state, self.names, tau, self.hp["spectrum"])

    def pm_prev(self, k, cstate) -> dict:
        return cstate["params"] if cstate else self.ctx.initial(k)   # w_p^0: Algorithm 1's inputs

    # ---- GMUPDATE (eq. 5): the plan the engine trains, per client or batched
    def loss(self, rnd, k, server, cstate):
        return self.gm_loss if self.distil_gm else ce_loss

    def aux(self, rnd, k, server, cstate):
        return {"target": self.target(self.pm_prev(k, cstate), self.hp["tau"])} if self.distil_gm else {}

    @batchable
    def gm_loss(self, m, x, y, aux):
        reg = spectral_term(m.params, self.names, aux["target"], self.hp["tau"], self.hp["spectrum"])
        return F.cross_entropy(m(x), y) + self.hp["lam_g"] * reg

    # ---- upload, then PMUPDATE (eq. 4)
    def finish(self, rnd, k, server, cstate, state, stats):
        up = self.upload(k, state, stats, server)                  # w_G,i^t
        aux = {}
        if self.hp["lam_p"] > 0:
            aux["target"] = self.target(state, 1.0)                  # s(w_G,i^t), before the module is reused
        if self.hp["code_prox"] > 0:
            aux["anchor"] = {n: t.detach() for n, t in server["params"].items()}   # the code's net_glob
        loss = self.pm_loss if aux else ce_loss
        return self.then_personal(up, self.personal_plan(k, self.pm_prev(k, cstate), loss, aux))

    @batchable
    def pm_loss(self, m, x, y, aux):
        value = F.cross_entropy(m(x), y)
        if "target" in aux:
            value = value + self.hp["lam_p"] * spectral_term(m.params, self.names, aux["target"], 1.0, self.hp["spectrum"])
        if "anchor" in aux:   # the code's option: sqrt(sum ||w - w_g||^2), not squared
            sq = sum(((p - aux["anchor"][n]) ** 2).sum() for n, p in m.params.items())
            value = value + self.hp["code_prox"] * torch.sqrt(sq + 1e-12)
        return value
