"""FedALA (Zhang, Hua, Wang, Shen, Guan & Cao, AAAI 2023): adaptive local aggregation for personalized FL.

Before local training, each selected client initialises its model from the global model it received (theta_g) and
its own old local model (theta_l) by Adaptive Local Aggregation (ALA; authors' code `system/utils/ALA.py`):
  - the lower parameters, all but the last `layer_idx` tensors of `named_parameters()`, are theta_g's;
  - the higher ones are theta = theta_l + (theta_g - theta_l) * W, with element-wise weights W kept per client
    (ones before the first ALA);
  - W is learned on a contiguous slice of `rand_percent` % of the client's training data at a random start, batch
    by batch in row order: W <- clip(W - eta * dL/dtheta * (theta_g - theta_l), 0, 1), then theta recomputed from
    W (the chain rule of theta's form; a projected step: `ala_step`);
  - the first time ALA runs, passes over the slice repeat until the standard deviation of the last `num_pre_loss`
    passes' final-batch losses is below `threshold` (at most `max_ala_passes`, a cap the code has not); later, one
    pass a round;
  - ALA is skipped while the first parameter tensor of theta_g minus theta_l sums to 0 (the code's test: the first
    round, when every client holds the initial weights).
Then E epochs of plain SGD on cross-entropy from theta, the whole model uploaded and averaged by n_k (FedAvg); the
client keeps its trained model and W, and is scored with that model.

In the engines (docs/architecture.md, "Methods that do not fit"): an ALA pass is a `Plan` that trains only the
higher tensors, on `Plan.rows` (the slice) with `shuffle=False`, by the custom step `Plan.update = ala_step` (state
W, `update_state`); `finish` answers `Then` another pass until the rule stops, then the local training. Both kinds
of plan batch across clients. Where this differs from the authors' code: docs/fidelity.md, "FedALA".
"""
from __future__ import annotations

import numpy as np
import torch

from ..core.aggregation import clone_state
from ..core.context import Plan, Then
from ..core.seeds import derive_seed
from ..params import Param
from .base import Algorithm

ALA_PURPOSE = 5      # seed stream of the ALA passes (dropout draws; their batches are in row order)
SLICE_PURPOSE = 6    # seed stream of the slice's random start


def converged(losses: list, num_pre_loss: int, threshold: float) -> bool:
    """The code's stopping rule of the first ALA: more than `num_pre_loss` passes, and the (population) standard
    deviation of the last `num_pre_loss` passes' losses below `threshold`."""
    return len(losses) > num_pre_loss and float(np.std(losses[-num_pre_loss:])) < threshold


def slice_rows(n: int, percent: int, seed: int) -> torch.Tensor:
    """The ALA sample: int(percent / 100 * n) consecutive rows from a start drawn uniformly in [0, n - that]
    (the code's `random.randint`, both ends included), from a generator seeded by `seed`."""
    m = int(percent / 100 * n)
    start = int(torch.randint(0, n - m + 1, (1,), generator=torch.Generator().manual_seed(seed)))
    return torch.arange(start, start + m)


