"""pFedMe and FedFomo (pFedSD's baselines): hand-computed math, seeded draws, byte accounting,
and short learning runs on real Fashion-MNIST."""
import io
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from pflrepro.algorithms import ALGORITHMS
from pflrepro.algorithms.base import Update
from pflrepro.algorithms.fedfomo import FedFomo, epsilon, fomo_update, fomo_weights, val_loss
from pflrepro.algorithms.pfedme import PFedMe
from pflrepro.core.aggregation import clone_state, state_bytes
from pflrepro.federation.build import build_context
from pflrepro.federation.config import RunConfig
from pflrepro.pipeline.store import run
from tests.conftest import FMNIST_AVAILABLE, small_cfg

needs_fmnist = pytest.mark.skipif(not FMNIST_AVAILABLE, reason="needs offline Fashion-MNIST")


def _ctx(**kw):
    cfg = RunConfig.from_dict(small_cfg(**{"subsample": 0.02, "n_clients": 4, "rounds": 1, **kw}))
    return build_context(cfg, torch.device("cpu"))


def _copy(net):
    out = torch.nn.Linear(net.in_features, net.out_features, bias=net.bias is not None)
    out.load_state_dict(net.state_dict())
    return out


# ---------------------------------------------------------------- pFedMe
def test_pfedme_outer_gradient_hand_computed():
    """K = 1 from theta = w = 0: theta_hat = -plr * grad f(0); the loss's gradient w.r.t. w is
    lambda (w - theta_hat) = lambda * plr * grad f(0); its value is f(0) = ln 2."""
    algo = PFedMe(None, lam=15.0, K=1, personal_lr=0.1)
    net = torch.nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        net.weight.zero_()
    theta = _copy(net)
    x, y = torch.tensor([[1.0, 2.0]]), torch.tensor([0])
    value = algo.moreau_loss(theta)(net, x, y)
    value.backward()
    grad_f = torch.tensor([[-0.5, -1.0], [0.5, 1.0]])      # (softmax(0) - e_0) x^T
    assert torch.allclose(theta.weight, -0.1 * grad_f)
    assert torch.allclose(net.weight.grad, 15.0 * 0.1 * grad_f)  # [[-0.75, -1.5], [0.75, 1.5]]
    assert value.item() == pytest.approx(math.log(2.0), rel=1e-6)


def test_pfedme_outer_gradient_is_lambda_w_minus_theta_hat():
    """General case (K = 3, warm start away from w, with bias): d loss / d w = lambda (w - theta_hat)."""
    torch.manual_seed(0)
    algo = PFedMe(None, lam=4.0, K=3, personal_lr=0.05)
    net, theta = torch.nn.Linear(3, 4), torch.nn.Linear(3, 4)
    x, y = torch.randn(6, 3), torch.randint(0, 4, (6,))
    algo.moreau_loss(theta)(net, x, y).backward()
    for n, p in net.named_parameters():
        want = 4.0 * (p.detach() - dict(theta.named_parameters())[n].detach())
        assert want.abs().max() > 1e-3 and torch.allclose(p.grad, want, atol=1e-6), n


def test_pfedme_inner_solve_reaches_the_prox_point():
    """The inner problem theta_hat = argmin f(theta) + lambda/2 ||theta - w||^2 (strongly convex for a
    linear model): enough steps drive its gradient to 0, away from w; one step only part of the way."""
    torch.manual_seed(1)
    net = torch.nn.Linear(3, 2)
    x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
    w = {n: p.detach().clone() for n, p in net.named_parameters()}

    def residual(theta):  # gradient of the inner objective at theta
        t = dict(theta.named_parameters())
        g = torch.autograd.grad(F.cross_entropy(theta(x), y), list(t.values()))
        return math.sqrt(sum(float(((gi + 2.0 * (t[n].detach() - w[n])) ** 2).sum()) for gi, n in zip(g, t)))

    at_w = residual(_copy(net))
    found = {}
    for K in (1, 300):
        theta = _copy(net)
        PFedMe(None, lam=2.0, K=K, personal_lr=0.05, inner_init="w").moreau_loss(theta)(net, x, y)
        found[K] = (residual(theta), float((theta.weight - net.weight).detach().abs().max()))
    assert at_w > 0.05
    assert found[300][0] < 1e-5 * at_w and found[300][1] > 1e-2   # stationary, and not at w
    assert 1e-3 * at_w < found[1][0] < at_w


