"""FedKD (Wu et al. 2022, "Communication-efficient federated learning via knowledge distillation",
Nature Communications 13:2032), as a DC-PFL baseline.

Each client keeps a large local *mentor* (its own architecture, never sent) and a copy of the small
shared *mentee* (averaged by the server). Adaptive mutual distillation on every batch:
    L_t = CE_t + KL(y_s || y_t) / (CE_t + CE_s) + MSE(H_t, W_h H_s) / (CE_t + CE_s)     (mentor)
    L_s = CE_s + KL(y_t || y_s) / (CE_t + CE_s) + MSE(H_t, W_h H_s) / (CE_t + CE_s)     (mentee)
H are the representations (`SplitModel.features`) and W_h a learnable linear map from the mentee's
to the mentor's feature size, kept by the client: any two SplitModels allow the hidden loss.
`detach` (default): each model minimises its own loss (the other model's outputs and the adaptive
weight 1/(CE_t+CE_s) are constants); False: the official code's single summed loss, gradients
flowing through everything. KL per sample, batch-averaged (the code's KLDivLoss averages over classes too).

Communication (`svd`, on by default as in the paper): the mentee's update (not its weights) is
factorised per weight matrix (conv kernels reshaped to out x rest) by SVD, keeping the fewest singular
values whose energy reaches T(t) = T_start + (t/R)(T_end - T_start); the server averages the
reconstructed updates and factorises the average again before sending it. Bytes count the factors
(or the dense tensor when that is smaller).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..core.aggregation import clone_state, plain_average, state_bytes, weighted_average
from ..core.seeds import derive_seed
from ..params import Param
from .base import Update
from .fml import Pair, SharedModelAlgorithm, shared_model_param
from .pfedsd import kd_kl


def svd_compress(t: torch.Tensor, energy: float) -> tuple[torch.Tensor, int]:
    """(what the receiver reconstructs, bytes sent) for one tensor at energy threshold T."""
    dense = t.numel() * t.element_size()
    if t.dim() < 2:
        return t, dense
    m = t.reshape(t.shape[0], -1)
    u, s, vh = torch.linalg.svd(m, full_matrices=False)
    e = (s * s).cumsum(0)
    r = min(int((e < energy * e[-1]).sum()) + 1, len(s))   # fewest values with >= T of the energy
    sent = r * (m.shape[0] + m.shape[1] + 1) * t.element_size()
    if sent >= dense:
        return t, dense
    return ((u[:, :r] * s[:r]) @ vh[:r]).reshape(t.shape), sent


def compress_state(delta: dict, energy: float | None) -> tuple[dict, int]:
    if energy is None:
        return delta, state_bytes(delta)
    out = {n: svd_compress(t, energy) for n, t in delta.items()}
    return {n: r for n, (r, _) in out.items()}, sum(b for _, b in out.values())


class FedKD(SharedModelAlgorithm):
    name = "fedkd"
    HPARAMS = {
        "shared_model": shared_model_param(),
        "hidden": Param(bool, True, "add the hidden-representation loss MSE(H_t, W_h H_s) / (CE_t + CE_s)"),
        "detach": Param(bool, True, "each model minimises its own loss (False: the code's summed loss)"),
        "svd": Param(bool, True, "SVD-compress the mentee's updates both ways (FedKD's communication scheme)"),
        "t_start": Param(float, 0.95, "energy threshold T at the start (FedKD: 0.95)", low=0.0, high=1.0),
        "t_end": Param(float, 0.98, "energy threshold T at the last round (FedKD: 0.98)", low=0.0, high=1.0),
    }

    def energy(self, rnd: int) -> float | None:
        h = self.hp
        return h["t_start"] + rnd / self.ctx.cfg.rounds * (h["t_end"] - h["t_start"]) if h["svd"] else None

    def projection(self, k, mentor, mentee, cstate) -> nn.Module:
        """W_h: mentee features -> mentor features, the client's own (seeded init on first use)."""
        torch.manual_seed(derive_seed(self.ctx.cfg.seed, k, 0xF3D))
        proj = nn.Linear(mentee.feature_dim, mentor.feature_dim, bias=False).to(self.ctx.device)
        if cstate:
            proj.weight.data.copy_(cstate["proj"])
        return proj

    def loss(self, rnd, k, server, cstate):
        return adaptive_mutual_loss(self.hp["hidden"], self.hp["detach"])

    def client_update(self, rnd, k, server, cstate):
        mentor, mentee = self.local(k, cstate, "mentor"), self.shared(server["params"])
        proj = self.projection(k, mentor, mentee, cstate)
        stats = self.ctx.train(Pair(mentor, mentee, proj), k, rnd, loss=self.loss(rnd, k, server, cstate))
        new = mentee.state_dict()
        delta = {n: new[n] - t for n, t in server["params"].items() if t.is_floating_point()}
        sent, up = compress_state(delta, self.energy(rnd))
        down = int(server["down_bytes"]) if "down_bytes" in server else state_bytes(server["params"])
        update = Update(weight=float(len(self.ctx.data.train[k])), payload=sent, loss=stats.loss,
                        samples=stats.samples, bytes_up=up, bytes_down=down)
        return update, {"mentor": clone_state(mentor.state_dict()), "proj": proj.weight.detach().clone()}

    def aggregate(self, rnd, server, updates, clients):
        deltas = [u.payload for u in updates]
        avg = weighted_average(deltas, [u.weight for u in updates]) if self.weighted else plain_average(deltas)
        sent, down = compress_state(avg, self.energy(rnd))
        params = {n: t + sent[n] if n in sent else t for n, t in server["params"].items()}
        return {**server, "params": params, "down_bytes": torch.tensor(down)}

    def personal_model(self, k, server, cstate):
        return self.local(k, cstate, "mentor")


def adaptive_weight(ce_t, ce_s, detach: bool):
    """1 / (CE_t + CE_s): distillation counts more when both models predict well (FedKD)."""
    w = ce_t + ce_s
    return 1.0 / (w.detach() if detach else w)


def adaptive_mutual_loss(hidden: bool, detach: bool):
    """L_t + L_s on one batch (mentor = pair.local, mentee = pair.shared, W_h = pair.proj)."""
    d = (lambda t: t.detach()) if detach else (lambda t: t)

    def loss(pair, x, y):
        h_t, h_s = pair.local.features(x), pair.shared.features(x)
        z_t, z_s = pair.local.head(h_t), pair.shared.head(h_s)
        ce_t, ce_s = F.cross_entropy(z_t, y), F.cross_entropy(z_s, y)
        inv = adaptive_weight(ce_t, ce_s, detach)
        total = ce_t + ce_s + inv * (kd_kl(z_t, d(z_s), 1.0) + kd_kl(z_s, d(z_t), 1.0))
        if hidden:  # L_t^h moves the mentor, L_s^h the mentee; W_h learns from both
            total = total + inv * (F.mse_loss(h_t, pair.proj(d(h_s))) + F.mse_loss(d(h_t), pair.proj(h_s)))
        return total
    return loss
