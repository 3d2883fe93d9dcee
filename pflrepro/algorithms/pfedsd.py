"""pFedSD (Jin et al., TPDS 2022): personalized federated self-knowledge distillation.

Algorithm 2 (client side): start from the global model w^t, train E epochs on
    Phi_k(w) = CE(w) + lambda * L_KL( q(v_k) || q(w) )                          (eq. 3)
with q = softmax(z / tau), then store the trained model as the personalized model v_k.
A client's first participation has no v_k: plain cross-entropy (author code: `is_active_before == 0`).
Algorithm 1 (server side): w^{t+1} = sum_{k in S^t} w_k^{t+1} / |S^t|  (plain mean, line 9).

KD term as in the author code: tau^2 * KL(softmax(teacher/tau) || softmax(student/tau)),
batchmean reduction. The teacher's predictions are obtained in one of two ways (Sec. 3.2):
`teacher: recompute` (a forward pass of v_k on every batch, as the code does) or `stored`
(v_k's logits on the client's training set computed once at the start of local training and
looked up per batch). `teacher_mode: train` runs the teacher with dropout active, like the code;
`eval` turns it off.

Table 9 replaces the KD term (`reg`): `l2` lambda/2 ||w - v_k||^2; `ewc` lambda/2 sum_i F_i (w_i - v_k,i)^2
with F the diagonal empirical Fisher of v_k on the client's training data (Kirkpatrick et al. 2017);
`mse` lambda * mean (z_w - z_v)^2 between logits, or `mse_prob` between the softened predictions q that
eq. 3 compares (the paper only says "replace KL divergence to Mean Squared Error in distillation loss").
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..core.aggregation import clone_state
from ..core.context import Plan
from ..core.seeds import derive_seed
from ..core.training import batchable
from ..params import Param
from .base import Algorithm


def kd_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, tau: float) -> torch.Tensor:
    """tau^2 * KL(softmax(t/tau) || softmax(s/tau)), averaged over the batch: `F.kl_div(log_p_s, p_t, reduction=
    "batchmean")` spelled out as ATen computes it (xlogy(p_t, p_t) - p_t * log_p_s, summed, over the batch size;
    the same bits, tests/test_algorithms.py), because `vmap` has no batching rule for `kl_div` and runs it client by
    client."""
    p_t = F.softmax(teacher_logits / tau, dim=1)
    log_p_s = F.log_softmax(student_logits / tau, dim=1)
    return tau * tau * ((torch.xlogy(p_t, p_t) - p_t * log_p_s).sum() / log_p_s.shape[0])


class PFedSD(Algorithm):
    name = "pfedsd"
    generic = False
    weighted = False  # Algorithm 1 line 9: plain mean over S^t
    HPARAMS = {
        "lam": Param(float, 0.5, "lambda, weight of the KD term (paper grid {0.1, 0.5})", low=0.0),
        "tau": Param(float, 3.0, "softmax temperature (paper grid {1, 3}; Fig. 8: 3 is better)", low=0.0, low_open=True),
        "teacher": Param(str, "recompute", "teacher predictions: 'recompute' per batch or 'stored' once per round",
                         choices=("recompute", "stored")),
        "teacher_mode": Param(str, "train", "teacher forward in 'train' mode (author code: dropout on) or 'eval'",
                              choices=("train", "eval")),
        "reg": Param(str, "kl", "regulariser toward v_k: 'kl' (pFedSD), or Table 9's 'mse' (logits), "
                     "'mse_prob' (softened predictions q), 'l2', 'ewc'", choices=("kl", "mse", "mse_prob", "l2", "ewc")),
    }

    def plan(self, rnd, k, server, cstate):
        if cstate is None:                      # first participation: plain CE
            return Plan(start=server["params"])
        v = cstate["params"]
        if self.hp["reg"] in ("l2", "ewc"):     # Table 9: parameter-space regularisers
            aux = {"anchor": {n: t.detach() for n, t in v.items()}}
            if self.hp["reg"] == "ewc":
                aux["fisher"] = diag_fisher(self.teacher(k, v).eval(), *self.ctx.data.client_train(k))
            return Plan(start=server["params"], loss=self.param_loss, aux=aux)
        if self.hp["teacher"] == "stored":      # v_k's logits once, looked up per batch
            teacher = self.teacher(k, v)
            x, _ = self.ctx.data.client_train(k)
            torch.manual_seed(derive_seed(self.ctx.cfg.seed, rnd, k, 2))  # teacher dropout, resume-safe
            with torch.no_grad():
                table = torch.cat([teacher(x[i:i + 1024]) for i in range(0, len(x), 1024)])
            return Plan(start=server["params"], loss=self.kd_loss, per_sample={"t_logits": table})
        return Plan(start=server["params"], loss=self.kd_loss, aux={"teacher": v})  # recomputed per batch

    def finish(self, rnd, k, server, cstate, state, stats):
        return self.upload(k, state, stats, server), {"params": clone_state(state)}

    def teacher(self, k, state):
        t = self.ctx.make_model(k).to(self.ctx.device)
        t.load_state_dict(state)
        t.train(self.hp["teacher_mode"] == "train")
        return t

    def reg(self, s, t):
        tau = self.hp["tau"]
        r = self.hp["reg"]
        if r == "kl":
            return kd_kl(s, t, tau)
        if r == "mse":
            return F.mse_loss(s, t)
        return F.mse_loss(F.softmax(s / tau, 1), F.softmax(t / tau, 1))  # mse_prob

    @batchable
    def kd_loss(self, m, xb, yb, aux):
        """Eq. (3): CE + lambda * KD against v_k: its logits are given per batch (`t_logits`, stored)
        or recomputed from its state (`teacher`) with the same forward as the student's."""
        logits = m(xb)
        t_logits = aux.get("t_logits")
        if t_logits is None:
            with torch.no_grad():
                t_logits = m.run(aux["teacher"], xb, train=self.hp["teacher_mode"] == "train")
        return F.cross_entropy(logits, yb) + self.hp["lam"] * self.reg(logits, t_logits)

    @batchable
    def param_loss(self, m, xb, yb, aux):
        """Table 9's L2 and EWC: CE + lambda/2 * sum_i F_i (w_i - v_i)^2 (F = 1 for L2)."""
        anchor, fisher = aux["anchor"], aux.get("fisher")
        reg = sum(((p - anchor[n]) ** 2 * (fisher[n] if fisher else 1.0)).sum() for n, p in m.params.items())
        return F.cross_entropy(m(xb), yb) + 0.5 * self.hp["lam"] * reg

    def personal_model(self, k, server, cstate):
        # v_k; a client never selected yet has no v_k and uses the global model
        return self.ctx.model(k, cstate["params"]) if cstate else None



def diag_fisher(net, x, y, batch: int = 128) -> dict:
    """Diagonal empirical Fisher: mean over samples of (d log p(y_n | x_n) / d theta)^2,
    with per-sample gradients from torch.func (no loop over samples)."""
    from torch.func import functional_call, grad, vmap
    params = {n: p.detach() for n, p in net.named_parameters()}
    buffers = {n: b.detach() for n, b in net.named_buffers()}

    def nll(p, xi, yi):
        out = functional_call(net, (p, buffers), (xi.unsqueeze(0),))
        return F.cross_entropy(out, yi.unsqueeze(0))

    per_sample = vmap(grad(nll), in_dims=(None, 0, 0))
    total = {n: torch.zeros_like(p) for n, p in params.items()}
    for i in range(0, len(y), batch):
        g = per_sample(params, x[i:i + batch], y[i:i + batch])
        for n in total:
            total[n] += (g[n] ** 2).sum(0)
    return {n: t / max(len(y), 1) for n, t in total.items()}
