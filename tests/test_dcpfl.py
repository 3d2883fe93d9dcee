"""DC-PFL, FedGH, FedProto: the statistics math on hand-made features, the server steps, and short runs."""
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pflrepro.algorithms.dcpfl import DCPFL
from pflrepro.algorithms.fedgh import FedGH
from pflrepro.algorithms.fedproto import FedProto
from pflrepro.algorithms.stats import (
    alignment_loss,
    class_stats,
    pool_class,
    pool_means,
    sample_gaussian,
    train_head_on_means,
    virtual_counts,
)
from pflrepro.data.models import SplitModel
from pflrepro.federation.build import build_context
from pflrepro.federation.config import RunConfig
from pflrepro.pipeline.store import load_checkpoint, run
from tests.conftest import FMNIST_AVAILABLE, small_cfg

needs_fmnist = pytest.mark.skipif(not FMNIST_AVAILABLE, reason="needs offline Fashion-MNIST")
SKEWED = dict(partition="classes_uniform_shares", partition_params={"classes_per_client": 2},
              split_params={"fractions": [0.8, 0.1, 0.1]})


# ---------------------------------------------------------------- eq. (6)-(7)
def test_class_stats_unbiased_on_hand_made_features():
    z = torch.tensor([[0.0, 0.0], [5.0, 5.0], [2.0, 0.0], [1.0, 3.0]])
    y = torch.tensor([0, 2, 0, 0])
    s = class_stats(z, y)
    assert s["classes"].tolist() == [0, 2] and s["counts"].tolist() == [3, 1]
    assert torch.equal(s["means"], torch.tensor([[1.0, 1.0], [5.0, 5.0]]))
    # class 0: deviations (-1,-1), (1,-1), (0,2): scatter [[2,0],[0,6]], divided by n-1 = 2
    assert torch.allclose(s["covs"][0], torch.tensor([[1.0, 0.0], [0.0, 3.0]]))
    assert torch.equal(s["covs"][1], torch.zeros(2, 2))  # one sample: the stated rule, a zero matrix
    assert "covs" not in class_stats(z, y, cov=False)
    g = torch.Generator().manual_seed(0)
    zr = torch.randn(40, 5, generator=g, dtype=torch.float64)
    yr = torch.arange(40) % 3
    sr = class_stats(zr, yr)
    for i, c in enumerate(sr["classes"].tolist()):
        assert torch.allclose(sr["covs"][i], torch.cov(zr[yr == c].T), atol=1e-12)  # torch.cov: n-1


# ---------------------------------------------------------------- eq. (10)-(11)
def test_pooling_equals_statistics_of_the_concatenated_features():
    g = torch.Generator().manual_seed(1)
    d = 4
    sizes = [(7, 0), (1, 1), (5, 2), (1, 0)]  # (samples, class): includes single-sample clients
    parts = [(torch.randn(n, d, generator=g, dtype=torch.float64) * (c + 1) + c, torch.full((n,), c))
             for n, c in sizes]
    parts.append((torch.randn(9, d, generator=g, dtype=torch.float64), torch.tensor([0, 1, 2] * 3)))
    msgs = [class_stats(z, y) for z, y in parts]
    z_all = torch.cat([z for z, _ in parts])
    y_all = torch.cat([y for _, y in parts])
    n, mu = pool_means(msgs, num_classes=4)
    assert n.tolist() == [float((y_all == c).sum()) for c in range(4)] and n[3] == 0
    for c in range(3):
        rows = [(m, i) for m in msgs for i, cc in enumerate(m["classes"].tolist()) if cc == c]
        big_n, mu_c, sigma_c = pool_class(torch.stack([m["counts"][i] for m, i in rows]),
                                          torch.stack([m["means"][i] for m, i in rows]),
                                          torch.stack([m["covs"][i] for m, i in rows]))
        zc = z_all[y_all == c]
        assert big_n == len(zc)
        assert torch.allclose(mu_c, zc.mean(0), rtol=0, atol=1e-12)
        assert torch.allclose(mu[c], zc.mean(0), rtol=0, atol=1e-12)
        assert torch.allclose(sigma_c, torch.cov(zc.T), rtol=0, atol=1e-12)
    one = pool_class(torch.tensor([1]), torch.ones(1, d), torch.zeros(1, d, d))  # N = 1: zero covariance
    assert one[0] == 1 and torch.equal(one[2], torch.zeros(d, d, dtype=torch.float64))


def test_plain_prototype_mean_option():
    msgs = [{"classes": torch.tensor([1]), "counts": torch.tensor([1]), "means": torch.tensor([[2.0]])},
            {"classes": torch.tensor([1]), "counts": torch.tensor([3]), "means": torch.tensor([[6.0]])}]
    assert pool_means(msgs, 2)[1][1].item() == 5.0                    # (1*2 + 3*6) / 4
    assert pool_means(msgs, 2, weighted=False)[1][1].item() == 4.0    # (2 + 6) / 2


