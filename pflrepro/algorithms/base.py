"""The algorithm interface. FedAvg *is* the base class: every method below only
overrides what its paper changes (loss term, trainable parameters, per-client state,
upload, aggregation, personal model).

Vocabulary follows Flower: the server sends a model to selected clients
(`client_update` receives `server`), clients return an `Update` message, the server
folds them in `aggregate`. States are dicts of tensors (see pflrepro.core.loop).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from ..core.aggregation import clone_state, plain_average, state_bytes, weighted_average
from ..core.context import Context, Plan, train_chain
from ..core.training import ce_loss
from ..params import Param, check_params


@dataclass
class Update:
    """What one client sends back after local training."""
    weight: float                      # n_k, for sample-weighted aggregation
    payload: dict = field(default_factory=dict)   # tensors uploaded (params or statistics)
    loss: float = float("nan")
    samples: int = 0                   # samples processed (for FLOPs accounting)
    overlap_samples: int = 0           # of which PM-phase samples, trained after the GM (pflrepro.core.clock: only
    #                                    wait-free overlaps them with communication)
    bytes_up: int = 0
    bytes_down: int = 0


class Algorithm:
    """FedAvg (McMahan et al. 2017): clients start from the global model, run E epochs of
    SGD on cross-entropy, the server takes the sample-weighted average."""
    name = "fedavg"
    HPARAMS: dict[str, Param] = {}
    generic = True            # trains one global model (PM = GM on local tests, Remark 4.1)
    weighted = True           # aggregate weighted by n_k (False: plain mean, as pFedSD's code)
    heterogeneous = False     # True: runs with per-client architectures (`models`): exchanges no whole models

    @classmethod
    def relative_cost(cls, hparams: dict) -> float:
        """Compute per local sample relative to FedAvg; only orders a grid's runs (longest first) and weighs the
        progress estimate (pflrepro.pipeline.parallel.work)."""
        return 1.0

    @classmethod
    def server_work(cls, cfg) -> float:
        """The server's compute per round in sample passes (one image forward and backward), beside the clients'."""
        return 0.0

    def __init__(self, ctx: Context, **hparams):
        self.ctx = ctx
        self.hp = check_params("hparams", hparams, self.HPARAMS)  # defaults filled, ranges checked

    # ---- server side
    def server_init(self) -> dict:
        return {"params": clone_state(self.ctx.init_state)}

    def aggregate(self, rnd: int, server: dict, updates: list[Update], clients: dict) -> dict:
        states = [u.payload for u in updates]
        avg = weighted_average(states, [u.weight for u in updates]) if self.weighted else plain_average(states)
        return {**server, "params": {**server["params"], **avg}}

    # ---- client side
    # The client step is plan -> train -> finish. `plan` says what to train (start state, loss term,
    # trainable parameters, the client's tensors the loss needs), as data; the engine trains it, per
    # client (`Context.train_plan`) or together with other clients (`pflrepro.core.engines.batched`); `finish`
    # turns the trained state into the message and the new client state. Algorithms that override
    # `client_update` itself keep working, client by client.
    def loss(self, rnd: int, k: int, server: dict, cstate: dict | None):
        """The loss term fed to the training primitive (FedAvg: plain CE). A `batchable` term
        (`loss(m, x, y, aux)`) lets the batched engine train clients together."""
        return ce_loss

    def aux(self, rnd: int, k: int, server: dict, cstate: dict | None) -> dict:
        """Client k's tensors the loss term receives as `aux` (e.g. FedProx's anchor)."""
        return {}

    def trainable(self, rnd: int, k: int):
        return None  # all parameters

    def plan(self, rnd: int, k: int, server: dict, cstate: dict | None) -> Plan:
        """Client k's local training as data (FedAvg: from the global model, CE, all parameters)."""
        return Plan(start=server["params"], loss=self.loss(rnd, k, server, cstate),
                    trainable=self.trainable(rnd, k), aux=self.aux(rnd, k, server, cstate))

    def finish(self, rnd: int, k: int, server: dict, cstate: dict | None, state: dict, stats) -> tuple[Update, dict | None]:
        """Message and new client state from the trained `state` (a state dict that the engine
        reuses afterwards: clone what is kept); or `context.Then(plan, done)` to train once more first."""
        return self.upload(k, state, stats, server), None

    @property
    def uses_plans(self) -> bool:
        """True when the client step is plan -> train -> finish (`client_update` not overridden): the batched
        engine (pflrepro.core.engines.batched) can then train this algorithm's clients together."""
        return type(self).client_update is Algorithm.client_update

    def client_update(self, rnd: int, k: int, server: dict, cstate: dict | None) -> tuple[Update, dict | None]:
        return train_chain(self.ctx, k, rnd, self.plan(rnd, k, server, cstate),
                           lambda state, stats: self.finish(rnd, k, server, cstate, state, stats))

    def upload(self, k: int, net, stats, server: dict, keys=None) -> Update:
        """Update carrying `keys` (default: all) of the trained model (`net`: a module or a state dict)."""
        state = net if isinstance(net, dict) else net.state_dict()
        keys = list(state) if keys is None else list(keys)
        sent = {n: state[n].detach().clone() for n in keys}
        nbytes = state_bytes(sent)
        return Update(weight=float(len(self.ctx.data.train[k])), payload=sent, loss=stats.loss,
                      samples=stats.samples, bytes_up=nbytes, bytes_down=nbytes)

    # ---- evaluation
    def global_model(self, server: dict) -> nn.Module | None:
        return self.ctx.model(-1, server["params"]) if "params" in server else None

    def personal_model(self, k: int, server: dict, cstate: dict | None) -> nn.Module | None:
        """Client k's personalized model; None means "the global model" (generic methods)."""
        return None

    def averaged_personal_model(self, server: dict, clients: dict) -> nn.Module | None:
        """SCD Remark 4.1: a PFL method without a GM is scored on the global test set by
        the plain average of its personal models (homogeneous architectures only)."""
        if self.ctx.cfg.heterogeneous:
            return None
        states = [c["params"] for c in clients.values() if c and "params" in c]
        if not states:
            return None
        return self.ctx.model(-1, plain_average(states))
