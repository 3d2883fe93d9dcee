"""L2GD (Hanzely and Richtarik 2020, "Federated learning of a mixture of global and local models"), a baseline
of FedBSD's Table 1 (FedRep's numbers).

The objective mixes local models x_i with their mean: min sum_i f_i(x_i) + lambda/2 sum_i ||x_i - x_bar||^2.
Loopless local GD flips a coin each step: with probability 1 - p every client takes a local gradient step, with
probability p every x_i moves toward the mean, x_i <- x_i - (eta lambda / (n p)) (x_i - x_bar). In rounds of
communication (ours, as FedEM's implementation `LoopLessLocalSGDAggregator` runs it): the local steps between
two communications are the round's local epochs, and a communication is the mixing step
    x_i <- (1 - theta) x_i + theta x_bar,   theta = eta lambda / (n p)   (`theta`; FedEM: 0.1 / 0.2 = 0.5),
applied when client i next receives x_bar. theta = 1 is FedAvg's training (every client restarts from the
mean), theta = 0 is Local. The server's x_bar: the sample-weighted mean of the uploaded x_i. The personal model
is the client's own x_i (a client not yet trained: its initial model mixed with x_bar).
"""
from __future__ import annotations

from ..core.aggregation import clone_state
from ..core.context import Plan
from ..params import Param
from .base import Algorithm


class L2GD(Algorithm):
    name = "l2gd"
    generic = False
    HPARAMS = {"theta": Param(float, 0.5, "mixing step toward the mean, eta lambda / (n p) (FedEM's L2GD: "
                              "penalty 0.1 / communication probability 0.2)", low=0.0, high=1.0)}

    def mixed(self, k, server, cstate):
        """(1 - theta) x_i + theta x_bar (floating entries; BN's counters from x_bar)."""
        own, t = (cstate["params"] if cstate else self.ctx.initial(k)), self.hp["theta"]
        return {n: ((1 - t) * own[n] + t * g) if g.is_floating_point() else g for n, g in server["params"].items()}

    def plan(self, rnd, k, server, cstate):
        return Plan(start=self.mixed(k, server, cstate))

    def finish(self, rnd, k, server, cstate, state, stats):
        return self.upload(k, state, stats, server), {"params": clone_state(state)}

    def personal_model(self, k, server, cstate):
        return self.ctx.model(k, cstate["params"] if cstate else self.mixed(k, server, None))