def test_pfedme_server_beta_mix_plain_mean():
    """w <- (1 - beta) w + beta * mean_k w_k, a plain mean (sizes 1 and 3 ignored); integer buffers
    take the first client's value."""
    server = {"params": {"a": torch.tensor([1.0, 1.0]), "n": torch.tensor(3)}}
    ups = [Update(weight=1.0, payload={"a": torch.tensor([2.0, 4.0]), "n": torch.tensor(5)}),
           Update(weight=3.0, payload={"a": torch.tensor([4.0, 8.0]), "n": torch.tensor(7)})]
    for beta, want in [(1.0, [3.0, 6.0]), (0.5, [2.0, 3.5]), (2.0, [5.0, 11.0])]:
        out = PFedMe(None, beta=beta).aggregate(1, server, ups, {})["params"]
        assert torch.allclose(out["a"], torch.tensor(want)), beta
        assert int(out["n"]) == 5


@needs_fmnist
def test_pfedme_client_update_keeps_theta_and_sends_one_model():
    ctx = _ctx(algorithm="pfedme")
    algo = ALGORITHMS["pfedme"](ctx, K=2)
    server = algo.server_init()
    up, st = algo.client_update(1, 0, server, None)
    nbytes = state_bytes(server["params"])
    assert up.bytes_down == nbytes and up.bytes_up == nbytes                    # Table 11: one model each way
    assert up.samples == 2 * ctx.cfg.local_epochs * len(ctx.data.train[0])    # K inner passes per sample
    assert any(not torch.equal(st["params"][n], up.payload[n]) for n in up.payload)   # theta_k != w_k
    assert any(not torch.equal(server["params"][n], up.payload[n]) for n in up.payload)  # w moved
    pm = algo.personal_model(0, server, st).state_dict()
    assert all(torch.equal(pm[n], st["params"][n]) for n in pm)
    up_r, _ = ALGORITHMS["pfedme"](ctx, K=2, R=3).client_update(1, 0, server, None)   # pFedMe code: R batches
    assert up_r.samples == 2 * 3 * ctx.cfg.batch_size


# ---------------------------------------------------------------- FedFomo: math
def test_fomo_weights_hand_computed():
    # w_n = (1.0 - L_n) / d_n = [0.5 / 1, 0.2 / 0.5, -0.2 / 2] = [0.5, 0.4, -0.1] -> [5/9, 4/9, 0]
    raw, w = fomo_weights(1.0, [0.5, 0.8, 1.2], [1.0, 0.5, 2.0])
    assert torch.allclose(raw, torch.tensor([0.5, 0.4, -0.1], dtype=torch.float64))
    assert torch.allclose(w, torch.tensor([5 / 9, 4 / 9, 0.0], dtype=torch.float64))
    raw, w = fomo_weights(1.0, [1.5, 3.0], [1.0, 2.0])          # all worse than theta_k: no update
    assert torch.allclose(raw, torch.tensor([-0.5, -1.0], dtype=torch.float64)) and torch.all(w == 0)
    raw, w = fomo_weights(1.0, [0.5, 0.9], [0.0, 1.0])           # distance 0 carries no update
    assert raw[0] == 0 and torch.allclose(w, torch.tensor([0.0, 1.0], dtype=torch.float64))


def test_fomo_update_hand_computed():
    theta = {"a": torch.tensor([0.0, 0.0]), "n": torch.tensor(4)}
    models = [{"a": torch.tensor([2.0, 0.0]), "n": torch.tensor(9)},
              {"a": torch.tensor([0.0, 4.0]), "n": torch.tensor(9)}]
    out = fomo_update(theta, models, [0.25, 0.75])
    assert torch.allclose(out["a"], torch.tensor([0.5, 3.0])) and int(out["n"]) == 4
    assert torch.allclose(fomo_update(theta, models, [0.5, 0.0])["a"], torch.tensor([1.0, 0.0]))
    _, w = fomo_weights(1.0, [2.0, 3.0], [1.0, 1.0])
    assert torch.equal(fomo_update(theta, models, w)["a"], theta["a"])   # all-negative: theta_k kept


def test_epsilon_schedule():
    got = [epsilon(0.3, 0.05, r) for r in range(1, 10)]
    assert got == pytest.approx([0.3, 0.25, 0.2, 0.15, 0.1, 0.05, 0.0, 0.0, 0.0], abs=1e-12)
    assert min(got) >= 0.0


