"""Aggregation math, the training primitive, client sampling: hand-computed cases."""
import numpy as np
import pytest
import torch
from torch import nn

from pflrepro.core.aggregation import plain_average, select_keys, state_bytes, weighted_average
from pflrepro.core.schedule import sample_clients
from pflrepro.core.seeds import derive_seed
from pflrepro.core.training import Divergence, local_train
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