# ---------------------------------------------------------------- virtual features
def test_virtual_counts_sum_and_follow_class_frequencies():
    assert virtual_counts(torch.tensor([300, 0, 100, 600]), 1000).tolist() == [300, 0, 100, 600]
    assert virtual_counts(torch.tensor([1, 1, 1]), 1000).tolist() == [334, 333, 333]  # ties to the lower class
    counts = torch.tensor([13, 0, 977, 5, 250, 41])
    for total in (1000, 600, 7):
        g = virtual_counts(counts, total)
        assert int(g.sum()) == total and g[1] == 0
        quota = total * counts.double() / counts.sum()
        assert ((g.double() - quota).abs() < 1).all()
    assert virtual_counts(torch.zeros(3), 10).tolist() == [0, 0, 0]


def test_gaussian_sampler_matches_a_full_rank_covariance():
    sigma = torch.tensor([[2.0, 0.6, 0.0], [0.6, 1.0, -0.3], [0.0, -0.3, 0.5]], dtype=torch.float64)
    mu = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)
    x = sample_gaussian(mu, sigma, 40000, torch.Generator().manual_seed(0))
    assert torch.allclose(x.mean(0), mu, atol=0.03)
    assert torch.allclose(torch.cov(x.T), sigma, atol=0.05)
    again = sample_gaussian(mu, sigma, 5, torch.Generator().manual_seed(3))
    assert torch.equal(again, sample_gaussian(mu, sigma, 5, torch.Generator().manual_seed(3)))


@pytest.mark.parametrize("kind", ["rank1", "zero", "indefinite", "nan"])
def test_singular_covariance_never_crashes_and_samples_are_finite(kind):
    d = 500
    g = torch.Generator().manual_seed(0)
    two = torch.randn(2, d, generator=g, dtype=torch.float64)
    sigma = {"rank1": torch.cov(two.T), "zero": torch.zeros(d, d, dtype=torch.float64),
             "indefinite": torch.diag(torch.linspace(-1, 1, d, dtype=torch.float64)),
             "nan": torch.full((d, d), float("nan"), dtype=torch.float64)}[kind]
    mu = two.mean(0)
    x = sample_gaussian(mu, sigma, 300, g)
    assert x.shape == (300, d) and torch.isfinite(x).all()
    if kind == "rank1":  # the spread lies along the one direction of the two samples
        u = (two[0] - two[1]) / (two[0] - two[1]).norm()
        along = ((x - mu) @ u).var()
        assert along.item() == pytest.approx(float(u @ sigma @ u), rel=0.3)
        assert ((x - mu) - ((x - mu) @ u)[:, None] * u).norm(dim=1).max() < 0.1 * along.sqrt()
    if kind in ("zero", "nan"):
        assert (x - mu).abs().max() < 1e-4  # nothing to spread: draws sit on the mean


# ---------------------------------------------------------------- eq. (3)-(4)
def test_alignment_loss_hand_computed():
    z = torch.tensor([[1.0, 2.0], [3.0, 4.0], [0.0, 0.0]])
    y = torch.tensor([0, 1, 2])
    targets = torch.tensor([[0.0, 0.0], [3.0, 2.0], [9.0, 9.0]])
    has = torch.tensor([True, True, False])  # class 2 has no global mean yet: contributes 0
    assert alignment_loss(z, y, targets, has, "sq").item() == pytest.approx((5 + 4 + 0) / 3)
    assert alignment_loss(z, y, targets, has, "mse").item() == pytest.approx(9 / 6)
    assert alignment_loss(z, y, targets, has, "l2").item() == pytest.approx((math.sqrt(5) + 2) / 3)


def _tiny_net():
    torch.manual_seed(0)
    return SplitModel(body=nn.Linear(3, 2), head=nn.Linear(2, 4), feature_dim=2)


def test_dcpfl_local_loss_is_ce_plus_lambda_alignment():
    algo = DCPFL.__new__(DCPFL)
    algo.hp = {"lam": 0.5, "align": "sq"}
    net = _tiny_net()
    x, y = torch.randn(5, 3), torch.tensor([0, 1, 1, 3, 0])
    means = torch.randn(4, 2)
    has = torch.tensor([True, True, False, True])
    got = algo.loss(2, 0, {"means": means, "has_mean": has}, None)(net, x, y)
    z = net.features(x)
    want = F.cross_entropy(net(x), y) + 0.5 * sum(((z[i] - means[y[i]]) ** 2).sum() for i in range(5) if has[y[i]]) / 5
    assert got.item() == pytest.approx(want.item(), rel=1e-6)
    first = algo.loss(1, 0, {"means": means, "has_mean": torch.zeros(4, dtype=torch.bool)}, None)(net, x, y)
    assert first.item() == pytest.approx(F.cross_entropy(net(x), y).item())  # round 1: CE only
    algo.hp = {"lam": 0.0, "align": "sq"}  # "w/o AL"
    assert algo.loss(2, 0, {"means": means, "has_mean": has}, None)(net, x, y).item() == pytest.approx(
        F.cross_entropy(net(x), y).item())


