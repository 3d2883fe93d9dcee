"""FedRep, FedBSD, FedRoD, FedBABU: which parameters move in each phase, what is uploaded, FedRoD's losses on
hand-computed cases, resume, and one short learning run each on real Fashion-MNIST."""
import io
import math

import pytest
import torch

from pflrepro.algorithms import ALGORITHMS
from pflrepro.algorithms.fedbsd import feature_kd
from pflrepro.algorithms.fedrod import RoD, bsm_loss, rod_losses
from pflrepro.core.aggregation import clone_state
from pflrepro.core.context import Then
from pflrepro.core.loop import run_rounds
from pflrepro.federation.build import build_context
from pflrepro.federation.config import RunConfig
from pflrepro.pipeline.store import WALL_COLUMNS, run
from tests.conftest import FMNIST_AVAILABLE, small_cfg

needs_fmnist = pytest.mark.skipif(not FMNIST_AVAILABLE, reason="needs offline Fashion-MNIST")
HEAD = {"head.weight", "head.bias"}     # cnn_cifar10's last linear layer


def _ctx(**kw):
    cfg = RunConfig.from_dict(small_cfg(**{"subsample": 0.02, "n_clients": 4, "rounds": 1, **kw}))
    return build_context(cfg, torch.device("cpu"))


def _same(a: dict, b: dict, names) -> bool:
    return all(torch.equal(a[n], b[n]) for n in names)


def _moved(a: dict, b: dict, names) -> bool:
    return all(not torch.equal(a[n], b[n]) for n in names)


def _resolve(ctx, out, k=0, rnd=1):
    """Train every further plan that `finish` answers (`Then`), client by client, as the engine does."""
    while isinstance(out, Then):
        net = ctx.model(k, out.plan.start)
        out = out.done(net.state_dict(), ctx.train_plan(net, k, rnd, out.plan))
    return out


# ---------------------------------------------------------------- FedRep
@needs_fmnist
def test_fedrep_trains_the_head_then_the_body_and_uploads_the_body():
    ctx = _ctx(algorithm="fedrep")
    algo = ALGORITHMS["fedrep"](ctx, head_epochs=1, body_epochs=1)
    server = algo.server_init()
    g = server["params"]
    body = [n for n in g if n not in HEAD]
    plan = algo.plan(1, 0, server, None)                  # phase 1: the head only
    assert plan.purpose == 0 and {n for n in g if plan.trainable(n)} == HEAD
    net = ctx.model(0, plan.start)
    stats = ctx.train_plan(net, 0, 1, plan)
    after_head = clone_state(net.state_dict())
    assert _same(after_head, g, body) and _moved(after_head, g, HEAD)
    then = algo.finish(1, 0, server, None, after_head, stats)   # phase 2: a second plan, the body only
    assert isinstance(then, Then)
    assert then.plan.purpose == 1 and {n for n in g if then.plan.trainable(n)} == set(body)  # own seed stream
    assert _same(then.plan.start, after_head, g)
    up, st = _resolve(ctx, then)
    assert set(up.payload) == set(body) and set(st["personal"]) == HEAD
    assert _moved(up.payload, g, body)
    assert _same(st["personal"], after_head, HEAD)        # the head did not move in the body phase
    assert up.samples == 2 * len(ctx.data.train[0])       # one head epoch + one body epoch
    new = algo.aggregate(1, server, [up], {0: st})
    assert _same(new["params"], g, HEAD)                  # heads never reach the server
    assert _same(algo.plan(2, 0, new, st).start, {**up.payload, **st["personal"]}, g)


# ---------------------------------------------------------------- FedBSD
def test_feature_kd_on_hand_computed_features():
    """softmax(t / T) = (0.75, 0.25), softmax(s / T) = (0.5, 0.5): KL = 0.75 ln 1.5 + 0.25 ln 0.5 = 0.1308120,
    times T^2; identical features give 0; features are flattened over every non-batch dimension."""
    ln3 = math.log(3.0)
    kl = 0.75 * math.log(1.5) + 0.25 * math.log(0.5)
    assert abs(kl - 0.1308120) < 1e-6
    s, t = torch.zeros(2, 2), torch.tensor([[ln3, 0.0], [ln3, 0.0]])
    assert torch.isclose(feature_kd(s, t, 1.0), torch.tensor(kl), atol=1e-6)
    assert torch.isclose(feature_kd(s, 2 * t, 2.0), torch.tensor(4 * kl), atol=1e-6)
    assert feature_kd(t, t, 3.0).abs() < 1e-6
    assert torch.isclose(feature_kd(s.view(2, 1, 2), t.view(2, 2, 1), 1.0), torch.tensor(kl), atol=1e-6)


