"""FedALA (Zhang et al., AAAI 2023) and the engine hooks it is the worked example of (`Plan.rows`, `Plan.shuffle`,
`Plan.update`): the ALA step by hand, one ALA pass against a loop written from the authors' ALA.py, per client and
batched, the stopping rule, the slice, the layer split, the skip, and learning on offline data."""
from __future__ import annotations

import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pflrepro.algorithms.fedala import FedALA, converged, slice_rows
from pflrepro.core.engines import local_train_many
from pflrepro.core.loop import run_rounds
from pflrepro.core.training import local_train
from pflrepro.federation.build import build_context
from pflrepro.federation.config import RunConfig
from pflrepro.pipeline.store import run
from tests.conftest import FMNIST_AVAILABLE, small_cfg

needs_fmnist = pytest.mark.skipif(not FMNIST_AVAILABLE, reason="needs offline Fashion-MNIST")


def _algo(**hp):
    """FedALA's step without a run: only its hyperparameters are read."""
    return types.SimpleNamespace(hp={"eta": 1.0, **hp})


def test_ala_step_by_hand():
    """Eq. 5, projected: W <- clip(W - eta * g * (theta_g - theta_l), 0, 1); theta = theta_l + (theta_g - theta_l) W."""
    W = {"w": torch.tensor([1.0, 0.5, 0.2, 0.0])}
    g = {"w": torch.tensor([2.0, -1.0, 0.5, 4.0])}
    local = {"w": torch.tensor([1.0, 2.0, 3.0, 4.0])}
    diff = {"w": torch.tensor([0.3, 0.4, -2.0, 1.0])}
    params, W2 = FedALA.ala_step(_algo(eta=0.5), {"w": torch.zeros(4)}, g, W, {"local": local, "diff": diff})
    # W - 0.5 g d = [1 - 0.3, 0.5 + 0.2, 0.2 + 0.5, 0 - 2] -> clip: [0.7, 0.7, 0.7, 0.0]
    torch.testing.assert_close(W2["w"], torch.tensor([0.7, 0.7, 0.7, 0.0]))
    torch.testing.assert_close(params["w"], torch.tensor([1.0 + 0.21, 2.0 + 0.28, 3.0 - 1.4, 4.0]))
    assert torch.equal(W["w"], torch.tensor([1.0, 0.5, 0.2, 0.0]))      # inputs untouched (the step is pure)


def _authors_pass(net, local, glob, W, x, y, batch, eta):
    """One ALA pass as ALA.py computes it (written from the code, not from ours): the higher tensors of a temp model
    set to local + (global - local) * W, then batch by batch in row order: CE, backward, W clipped, temp refreshed.
    Returns the temp model's tensors, W and the last batch's loss."""
    W = {n: t.clone() for n, t in W.items()}
    t = {n: (local[n] + (glob[n] - local[n]) * W[n]).clone().requires_grad_(True) for n in W}
    loss = None
    for s in range(0, len(y), batch):
        out = torch.func.functional_call(net, t, (x[s:s + batch],))
        loss = F.cross_entropy(out, y[s:s + batch])
        grads = torch.autograd.grad(loss, list(t.values()))
        for (n, p), g in zip(t.items(), grads):
            W[n] = torch.clamp(W[n] - eta * (g * (glob[n] - local[n])), 0, 1)
        t = {n: (local[n] + (glob[n] - local[n]) * W[n]).detach().requires_grad_(True) for n in W}
    return {n: p.detach() for n, p in t.items()}, W, loss.item()


def _setup(seed):
    g = torch.Generator().manual_seed(seed)
    net = nn.Linear(5, 3)
    local = {n: torch.randn(p.shape, generator=g) for n, p in net.named_parameters()}
    glob = {n: torch.randn(p.shape, generator=g) for n, p in net.named_parameters()}
    W = {n: torch.rand(p.shape, generator=g) for n, p in net.named_parameters()}
    x, y = torch.randn(11, 5, generator=g), torch.randint(0, 3, (11,), generator=g)
    return net, local, glob, W, x, y


