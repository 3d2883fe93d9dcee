"""Ditto (Li, Hu, Beirami & Smith, ICML 2021): fair and robust federated learning through personalization.

Algorithm 1, per selected client k in round t, which receives the global model w^t:
  - global model: w_k^t from w^t by the FedAvg local solver (E epochs of SGD on CE); w_k^t is sent back
    and the server aggregates as FedAvg (the only model that travels: Ditto's messages are FedAvg's);
  - personal model: `pm_epochs` epochs of SGD on h_k(v; w^t) = F_k(v) + lam/2 ||v - w^t||^2, i.e. the
    step v <- v - eta (grad F_k(v) + lam (v - w^t)), anchored at the w^t the client RECEIVED this round.
v_k starts from the common initial weights (the code initialises local models like the global one) and
is kept per client. Order within a round: GM first, then PM (SCD's "compute-and-wait" protocol); the GM
is batchable (`plan`), and so is the PM, which `finish` answers as a second plan (`context.Then`) with its
own data order (purpose 3). `personal_plan`/`then_personal` are the reusable "then train the PM" step
(SCD trains GM then PM too).
"""
from __future__ import annotations

from ..core.aggregation import clone_state
from ..core.clock import steps_per_epochs
from ..core.context import Plan, Then
from ..core.training import batchable, ce_loss
from ..params import MAX_EPOCHS, Param
from .base import Algorithm


class Ditto(Algorithm):
    name = "ditto"
    generic = False
    HPARAMS = {
        "lam": Param(float, 1.0, "lambda of h_k = F_k(v) + lambda/2 ||v - w^t||^2 (authors' Fashion-MNIST "
                     "scripts: lam=1; their dynamic-lambda candidates {0.1, 1, 2})", low=0.0),
        "pm_epochs": Param(int, 0, "personal-model epochs per round; 0 = local_epochs (the code runs as many "
                           "PM steps as GM steps; SCD Table 4 uses 3 or 5)", low=0, high=MAX_EPOCHS),
    }

    @classmethod
    def relative_cost(cls, hparams):
        return 2.0  # one GM and one PM pass (pm_epochs = local_epochs by default)

    def finish(self, rnd, k, server, cstate, state, stats):
        up = self.upload(k, state, stats, server)        # w_k^t, copied before the module is reused
        v = cstate["params"] if cstate else self.ctx.initial(k)
        anchor = {n: t.detach() for n, t in server["params"].items()}   # w^t as received
        return self.then_personal(up, self.personal_plan(k, v, self.prox, {"anchor": anchor}))

    def personal_plan(self, k: int, start: dict, loss, aux: dict | None = None, epochs: int | None = None) -> Plan:
        """Client k's PM step as a Plan: `start` trained on its data with `loss` (a batchable term fed `aux`)
        for `epochs` (default `pm_epochs`, 0 = local_epochs), data order from seed stream purpose 3; under
        the run clock's wait-free `window` budget, only the steps that fit before the next global model
        arrives (`Clock.pm_steps`)."""
        epochs = epochs if epochs is not None else (self.hp.get("pm_epochs") or self.ctx.cfg.local_epochs)
        steps, clock = None, getattr(self.ctx, "clock", None)
        if clock is not None:
            cap = steps_per_epochs(len(self.ctx.data.train[k]), self.ctx.cfg.batch_size, epochs)
            steps = clock.pm_steps(k, self.ctx.cfg.batch_size, cap)
            steps = None if steps >= cap else steps       # the whole budget: exactly the epochs' batches
        return Plan(start=start, loss=loss, aux=aux or {}, epochs=epochs, steps=steps, purpose=3)

    @staticmethod
    def then_personal(up, plan: Plan) -> Then:
        """Train the PM `plan` after the GM (the engine batches all clients' PM plans), then reply `up`, its
        samples counted as PM-phase samples (pflrepro.core.clock), and keep the trained PM as the client state."""
        def done(state, pstats):
            up.samples += pstats.samples
            up.overlap_samples = pstats.samples           # the PM phase, after the GM (pflrepro.core.clock)
            return up, {"params": clone_state(state)}
        return Then(plan, done)

    @batchable
    def prox(self, m, x, y, aux):
        """h_k(v; w^t) = CE(v) + lam/2 ||v - w^t||^2 over the parameters (buffers are not optimised)."""
        anchor = aux["anchor"]
        reg = sum(((p - anchor[n]) ** 2).sum() for n, p in m.params.items())
        return ce_loss(m, x, y) + 0.5 * self.hp["lam"] * reg

    def personal_model(self, k, server, cstate):
        # v_k; a client never selected has no v_k and is scored with the global model
        return self.ctx.model(k, cstate["params"]) if cstate else None
