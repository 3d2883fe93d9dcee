"""FedBABU (Oh, Kim, Yun, ICLR 2022, "FedBABU: Toward enhanced representation for federated image
classification"), a baseline of SCD.

Federated training is FedAvg on the body only: "the head is randomly initialized and never updated"
(abstract). Every client starts from the global body and the common initial head, trains the body
(the head is frozen: `trainable`), and uploads the body; the server averages bodies, so the head
stays at the run's initialisation for everyone. The client step is a `Plan`: the batched engine
trains the selected clients together.

Personalization happens at evaluation and never feeds back into training: client k's PM is the
global model fine-tuned for `ft_epochs` on k's training data (own seed stream, `purpose` 1, round
0). FedBABU's personalization code fine-tunes the whole network (body and head, one learning rate)
for 5 epochs; `ft_part: head` fine-tunes the head only (the abstract's wording).
GM (`gm`): `global` = the global model itself (body + initial head, FedBABU's "initial" model);
`averaged_pm` = the plain average of the clients' fine-tuned PMs, which is what SCD's parentheses
(Remark 4.1) denote for FedBABU.
"""
from __future__ import annotations

from ..core.aggregation import clone_state, plain_average
from ..core.context import Plan
from ..params import MAX_EPOCHS, Param
from .base import Algorithm
from .partial import head_modules


class FedBABU(Algorithm):
    name = "fedbabu"
    generic = False
    HPARAMS = {
        "head_layers": Param(int, 1, "how many last parametrised layers form the frozen head (FedBABU: the "
                             "last linear classifier)", low=1),
        "ft_epochs": Param(int, 5, "fine-tuning epochs at evaluation (FedBABU code: 5)", low=0, high=MAX_EPOCHS),
        "ft_lr": Param(float, 0.0, "fine-tuning learning rate; 0 = the run's lr", low=0.0),
        "ft_part": Param(str, "full", "what fine-tuning updates: 'full' (FedBABU code) or 'head'",
                         choices=("full", "head")),
        "gm": Param(str, "global", "GM: 'global' (body + initial head) or 'averaged_pm' (SCD Remark 4.1)",
                    choices=("global", "averaged_pm")),
    }

    def __init__(self, ctx, **hparams):
        super().__init__(ctx, **hparams)
        self._head = head_modules(self, ctx.model(0))

    def is_head(self, name: str) -> bool:
        return name.rsplit(".", 1)[0] in self._head     # buffers follow their module

    def is_body(self, name: str) -> bool:
        return not self.is_head(name)

    def plan(self, rnd, k, server, cstate):
        return Plan(start=server["params"], trainable=self.is_body)

    def finish(self, rnd, k, server, cstate, state, stats):
        return self.upload(k, state, stats, server, keys=[n for n in state if self.is_body(n)]), None

    def personal_model(self, k, server, cstate):
        net = self.ctx.model(k, server["params"])
        self.ctx.train(net, k, 0, epochs=self.hp["ft_epochs"], lr=self.hp["ft_lr"] or None, purpose=1,
                       trainable=self.is_head if self.hp["ft_part"] == "head" else None)
        return net

    def global_model(self, server):
        return super().global_model(server) if self.hp["gm"] == "global" else None

    def averaged_personal_model(self, server, clients):
        states = [clone_state(self.personal_model(k, server, None).state_dict())
                  for k in range(self.ctx.data.n_clients)]
        return self.ctx.model(-1, plain_average(states))
