"""FedFomo (Zhang et al., ICLR 2021): personalized FL with first-order model optimization.

The server keeps every client's latest uploaded model and an affinity matrix P. A selected client k
1. downloads M models chosen epsilon-greedily from its affinity row P[k] (pFedSD: M = 5,
   epsilon = 0.3 "with 0.05 decay each round": epsilon_t = max(0, 0.3 - 0.05 (t - 1)));
2. scores them on its local validation set against its own model theta_k (first-order weights):
       w_n = max(0, (L_val(theta_k) - L_val(theta_n)) / ||theta_n - theta_k||),  normalised to sum 1 if any > 0;
3. updates theta_k <- theta_k + sum_n w_n (theta_n - theta_k) and reports w to the server,
   which adds it to P[k] (the `affinity: deltas` option adds the code's signed w_n / |sum_n w_n| instead);
4. trains theta_k locally (plain CE, E epochs) on its training data minus the validation part, and uploads it.
Randomness (epsilon draws, tie-breaks, the validation hold-out) comes from `derive_seed`: resume-safe.
The client's own theta_k is the model it uploaded last (the server's copy is the same tensors, so it is
stored once, in the server's table); a client never selected holds the common initialisation.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from ..core.aggregation import plain_average, state_bytes
from ..core.seeds import derive_seed
from ..params import Param
from .base import Algorithm

PICK, HOLDOUT = 0xF0, 0xF1  # derive_seed purposes: epsilon-greedy draw, validation hold-out


def epsilon(eps: float, decay: float, rnd: int) -> float:
    """Exploration probability of round rnd (1-based): eps in round 1, minus `decay` per round, floor 0."""
    return max(0.0, eps - decay * (rnd - 1))


def fomo_weights(base_loss: float, losses, dists) -> tuple[torch.Tensor, torch.Tensor]:
    """(signed w_n = (L_k - L_n) / d_n, max(0, w_n) normalised to sum 1 when any > 0, else all 0).
    A model at distance 0 from theta_k carries no update and gets w_n = 0."""
    losses, dists = torch.as_tensor(losses, dtype=torch.float64), torch.as_tensor(dists, dtype=torch.float64)
    raw = torch.where(dists > 0, (base_loss - losses) / torch.where(dists > 0, dists, 1.0), 0.0)
    pos = raw.clamp(min=0)
    return raw, (pos / pos.sum() if pos.sum() > 0 else pos)


def fomo_update(theta: dict, models: list[dict], weights) -> dict:
    """theta + sum_n w_n (theta_n - theta) on floating entries (integer buffers kept)."""
    return {n: (t.double() + sum(float(w) * (m[n].double() - t.double()) for m, w in zip(models, weights))).to(t.dtype)
            if torch.is_floating_point(t) else t.clone() for n, t in theta.items()}


@torch.no_grad()
def val_loss(net, x, y, batch: int = 1024) -> float:
    """Mean CE of `net` (eval mode) on (x, y)."""
    net.eval()
    return sum(F.cross_entropy(net(x[i:i + batch]), y[i:i + batch], reduction="sum").item()
               for i in range(0, len(y), batch)) / max(len(y), 1)


class FedFomo(Algorithm):
    name = "fedfomo"
    generic = False
    HPARAMS = {
        "M": Param(int, 5, "models downloaded per selected client (pFedSD: M = 5)", low=1),
        "eps": Param(float, 0.3, "exploration probability in round 1 (pFedSD: 0.3)", low=0.0, high=1.0),
        "eps_decay": Param(float, 0.05, "decrease of epsilon per round, floor 0 (pFedSD: 0.05)", low=0.0),
        "val": Param(str, "holdout", "validation data: 'holdout' (a fixed val_frac of the training data, not trained "
                     "on) or 'split' (the split's val part)", choices=("holdout", "split")),
        "val_frac": Param(float, 0.25, "hold-out fraction (0.25 of pFedSD's 80% = FedFomo code's 60/20/20)",
                          low=0.0, low_open=True, high=0.9),
        "affinity": Param(str, "weights", "increment of P[k]: normalised weights w ('weights') or the code's "
                          "signed w_n / |sum w_n| ('deltas')", choices=("weights", "deltas")),
    }

    def server_init(self):  # latest model of every client that uploaded; affinity matrix P
        return {"models": {}, "affinity": torch.zeros(self.ctx.data.n_clients, self.ctx.data.n_clients)}

    def local_data(self, k):
        """((x, y) trained on, (x, y) validation) of client k, the same in every round."""
        x, y = self.ctx.data.client_train(k)
        if self.hp["val"] == "split":
            xv, yv = self.ctx.data.client_val(k)
            if len(yv) == 0:
                raise ValueError("fedfomo val='split' needs a validation part (split_params.fractions=[0.6, 0.2, 0.2])")
            return (x, y), (xv, yv)
        g = torch.Generator().manual_seed(derive_seed(self.ctx.cfg.seed, 0, k, HOLDOUT))
        perm = torch.randperm(len(y), generator=g).to(y.device)
        nv = max(1, math.floor(self.hp["val_frac"] * len(y) + 1e-9))
        return (x[perm[nv:]], y[perm[nv:]]), (x[perm[:nv]], y[perm[:nv]])

    def choose(self, rnd: int, k: int, server: dict) -> list[int]:
        """Epsilon-greedy: each of the M slots takes, with probability epsilon_t, the next client of a random
        order, else the next by affinity P[k, j] (random tie-break); clients without an upload are skipped."""
        avail = sorted(int(j) for j in server["models"] if int(j) != k)
        rng = np.random.default_rng(derive_seed(self.ctx.cfg.seed, rnd, k, PICK))
        tie, aff = rng.random(len(avail)), server["affinity"][k]
        ranked = [avail[i] for i in sorted(range(len(avail)), key=lambda i: (-float(aff[avail[i]]), tie[i]))]
        shuffled = [int(j) for j in rng.permutation(avail)]
        eps, chosen = epsilon(self.hp["eps"], self.hp["eps_decay"], rnd), []
        for _ in range(min(self.hp["M"], len(avail))):
            pool = shuffled if rng.random() < eps else ranked
            chosen.append(next(j for j in pool if j not in chosen))
        return chosen

    def client_update(self, rnd, k, server, cstate):
        table = server["models"]
        own = table.get(str(k), self.ctx.init_state)           # theta_k
        (xt, yt), (xv, yv) = self.local_data(k)
        chosen = self.choose(rnd, k, server)
        models = [table[str(j)] for j in chosen]                  # the M downloads
        base = val_loss(self.ctx.model(k, own), xv, yv)
        losses = [val_loss(self.ctx.model(k, m), xv, yv) for m in models]
        names = [n for n, _ in self.ctx.model(k).named_parameters()]
        dists = [math.sqrt(sum(float(((m[n].double() - own[n].double()) ** 2).sum()) for n in names)) for m in models]
        raw, w = fomo_weights(base, losses, dists)
        net = self.ctx.model(k, fomo_update(own, models, w))
        stats = self.ctx.train(net, k, rnd, data=(xt, yt))
        up = self.upload(k, net, stats, server)
        inc = torch.zeros(self.ctx.data.n_clients)                # increment of P[k]
        inc[chosen] = (w if self.hp["affinity"] == "weights" else raw / max(abs(float(raw.sum())), 1e-9)).float()
        up.payload = {"client": torch.tensor(k), "params": up.payload, "affinity": inc}
        up.weight = float(len(yt))
        up.bytes_down = sum(state_bytes(m) for m in models)
        up.bytes_up += 4 * len(chosen)                            # the M weights reported for P[k]
        return up, None

    def aggregate(self, rnd, server, updates, clients):
        models, aff = dict(server["models"]), server["affinity"].clone()
        for u in updates:
            models[str(int(u.payload["client"]))] = u.payload["params"]
            aff[int(u.payload["client"])] += u.payload["affinity"]
        return {**server, "models": models, "affinity": aff}

    def global_model(self, server):
        return None  # no global model: GM = average of the stored models (SCD Remark 4.1)

    def averaged_personal_model(self, server, clients):
        states = list(server["models"].values())
        return self.ctx.model(-1, plain_average(states)) if states else None

    def personal_model(self, k, server, cstate):
        return self.ctx.model(k, server["models"].get(str(k), self.ctx.init_state))
