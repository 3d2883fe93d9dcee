"""Per-FedAvg (Fallah, Mokhtari & Ozdaglar, NeurIPS 2020): personalized federated learning with theoretical
guarantees, a model-agnostic meta-learning (MAML) approach.

The objective is F(w) = mean_i f_i(w - alpha grad f_i(w)): a global model w that is good *after one step of
gradient descent* on each client's own data. Algorithm 1 of the paper, round k:
  - the server sends w_k to the selected clients;
  - client i starts from w = w_k and takes tau local steps, each on independent batches D, D' (and D''):
        temp = w - alpha * grad f_i(w; D)                                   (inner step, size alpha)
        w    = w - beta * (I - alpha * H_i(w; D'')) grad f_i(temp; D')      (outer step, size beta)
    `variant: fo` (Per-FedAvg (FO)) drops the Hessian term: w = w - beta * grad f_i(temp; D'), the gradient at
    temp applied to w; `variant: hf` keeps it as a Hessian-vector product;
  - the server averages the returned models (base class: FedAvg's average, see `weighted`).
The personalized model of client i (the paper's evaluation, PerFed-CKT's "Per-FedAvg (LM)") is the global
model after one step of SGD with step alpha on the client's training data; the global model (PerFed-CKT's
"Per-FedAvg (GM)", `eval_gm_local` scores it on the local test sets) is w as it is.

How it maps onto the engine. One local step is one call of the training primitive's loss term
(`training.local_train`): the primitive draws a batch of `parts x batch_size` samples (parts = 2 for FO, 3 for
HF) from its seeded permutation (seed derive_seed(seed, rnd, k, 0)), and `meta_loss` splits it into D, D'
(, D'') of batch_size samples each (PFLlib's clientperavg loads batches of 2B and splits them in halves;
FL-bench draws two (three) loader batches of B per step). Inside the term:
    g    = grad f(w; D)                       (torch.autograd.grad, no graph: a constant)
    temp = w - alpha * g                      (d temp / d w = I)
    L    = f(temp; D')                        (torch.func.functional_call at temp)
so the primitive's backward gives dL/dw = grad f(temp; D') exactly: the FO meta-gradient. For HF the term adds
-alpha * (<grad f(w; D''), v> - its value), v = grad f(temp; D') held constant, whose gradient is
-alpha * H(w; D'') v, an exact autograd Hessian-vector product (the paper's HF variant and FL-bench approximate
H v by finite differences (grad f(w + delta v) - grad f(w - delta v)) / (2 delta), FL-bench: delta = 0.001;
this is its limit delta -> 0). The primitive's optimiser takes the outer step with lr = beta (and the run's
momentum, weight decay and gradient clipping act on the meta-gradient: momentum = weight_decay = 0 gives
Algorithm 1 exactly; PerFed-CKT runs all baselines without either). The primitive's batch size is not a Plan
field, so the client step is a `client_update` override (per client; the batched engine does not train it).
The reported training loss is f(temp; D'), the loss after the inner step (PFLlib's train_metrics reports the
same quantity).

Choices where the papers are silent or differ, and why:
  - alpha (inner and evaluation step) defaults to the run's client lr `cfg.lr`: FL-bench, PFLlib and the pFedMe
    authors' Per-FedAvg code all take the inner step with the client optimiser's learning rate. beta defaults
    to 0.001: FL-bench's default (`--beta 1e-3`) and the pFedMe authors' Per-FedAvg runs
    (`--learning_rate 0.005 --beta 0.001`); PFLlib instead sets beta = learning_rate (set `beta` to cfg.lr for
    that). The Per-FedAvg paper's own experimental step sizes could not be checked against its text here. The
    reproducing papers state no alpha/beta: PerFed-CKT "do[es] a grid search over the learning rate"
    and uses "the best hyper-parameter for each benchmark after doing a grid search over feasible parameters
    referring to their source codes", with "[no] momentum acceleration or weight decay to local training";
    FedBSD sets one learning rate "for all approaches" (the value is lost in our copy). SCD only cites
    Per-FedAvg as related work ("meta-learning [34, 35]"), with no numbers.
  - Local steps per round: `steps: 0` (default) = `local_epochs` passes over the client's data, each step
    reading parts x batch_size samples (ceil(n / (parts B)) steps per epoch; the last, partial batch is split in
    near-equal parts, or reused whole as D = D' (= D'') when it has fewer samples than parts); `steps: tau` =
    tau steps, the paper's tau (the pFedMe code's `local_epochs` = 20 is such a tau), cycling through reshuffled
    passes.
  - Aggregation: sample-weighted (`weighted: true`, FedAvg's, as PFLlib and the pFedMe code); Algorithm 1
    itself takes the plain mean (1/rn) sum_i w^i (FL-bench: weight 1): `weighted: false`.
  - Personalized model: `ft_steps` (default 1, the paper's one step) SGD steps of size alpha, each on one batch
    of batch_size from a seeded permutation of the client's training data (`ft_data: batch`; PFLlib's
    `train_one_step`: the first batch of its shuffled loader) or on the full local training set
    (`ft_data: full`: a deterministic gradient step). FL-bench instead fine-tunes at least one whole epoch
    (`finetune_epoch = max(1, ...)`): `ft_steps` = ceil(n / B) approximates it. Plain SGD (no momentum, weight
    decay or clipping), as the codes' optimisers do. The batch is drawn from derive_seed(seed, 0, k, 1): the
    same batch at every evaluation of client k (round 0 = evaluation, as FedAvgFT); the adaptation never feeds
    back into training. BN statistics (if any) move with the adaptation step's train-mode forward, as in the
    codes.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..core.seeds import derive_seed
from ..core.training import local_train
from ..params import MAX_STEPS, Param
from .base import Algorithm


class PerFedAvg(Algorithm):
    name = "perfedavg"
    generic = False
    HPARAMS = {
        "alpha": Param(float, None, "inner step size alpha, also the evaluation step; None = the run's lr "
                       "(FL-bench, PFLlib and the pFedMe code take the inner step with the client lr)",
                       low=0.0, low_open=True),
        "beta": Param(float, 0.001, "outer (meta) step size beta, the step the optimiser takes (FL-bench default "
                      "1e-3; pFedMe's Per-FedAvg runs: 0.001; PFLlib: beta = lr)", low=0.0, low_open=True),
        "variant": Param(str, "fo", "'fo': first-order (the gradient at temp applied to w); 'hf': with the "
                         "Hessian-vector correction (I - alpha H(w; D'')) on a third batch (exact autograd HVP)",
                         choices=("fo", "hf")),
        "steps": Param(int, 0, "local MAML steps per round: 0 = local_epochs passes (each step reads 2 (hf: 3) "
                       "batches); tau > 0 = tau steps (the paper's tau)", low=0, high=MAX_STEPS),
        "ft_steps": Param(int, 1, "SGD steps of size alpha from the global model for the personalized model "
                          "(paper: one step; 0 = evaluate the global model)", low=0, high=MAX_STEPS),
        "ft_data": Param(str, "batch", "data of each personalization step: one batch of batch_size ('batch', the "
                         "codes' train_one_step) or the full local training set ('full')",
                         choices=("batch", "full")),
        "weighted": Param(bool, True, "sample-weighted average (FedAvg, PFLlib, pFedMe code); false = the plain "
                          "mean of Algorithm 1 (FL-bench)"),
    }

    @classmethod
    def relative_cost(cls, hparams):
        return 2.0 if hparams.get("variant", "fo") == "hf" else 1.0   # the HVP: a second backward on D''

    def __init__(self, ctx, **hparams):
        super().__init__(ctx, **hparams)
        self.weighted = self.hp["weighted"]

    # ---- hyperparameters resolved against the run
    @property
    def alpha(self) -> float:
        a = self.hp["alpha"]
        return float(self.ctx.cfg.lr if a is None else a)

    @property
    def parts(self) -> int:
        return 3 if self.hp["variant"] == "hf" else 2

    # ---- the loss, per sample batch; a subclass may change it (the unit tests use a quadratic)
    @staticmethod
    def criterion(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out, y)

    def split(self, xb: torch.Tensor, yb: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """D, D' (, D''): the step's batch cut into `parts` consecutive near-equal pieces (B samples each for a
        full batch of parts x B); a batch with fewer samples than parts is used whole for every piece."""
        p = self.parts
        if len(yb) < p:
            return [(xb, yb)] * p
        return list(zip(xb.tensor_split(p), yb.tensor_split(p)))

    def meta_loss(self, net, xb, yb):
        """Loss term of one local step: value f(temp; D'); gradient w.r.t. w the FO meta-gradient
        grad f(temp; D') (temp = w - alpha grad f(w; D), the inner gradient a constant), minus
        alpha H(w; D'') grad f(temp; D') for `hf`."""
        alpha = self.alpha
        parts = self.split(xb, yb)
        (x1, y1), (x2, y2) = parts[0], parts[1]
        names = [n for n, p in net.named_parameters() if p.requires_grad]
        params = [p for p in net.parameters() if p.requires_grad]
        grads = _grad(self.criterion(net(x1), y1), params)                  # grad f(w; D), no graph
        temp = {n: p - alpha * g for n, p, g in zip(names, params, grads)}  # d temp / d w = I
        outer = self.criterion(torch.func.functional_call(net, temp, (x2,)), y2)
        if self.hp["variant"] == "hf":
            x3, y3 = parts[2]
            v = _grad(outer, params, retain_graph=True)                      # grad f(temp; D'), constant
            g3 = _grad(self.criterion(net(x3), y3), params, create_graph=True)
            dot = sum((a * b).sum() for a, b in zip(g3, v))                  # d/dw = H(w; D'') v
            outer = outer - alpha * (dot - dot.detach())
        return outer

    def adapt_loss(self, net, xb, yb):
        return self.criterion(net(xb), yb)

    # ---- client side
    def client_update(self, rnd, k, server, cstate):
        net = self.ctx.model(k, server["params"])
        stats = self.ctx.train(net, k, rnd, loss=self.meta_loss, lr=self.hp["beta"], steps=self.hp["steps"] or None,
                               batch_size=self.parts * self.ctx.cfg.batch_size)
        return self.upload(k, net, stats, server), None

    # ---- evaluation
    def personal_model(self, k, server, cstate):
        """The global model after `ft_steps` plain SGD steps of size alpha on client k's training data (the
        shared module of k's architecture: valid until the next `ctx.model` call)."""
        net = self.ctx.model(k, server["params"])
        x, y = self.ctx.data.client_train(k)
        if self.hp["ft_steps"] == 0 or len(y) == 0:
            return net
        bs = len(y) if self.hp["ft_data"] == "full" else self.ctx.cfg.batch_size
        # purpose=1, round 0: a data-order stream of its own, the same at every evaluation
        local_train(net, x, y, epochs=1, batch_size=bs, lr=self.alpha, loss=self.adapt_loss,
                    seed=derive_seed(self.ctx.cfg.seed, 0, k, 1), steps=self.hp["ft_steps"])
        return net


def _grad(value: torch.Tensor, params: list, **kw) -> list[torch.Tensor]:
    """d value / d params, zeros for parameters the value does not reach."""
    gs = torch.autograd.grad(value, params, allow_unused=True, **kw)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, gs)]
