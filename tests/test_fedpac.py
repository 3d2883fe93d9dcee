"""FedPAC (FedBSD's baseline): the feature statistics, the classifier-combination QP, one round's server step,
and learning on real data."""
import numpy as np
import pytest
import torch

from pflrepro.algorithms import ALGORITHMS
from pflrepro.algorithms.fedpac import combination_weights, feature_statistics
from pflrepro.federation.build import build_context
from pflrepro.federation.config import RunConfig
from pflrepro.pipeline.store import run
from tests.conftest import FMNIST_AVAILABLE, small_cfg


def test_feature_statistics_hand_computed():
    """z = (1,0), (3,0) of class 0 and (0,2) of class 1, n = 3: p = (2/3, 1/3), mu_0 = (2,0), mu_1 = (0,2),
    E||f||^2 = 5 and 4. V = (2/3*5 + 1/3*4 - 4/9*4 - 1/9*4) / 3 = (42/9 - 20/9) / 3 = 22/27; H = [p_c mu_c]."""
    z = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 2.0]])
    v, h = feature_statistics(z, torch.tensor([0, 0, 1]), num_classes=3)
    assert v == pytest.approx(22 / 27)
    assert torch.allclose(h, torch.tensor([[4 / 3, 0.0], [0.0, 2 / 3], [0.0, 0.0]], dtype=torch.float64))


def test_combination_weights_hand_computed():
    """Equal H (no bias): min a^T diag(V) a on the simplex gives a_j ~ 1/V_j: V = (1, 3) -> (3/4, 1/4)."""
    hs = torch.zeros(2, 3, 4)
    assert np.allclose(combination_weights(torch.tensor([1.0, 3.0]), hs, 0), [0.75, 0.25], atol=1e-5)
    # a client far from the other (bias) keeps more of its own head: H_1 - H_0 = 1 in one entry, V = (1, 1):
    # a^T [[1, 0], [0, 2]] a for client 0 -> (2/3, 1/3); for client 1, [[2, 0], [0, 1]] -> (1/3, 2/3)
    hs[1, 0, 0] = 1.0
    assert np.allclose(combination_weights(torch.tensor([1.0, 1.0]), hs, 0), [2 / 3, 1 / 3], atol=1e-5)
    assert np.allclose(combination_weights(torch.tensor([1.0, 1.0]), hs, 1), [1 / 3, 2 / 3], atol=1e-5)
    # weights below eps are dropped and the rest renormalised: V = (1, 1e4) -> (0.9999, 1e-4) -> (1, 0)
    assert np.array_equal(combination_weights(torch.tensor([1.0, 1e4]), torch.zeros(2, 3, 4), 0, eps=1e-3), [1.0, 0.0])


@pytest.mark.skipif(not FMNIST_AVAILABLE, reason="needs offline Fashion-MNIST")
def test_fedpac_round_trains_head_then_body_and_combines_heads(store):
    cfg = RunConfig.from_dict(small_cfg(algorithm="fedpac", partition="shards", partition_params={"s": 2},
                                        subsample=0.05, n_clients=4, momentum=0.0))
    ctx = build_context(cfg, torch.device("cpu"))
    algo = ALGORITHMS["fedpac"](ctx, head_epochs=1, body_epochs=1)
    server = algo.server_init()
    ups = [algo.client_update(1, k, server, None)[0] for k in range(4)]
    for u in ups:                                   # both phases moved their parameters
        p = u.payload["params"]
        assert not torch.equal(p["head.weight"], server["params"]["head.weight"])
        assert any(not torch.equal(p[n], server["params"][n]) for n in p if not n.startswith("head."))
    new = algo.aggregate(1, server, ups, {})
    w = torch.tensor([u.weight for u in ups], dtype=torch.float64)
    body = [n for n in server["params"] if not n.startswith("head.")]
    for n in body:                                  # the body: sample-weighted mean
        want = sum(wi * u.payload["params"][n].double() for wi, u in zip(w / w.sum(), ups))
        assert torch.allclose(new["params"][n].double(), want, atol=1e-6)
    assert set(new["heads"]) == {"0", "1", "2", "3"} and bool(new["has_proto"].sum() >= 2)
    v, hs = torch.stack([u.payload["v"] for u in ups]), torch.stack([u.payload["h"] for u in ups])
    a = combination_weights(v, hs, 2)
    want = sum(ai * u.payload["params"]["head.weight"].double() for ai, u in zip(a, ups))
    assert torch.allclose(new["heads"]["2"]["head.weight"].double(), want, atol=1e-6)
    pm = algo.personal_model(2, new, None).state_dict()
    assert torch.equal(pm["head.weight"], new["heads"]["2"]["head.weight"]) and all(torch.equal(pm[n], new["params"][n]) for n in body)


@pytest.mark.skipif(not FMNIST_AVAILABLE, reason="needs offline Fashion-MNIST")
def test_fedpac_learns_on_pathological_fmnist(store):
    """2 classes per client: a constant guess scores ~0.5 per client."""
    res = run(small_cfg(algorithm="fedpac", hparams={"head_epochs": 1, "body_epochs": 1}, partition="shards",
                        partition_params={"s": 2}, subsample=0.1, rounds=3, momentum=0.5), progress=False)
    assert res.metric("pm_acc_mean")[-1] > 0.7, res.metric("pm_acc_mean")
