"""Aggregation math, the training primitive, client sampling: hand-computed cases."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pflrepro.core.aggregation import plain_average, select_keys, state_bytes, weighted_average
from pflrepro.core.schedule import sample_clients
from pflrepro.core.seeds import derive_seed
from pflrepro.core.training import Divergence, batchable, local_train
from pflrepro.federation.config import RunConfig


def test_weighted_average_hand_computed():
    a = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.0])}
    b = {"w": torch.tensor([3.0, 6.0]), "b": torch.tensor([4.0])}
    out = weighted_average([a, b], [1, 3])          # (1*a + 3*b) / 4
    assert torch.allclose(out["w"], torch.tensor([2.5, 5.0]))
    assert torch.allclose(out["b"], torch.tensor([3.0]))
    plain = plain_average([a, b])
    assert torch.allclose(plain["w"], torch.tensor([2.0, 4.0]))


def test_weighted_average_subset_and_int_buffers():
    a = {"body.w": torch.tensor([1.0]), "head.w": torch.tensor([10.0]), "bn.num_batches_tracked": torch.tensor(5)}
    b = {"body.w": torch.tensor([3.0]), "head.w": torch.tensor([30.0]), "bn.num_batches_tracked": torch.tensor(7)}
    keys = select_keys(a, exclude=lambda n: n.startswith("head."))
    out = weighted_average([a, b], [1, 1], keys)
    assert set(out) == {"body.w", "bn.num_batches_tracked"}
    assert out["body.w"].item() == 2.0
    assert out["bn.num_batches_tracked"].item() == 5  # integers are not averaged
    with pytest.raises(ValueError):
        weighted_average([a, b], [0, 0])
    assert state_bytes(a, ["body.w", "head.w"]) == 8


def test_derive_seed_is_stable_and_distinct():
    assert derive_seed(0, 1, 2) == derive_seed(0, 1, 2)
    assert len({derive_seed(0, r, k) for r in range(5) for k in range(5)}) == 25


def test_sample_clients_uniform_and_by_data_share():
    cfg = RunConfig.from_dict({"n_clients": 10, "participation": 0.3})
    n = np.ones(10)
    s1 = sample_clients(cfg, 1, n)
    assert len(s1) == 3 and len(set(s1)) == 3 and s1 == sample_clients(cfg, 1, n)
    assert s1 != sample_clients(cfg, 2, n) or s1 != sample_clients(cfg, 3, n)
    # PerFed-CKT: by data share p_k; a client with all the data but one sample is almost always in
    cfg2 = RunConfig.from_dict({"n_clients": 10, "participation": 0.1, "sampling": "data_share"})
    n2 = np.array([1000.0] + [1e-6] * 9)
    assert all(sample_clients(cfg2, r, n2) == [0] for r in range(1, 20))
    full = RunConfig.from_dict({"n_clients": 4, "participation": 1.0})
    assert sample_clients(full, 7, np.ones(4)) == [0, 1, 2, 3]


def _tiny():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def test_local_train_learns_and_respects_trainable():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(120, 4, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    net = _tiny()
    frozen_before = net[0].weight.detach().clone()
    st = local_train(net, x, y, epochs=20, batch_size=16, lr=0.1, momentum=0.9,
                     trainable=lambda n: n.startswith("2."), seed=1)
    assert torch.equal(net[0].weight, frozen_before)          # frozen layer untouched
    assert all(p.requires_grad for p in net.parameters())      # and unfrozen afterwards
    assert st.steps == 20 * 8 and st.samples == 20 * 120       # 120/16 -> 8 batches (last partial kept)
    net2 = _tiny()
    local_train(net2, x, y, epochs=20, batch_size=16, lr=0.1, momentum=0.9, seed=1)
    acc = (net2(x).argmax(1) == y).float().mean().item()
    assert acc > 0.8


def test_local_train_same_seed_same_result_and_steps_cap():
    x, y = torch.randn(50, 4), torch.randint(0, 3, (50,))
    a, b = _tiny(), _tiny()
    local_train(a, x, y, epochs=2, batch_size=8, lr=0.1, seed=3)
    local_train(b, x, y, epochs=2, batch_size=8, lr=0.1, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert local_train(_tiny(), x, y, epochs=1, batch_size=8, lr=0.1, steps=3, seed=0).steps == 3


def test_local_train_is_torch_sgd_bit_for_bit():
    """`local_train`'s update (SGD with momentum, weight decay and a bias exempt from it) leaves the same bits as
    torch's fused SGD kernel driven by hand over the same batches."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 4, generator=g), torch.randint(0, 3, (40,), generator=g)
    a, b = _tiny(), _tiny()
    local_train(a, x, y, epochs=3, batch_size=8, lr=0.1, momentum=0.9, weight_decay=0.01, bias_decay=False, seed=5)
    decay = [p for n, p in b.named_parameters() if "bias" not in n]
    opt = torch.optim.SGD([{"params": decay, "weight_decay": 0.01},
                           {"params": [p for n, p in b.named_parameters() if "bias" in n], "weight_decay": 0.0}],
                          lr=0.1, momentum=0.9, fused=True)
    gen = torch.Generator().manual_seed(5)
    for _ in range(3):
        order = torch.randperm(40, generator=gen)
        for s in range(0, 40, 8):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(b(x[order[s:s + 8]]), y[order[s:s + 8]]).backward()
            opt.step()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a[0].weight, _tiny()[0].weight)