def test_one_ala_pass_equals_the_authors_loop_per_client_and_batched():
    """The engines' custom step (`update`), in row order (`shuffle=False`), per client (`local_train`) and for two
    clients at once (`local_train_many`, the step `vmap`ped), against the loop above."""
    eta, B = 0.7, 4
    cases = [_setup(0), _setup(1)]
    want = [_authors_pass(net, local, glob, W, x, y, B, eta) for net, local, glob, W, x, y in cases]
    algo = _algo(eta=eta)
    step = lambda p, g, s, a: FedALA.ala_step(algo, p, g, s, a)          # noqa: E731
    starts, auxes = [], []
    for (net, local, glob, W, x, y), (theta, W_want, last) in zip(cases, want):
        aux = {"local": local, "diff": {n: glob[n] - local[n] for n in local}}
        start = {n: local[n] + aux["diff"][n] * W[n] for n in local}
        net.load_state_dict(start)
        stats = local_train(net, x, y, epochs=1, batch_size=B, lr=0.0, seed=3, shuffle=False, update=step,
                            update_state=W, aux=aux)
        for n in theta:
            torch.testing.assert_close(net.state_dict()[n], theta[n], atol=1e-6, rtol=0)
            torch.testing.assert_close(stats.update_state[n], W_want[n], atol=1e-6, rtol=0)
        assert stats.steps == 3 and stats.samples == 11 and stats.last == pytest.approx(last, abs=1e-6)
        starts.append(start)
        auxes.append(aux)
    x = torch.cat([c[4] for c in cases])
    y = torch.cat([c[5] for c in cases])
    out = local_train_many(cases[0][0], starts, x, y, [torch.arange(0, 11), torch.arange(11, 22)], epochs=1,
                           batch_size=B, lr=0.0, seeds=[3, 4], shuffle=False, update=step,
                           update_state=[c[3] for c in cases], aux=auxes)
    for (state, stats), (theta, W_want, last) in zip(out, want):
        for n in theta:
            torch.testing.assert_close(state[n], theta[n], atol=1e-6, rtol=0)
            torch.testing.assert_close(stats.update_state[n], W_want[n], atol=1e-6, rtol=0)
        assert stats.last == pytest.approx(last, abs=1e-6)


def test_a_projected_step_keeps_every_client_in_its_box_batched_as_alone():
    """A custom step that is a projection (SGD, then clip to [-0.05, 0.05]): batched equals per client, and every
    weight ends inside the box; momentum and weight decay do not apply to a custom step."""
    def box(p, g, s, a):
        return {n: torch.clamp(p[n] - 0.5 * g[n], -0.05, 0.05) for n in p}, s
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
    starts = [{n: t.clone() for n, t in net.state_dict().items()} for _ in range(3)]
    x, y = torch.randn(30, 5), torch.randint(0, 3, (30,))
    index = [torch.arange(0, 7), torch.arange(7, 19), torch.arange(19, 30)]
    out = local_train_many(net, starts, x, y, index, epochs=2, batch_size=4, lr=9.9, momentum=0.9, weight_decay=1.0,
                           seeds=[1, 2, 3], update=box, update_state=[{}, {}, {}])
    for i, (state, stats) in enumerate(out):
        alone = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
        alone.load_state_dict(starts[i])
        st = local_train(alone, x[index[i]], y[index[i]], epochs=2, batch_size=4, lr=9.9, momentum=0.9,
                         weight_decay=1.0, seed=[1, 2, 3][i], update=box, update_state={})
        for n, t in alone.state_dict().items():
            torch.testing.assert_close(state[n], t, atol=1e-6, rtol=0)
            assert t.abs().max() <= 0.05 + 1e-7
        assert stats.steps == st.steps and stats.update_state == {} == st.update_state


def test_rows_in_order_every_epoch():
    """`shuffle=False`: every epoch reads the rows in order (a `DataLoader` without shuffling), so two epochs from the
    same start at lr 0 see the same batches: the last step's loss is the last batch's, whatever the seed."""
    torch.manual_seed(0)
    net = nn.Linear(5, 3)
    x, y = torch.randn(10, 5), torch.randint(0, 3, (10,))
    a = local_train(net, x, y, epochs=2, batch_size=4, lr=0.0, seed=1, shuffle=False)
    b = local_train(net, x, y, epochs=1, batch_size=4, lr=0.0, seed=7, shuffle=False)
    assert a.last == b.last == pytest.approx(F.cross_entropy(net(x[8:]), y[8:]).item())


def test_the_first_alas_stopping_rule():
    """ALA.py: stop once len(losses) > num_pre_loss and np.std(losses[-num_pre_loss:]) < threshold."""
    assert not converged([1.0] * 10, 10, 0.1)              # needs more than num_pre_loss passes
    assert converged([1.0] * 11, 10, 0.1)
    losses = [5.0] + [1.0, 1.5] * 5                           # last 10: population std exactly 0.25
    assert np.std(losses[-10:]) == 0.25 and np.std(losses[-10:], ddof=1) > 0.26
    assert not converged(losses, 10, 0.25) and converged(losses, 10, 0.2501)
    assert converged([3.0, 2.0, 2.0], 1, 1e-9)


