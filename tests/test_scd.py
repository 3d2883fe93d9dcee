"""Spectral co-distillation: the spectrum, truncation and divergence on hand-computed cases, the
gradient of the spectral term against finite differences, the GM/PM steps, the simulated clock's
compute-and-wait and wait-free rounds, and a short learning run on Fashion-MNIST."""
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from pflrepro.algorithms import ALGORITHMS
from pflrepro.algorithms.spectral import (
    divergence,
    normalise,
    spectral_names,
    spectral_target,
    spectral_term,
    spectrum,
    truncate,
)
from pflrepro.core.clock import CLOCK_SCHEMA, Clock, time_to
from pflrepro.federation.build import build_context
from pflrepro.federation.config import RunConfig
from pflrepro.params import ConfigError, check_params
from pflrepro.pipeline.store import run
from tests.conftest import FMNIST_AVAILABLE, small_cfg

needs_fmnist = pytest.mark.skipif(not FMNIST_AVAILABLE, reason="needs offline Fashion-MNIST")


# ---------------------------------------------------------------- spectrum, truncation, divergence
def test_divergence_hand_computed_and_zero_log_zero():
    p, q = torch.tensor([0.5, 0.5, 0.0]), torch.tensor([0.25, 0.25, 0.5])
    assert divergence(p, q).item() == pytest.approx(math.log(2.0))        # 2 * 0.5 log(0.5 / 0.25)
    z = divergence(torch.tensor([0.0, 1.0]), torch.tensor([0.0, 1.0]))      # 0 log 0 = 0, not nan
    assert z.item() == 0.0
    assert divergence(q, q).item() == pytest.approx(0.0, abs=1e-7)
    with pytest.raises(ValueError, match="same architecture"):
        divergence(p, q[:2])


@pytest.mark.parametrize("tau, d, keep", [(0.4, 10, 4), (0.4, 11, 5), (0.3, 10, 3), (0.0, 7, 0), (1.0, 7, 7),
                                          (0.1, 44190, 4419)])
def test_truncation_keeps_ceil_tau_d(tau, d, keep):
    assert len(truncate(torch.arange(d, dtype=torch.float32), tau)) == keep


def test_spectrum_and_normalisation_hand_computed():
    # DFT of a unit impulse is all ones; of a constant vector, all mass at frequency 0
    imp = spectrum({"w": torch.tensor([1.0, 0.0, 0.0, 0.0])}, ["w"])
    assert torch.allclose(imp, torch.ones(4))
    assert torch.allclose(normalise(imp), torch.full((4,), 0.25))
    const = spectrum({"a.weight": torch.ones(2, 1), "b.weight": torch.ones(2)}, ["a.weight", "b.weight"])
    assert torch.allclose(const, torch.tensor([4.0, 0.0, 0.0, 0.0]), atol=1e-6)
    # [1, 2]: DFT (3, -1) -> magnitudes (3, 1) -> normalised (3/4, 1/4)
    assert torch.allclose(normalise(spectrum({"w": torch.tensor([1.0, 2.0])}, ["w"])), torch.tensor([0.75, 0.25]))
    for d in (1, 4, 7, 491):   # the half-length rfft + mirror is the full DFT's magnitude, odd and even d
        w = torch.randn(d, dtype=torch.float64)
        assert torch.allclose(spectrum({"w": w}, ["w"]), torch.fft.fft(w).abs())


@pytest.mark.parametrize("d", [2 * 37, 3 * 41 * 4, 44190])   # largest prime factor > 31: the four-step rule
def test_four_step_dft_is_the_dft(d):
    from pflrepro.algorithms.spectral import _four_step_dft, _largest_prime_factor
    w = torch.randn(d, dtype=torch.float64)
    p = _largest_prime_factor(d)
    assert d % p == 0 and p > 31
    assert torch.allclose(_four_step_dft(w, p), torch.fft.fft(w), atol=1e-9)
    assert torch.allclose(spectrum({"w": w}, ["w"]), torch.fft.fft(w).abs(), atol=1e-9)
    w32 = w.float()                                             # float32: the DFT up to float rounding
    assert torch.allclose(spectrum({"w": w32}, ["w"]), torch.fft.fft(w).abs().float(), rtol=1e-4, atol=1e-4)
    # a batch of vectors (vmap and the batched engine stack clients on a leading axis)
    W = torch.randn(3, d, dtype=torch.float64)
    assert torch.allclose(_four_step_dft(W, p), torch.fft.fft(W, dim=-1), atol=1e-9)