def _sgd_steps(ps: list, grads: list, step) -> list:
    for gs in grads:
        step(ps, gs)
    return ps


def test_per_client_update_is_the_batched_engines_bit_for_bit():
    """Both engines take one pass of torch's fused SGD kernel per update (`training.sgd_kernel`, `batched.sgd_update`):
    the same bits with momentum and weight decay together. (torch's three-pass `foreach` form, which `local_train` used
    before, rounds about one weight in a million differently there: vector tails, values-dependent; not asserted.)"""
    from pflrepro.core.engines.many import sgd_update
    from pflrepro.core.training import sgd_kernel
    g = torch.Generator().manual_seed(1)
    shapes = [(2000, 512), (2000,), (33, 3, 5, 5)]
    start = [torch.randn(s, generator=g) for s in shapes]
    grads = [[torch.randn(s, generator=g) for s in shapes] for _ in range(5)]
    hp = dict(lr=0.05, momentum=0.9, weight_decay=1e-3)

    def with_torch(kernel):
        ps = [p.clone().requires_grad_() for p in start]
        opt = torch.optim.SGD(ps, **hp, **kernel)

        def step(ps, gs):
            for p, gr in zip(ps, gs):
                p.grad = gr.clone()
            opt.step()
        return [p.detach() for p in _sgd_steps(ps, grads, step)]

    bufs, steps = [torch.zeros(s) for s in shapes], []
    engine = _sgd_steps([p.clone() for p in start], grads, lambda ps, gs: sgd_update(
        ps, [t.clone() for t in gs], bufs, **hp, first=not steps) or steps.append(1))
    assert sgd_kernel(start) == {"fused": True}
    assert all(torch.equal(a, b) for a, b in zip(with_torch(sgd_kernel(start)), engine))


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3, float("inf"), float("nan")])
def test_clip_grad_norm_is_torchs_bit_for_bit(scale):
    """`training.clip_grad_norm` skips torch's multiply by exactly 1.0 when the norm is within the bound; everything
    else (a scaled gradient, an infinite or NaN norm) is torch's `clip_grad_norm_`, bit for bit."""
    from pflrepro.core.training import clip_grad_norm
    g = torch.Generator().manual_seed(2)
    grads = [torch.randn(50, 30, generator=g) * scale, torch.randn(30, generator=g) * scale]
    mine, ref = ([nn.Parameter(torch.zeros_like(t)) for t in grads] for _ in range(2))
    for a, b, t in zip(mine, ref, grads):
        a.grad, b.grad = t.clone(), t.clone()
    clip_grad_norm(mine, 5.0)
    nn.utils.clip_grad_norm_(ref, 5.0)
    same = [torch.equal(a.grad.nan_to_num(7.0), b.grad.nan_to_num(7.0)) for a, b in zip(mine, ref)]
    assert all(same)
    assert torch.equal(mine[0].grad, grads[0]) == (scale < 1)      # untouched when within the bound


