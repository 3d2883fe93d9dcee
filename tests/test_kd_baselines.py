"""FML, FedKD and FD (DC-PFL's mutual-learning and distillation baselines): hand-computed losses,
aggregation rules and compression, heterogeneous runs, and short learning runs on Fashion-MNIST."""
import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from pflrepro.algorithms.base import Update
from pflrepro.algorithms.fd import FD, distill_targets, per_class_average, pool_class_averages
from pflrepro.algorithms.fedkd import FedKD, adaptive_mutual_loss, adaptive_weight, svd_compress
from pflrepro.algorithms.fml import Pair, mutual_loss
from pflrepro.data.models import build_model
from pflrepro.pipeline.store import load_checkpoint, run
from tests.conftest import FMNIST_AVAILABLE, small_cfg

needs_fmnist = pytest.mark.skipif(not FMNIST_AVAILABLE, reason="needs offline Fashion-MNIST")
LN3 = math.log(3.0)


class Fixed(nn.Module):
    """A 'model' whose features are a trainable vector (the same for every input) and whose head is
    the identity: logits = features = z."""

    def __init__(self, z):
        super().__init__()
        self.z = nn.Parameter(torch.tensor([z]))
        self.head = nn.Identity()
        self.feature_dim = len(z)

    def features(self, x):
        return self.z.expand(len(x), -1)

    def forward(self, x):
        return self.head(self.features(x))


def _pair(proj_eye=False):
    # local/mentor p = softmax([0, ln 3]) = [1/4, 3/4]; shared/mentee q = [1/2, 1/2]; label 0
    proj = None
    if proj_eye:
        proj = nn.Linear(2, 2, bias=False)
        proj.weight.data = torch.eye(2)
    return Pair(Fixed([0.0, LN3]), Fixed([0.0, 0.0]), proj), torch.zeros(1, 1), torch.tensor([0])


KL_SHARED_LOCAL = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)   # KL(q || p)
KL_LOCAL_SHARED = 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)  # KL(p || q)


# ---------------------------------------------------------------- FML
def test_fml_mutual_loss_value_and_kl_directions():
    pair, x, y = _pair()
    alpha, beta = 0.3, 0.8
    value = mutual_loss(alpha, beta)(pair, x, y)
    want = (alpha * math.log(4) + (1 - alpha) * KL_SHARED_LOCAL) + (beta * math.log(2) + (1 - beta) * KL_LOCAL_SHARED)
    assert value.item() == pytest.approx(want, rel=1e-6)
    value.backward()
    # d/dz_local = alpha (p - e_y) + (1 - alpha)(p - q);  d/dz_meme = beta (q - e_y) + (1 - beta)(q - p):
    # each model only feels its own loss (the other's prediction is a constant), KL pulls it to the other
    assert torch.allclose(pair.local.z.grad, torch.tensor([[-0.4, 0.4]]), atol=1e-6)
    assert torch.allclose(pair.shared.z.grad, torch.tensor([[-0.35, 0.35]]), atol=1e-6)


def test_fml_alpha_one_is_plain_cross_entropy():
    pair, x, y = _pair()
    assert mutual_loss(1.0, 1.0)(pair, x, y).item() == pytest.approx(math.log(4) + math.log(2), rel=1e-6)


# ---------------------------------------------------------------- FedKD
def test_fedkd_adaptive_weight_on_given_ce_values():
    ce_t, ce_s = torch.tensor(0.5, requires_grad=True), torch.tensor(1.5, requires_grad=True)
    assert adaptive_weight(ce_t, ce_s, True).item() == pytest.approx(0.5)
    assert adaptive_weight(ce_t, ce_s, True).requires_grad is False      # a constant weight
    w = adaptive_weight(ce_t, ce_s, False)                                # the code: differentiated
    w.backward()
    assert ce_t.grad.item() == pytest.approx(-1 / 4)                      # d(1/(a+b))/da = -1/(a+b)^2


