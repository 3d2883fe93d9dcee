"""`core.engines.grouped`: convolution and max-pooling of many clients as one channels-last kernel under `vmap`.

Hand-checkable reference: the same per-client gradients `vmap(grad_and_value(loss))` gives through the plain
layers, for every geometry the two layers take (stride, padding, dilation, groups, no bias, ceil mode), for
weights stacked per client and weights shared by all clients (a frozen layer), and with the input's gradient asked
for or not; the twin differentiated as the batched engine does (ordinary autograd over `vmap`, where its layers
step out of `vmap`) and under `torch.func.grad` (where they must not). The batched engine's results through it are
checked against the per-client path in tests/test_batched.py (every test there runs with the grouped kernels forced
and switched off); here, that the engine uses it exactly where `pays` says."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from pflrepro.core.engines import grouped
from pflrepro.core.engines.many import local_train_many, losses_and_grads
from pflrepro.data.models import cnn_cifar10

C, B = 3, 5


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _net(**kw) -> nn.Module:
    torch.manual_seed(0)
    conv = dict(dict(stride=1, padding=0, dilation=1, groups=1, bias=True), **kw.get("conv", {}))
    pool = dict(dict(kernel_size=2, stride=2, padding=0, ceil_mode=False), **kw.get("pool", {}))
    return nn.Sequential(nn.Conv2d(4, 6, 3, **conv), nn.ReLU(), nn.MaxPool2d(**pool),
                         nn.Conv2d(6, 4, 2), nn.ReLU(), nn.Flatten(), nn.LazyLinear(3))


def _stacked_params(net, x, frozen=()):
    net(x[0])                                  # materialise the lazy layer
    g = torch.Generator().manual_seed(1)
    return {n: (p.detach().clone() if n in frozen else
                p.detach() + 0.1 * torch.randn((C, *p.shape), generator=g))
            for n, p in net.named_parameters()}


def _grads(net, P, x, y, frozen=(), input_grad=False):
    """Per-client gradients (of the trainable parameters, and of the input if asked) and losses under vmap."""
    train = {n: t for n, t in P.items() if n not in frozen}
    fz = {n: t for n, t in P.items() if n in frozen}

    def loss(tp, xb, yb):
        return F.cross_entropy(functional_call(net, {**tp, **fz}, (xb,)), yb)

    if input_grad:
        return vmap(grad_and_value(loss, argnums=(0, 1)))(train, x, y)
    return vmap(grad_and_value(loss))(train, x, y)


def _engine_grads(net, P, x, y, frozen=(), input_grad=False):
    """The same, as `batched._Gradients` computes them: ordinary autograd over the `vmap`ped losses."""
    train = {n: t for n, t in P.items() if n not in frozen}
    fz = {n: t for n, t in P.items() if n in frozen}
    x = x.detach().requires_grad_(input_grad)
    losses = vmap(lambda tp, xb, yb: F.cross_entropy(functional_call(net, {**tp, **fz}, (xb,)), yb))
    gp, gx, v = losses_and_grads(losses, train, x, y, extra=(x,) if input_grad else ())
    return ((gp, gx[0]) if input_grad else gp), v


GEOMETRIES = {
    "plain": {},
    "stride 2, padding 1": {"conv": {"stride": 2, "padding": 1}},
    "dilation 2, no bias": {"conv": {"dilation": 2, "bias": False}},
    "groups 2": {"conv": {"groups": 2}},
    "pool 3/2, padding 1, ceil": {"pool": {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True}},
}


@pytest.mark.parametrize("geometry", list(GEOMETRIES))
@pytest.mark.parametrize("frozen", [False, True])
def test_twin_gives_the_plain_layers_gradients_under_vmap(geometry, frozen):
    net = _net(**GEOMETRIES[geometry])
    x = torch.randn(C, B, 4, 13, 13, generator=torch.Generator().manual_seed(2))
    y = torch.randint(0, 3, (C, B), generator=torch.Generator().manual_seed(3))
    fz = ("0.weight", "0.bias") if frozen else ()
    P = _stacked_params(net, x, fz)
    tw = grouped.twin(net)
    assert type(tw[0]) is grouped.GroupedConv2d and type(tw[2]) is grouped.GroupedMaxPool2d
    assert type(net[0]) is nn.Conv2d and type(net[2]) is nn.MaxPool2d      # the original is left as it was
    want_g, want_v = _grads(net, P, x, y, fz)
    for how in (_engine_grads, _grads):      # stepping out of vmap; and as the plain layers under torch.func.grad
        got_g, got_v = how(tw, P, x, y, fz)
        torch.testing.assert_close(got_v, want_v, atol=1e-6, rtol=1e-6)
        assert set(got_g) == set(want_g)
        for n in want_g:
            torch.testing.assert_close(got_g[n], want_g[n], atol=1e-6, rtol=1e-5, msg=lambda m: f"{n}: {m}")
    # discrimination: another client's weights give other gradients
    other = {n: t.flip(0) if n not in fz else t for n, t in P.items()}
    assert max(float((_engine_grads(tw, other, x, y, fz)[0][n] - want_g[n]).abs().max()) for n in want_g) > 1e-3


def test_the_input_gradient_when_asked():
    net = _net()
    x = torch.randn(C, B, 4, 13, 13, generator=torch.Generator().manual_seed(2))
    y = torch.randint(0, 3, (C, B))
    P = _stacked_params(net, x)
    (want_p, want_x), _ = _grads(net, P, x, y, input_grad=True)
    (got_p, got_x), _ = _engine_grads(grouped.twin(net), P, x, y, input_grad=True)
    torch.testing.assert_close(got_x, want_x, atol=1e-6, rtol=1e-5)
    assert float(want_x.abs().max()) > 0


def test_twin_outside_vmap_is_the_module():
    net = _net(conv={"stride": 2, "padding": 1})
    x = torch.randn(B, 4, 13, 13, requires_grad=True)
    net(x)
    tw = grouped.twin(net)
    out, ref = tw(x), net(x)
    torch.testing.assert_close(out, ref, atol=0, rtol=0)
    ga = torch.autograd.grad(out.sum(), [x, *tw.parameters()])
    gb = torch.autograd.grad(ref.sum(), [x, *net.parameters()])
    for a, b in zip(ga, gb):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    assert list(dict(tw.state_dict())) == list(dict(net.state_dict()))


def test_only_plain_layers_are_converted():
    net = nn.Sequential(nn.Conv2d(1, 2, 3, padding="same"), nn.Conv2d(2, 2, 3, padding=1, padding_mode="reflect"),
                        nn.MaxPool2d(2, return_indices=True), nn.Conv2d(2, 2, 1))
    tw = grouped.twin(net)
    assert [type(m) for m in tw] == [nn.Conv2d, nn.Conv2d, nn.MaxPool2d, grouped.GroupedConv2d]


def test_pays_on_cpu_convolutions_from_the_thresholds():
    conv, mlp = cnn_cifar10(1, 10, 28), nn.Sequential(nn.Flatten(), nn.Linear(4, 2))
    cpu = torch.zeros(1)
    rows, clients = grouped.GROUPED_MIN_ROWS, grouped.GROUPED_MIN_CLIENTS
    assert clients >= 2                                                       # one client has nothing to group
    assert grouped.pays(conv, cpu, clients, -(-rows // clients))
    assert not grouped.pays(conv, cpu, clients, -(-rows // clients) - 1)
    assert not grouped.pays(conv, cpu, clients - 1, 100)
    assert not grouped.pays(mlp, cpu, 100, 100)
    assert not grouped.pays(conv, torch.zeros(1, device="meta"), 100, 100)    # not the CPU: not measured there
    bn = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.LazyLinear(2))
    assert not grouped.pays(bn, cpu, 100, 100)                                # a layer not measured


class _CountConv:
    """Counts the convolutions run outside `vmap` (one grouped kernel for every client) while installed."""

    def __init__(self, monkeypatch):
        self.n = 0
        conv = grouped.F.conv2d

        def counted(x, w, *a, **k):
            self.n += 1
            return conv(x, w, *a, **k)
        monkeypatch.setattr(grouped, "F", type("F", (), {"conv2d": staticmethod(counted),
                                                         "max_pool2d": staticmethod(F.max_pool2d)}))


@pytest.mark.parametrize("batch, used", [(16, True), (8, False)])
def test_the_engine_uses_it_where_it_pays(monkeypatch, batch, used):
    """16 clients at B = 16 (256 rows) go through the grouped kernels; at B = 8 (128 rows, threshold raised to 129)
    they do not; both train (the weights move)."""
    monkeypatch.setattr(grouped, "GROUPED_MIN_ROWS", 129)
    spy = _CountConv(monkeypatch)
    net = cnn_cifar10(1, 10, 28)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16 * batch, 1, 28, 28, generator=g), torch.randint(0, 10, (16 * batch,), generator=g)
    index = [torch.arange(i * batch, (i + 1) * batch) for i in range(16)]
    start = {n: t.clone() for n, t in net.state_dict().items()}
    res = local_train_many(net, [start] * 16, x, y, index, epochs=1, batch_size=batch, lr=0.1, seeds=list(range(16)))
    assert (spy.n > 0) is used
    assert all(float((st["body.conv1.weight"] - start["body.conv1.weight"]).abs().max()) > 0 for st, _ in res)


def test_it_steps_out_of_vmap_only_where_vmap_is_innermost(monkeypatch):
    """Ordinary autograd over `vmap` (the engine): one grouped call per convolution; under `torch.func.grad` inside
    `vmap` the layers run as the plain ones (the gradient transform must see them), and outside `vmap` too."""
    net = _net()
    x = torch.randn(C, B, 4, 13, 13, generator=torch.Generator().manual_seed(2))
    y = torch.randint(0, 3, (C, B))
    P = _stacked_params(net, x)
    tw = grouped.twin(net)
    spy = _CountConv(monkeypatch)
    _engine_grads(tw, P, x, y)
    assert spy.n == 2                     # the two convolutions, once each
    _grads(tw, P, x, y)
    tw(x[0])
    assert spy.n == 2
