"""FedBSD (Personalized Federated Learning via Backbone Self-Distillation), Sec. 3 and Alg. 1.

FedRep's round (the last layer is a private head, never uploaded; every other layer is the shared backbone,
averaged by n_k) with the backbone phase replaced by self-distillation:
  1. from the received global backbone and its own head, the client trains the HEAD only on CE
     ("the private head requires 10 rounds of updates", as FedRep);
  2. then the BACKBONE only, on (eq. 9)
         L = (1 - a) * CE(head(f_s(x)), y) + a * T^2 * KL( softmax(f_t(x) / T) || softmax(f_s(x) / T) )
     with teacher f_t = "the global backbone received from the server" (frozen) and student f_s = "the original
     local backbone" (Alg. 1): the client's own backbone from its last round (the received one before its first)
     ("the objective of distillation here has changed to features rather than logits");
  3. uploads the backbone and keeps it: the client's personalized model is its distilled backbone with its
     private head (Sec. 3: self-distillation "improves the performance of the local backbone").
`student="global"` is the ablation that starts the student from the received backbone and scores the server's
backbone with the client's head (FedRep's scoring).
Our copy of the paper lost its equations and values: a = 0.5 is its "equal contribution"; T, the T^2 factor
(Hinton et al.'s convention, as pFedSD's code), where the student starts and the teacher's mode are
documented choices (docs/fidelity.md "FedBSD") and hyperparameters here.
The backbone phase runs client by client inside `finish` (FedRep's body phase is a second plan the
engine batches, `context.Then`; this one is not): its loss reads the backbone's features through the
module, which a batched loss term (`engine.ModelView`) does not see.
Real-world experiments (Fig. 3) keep every BatchNorm layer on the client ("we adopt this exclusion BN strategy
in our approach FedBSD", FedBN's): `local_bn=True` trains BN layers with the backbone but neither uploads nor
averages them (they stay in the client state with the head); the teacher is the received backbone with the
client's own BN layers (the server has none to send).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..core.context import Plan
from ..core.training import TrainStats
from ..data.models import bn_names
from ..params import Param
from .fedrep import FedRep


def feature_kd(student_feat: torch.Tensor, teacher_feat: torch.Tensor, temperature: float) -> torch.Tensor:
    """T^2 * KL(softmax(t / T) || softmax(s / T)) over the feature dimension, averaged over the batch."""
    p_t = F.softmax(teacher_feat.flatten(1) / temperature, dim=1)
    log_p_s = F.log_softmax(student_feat.flatten(1) / temperature, dim=1)
    return temperature * temperature * F.kl_div(log_p_s, p_t, reduction="batchmean")


class FedBSD(FedRep):
    name = "fedbsd"
    HPARAMS = {
        **FedRep.HPARAMS,
        "a": Param(float, 0.5, "weight factor a of the distillation term, (1 - a) on CE (paper: a = 0.5, 'local "
                   "training and global knowledge make an equal contribution')", low=0.0, high=1.0),
        "temperature": Param(float, 3.0, "softmax temperature T on the features (value lost in our copy; 3 as "
                             "pFedSD, which FedBSD compares with)", low=0.0, low_open=True),
        "student": Param(str, "own", "where the student backbone starts, and so which backbone the client's "
                         "personalized model has: 'own' (Alg. 1: 'the student model is the original local "
                         "backbone', the client's own distilled backbone, kept and scored) or 'global' (ablation: "
                         "the received backbone replaces the previous one, Sec. 3.2, and the client is scored with "
                         "the server's backbone, as FedRep)", choices=("own", "global")),
        "teacher_mode": Param(str, "eval", "teacher forward: 'eval' (BN running statistics) or 'train'",
                              choices=("eval", "train")),
        "local_bn": Param(bool, False, "keep BatchNorm layers local (FedBN's exclusion, FedBSD's real-world "
                          "experiments, Fig. 3): trained with the backbone, never uploaded"),
    }

    def __init__(self, ctx, **hparams):
        super().__init__(ctx, **hparams)
        self._bn = frozenset(bn_names(ctx.model(0))) if self.hp["local_bn"] else frozenset()

    def is_head(self, name: str) -> bool:
        """The private head (the last layer), whether or not BN layers are local too."""
        return name.rsplit(".", 1)[0] in self._head

    def is_body(self, name: str) -> bool:
        """The backbone, trained by self-distillation: every layer but the head (BN included)."""
        return not self.is_head(name)

    def is_shared(self, name: str) -> bool:
        """What is uploaded and averaged: the backbone, less its BN layers under `local_bn`."""
        return self.is_body(name) and name not in self._bn

    @classmethod
    def relative_cost(cls, hparams):
        hp = {n: hparams.get(n, p.default) for n, p in cls.HPARAMS.items()}
        return hp["head_epochs"] / 3 + hp["body_epochs"] * 4 / 3   # + one teacher forward per body step

    def local_state(self, k, server, cstate):
        state = super().local_state(k, server, cstate)
        if self.hp["student"] == "own" and cstate and "body" in cstate:
            state = {**state, **cstate["body"]}
        return state

    def plan(self, rnd, k, server, cstate):
        return Plan(start=self.local_state(k, server, cstate), trainable=self.is_head, epochs=self.hp["head_epochs"])

    def finish(self, rnd, k, server, cstate, state, stats):
        """Phase 2: the backbone by self-distillation from the received global backbone, then FedPer's message."""
        teacher = self.ctx.make_model(k).to(self.ctx.device)      # its own module: ctx.model's is the student's
        teacher.load_state_dict({**state, **{n: t for n, t in server["params"].items() if self.is_shared(n)}})
        teacher.train(self.hp["teacher_mode"] == "train")
        a, temp = self.hp["a"], self.hp["temperature"]

        def loss(net, x, y):
            f_s = net.features(x)
            with torch.no_grad():
                f_t = teacher.features(x)
            return (1 - a) * F.cross_entropy(net.head(f_s), y) + a * feature_kd(f_s, f_t, temp)

        net = self.ctx.model(k, state)
        body = self.ctx.train(net, k, rnd, loss=loss, trainable=self.is_body, epochs=self.hp["body_epochs"],
                              purpose=1)
        n = stats.samples + body.samples
        both = TrainStats(loss=(stats.loss * stats.samples + body.loss * body.samples) / max(n, 1),
                          steps=stats.steps + body.steps, samples=n)
        up, cst = super(FedRep, self).finish(rnd, k, server, cstate, net.state_dict(), both)
        if self.hp["student"] == "own":
            cst["body"] = {n_: t.detach().clone() for n_, t in up.payload.items()}
        return up, cst
