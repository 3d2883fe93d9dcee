"""Partial sharing: the model splits into a shared part (averaged by the server) and a
personal part (kept by each client). The two classic baselines differ only in which side
the head is on.

FedPer (Arivazhagan et al. 2019): body shared, head personal. pFedSD Sec. 4.1: "For FedPer, we
keep the last two layers as the personalized head for Fashion-MNIST and the last linear layer for CIFAR."
LG-FedAvg (Liang et al. 2020): head shared, body personal ("learns compact local representations for
the individual client and global head"). pFedSD: "For LG-FedAvg, we keep the last two layers as the
shared head for all datasets."
"""
from __future__ import annotations

from ..core.aggregation import clone_state, plain_average
from ..core.context import Plan
from ..data.models import head_param_names, layer_param_groups
from ..params import ConfigError, Param
from .base import Algorithm


def head_modules(algo: Algorithm, model, needs_body: bool = True) -> set:
    """The modules of `model`'s last `head_layers` parametrised layers (buffers follow their module). An algorithm
    that trains a body apart from its head (`needs_body`) refuses a head that is the whole model: its body
    optimiser would get no parameter (issue 33)."""
    n, layers = algo.hp["head_layers"], len(layer_param_groups(model))
    if needs_body and n >= layers:
        raise ConfigError(f"hparams.head_layers={n}: {algo.name}'s head would be all {layers} parametrised layers of "
                          f"the model, leaving no body to train (at most {layers - 1})")
    return {name.rsplit(".", 1)[0] for name in head_param_names(model, n)}


class FedPer(Algorithm):
    name = "fedper"
    generic = False
    head_is_shared = False
    needs_body = False      # FedPer and LG-FedAvg train the whole model at once: a head of every layer is allowed
    HPARAMS = {"head_layers": Param(int, 2, "how many last parametrised layers form the head", low=1)}

    def __init__(self, ctx, **hparams):
        super().__init__(ctx, **hparams)
        # modules forming the head (fixed by the architecture; buffers follow their module)
        self._head = head_modules(self, ctx.model(0), self.needs_body)

    def is_shared(self, name: str) -> bool:
        """Parameters/buffers averaged by the server (the rest stays on the client)."""
        in_head = name.rsplit(".", 1)[0] in self._head
        return in_head == self.head_is_shared

    def local_state(self, k, server, cstate):
        """Global shared part + the client's own personal part (initially its architecture's init)."""
        own = cstate["personal"] if cstate else {n: t for n, t in self.ctx.initial(k).items() if not self.is_shared(n)}
        return {**{n: t for n, t in server["params"].items() if self.is_shared(n)}, **own}

    def plan(self, rnd, k, server, cstate):
        return Plan(start=self.local_state(k, server, cstate))

    def finish(self, rnd, k, server, cstate, state, stats):
        shared = [n for n in state if self.is_shared(n)]
        personal = clone_state({n: t for n, t in state.items() if not self.is_shared(n)})
        return self.upload(k, state, stats, server, keys=shared), {"personal": personal}

    def global_model(self, server):
        return None  # no complete global model: GM = averaged PMs (SCD Remark 4.1)

    def personal_model(self, k, server, cstate):
        return self.ctx.model(k, self.local_state(k, server, cstate))

    def averaged_personal_model(self, server, clients):
        states = [self.local_state(k, server, c) for k, c in clients.items() if c]
        if not states or self.ctx.cfg.heterogeneous:  # nothing to average
            return None
        return self.ctx.model(-1, plain_average(states))


class LGFedAvg(FedPer):
    name = "lg_fedavg"
    head_is_shared = True
    heterogeneous = True   # only the head is exchanged: bodies may differ (DC-PFL Table 2)
    HPARAMS = {"head_layers": Param(int, 2, "how many last parametrised layers form the shared head", low=1)}
