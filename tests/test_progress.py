"""Progress lines for logs (`dvc repro`): the heartbeat files and the grid's runs-done / rounds / time-left line."""
import io

import pytest

from pflrepro.federation.config import RunConfig
from pflrepro.pipeline import experiments
from pflrepro.pipeline.progress import HEARTBEAT, GridLog, Heartbeat, read_round
from tests.conftest import FMNIST_AVAILABLE, small_cfg


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_heartbeat_is_throttled_and_cleared(tmp_path):
    now = Clock()
    beat = Heartbeat(tmp_path / HEARTBEAT, rounds=40, every=2.0, now=now)
    beat(1)
    now.t = 1.0
    beat(2)                                    # within 2 s of the last write: skipped
    assert read_round(tmp_path) == (1, 40)
    now.t = 2.5
    beat(3)
    assert read_round(tmp_path) == (3, 40)
    beat.clear()
    assert read_round(tmp_path) is None and not (tmp_path / HEARTBEAT).exists()


def test_grid_line_counts_runs_rounds_and_estimates_time_left(tmp_path):
    """Work 1 + 3; after 60 s the 3-work run is at round 10 of 40 (0.75 done): 60 * 3.25 / 0.75 = 260 s left.
    Then the 1-work run finishes: 60 * 2.25 / 1.75 = 77 s left."""
    p1, p2 = tmp_path / "a", tmp_path / "b"
    p1.mkdir(), p2.mkdir()
    now, out = Clock(), io.StringIO()
    log = GridLog("t", {p1: ("a / x s0", 1.0), p2: ("b / x s0", 3.0)}, total=3, every=0, stream=out, now=now)
    assert log.line() == "[t] 0/2 runs done (3 in the grid, 1 from the store) | 0:00 elapsed"
    Heartbeat(p2 / HEARTBEAT, rounds=40, every=0)(10)
    now.t = 60.0
    assert log.line() == ("[t] 0/2 runs done (3 in the grid, 1 from the store) | training: b / x s0 r10/40 | "
                          "1:00 elapsed, ~4:20 left")
    log.done(p1)
    assert out.getvalue().splitlines()[-1].endswith("training: b / x s0 r10/40 | 1:00 elapsed, ~1:17 left")
    assert out.getvalue().startswith("[t] 1/2 runs done")


@pytest.mark.skipif(not FMNIST_AVAILABLE, reason="needs offline Fashion-MNIST")
def test_run_grid_log_mode_prints_to_stderr_and_leaves_no_heartbeat(tmp_path, capfd):
    cfgs = {(m, "s", 0): RunConfig.from_dict(small_cfg(algorithm=m, rounds=1, subsample=0.02)) for m in ("fedavg", "local")}
    res = experiments.run_grid(cfgs, root=tmp_path, progress="log", jobs=1, name="tiny")
    err = capfd.readouterr().err
    assert "[tiny] 0/2 runs done (2 in the grid, 0 from the store)" in err and "[tiny] 2/2 runs done" in err, err
    assert all(not (r.path / HEARTBEAT).exists() for r in res.values())
    experiments.run_grid(cfgs, root=tmp_path, progress="log", jobs=1, name="tiny")     # all stored: nothing to say
    assert "[tiny]" not in capfd.readouterr().err
    with pytest.raises(ValueError, match="progress='yes'"):
        experiments.run_grid(cfgs, root=tmp_path, progress="yes")