class FedALA(Algorithm):
    name = "fedala"
    generic = False
    HPARAMS = {
        "eta": Param(float, 1.0, "eta, the weights' learning rate (Eq. 5; the code's -et, default 1.0)", low=0.0,
                     low_open=True),
        "rand_percent": Param(int, 80, "s: % of a client's training data ALA learns W on (the code's -s, 80)",
                              low=1, high=100),
        "layer_idx": Param(int, 2, "p: the last p parameter tensors are aggregated adaptively, the others taken from "
                           "the global model (the code's -p, 2: the last layer's weight and bias; 0: all)", low=0),
        "threshold": Param(float, 0.1, "first ALA: stop once the std of the last num_pre_loss passes' losses is below "
                           "it (ALA.py's default 0.1; its README says the paper ran 0.01)", low=0.0, low_open=True),
        "num_pre_loss": Param(int, 10, "passes the first ALA's stopping rule reads (ALA.py's default)", low=1),
        "max_ala_passes": Param(int, 500, "at most this many passes in the first ALA (the code has no cap; its "
                                "README warns a small threshold can leave a run stuck)", low=1),
    }

    @classmethod
    def relative_cost(cls, hparams):
        return 1.0 + hparams.get("rand_percent", 80) / 100     # E epochs and one pass over the sample (E = 1)

    def layers(self) -> tuple[list, list]:
        """(lower, higher) parameter names, by the code's slicing of `parameters()`: [:-p] and [-p:]."""
        names = [n for n, _ in self.ctx.model(-1).named_parameters()]
        p = self.hp["layer_idx"]
        return names[:-p], names[-p:]

    def plan(self, rnd, k, server, cstate):
        glob, local = server["params"], (cstate["params"] if cstate else self.ctx.initial(k))
        lower, higher = self.layers()
        first = (lower + higher)[0]
        if float(torch.sum(glob[first] - local[first])) == 0:       # the code's test: nothing to aggregate yet
            return Plan(start=local)
        W = cstate["W"] if cstate and "W" in cstate else {n: torch.ones_like(local[n]) for n in higher}
        diff = {n: glob[n] - local[n] for n in higher}
        start = {**local, **{n: glob[n] for n in lower}, **{n: local[n] + diff[n] * W[n] for n in higher}}
        rows = slice_rows(len(self.ctx.data.train[k]), self.hp["rand_percent"],
                          derive_seed(self.ctx.cfg.seed, rnd, k, SLICE_PURPOSE))
        if not len(rows):                                           # nothing to learn W on: theta as it stands
            return Plan(start=start)
        return Plan(start=start, trainable=set(higher).__contains__, aux={"local": {n: local[n] for n in higher},
                    "diff": diff}, epochs=1, rows=rows, shuffle=False, update=self.ala_step, update_state=W,
                    purpose=ALA_PURPOSE)

    def ala_step(self, params, grads, W, aux):
        """One ALA step (Eq. 5, projected): W <- clip(W - eta * g * (theta_g - theta_l), 0, 1), theta = theta_l +
        (theta_g - theta_l) * W, as ALA.py computes them."""
        W = {n: torch.clamp(W[n] - self.hp["eta"] * (grads[n] * aux["diff"][n]), 0, 1) for n in W}
        return {n: aux["local"][n] + aux["diff"][n] * W[n] for n in params}, W

    def finish(self, rnd, k, server, cstate, state, stats):
        if stats.update_state is None:            # ALA skipped: `state` is the locally trained model
            return self.reply(k, server, cstate, state, stats, cstate["W"] if cstate and "W" in cstate else None, 0)
        return self.after_pass(rnd, k, server, cstate, state, stats, [], 0)

    def after_pass(self, rnd, k, server, cstate, state, stats, losses, samples):
        """After an ALA pass: another pass (first ALA, until `converged`), else the local training from theta."""
        losses, samples = losses + [stats.last], samples + stats.samples
        W = {n: t.detach().clone() for n, t in stats.update_state.items()}
        first_ala = not (cstate and "W" in cstate)
        hp = self.hp
        if first_ala and not converged(losses, hp["num_pre_loss"], hp["threshold"]) and len(losses) < hp["max_ala_passes"]:
            again = self.plan(rnd, k, server, cstate)
            again.start, again.update_state = clone_state(state), W
            return Then(again, lambda s, st: self.after_pass(rnd, k, server, cstate, s, st, losses, samples))
        return Then(Plan(start=clone_state(state)),
                    lambda s, st: self.reply(k, server, cstate, s, st, W, samples))

    def reply(self, k, server, cstate, state, stats, W, ala_samples):
        """The trained model uploaded (FedAvg) and kept with W."""
        up = self.upload(k, state, stats, server)
        up.samples += ala_samples
        return up, {"params": clone_state(state), **({"W": W} if W is not None else {})}

    def personal_model(self, k, server, cstate):
        # the client's model after its last local training; a client never selected is scored with the global model
        return self.ctx.model(k, cstate["params"]) if cstate else None
