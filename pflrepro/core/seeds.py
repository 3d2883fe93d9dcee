"""Seeds: every random stream of a run is derived from the config's seed and named parts."""
from __future__ import annotations

import numpy as np


def derive_seed(*parts: int) -> int:
    """A 63-bit seed from integers (run seed, round, client, purpose): independent of
    call order, so a resumed run draws exactly what an uninterrupted one draws."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(2, np.uint64)[0] >> np.uint64(1))