@needs_fmnist
def test_fedbsd_phases_and_upload():
    """Head first (CE, head only), then the backbone only, uploading the backbone. With a = 0 the backbone phase
    is FedRep's to the bit; with a = 1 and the student starting at the teacher (the received backbone) every
    gradient is zero (up to float rounding), so the uploaded backbone is the received one; at a = 0.5 it moves,
    and differently from FedRep's."""
    ctx = _ctx(algorithm="fedbsd")
    server = ALGORITHMS["fedbsd"](ctx).server_init()
    g = server["params"]
    body = [n for n in g if n not in HEAD]

    def one(name, **hp):
        algo = ALGORITHMS[name](ctx, head_epochs=1, body_epochs=1, **hp)
        plan = algo.plan(1, 0, server, None)
        assert {n for n in g if plan.trainable(n)} == HEAD
        net = ctx.model(0, plan.start)
        stats = ctx.train_plan(net, 0, 1, plan)
        after_head = clone_state(net.state_dict())
        up, st = _resolve(ctx, algo.finish(1, 0, server, None, after_head, stats))
        assert set(up.payload) == set(body) and set(st["personal"]) == HEAD
        assert _same(st["personal"], after_head, HEAD)           # the head is still in the backbone phase
        return up.payload
    rep, a0, a1, half = one("fedrep"), one("fedbsd", a=0.0), one("fedbsd", a=1.0), one("fedbsd")
    assert _same(a0, rep, body)
    def gap(a, b):
        return max((a[n] - b[n]).abs().max().item() for n in body)
    assert gap(a1, g) < 1e-6 < 1e-3 < gap(half, g)
    assert gap(half, rep) > 1e-3


@needs_fmnist
def test_fedbsd_student_own_starts_from_the_clients_previous_backbone():
    ctx = _ctx(algorithm="fedbsd")
    algo = ALGORITHMS["fedbsd"](ctx, head_epochs=1, body_epochs=1, student="own")
    server = algo.server_init()
    up, st = algo.client_update(1, 0, server, None)
    assert _same(st["body"], up.payload, up.payload)
    moved = {n: t + 1.0 for n, t in server["params"].items()}        # a different global model next round
    start = algo.plan(2, 0, {"params": moved}, st).start
    assert _same(start, up.payload, up.payload) and _same(start, st["personal"], HEAD)
    assert ALGORITHMS["fedbsd"](ctx, head_epochs=1, body_epochs=1).hp["student"] == "own"   # Alg. 1, the default
    glob = ALGORITHMS["fedbsd"](ctx, head_epochs=1, body_epochs=1, student="global")
    assert _same(glob.plan(2, 0, {"params": moved}, st).start, moved, list(up.payload))


@needs_fmnist
def test_fedbsd_scores_the_clients_distilled_backbone_with_its_head():
    """What FedBSD scores (Alg. 1, `student: own`): after two rounds, each selected client's personalized model is,
    parameter for parameter, the backbone it distilled and uploaded in its last round plus its private head; a
    client never selected is the global backbone with its initial head. `student: global` (Sec. 3.2's replacement) scores
    the server's averaged backbone with the client's head (FedRep's scoring) instead."""
    ctx = _ctx(algorithm="fedbsd", rounds=2, participation=0.5)
    for student in ("own", "global"):
        algo = ALGORITHMS["fedbsd"](ctx, head_epochs=1, body_epochs=1, student=student)
        res = run_rounds(ctx, algo, progress=False)
        g = res.server["params"]
        body = [n for n in g if n not in HEAD]
        assert any(res.clients.values())
        for k in range(ctx.cfg.n_clients):
            c = res.clients.get(k)
            pm = algo.personal_model(k, res.server, c).state_dict()
            if not c:
                assert _same(pm, g, body) and _same(pm, ctx.initial(k), HEAD)
                continue
            assert _same(pm, c["personal"], HEAD)
            if student == "own":
                assert set(c["body"]) == set(body) and _same(pm, c["body"], body)
                assert not _same(pm, g, body)   # the distilled backbone, not the average
            else:
                assert "body" not in c and _same(pm, g, body)