def test_fedkd_loss_hand_computed():
    pair, x, y = _pair(proj_eye=True)
    w = math.log(4) + math.log(2)                       # CE_t + CE_s = ln 8
    mse = LN3 ** 2 / 2                                  # mean over the 2 features of (H_t - W_h H_s)^2
    value = adaptive_mutual_loss(hidden=True, detach=True)(pair, x, y)
    assert value.item() == pytest.approx(w + (KL_SHARED_LOCAL + KL_LOCAL_SHARED + 2 * mse) / w, rel=1e-6)
    value.backward()
    # mentor: (p - e_y) + (p - q)/w + (H_t - H_s)/w   (adaptive weight held constant)
    g = torch.tensor([-0.75, 0.75]) + (torch.tensor([0.25, 0.75]) - 0.5) / w + torch.tensor([0.0, LN3]) / w
    assert torch.allclose(pair.local.z.grad[0], g, atol=1e-6)
    no_hidden = adaptive_mutual_loss(hidden=False, detach=True)(*_pair(proj_eye=True))
    assert no_hidden.item() == pytest.approx(w + (KL_SHARED_LOCAL + KL_LOCAL_SHARED) / w, rel=1e-6)
    pair2, x, y = _pair(proj_eye=True)
    code = adaptive_mutual_loss(hidden=True, detach=False)(pair2, x, y)
    assert code.item() == pytest.approx(value.item(), rel=1e-6)  # same value, other gradients
    code.backward()
    assert not torch.allclose(pair2.local.z.grad, pair.local.z.grad, atol=1e-4)


def test_svd_compress_keeps_the_fewest_values_reaching_the_energy():
    t = torch.diag(torch.tensor([3.0, 2.0, 1.0, 0, 0, 0, 0, 0]))        # energies 9, 4, 1 of 14
    rec, sent = svd_compress(t, 0.9)                                       # 9/14 < 0.9 <= 13/14 -> rank 2
    assert torch.allclose(rec, torch.diag(torch.tensor([3.0, 2.0, 0, 0, 0, 0, 0, 0])), atol=1e-5)
    assert sent == 2 * (8 + 8 + 1) * 4
    rec, sent = svd_compress(t, 0.5)                                       # 9/14 >= 0.5 -> rank 1
    assert sent == 1 * 17 * 4 and rec[1, 1].abs().item() < 1e-5
    conv = t.reshape(8, 2, 2, 2)                                           # conv kernel: out x (in*kh*kw)
    rec, _ = svd_compress(conv, 0.9)
    assert rec.shape == conv.shape and rec.reshape(8, 8)[2, 2].abs().item() < 1e-5
    bias = torch.arange(5.0)
    assert svd_compress(bias, 0.5) == (bias, 20)                           # vectors go dense
    full, sent = svd_compress(t, 1.0)                                      # rank 3: factors cost 204 < 256
    assert torch.allclose(full, t, atol=1e-5) and sent == 3 * 17 * 4


def test_fedkd_server_applies_the_averaged_update():
    algo = FedKD.__new__(FedKD)
    algo.ctx = SimpleNamespace(cfg=SimpleNamespace(rounds=10))
    algo.hp = {"svd": False, "t_start": 0.95, "t_end": 0.98}
    server = {"params": {"w": torch.ones(2, 2), "n": torch.tensor(7)}}
    ups = [Update(weight=1.0, payload={"w": torch.full((2, 2), 1.0)}),
           Update(weight=3.0, payload={"w": torch.full((2, 2), 5.0)})]
    out = algo.aggregate(1, server, ups, {})
    assert torch.allclose(out["params"]["w"], torch.full((2, 2), 5.0))   # 1 + (1*1 + 3*5)/4
    assert out["params"]["n"].item() == 7 and out["down_bytes"].item() == 16
    algo.hp["svd"] = True                                                  # rank-1 average: one factor triple
    out = algo.aggregate(1, server, ups, {})
    assert torch.allclose(out["params"]["w"], torch.full((2, 2), 5.0), atol=1e-5)
    assert out["down_bytes"].item() == 16                                  # factors (20 B) cost more: dense
    assert algo.energy(5) == pytest.approx(0.95 + 0.5 * 0.03)


