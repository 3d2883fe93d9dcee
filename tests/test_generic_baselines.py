"""Ditto, FedAvgM, FedDyn and SCAFFOLD: hand-computed updates and aggregation rules on tiny models and
hand-made messages, byte accounting, a resume that repeats an uninterrupted run, and one short
learning run each on real Fashion-MNIST."""
import io
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pflrepro.algorithms import ALGORITHMS
from pflrepro.algorithms.base import Update
from pflrepro.algorithms.ditto import Ditto
from pflrepro.algorithms.scaffold import Scaffold
from pflrepro.algorithms.server_opt import FedAvgM, FedDyn
from pflrepro.core.aggregation import state_bytes
from pflrepro.core.loop import run_rounds
from pflrepro.core.training import ModelView
from pflrepro.federation.build import build_context
from pflrepro.federation.config import RunConfig
from pflrepro.pipeline.store import WALL_COLUMNS, run
from tests.conftest import FMNIST_AVAILABLE, small_cfg

needs_fmnist = pytest.mark.skipif(not FMNIST_AVAILABLE, reason="needs offline Fashion-MNIST")


class _Tiny(nn.Module):
    """One parameter `w` (2 entries), a float buffer `rm` and an integer buffer `n` (like BN's)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(2))
        self.register_buffer("rm", torch.zeros(2))
        self.register_buffer("n", torch.tensor(0))


def _stub(n_clients=4, lr=0.1, momentum=0.0):
    net = _Tiny()
    return SimpleNamespace(model=lambda k, state=None: net, init_state=dict(net.state_dict()),
                           data=SimpleNamespace(n_clients=n_clients, train=[list(range(5))] * n_clients),
                           cfg=SimpleNamespace(lr=lr, momentum=momentum))


def _st(w, rm=(0.0, 0.0), n=0):
    return {"w": torch.tensor(w), "rm": torch.tensor(rm), "n": torch.tensor(n)}


def _ups(*states, weights=None):
    return [Update(weight=float(wt), payload=s) for s, wt in zip(states, weights or [1.0] * len(states))]


def _ctx(**kw):
    cfg = RunConfig.from_dict(small_cfg(**{"subsample": 0.02, "n_clients": 4, "rounds": 1, **kw}))
    return build_context(cfg, torch.device("cpu"))


def _grad(loss_fn, net, x, y, aux):
    net.zero_grad()
    loss_fn(ModelView(net), x, y, aux).backward()
    return {n: p.grad.clone() for n, p in net.named_parameters()}


def _net2():
    torch.manual_seed(0)
    return nn.Linear(2, 3), torch.tensor([[1.0, -2.0], [0.5, 1.0]]), torch.tensor([0, 2])


# ---------------------------------------------------------------- Ditto
def test_ditto_pm_objective_hand_computed():
    """h_k(v; w) = CE(v) + lam/2 ||v - w||^2: value on a one-weight model (v = 3, w = 1, lam = 0.5 ->
    0.25 * 4 = 1 above CE), and its gradient is grad CE + lam (v - w) (Algorithm 1's PM step)."""
    algo = Ditto(_stub(), lam=0.5)
    net = nn.Linear(1, 2, bias=False)
    with torch.no_grad():
        net.weight.copy_(torch.tensor([[3.0], [1.0]]))
    x, y = torch.zeros(1, 1), torch.tensor([0])
    anchor = {"weight": torch.tensor([[1.0], [1.0]])}
    ce = F.cross_entropy(net(x), y)
    assert (algo.prox(ModelView(net), x, y, {"anchor": anchor}) - ce).item() == pytest.approx(1.0)
    net, xb, yb = _net2()
    w = {n: p.detach() + 0.3 for n, p in net.named_parameters()}
    g = _grad(algo.prox, net, xb, yb, {"anchor": w})
    g_ce = _grad(lambda m, x, y, a: F.cross_entropy(m(x), y), net, xb, yb, {})
    for n, p in net.named_parameters():
        torch.testing.assert_close(g[n], g_ce[n] + 0.5 * (p.detach() - w[n]))


@needs_fmnist
def test_ditto_round_gm_is_fedavg_pm_is_anchored_at_received_w():
    ctx = _ctx(algorithm="ditto")
    algo, fa = ALGORITHMS["ditto"](ctx, lam=0.5, pm_epochs=2), ALGORITHMS["fedavg"](ctx)
    server = fa.server_init()
    server["params"] = {n: t + 0.01 for n, t in server["params"].items()}   # w^t != the initial weights
    up, st = algo.client_update(1, 0, server, None)
    up_fa, _ = fa.client_update(1, 0, server, None)
    assert all(torch.equal(up.payload[n], up_fa.payload[n]) for n in up_fa.payload)   # GM: FedAvg's solver
    assert up.bytes_up == up.bytes_down == state_bytes(server["params"])               # only the GM travels
    n_k = len(ctx.data.train[0])
    assert up.samples == (1 + 2) * n_k                                                 # E = 1 GM + 2 PM epochs
    # the PM: from the common initial weights, 2 epochs on CE + lam/2 ||v - w^t||^2, data order purpose 3
    net = ctx.model(0, ctx.initial(0))
    ctx.train(net, 0, 1, loss=algo.prox, epochs=2, aux={"anchor": server["params"]}, purpose=3)
    assert all(torch.equal(st["params"][n], t) for n, t in net.state_dict().items())
    assert any(not torch.equal(st["params"][n], up.payload[n]) for n in up.payload)
    pm = algo.personal_model(0, server, st).state_dict()
    assert all(torch.equal(pm[n], st["params"][n]) for n in pm)
    assert algo.personal_model(1, server, None) is None              # never selected: scored with the GM
    up2, st2 = algo.client_update(2, 0, server, st)                   # v_k carries over between rounds
    assert any(not torch.equal(st2["params"][n], st["params"][n]) for n in st["params"])


# ---------------------------------------------------------------- FedAvgM
def test_fedavgm_server_momentum_hand_computed():
    """Round 1 (v = 0): FedAvg's weighted mean. Round 2: v = beta v + (w - avg), w <- w - lr v.
    Buffers come from the average: float ones weighted, integer ones the first client's."""
    ctx = _stub()
    algo = FedAvgM(ctx, beta=0.9, server_lr=1.0)
    server = algo.server_init()
    server["params"] = _st([1.0, 1.0], n=3)
    out = algo.aggregate(1, server, _ups(_st([2.0, 4.0], (1.0, 1.0), 5), _st([4.0, 8.0], (3.0, 5.0), 7),
                                         weights=[1, 3]), {})
    assert set(out["momentum"]) == {"w"}                               # parameters only
    assert torch.allclose(out["momentum"]["w"], torch.tensor([-2.5, -6.0]))
    assert torch.allclose(out["params"]["w"], torch.tensor([3.5, 7.0]))
    assert torch.allclose(out["params"]["rm"], torch.tensor([2.5, 4.0])) and int(out["params"]["n"]) == 5
    # round 2: the clients average to [4.5, 8]: Delta = [-1, -1], v = 0.9 [-2.5, -6] + Delta = [-3.25, -6.4]
    ups = _ups(_st([4.5, 8.0]), _st([4.5, 8.0]))
    out2 = algo.aggregate(2, out, ups, {})
    assert torch.allclose(out2["momentum"]["w"], torch.tensor([-3.25, -6.4]))
    assert torch.allclose(out2["params"]["w"], torch.tensor([6.75, 13.4]))
    half = FedAvgM(ctx, beta=0.9, server_lr=0.5).aggregate(2, out, ups, {})
    assert torch.allclose(half["params"]["w"], torch.tensor([3.5 + 1.625, 7.0 + 3.2]))
    plain = FedAvgM(ctx, beta=0.0, server_lr=1.0).aggregate(2, out, ups, {})
    assert torch.allclose(plain["params"]["w"], torch.tensor([4.5, 8.0]))   # beta = 0, lr = 1: FedAvg


# ---------------------------------------------------------------- FedDyn
def test_feddyn_local_objective_gradient():
    """d/dtheta [CE - <g_k, theta - theta^{t-1}> + alpha/2 ||theta - theta^{t-1}||^2]
    = grad CE - g_k + alpha (theta - theta^{t-1})."""
    algo = FedDyn(_stub(), alpha=0.3)
    net, xb, yb = _net2()
    anchor = {n: p.detach() - 0.2 for n, p in net.named_parameters()}
    gk = {n: torch.full_like(p, 0.7) for n, p in net.named_parameters()}
    g = _grad(algo.dyn_loss, net, xb, yb, {"anchor": anchor, "grad": gk})
    g_ce = _grad(lambda m, x, y, a: F.cross_entropy(m(x), y), net, xb, yb, {})
    for n, p in net.named_parameters():
        torch.testing.assert_close(g[n], g_ce[n] - 0.7 + 0.3 * 0.2)
    value = algo.dyn_loss(ModelView(net), xb, yb, {"anchor": anchor, "grad": gk})
    n_par = sum(p.numel() for p in net.parameters())
    want = F.cross_entropy(net(xb), yb) - 0.7 * 0.2 * n_par + 0.15 * 0.04 * n_par
    assert value.item() == pytest.approx(want.item(), rel=1e-6)


def test_feddyn_client_state_and_server_hand_computed():
    """m = 4 clients, alpha = 0.5, theta^0 = 0, h^0 = 0; clients 0, 1 return [1, 2], [3, 0]:
    grad L_k = -alpha (theta_k - theta^0); h^1 = -alpha/4 [4, 2] = [-0.5, -0.25];
    theta^1 = mean [2, 1] - h^1 / alpha = [3, 1.5]. Buffers: plain mean."""
    ctx = _stub(n_clients=4)
    algo = FedDyn(ctx, alpha=0.5)
    server = algo.server_init()
    stats = SimpleNamespace(loss=0.0, samples=5, steps=1)
    up0, c0 = algo.finish(1, 0, server, None, _st([1.0, 2.0], (1.0, 1.0)), stats)
    up1, c1 = algo.finish(1, 1, server, None, _st([3.0, 0.0], (3.0, 3.0)), stats)
    assert set(c0) == {"grad"} and set(c0["grad"]) == {"w"}
    assert torch.allclose(c0["grad"]["w"], torch.tensor([-0.5, -1.0]))
    out = algo.aggregate(1, server, [up0, up1], {0: c0, 1: c1})
    assert torch.allclose(out["h"]["w"], torch.tensor([-0.5, -0.25]))
    assert torch.allclose(out["params"]["w"], torch.tensor([3.0, 1.5]))
    assert torch.allclose(out["params"]["rm"], torch.tensor([2.0, 2.0]))
    # round 2, client 0 alone returns [3, 3]: grad = [-0.5, -1] - 0.5 ([3, 3] - [3, 1.5]) = [-0.5, -1.75];
    # h^2 = h^1 - 0.5/4 [0, 1.5] = [-0.5, -0.4375]; theta^2 = [3, 3] + 2 [0.5, 0.4375] = [4, 3.875]
    up, c0b = algo.finish(2, 0, out, c0, _st([3.0, 3.0]), stats)
    assert torch.allclose(c0b["grad"]["w"], torch.tensor([-0.5, -1.75]))
    out2 = algo.aggregate(2, out, [up], {})
    assert torch.allclose(out2["h"]["w"], torch.tensor([-0.5, -0.4375]))
    assert torch.allclose(out2["params"]["w"], torch.tensor([4.0, 3.875]))


# ---------------------------------------------------------------- SCAFFOLD
def test_scaffold_corrected_gradient():
    """d/dy [CE(y) + <c - c_k, y - x>] = g(y) + c - c_k: Algorithm 1's corrected step."""
    algo = Scaffold(_stub())
    net, xb, yb = _net2()
    corr = {n: torch.linspace(-1, 1, p.numel()).reshape(p.shape) for n, p in net.named_parameters()}
    anchor = {n: p.detach().clone() for n, p in net.named_parameters()}
    g = _grad(algo.corrected, net, xb, yb, {"anchor": anchor, "corr": corr})
    g_ce = _grad(lambda m, x, y, a: F.cross_entropy(m(x), y), net, xb, yb, {})
    for n in g:
        torch.testing.assert_close(g[n], g_ce[n] + corr[n])
    assert algo.corrected(ModelView(net), xb, yb, {"anchor": anchor, "corr": corr}).item() == \
        pytest.approx(F.cross_entropy(net(xb), yb).item())           # y = x: the linear term is 0


def test_scaffold_option_ii_and_server_hand_computed():
    """x = [1, 1], y_k = [0.5, 2], K = 5 steps, lr = 0.1: (x - y)/(K lr) = [1, -2];
    c = [0.2, 0], c_k = [0.1, 0.3] -> c_k+ = c_k - c + [1, -2] = [0.9, -1.7], Delta c = [0.8, -2].
    Server (N = 4): x + mean(Delta y), c + (1/N) sum(Delta c)."""
    ctx = _stub(n_clients=4, lr=0.1, momentum=0.5)
    algo = Scaffold(ctx)
    server = algo.server_init()
    server["params"], server["c"] = _st([1.0, 1.0]), {"w": torch.tensor([0.2, 0.0])}
    ck = {"c": {"w": torch.tensor([0.1, 0.3])}}
    stats = SimpleNamespace(loss=0.0, samples=5, steps=5)
    up, new = algo.finish(1, 0, server, ck, _st([0.5, 2.0], (1.0, 1.0)), stats)
    assert torch.allclose(new["c"]["w"], torch.tensor([0.9, -1.7]))
    assert torch.allclose(up.payload["dc"]["w"], torch.tensor([0.8, -2.0]))
    model_bytes = state_bytes(server["params"])
    assert up.bytes_up == model_bytes + 8 and up.bytes_down == model_bytes + 8   # + c (2 floats) each way
    # 'effective': the step lr / (1 - momentum) = 0.2 -> (x - y) / (K * 0.2) = [0.5, -1]
    _, eff = Scaffold(ctx, cv_lr="effective").finish(1, 0, server, ck, _st([0.5, 2.0]), stats)
    assert torch.allclose(eff["c"]["w"], torch.tensor([0.4, -0.7]))
    # client 1 (c_k = 0), y = [2.5, 0]: c_k+ = -c + [-3, 2] = [-3.2, 2] = Delta c
    up2, _ = algo.finish(1, 1, server, None, _st([2.5, 0.0], (3.0, 3.0)), stats)
    assert torch.allclose(up2.payload["dc"]["w"], torch.tensor([-3.2, 2.0]))
    out = algo.aggregate(1, server, [up, up2], {})
    assert torch.allclose(out["params"]["w"], torch.tensor([1.5, 1.0]))               # mean of the y_k
    assert torch.allclose(out["params"]["rm"], torch.tensor([2.0, 2.0]))
    assert torch.allclose(out["c"]["w"], torch.tensor([0.2 + (0.8 - 3.2) / 4, 0.0 + (-2.0 + 2.0) / 4]))
    half = Scaffold(ctx, server_lr=0.5).aggregate(1, server, [up, up2], {})
    assert torch.allclose(half["params"]["w"], torch.tensor([1.25, 1.0]))             # x + 0.5 mean(Delta y)


@needs_fmnist
def test_scaffold_first_round_is_fedavg_and_c_k_is_the_mean_step():
    """c = c_k = 0: round 1 is FedAvg's local update, and option II's c_k = (x - y_k) / (K lr)."""
    ctx = _ctx(algorithm="scaffold", momentum=0.0, weight_decay=0.0)
    algo, fa = ALGORITHMS["scaffold"](ctx), ALGORITHMS["fedavg"](ctx)
    server = algo.server_init()
    up, st = algo.client_update(1, 2, server, None)
    up_fa, _ = fa.client_update(1, 2, server, None)
    y, x = up.payload["y"], server["params"]
    assert all(torch.equal(y[n], up_fa.payload[n]) for n in y)
    steps = -(-len(ctx.data.train[2]) // ctx.cfg.batch_size)
    for n, c in st["c"].items():
        torch.testing.assert_close(c, (x[n] - y[n]) / (steps * ctx.cfg.lr))
    assert up.bytes_up == state_bytes(x) + state_bytes(st["c"]) == 2 * state_bytes(x)   # no BN in this CNN
    server2 = algo.aggregate(1, server, [up], {2: st})
    up2, _ = algo.client_update(2, 3, server2, None)                 # c != 0 now corrects the steps
    up2_fa, _ = fa.client_update(2, 3, server2, None)
    assert any(not torch.equal(up2.payload["y"][n], up2_fa.payload[n]) for n in up2_fa.payload)


@needs_fmnist
def test_scaffold_resume_repeats_the_uninterrupted_run():
    """A checkpoint after round 2 (server x, c and every client's c_k: tensors only, loaded with
    weights_only=True) resumes to round 3 with exactly the uninterrupted run's metrics and state."""
    cfg = RunConfig.from_dict(small_cfg(algorithm="scaffold", subsample=0.02, n_clients=4, participation=0.5,
                                        rounds=3))
    saved = {}

    def keep(state):
        if state["round"] == 2:
            buf = io.BytesIO()
            torch.save(state, buf)
            saved["ckpt"] = buf.getvalue()

    ctx = build_context(cfg, torch.device("cpu"))
    full = run_rounds(ctx, ALGORITHMS["scaffold"](ctx), on_checkpoint=keep, progress=False)
    start = torch.load(io.BytesIO(saved["ckpt"]), weights_only=True)
    assert start["clients"] and all(set(c) == {"c"} for c in start["clients"].values())
    ctx2 = build_context(cfg, torch.device("cpu"))
    resumed = run_rounds(ctx2, ALGORITHMS["scaffold"](ctx2), start=start, progress=False)
    drop = lambda h: [{k: v for k, v in r.items() if k not in WALL_COLUMNS} for r in h]  # noqa: E731
    assert resumed.resumed_from == 2 and drop(resumed.history) == drop(full.history)
    for part in ("params", "c"):
        assert all(torch.equal(resumed.server[part][n], full.server[part][n]) for n in full.server[part])


# ---------------------------------------------------------------- learning on real Fashion-MNIST
@needs_fmnist
@pytest.mark.parametrize("algorithm, kw, metric, floor", [
    # 2 classes per client: a constant guess scores ~0.5 per client (PFL floors of test_algorithms.py)
    ("ditto", dict(partition="shards", partition_params={"s": 2}, subsample=0.1), "pm_acc_mean", 0.7),
    # IID, 10 classes, 3 short rounds on 5% of the data: chance is 0.10 (FedAvg reaches ~0.4 here)
    ("fedavgm", dict(), "gm_acc", 0.25),
    ("feddyn", dict(), "gm_acc", 0.25),
    ("scaffold", dict(momentum=0.0, lr=0.1), "gm_acc", 0.25),      # Algorithm 1's plain SGD step
])
def test_generic_baselines_learn(store, algorithm, kw, metric, floor):
    res = run(small_cfg(algorithm=algorithm, **kw), progress=False)
    assert res.metric(metric)[-1] > floor, res.metric(metric)
