"""FML (Shen et al. 2020, "Federated Mutual Learning", arXiv:2006.16765), as a DC-PFL baseline.

Every client keeps a personal *local* model of its own architecture and receives a copy of the
shared *meme* model (one small homogeneous architecture, averaged by the server as in FedAvg).
Both are trained together on the same batches by deep mutual learning (FML's local losses):
    L_local = alpha * CE(local) + (1 - alpha) * KL(p_meme || p_local)
    L_meme  = beta  * CE(meme)  + (1 - beta)  * KL(p_local || p_meme)
Each model's loss treats the other's prediction as a constant (DML), so the primitive minimises
L_local + L_meme over a `Pair` module holding both: the gradients separate by themselves.
Personalized model = the local model; global model = the averaged meme model.

`shared_model` (the meme's architecture) defaults to `cnn5`, the smallest of FedGH's five CNNs
(DC-PFL's model set): DC-PFL only says the homogeneous model is "small".

`Pair` is shared with FedKD and FD (fedkd.py, fd.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..core.aggregation import clone_state
from ..core.seeds import derive_seed
from ..data.models import MODELS, build_model
from ..params import Param
from .base import Algorithm
from .pfedsd import kd_kl


class Pair(nn.Module):
    """Two models trained in one call of the primitive: `local` (personal, client's architecture)
    and `shared` (the exchanged one), plus an optional `proj` (FedKD's hidden-state map)."""

    def __init__(self, local: nn.Module, shared: nn.Module, proj: nn.Module | None = None):
        super().__init__()
        self.local, self.shared = local, shared
        if proj is not None:
            self.proj = proj



class SharedModelAlgorithm(Algorithm):
    """Common part of FML and FedKD: a personal model per client plus one shared small model whose
    weights are the server state ("params"); the shared module is a work buffer, reloaded before use."""
    generic = False
    heterogeneous = True   # only the shared (homogeneous) model is exchanged

    def __init__(self, ctx, **hparams):
        super().__init__(ctx, **hparams)
        s = ctx.data.spec
        self._shared = build_model(self.hp["shared_model"], s.channels, s.num_classes, s.size).to(ctx.device)

    def server_init(self) -> dict:
        torch.manual_seed(derive_seed(self.ctx.cfg.seed, 0x1A17, 0x5AED))  # the shared model's common init
        s = self.ctx.data.spec
        net = build_model(self.hp["shared_model"], s.channels, s.num_classes, s.size)
        return {"params": {n: t.to(self.ctx.device) for n, t in net.state_dict().items()}}

    def shared(self, state: dict) -> nn.Module:
        self._shared.load_state_dict(state)
        return self._shared

    def local(self, k: int, cstate: dict | None, key: str = "params") -> nn.Module:
        return self.ctx.model(k, cstate[key] if cstate else self.ctx.initial(k))

    def global_model(self, server):
        return self.shared(server["params"])


def shared_model_param() -> Param:
    return Param(str, "cnn5", "architecture of the shared small model (default: FedGH's smallest CNN)",
                 choices=tuple(sorted(MODELS)))


class FML(SharedModelAlgorithm):
    name = "fml"
    HPARAMS = {
        "alpha": Param(float, 0.5, "weight of the local model's CE (1 - alpha on KL(meme || local)); FML: 0.5",
                       low=0.0, high=1.0),
        "beta": Param(float, 0.5, "weight of the meme model's CE (1 - beta on KL(local || meme)); FML: 0.5",
                      low=0.0, high=1.0),
        "shared_model": shared_model_param(),
    }

    def loss(self, rnd, k, server, cstate):
        return mutual_loss(self.hp["alpha"], self.hp["beta"])

    def client_update(self, rnd, k, server, cstate):
        local, meme = self.local(k, cstate), self.shared(server["params"])
        stats = self.ctx.train(Pair(local, meme), k, rnd, loss=self.loss(rnd, k, server, cstate))
        return self.upload(k, meme, stats, server), {"params": clone_state(local.state_dict())}

    def personal_model(self, k, server, cstate):
        return self.local(k, cstate)


def mutual_loss(alpha: float, beta: float):
    """L_local + L_meme on one batch; KL(p || q) = sum p log(p / q), targets detached."""
    def loss(pair, x, y):
        z_loc, z_meme = pair.local(x), pair.shared(x)
        l_local = alpha * F.cross_entropy(z_loc, y) + (1 - alpha) * kd_kl(z_loc, z_meme.detach(), 1.0)
        l_meme = beta * F.cross_entropy(z_meme, y) + (1 - beta) * kd_kl(z_meme, z_loc.detach(), 1.0)
        return l_local + l_meme
    return loss
