"""Existing results stay what they were: two tiny runs (pFedSD batched, FedPer per client with partial
participation) must reproduce the metrics in tests/golden/ (computed at one torch thread, as the tests run, by the
code of 2026-11-28 that made CPU image batches channels-last; until then the golden metrics were those of b369e49,
before the round loop learnt about simulated time and asynchronous servers: the file's note says what moved).
Compared to 1e-6 relative, not bit for bit, so that another CPU's kernels cannot fail it while any change of the
computation does. A deliberate change of the arithmetic replaces the file and says so in its note."""
import json
from pathlib import Path

import pytest

from pflrepro.pipeline.store import run
from tests.conftest import FMNIST_AVAILABLE

GOLDEN = json.loads((Path(__file__).parent / "golden" / "metrics_2026-11-28.json").read_text())


@pytest.mark.skipif(not FMNIST_AVAILABLE, reason="needs offline Fashion-MNIST")
@pytest.mark.parametrize("case", GOLDEN["runs"], ids=lambda c: c["config"]["algorithm"])
def test_metrics_unchanged_since_golden(case, store):
    res = run(case["config"], progress=False)
    assert len(res.history) == len(case["history"])
    for got, want in zip(res.history, case["history"]):
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-9), (got["round"], key)