def test_largest_prime_factor_hand_computed():
    from pflrepro.algorithms.spectral import _largest_prime_factor
    assert [_largest_prime_factor(d) for d in (1, 2, 12, 491, 44190, 65536, 11169152)] == [1, 2, 3, 491, 491, 2, 1229]


def test_fft2d_layer_mode_is_a_2d_fft_per_layer():
    w = torch.tensor([[1.0, 2.0], [3.0, 4.0]])               # fft2: [[10, -2], [-4, 0]]
    b = torch.tensor([1.0, -1.0])                             # fft:  [0, 2]
    s = spectrum({"l.weight": w, "n.weight": b}, ["l.weight", "n.weight"], mode="fft2d_layer")
    assert torch.allclose(s, torch.tensor([10.0, 2.0, 4.0, 0.0, 0.0, 2.0]), atol=1e-6)
    conv = torch.randn(3, 2, 2, 2)                            # reshaped to (out, in*k*k) = (3, 8)
    s2 = spectrum({"c.weight": conv}, ["c.weight"], mode="fft2d_layer")
    assert torch.allclose(s2, torch.fft.fft2(conv.reshape(3, 8)).abs().reshape(-1), atol=1e-6)


def test_spectral_names_weights_only_by_default():
    names = ["conv.weight", "conv.bias", "bn.weight", "bn.bias", "head.weight", "head.bias"]
    assert spectral_names(names) == ["conv.weight", "bn.weight", "head.weight"]
    assert spectral_names(names, "all") == names


def test_spectral_term_gradient_is_nonzero_and_matches_finite_differences():
    torch.manual_seed(0)
    params = {"a.weight": torch.randn(3, 2, dtype=torch.float64, requires_grad=True),
              "b.weight": torch.randn(5, dtype=torch.float64, requires_grad=True)}
    names = ["a.weight", "b.weight"]
    teacher = {n: torch.randn_like(t) for n, t in params.items()}
    for tau, mode in [(1.0, "dft1d"), (0.4, "dft1d"), (1.0, "fft2d_layer")]:
        target = spectral_target(teacher, names, tau, mode)
        assert not target.requires_grad                          # the teacher side is detached
        value = spectral_term(params, names, target, tau, mode)
        grads = torch.autograd.grad(value, [params[n] for n in names])
        assert all(g.abs().sum() > 0 for g in grads)
        eps = 1e-6
        for n, g in zip(names, grads):
            for i in range(params[n].numel()):
                with torch.no_grad():
                    flat = params[n].view(-1)
                    flat[i] += eps
                    up = spectral_term(params, names, target, tau, mode).item()
                    flat[i] -= 2 * eps
                    down = spectral_term(params, names, target, tau, mode).item()
                    flat[i] += eps
                assert g.view(-1)[i].item() == pytest.approx((up - down) / (2 * eps), rel=1e-4, abs=1e-8), (tau, mode, n, i)


# ---------------------------------------------------------------- the algorithm
def _ctx(**kw):
    cfg = RunConfig.from_dict(small_cfg(**{"subsample": 0.02, "n_clients": 4, "rounds": 1, "algorithm": "scd", **kw}))
    return build_context(cfg, torch.device("cpu"))


@needs_fmnist
def test_scd_without_gm_distillation_uploads_exactly_fedavgs_update():
    ctx = _ctx()
    fa = ALGORITHMS["fedavg"](ctx)
    server = fa.server_init()
    up_fa, _ = fa.client_update(1, 0, server, None)
    plain = ALGORITHMS["scd"](ctx, lam_g=0.0)
    up, st = plain.client_update(1, 0, server, None)
    assert all(torch.equal(up.payload[n], up_fa.payload[n]) for n in up.payload)    # Table 5 "w/o SCD-GM"
    assert up.overlap_samples > 0 and up.samples == up_fa.samples + up.overlap_samples
    # the PM is trained from w_p^{t-1} (the initial weights), not from the uploaded GM
    assert any(not torch.equal(st["params"][n], up.payload[n]) for n in up.payload)
    # with the spectral term (a large lambda, so it shows after a few steps), the GM update changes
    _, st_pm = plain.client_update(1, 0, server, None)
    up2, _ = ALGORITHMS["scd"](ctx, lam_g=50.0).client_update(2, 0, server, st_pm)
    up2_fa, _ = fa.client_update(2, 0, server, None)
    assert any(not torch.equal(up2.payload[n], up2_fa.payload[n]) for n in up2.payload)


