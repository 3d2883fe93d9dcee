"""FedBSD Fig. 3's multi-domain federations: the Fashion-MNIST feature shifts on hand-computed images, the
one-domain-per-client partition and test split, the domain datasets' loaders, FedBN's and FedBSD's (local_bn)
uploads and aggregation on hand-computed states, and a short learning run of each on real Fashion-MNIST."""
import numpy as np
import pytest
import torch

from pflrepro.algorithms import ALGORITHMS
from pflrepro.core.aggregation import clone_state
from pflrepro.core.training import TrainStats
from pflrepro.data.datasets import SPECS, DatasetUnavailable, fmnist_domain_transform, load_dataset
from pflrepro.data.models import bn_names
from pflrepro.data.partition import by_domain, domain_test
from pflrepro.federation.build import build_context, build_partition
from pflrepro.federation.config import RunConfig
from pflrepro.pipeline.store import run
from tests.conftest import FMNIST_AVAILABLE, small_cfg

needs_fmnist = pytest.mark.skipif(not FMNIST_AVAILABLE, reason="needs offline Fashion-MNIST")
HEAD = {"head.weight", "head.bias"}


# ---------------------------------------------------------------- the feature shifts
def test_domain_transforms_on_a_hand_made_image():
    x = torch.zeros(1, 1, 28, 28, dtype=torch.uint8)
    x[0, 0, 0, :4] = torch.tensor([0, 40, 80, 120], dtype=torch.uint8)   # one 4x4 block's first row
    x[0, 0, 0, 27] = 200                                                   # top-right pixel
    assert torch.equal(fmnist_domain_transform(x, "original"), x)
    inv = fmnist_domain_transform(x, "inverted")
    assert inv[0, 0, 0, 1] == 215 and inv[0, 0, 5, 5] == 255 and inv[0, 0, 0, 27] == 55
    rot = fmnist_domain_transform(x, "rotated")          # 90 degrees counter-clockwise: (r, c) -> (27 - c, r)
    assert rot[0, 0, 0, 0] == 200 and rot[0, 0, 27, 0] == 0 and rot[0, 0, 26, 0] == 40 and rot.sum() == x.sum()
    low = fmnist_domain_transform(x, "lowres")           # block mean (0 + 40 + 80 + 120) / 16 = 15, repeated 4x4
    assert torch.equal(low[0, 0, :4, :4], torch.full((4, 4), 15, dtype=torch.uint8))
    assert torch.equal(low[0, 0, :4, 24:], torch.full((4, 4), round(200 / 16), dtype=torch.uint8))
    assert low[0, 0, 4:, :].sum() == 0
    n1, n2 = fmnist_domain_transform(x, "noisy", seed=3), fmnist_domain_transform(x, "noisy", seed=3)
    assert torch.equal(n1, n2) and n1.dtype == torch.uint8 and not torch.equal(n1, x)
    gray = torch.full((4, 1, 28, 28), 128, dtype=torch.uint8)   # mid-gray: 2 std from both ends, little clipped
    d = fmnist_domain_transform(gray, "noisy", seed=3).float() - 128
    assert 58 < d.std() < 68 and d.mean().abs() < 4       # Gaussian noise of std 64
    with pytest.raises(ValueError, match="unknown Fashion-MNIST domain"):
        fmnist_domain_transform(x, "sepia")


# ---------------------------------------------------------------- partition and split
def test_by_domain_gives_each_client_its_domain_and_domain_test_its_test_half():
    labels = np.array([0, 1, 2, 0, 1, 2, 0])
    doms = np.array([1, 0, 2, 1, 0, 2, 2])
    parts = by_domain(labels, 3, seed=0, domains=doms)
    assert [p.tolist() for p in parts] == [[1, 4], [0, 3], [2, 5, 6]]
    split = domain_test(labels, parts, seed=0, test_domains=np.array([2, 0, 0, 1]))
    assert [p.tolist() for p in split["train"]] == [[1, 4], [0, 3], [2, 5, 6]]
    assert [p.tolist() for p in split["test"]] == [[1, 2], [3], [0]]
    with pytest.raises(ValueError, match="3 domains"):
        by_domain(labels, 2, seed=0, domains=doms)
    with pytest.raises(ValueError, match="multi-domain dataset"):
        by_domain(labels, 3, seed=0)
    with pytest.raises(ValueError, match="multi-domain dataset"):
        domain_test(labels, parts, seed=0)