# ---------------------------------------------------------------- FD
def test_fd_per_class_averaging_with_counts():
    a = {"classes": torch.tensor([0, 2]), "counts": torch.tensor([2.0, 1.0]),
         "means": torch.tensor([[1.0, 0, 0], [0, 0, 3.0]])}
    b = {"classes": torch.tensor([0, 1]), "counts": torch.tensor([3.0, 4.0]),
         "means": torch.tensor([[6.0, 0, 0], [0, 2.0, 0]])}
    table, counts = pool_class_averages([a, b], 3)
    assert torch.allclose(table, torch.tensor([[4.0, 0, 0], [0, 2.0, 0], [0, 0, 3.0]]))  # (2*1 + 3*6)/5 = 4
    assert torch.equal(counts, torch.tensor([5.0, 4.0, 1.0]))
    # FD's per-device target F_hat^(i): b's own contribution removed
    target, valid = distill_targets(table, counts, torch.tensor([[6.0, 0, 0], [0, 2.0, 0], [0, 0, 0]]),
                                    torch.tensor([3.0, 4.0, 0.0]))
    assert torch.allclose(target[0], torch.tensor([1.0, 0, 0])) and torch.allclose(target[2], torch.tensor([0, 0, 3.0]))
    assert valid.tolist() == [1.0, 0.0, 1.0]                              # only b holds class 1
    table, weights = pool_class_averages([a, b], 3, weighted=False)      # FD's wording: mean over devices
    assert torch.allclose(table[0], torch.tensor([3.5, 0, 0])) and weights.tolist() == [2.0, 1.0, 1.0]
    target, _ = distill_targets(table, weights, torch.tensor([[6.0, 0, 0], [0, 2.0, 0], [0, 0, 0]]),
                                torch.tensor([1.0, 1.0, 0.0]))
    assert torch.allclose(target[0], torch.tensor([1.0, 0, 0]))
    msg = per_class_average(torch.tensor([[2.0, 4.0], [0.0, 0.0]]), torch.tensor([2.0, 0.0]))
    assert msg["classes"].tolist() == [0] and msg["means"].tolist() == [[1.0, 2.0]]


def test_fd_removes_its_own_contribution_only_when_it_is_in_the_table():
    algo = FD.__new__(FD)
    algo.hp = {"exclude_own": True, "weighted": True}
    server = {"table": torch.tensor([[4.0, 0.0], [0.0, 2.0]]), "counts": torch.tensor([5.0, 4.0]),
              "round": torch.tensor(3)}
    mine = {"means": torch.tensor([[6.0, 0.0], [0.0, 0.0]]), "counts": torch.tensor([3.0, 0.0])}
    target, valid = algo.targets(server, {**mine, "round": torch.tensor(3)})   # uploaded in round 3
    assert target[0].tolist() == [1.0, 0.0] and target[1].tolist() == [0.0, 2.0] and valid.tolist() == [1, 1]
    target, _ = algo.targets(server, {**mine, "round": torch.tensor(2)})      # table built without it
    assert target[0].tolist() == [4.0, 0.0]
    algo.hp["exclude_own"] = False
    assert algo.targets(server, {**mine, "round": torch.tensor(3)})[0][0].tolist() == [4.0, 0.0]
    assert algo.targets({**server, "counts": torch.zeros(2)}, None) == (None, None)  # round 1: plain CE


def test_fd_loss_looks_up_the_target_of_each_label_and_collects_outputs():
    algo = FD.__new__(FD)
    algo.hp = {"gamma": 0.5, "space": "logits", "exclude_own": False}
    net = Fixed([0.0, LN3])                                  # p = [1/4, 3/4] for every sample
    target = torch.tensor([[0.0, 0.0], [0.0, LN3]])           # class 0 -> uniform, class 1 -> p itself
    valid = torch.tensor([1.0, 0.0])                          # class 1 has no target yet
    sums, counts = torch.zeros(2, 2), torch.zeros(2)
    y = torch.tensor([0, 1, 0])
    value = algo.fd_loss(target, valid, sums, counts)(net, torch.zeros(3, 1), y)
    ce = (2 * math.log(4) + math.log(4 / 3)) / 3
    psi0 = -(0.5 * math.log(0.25) + 0.5 * math.log(0.75))     # cross-entropy of [1/2, 1/2] to p
    assert value.item() == pytest.approx(ce + 0.5 * (2 * psi0 + 0) / 3, rel=1e-6)
    assert counts.tolist() == [2.0, 1.0] and torch.allclose(sums, torch.tensor([[0.0, 2 * LN3], [0.0, LN3]]))
    algo.hp["space"] = "probs"                                # averaged softmax outputs are the target itself
    value = algo.fd_loss(torch.tensor([[0.5, 0.5], [0.0, 1.0]]), valid, sums, counts)(net, torch.zeros(3, 1), y)
    assert value.item() == pytest.approx(ce + 0.5 * (2 * psi0) / 3, rel=1e-6)
    assert algo.fd_loss(None, None, sums, counts)(net, torch.zeros(3, 1), y).item() == pytest.approx(ce, rel=1e-6)