@needs_fmnist
def test_scd_loss_terms_are_eq4_and_eq5():
    """GM: CE + lambda_G D(s_hat(w_G) || s_hat(w_p)) on the first ceil(tau d) entries; PM: CE + lambda_p
    D(s(w_p) || s(w_G,i)) on the full spectrum; the teacher side is the given (detached) target."""
    from pflrepro.core.training import ModelView
    ctx = _ctx()
    algo = ALGORITHMS["scd"](ctx, lam_g=0.5, lam_p=2.0, tau=0.4)
    net = ctx.model(0, ctx.init_state)
    other = {n: t + 0.01 * torch.randn_like(t) if t.is_floating_point() else t for n, t in ctx.init_state.items()}
    x, y = ctx.data.client_train(0)
    x, y = x[:8], y[:8]
    names = algo.names
    assert names and all(n.endswith(".weight") for n in names)
    ce = torch.nn.functional.cross_entropy(net(x), y).item()
    m = ModelView(net)
    gm = algo.gm_loss(m, x, y, algo.aux(1, 0, {}, {"params": other})).item()
    want_gm = ce + 0.5 * divergence(normalise(truncate(spectrum(dict(net.named_parameters()), names), 0.4)),
                                    normalise(truncate(spectrum(other, names), 0.4))).item()
    assert gm == pytest.approx(want_gm, rel=1e-5) and gm > ce
    pm = algo.pm_loss(m, x, y, {"target": algo.target(other, 1.0)}).item()
    want_pm = ce + 2.0 * divergence(normalise(spectrum(dict(net.named_parameters()), names)),
                                    normalise(spectrum(other, names))).item()
    assert pm == pytest.approx(want_pm, rel=1e-5) and pm > ce


@needs_fmnist
def test_scd_learns_gm_and_pm(store):
    res = run(small_cfg(algorithm="scd", partition="shards", partition_params={"s": 2}, subsample=0.1, rounds=3),
              progress=False)
    assert res.metric("pm_acc_mean")[-1] > 0.7, res.metric("pm_acc_mean")
    assert res.metric("gm_acc")[-1] > 0.3, res.metric("gm_acc")      # 2 classes per client: GM lags
    assert (torch.tensor(res.metric("sim_time")).diff() > 0).all()


# ---------------------------------------------------------------- the simulated clock
def _clock(protocol, pm_budget="epochs"):
    p = check_params("clock", {"protocol": protocol, "pm_budget": pm_budget, "gflops": 1.0, "uplink_mbps": 8.0,
                               "downlink_mbps": 80.0, "sigma": 0.0, "server_s": 0.5}, CLOCK_SCHEMA)
    return Clock(p, n_clients=2, seed=0, flops_per_sample=1e6 / 3, model_bytes=10_000_000)  # 1 ms per sample


def _up(samples, pm):  # bytes: 2e6 up at 1e6 B/s = 2 s; 1e7 down at 1e7 B/s = 1 s
    return SimpleNamespace(samples=samples, overlap_samples=pm, bytes_up=2_000_000, bytes_down=10_000_000)


def test_clock_compute_and_wait_vs_wait_free_hand_computed():
    cw, wf = _clock("compute_and_wait"), _clock("wait_free")
    ups = [_up(3000, 2000), _up(1500, 1000)]          # client 0: GM 1 s, PM 2 s; client 1: GM 0.5 s, PM 1 s
    # CW: client 0 arrives at 1 (down) + 1 + 2 + 2 (up) = 6; round ends at 6 + 2 x 0.5 (server, 2 updates) = 7
    # WF: client 0 arrives at 1 + 1 + 2 = 4 -> 5; its PM runs 2..4, free again at 4 < 5 + 1
    assert cw.end_round([0, 1], ups) == pytest.approx({"sim_time": 7.0, "sim_time_cw": 7.0, "sim_time_wf": 5.0})
    assert wf.end_round([0, 1], ups) == pytest.approx({"sim_time": 5.0, "sim_time_cw": 7.0, "sim_time_wf": 5.0})
    assert wf.ready["wait_free"].tolist() == pytest.approx([4.0, 2.5])   # client 1: GM 1..1.5, PM 1.5..2.5
    assert cw.end_round([0, 1], ups)["sim_time"] == pytest.approx(14.0)
    assert wf.end_round([0, 1], ups)["sim_time"] == pytest.approx(10.0)
    # a PM longer than the wait delays the next GM: PM 6 s, free at 1 + 1 + 6 = 8 > 4.5 + 1
    slow = _clock("wait_free")
    slow.end_round([0], [_up(7000, 6000)])
    assert slow.now == pytest.approx(4.5) and slow.ready["wait_free"][0] == pytest.approx(8.0)
    assert slow.end_round([0], [_up(7000, 6000)])["sim_time"] == pytest.approx(8.0 + 1.0 + 2.0 + 0.5)


