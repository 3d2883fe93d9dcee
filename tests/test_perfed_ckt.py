"""PerFed-CKT (clustered co-distillation): the loss of eq. 1, the server's clustering and eq. 4's choice,
the public set, the bytes a round sends, and a short learning run on Fashion-MNIST."""
import math

import numpy as np
import pytest
import torch
from torch import nn

from pflrepro.algorithms.perfed_ckt import codistillation_loss, kmeans_centroids, nearest_centroid, soft_decisions
from pflrepro.federation.build import build_partition, public_indices
from pflrepro.federation.config import RunConfig
from pflrepro.params import ConfigError
from pflrepro.pipeline.store import run

from .conftest import FMNIST_AVAILABLE, small_cfg


def test_codistillation_loss_hand_computed():
    """W = 0, b = 0: s(w, x) = (1/2, 1/2) everywhere, CE = ln 2; targets (1,0), (0,1), (1/2,1/2) are at squared
    distances 1/2, 1/2, 0: the public term is lam * 1/3 (b' >= |P|: the whole public set, any order)."""
    net = nn.Linear(2, 2)
    nn.init.zeros_(net.weight), nn.init.zeros_(net.bias)
    public = torch.tensor([[1.0, 0.0], [0.0, 1.0], [3.0, -2.0]])
    target = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]])
    loss = codistillation_loss(2.0, public, target, 5, torch.Generator().manual_seed(0))
    value = loss(net, torch.tensor([[0.3, 0.7]]), torch.tensor([1]))
    assert value.item() == pytest.approx(math.log(2) + 2.0 / 3.0, abs=1e-6)
    # the gradient is eq. 2's: 2 lam / |P| sum grad s^T (s - s_bar) + grad CE
    value.backward()
    assert net.weight.grad.abs().sum() > 0
    raw = codistillation_loss(2.0, public, target, 5, torch.Generator().manual_seed(0), output="logits")
    # logits are 0: distances 1, 1, 1/2 -> lam * (5/2) / 3
    assert raw(net, torch.tensor([[0.3, 0.7]]), torch.tensor([1])).item() == pytest.approx(
        math.log(2) + 2.0 * 2.5 / 3.0, abs=1e-6)


def test_public_minibatch_is_drawn_per_step():
    """b' < |P|: each call draws another public batch (the target rows follow the drawn inputs)."""
    net = nn.Linear(1, 2)
    nn.init.zeros_(net.weight), nn.init.zeros_(net.bias)
    public = torch.arange(6.0).view(6, 1)
    target = torch.tensor([[1.0, 0.0]] * 3 + [[0.5, 0.5]] * 3)   # rows 0-2 at distance 1/2, rows 3-5 at 0
    loss = codistillation_loss(1.0, public, target, 1, torch.Generator().manual_seed(3))
    values = {round(loss(net, torch.zeros(1, 1), torch.tensor([0])).item() - math.log(2), 6) for _ in range(40)}
    assert values == {0.0, 0.5}


def test_kmeans_and_nearest_centroid():
    pts = torch.tensor([[0.0, 0.0], [0.0, 1.0], [10.0, 10.0], [10.0, 11.0]])
    c2 = kmeans_centroids(pts, 2, seed=0)
    assert sorted(map(tuple, c2.tolist())) == [(0.0, 0.5), (10.0, 10.5)]
    assert kmeans_centroids(pts, 1, seed=0).tolist() == [[5.0, 5.5]]
    dup = torch.tensor([[1.0, 2.0], [1.0, 2.0], [3.0, 4.0]])
    assert kmeans_centroids(dup, 3, seed=0).shape == (2, 2)        # two distinct rows: two clusters
    cents = torch.tensor([[[0.0, 0.0]], [[1.0, 1.0]], [[5.0, 5.0]]])   # (c, |P| = 1, N = 2)
    assert nearest_centroid(cents, torch.tensor([[0.9, 0.6]])).tolist() == [[1.0, 1.0]]
    assert nearest_centroid(cents, torch.tensor([[3.1, 3.0]])).tolist() == [[5.0, 5.0]]
    assert nearest_centroid(cents, torch.tensor([[0.5, 0.5]])).tolist() == [[0.0, 0.0]]   # tie: the first


