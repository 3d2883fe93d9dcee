"""PerFed-CKT (Cho, Wang, Chiruvolu & Joshi, "Personalized Federated Learning for Heterogeneous Clients
with Clustered Knowledge Transfer"): clustered co-distillation on an unlabeled public set P.

No weights travel. Algorithm 1, round t:
  - server (lines 6-9): k-means with c clusters over the soft decisions s_k in R^{|P| x N} received in the
    previous round (flattened), centroids {c_i} sent to this round's clients (m of K, drawn by data share
    p_k without replacement: `sampling: data_share`);
  - client k (lines 11-15): resumes its own last local model w_k ("we retrieve the most recently updated
    local model"), picks the centroid nearest to its current soft decisions (eq. 4) as s_bar_k, takes tau
    steps of eq. 2 on  CE(private batch of b) + lam/|P_b| sum_{x in P_b} ||s_bar_k(x) - s(w_k, x)||^2
    (a public batch P_b of b' drawn per step), and uploads s_k of the updated model on all of P.
Before round 1 the server clusters the initial models' soft decisions of a set S^(-1) of m clients (line 3:
"Initialize {s_k^(0,0)}, selected set of m clients S^(-1,0)"), drawn like every round's set.
s = softmax outputs: the paper says "logits" but defines s on the probability simplex Delta_N (`output`
option 'logits' uses raw outputs instead). Soft decisions on P are computed in eval mode.
Choices the paper leaves open are in docs/fidelity.md (PerFed-CKT).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ..core.aggregation import clone_state, state_bytes
from ..core.schedule import sample_clients
from ..core.seeds import derive_seed
from ..core.training import outputs
from ..params import MAX_STEPS, Param
from .base import Algorithm, Update


def soft_decisions(net, x: torch.Tensor, output: str = "softmax") -> torch.Tensor:
    """s(w, x) for every x in the public set, stacked into rows (|P|, N), in eval mode."""
    z = outputs(net, x)
    return F.softmax(z, 1) if output == "softmax" else z


def kmeans_centroids(points: torch.Tensor, c: int, seed: int, n_init: int = 10) -> torch.Tensor:
    """Centroids of c-means clustering (scikit-learn's KMeans, seeded) of the rows of `points` (m, D); with
    fewer distinct rows than c, as many clusters as distinct rows (an empty cluster has no centroid)."""
    x = points.detach().double().cpu().numpy()
    c = min(c, len(np.unique(x, axis=0)))
    if c == 1:
        centres = x.mean(0, keepdims=True)
    else:
        from sklearn.cluster import KMeans
        from threadpoolctl import threadpool_limits
        # one thread: scikit-learn's OpenMP runtime is not torch's; its idle workers spinning beside torch's
        # slowed every later training step of the process ~10x (measured); m points are clustered in milliseconds
        with threadpool_limits(limits=1):
            centres = KMeans(n_clusters=c, n_init=n_init, random_state=seed % 2**32).fit(x).cluster_centers_
    return torch.as_tensor(centres, dtype=points.dtype, device=points.device)


def nearest_centroid(centroids: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Eq. 4: argmin_i ||c_i - s||_2^2 over the centroids (c, |P|, N); ties go to the first."""
    d = ((centroids - s.unsqueeze(0)) ** 2).flatten(1).sum(1)
    return centroids[int(torch.argmin(d))]


def codistillation_loss(lam: float, public: torch.Tensor, target: torch.Tensor, b_pub: int, gen: torch.Generator,
                        output: str = "softmax"):
    """Eq. 1's minibatch objective: CE(w; private batch) + lam/|P_b| sum_{x in P_b} ||s_bar(x) - s(w, x)||^2,
    P_b = b' public samples drawn uniformly (without replacement within the batch) for every step."""
    def loss(net, x, y):
        idx = torch.randperm(len(public), generator=gen)[:b_pub].to(public.device)
        z = net(public[idx])
        s = F.softmax(z, 1) if output == "softmax" else z
        return F.cross_entropy(net(x), y) + lam * ((target[idx] - s) ** 2).sum(1).mean()
    return loss


class PerFedCKT(Algorithm):
    name = "perfed_ckt"
    generic = False
    heterogeneous = True    # only soft decisions on P are exchanged
    needs_public = True     # RunConfig refuses a run without `public.size`
    HPARAMS = {
        "clusters": Param(int, 1, "c: k-means clusters over the received soft decisions (1 = plain co-distillation)",
                          low=1),
        "lam": Param(float, 2.0, "lambda, weight of the distillation term (appendix E: 2)", low=0.0),
        "public_batch": Param(int, 128, "b': public samples per local step (appendix E: 128)", low=1),
        "tau": Param(int, 50, "local iterations per round (appendix E: 50); 0 = local_epochs epochs", low=0, high=MAX_STEPS),
        "output": Param(str, "softmax", "s(w, x): 'softmax' (on the simplex, as defined) or raw 'logits'",
                        choices=("softmax", "logits")),
        "n_init": Param(int, 10, "k-means restarts (scikit-learn n_init)", low=1),
    }

    @classmethod
    def relative_cost(cls, hparams):
        return 3.0  # private + public batch per step, soft decisions on P twice

    def _cluster(self, soft: list, tag: int) -> dict:
        S = torch.stack(soft)                                   # (m, |P|, N)
        cent = kmeans_centroids(S.flatten(1), self.hp["clusters"], derive_seed(self.ctx.cfg.seed, tag, 0xC1),
                                self.hp["n_init"])
        return {"centroids": cent.view(-1, *S.shape[1:])}

    def server_init(self):
        P = self.ctx.data.x_public
        first = sample_clients(self.ctx.cfg, 0, self.ctx.data.n_train().numpy())      # S^(-1,0)
        return self._cluster([soft_decisions(self.ctx.model(k, self.ctx.initial(k)), P, self.hp["output"])
                              for k in first], 0)

    def client_update(self, rnd, k, server, cstate):
        P, hp = self.ctx.data.x_public, self.hp
        net = self.ctx.model(k, cstate["params"] if cstate else self.ctx.initial(k))
        target = nearest_centroid(server["centroids"], soft_decisions(net, P, hp["output"]))    # line 11
        gen = torch.Generator().manual_seed(derive_seed(self.ctx.cfg.seed, rnd, k, 7))
        stats = self.ctx.train(net, k, rnd, loss=codistillation_loss(hp["lam"], P, target, hp["public_batch"], gen,
                                                                     hp["output"]), steps=hp["tau"] or None)
        s = soft_decisions(net, P, hp["output"])                                                 # line 15
        up = Update(weight=float(len(self.ctx.data.train[k])), payload={"soft": s}, loss=stats.loss,
                    samples=stats.samples + stats.steps * min(hp["public_batch"], len(P)) + 2 * len(P),
                    bytes_up=state_bytes({"s": s}), bytes_down=state_bytes(server))
        return up, {"params": clone_state(net.state_dict())}

    def aggregate(self, rnd, server, updates, clients):
        return self._cluster([u.payload["soft"] for u in updates], rnd) if updates else server

    def global_model(self, server):
        return None

    def personal_model(self, k, server, cstate):
        return self.ctx.model(k, cstate["params"] if cstate else self.ctx.initial(k))