# ---------------------------------------------------------------- FedBABU
@needs_fmnist
def test_fedbabu_head_stays_at_its_initialisation_and_only_the_body_travels():
    ctx = _ctx(algorithm="fedbabu", rounds=2, engine="batched")
    algo = ALGORITHMS["fedbabu"](ctx, ft_epochs=1)
    init = ctx.init_state
    body = [n for n in init if n not in HEAD]
    server = algo.server_init()
    up, st = algo.client_update(1, 0, server, None)
    assert st is None and set(up.payload) == set(body) and _moved(up.payload, init, body)
    res = run_rounds(ctx, algo, progress=False)          # two rounds, clients trained together
    g = res.server["params"]
    assert _same(g, init, HEAD) and _moved(g, init, body)
    before = clone_state(g)
    pm = clone_state(algo.personal_model(1, res.server, None).state_dict())   # whole-model fine-tuning
    assert _moved(pm, g, HEAD) and _moved(pm, g, ["body.conv1.weight"])
    assert _same(g, before, g)                           # fine-tuning never feeds back
    head_ft = ALGORITHMS["fedbabu"](ctx, ft_epochs=1, ft_part="head", gm="averaged_pm")
    pm_h = head_ft.personal_model(1, res.server, None).state_dict()
    assert _same(pm_h, g, body) and _moved(pm_h, g, HEAD)
    assert head_ft.global_model(res.server) is None and head_ft.averaged_personal_model(res.server, {}) is not None


# ---------------------------------------------------------------- FedRoD
def test_balanced_softmax_hand_computed():
    # prior (0.2, 0.8): CE on logits + log prior. Zero logits give the prior itself as the prediction.
    lp = torch.tensor([0.2, 0.8]).log()
    z = torch.zeros(2, 2)
    assert bsm_loss(z, torch.tensor([0, 1]), lp).item() == pytest.approx(-(math.log(0.2) + math.log(0.8)) / 2)
    p0 = 0.2 * math.e / (0.2 * math.e + 0.8)               # logits (1, 0), label 0
    assert bsm_loss(torch.tensor([[1.0, 0.0]]), torch.tensor([0]), lp).item() == pytest.approx(-math.log(p0))
    # a class the client never saw (prior 0) drops out of the softmax and gets no gradient
    z = torch.tensor([[0.0, 0.0, 100.0]], requires_grad=True)
    loss = bsm_loss(z, torch.tensor([0]), torch.tensor([0.5, 0.5, 0.0]).log())
    loss.backward()
    assert loss.item() == pytest.approx(math.log(2)) and z.grad[0, 2] == 0 and torch.isfinite(z.grad).all()


def test_fedrod_losses_reach_disjoint_parameters():
    torch.manual_seed(0)
    from pflrepro.data.models import build_model
    net, phead = build_model("cnn_cifar10", 1, 3, 28), torch.nn.Linear(84, 3)
    pair = RoD(net, phead)
    x, y = torch.randn(5, 1, 28, 28), torch.tensor([0, 1, 1, 0, 1])
    with torch.no_grad():   # the personalized prediction is the sum of both heads' logits
        assert torch.allclose(pair(x), net(x) + phead(net.features(x)))
    lp = torch.tensor([0.4, 0.6, 0.0]).log()
    l_g, l_p = rod_losses(pair, x, y, lp)
    l_p.backward(retain_graph=True)                       # personal CE: only the personal head
    assert all(p.grad is None for p in net.parameters()) and all(p.grad.abs().sum() > 0 for p in phead.parameters())
    pair.zero_grad(set_to_none=True)
    l_g.backward()                                        # BSM: body and generic head, never the personal head
    assert all(p.grad is None for p in phead.parameters())
    assert net.head.weight.grad.abs().sum() > 0 and net.body.conv1.weight.grad.abs().sum() > 0
    with torch.no_grad():
        assert l_p.item() == pytest.approx(torch.nn.functional.cross_entropy(pair(x), y).item(), rel=1e-6)


@needs_fmnist
def test_fedrod_uploads_the_generic_model_and_pm_epochs_only_move_the_personal_head():
    ctx = _ctx(algorithm="fedrod")
    plain = ALGORITHMS["fedrod"](ctx)
    server = plain.server_init()
    up, st = plain.client_update(1, 0, server, None)
    assert set(up.payload) == set(server["params"]) and set(st["phead"]) == {"weight", "bias"}
    assert _moved(st["phead"], {"weight": ctx.init_state["head.weight"], "bias": ctx.init_state["head.bias"]},
                  ["weight", "bias"])                      # trained jointly from the common initial head
    more = ALGORITHMS["fedrod"](ctx, pm_epochs=1)
    up2, st2 = more.client_update(1, 0, server, None)
    assert _same(up2.payload, up.payload, up.payload)     # the PM epochs come after the upload
    assert _moved(st2["phead"], st["phead"], ["weight", "bias"])
    n = len(ctx.data.train[0])
    assert up2.overlap_samples == n and up2.samples == up.samples + n
    only = ALGORITHMS["fedrod"](ctx, joint=False)         # no PM epochs, no joint training: head stays
    _, st3 = only.client_update(1, 0, server, None)
    assert _same(st3["phead"], {"weight": ctx.init_state["head.weight"], "bias": ctx.init_state["head.bias"]},
                 ["weight", "bias"])