def test_divergence_is_reported():
    x, y = torch.randn(20, 4), torch.randint(0, 3, (20,))
    with pytest.raises(Divergence, match="diverged"):
        local_train(_tiny(), x, y, epochs=1, batch_size=4, lr=0.1, loss=lambda net, xb, yb: net(xb).sum() * float("nan"))


def test_weight_decay_spares_biases_when_asked_hand_computed():
    """A zero loss leaves only weight decay: one SGD step at lr 0.1, weight decay 0.5 multiplies each decayed
    parameter by 1 - 0.1 * 0.5 = 0.95; with `bias_decay=False` (FedRep's code) the bias stays where it was."""
    def zero(net, xb, yb):
        return net(xb).sum() * 0.0
    for bias_decay, bias_factor in ((True, 0.95), (False, 1.0)):
        net = nn.Linear(2, 1)
        with torch.no_grad():
            net.weight.copy_(torch.tensor([[2.0, -4.0]]))
            net.bias.fill_(3.0)
        local_train(net, torch.ones(4, 2), torch.zeros(4), epochs=1, batch_size=4, lr=0.1, weight_decay=0.5,
                    bias_decay=bias_decay, loss=zero)
        assert torch.allclose(net.weight, torch.tensor([[1.9, -3.8]]))
        assert net.bias.item() == pytest.approx(3.0 * bias_factor)