def test_soft_decisions_are_softmax_rows_in_eval_mode():
    net = nn.Sequential(nn.Linear(3, 4), nn.Dropout(0.9))
    x = torch.randn(7, 3)
    s = soft_decisions(net, x)
    assert net.training                                           # mode restored
    assert torch.allclose(s, torch.softmax(net[0](x), 1))          # dropout off
    assert torch.allclose(s.sum(1), torch.ones(7))


def _ckt(**kw):
    return small_cfg(**{"algorithm": "perfed_ckt", "subsample": 0.1, "partition": "shards", "partition_params": {"s": 2},
                        "public": {"size": 300}, "hparams": {"tau": 5, "clusters": 2}, "rounds": 1, **kw})


def test_config_requires_a_public_set_of_the_run_shape():
    with pytest.raises(ConfigError, match="public.size=0"):
        RunConfig.from_dict(_ckt(public={}))
    with pytest.raises(ConfigError, match="public.dataset='cifar100'"):
        RunConfig.from_dict(_ckt(public={"size": 10, "dataset": "cifar100"}))
    with pytest.raises(ConfigError, match="public.split"):
        RunConfig.from_dict(_ckt(public={"size": 10, "split": "val"}))


@pytest.mark.skipif(not FMNIST_AVAILABLE, reason="needs Fashion-MNIST (Debian package)")
def test_public_set_is_disjoint_from_every_client_and_test_sample():
    cfg = RunConfig.from_dict(_ckt(split="perfed_ckt", split_params={}))
    split = build_partition(cfg)
    pub = public_indices(cfg, split)
    used = np.concatenate([a for name in ("train", "val", "test") for a in split[name]])
    assert len(pub) == 300 and len(np.unique(pub)) == 300
    assert not np.intersect1d(pub, used).size
    assert np.array_equal(pub, public_indices(cfg, split))            # deterministic
    test_half = RunConfig.from_dict(_ckt(public={"size": 50, "split": "test"}))
    from pflrepro.federation.build import _gm_test_keep, raw_dataset
    assert not np.intersect1d(public_indices(test_half), _gm_test_keep(test_half, raw_dataset("fmnist"))).size
    with pytest.raises(ValueError, match="only .* samples of fmnist/test are left"):
        public_indices(RunConfig.from_dict(_ckt(subsample=1.0, public={"size": 50, "split": "test"})))


@pytest.mark.slow
@pytest.mark.skipif(not FMNIST_AVAILABLE, reason="needs Fashion-MNIST (Debian package)")
def test_round_sends_soft_decisions_only(store):
    """Homogeneous clients start from one init: S^(-1)'s soft decisions coincide, one centroid reaches round 1;
    each of the m clients uploads |P| x N floats and receives the centroids."""
    cfg = _ckt(participation=0.5, hparams={"tau": 3, "clusters": 2, "public_batch": 16})
    res = run(cfg, progress=False)
    m, P, N = 5, 300, 10
    assert res.history[0]["bytes_up"] == m * P * N * 4
    assert res.history[0]["bytes_down"] == m * 1 * P * N * 4
    same = run(cfg, progress=False, force=True)                # deterministic
    assert same.history[0]["pm_acc_mean"] == res.history[0]["pm_acc_mean"]
    assert same.history[0]["train_loss"] == res.history[0]["train_loss"]
    again = run({**cfg, "rounds": 2}, progress=False)          # a second round: two distinct centroids now
    assert again.history[-1]["bytes_down"] - again.history[0]["bytes_down"] == m * 2 * P * N * 4


@pytest.mark.slow
@pytest.mark.skipif(not FMNIST_AVAILABLE, reason="needs Fashion-MNIST (Debian package)")
def test_perfed_ckt_learns(store):
    """2 classes per client: a constant guess scores ~0.5 on a client's test set."""
    cfg = _ckt(participation=1.0, rounds=3, hparams={"tau": 10, "clusters": 2, "public_batch": 32}, lr=0.05)
    res = run(cfg, progress=False)
    assert res.metric("pm_acc_mean")[-1] > 0.8, res.metric("pm_acc_mean")
