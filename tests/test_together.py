"""Runs trained together (pflrepro.core.engines.together, executor "stacked"): a grid's runs in lockstep with their clients'
local training stacked into shared calls give each run the result it has alone: bit for bit where the stacked
arithmetic does not depend on the stack (the MLP), within float rounding where it does (convolutions); each run keeps
its own store record, and a failing run fails alone."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from pflrepro.core.engines import batched, together
from pflrepro.core.training import Divergence
from pflrepro.federation.config import RunConfig
from pflrepro.params import ConfigError
from pflrepro.pipeline import executors
from pflrepro.pipeline.store import load_result, run, run_dir

from .conftest import small_cfg

ACC_ATOL = 0.02      # two test images in a hundred: float rounding moved through a few rounds (convolutions)


def _cfg(**kw) -> RunConfig:
    base = dict(subsample=0.02, n_clients=6, rounds=3, batch_size=16, lr=0.02, engine="batched", checkpoint_every=1)
    return RunConfig.from_dict(small_cfg(**{**base, **kw}))


def _alone(cfgs, root):
    return [run(c, root=root, progress=False) for c in cfgs]


def _together(cfgs, root, spy=None):
    st = together.Stacker()
    outs = st.run_all([lambda c=c: run(c, root=root, progress=False) for c in cfgs])
    if spy is not None:
        spy.extend(st.calls)
    return outs


def _metrics(res):
    drop = ("seconds", "eval_seconds")
    return [{k: v for k, v in h.items() if k not in drop} for h in res.history], res.per_client


@pytest.mark.parametrize("algorithm, hparams", [("fedavg", {}), ("pfedsd", {}), ("ditto", {})])
def test_stacked_seeds_of_an_mlp_equal_each_run_alone_bit_for_bit(tmp_path, algorithm, hparams):
    cfgs = [_cfg(algorithm=algorithm, hparams=hparams, model="mlp", seed=s) for s in (0, 1, 2)]
    want = _alone(cfgs, tmp_path / "alone")
    calls = []
    outs = _together(cfgs, tmp_path / "together", calls)
    assert all(e is None for _, e in outs), outs
    for (got, _), w in zip(outs, want):
        assert _metrics(got) == _metrics(w)
    # the three runs' clients shared every call: 6 clients x 3 runs, once a round (twice for Ditto: GM then PM)
    phases = 2 if algorithm == "ditto" else 1
    assert calls == [(3, 18)] * (3 * phases), calls


def test_stacked_runs_with_convolutions_equal_alone_within_rounding(tmp_path):
    cfgs = [_cfg(seed=s, model="cnn_cifar10") for s in (0, 1)]
    want = _alone(cfgs, tmp_path / "alone")
    outs = _together(cfgs, tmp_path / "together")
    for (got, err), w in zip(outs, want):
        assert err is None
        g, w_ = _metrics(got), _metrics(w)
        for a, b in zip(g[0], w_[0]):
            assert a["round"] == b["round"] and a["bytes_up"] == b["bytes_up"]
            for m in ("pm_acc_mean", "gm_acc"):
                assert a[m] == pytest.approx(b[m], abs=ACC_ATOL), (m, a, b)
        np.testing.assert_allclose(np.array(g[1]), np.array(w_[1]), atol=0.1)


def test_runs_of_other_settings_train_in_lockstep_but_apart(tmp_path):
    """Seeds merge; a different learning rate (arithmetic, not data) never shares a call."""
    cfgs = [_cfg(model="mlp", seed=0), _cfg(model="mlp", seed=1), _cfg(model="mlp", seed=0, lr=0.01)]
    want = _alone(cfgs, tmp_path / "alone")
    calls = []
    outs = _together(cfgs, tmp_path / "together", calls)
    for (got, _), w in zip(outs, want):
        assert _metrics(got) == _metrics(w)
    assert calls == [(2, 12)] * 3, calls       # the lr=0.01 run trained alone (its own call, not recorded here)


def test_runs_with_different_data_share_calls(tmp_path):
    """Data settings (here the partition's Dirichlet alpha and the subsample) may differ: rows are gathered. Clients
    of unequal sizes end their epochs at different steps, so a step's clients of one batch size form groups whose
    composition the other run changes: equal up to float rounding (measured: 7e-9 in round 2's loss), not bit for
    bit."""
    cfgs = [_cfg(model="mlp", seed=0, partition="dirichlet", partition_params={"alpha": a, "min_size": 5},
                 subsample=f) for a, f in ((0.5, 0.02), (5.0, 0.03))]
    want = _alone(cfgs, tmp_path / "alone")
    calls = []
    outs = _together(cfgs, tmp_path / "together", calls)
    for (got, err), w in zip(outs, want):
        assert err is None
        for a, b in zip(got.history, w.history):
            assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-6)
            assert a["pm_acc_mean"] == pytest.approx(b["pm_acc_mean"], abs=ACC_ATOL)
    assert calls == [(2, 12)] * 3, calls


def test_each_run_keeps_its_own_store_record(tmp_path):
    cfgs = [_cfg(model="mlp", seed=s) for s in (0, 1)]
    _together(cfgs, tmp_path)
    for c in cfgs:
        path = run_dir(c, tmp_path)
        prov = json.loads((path / "provenance.json").read_text())
        assert prov["trained_with_runs"] == 2 and prov["seed"] == c.seed
        assert (path / "manifest.json").exists() and not (path / "checkpoint.pt").exists()
        load_result(path)      # verified as any run
    alone = run(_cfg(model="mlp", seed=5), root=tmp_path / "a", progress=False)
    assert json.loads((alone.path / "provenance.json").read_text())["trained_with_runs"] == 1


def test_a_run_that_diverges_fails_alone(tmp_path):
    """One run's divergence is its own: the merged call is retried run by run, and the others finish as alone."""
    ok = [_cfg(model="mlp", seed=s) for s in (0, 1)]
    bad = _cfg(model="mlp", seed=2, lr=1e30)     # other lr: apart; and with lr in the stack's key it cannot merge
    want = _alone(ok, tmp_path / "alone")
    outs = _together([ok[0], bad, ok[1]], tmp_path / "together")
    assert isinstance(outs[1][1], Divergence), outs[1]
    for (got, err), w in zip([outs[0], outs[2]], want):
        assert err is None and _metrics(got) == _metrics(w)


def test_a_divergence_inside_a_merged_call_is_the_diverging_runs_own(tmp_path, monkeypatch):
    """A merged call that raises is retried run by run: only the run whose clients raise fails."""
    from pflrepro.core.engines import batched
    cfgs = [_cfg(model="mlp", seed=s) for s in (0, 1, 2)]
    want = _alone(cfgs, tmp_path / "alone")
    real = batched.train_items

    def poisoned(items):
        if any(ctx.cfg.seed == 1 and rnd == 2 for ctx, rnd, _, _ in items):
            raise Divergence("loss became nan (test)")
        return real(items)
    monkeypatch.setattr(batched, "train_items", poisoned)
    outs = _together(cfgs, tmp_path / "together")
    assert isinstance(outs[1][1], Divergence)
    for i in (0, 2):
        assert outs[i][1] is None and _metrics(outs[i][0]) == _metrics(want[i])


def test_interleaving_is_fixed(tmp_path):
    """Two stacked trainings of the same grid give the same bits (the order of turns does not depend on timing)."""
    cfgs = [_cfg(model="cnn_cifar10", seed=s) for s in (0, 1, 2)]
    a = _together(cfgs, tmp_path / "a")
    b = _together(cfgs, tmp_path / "b")
    for (x, _), (y, _) in zip(a, b):
        assert _metrics(x) == _metrics(y)


# ---------------------------------------------------------------- the executor
def test_stacked_executor_trains_a_grid_and_reports_failures(tmp_path):
    cfgs = [_cfg(model="mlp", seed=s) for s in (0, 1)] + [_cfg(model="mlp", seed=0, lr=1e30)]
    done = []
    ex = executors.resolve("stacked", None, cfgs)
    assert isinstance(ex, executors.StackedExecutor) and ex.runs is None
    with pytest.raises(Divergence):
        ex.train_all(cfgs, tmp_path, on_done=done.append)
    assert done == cfgs[:2]
    assert executors.resolve("stacked:runs=4", None, cfgs).runs == 4


@pytest.mark.parametrize("spec", ["stacked:runs=0", "stacked:runs=x", "stacked:jobs=2", "stacked:runs"])
def test_bad_stacked_options_are_refused_in_one_line(spec):
    with pytest.raises(ConfigError, match="executor="):
        executors.resolve(spec, None, [])


def test_batches_respect_the_memory_cap_and_the_run_limit():
    cfgs = [_cfg(model="mlp", seed=s) for s in range(5)] + [_cfg(model="mlp", seed=0, lr=0.01)]
    size = lambda c: 10          # noqa: E731
    assert [len(b) for b in executors.plan_batches(cfgs, cap=100, size=size)] == [5, 1]   # other settings apart
    assert [len(b) for b in executors.plan_batches(cfgs, cap=25, size=size)] == [2, 2, 1, 1]  # never over the cap
    assert [len(b) for b in executors.plan_batches(cfgs, runs=3, cap=1e9, size=size)] == [3, 2, 1]
    assert [len(b) for b in executors.plan_batches(cfgs[:2], cap=5, size=size)] == [1, 1]    # one run over: alone
    assert sum(executors.plan_batches(cfgs, cap=1e9, size=size), []) == sorted(cfgs, key=lambda c: c.lr != 0.02)


def test_run_bytes_counts_the_data_and_three_models_a_client():
    c = _cfg(model="mlp")
    from pflrepro.data.datasets import SPECS
    from pflrepro.data.models import build_model
    s = SPECS["fmnist"]
    model = sum(t.numel() * 4 for t in build_model("mlp", s.channels, s.num_classes, s.size).state_dict().values())
    assert executors.run_bytes(c) == math.ceil((s.n_train + s.n_test) * (784 * 4 + 8)) + 3 * 6 * model


def test_stack_key_ignores_seeds_and_data_only():
    from pflrepro.federation.build import build_context
    from pflrepro.algorithms import ALGORITHMS

    def key(**kw):
        c = _cfg(model="mlp", **kw)
        ctx = build_context(c, torch.device("cpu"))
        algo = ALGORITHMS[c.algorithm](ctx, **c.hparams)
        return batched.stack_key(ctx, 0, algo.plan(1, 0, algo.server_init(), None))
    base = key(seed=0)
    assert key(seed=3) == base and key(n_clients=8, participation=0.5) == base
    assert key(lr=0.03) != base and key(momentum=0.5) != base and key(batch_size=8) != base


def test_a_grid_trains_stacked_through_run_grid_and_serves_like_any_other(tmp_path):
    """`executor="stacked"` where a notebook or the CLI names it: the grid's runs land in the store, each verified, and
    a second call serves them without training."""
    from pflrepro.pipeline import experiments
    grid = {("fedavg", "s", s): _cfg(model="mlp", seed=s) for s in (0, 1, 2)}
    got = experiments.run_grid(grid, root=tmp_path, progress=False, executor="stacked")
    alone = _alone(list(grid.values()), tmp_path / "alone")
    for key, w in zip(grid, alone):
        assert _metrics(got[key]) == _metrics(w)
        assert json.loads((run_dir(grid[key], tmp_path) / "provenance.json").read_text())["trained_with_runs"] == 3
    again = experiments.run_grid(grid, root=tmp_path, progress=False, executor="stacked")
    assert all(_metrics(again[k]) == _metrics(got[k]) for k in grid)
