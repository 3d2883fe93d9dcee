"""FedPAC (Xu, Tong and Huang, ICLR 2023, "Personalized federated learning with feature alignment and
classifier collaboration"), a baseline of FedBSD's Table 1 and Fig. 4.

FedPer's split (body shared, head personal). Per round a selected client, from the global body and the head
the server last combined for it (its initial head before that):
1. reports the statistics of its current features f(x) over its training data: per class c the share
   p_c = n_c / n and mean mu_c; H = [p_c mu_c]_c (C x d) and V = (sum_c p_c E_c||f||^2 - sum_c p_c^2 ||mu_c||^2) / n
   (the authors' `statistics_extraction`);
2. trains the head alone for `head_epochs` at `head_lr` (the code: 1 epoch at 0.1);
3. trains the body alone for `body_epochs` on CE + lam * MSE(f(x), c_y): c_y the global prototype of class y,
   or the client's own class mean from before training where no global one exists (no alignment in the
   first round, as the code's `round > 0`);
4. uploads body, head, its class means after training and its class counts.
Server: the body averaged by n_k; global prototypes = class-count-weighted means of this round's uploads;
for each selected client i a combination of the uploaded heads, alpha_i = argmin a^T (diag(V) + D_i) a over
the simplex, D_i[j, l] = sum_c (H_i[c] - H_j[c]) . (H_i[c] - H_l[c]) (eq. 11: variance plus bias of the
combined classifier), weights below `eps` dropped and the rest renormalised (the code's 1e-3 cut and
`agg_classifier_weighted_p`). Solved with scipy's SLSQP (the code: cvxpy). The personal model: the global
body with the client's combined head.
"""
from __future__ import annotations

import numpy as np
import torch

from ..core.aggregation import clone_state, plain_average, state_bytes, weighted_average
from ..core.training import TrainStats
from ..params import MAX_EPOCHS, Param
from .base import Update
from .partial import FedPer
from .stats import aligned_ce, class_stats, features, pool_means, targets_bytes


def feature_statistics(z: torch.Tensor, y: torch.Tensor, num_classes: int) -> tuple[float, torch.Tensor]:
    """(V, H) of one client's features z (n x d) with labels y, as the authors' `statistics_extraction`."""
    n, d = z.shape
    z64, v = z.double(), 0.0
    h = torch.zeros(num_classes, d, dtype=torch.float64, device=z.device)
    for c in torch.unique(y).tolist():
        zc = z64[y == c]
        p, mu = len(zc) / n, zc.mean(0)
        h[c] = p * mu
        v += p * float((zc ** 2).sum(1).mean()) - p * p * float(mu @ mu)
    return v / n, h


def combination_weights(v: torch.Tensor, hs: torch.Tensor, i: int, eps: float = 1e-3) -> np.ndarray:
    """Client i's weights over the m uploaded heads: argmin a^T (diag(v) + D_i) a on the simplex, weights
    below `eps` set to 0, renormalised. `hs`: (m, C, d) stacked H."""
    from scipy.optimize import minimize
    diff = (hs[i][None] - hs).flatten(1).double()                 # (m, C d): H_i - H_j
    p = (torch.diag(v.double()) + diff @ diff.T).cpu().numpy()
    m = len(p)
    res = minimize(lambda a: a @ p @ a, np.full(m, 1.0 / m), jac=lambda a: 2 * p @ a, method="SLSQP",
                   bounds=[(0.0, 1.0)] * m, constraints=[{"type": "eq", "fun": lambda a: a.sum() - 1.0}],
                   options={"ftol": 1e-12, "maxiter": 500})
    a = np.where(res.x > eps, res.x, 0.0)
    if not res.success or a.sum() <= 0:
        a = np.eye(m)[i]                                       # the code's fallback: the client's own head
    return a / a.sum()