def test_clock_wait_free_window_caps_pm_steps():
    wf = _clock("wait_free", "window")
    wf.begin_round([0, 1], {0: 1000, 1: 500})
    # predicted from the model size both ways (1e7 B: up 10 s, down 1 s): client 0 starts at 1, its GM is
    # done at 2 and arrives at 12; the round ends at 12 + 2 x 0.5 = 13; the next model arrives at 14: window 12 s
    assert wf.pm_steps(0, batch_size=10, cap_steps=100) == 100             # 100 steps = 1 s fits
    assert wf.pm_steps(0, batch_size=10, cap_steps=5000) == 1200           # 12 s / 10 ms
    cw = _clock("compute_and_wait", "window")
    cw.begin_round([0, 1], {0: 1000, 1: 500})
    assert cw.pm_steps(0, batch_size=10, cap_steps=5000) == 5000           # only wait-free has a window


def test_clock_state_round_trips_and_time_to_target():
    wf = _clock("wait_free")
    wf.end_round([0, 1], [_up(3000, 2000), _up(1500, 1000)])
    other = _clock("wait_free")
    other.load(wf.state())
    assert other.t == wf.t and all(other.ready[p].tolist() == wf.ready[p].tolist() for p in wf.ready)
    hist = [{"pm_acc_mean": 0.3, "sim_time": 5.0}, {"pm_acc_mean": 0.45, "sim_time": 10.0},
            {"pm_acc_mean": 0.5, "sim_time": 15.0}]
    assert time_to(hist, "pm_acc_mean", 0.4) == 10.0
    assert math.isnan(time_to(hist, "pm_acc_mean", 0.8))


def test_clock_rates_are_seeded_lognormal_and_validated():
    p = check_params("clock", {"sigma": 0.5}, CLOCK_SCHEMA)
    a, b = Clock(p, 1000, 0, 1e6, 1), Clock(p, 1000, 0, 1e6, 1)
    assert (a.rate == b.rate).all() and a.rate.std() > 0
    assert a.rate.mean() == pytest.approx(5e9, rel=0.1)                    # mean-preserving spread
    with pytest.raises(ConfigError, match="clock.protocol"):
        RunConfig.from_dict(small_cfg(clock={"protocol": "async"}))


# ---------------------------------------------------------------- new clients (Fig. 3)
def test_new_clients_never_train_and_are_not_scored():
    import numpy as np

    from pflrepro.core.schedule import sample_clients
    cfg = RunConfig.from_dict(small_cfg(n_clients=10, new_clients=3, participation=0.5))
    picked = {k for rnd in range(1, 30) for k in sample_clients(cfg, rnd, np.ones(10))}
    assert picked <= set(range(7)) and len(sample_clients(cfg, 1, np.ones(10))) == 4   # round(0.5 * 7)
    with pytest.raises(ConfigError, match="new_clients"):
        RunConfig.from_dict(small_cfg(n_clients=4, new_clients=4))


@needs_fmnist
def test_new_clients_fine_tune_the_final_gm(store):
    from pflrepro.papers.newclients import new_client_accuracy
    res = run(small_cfg(n_clients=6, new_clients=2, rounds=2, subsample=0.03), progress=False)
    assert all(np.isnan(res.per_client[-1][k]) for k in (4, 5))            # never trained, never scored
    assert not any(np.isnan(res.per_client[-1][k]) for k in range(4))
    zero, five = new_client_accuracy(res, 0), new_client_accuracy(res, 5)
    assert zero["clients"] == [4, 5] and 0.0 <= zero["acc"] <= 1.0
    assert five["acc"] != zero["acc"]                                      # fine-tuning moved the model
    assert five == new_client_accuracy(res, 5)                             # seeded: the same twice