def test_the_slice_is_consecutive_rows_at_a_random_start():
    for n, pct in [(10, 80), (11, 80), (7, 100), (200, 1), (3, 20)]:
        for seed in range(20):
            r = slice_rows(n, pct, seed)
            m = int(pct / 100 * n)
            assert len(r) == m and (m == 0 or (r[0] >= 0 and r[-1] < n and torch.equal(r, torch.arange(r[0], r[0] + m))))
    starts = {int(slice_rows(10, 80, s)[0]) for s in range(60)}
    assert starts == {0, 1, 2}                                # randint(0, n - m) includes both ends


@needs_fmnist
def test_layers_split_by_parameter_tensors_from_the_end_and_round_one_skips_ala():
    cfg = RunConfig.from_dict(small_cfg(algorithm="fedala", n_clients=3, model="cnn_fmnist"))
    ctx = build_context(cfg, torch.device("cpu"))
    names = [n for n, _ in ctx.model(-1).named_parameters()]
    algo = FedALA(ctx)
    assert algo.layers() == (names[:-2], names[-2:]) and len(names[-2:]) == 2 and names[-1].endswith("bias")
    assert FedALA(ctx, layer_idx=0).layers() == ([], names)
    server = algo.server_init()
    plan = algo.plan(1, 0, server, None)             # every client holds the initial weights: ALA skipped
    assert plan.update is None and plan.rows is None and plan.start is ctx.initial(0)
    moved = {n: t + 0.01 for n, t in server["params"].items()}
    plan = algo.plan(2, 0, {"params": moved}, None)  # a new global model: ALA on an 80 % slice, higher tensors only
    lower, higher = algo.layers()
    assert plan.update is not None and not plan.shuffle and len(plan.rows) == int(0.8 * len(ctx.data.train[0]))
    assert {n for n in names if plan.trainable(n)} == set(higher)
    for n in lower:
        assert torch.equal(plan.start[n], moved[n])
    for n in higher:                                  # W = 1 before the first ALA: theta = theta_g
        torch.testing.assert_close(plan.start[n], moved[n])


@needs_fmnist
def test_fedala_learns(store):
    """Pathological Fashion-MNIST (2 classes a client: a constant guess scores about 0.5)."""
    res = run(small_cfg(algorithm="fedala", partition="shards", partition_params={"s": 2}, subsample=0.1, rounds=3,
                        momentum=0.0), progress=False)
    assert res.metric("pm_acc_mean")[-1] > 0.7, res.metric("pm_acc_mean")


@needs_fmnist
def test_every_client_keeps_its_trained_model_and_weights_in_the_unit_box():
    cfg = RunConfig.from_dict(small_cfg(algorithm="fedala", n_clients=4, rounds=3, hparams={"num_pre_loss": 2}))
    ctx = build_context(cfg, torch.device("cpu"))
    algo = FedALA(ctx, **cfg.hparams)
    out = run_rounds(ctx, algo, progress=False)
    _, higher = algo.layers()
    assert len(out.clients) == 4
    for c in out.clients.values():
        assert set(c["W"]) == set(higher) and set(c["params"]) == set(ctx.init_state)
        for w in c["W"].values():
            assert 0 <= w.min() and w.max() <= 1 and (w < 1).any()      # learned, projected


def test_a_custom_step_reads_aux_shared_by_every_client():
    """Clients whose aux tensors are the very same objects (two never-trained clients: theta_l is the initial model)
    get them unbatched inside the step's `vmap`; the result equals each client alone."""
    torch.manual_seed(0)
    net = nn.Linear(5, 3)
    local = {n: torch.randn(p.shape) for n, p in net.named_parameters()}
    aux = {"local": local, "diff": {n: torch.randn(t.shape) for n, t in local.items()}}
    algo = _algo()
    step = lambda p, g, s, a: FedALA.ala_step(algo, p, g, s, a)          # noqa: E731
    W = [{n: torch.ones_like(t) for n, t in local.items()} for _ in range(2)]
    start = {n: local[n] + aux["diff"][n] for n in local}
    x, y = torch.randn(20, 5), torch.randint(0, 3, (20,))
    index = [torch.arange(0, 9), torch.arange(9, 20)]
    out = local_train_many(net, [start, start], x, y, index, epochs=2, batch_size=4, lr=0.0, seeds=[1, 2],
                           shuffle=False, update=step, update_state=W, aux=[aux, aux])
    for i, (state, stats) in enumerate(out):
        alone = nn.Linear(5, 3)
        alone.load_state_dict(start)
        st = local_train(alone, x[index[i]], y[index[i]], epochs=2, batch_size=4, lr=0.0, seed=i + 1, shuffle=False,
                         update=step, update_state=W[i], aux=aux)
        for n, t in alone.state_dict().items():
            assert torch.equal(state[n], t) and torch.equal(stats.update_state[n], st.update_state[n])
        assert not torch.equal(stats.update_state["weight"], W[i]["weight"])       # W moved