# ---------------------------------------------------------------- runs
HETERO = dict(models=["cnn1", "cnn2", "cnn3", "cnn4", "cnn5"], model="cnn1", n_clients=5, subsample=0.01,
              batch_size=64, partition="classes_uniform_shares", partition_params={"classes_per_client": 2},
              split_params={"fractions": [0.8, 0.1, 0.1]})


@needs_fmnist
@pytest.mark.parametrize("algorithm", ["fml", "fedkd", "fd"])
def test_runs_with_heterogeneous_fedgh_models(store, algorithm, monkeypatch):
    monkeypatch.setenv("PFLREPRO_KEEP_CHECKPOINTS", "1")   # its final states are read below
    res = run(small_cfg(algorithm=algorithm, rounds=1, **HETERO), progress=False)
    assert 0.0 <= res.metric("pm_acc_mean")[-1] <= 1.0
    ckpt = load_checkpoint(res.path / "checkpoint.pt", res.config)    # states are tensors only
    personal = ckpt["clients"][3]["mentor" if algorithm == "fedkd" else "params"]
    assert personal["body.fc1.weight"].shape == (800, 512)              # client 3 kept its cnn4
    assert ckpt["clients"][1]["mentor" if algorithm == "fedkd" else "params"]["body.conv2.weight"].shape[0] == 16
    cnn5 = build_model("cnn5", 1, 10, 28)                                # the default shared model
    shared = sum(t.numel() * 4 for t in cnn5.state_dict().values())
    up_bytes = res.history[-1]["bytes_up"]
    if algorithm == "fml":
        assert up_bytes == 5 * shared                                    # the meme model, from every client
        assert ckpt["server"]["params"].keys() == cnn5.state_dict().keys()
    elif algorithm == "fedkd":
        assert 0 < up_bytes < 5 * shared                                 # SVD-compressed mentee updates
    else:
        assert up_bytes == 5 * 2 * (10 * 4 + 4 + 8)                      # 2 labels x (10 logits, a count, a label id)


@needs_fmnist
@pytest.mark.parametrize("algorithm, hparams", [("fml", {"shared_model": "cnn_cifar10"}),
                                                ("fedkd", {"shared_model": "cnn_cifar10"}), ("fd", {})])
def test_learns_on_fmnist_two_classes_per_client(store, algorithm, hparams):
    """2 classes per client: a constant guess scores ~0.5 per client."""
    res = run(small_cfg(algorithm=algorithm, hparams=hparams, partition="classes_uniform_shares",
                        partition_params={"classes_per_client": 2}, split_params={"fractions": [0.8, 0.1, 0.1]},
                        n_clients=5, rounds=4, eval_every=4), progress=False)
    assert res.metric("pm_acc_mean")[-1] > 0.8, res.metric("pm_acc_mean")


@needs_fmnist
@pytest.mark.parametrize("algorithm, hparams", [("local", {}), ("lg_fedavg", {"head_layers": 1})])
def test_local_and_lg_fedavg_run_heterogeneous_models(store, algorithm, hparams, monkeypatch):
    """DC-PFL Table 2 runs Local-T and LG-FedAvg with FedGH's five CNNs: every client starts from its
    own architecture's init (Context.initial), LG-FedAvg shares only the head (same shape for all)."""
    monkeypatch.setenv("PFLREPRO_KEEP_CHECKPOINTS", "1")   # its final states are read below
    res = run(small_cfg(algorithm=algorithm, hparams=hparams, rounds=1, **HETERO), progress=False)
    assert all(0.0 <= a <= 1.0 for a in res.per_client[-1])
    assert math.isnan(res.history[-1]["gm_acc"])                         # nothing to average across architectures
    ckpt = load_checkpoint(res.path / "checkpoint.pt", res.config)
    own = ckpt["clients"][3]["params" if algorithm == "local" else "personal"]
    assert own["body.fc1.weight"].shape == (800, 512)                    # client 3 kept its cnn4
    if algorithm == "lg_fedavg":
        assert set(ckpt["server"]["params"]) >= {"head.weight", "head.bias"}
        assert res.history[-1]["bytes_up"] == 5 * (500 * 10 + 10) * 4    # the head only, from every client