def test_by_domain_on_a_single_domain_dataset_fails_clearly():
    cfg = RunConfig.from_dict({**small_cfg(dataset="fake-mnist", partition="by_domain", n_clients=5, subsample=0.01),
                               "split": "random"})
    with pytest.raises(ValueError, match="multi-domain dataset"):
        build_partition(cfg)


def test_domain_test_needs_the_train_pool():
    from pflrepro.params import ConfigError
    with pytest.raises(ConfigError, match="pool='train'"):
        RunConfig.from_dict(small_cfg(dataset="fake-digits", partition="by_domain", split="domain_test",
                                      split_params={}, n_clients=5, pool="train+test"))


def test_paper_domain_sets_stand_ins_and_files(tmp_path, monkeypatch):
    """The stand-ins have the paper sets' shapes and one block of images per domain; the real sets are read from
    the npz files the user provides, and a missing file names the folder and files to put there."""
    fake = load_dataset("fake-digits")
    assert tuple(fake.x_train.shape[1:]) == (3, 28, 28) and fake.d_train.bincount().tolist() == [743] * 5
    monkeypatch.setenv("PFLREPRO_DATA", str(tmp_path))
    with pytest.raises(DatasetUnavailable, match=r"(?s)svhn_\{train,test\}\.npz.*Missing: .*svhn_train\.npz"):
        load_dataset("digits")
    (tmp_path / "digits").mkdir()
    rng = np.random.default_rng(0)
    for i, dom in enumerate(SPECS["digits"].domains):
        for half, n in (("train", 3), ("test", 2)):
            np.savez(tmp_path / "digits" / f"{dom}_{half}.npz", x=rng.integers(0, 256, (n, 28, 28, 3), dtype=np.uint8),
                     y=np.full(n, i))
    raw = load_dataset("digits")
    assert tuple(raw.x_train.shape) == (15, 3, 28, 28) and tuple(raw.x_test.shape) == (10, 3, 28, 28)
    assert raw.d_train.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4] and raw.y_test.tolist() == raw.d_test.tolist()
    np.savez(tmp_path / "digits" / "usps_test.npz", x=np.zeros((2, 16, 16), np.uint8), y=np.zeros(2, np.int64))
    with pytest.raises(DatasetUnavailable, match="expected"):
        load_dataset("digits")


@needs_fmnist
def test_fmnist_domains_are_disjoint_fifths_with_fashion_mnist_labels():
    raw, base = load_dataset("fmnist-domains"), load_dataset("fmnist")
    assert raw.d_train.bincount().tolist() == [12000] * 5 and raw.d_test.bincount().tolist() == [2000] * 5
    assert torch.equal(raw.y_train, base.y_train) and torch.equal(raw.y_test, base.y_test)
    for d, dom in enumerate(SPECS["fmnist-domains"].domains):
        i = torch.nonzero(raw.d_train == d).flatten()[:50]
        if dom != "noisy":
            assert torch.equal(raw.x_train[i], fmnist_domain_transform(base.x_train[i], dom))


# ---------------------------------------------------------------- FedBN and FedBSD with local BN
def _ctx(**kw):
    cfg = RunConfig.from_dict(small_cfg(**{"model": "cnn_bn", "subsample": 0.02, "n_clients": 2, "rounds": 1, **kw}))
    return build_context(cfg, torch.device("cpu"))


def _filled(state, v):
    return {n: (torch.full_like(t, v) if t.is_floating_point() else t.clone()) for n, t in state.items()}