# ---------------------------------------------------------------- FedFomo: epsilon-greedy draw
def _stub(seed=0, n=8, **hp):
    return FedFomo(SimpleNamespace(cfg=SimpleNamespace(seed=seed), data=SimpleNamespace(n_clients=n)), **hp)


def _server(avail, aff_row=None, k=4, n=8):
    aff = torch.zeros(n, n)
    if aff_row is not None:
        aff[k] = torch.tensor(aff_row)
    return {"models": {str(j): {} for j in avail}, "affinity": aff}


def test_fomo_greedy_takes_top_affinity_among_uploaded():
    row = [0.1, 0.9, 0.0, 0.5, 9.0, 0.7, -1.0, 0.2]   # client 4's own entry is never a candidate
    algo = _stub(M=3)
    assert algo.choose(7, 4, _server([0, 1, 2, 3, 4, 5, 6, 7], row)) == [1, 5, 3]     # epsilon_7 = 0
    assert algo.choose(9, 4, _server([0, 1, 2, 3, 6, 7], row)) == [1, 3, 7]          # 5 never uploaded
    assert sorted(algo.choose(9, 4, _server([2, 6], row))) == [2, 6]                 # fewer than M
    assert algo.choose(1, 4, _server([])) == []


def test_fomo_draw_is_seeded_and_explores():
    avail, row = [0, 1, 2, 3, 5, 6, 7], [0.0, 5.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    explore = _stub(M=2, eps=1.0, eps_decay=0.0)
    draws = [explore.choose(r, 4, _server(avail, row)) for r in range(1, 41)]
    assert draws == [explore.choose(r, 4, _server(avail, row)) for r in range(1, 41)]   # same seeds, same draws
    assert all(len(set(d)) == 2 and set(d) <= set(avail) for d in draws)
    assert 0 < sum(1 in d for d in draws) < 40       # exploring ignores the affinity
    greedy = _stub(M=2, eps=0.0)
    assert all(1 in greedy.choose(r, 4, _server(avail, row)) for r in range(1, 41))
    # ties (all zero affinity) are broken at random, but reproducibly from (seed, round, client)
    ties = [_stub(seed=s, M=2, eps=0.0).choose(3, 4, _server(avail)) for s in range(6)]
    assert len({tuple(t) for t in ties}) > 1
    assert ties[2] == _stub(seed=2, M=2, eps=0.0).choose(3, 4, _server(avail))


# ---------------------------------------------------------------- FedFomo: one client on real data
@needs_fmnist
def test_fedfomo_bytes_affinity_and_holdout():
    ctx = _ctx(algorithm="fedfomo", n_clients=8)
    algo = ALGORITHMS["fedfomo"](ctx, **ctx.cfg.hparams)
    server = algo.server_init()
    (xt, yt), (xv, yv) = algo.local_data(0)
    n = len(ctx.data.train[0])
    assert len(yv) == math.floor(0.25 * n) and len(yt) + len(yv) == n
    (xt2, _), (xv2, _) = algo.local_data(0)
    assert torch.equal(xv, xv2) and torch.equal(xt, xt2)                         # fixed over rounds
    assert not (xv.flatten(1)[:, None] == xt.flatten(1)[None]).all(-1).any()       # disjoint
    # round 1: nothing to download; the update is plain CE from the common init on the training part
    ups = [algo.client_update(1, k, server, None)[0] for k in range(8)]
    assert all(u.bytes_down == 0 for u in ups) and ups[0].weight == len(yt)
    net = ctx.model(0, ctx.init_state)
    ctx.train(net, 0, 1, data=(xt, yt))
    assert all(torch.equal(net.state_dict()[n_], ups[0].payload["params"][n_]) for n_ in net.state_dict())
    server = algo.aggregate(1, server, ups, {})
    assert sorted(server["models"]) == [str(k) for k in range(8)]
    # round 2: M = 5 downloads, counted; the weights go into P[0]
    up, st = algo.client_update(2, 0, server, None)
    model = state_bytes(server["models"]["0"])
    chosen = algo.choose(2, 0, server)
    assert st is None and len(chosen) == 5 and up.bytes_down == 5 * model and up.bytes_up == model + 4 * 5
    inc = up.payload["affinity"]
    assert set(torch.nonzero(inc).flatten().tolist()) <= set(chosen) and inc.min() >= 0
    assert float(inc.sum()) == pytest.approx(1.0, abs=1e-6) or float(inc.sum()) == 0.0
    new = algo.aggregate(2, server, [up], {})
    assert torch.allclose(new["affinity"][0], inc) and torch.equal(new["affinity"][1:], server["affinity"][1:])
    buf = io.BytesIO()
    torch.save(new, buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=True)                                      # checkpointable
    assert torch.equal(back["models"]["0"]["head.weight"], up.payload["params"]["head.weight"])


@needs_fmnist
def test_fedfomo_client_combines_the_downloads_by_their_weights():
    """With E = 0 the upload is theta_k after the update: it must equal the weights recomputed here
    from validation losses and parameter distances."""
    ctx = _ctx(algorithm="fedfomo", n_clients=6, local_epochs=0)
    algo = ALGORITHMS["fedfomo"](ctx, M=3)
    table = {}
    for j in range(1, 6):
        net = ctx.model(j, ctx.init_state)
        ctx.train(net, j, 1, epochs=1)
        table[str(j)] = clone_state(net.state_dict())
    server = {"models": table, "affinity": torch.zeros(6, 6)}
    up, _ = algo.client_update(9, 0, server, None)                 # epsilon_9 = 0; client 0 holds the init
    models = [table[str(j)] for j in algo.choose(9, 0, server)]
    _, (xv, yv) = algo.local_data(0)
    base = val_loss(ctx.model(0, ctx.init_state), xv, yv)
    losses = [val_loss(ctx.model(0, m), xv, yv) for m in models]
    dists = [torch.cat([(m[n] - ctx.init_state[n]).flatten() for n, _ in ctx.model(0).named_parameters()]).norm()
             for m in models]
    _, w = fomo_weights(base, losses, dists)
    assert len(models) == 3 and (w > 0).any() and float(w.sum()) == pytest.approx(1.0)
    want = fomo_update(ctx.init_state, models, w)
    assert all(torch.allclose(up.payload["params"][n], want[n], atol=1e-6) for n in want)


@needs_fmnist
def test_fedfomo_validation_from_split():
    ctx = _ctx(algorithm="fedfomo", split_params={"fractions": [0.6, 0.2, 0.2]})
    (xt, _), (xv, yv) = ALGORITHMS["fedfomo"](ctx, val="split").local_data(1)
    assert torch.equal(xv, ctx.data.client_val(1)[0]) and torch.equal(xt, ctx.data.client_train(1)[0])
    with pytest.raises(ValueError, match="validation part"):
        ALGORITHMS["fedfomo"](_ctx(algorithm="fedfomo"), val="split").local_data(1)


# ---------------------------------------------------------------- learning runs
@needs_fmnist
@pytest.mark.parametrize("algorithm, subsample", [("pfedme", 0.05), ("fedfomo", 0.1)])
def test_baselines_learn_on_pathological_fmnist(store, algorithm, subsample):
    """2 classes per client: a constant guess scores ~0.5 per client, chance over 10 classes 0.1.
    (pFedMe costs K + 1 passes per batch: half the data keeps it as fast as the others.)"""
    res = run(small_cfg(algorithm=algorithm, partition="shards", partition_params={"s": 2}, subsample=subsample,
                        rounds=3), progress=False)
    pm = res.metric("pm_acc_mean")
    assert pm[-1] > 0.7 and pm[-1] > pm[0], pm


@needs_fmnist
def test_cost_bytes_are_the_steady_rounds_not_the_warm_up():
    """Table 11's bytes per client and round (pflrepro.pipeline.cost.measure): FedAvg one model down and one up; FedFomo
    M models down, one model and M float32 weights up once every client has uploaded. Round 1, when FedFomo
    has nothing to download, is warm-up (it made FedFomo's bytes 4.33 models instead of 6 at mini)."""
    from pflrepro.federation.config import RunConfig
    from pflrepro.pipeline.cost import measure
    from tests.conftest import small_cfg
    cfg = RunConfig.from_dict(small_cfg(n_clients=4, subsample=0.02, rounds=2, split="random",
                                        split_params={"fractions": [0.75, 0.25]}))
    avg = measure(cfg)
    model = 4 * avg["model_params"]
    assert avg["bytes_per_client"] == 2 * model
    fomo = measure(cfg.replace(algorithm="fedfomo", hparams={"M": 2}))
    assert fomo["bytes_per_client"] == 2 * model + model + 4 * 2
