"""What a grid costs before it runs (pflrepro.pipeline.budget): FLOPs by hand, time from a rate, the estimate against a run."""
from __future__ import annotations

import pytest

from pflrepro.federation.config import RunConfig
from pflrepro.pipeline import budget, experiments, parallel

from .conftest import FMNIST_AVAILABLE, small_cfg


def test_forward_flops_of_the_mlp_by_hand():
    # 784 -> 512 -> 256 -> 64 -> 10, 2 FLOPs per multiply-add (torch's counter; biases not counted)
    assert budget.forward_flops("mlp", "fmnist") == 2 * (784 * 512 + 512 * 256 + 256 * 64 + 64 * 10)


def test_run_flops_are_three_forward_passes_per_sample_pass():
    cfg = RunConfig.from_dict(small_cfg(model="mlp", rounds=2))
    # 2 rounds x 10 clients x 300 images x 0.8 train share x 1 epoch = 4,800 sample passes
    assert budget.run_flops(cfg) == pytest.approx(3 * 1_099_008 * 4800)
    hetero = cfg.replace(algorithm="fedproto", models=("mlp", "cnn_cifar10"))   # costed at their mean
    mean = (budget.forward_flops("mlp", "fmnist") + budget.forward_flops("cnn_cifar10", "fmnist")) / 2
    assert budget.run_flops(hetero) == pytest.approx(3 * mean * 4800)


def test_grid_cost_totals_from_a_rate(monkeypatch):
    monkeypatch.setattr(budget, "train_rate", lambda *a, **k: 1e9)   # 1 GFLOP/s for every model
    a = RunConfig.from_dict(small_cfg(model="mlp", rounds=2))
    b = a.replace(seed=1, rounds=4)
    cost = budget.grid_cost([a, b, a], jobs=2, gpu_flops=1e12)       # the repeated config is one run
    flops = 3 * 1_099_008 * 4800 * (1 + 2)
    t = cost["total"]
    assert t["runs"] == 2 and t["tflops"] == pytest.approx(flops / 1e12)
    assert t["cpu_hours"] == pytest.approx(flops / 1e9 / 3600)
    assert t["wall_hours"] == pytest.approx(t["cpu_hours"] / 2)
    assert t["gpu_hours"] == pytest.approx(flops / 1e12 / 3600)
    assert [r["runs"] for r in cost["rows"]] == [2]
    text = budget.describe(cost, "t")
    assert "cost of 2 runs" in text and "mlp on fmnist (B=32)" in text and "1.0 GFLOP/s" in text


def test_a_measured_rate_is_positive_and_restores_threads():
    import torch
    before = torch.get_num_threads()
    assert budget.train_rate("mlp", "fmnist", 16, 1) > 1e7
    assert torch.get_num_threads() == before


@pytest.mark.skipif(not FMNIST_AVAILABLE, reason="needs offline Fashion-MNIST")
def test_the_estimate_counts_the_samples_a_run_trains_and_a_paper_grid_announces_it(tmp_path, capfd):
    cfg = RunConfig.from_dict(small_cfg(rounds=2, subsample=0.02))
    res = experiments.run_grid({("fedavg", "s", 0): cfg}, root=tmp_path, progress=False, jobs=1,
                               announce_cost=True)[("fedavg", "s", 0)]
    # FedAvg trains exactly the participating clients' train shares: the estimate is the run's own count
    assert res.provenance["train_samples"] == pytest.approx(parallel.work(cfg), rel=0.01)
    assert res.provenance["train_flops_estimate"] == pytest.approx(budget.run_flops(cfg), rel=0.01)
    err = capfd.readouterr().err
    assert "[grid] cost of 1 runs to train" in err and ">= " in err
