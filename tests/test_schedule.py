"""FedAsync and FedBuff (SCD Table 9's asynchronous servers) on hand-computed cases, the schedule's
dispatch/collect order on the simulated clock, and an asynchronous run that learns and resumes exactly."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from pflrepro.core.schedule import SCHEDULE_SCHEMA, Asynchronous
from pflrepro.federation.config import RunConfig
from pflrepro.params import ConfigError, check_params
from pflrepro.pipeline.store import read_metrics
from tests.conftest import FMNIST_AVAILABLE, small_cfg

needs_fmnist = pytest.mark.skipif(not FMNIST_AVAILABLE, reason="needs offline Fashion-MNIST")


def _sched(**p):
    cfg = SimpleNamespace(schedule=check_params("schedule", p, SCHEDULE_SCHEMA), n_clients=4, new_clients=0, seed=0)
    return Asynchronous(cfg, np.ones(4))


def _job(k, version, w, base, arrival=0.0):
    return {"k": k, "arrival": arrival, "version": version, "weight": 1.0, "loss": 0.0,
            "payload": {"w": torch.tensor([w]), "n": torch.tensor(k)}, "base": {"w": torch.tensor([base]), "n": torch.tensor(0)}}


def test_fedasync_staleness_weighted_mix_hand_computed():
    s = _sched(mode="fedasync", alpha=0.6, staleness_a=0.5)
    server = {"params": {"w": torch.tensor([1.0]), "n": torch.tensor(0)}}
    # server step t = 4 (version 3); the client trained from version 0: staleness 3, a_t = 0.6 * 4^-0.5 = 0.3
    out = s.aggregate(None, 4, server, [_job(2, 0, 5.0, 0.0)], {})
    assert out["params"]["w"].item() == pytest.approx(0.7 * 1.0 + 0.3 * 5.0)
    assert out["params"]["n"].item() == 2                       # integer buffers: the arriving value
    fresh = s.aggregate(None, 1, server, [_job(2, 0, 5.0, 0.0)], {})   # staleness 0: a = alpha
    assert fresh["params"]["w"].item() == pytest.approx(0.4 * 1.0 + 0.6 * 5.0)


def test_fedbuff_step_is_the_staleness_scaled_mean_of_deltas():
    s = _sched(mode="fedbuff", buffer=2, server_lr=1.0)
    server = {"params": {"w": torch.tensor([10.0]), "n": torch.tensor(0)}}
    # step t = 4 (version 3): deltas +2 (staleness 0, weight 1) and -6 (trained from version 0: staleness 3, 1/2)
    out = s.aggregate(None, 4, server, [_job(0, 3, 3.0, 1.0), _job(1, 0, 0.0, 6.0)], {})
    assert out["params"]["w"].item() == pytest.approx(10.0 + (2.0 + (-6.0) / 2.0) / 2)


def test_async_collects_earliest_arrivals_and_refills_idle_clients():
    s = _sched(mode="fedbuff", buffer=2, concurrency=3)
    first = s.dispatch(1)
    assert len(first) == 3
    clock = SimpleNamespace(now=0.0, job=lambda k, up: {first[0]: 5.0, first[1]: 1.0, first[2]: 3.0}[k],
                            server_step=lambda t, n: {"sim_time": t + n})
    ups = [SimpleNamespace(weight=1.0, loss=0.5, payload={"w": torch.tensor([1.0])}) for _ in first]
    s.launch(1, first, ups, {"params": {"w": torch.tensor([0.0])}}, clock)
    arrived, sim = s.collect(1, clock)
    assert [j["k"] for j in arrived] == [first[1], first[2]] and sim == {"sim_time": 5.0}
    again = s.dispatch(2)                         # two are free: one idle slot was never used, two returned
    assert len(again) == 2 and first[0] not in again


def test_async_needs_the_base_aggregation():
    with pytest.raises(ConfigError, match="schedule.mode='fedasync'"):
        RunConfig.from_dict(small_cfg(algorithm="fedavgm", schedule={"mode": "fedasync"}))


@needs_fmnist
def test_fedbuff_run_learns_and_resumes_with_updates_in_flight(tmp_path, monkeypatch, capsys):
    """Killed after server step 3 with updates in flight; the resumed run ends with the metrics of a clean one.
    The kill is real (a `python -m pflrepro run` process, SIGKILLed by the test hook); the resume and the clean run
    call the same CLI `main` in this process (a second and third process cost about 140 s each to start on a slow
    CI-like machine; both take the same single torch thread as the killed one, tests/conftest.py)."""
    import os
    import subprocess
    import sys

    from pflrepro.__main__ import main
    from pflrepro.paths import REPO_ROOT
    from pflrepro.pipeline.store import load_result
    args = ["algorithm=fedavg", "schedule.mode=fedbuff", "schedule.buffer=2", "subsample=0.03", "n_clients=5",
            "model=cnn_cifar10", "rounds=6", "eval_every=2", "checkpoint_every=1", "batch_size=32", "lr=0.05",
            "momentum=0.9"]
    env = {**os.environ, "PFLREPRO_RESULTS": str(tmp_path / "killed"), "PFLREPRO_DIE_AFTER_ROUND": "3"}
    killed = subprocess.run([sys.executable, "-m", "pflrepro", "run", "--quiet", *args], env=env, cwd=REPO_ROOT,
                            capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr
    monkeypatch.delenv("PFLREPRO_DIE_AFTER_ROUND", raising=False)
    for store in ("killed", "clean"):
        monkeypatch.setenv("PFLREPRO_RESULTS", str(tmp_path / store))
        assert main(["run", "--quiet", *args]) == 0, capsys.readouterr().err
    (run_path,) = [p for p in (tmp_path / "killed" / "runs").iterdir() if p.is_dir()]   # a killed trainer leaves its .lock
    (clean_path,) = (tmp_path / "clean" / "runs").iterdir()
    assert read_metrics(run_path) == read_metrics(clean_path)
    res = load_result(clean_path)
    assert res.provenance["resumed_from_round"] == 0 and load_result(run_path).provenance["resumed_from_round"] == 3
    assert res.metric("gm_acc")[-1] > 0.3, res.metric("gm_acc")   # chance: 0.1
    assert (np.diff(res.metric("sim_time")) > 0).all() and np.isnan(res.metric("sim_time_wf")).all()
