"""FedRep (Collins et al., ICML 2021, "Exploiting shared representations for personalized federated
learning"), the baseline of FedBSD, SCD and PerFed-CKT.

FedPer's split (body shared and averaged, head kept by each client), trained in two phases per round
(FedRep's Algorithm 1): starting from the global body and its own head, the client trains the HEAD
ONLY for `head_epochs` epochs, then the BODY ONLY for `body_epochs` epochs, and uploads the body.
FedRep's experiments: "FedRep executes ten local epochs of SGD with momentum to train the local head,
followed by one or five epochs for the representation" (its code: head `local_ep - local_rep_ep`
epochs first, then `local_rep_ep`; FedBSD: one body epoch for CIFAR-10 with S = 2, five otherwise).

Each phase is one call of the training primitive with its own seed stream (`purpose` 0 and 1) and
its own optimiser: the head is exactly still while the body trains (FedRep's code keeps one SGD
across both phases, so momentum and weight decay nudge the frozen head a little; see docs/fidelity.md).
A `Plan` has one trainable set, so the head phase is the plan and the body phase a second plan that
`finish` answers (`context.Then`, as Ditto's PM step); the batched engine trains each phase for all clients.
"""
from __future__ import annotations

from ..core.aggregation import clone_state
from ..core.context import Plan, Then
from ..core.training import TrainStats
from ..params import MAX_EPOCHS, Param
from .partial import FedPer


class FedRep(FedPer):
    name = "fedrep"
    needs_body = True    # head and body train in separate phases
    HPARAMS = {
        "head_layers": Param(int, 1, "how many last parametrised layers form the personal head (FedRep: the "
                             "last linear layer)", low=1),
        "head_epochs": Param(int, 10, "head-only epochs per round, first (FedRep: ten)", low=0, high=MAX_EPOCHS),
        "body_epochs": Param(int, 5, "body-only epochs per round, after the head (FedRep/FedBSD: 1 for "
                             "CIFAR-10 with S = 2, 5 otherwise)", low=0, high=MAX_EPOCHS),
    }

    @classmethod
    def relative_cost(cls, hparams):
        hp = {n: hparams.get(n, p.default) for n, p in cls.HPARAMS.items()}
        return hp["head_epochs"] / 3 + hp["body_epochs"]   # a head-only epoch is about a forward pass

    def is_head(self, name: str) -> bool:
        return not self.is_shared(name)

    def plan(self, rnd, k, server, cstate):
        """Phase 1: from the global body and the client's own head, train the head only."""
        return Plan(start=self.local_state(k, server, cstate), trainable=self.is_head, epochs=self.hp["head_epochs"])

    def finish(self, rnd, k, server, cstate, state, stats):
        """Phase 2: train the body only (a second plan, batched across clients), then FedPer's message (the
        body) and client state (the head)."""
        body = Plan(start=clone_state(state), trainable=self.is_shared, epochs=self.hp["body_epochs"], purpose=1)

        def done(state, bstats):   # after the body: FedPer's message and client state, both phases' statistics
            n = stats.samples + bstats.samples
            both = TrainStats(loss=(stats.loss * stats.samples + bstats.loss * bstats.samples) / max(n, 1),
                              steps=stats.steps + bstats.steps, samples=n)
            return FedPer.finish(self, rnd, k, server, cstate, state, both)
        return Then(body, done)
