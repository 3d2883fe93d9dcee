"""The worked examples of the API: Local-only, FedProx, FedAvg+FT and FedProx+FT (FedAvg is the base class)."""
from __future__ import annotations

from ..core.aggregation import clone_state
from ..core.context import Plan
from ..core.training import batchable, ce_loss
from ..data.models import head_param_names
from ..params import MAX_EPOCHS, Param
from .base import Algorithm, Update


class Local(Algorithm):
    """Local-only: every client trains its own model from the common initialisation and
    never communicates."""
    name = "local"
    generic = False
    heterogeneous = True

    def server_init(self) -> dict:
        return {}

    def plan(self, rnd, k, server, cstate):
        return Plan(start=cstate["params"] if cstate else self.ctx.initial(k))

    def finish(self, rnd, k, server, cstate, state, stats):
        return (Update(weight=float(len(self.ctx.data.train[k])), loss=stats.loss, samples=stats.samples),
                {"params": clone_state(state)})

    def aggregate(self, rnd, server, updates, clients):
        return server

    def global_model(self, server):
        return None  # no GM: the engine scores the averaged PMs (Remark 4.1)

    def personal_model(self, k, server, cstate):
        return self.ctx.model(k, cstate["params"] if cstate else self.ctx.initial(k))


class FedProx(Algorithm):
    """FedProx (Li et al. 2020): FedAvg plus mu/2 * ||w - w_global||^2 in the local loss."""
    name = "fedprox"
    HPARAMS = {"mu": Param(float, 0.01, "proximal coefficient mu", low=0.0)}

    def loss(self, rnd, k, server, cstate):
        return self.prox

    def aux(self, rnd, k, server, cstate):
        return {"anchor": {n: t.detach() for n, t in server["params"].items()}}   # w_global

    @batchable
    def prox(self, m, x, y, aux):
        anchor = aux["anchor"]
        reg = sum(((p - anchor[n]) ** 2).sum() for n, p in m.params.items())
        return ce_loss(m, x, y) + 0.5 * self.hp["mu"] * reg


class HeadFT:
    """Mixin for FedBSD's "+FT" baselines: the algorithm trains as usual, and each client's personalized model
    is the global model with its head fine-tuned for `ft_epochs` epochs on the client's own training data
    (FedBSD: "an additional 10 epochs of head training on each client"). Fine-tuning happens at evaluation
    time and never feeds back into training."""
    generic = False
    FT_HPARAMS = {"ft_epochs": Param(int, 10, "head fine-tuning epochs at evaluation", low=0, high=MAX_EPOCHS),
                  "head_layers": Param(int, 1, "how many last layers form the head", low=1)}

    def personal_model(self, k, server, cstate):
        net = self.ctx.model(k, server["params"])
        head = set(head_param_names(net, self.hp["head_layers"]))
        # purpose=1: a data-order stream separate from training's; round 0 = evaluation
        self.ctx.train(net, k, 0, epochs=self.hp["ft_epochs"], trainable=head.__contains__, purpose=1)
        return net


class FedAvgFT(HeadFT, Algorithm):
    """FedAvg+FT: FedAvg, its head fine-tuned per client at evaluation (HeadFT)."""
    name = "fedavg_ft"
    HPARAMS = HeadFT.FT_HPARAMS


class FedProxFT(HeadFT, FedProx):
    """FedProx+FT (FedBSD Table 1): FedProx, its head fine-tuned per client at evaluation (HeadFT)."""
    name = "fedprox_ft"
    HPARAMS = {**FedProx.HPARAMS, **HeadFT.FT_HPARAMS}
