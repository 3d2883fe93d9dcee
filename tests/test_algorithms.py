"""Loss/update math of the algorithms on hand-computed cases, and short learning runs."""
import math
import warnings

import pytest
import torch

from pflrepro.algorithms import ALGORITHMS
from pflrepro.algorithms.pfedsd import kd_kl
from pflrepro.core.training import ModelView
from pflrepro.federation.build import build_context
from pflrepro.federation.config import RunConfig
from pflrepro.pipeline.store import run
from tests.conftest import FMNIST_AVAILABLE, small_cfg


def test_kd_kl_hand_computed():
    # teacher p = softmax([0, ln 3]) = [1/4, 3/4]; student q = [1/2, 1/2]; tau = 1
    t = torch.tensor([[0.0, math.log(3.0)]])
    s = torch.tensor([[0.0, 0.0]])
    want = 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)
    assert kd_kl(s, t, 1.0).item() == pytest.approx(want, rel=1e-6)
    # tau = 2: logits scaled by 1/2, multiplied by tau^2 = 4; batchmean over 2 identical rows
    p = torch.softmax(t / 2, 1)[0]
    want2 = 4 * float((p * (p.log() - math.log(0.5))).sum())
    assert kd_kl(s.repeat(2, 1), t.repeat(2, 1), 2.0).item() == pytest.approx(want2, rel=1e-5)
    assert kd_kl(t, t, 3.0).item() == pytest.approx(0.0, abs=1e-6)


def test_kd_kl_is_torch_kl_div_bit_for_bit_and_under_vmap():
    """kd_kl spells out F.kl_div(..., reduction="batchmean") (vmap has no batching rule for kl_div): the same value
    and gradient bits, per client and under vmap (whose fallback for kl_div runs the clients one by one)."""
    import torch.nn.functional as F

    def torch_kd(s, t, tau):
        return tau * tau * F.kl_div(F.log_softmax(s / tau, 1), F.softmax(t / tau, 1), reduction="batchmean")

    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(5, 16, 10, generator=g, requires_grad=True), torch.randn(5, 16, 10, generator=g)
    t[0, 0] = -1e4                     # a teacher probability of exactly 0 (0 log 0 = 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")      # "performance drop ... batching rule for aten::kl_div"
        want = torch.func.vmap(lambda a, b: torch_kd(a, b, 3.0))(s, t)
    got = torch.func.vmap(lambda a, b: kd_kl(a, b, 3.0))(s, t)
    assert torch.equal(got, want)
    assert torch.equal(torch.autograd.grad(got.sum(), s)[0], torch.autograd.grad(want.sum(), s)[0])
    assert torch.equal(kd_kl(s[1], t[1], 1.0), torch_kd(s[1], t[1], 1.0))
    assert not torch.equal(kd_kl(s[1], t[2], 1.0), torch_kd(s[1], t[1], 1.0))


def _ctx(**kw):
    cfg = RunConfig.from_dict(small_cfg(subsample=0.02, n_clients=4, rounds=1, **kw))
    return build_context(cfg, torch.device("cpu"))


needs_fmnist = pytest.mark.skipif(not FMNIST_AVAILABLE, reason="needs offline Fashion-MNIST")


@needs_fmnist
def test_pfedsd_first_round_is_plain_ce_and_stores_vk():
    ctx = _ctx(algorithm="pfedsd")
    sd = ALGORITHMS["pfedsd"](ctx, **ctx.cfg.hparams)
    fa = ALGORITHMS["fedavg"](ctx)
    server = fa.server_init()
    up_sd, st = sd.client_update(1, 0, server, None)
    up_fa, _ = fa.client_update(1, 0, server, None)
    assert all(torch.equal(up_sd.payload[n], up_fa.payload[n]) for n in up_fa.payload)  # same seed, CE only
    assert all(torch.equal(st["params"][n], up_sd.payload[n]) for n in st["params"])     # v_k = trained w_k
    # second participation: the KD term changes the update
    up2, _ = sd.client_update(2, 0, server, st)
    up2_fa, _ = fa.client_update(2, 0, server, None)
    assert any(not torch.equal(up2.payload[n], up2_fa.payload[n]) for n in up2.payload)