# ---------------------------------------------------------------- server steps
def _head_state(seed=0, d=3, C=4):
    g = torch.Generator().manual_seed(seed)
    return {"head.weight": torch.randn(C, d, generator=g), "head.bias": torch.randn(C, generator=g)}


def _msg(classes, counts, means, covs=None):
    m = {"classes": torch.tensor(classes), "counts": torch.tensor(counts), "means": torch.tensor(means)}
    if covs is not None:
        m["covs"] = covs
    return SimpleNamespace(payload=m)


def _manual_step(w, b, z, y, lr):
    p = torch.softmax(z @ w.T + b, 1)
    p[torch.arange(len(y)), y] -= 1
    p /= len(y)
    return w - lr * p.T @ z, b - lr * p.sum(0)


def test_fedgh_server_header_moves_one_class_mean_per_step():
    algo = FedGH.__new__(FedGH)
    algo.hp = {"server_lr": 0.1}
    server = {"head": _head_state()}
    ups = [_msg([0, 2], [5, 7], [[1.0, 0.0, 2.0], [0.0, -1.0, 1.0]]), _msg([3], [2], [[2.0, 2.0, 0.0]])]
    new = algo.aggregate(1, server, ups, {})
    w, b = server["head"]["head.weight"], server["head"]["head.bias"]
    for z, c in [([1.0, 0.0, 2.0], 0), ([0.0, -1.0, 1.0], 2), ([2.0, 2.0, 0.0], 3)]:  # in order, one at a time
        w, b = _manual_step(w, b, torch.tensor([z]), torch.tensor([c]), 0.1)
    assert not torch.equal(new["head"]["head.weight"], server["head"]["head.weight"])  # unlike the public code
    assert torch.allclose(new["head"]["head.weight"], w, atol=1e-6)
    assert torch.allclose(new["head"]["head.bias"], b, atol=1e-6)


def test_dcpfl_eq8_one_step_per_client_on_its_mean_class_loss():
    head = nn.Linear(3, 4)
    head.load_state_dict({"weight": _head_state()["head.weight"], "bias": _head_state()["head.bias"]})
    z, y = torch.tensor([[1.0, 0.0, 2.0], [0.0, -1.0, 1.0]]), torch.tensor([0, 2])
    w, b = _manual_step(head.weight.detach(), head.bias.detach(), z, y, 0.05)  # 1/|C_k| sum_c CE
    train_head_on_means(head, [(z, y)], 0.05)
    assert torch.allclose(head.weight, w, atol=1e-6) and torch.allclose(head.bias, b, atol=1e-6)


def _dcpfl_server_algo(**hp):
    algo = DCPFL.__new__(DCPFL)
    algo.hp = {"lam": 0.01, "align": "sq", "calibrate": True, "n_virtual": 200, "server_lr": 0.05,
               "server_epochs": 1, "server_batch": 32, "cov_shrink": 0.0, "cov_jitter": 1e-5, **hp}
    algo.ctx = SimpleNamespace(cfg=SimpleNamespace(seed=0))
    return algo


def test_dcpfl_aggregate_pools_means_calibrates_and_keeps_absent_classes():
    g = torch.Generator().manual_seed(0)
    zs = [torch.randn(6, 3, generator=g) + i for i in range(2)]
    ys = [torch.tensor([0, 0, 0, 1, 1, 1]), torch.tensor([1, 1, 1, 1, 2, 2])]
    ups = [SimpleNamespace(payload=class_stats(z, y)) for z, y in zip(zs, ys)]
    old = torch.full((4, 3), 7.0)
    server = {"head": _head_state(), "means": old, "has_mean": torch.tensor([False, False, False, True])}
    out = _dcpfl_server_algo().aggregate(3, server, ups, {})
    z_all, y_all = torch.cat(zs), torch.cat(ys)
    for c in range(3):
        assert torch.allclose(out["means"][c], z_all[y_all == c].mean(0), atol=1e-5)  # eq. 10
    assert torch.equal(out["means"][3], old[3])                                     # absent: last mean kept
    assert out["has_mean"].tolist() == [True, True, True, True]
    again = _dcpfl_server_algo().aggregate(3, server, ups, {})
    assert torch.equal(out["head"]["head.weight"], again["head"]["head.weight"])    # server RNG from (seed, round)
    no_gc = _dcpfl_server_algo(calibrate=False).aggregate(3, server, ups, {})
    assert not torch.allclose(no_gc["head"]["head.weight"], out["head"]["head.weight"])  # eq. 12 moved it
    assert torch.equal(no_gc["means"], out["means"])
    assert _dcpfl_server_algo().down_bytes(out) == (4 * 3 + 4) * 4 + 4 * 3 * 4      # header + 4 means, float32
    assert _dcpfl_server_algo(lam=0.0).down_bytes(out) == (4 * 3 + 4) * 4           # w/o AL: no means sent


