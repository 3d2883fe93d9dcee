"""FedGH (Yi et al., ACM MM 2023): heterogeneous FL with a generalized global header.

Client k = its own (possibly heterogeneous) feature extractor f_theta_k + the shared header g_phi:
  1. replace its header with the global header phi^t, train the whole network with cross-entropy;
  2. upload the mean representation of each class it holds, mu_{c,k} = mean_{x in D_k^c} f_theta_k(x).
Server: train phi on the uploaded (mu_{c,k}, c) pairs with SGD, one pair per step, one pass per round
(as the paper describes; the public code's header optimiser holds the clients' parameters, so its
header never moves: docs/fidelity.md).
Personal model: client k's extractor + the current global header (`eval_head: global`), or + the header
as the client's local training left it (`local`: what the public code scores right after training).
A client never selected yet has its architecture's initial extractor.
"""
from __future__ import annotations

from torch import nn

from ..core.aggregation import clone_state, plain_average, state_bytes
from ..core.context import Context
from ..params import Param
from .base import Algorithm, Update
from .stats import class_stats, features, train_head_on_means


def arch_init_states(ctx: Context) -> dict[str, dict]:
    """Initial weights of every client architecture of the run (`Context.initial`), one copy each."""
    first: dict[str, int] = {}
    for k in range(ctx.cfg.n_clients):
        first.setdefault(ctx.arch(k), k)
    return {a: clone_state(ctx.initial(k)) for a, k in first.items()}


def shared_head_init_states(ctx: Context, what: str) -> dict[str, dict]:
    """`arch_init_states`, for algorithms whose clients share one header (or prototype) space: every
    architecture must end in the same `head` shape (representation size x classes)."""
    init = arch_init_states(ctx)
    shapes = {tuple(s["head.weight"].shape) for s in init.values()}
    if len(shapes) != 1:
        raise ValueError(f"{what} for all clients, got head shapes {sorted(shapes)}")
    return init


def is_head(name: str) -> bool:
    return name.startswith("head.")


class FedGH(Algorithm):
    name = "fedgh"
    generic = False
    heterogeneous = True     # only the header and class statistics are exchanged
    upload_cov = False       # DC-PFL also uploads class covariances
    HPARAMS = {
        "server_lr": Param(float, 0.01, "learning rate of the server's header SGD (FedGH code: 0.01)",
                           low=0.0, low_open=True),
        "eval_head": Param(str, "global", "personal model = extractor + 'global' header, or + the header "
                           "after local training ('local', FedGH's code)", choices=("global", "local")),
    }

    def __init__(self, ctx, **hparams):
        super().__init__(ctx, **hparams)
        self.init = shared_head_init_states(ctx, f"{self.name}: the global header needs one header shape")

    # ---- server side
    def server_init(self):
        return {"head": clone_state({n: t for n, t in self.init[self.ctx.arch(0)].items() if is_head(n)})}

    def header(self, server) -> nn.Linear:
        w, b = server["head"]["head.weight"], server["head"]["head.bias"]
        lin = nn.utils.skip_init(nn.Linear, w.shape[1], w.shape[0], device=w.device)  # no RNG draw
        lin.load_state_dict({"weight": w, "bias": b})
        return lin

    @staticmethod
    def header_state(head: nn.Linear) -> dict:
        return {"head.weight": head.weight.detach().clone(), "head.bias": head.bias.detach().clone()}

    def aggregate(self, rnd, server, updates, clients):
        """Header training on class means: one (mu_{c,k}, c) per SGD step, clients and classes in order."""
        head = self.header(server)
        pairs = [(u.payload["means"][i:i + 1], u.payload["classes"][i:i + 1])
                 for u in updates for i in range(len(u.payload["classes"]))]
        train_head_on_means(head, pairs, self.hp["server_lr"])
        return {**server, "head": self.header_state(head)}

    # ---- client side
    def local_state(self, k, server, cstate, head: str = "global") -> dict:
        body = cstate["body"] if cstate else {n: t for n, t in self.init[self.ctx.arch(k)].items() if not is_head(n)}
        return {**body, **(cstate["head"] if (cstate and head == "local") else server["head"])}

    def down_bytes(self, server) -> int:
        return state_bytes(server["head"])

    def client_update(self, rnd, k, server, cstate):
        net = self.ctx.model(k, self.local_state(k, server, cstate))  # the global header replaces the local one
        stats = self.ctx.train(net, k, rnd, loss=self.loss(rnd, k, server, cstate))
        x, y = self.ctx.data.client_train(k)
        sent = class_stats(features(net, x), y, cov=self.upload_cov)
        state = net.state_dict()
        new = {"body": clone_state({n: t for n, t in state.items() if not is_head(n)}),
               "head": clone_state({n: t for n, t in state.items() if is_head(n)})}
        up = Update(weight=float(len(y)), payload=sent, loss=stats.loss, samples=stats.samples,
                    bytes_up=state_bytes(sent), bytes_down=self.down_bytes(server))
        return up, new

    # ---- evaluation
    def global_model(self, server):
        return None  # no global feature extractor

    def personal_model(self, k, server, cstate):
        return self.ctx.model(k, self.local_state(k, server, cstate, self.hp["eval_head"]))

    def averaged_personal_model(self, server, clients):
        """Homogeneous runs: averaged extractors + global header (SCD Remark 4.1); heterogeneous: None."""
        if len({self.ctx.arch(k) for k in range(self.ctx.cfg.n_clients)}) > 1:
            return None
        bodies = [c["body"] for c in clients.values() if c]
        if not bodies:
            return None
        return self.ctx.model(0, {**plain_average(bodies), **server["head"]})
