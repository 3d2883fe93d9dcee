"""FedBSD's mixture baselines L2GD and APFL: their update rules on hand-made cases, equivalences with FedAvg
and Local at the ends of L2GD's mixing, and learning on real data."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pflrepro.algorithms import ALGORITHMS
from pflrepro.algorithms.apfl import Mixture, apfl_loss
from pflrepro.federation.build import build_context
from pflrepro.federation.config import RunConfig
from pflrepro.pipeline.store import run
from tests.conftest import FMNIST_AVAILABLE, small_cfg

needs_fmnist = pytest.mark.skipif(not FMNIST_AVAILABLE, reason="needs offline Fashion-MNIST")


def test_apfl_step_gradients_are_algorithm_1s():
    """One loss, three gradients: w gets grad f(w) only, v gets alpha grad f(v_bar), alpha gets
    <v - w, grad f(v_bar)>, with v_bar = alpha v + (1 - alpha) w."""
    torch.manual_seed(0)
    w, v = nn.Linear(3, 2), nn.Linear(3, 2)
    x, y = torch.randn(5, 3), torch.tensor([0, 1, 1, 0, 1])
    m = Mixture(w, v, 0.3)
    apfl_loss(m, x, y).backward()
    ref_w = nn.Linear(3, 2)
    ref_w.load_state_dict(w.state_dict())
    F.cross_entropy(ref_w(x), y).backward()
    vbar = nn.Linear(3, 2)
    vbar.load_state_dict({n: 0.3 * v.state_dict()[n] + 0.7 * w.state_dict()[n] for n in ("weight", "bias")})
    F.cross_entropy(vbar(x), y).backward()
    for n in ("weight", "bias"):
        assert torch.allclose(getattr(w, n).grad, getattr(ref_w, n).grad, atol=1e-6)
        assert torch.allclose(getattr(v, n).grad, 0.3 * getattr(vbar, n).grad, atol=1e-6)
    want = sum(((getattr(v, n) - getattr(w, n)) * getattr(vbar, n).grad).sum() for n in ("weight", "bias"))
    assert float(m.alpha.grad) == pytest.approx(float(want.detach()), abs=1e-6)


def test_l2gd_mixes_toward_the_mean_before_training(store):
    """theta = 0.25: a client at 1 receiving x_bar = 3 starts from 0.75 * 1 + 0.25 * 3 = 1.5."""
    ctx = build_context(RunConfig.from_dict(small_cfg(algorithm="l2gd", n_clients=2, subsample=0.01)), torch.device("cpu"))
    algo = ALGORITHMS["l2gd"](ctx, theta=0.25)
    server = {"params": {n: torch.full_like(t, 3.0) for n, t in ctx.init_state.items()}}
    start = algo.plan(1, 0, server, {"params": {n: torch.ones_like(t) for n, t in ctx.init_state.items()}}).start
    assert all(torch.equal(t, torch.full_like(t, 1.5)) for t in start.values())


@needs_fmnist
@pytest.mark.parametrize("theta, same_as, metric", [(1.0, "fedavg", "gm_acc"), (0.0, "local", "pm_acc_mean")])
def test_l2gd_ends_are_fedavg_and_local(store, theta, same_as, metric):
    """theta = 1: every client restarts from the mean (FedAvg's training, the same global model);
    theta = 0: nobody mixes (Local's personal models)."""
    kw = dict(rounds=2, subsample=0.03, momentum=0.0)
    a = run(small_cfg(algorithm="l2gd", hparams={"theta": theta}, **kw), progress=False)
    b = run(small_cfg(algorithm=same_as, **kw), progress=False)
    assert list(a.metric(metric)) == list(b.metric(metric)), (a.metric(metric), b.metric(metric))


@needs_fmnist
@pytest.mark.parametrize("algorithm, hparams", [("l2gd", {}), ("apfl", {"alpha": 0.75})])
def test_mixture_baselines_learn_on_pathological_fmnist(store, algorithm, hparams):
    """2 classes per client: a constant guess scores ~0.5 per client. APFL starts at alpha = 0.75 (one of APFL's
    values): from 0.25 its personalized model is mostly the global one for the first rounds (0.55 after 3)."""
    res = run(small_cfg(algorithm=algorithm, hparams=hparams, partition="shards", partition_params={"s": 2},
                        subsample=0.1, rounds=3, momentum=0.5), progress=False)
    assert res.metric("pm_acc_mean")[-1] > 0.7, res.metric("pm_acc_mean")