@needs_fmnist
def test_fedrod_resumed_run_equals_a_straight_run():
    """2 rounds, checkpoint through torch.save / load(weights_only=True), resumed to 3 == 3 straight."""
    kw = dict(algorithm="fedrod", rounds=3, hparams={"pm_epochs": 1})
    saved = {}

    def keep(state):
        buf = io.BytesIO()
        torch.save(state, buf)
        saved[int(state["round"])] = buf.getvalue()

    ctx = _ctx(**kw)
    straight = run_rounds(ctx, ALGORITHMS["fedrod"](ctx, pm_epochs=1), on_checkpoint=keep, progress=False)
    start = torch.load(io.BytesIO(saved[2]), weights_only=True)
    ctx2 = _ctx(**kw)
    resumed = run_rounds(ctx2, ALGORITHMS["fedrod"](ctx2, pm_epochs=1), start=start, progress=False)
    assert resumed.resumed_from == 2
    drop = WALL_COLUMNS
    assert [{k: v for k, v in r.items() if k not in drop} for r in resumed.history] == \
           [{k: v for k, v in r.items() if k not in drop} for r in straight.history]
    assert _same(resumed.server["params"], straight.server["params"], straight.server["params"])
    for k, c in straight.clients.items():
        assert _same(resumed.clients[k]["phead"], c["phead"], c["phead"])


# ---------------------------------------------------------------- learning on real data
@needs_fmnist
@pytest.mark.parametrize("algorithm, hparams, extra", [
    ("fedrep", {"head_epochs": 1, "body_epochs": 1}, {}),
    ("fedbsd", {"head_epochs": 1, "body_epochs": 1}, {}),
    ("fedrod", {}, {}),
    ("fedbabu", {"ft_epochs": 1}, {"eval_every": 3}),   # fine-tuning every client is the costly part
])
def test_rep_baselines_learn_on_pathological_fmnist(store, algorithm, hparams, extra):
    """2 classes per client: a constant guess scores ~0.5 per client."""
    res = run(small_cfg(algorithm=algorithm, hparams=hparams, partition="shards", partition_params={"s": 2},
                        subsample=0.1, rounds=3, **extra), progress=False)
    assert res.metric("pm_acc_mean")[-1] > 0.7, res.metric("pm_acc_mean")


@needs_fmnist
@pytest.mark.parametrize("base, ft", [("fedprox", "fedprox_ft"),
                                      pytest.param("scaffold", "scaffold_ft", marks=pytest.mark.full)])   # 5 s each
def test_ft_variants_train_as_their_base_and_personalise_the_head_only(store, base, ft):
    """FedBSD's +FT rows: training (the GM's curve, the bytes) is the base algorithm's bit for bit; each PM is
    the GM with its head fine-tuned on the client's data, and it learns on 2-class clients (chance ~0.5)."""
    kw = dict(partition="shards", partition_params={"s": 2}, subsample=0.1, rounds=2, momentum=0.0)   # SCAFFOLD: plain SGD
    a = run(small_cfg(algorithm=base, **kw), progress=False)
    b = run(small_cfg(algorithm=ft, hparams={"ft_epochs": 2}, **kw), progress=False)
    keys = ("gm_acc", "bytes_up", "bytes_down")
    assert [{k: r[k] for k in keys} for r in a.history] == [{k: r[k] for k in keys} for r in b.history]
    assert b.metric("pm_acc_mean")[-1] > 0.7 > a.metric("pm_acc_mean")[-1] + 0.1, (a.metric("pm_acc_mean"),
                                                                                  b.metric("pm_acc_mean"))
    ctx = build_context(RunConfig.from_dict(small_cfg(algorithm=ft, hparams={"ft_epochs": 1}, **kw)), torch.device("cpu"))
    algo = ALGORITHMS[ft](ctx, ft_epochs=1)
    server = algo.server_init()
    pm = algo.personal_model(3, server, None).state_dict()
    changed = {n for n, t in pm.items() if not torch.equal(t, server["params"][n])}
    assert changed == {"head.weight", "head.bias"}
