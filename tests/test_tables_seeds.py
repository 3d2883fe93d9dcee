"""Each seed's values beside the means (`repro_seeds`, `<column>_seeds`): what the claims checker pairs seeds with
must belong to the row it sits on (issue 31). Hand-made curves and runs, no training."""
from __future__ import annotations

import numpy as np
import pandas as pd

from pflrepro.reporting import tables
from pflrepro.reporting.claims import _parse_seeds


def curves() -> pd.DataFrame:
    """Two methods whose names sort against the order they appear in, three seeds, 8 rounds."""
    rows = []
    for method, base in (("zeta", 50.0), ("alpha", 80.0)):
        for seed in range(3):
            for rnd in range(1, 9):
                rows.append({"method": method, "dataset": "d", "setting": "s", "panel": "d s", "seed": seed,
                             "round": rnd, "acc": base + rnd + 10 * seed})
    return pd.DataFrame(rows)


def test_at_rounds_seeds_belong_to_their_row():
    t = tables.at_rounds(curves(), "acc")
    for r in t.to_dict("records"):
        seeds = _parse_seeds(r["repro_seeds"])
        assert len(seeds) == 3 and np.mean(list(seeds.values())) == r["reproduced"], r
    assert sorted(t.fraction.unique()) == [0.25, 0.5, 0.75, 1.0]


def test_over_seeds_and_rounds_to_target():
    c = curves()
    per = pd.DataFrame({"k": ["b", "a", "b", "a"], "seed": [0, 0, 1, 1], "v": [1.0, 5.0, 3.0, 7.0]})
    out = tables.over_seeds(per, ["k"], ["v"])
    assert out.set_index("k").loc["b", "v"] == 2.0 and _parse_seeds(out.set_index("k").loc["b", "v_seeds"]) == {0: 1.0, 1: 3.0}
    # target: alpha's last round (88, 98, 108 by seed); zeta (58..) never reaches it: blank on every seed
    reach = tables.rounds_to_target(c, "alpha", "acc").set_index("method")
    assert reach.loc["alpha", "reproduced"] == 8.0 and np.isnan(reach.loc["zeta", "reproduced"])
    assert _parse_seeds(reach.loc["zeta", "repro_seeds"]).keys() == {0, 1, 2}


def test_rounds_to_shares_and_stability_hand_computed():
    c = curves()
    c.loc[(c.method == "zeta") & (c["round"] % 2 == 0), "acc"] += 4.0     # zeta zig-zags by 4 points
    t = tables.rounds_to_shares(c, "acc", shares=(0.5,)).set_index("method")
    # best final (alpha, seed s): 88 + 10 s; half of it: 44 + 5 s; zeta (51 + 10 s at round 1) reaches it at round 1
    assert t.loc["zeta", "reproduced"] == 1.0 and t.loc["alpha", "reproduced"] == 1.0
    st = tables.stability(c, "acc").set_index("method")
    # second half: rounds 5..8; alpha rises 1 a round: 1.0; zeta alternates +5, -3, +5: mean 13/3
    assert st.loc["alpha", "reproduced"] == 1.0 and abs(st.loc["zeta", "reproduced"] - 13 / 3) < 1e-9
