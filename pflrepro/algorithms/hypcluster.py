"""HypCluster (Mansour, Mohri, Ro & Suresh 2020, "Three approaches for personalization with applications to
federated learning", arXiv:2002.10619): hypothesis-based clustering, a PerFed-CKT Table 1 baseline (c = 2, 3, 5, 6).

The server keeps c hypotheses h_1..h_c (c whole models). Round t, per selected client k:
  - the client receives all c models and assigns itself to the one with the lowest loss on its own data,
    f(k) = argmin_i L_{D_k}(h_i) (the paper's clustering step; the authors' TFF code, google-research/federated
    data_poor_fl/hypcluster_utils.py: `multi_model_eval` runs every model with `training=False` on the client's
    dataset and `select_best_model` takes `tf.math.argmin` of the mean losses);
  - it trains that model like FedAvg (E epochs of SGD on CE, `Context.train`) and uploads it with its cluster id;
  - the server averages each cluster's uploads, weighted by n_k (FedJAX: "weighted average delta params, or None if
    no examples were seen for this cluster"); a cluster nobody chose keeps its model (the TFF
    trainer builds its mean with `MeanFactory(no_nan_division=True)` "to avoid NaNs in the learned model, which can
    happen when a model is not selected by any client in a round").
Choices where the papers are silent, or follow the code rather than the text:
  - initial models: cluster 0 is the run's common init, cluster i > 0 an independent init of the same architecture
    from a generator seeded by (seed, i): the TFF code's default builds `[ModelWeights.from_model(model_fn()) for _
    in range(num_clusters)]`, and FedJAX (google/fedjax, fedjax/algorithms/hyp_cluster.py, by a co-author)
    offers `random_init` ("Randomly initializes cluster params"), i.e. c different random initialisations. Not
    built: FedJAX's `kmeans_init` ("a k-means++ variant": per-client trained models, the ones "furthest away" in
    loss) and the TFF warm start from FedAvg checkpoints;
  - the selection loss is the mean CE over the client's whole training split, in eval mode; ties go to the lowest
    cluster id (argmin);
  - personal model = the cluster model the client would pick *now* (lowest loss on its training split), for every
    client, selected before or not: the TFF evaluation (`hypcluster_eval.py`) picks "the best model" on client data
    ("selection_data") and scores it on held-out "test_data"; the last chosen id is kept as client state only for
    inspection;
  - global model: none (HypCluster outputs c models), so GM accuracy is NaN;
  - bytes: down = c models, up = 1 model (the 8-byte cluster id is not counted; the run clock's simulated transfer
    time still prices one model per message); `samples` counts training samples only (the c forward passes of the
    selection are not counted).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..core.aggregation import clone_state, state_bytes, weighted_average
from ..core.seeds import derive_seed
from ..core.training import outputs
from ..params import Param
from .base import Algorithm, Update


def mean_losses(net, states: list, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean CE of `net` loaded with each of `states` on (x, y), in eval mode: a (len(states),) tensor."""
    out = []
    for st in states:
        net.load_state_dict(st)
        out.append(F.cross_entropy(outputs(net, x), y, reduction="sum").item() / max(len(y), 1))
    return torch.tensor(out, dtype=torch.float64)


def pick_cluster(net, states: list, x: torch.Tensor, y: torch.Tensor) -> int:
    """f(k) = argmin_i L_{D_k}(h_i): index of the state with the lowest mean loss on (x, y); ties: the first."""
    return int(torch.argmin(mean_losses(net, states, x, y)))


class HypCluster(Algorithm):
    name = "hypcluster"
    generic = False
    HPARAMS = {
        "clusters": Param(int, 2, "c, number of hypotheses (cluster models); PerFed-CKT Table 1 runs c = 2, 3, 5, 6",
                          low=1, high=100),
    }

    @classmethod
    def relative_cost(cls, hparams):
        return 1.0  # FedAvg's training; the selection is c forward passes

    def server_init(self):
        models = {"0": clone_state(self.ctx.init_state)}
        for i in range(1, self.hp["clusters"]):          # independent inits (TFF code: one model_fn() per cluster)
            models[str(i)] = self.ctx.fresh_state(-1, derive_seed(self.ctx.cfg.seed, 0x4C, i))
        return {"models": models}

    def _states(self, server: dict) -> list:
        return [server["models"][str(i)] for i in range(len(server["models"]))]

    def choose(self, k: int, server: dict) -> int:
        """Client k's cluster: the model with the lowest loss on its training split."""
        return pick_cluster(self.ctx.model(k), self._states(server), *self.ctx.data.client_train(k))

    def client_update(self, rnd, k, server, cstate):
        i = self.choose(k, server)
        net = self.ctx.model(k, server["models"][str(i)])
        stats = self.ctx.train(net, k, rnd)
        state = clone_state(net.state_dict())
        one = state_bytes(state)
        up = Update(weight=float(len(self.ctx.data.train[k])), payload={"cluster": torch.tensor(i), "params": state},
                    loss=stats.loss, samples=stats.samples, bytes_up=one, bytes_down=one * len(server["models"]))
        return up, {"cluster": torch.tensor(i)}

    def aggregate(self, rnd, server, updates, clients):
        models = dict(server["models"])
        for name in models:
            mine = [u for u in updates if int(u.payload["cluster"]) == int(name)]
            if mine:                                      # an unchosen cluster keeps its model
                models[name] = weighted_average([u.payload["params"] for u in mine], [u.weight for u in mine])
        return {**server, "models": models}

    def global_model(self, server):
        return None

    def averaged_personal_model(self, server, clients):
        return None     # no single model: GM accuracy is NaN

    def personal_model(self, k, server, cstate):
        return self.ctx.model(k, server["models"][str(self.choose(k, server))])