@needs_fmnist
def test_pfedsd_stored_teacher_gives_the_recomputed_loss_in_eval_mode():
    """Sec. 3.2's two ways of getting v_k's predictions give the same eq.-3 loss on a batch
    (whole trajectories differ only by float rounding: conv kernels depend on batch size)."""
    ctx = _ctx(algorithm="pfedsd")
    a = ALGORITHMS["pfedsd"](ctx, lam=0.5, tau=3.0, teacher="recompute", teacher_mode="eval", reg="kl")
    server = a.server_init()
    _, st = a.client_update(1, 1, server, None)
    teacher = a.teacher(1, st["params"])
    x, y = ctx.data.client_train(1)
    with torch.no_grad():
        table = teacher(x)
    net = ctx.model(1, server["params"]).eval()
    idx = torch.arange(5, 37)
    m = ModelView(net)
    recomputed = a.kd_loss(m, x[idx], y[idx], {"teacher": st["params"]})
    stored = a.kd_loss(m, x[idx], y[idx], {"t_logits": table[idx]})
    assert stored.item() == pytest.approx(recomputed.item(), rel=1e-5)
    assert recomputed.item() > torch.nn.functional.cross_entropy(net(x[idx]), y[idx]).item()  # KD term > 0


@needs_fmnist
@pytest.mark.full   # pFedSD learns in `make test` (test_pfl_methods_learn_on_pathological_fmnist); the stored
# teacher's loss equals the recomputed one there too (test_pfedsd_stored_teacher_gives_the_recomputed_loss_in_eval_mode)
def test_pfedsd_stored_teacher_learns(store):
    res = run(small_cfg(algorithm="pfedsd", hparams={"teacher": "stored"}, partition="shards",
                        partition_params={"s": 2}, subsample=0.1, rounds=3), progress=False)
    assert res.metric("pm_acc_mean")[-1] > 0.7, res.metric("pm_acc_mean")


@needs_fmnist
def test_plain_mean_aggregation_for_pfedsd():
    ctx = _ctx(algorithm="pfedsd")
    sd = ALGORITHMS["pfedsd"](ctx, **ctx.cfg.hparams)
    from pflrepro.algorithms.base import Update
    w = {"w": torch.tensor([1.0])}, {"w": torch.tensor([4.0])}
    server = {"params": {"w": torch.tensor([0.0])}}
    out = sd.aggregate(1, server, [Update(weight=1.0, payload=w[0]), Update(weight=100.0, payload=w[1])], {})
    assert out["params"]["w"].item() == 2.5  # Algorithm 1 line 9: plain mean, sizes ignored


@needs_fmnist
@pytest.mark.parametrize("name, shared_head", [("fedper", False), ("lg_fedavg", True)])
def test_partial_sharing_uploads_only_the_shared_part(name, shared_head):
    ctx = _ctx(algorithm=name)
    algo = ALGORITHMS[name](ctx, head_layers=2)
    server = algo.server_init()
    up, st = algo.client_update(1, 0, server, None)
    head = {"body.fc2.weight", "body.fc2.bias", "head.weight", "head.bias"}  # cnn_cifar10: last two layers
    head = {n for n in head if n in server["params"]}
    assert head and set(up.payload).isdisjoint(set(st["personal"]))
    assert (head <= set(up.payload)) == shared_head
    assert (head <= set(st["personal"])) == (not shared_head)
    assert up.bytes_up < sum(t.numel() * 4 for t in server["params"].values())
    new = algo.aggregate(1, server, [up], {0: st})
    pm = algo.personal_model(0, new, st).state_dict()
    for n in st["personal"]:  # the personal part survives aggregation untouched
        assert torch.equal(pm[n], st["personal"][n])


