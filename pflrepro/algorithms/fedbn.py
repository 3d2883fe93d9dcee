"""FedBN (Li et al., ICLR 2021, "FedBN: Federated Learning on Non-IID Features via Local Batch Normalization"),
FedBSD's Fig. 3 baseline: "FedBN ..., which excludes the uploading of a BN layer in comparison to FedAvg".

FedAvg, except that every BatchNorm layer (its weight and bias and its running statistics) stays on the client:
a client starts from the global non-BN parameters and its own BN layers (its architecture's initial ones on its
first round), trains everything on CE, uploads the non-BN entries only, and keeps its BN entries. The server
averages what it receives, weighted by n_k as FedAvg (FedBN's code weighs its clients equally, which is the same
on its equal-sized clients). FedBN's code excludes every state entry whose name contains 'bn'; here the
BatchNorm modules themselves (`models.bn_names`), whatever their names.
A client's personal model is the global non-BN part with its own BN layers; there is no global model (its BN
layers are never aggregated), so the GM accuracy is that of the averaged personal models (SCD Remark 4.1).
"""
from __future__ import annotations

from ..core.aggregation import clone_state, plain_average
from ..core.context import Plan
from ..data.models import bn_names
from .base import Algorithm


class FedBN(Algorithm):
    name = "fedbn"
    generic = False

    def __init__(self, ctx, **hparams):
        super().__init__(ctx, **hparams)
        self._bn = frozenset(bn_names(ctx.model(0)))

    def is_local(self, name: str) -> bool:
        """BatchNorm entries: never uploaded nor averaged."""
        return name in self._bn

    def local_state(self, k, server, cstate):
        own = cstate["bn"] if cstate else {n: t for n, t in self.ctx.initial(k).items() if self.is_local(n)}
        return {**{n: t for n, t in server["params"].items() if not self.is_local(n)}, **own}

    def plan(self, rnd, k, server, cstate):
        return Plan(start=self.local_state(k, server, cstate))

    def finish(self, rnd, k, server, cstate, state, stats):
        up = self.upload(k, state, stats, server, keys=[n for n in state if not self.is_local(n)])
        return up, {"bn": clone_state({n: t for n, t in state.items() if self.is_local(n)})}

    def global_model(self, server):
        return None

    def personal_model(self, k, server, cstate):
        return self.ctx.model(k, self.local_state(k, server, cstate))

    def averaged_personal_model(self, server, clients):
        states = [self.local_state(k, server, c) for k, c in clients.items() if c]
        if not states or self.ctx.cfg.heterogeneous:
            return None
        return self.ctx.model(-1, plain_average(states))
