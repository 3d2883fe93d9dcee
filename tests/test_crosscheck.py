"""scripts/crosscheck/pfllib.py without PFLlib: what it reads from PFLlib's log, how it scores and summarises, and
the shared model (PFLlib's FedAvgCNN layout). The comparison itself needs a PFLlib checkout (docs/evidence.md)."""
import importlib.util
import math

import pytest
import torch

from pflrepro.paths import REPO_ROOT


@pytest.fixture(scope="module")
def xc():
    spec = importlib.util.spec_from_file_location("xcheck_pfllib", REPO_ROOT / "scripts" / "crosscheck" / "pfllib.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


LOG = """XCHECK_INIT {"sum": 1.5, "sumsq": 2.5}
-------------Round number: 0-------------
XCHECK_CLIENT {"fn": "test_metrics", "id": 0, "correct": 6, "n": 60, "alias": null}
XCHECK_CLIENT {"fn": "test_metrics", "id": 1, "correct": 30, "n": 40, "alias": null}
Averaged Test Accuracy: 0.3600
-------------Round number: 1-------------
XCHECK_CLIENT {"fn": "test_metrics", "id": 0, "correct": 60, "n": 60, "alias": null}
XCHECK_CLIENT {"fn": "test_metrics", "id": 1, "correct": 20, "n": 40, "alias": null}
Averaged Test Accuracy: 0.8000
"""


def test_pfllib_log_is_read_per_round_and_client_and_scored_both_ways(xc):
    recs, init, printed = xc.parse_pfllib(LOG)
    assert init == {"sum": 1.5, "sumsq": 2.5} and printed == {0: [0.36], 1: [0.8]}
    assert recs[(1, "test_metrics")] == {0: (60, 60, None), 1: (20, 40, None)}
    mean, pooled = xc.scores(recs[(0, "test_metrics")], 2)
    assert mean == pytest.approx((0.1 + 0.75) / 2) and pooled == pytest.approx(36 / 100)   # PFLlib prints pooled
    with pytest.raises(ValueError, match="1 client results, expected 2"):
        xc.scores({0: (1, 2, None)}, 2)


def test_summary_is_the_paired_difference_with_a_t_interval(xc):
    """Differences 0.01, 0.03, 0.02 over three seeds: mean 0.02, sem 0.01 / sqrt(3), t(0.975, 2) = 4.3027."""
    per_seed = [{"algorithm": "fedavg", "seed": s, "metric": "pm_mean", "ours": 0.5 + d, "pfllib": 0.5, "diff": d}
                for s, d in enumerate((0.01, 0.03, 0.02))]
    (row,) = xc.summary_table(per_seed)
    half = 4.302653 * 0.01 / math.sqrt(3)
    assert row["diff"] == pytest.approx(0.02) and row["n_seeds"] == 3
    assert (row["ci95_low"], row["ci95_high"]) == pytest.approx((0.02 - half, 0.02 + half), abs=1e-6)


def test_last_rounds_are_averaged_per_side_and_seed(xc):
    rows = [xc.row("fedavg", 0, r, side, (acc, acc), (float("nan"),) * 2, float("nan"))
            for r, side, acc in ((1, "ours", 0.1), (2, "ours", 0.3), (3, "ours", 0.5),
                                 (1, "pfllib", 0.2), (2, "pfllib", 0.2), (3, "pfllib", 0.4))]
    got = {r["metric"]: r for r in xc.per_seed_table(rows, rounds=3, last=2)}
    assert set(got) == {"pm_mean", "pm_pooled"}    # no global-model rows on either side: left out
    assert got["pm_mean"]["ours"] == pytest.approx(0.4) and got["pm_mean"]["diff"] == pytest.approx(0.1)


def test_the_shared_model_is_pfllibs_fedavgcnn_with_seed_0_weights(xc):
    net = xc.fedavg_cnn(1, 10, 28)
    assert sum(p.numel() for p in net.parameters()) == 832 + 51_264 + 524_800 + 5_130
    assert net(torch.zeros(3, 1, 28, 28)).shape == (3, 10)
    again = xc.fedavg_cnn(1, 10, 28)
    assert all(torch.equal(a, b) for a, b in zip(net.state_dict().values(), again.state_dict().values()))