@needs_fmnist
@pytest.mark.parametrize("algorithm, rounds, floor", [("pfedsd", 3, 0.7), ("fedper", 3, 0.7), ("lg_fedavg", 6, 0.6)])
def test_pfl_methods_learn_on_pathological_fmnist(store, algorithm, rounds, floor):
    """2 classes per client: a constant guess scores ~0.5 per client, so floors sit above that."""
    res = run(small_cfg(algorithm=algorithm, partition="shards", partition_params={"s": 2}, subsample=0.1,
                        rounds=rounds), progress=False)
    assert res.metric("pm_acc_mean")[-1] > floor, res.metric("pm_acc_mean")


def test_diag_fisher_matches_a_per_sample_loop():
    from pflrepro.algorithms.pfedsd import diag_fisher
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    x, y = torch.randn(7, 3), torch.randint(0, 2, (7,))
    want = {n: torch.zeros_like(p) for n, p in net.named_parameters()}
    for i in range(7):
        net.zero_grad()
        torch.nn.functional.cross_entropy(net(x[i:i + 1]), y[i:i + 1]).backward()
        for n, p in net.named_parameters():
            want[n] += p.grad ** 2 / 7
    got = diag_fisher(net, x, y, batch=3)
    for n in want:
        assert torch.allclose(got[n], want[n], atol=1e-6), n


@needs_fmnist
@pytest.mark.parametrize("reg", ["mse", "l2", "ewc"])
def test_table9_regularisers_change_the_update(reg):
    ctx = _ctx(algorithm="pfedsd")
    base = ALGORITHMS["pfedsd"](ctx, lam=0.5, tau=3.0, teacher="recompute", teacher_mode="eval", reg="kl")
    var = ALGORITHMS["pfedsd"](ctx, lam=0.5, tau=3.0, teacher="recompute", teacher_mode="eval", reg=reg)
    server = base.server_init()
    _, st = base.client_update(1, 2, server, None)
    u_kl, _ = base.client_update(2, 2, server, st)
    u_var, st2 = var.client_update(2, 2, server, st)
    assert any(not torch.equal(u_kl.payload[n], u_var.payload[n]) for n in u_kl.payload)


@needs_fmnist
# `make test` trains one regulariser (3-4 s each on a fast machine); test_table9_regularisers_change_the_update
# checks each one's update in `make test` too
@pytest.mark.parametrize("reg, lam", [pytest.param("mse", 0.01, marks=pytest.mark.full),
                                      pytest.param("mse_prob", 0.5, marks=pytest.mark.full), ("l2", 0.1),
                                      pytest.param("ewc", 0.1, marks=pytest.mark.full)])
def test_table9_variants_learn(store, reg, lam):
    """MSE on raw logits is ~10x the KL term's scale here (teacher logits std ~5): smaller lambda."""
    res = run(small_cfg(algorithm="pfedsd", hparams={"reg": reg, "lam": lam}, partition="shards",
                        partition_params={"s": 2}, lr=0.02,
                        subsample=0.1, rounds=3), progress=False)
    assert res.metric("pm_acc_mean")[-1] > 0.7, res.metric("pm_acc_mean")


def test_l2_regulariser_hand_computed():
    """lambda/2 * ||w - v||^2 on a one-weight model: w=3, v=1, lambda=0.5 -> 0.25 * 4 = 1."""
    from pflrepro.algorithms.pfedsd import PFedSD
    algo = PFedSD.__new__(PFedSD)
    algo.hp = {"lam": 0.5, "reg": "l2"}
    algo.ctx = None
    net = torch.nn.Linear(1, 2, bias=False)
    with torch.no_grad():
        net.weight.copy_(torch.tensor([[3.0], [1.0]]))
    v = {"weight": torch.tensor([[1.0], [1.0]])}
    x, y = torch.zeros(1, 1), torch.tensor([0])
    ce = torch.nn.functional.cross_entropy(net(x), y)  # logits are 0: ln 2
    assert (algo.param_loss(ModelView(net), x, y, {"anchor": v}) - ce).item() == pytest.approx(1.0)