class FedPAC(FedPer):
    name = "fedpac"
    needs_body = True    # head and body train in separate phases
    HPARAMS = {
        "head_layers": Param(int, 1, "how many last layers form the personal head (FedPAC: the classifier)", low=1),
        "head_epochs": Param(int, 1, "head-only epochs a round, first (the code: 1)", low=0, high=MAX_EPOCHS),
        "head_lr": Param(float, 0.1, "the head phase's learning rate (the code: 0.1)", low=0.0, low_open=True),
        "body_epochs": Param(int, 1, "body-only epochs a round, after the head (the code: local_epoch)", low=0, high=MAX_EPOCHS),
        "lam": Param(float, 1.0, "weight of the feature alignment MSE (the code's --lam default 1)", low=0.0),
        "eps": Param(float, 1e-3, "combination weights below this are dropped (the code: 1e-3)", low=0.0),
    }

    @classmethod
    def relative_cost(cls, hparams):
        hp = {n: hparams.get(n, p.default) for n, p in cls.HPARAMS.items()}
        return hp["head_epochs"] / 3 + hp["body_epochs"] + 1    # + the statistics and prototype passes

    def server_init(self):
        s = super().server_init()
        C, d = s["params"]["head.weight"].shape
        dev = self.ctx.device
        return {**s, "heads": {}, "protos": torch.zeros(C, d, device=dev), "has_proto": torch.zeros(C, dtype=torch.bool, device=dev)}

    def is_head(self, name: str) -> bool:
        return not self.is_shared(name)

    def local_state(self, k, server, cstate):
        head = server["heads"].get(str(k)) or {n: t for n, t in self.ctx.initial(k).items() if self.is_head(n)}
        return {**{n: t for n, t in server["params"].items() if self.is_shared(n)}, **head}

    def client_update(self, rnd, k, server, cstate):
        net = self.ctx.model(k, self.local_state(k, server, cstate))
        x, y = self.ctx.data.client_train(k)
        C = server["protos"].shape[0]
        z = features(net, x)
        v, h = feature_statistics(z, y, C)                                    # 1. before training
        own = class_stats(z, y, cov=False)
        head = self.ctx.train(net, k, rnd, trainable=self.is_head, epochs=self.hp["head_epochs"],
                              lr=self.hp["head_lr"])                           # 2.
        has_own = torch.zeros(C, dtype=torch.bool, device=z.device)
        has_own[own["classes"]] = True
        targets = server["protos"].clone()
        missing = has_own & ~server["has_proto"]
        targets[own["classes"][missing[own["classes"]]]] = own["means"][missing[own["classes"]]].to(targets.dtype)
        loss = aligned_ce(self.hp["lam"], targets, server["has_proto"] | has_own, "mse") \
            if bool(server["has_proto"].any()) else aligned_ce(0.0, targets, has_own, "mse")
        body = self.ctx.train(net, k, rnd, trainable=self.is_shared, epochs=self.hp["body_epochs"], loss=loss,
                              purpose=1)                                       # 3.
        state = clone_state(net.state_dict())
        protos = class_stats(features(net, x), y, cov=False)
        sent = {"client": torch.tensor(k), "params": state, "v": torch.tensor(v, dtype=torch.float64, device=h.device), "h": h,
                **{f"proto_{n}": t for n, t in protos.items()}}
        up = state_bytes(state) + state_bytes(protos) + state_bytes({"v": sent["v"], "h": h})
        n = head.samples + body.samples
        stats = TrainStats(loss=(head.loss * head.samples + body.loss * body.samples) / max(n, 1),
                           steps=head.steps + body.steps, samples=n)
        down = state_bytes(self.local_state(k, server, cstate)) + targets_bytes(server["protos"], server["has_proto"])
        return Update(weight=float(len(y)), payload=sent, loss=stats.loss, samples=stats.samples,
                      bytes_up=up, bytes_down=down), None

    def aggregate(self, rnd, server, updates, clients):
        states = [u.payload["params"] for u in updates]
        body = weighted_average([{n: t for n, t in s.items() if self.is_shared(n)} for s in states],
                                [u.weight for u in updates])
        C = server["protos"].shape[0]
        cnt, protos = pool_means([{k[6:]: t for k, t in u.payload.items() if k.startswith("proto_")} for u in updates], C)
        v = torch.stack([u.payload["v"] for u in updates])
        hs = torch.stack([u.payload["h"] for u in updates])
        heads, uploaded = dict(server["heads"]), [{n: t for n, t in s.items() if self.is_head(n)} for s in states]
        for i, u in enumerate(updates):
            a = combination_weights(v, hs, i, self.hp["eps"])
            heads[str(int(u.payload["client"]))] = weighted_average(uploaded, list(a))
        return {**server, "params": {**server["params"], **body}, "heads": heads,
                "protos": protos.to(server["protos"].dtype), "has_proto": cnt > 0}

    def personal_model(self, k, server, cstate):
        return self.ctx.model(k, self.local_state(k, server, cstate))

    def averaged_personal_model(self, server, clients):
        """SCD Remark 4.1: the plain average of the personal models of the clients that have trained."""
        states = [self.local_state(int(k), server, None) for k in server["heads"]]
        return self.ctx.model(-1, plain_average(states)) if states else None