@needs_fmnist
def test_fedbn_uploads_and_averages_everything_but_bn():
    """Two clients 'trained' to constant states 1 and 4 with n_0, n_1 samples: the server's non-BN entries become
    (n_0 + 4 n_1) / (n_0 + n_1), its BN entries stay the initial ones, each client keeps its own BN (1 or 4),
    and its next start is the new global non-BN part with its own BN."""
    ctx = _ctx(algorithm="fedbn")
    algo = ALGORITHMS["fedbn"](ctx)
    server = algo.server_init()
    g = server["params"]
    bn = bn_names(ctx.model(0))
    assert bn and {n for n in g if n.startswith("body.bn")} == bn
    start = algo.plan(1, 0, server, None).start
    assert all(torch.equal(start[n], g[n]) for n in g)                       # first round: the initial model
    stats = TrainStats(loss=0.0, steps=1, samples=1)
    (u0, c0), (u1, c1) = [algo.finish(1, k, server, None, _filled(g, v), stats) for k, v in ((0, 1.0), (1, 4.0))]
    assert set(u0.payload) == set(g) - bn and set(c0["bn"]) == bn
    n0, n1 = len(ctx.data.train[0]), len(ctx.data.train[1])
    assert (u0.weight, u1.weight) == (n0, n1)
    new = algo.aggregate(1, server, [u0, u1], {0: c0, 1: c1})["params"]
    want = (n0 * 1.0 + n1 * 4.0) / (n0 + n1)
    for n in set(g) - bn:
        if g[n].is_floating_point():
            assert torch.allclose(new[n], torch.full_like(g[n], want)), n
    assert all(torch.equal(new[n], g[n]) for n in bn)                        # BN never reaches the server
    nxt = algo.plan(2, 1, {"params": new}, c1).start
    assert all(torch.equal(nxt[n], torch.full_like(g[n], 4.0)) for n in bn if g[n].is_floating_point())
    assert all(torch.equal(nxt[n], new[n]) for n in set(g) - bn)
    assert u0.bytes_up == sum(g[n].numel() * g[n].element_size() for n in set(g) - bn)


@needs_fmnist
def test_fedbsd_local_bn_trains_bn_with_the_backbone_but_keeps_it():
    """local_bn: the head phase trains the head only, the backbone phase every other layer (BN included), the
    upload is the backbone less BN, the client keeps head + BN; without it BN is uploaded as before."""
    ctx = _ctx(algorithm="fedbsd")
    g = ALGORITHMS["fedbsd"](ctx).server_init()["params"]
    bn = bn_names(ctx.model(0))
    for local_bn in (False, True):
        algo = ALGORITHMS["fedbsd"](ctx, head_epochs=1, body_epochs=1, local_bn=local_bn)
        server = algo.server_init()
        plan = algo.plan(1, 0, server, None)
        assert {n for n in g if plan.trainable(n)} == HEAD
        net = ctx.model(0, plan.start)
        stats = ctx.train_plan(net, 0, 1, plan)
        up, st = algo.finish(1, 0, server, None, clone_state(net.state_dict()), stats)
        kept = HEAD | bn if local_bn else HEAD
        assert set(up.payload) == set(g) - kept and set(st["personal"]) == kept
        moved = [n for n in bn if n.endswith("weight") and not torch.equal(st["personal"].get(n, up.payload.get(n)), g[n])]
        assert len(moved) == len([n for n in bn if n.endswith("weight")])   # BN trained in the backbone phase
        if local_bn:
            nxt = algo.plan(2, 0, algo.aggregate(1, server, [up], {0: st}), st).start
            assert all(torch.equal(nxt[n], st["personal"][n]) for n in bn)


@needs_fmnist
@pytest.mark.parametrize("algorithm, hparams", [("fedbn", {}),   # FedBSD learns in `make test` in test_rep_baselines.py
                                                pytest.param("fedbsd", {"head_epochs": 1, "body_epochs": 1, "local_bn": True},
                                                             marks=pytest.mark.full)])
def test_bn_local_methods_learn_on_fashion_mnist_domains(store, algorithm, hparams):
    """One domain per client (original, inverted, rotated, noisy, low resolution), 300 images each, 3 rounds:
    chance is 0.1 on every client."""
    res = run(small_cfg(algorithm=algorithm, hparams=hparams, dataset="fmnist-domains", model="cnn_bn",
                        partition="by_domain", split="domain_test", split_params={}, n_clients=5, subsample=0.025,
                        batch_size=10, lr=0.01, momentum=0.5, rounds=3, eval_every=3), progress=False)
    assert res.metric("pm_acc_mean")[-1] > 0.35, res.metric("pm_acc_mean")   # measured: FedBN 0.47, FedBSD > 0.55
    assert sum(a > 0.4 for a in res.per_client[-1]) >= 3, res.per_client[-1]  # FedBN: 0.66 0.15 0.25 0.65 0.62