# ---------------------------------------------------------------- FedProto server
def test_fedproto_prototypes_averaged_by_class_counts():
    algo = FedProto.__new__(FedProto)
    algo.hp = {"weighting": "count"}
    server = {"protos": torch.full((3, 2), -1.0), "has_proto": torch.tensor([False, False, True])}
    ups = [_msg([0, 1], [3, 1], [[1.0, 1.0], [2.0, 2.0]]), _msg([1], [3], [[6.0, 6.0]])]
    out = algo.aggregate(1, server, ups, {})
    assert out["protos"].tolist() == [[1.0, 1.0], [5.0, 5.0], [-1.0, -1.0]]  # class 2 absent: kept
    assert out["has_proto"].tolist() == [True, True, True]
    algo.hp = {"weighting": "plain"}
    assert algo.aggregate(1, server, ups, {})["protos"][1].tolist() == [4.0, 4.0]


# ---------------------------------------------------------------- on Fashion-MNIST
def _ctx(**kw):
    cfg = RunConfig.from_dict(small_cfg(subsample=0.02, n_clients=5, rounds=1, **SKEWED, **kw))
    return build_context(cfg, torch.device("cpu"))


@needs_fmnist
def test_dcpfl_without_al_trains_like_fedgh_and_with_al_differently():
    ctx = _ctx(algorithm="dcpfl")
    gh, dc0, dc = FedGH(ctx), DCPFL(ctx, lam=0.0), DCPFL(ctx, lam=0.01)
    server = dc.server_init()
    server = {**server, "means": torch.randn_like(server["means"]), "has_mean": torch.ones_like(server["has_mean"])}
    _, s_gh = gh.client_update(2, 1, server, None)
    _, s_dc0 = dc0.client_update(2, 1, server, None)
    _, s_dc = dc.client_update(2, 1, server, None)
    assert all(torch.equal(s_gh["body"][n], s_dc0["body"][n]) for n in s_gh["body"])
    assert any(not torch.equal(s_gh["body"][n], s_dc["body"][n]) for n in s_gh["body"])


@needs_fmnist
@pytest.mark.parametrize("algorithm", ["dcpfl", "fedgh", "fedproto"])
def test_heterogeneous_round_runs_and_counts_the_statistics_sent(store, algorithm, monkeypatch):
    monkeypatch.setenv("PFLREPRO_KEEP_CHECKPOINTS", "1")   # its final states are read below
    models = ["cnn1", "cnn2", "cnn3", "cnn4", "cnn5"]
    cfg = small_cfg(algorithm=algorithm, model="cnn1", models=models, n_clients=5, subsample=0.02, rounds=1, **SKEWED)
    res = run(cfg, progress=False)
    assert math.isnan(res.history[-1]["gm_acc"])       # no global extractor, no average across architectures
    assert all(0.0 <= a <= 1.0 for a in res.per_client[-1])
    ctx = build_context(RunConfig.from_dict(cfg), torch.device("cpu"))
    n_classes = sum(len(torch.unique(ctx.data.client_train(k)[1])) for k in range(5))
    per_class = 8 + 8 + 500 * 4 + (500 * 500 * 4 if algorithm == "dcpfl" else 0)  # class id, count, mean, cov
    assert res.history[-1]["bytes_up"] == n_classes * per_class
    assert res.history[-1]["bytes_down"] == (0 if algorithm == "fedproto" else 5 * (500 * 10 + 10) * 4)
    ckpt = load_checkpoint(res.path / "checkpoint.pt", res.config)  # tensors only
    assert set(ckpt["clients"]) == set(range(5))


@needs_fmnist
@pytest.mark.parametrize("algorithm", ["dcpfl", "fedgh", "fedproto"])
def test_methods_learn_on_class_skewed_fmnist(store, algorithm):
    """2 classes per client: a constant guess scores ~0.5 per client, random 0.1; the floor sits well above.
    lr 0.02 (not small_cfg's 0.05): with momentum 0.9, FedGH's shared header diverges at 0.05 here."""
    res = run(small_cfg(algorithm=algorithm, rounds=3, eval_every=3, lr=0.02, local_epochs=2, **SKEWED),
              progress=False)
    assert res.metric("pm_acc_mean")[-1] > 0.75, res.metric("pm_acc_mean")