class _LayoutProbe(nn.Module):
    """A tiny CNN that records whether each image batch it is given is strided channels-last (NHWC)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 2, 3)
        self.fc = nn.Linear(2 * 4 * 4, 3)
        self.seen = []

    def forward(self, x):
        self.seen.append(x.dim() == 4 and x.stride(1) == 1 and x.stride(3) == x.shape[1])
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def test_cpu_batches_reach_the_model_channels_last_with_their_values():
    from pflrepro.core.training import cpu_layout, outputs, predict
    x = torch.randn(5, 3, 6, 6)
    cl = cpu_layout(x)
    assert cl.is_contiguous(memory_format=torch.channels_last)
    assert not x.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(cl, x)                     # the same values, only the strides differ
    flat = torch.randn(5, 7)
    assert cpu_layout(flat) is flat               # not an image batch: untouched
    net = _LayoutProbe()
    local_train(net, x, torch.tensor([0, 1, 2, 0, 1]), epochs=1, batch_size=2, lr=0.1)
    predict(net, x)
    outputs(net, x)
    assert net.seen == [True] * 5                 # 3 training batches, one scoring, one outputs pass


def test_an_mlp_gets_its_batches_as_they_come():
    from pflrepro.core.training import cpu_layout
    from pflrepro.data.models import mlp2
    x = torch.randn(5, 1, 28, 28)
    assert cpu_layout(x, mlp2(1, 10, 28)) is x    # no convolution: channels-last would only copy


def _ce_slow(m, x, y, aux=None):
    """The cross-entropy under another name: `head_only` does not recognise it, so training takes the full path."""
    return F.cross_entropy(m(x), y)


def test_head_only_training_computes_the_frozen_body_once_and_matches_the_full_path(monkeypatch):
    from pflrepro.core import training
    from pflrepro.data.models import cnn_cifar10
    calls = []
    real = training.body_features
    monkeypatch.setattr(training, "body_features", lambda *a, **k: calls.append(1) or real(*a, **k))
    torch.manual_seed(0)
    net = cnn_cifar10(1, 10, 28)
    start = {n: t.clone() for n, t in net.state_dict().items()}
    x, y = torch.randn(70, 1, 28, 28), torch.randint(0, 10, (70,))
    head = lambda n: n.startswith("head.")   # noqa: E731
    kw = dict(epochs=3, batch_size=8, lr=0.05, momentum=0.9, weight_decay=1e-3, trainable=head, seed=4)
    fast = local_train(net, x, y, **kw)
    got = {n: t.clone() for n, t in net.state_dict().items()}
    assert calls == [1]                          # one pass through the body for the whole call
    net.load_state_dict(start)
    full = local_train(net, x, y, loss=batchable(_ce_slow), **kw)
    assert calls == [1]                          # the full path: every step through the body
    assert fast.steps == full.steps == 27 and fast.samples == full.samples
    assert fast.loss == pytest.approx(full.loss, rel=1e-6)
    for n, t in net.state_dict().items():
        if n.startswith("body."):
            assert torch.equal(got[n], start[n]) and torch.equal(t, start[n])   # frozen: not a bit moved
        else:
            assert not torch.equal(got[n], start[n])                             # the head trained
            assert torch.allclose(got[n], t, atol=1e-6, rtol=1e-5)               # as the full path trains it


def test_head_only_is_refused_where_the_body_is_not_a_fixed_function():
    from pflrepro.core.training import ce_loss, head_only
    from pflrepro.data.models import cnn_bn, cnn_cifar10, cnn_fmnist
    head = lambda n: n.startswith("head.")   # noqa: E731
    net = cnn_cifar10(1, 10, 28)
    assert head_only(net, head, ce_loss) is net.head
    assert head_only(cnn_fmnist(1, 10, 28), head, ce_loss) is None            # Dropout2d in the body
    assert head_only(cnn_bn(1, 10, 28), head, ce_loss) is None                # BatchNorm: batch statistics
    assert head_only(net, None, ce_loss) is None                              # everything trains
    assert head_only(net, lambda n: n.startswith(("head.", "body.fc2")), ce_loss) is None  # a body layer too
    assert head_only(net, head, batchable(_ce_slow)) is None                  # another loss term
    assert head_only(net, head, ce_loss, {"t": torch.zeros(3)}) is None        # per-sample tensors


def test_batched_head_only_training_equals_the_per_client_path():
    from pflrepro.core.engines import local_train_many
    from pflrepro.data.models import cnn_cifar10
    torch.manual_seed(1)
    net = cnn_cifar10(1, 10, 28)
    starts = [{n: t + 0.01 * torch.randn_like(t) for n, t in net.state_dict().items()} for _ in range(3)]
    x, y = torch.randn(90, 1, 28, 28), torch.randint(0, 10, (90,))
    index = [torch.arange(0, 20), torch.arange(20, 55), torch.arange(55, 90)]
    head = lambda n: n.startswith("head.")   # noqa: E731
    kw = dict(epochs=2, batch_size=8, lr=0.05, momentum=0.9, weight_decay=1e-3, trainable=head)
    many = local_train_many(net, starts, x, y, index, seeds=[5, 6, 7], **kw)
    for s, idx, seed, (state, stats) in zip(starts, index, [5, 6, 7], many):
        one = cnn_cifar10(1, 10, 28)
        one.load_state_dict(s)
        ref = local_train(one, x[idx], y[idx], seed=seed, **kw)
        assert (stats.steps, stats.samples) == (ref.steps, ref.samples)
        assert stats.loss == pytest.approx(ref.loss, rel=1e-6)
        for n, t in one.state_dict().items():
            assert torch.equal(state[n], s[n]) if n.startswith("body.") else torch.allclose(state[n], t, atol=1e-6)
