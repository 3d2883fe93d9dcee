"""pFedSD Fig. 2's probe: FedAvg, scored by each client's *last local model*.

"Fig. 2 shows the personalized test accuracy gap between the global model and the local model
[trained] in the last round" (Sec. 2.2). Training is FedAvg's exactly (same seeds, same updates),
so pairing this run with a plain FedAvg run of the same config compares, client by client and
round by round, the model a client is about to receive (FedAvg's PM = GM on the local test set)
with the model it held before receiving it.
"""
from __future__ import annotations

from ..core.aggregation import clone_state
from .base import Algorithm


class FedAvgLastLocal(Algorithm):
    name = "fedavg_last_local"
    generic = False

    def finish(self, rnd, k, server, cstate, state, stats):
        up, _ = super().finish(rnd, k, server, cstate, state, stats)
        return up, {"params": clone_state(up.payload)}   # FedAvg uploads the full trained state

    def personal_model(self, k, server, cstate):
        return self.ctx.model(k, cstate["params"]) if cstate else None  # never trained: the GM
