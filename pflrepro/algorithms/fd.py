"""FD, federated distillation (Jeong et al. 2018, "Communication-efficient on-device machine learning:
Federated distillation and augmentation under non-IID private data", arXiv:1811.11479), as a DC-PFL baseline.

No weights are exchanged, so client models may differ. Client i trains its own model with
    CE(F(x), y) + gamma * psi(F(x), F_hat_y),   psi = cross-entropy to the soft target of label y,
and while training adds up its outputs per label: it uploads the local per-label averages and counts
(labels it holds only). The server averages them per label (`weighted`: by counts, i.e. over all
outputs; False: plain mean over the devices holding the label) into the global per-label averages
F_hat it sends back. A label nobody has reported yet (first round) gets no distillation term: plain CE.

`space`: what is averaged. 'logits' (default): raw logits, the target is softmax(F_hat_y);
'probs': softmax outputs (FD calls the softmax-normalised output the "logit vector"), the target is F_hat_y.
`exclude_own`: client i's target leaves out its own last contribution, when it is part of the table
(FD's per-device F_hat^(i)); default off: one global table for everyone.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..core.aggregation import clone_state, state_bytes
from ..params import Param
from .base import Algorithm, Update


def per_class_average(sums: torch.Tensor, counts: torch.Tensor) -> dict:
    """The upload: {classes, counts, means} of the labels present (sums (C, C), counts (C,))."""
    present = counts > 0
    return {"classes": present.nonzero().flatten(), "counts": counts[present],
            "means": sums[present] / counts[present, None]}


def label_weights(counts: torch.Tensor, weighted: bool) -> torch.Tensor:
    return counts if weighted else (counts > 0).to(counts.dtype)


def pool_class_averages(messages: list[dict], num_classes: int, weighted: bool = True):
    """Per-class average of the uploads, weighted by counts (or 1 per device): (averages (C, C), weights (C,))."""
    dev = messages[0]["means"].device
    s = torch.zeros(num_classes, num_classes, dtype=torch.float64, device=dev)
    n = torch.zeros(num_classes, dtype=torch.float64, device=dev)
    for m in messages:
        w = label_weights(m["counts"].double(), weighted)
        n.index_add_(0, m["classes"], w)
        s.index_add_(0, m["classes"], w[:, None] * m["means"].double())
    return (s / n.clamp(min=1)[:, None]).float(), n.float()


def distill_targets(table, counts, own_means=None, own_counts=None):
    """Per-class targets and a validity mask from the server's (table, weights); with `own_*` the
    client's own contribution (its averages and weights) is removed first."""
    s, n = table * counts[:, None], counts.clone()
    if own_means is not None:
        s, n = s - own_means * own_counts[:, None], n - own_counts
    valid = n > 0.5
    return s / n.clamp(min=1)[:, None], valid.float()


class FD(Algorithm):
    name = "fd"
    generic = False
    heterogeneous = True  # only per-class outputs are exchanged
    HPARAMS = {
        "gamma": Param(float, 1.0, "weight of the distillation term", low=0.0),
        "space": Param(str, "logits", "average raw 'logits' (target softmax of the average) or softmax 'probs'",
                       choices=("logits", "probs")),
        "exclude_own": Param(bool, False, "leave the client's own last upload out of its target (FD's F_hat^(i))"),
        "weighted": Param(bool, True, "server average weighted by counts (False: plain mean over devices)"),
    }

    def server_init(self):
        C = self.ctx.data.spec.num_classes
        return {"table": torch.zeros(C, C, device=self.ctx.device), "counts": torch.zeros(C, device=self.ctx.device),
                "round": torch.tensor(0)}

    def targets(self, server, cstate):
        if float(server["counts"].sum()) == 0:
            return None, None                    # first round: nothing to distil from
        own = self.hp["exclude_own"] and cstate is not None and int(cstate["round"]) == int(server["round"])
        mine = (cstate["means"], label_weights(cstate["counts"], self.hp["weighted"])) if own else ()
        return distill_targets(server["table"], server["counts"], *mine)

    def fd_loss(self, target, valid, sums, counts):
        gamma, probs = self.hp["gamma"], self.hp["space"] == "probs"

        def loss(net, x, y):
            z = net(x)
            with torch.no_grad():  # FD: per-label sums of the outputs seen during local training
                sums.index_add_(0, y, F.softmax(z, 1) if probs else z)
                counts.index_add_(0, y, torch.ones_like(y, dtype=counts.dtype))
            value = F.cross_entropy(z, y)
            if target is not None:
                q = target[y] if probs else F.softmax(target[y], 1)
                psi = -(q * F.log_softmax(z, 1)).sum(1)
                value = value + gamma * (valid[y] * psi).mean()
            return value
        return loss

    def client_update(self, rnd, k, server, cstate):
        net = self.ctx.model(k, cstate["params"] if cstate else self.ctx.initial(k))
        C = self.ctx.data.spec.num_classes
        sums, counts = torch.zeros(C, C, device=self.ctx.device), torch.zeros(C, device=self.ctx.device)
        stats = self.ctx.train(net, k, rnd, loss=self.fd_loss(*self.targets(server, cstate), sums, counts))
        msg = per_class_average(sums, counts)
        sent = server["counts"] > 0
        down = state_bytes({"t": server["table"][sent], "n": server["counts"][sent]})
        up = Update(weight=float(len(self.ctx.data.train[k])), payload=msg, loss=stats.loss,
                    samples=stats.samples, bytes_up=state_bytes(msg), bytes_down=down)
        own = {"means": torch.zeros(C, C, device=sums.device), "counts": counts}
        own["means"][msg["classes"]] = msg["means"]
        return up, {"params": clone_state(net.state_dict()), "round": torch.tensor(rnd), **own}

    def aggregate(self, rnd, server, updates, clients):
        table, counts = pool_class_averages([u.payload for u in updates], self.ctx.data.spec.num_classes,
                                            self.hp["weighted"])
        return {"table": table, "counts": counts, "round": torch.tensor(rnd)}

    def global_model(self, server):
        return None

    def personal_model(self, k, server, cstate):
        return self.ctx.model(k, cstate["params"] if cstate else self.ctx.initial(k))
