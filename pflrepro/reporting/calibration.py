"""How often the claims ledger's verdicts are wrong, measured: simulated tables with known effects through the
same code that judges the reproduced ones (`claims.judge`), for every claim form and quantifier the claims files
use (issue 51).

A *shape* is a claim form with its quantifier, the number of paired seeds, cells and competitors, and the noise
of one seed's value: `normal`, `t3` (Student t with 3 degrees of freedom: heavy tails) or `binom<N>` (an
accuracy counted over N test images: two methods score the same images, agreeing on 70 % of them by
construction, so a true effect of 0 often gives per-seed differences of exactly 0, and 7 images make steps of
14 points). Every seed also moves every method of a cell together by a partition effect (sd 5 points), which
pairing removes, as in the real tables.

`rates(shape, variant, draws)` simulates `draws` tables at one *variant* of the truth and counts the verdicts:

- `boundary`: every cell and comparison exactly at the claim's boundary (a > b with a = b; a band's edge). Both
  P(holds) and P(fails) must stay at or under ALPHA = 5 %.
- `boundary_one`: one cell (or one competitor, one pair) at the boundary and the others far on the claimed side:
  the worst case for a claim that must hold everywhere (`all`, `best`) to hold wrongly.
- `boundary_rest_against`: one cell at the boundary and the others far against the claim: the worst case for an
  `any` claim to fail wrongly.
- `power1`, `power2`: every cell and comparison 1 or 2 noise standard deviations inside the claimed region
  (the sd of one seed's paired difference, estimated for the counted noises): P(holds) is the power.

Which variants a shape is checked at, and which of its two rates each bounds, is `checks(shape)`. Nothing here
reads files; `benchmarks/bench_calibration.py` runs the grid, `tests/test_calibration.py` a fast fixed-seed part.
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import claims, verdicts

FAR = 8.0                  # "far" from the boundary, in noise standard deviations
SEED_SD = 5.0              # the partition effect every method of a cell shares on a seed (points)
BASE = 80.0                # a method's accuracy level (points) for the continuous noises
BASE_P = 0.5               # ... and the probability of a correct image for the counted ones
COUNTED_FAR = 3.0          # "far" for the counted noises (7 images: 3 sds = 43 points, all an accuracy can move)
SHARED = 0.7               # the share of images two methods score alike (counted noise)
TOL = 2.0                  # a band's half-width, in noise standard deviations
RATIO_SD = 0.02            # one seed's ratio noise (ratio forms), in ratio units


@dataclass(frozen=True)
class Shape:
    form: str              # a key of FORMS
    quantifier: str = "all"
    seeds: int = 3
    cells: int = 1
    rivals: int = 1        # competitors (best, order with a list, order_all's below, margin); points-1 (trend)
    noise: str = "normal"

    def __str__(self) -> str:
        return (f"{self.form} q={self.quantifier} seeds={self.seeds} cells={self.cells} rivals={self.rivals} "
                f"noise={self.noise}")


# ------------------------------------------------------------------ noise
def _noise(rng: np.random.Generator, kind: str, size) -> np.ndarray:
    """Method noise of one seed's value with variance 1/2 (a paired difference: variance 1)."""
    if kind == "t3":
        return rng.standard_t(3, size) * math.sqrt(0.5 / 3.0)
    return rng.normal(0.0, math.sqrt(0.5), size)


def _counted(n: int) -> int | None:
    return int(n[5:]) if isinstance(n, str) and n.startswith("binom") else None


def counted_sd(n_images: int, p: float = BASE_P, shared: float = SHARED) -> float:
    """The sd (points) of one seed's difference between two methods of equal accuracy p counted over n images,
    a share `shared` of which they score alike: 100 sqrt(2 p (1 - p) (1 - shared) / n)."""
    return 100.0 * math.sqrt(2 * p * (1 - p) * (1 - shared) / n_images)


class Truth:
    """The true mean of every (cell, method) (points, or ratio for a `value` column) and how a table is drawn."""

    def __init__(self, shape: Shape):
        self.shape = shape
        self.n_img = _counted(shape.noise)
        self.unit = counted_sd(self.n_img) if self.n_img else 1.0     # one noise sd, in points
        if shape.form == "near_value":     # one seed's value against a printed constant: nothing pairs it
            self.unit = math.sqrt(SEED_SD ** 2 + (self.unit ** 2 / 2))

    def draw(self, rng: np.random.Generator, means: dict) -> pd.DataFrame:
        """One simulated table: `means` {(cell, method): true mean}; per seed, paired within a cell."""
        sh, n = self.shape, self.shape.seeds
        cells = sorted({c for c, _ in means})
        rows = []
        part = rng.normal(0.0, SEED_SD, n)     # a seed's partition moves every method of every cell together
        for c in cells:
            methods = [m for cc, m in means if cc == c]
            if self.n_img:
                u = rng.random((n, self.n_img))       # the images' shared difficulty, per seed
            for m in methods:
                mu = means[(c, m)]
                if self.n_img:
                    own = rng.random((n, self.n_img))
                    pick = np.where(rng.random((n, self.n_img)) < SHARED, u, own)
                    p = np.clip((mu + part) / 100.0, 0.0, 1.0)[:, None]
                    vals = 100.0 * (pick < p).mean(axis=1)
                else:
                    vals = mu + part + _noise(rng, sh.noise, n)
                rows.append(_row(c, m, vals, self.n_img))
        return pd.DataFrame(rows)


def _row(cell: str, method: str, vals: np.ndarray, n_img: int | None) -> dict:
    return {"dataset": "sim", "setting": cell, "method": method, "reproduced": float(np.mean(vals)),
            "repro_std": float(np.std(vals, ddof=1)) if len(vals) > 1 else float("nan"), "seeds": len(vals),
            "repro_seeds": ";".join(f"{i}:{v:.10g}" for i, v in enumerate(vals)),
            "test_n": float(n_img) if n_img else float("nan")}


# ------------------------------------------------------------------ the forms: a claim and its truth at a distance
# Each form takes the shape, the Truth and `d(i, j)`: the distance from the boundary (noise sds; a band: the
# effect itself) of cell i's comparison j, and returns (claim, {(cell, method): true mean}).
def _claim(form: str, **kw) -> dict:
    return {"id": f"sim-{form}", "quote": "a simulated claim sentence", "where": {"stage": "sim"}, "form": form, **kw}


def _level(t: Truth) -> float:
    return 100.0 * BASE_P if t.n_img else BASE


def _cells(shape: Shape) -> list[str]:
    return [f"c{i}" for i in range(shape.cells)]


def _order(shape: Shape, t: Truth, d) -> tuple[dict, dict]:
    """a > b per cell: a - b = d(i, 0)."""
    base, means = _level(t), {}
    for i, c in enumerate(_cells(shape)):
        means[(c, "a")] = base + d(i, 0) * t.unit
        means[(c, "b")] = base
    return _claim("order", a="a", b="b", quantifier=shape.quantifier), means


def _against_each(shape: Shape, t: Truth, d) -> dict:
    base, means = _level(t), {}
    for i, c in enumerate(_cells(shape)):
        means[(c, "a")] = base
        for j in range(shape.rivals):
            means[(c, f"b{j}")] = base - d(i, j) * t.unit
    return means


def _order_list(shape: Shape, t: Truth, d) -> tuple[dict, dict]:
    """a > each of b0..b(m-1): a - bj = d(i, j)."""
    bs = [f"b{j}" for j in range(shape.rivals)]
    return _claim("order", a="a", b=bs, quantifier=shape.quantifier), _against_each(shape, t, d)


def _best(shape: Shape, t: Truth, d) -> tuple[dict, dict]:
    """a beats every other method of the cell: a - bj = d(i, j)."""
    return _claim("best", a="a", quantifier=shape.quantifier), _against_each(shape, t, d)


def _order_all(shape: Shape, t: Truth, d, pairs: str = "all") -> tuple[dict, dict]:
    """above {a0, a1} > below {b0..b(m-1)}: a0 - b0 = d(i, 0), every other pair d(i, 1)."""
    base, means = _level(t), {}
    bs = [f"b{j}" for j in range(shape.rivals)]
    for i, c in enumerate(_cells(shape)):
        d0, rest = d(i, 0), d(i, 1)
        means[(c, "b0")] = base
        means[(c, "a0")] = base + d0 * t.unit
        means[(c, "a1")] = base + rest * t.unit                      # a1 - b0 = rest
        for b in bs[1:]:
            means[(c, b)] = base + (d0 - rest) * t.unit              # a0 - b = rest, a1 - b = 2 rest - d0
    return _claim("order_all", above=["a0", "a1"], below=bs, quantifier=shape.quantifier, pairs=pairs), means


def _trend(shape: Shape, t: Truth, d, steps: str = "all") -> tuple[dict, dict]:
    """An increasing series of rivals + 1 points (along `setting`) per cell (a method each): its ends differ by
    d(i, 0) sds, in equal steps."""
    base, means, pts = _level(t), {}, shape.rivals + 1
    for i in range(shape.cells):
        for j in range(pts):
            means[(f"x{j}", f"m{i}")] = base + d(i, 0) * t.unit * j / (pts - 1)
    order = [f"x{j}" for j in range(pts)]
    return _claim("trend", direction="increasing", steps=steps, order=order, quantifier=shape.quantifier), means


def _peak(shape: Shape, t: Truth, d) -> tuple[dict, dict]:
    """A series of max(rivals + 1, 3) points per cell: the first interior point d(i, 0) sds above both ends, the
    other interior points d(i, 1)."""
    base, means, pts = _level(t), {}, max(shape.rivals + 1, 3)
    for i in range(shape.cells):
        for j in range(pts):
            lift = 0.0 if j in (0, pts - 1) else (d(i, 0) if j == 1 else d(i, 1))
            means[(f"x{j}", f"m{i}")] = base + lift * t.unit
    order = [f"x{j}" for j in range(pts)]
    return _claim("trend", direction="peak", order=order, quantifier=shape.quantifier), means


def _band(shape: Shape, t: Truth, d, target_sd: float = 0.0) -> tuple[dict, dict]:
    """near diff: a - b = d(i, 0) sds, claimed within target ± TOL sds (a target above 0 is also a side)."""
    base, means = _level(t), {}
    for i, c in enumerate(_cells(shape)):
        means[(c, "a")] = base + d(i, 0) * t.unit
        means[(c, "b")] = base
    return _claim("near", quantity="diff", a="a", b="b", target=target_sd * t.unit, tolerance=TOL * t.unit,
                  quantifier=shape.quantifier), means


def _margin(shape: Shape, t: Truth, d) -> tuple[dict, dict]:
    """near margin: a - b0 = d(i, 0) (b0 the leader), a - bj = d(i, 1) for the others; claimed within
    MARGIN ± TOL sds (a high, the competitors below it: a counted accuracy must stay in [0, 100])."""
    base, means = (85.0 if t.n_img else _level(t)), {}
    for i, c in enumerate(_cells(shape)):
        means[(c, "a")] = base
        means[(c, "b0")] = base - d(i, 0) * t.unit
        for j in range(1, shape.rivals):
            means[(c, f"b{j}")] = base - d(i, 1) * t.unit
    return _claim("near", quantity="margin", a="a", target=MARGIN * t.unit, tolerance=TOL * t.unit,
                  quantifier=shape.quantifier), means


def _value(shape: Shape, t: Truth, d) -> tuple[dict, dict]:
    """near value: each cell's reproduced value - its paper column (= the level) is d(i, 0) sds; claimed within
    ± TOL sds."""
    base = _level(t)
    means = {(c, "a"): base + d(i, 0) * t.unit for i, c in enumerate(_cells(shape))}
    return _claim("near", quantity="value", tolerance=TOL * t.unit, quantifier=shape.quantifier), means


def _ratio(shape: Shape, t: Truth, d, band: bool = False) -> tuple[dict, dict]:
    """a / b = 1 + d(i, 0) RATIO_SD per cell, claimed at least 1 (band: within [1, 1 + 2 TOL RATIO_SD])."""
    kw = {"at_least": 1.0, "at_most": 1.0 + 2 * TOL * RATIO_SD} if band else {"at_least": 1.0}
    means = {}
    for i, c in enumerate(_cells(shape)):
        means[(c, "a")] = 1.0 + d(i, 0) * RATIO_SD
        means[(c, "b")] = 1.0
    return _claim("ratio", num="a", den="b", quantifier=shape.quantifier, **kw), means


def _near_ratio(shape: Shape, t: Truth, d) -> tuple[dict, dict]:
    """near ratio: a / b = 1 + d(i, 0) RATIO_SD, claimed within (1 + (TOL + 1) RATIO_SD) ± TOL RATIO_SD, above 1."""
    claim, means = _ratio(shape, t, d)
    target = 1.0 + (TOL + 1.0) * RATIO_SD
    return _claim("near", quantity="ratio", a="a", b="b", target=target, tolerance=TOL * RATIO_SD,
                  quantifier=shape.quantifier), means


MARGIN = TOL + 1.0         # the margin claimed (sds): its band [1, 1 + 2 TOL] lies above 0
FORMS = {
    "order": _order, "order_list": _order_list, "best": _best, "order_all": _order_all,
    "order_all_any": lambda s, t, d: _order_all(s, t, d, "any"), "trend": _trend,
    "trend_ends": lambda s, t, d: _trend(s, t, d, "ends"), "peak": _peak,
    "near_diff": _band, "near_diff_side": lambda s, t, d: _band(s, t, d, target_sd=TOL + 1.0),
    "near_margin": _margin, "near_value": _value, "ratio": _ratio, "ratio_band": lambda s, t, d: _ratio(s, t, d, True),
    "near_ratio": _near_ratio,
}
RATIO_FORMS = ("ratio", "ratio_band", "near_ratio")     # drawn by `_ratio_table` (continuous noise only)
# bands: (lower edge, upper edge) of the effect, in the units `d` is in
BANDS = {"near_diff": (-TOL, TOL), "near_diff_side": (1.0, 1.0 + 2 * TOL), "near_value": (-TOL, TOL),
         "ratio_band": (0.0, 2 * TOL), "near_margin": (MARGIN - TOL, MARGIN + TOL), "near_ratio": (1.0, 1.0 + 2 * TOL)}


# ------------------------------------------------------------------ variants of the truth
def _distances(shape: Shape, variant: str):
    """d(i, j) for a variant (module docstring): the boundary B (one-sided: 0; a band: its upper edge, or its lower
    edge for `boundary_low*`), one test at B and the rest far for it (`boundary_one`) or far against it
    (`boundary_rest_against`), or every test `power` sds inside the region (a band: inside its lower edge)."""
    f = shape.form
    power = {"power1": 1.0, "power2": 2.0}.get(variant)
    if f in BANDS:
        lo, hi = BANDS[f]
        centre = (lo + hi) / 2
        if power is not None:
            return lambda i, j: lo + power
        edge = lo if variant.startswith("boundary_low") else hi
        if f == "near_margin":     # d(i, 0): the leader's margin; d(i, 1): the others' (tied, or far behind)
            one = variant.endswith("_one")
            far = COUNTED_FAR if _counted(shape.noise) else FAR
            return lambda i, j: edge if j == 0 or not one else edge + far
        if variant == "boundary_one":
            return lambda i, j: edge if (i, j) == (0, 0) else centre
        return lambda i, j: edge
    far = COUNTED_FAR if _counted(shape.noise) else FAR
    if power is not None:
        return lambda i, j: 0.0 if (f == "peak" and j == 1) else power
    if f == "peak" and variant == "boundary_one":      # every series: one interior point level with the ends
        return lambda i, j: 0.0 if j == 0 else -far
    if variant == "boundary_one":
        return lambda i, j: 0.0 if (i, j) == (0, 0) else far
    if variant == "boundary_rest_against":
        if f == "order_all_any" and shape.quantifier == "all":     # one pair at the boundary in every cell
            return lambda i, j: 0.0 if j == 0 else -far
        return lambda i, j: 0.0 if (i, j) == (0, 0) else -far
    return lambda i, j: 0.0


def truth(shape: Shape, variant: str) -> tuple[dict, dict, Truth]:
    """(claim, {(cell, method): mean}, Truth) of a shape at a variant. A counted noise whose means leave [0, 100]
    (an accuracy cannot) is refused: its boundary would not be where the shape says."""
    t = Truth(shape)
    claim, means = FORMS[shape.form](shape, t, _distances(shape, variant))
    if t.n_img and not all(SEED_SD <= m <= 100 - SEED_SD for m in means.values()):
        raise ValueError(f"{shape} at {variant}: accuracies {min(means.values()):.0f}-{max(means.values()):.0f} % "
                         f"cannot be drawn over {t.n_img} test images (an accuracy stays in [0, 100])")
    return claim, means, t


def _ratio_table(rng: np.random.Generator, shape: Shape, means: dict) -> pd.DataFrame:
    """A ratio claim's table: b per seed around BASE (with the partition effect), a = b x (ratio + noise)."""
    rows, n = [], shape.seeds
    for c in sorted({c for c, _ in means}):
        b = BASE + rng.normal(0.0, SEED_SD, n)
        r = means[(c, "a")] + _noise(rng, shape.noise, n) * math.sqrt(2.0) * RATIO_SD
        rows += [_row(c, "b", b, None), _row(c, "a", b * r, None)]
    return pd.DataFrame(rows)


def draw(rng: np.random.Generator, shape: Shape, variant: str) -> tuple[dict, pd.DataFrame]:
    claim, means, t = truth(shape, variant)
    if shape.form in RATIO_FORMS:
        return claim, _ratio_table(rng, shape, means)
    table = t.draw(rng, means)
    if shape.form == "near_value":
        table["paper"] = _level(t)
    return claim, table


def checks(shape: Shape) -> dict[str, tuple[str, ...]]:
    """{variant: the rates it bounds} for a shape: every variant at which its form and quantifier have a worst
    case (module docstring)."""
    f, q = shape.form, shape.quantifier
    both = ("holds", "fails")
    out: dict = {"boundary": both}
    if f in BANDS:
        out["boundary_low"] = both
    if f == "near_margin":
        if shape.rivals > 1:
            out["boundary_one"] = out["boundary_low_one"] = both
        return out
    tests = shape.cells * (shape.rivals if f in ("order_list", "best") else 1) + (f == "order_all")
    if f == "order_all_any" or (q == "any" and shape.cells > 1):
        out["boundary_rest_against"] = ("fails",)
    elif tests > 1 and q == "all" and f != "peak":
        out["boundary_one"] = ("holds",)
    if f == "peak" and shape.rivals >= 3:
        out["boundary_one"] = both
    return out


def rates(shape: Shape, variant: str, draws: int, seed: int = 0) -> dict:
    """P(holds), P(fails) (and their Monte Carlo standard errors) over `draws` simulated tables."""
    rng = np.random.default_rng([seed, zlib.crc32(str(shape).encode()), zlib.crc32(variant.encode())])
    counts = {"holds": 0, "fails": 0}
    for _ in range(draws):
        claim, table = draw(rng, shape, variant)
        v = claims.judge(claim, table).verdict
        if v in counts:
            counts[v] += 1
    out = {"shape": str(shape), "variant": variant, "draws": draws}
    for k, c in counts.items():
        p = c / draws
        out[f"p_{k}"] = p
        out[f"se_{k}"] = math.sqrt(max(p * (1 - p), 1e-12) / draws)
    return out


# ------------------------------------------------------------------ the grid
# form -> (quantifiers, rivals): what the claims files use of each (`quantifier`, `aggregate: mean` = most,
# `pairs: any`); rivals: competitors (best, order with a list, order_all's below, margin) or points - 1 (trend)
FORM_GRID = {
    "order": (("all", "any", "most"), (1,)), "order_list": (("all", "most"), (3, 7)),
    "best": (("all", "most"), (1, 3, 7)), "order_all": (("all", "most"), (1, 3, 7)),
    "order_all_any": (("all", "any"), (1, 3, 7)), "trend": (("all",), (2, 4)), "trend_ends": (("all",), (2, 4)),
    "peak": (("all",), (2, 4)), "near_diff": (("all", "most"), (1,)), "near_diff_side": (("all",), (1,)),
    "near_margin": (("all", "most"), (1, 3, 7)), "near_value": (("all",), (1,)), "ratio": (("all",), (1,)),
    "ratio_band": (("all",), (1,)), "near_ratio": (("all", "most"), (1,)),
}
SEEDS, CELLS, NOISES = (3, 5, 10), (1, 3, 6), ("normal", "t3", "binom7", "binom30", "binom200")
WIDE_FORMS = ("near_diff_side", "near_margin")


def grid(part: str) -> list[Shape]:
    """The shapes of one part of the calibration grid:
    - 'structure': every form x its quantifiers x cells 1, 3, 6 x its rivals, at 3 seeds, normal noise;
    - 'noise': every form (its first quantifier, its middle rivals, one cell) x seeds 3, 5, 10 x every noise;
    - 'extremes': every form at 6 cells and its most rivals, 3 seeds, t3 and 7-image noise."""
    out = []
    for form, (quants, rivals) in FORM_GRID.items():
        noises = NOISES if form not in RATIO_FORMS else ("normal", "t3")
        if form in WIDE_FORMS:     # boundaries 5 sds from 0: 72 points at 7 images, beyond what an accuracy can move
            noises = tuple(z for z in noises if z != "binom7")
        if part == "structure":
            out += [Shape(form, q, 3, k, m) for k in CELLS for q in (quants if k > 1 else quants[:1])
                    for m in rivals]
        elif part == "noise":
            out += [Shape(form, quants[0], n, 1, rivals[len(rivals) // 2], z) for n in SEEDS for z in noises]
        elif part == "extremes":
            out += [Shape(form, quants[0], 3, 6, rivals[-1], z) for z in noises if z in ("t3", "binom7", "binom30")
                    and not (z == "binom30" and "binom7" in noises)]
        else:
            raise ValueError(f"unknown part {part!r} (structure, noise, extremes)")
    return out


def evaluate_shape(shape: Shape, draws: int, power_draws: int, seed: int = 0) -> list[dict]:
    """Every check of a shape (`checks`) and its power at 1 and 2 noise sds: one row per variant with the rates,
    their Monte Carlo standard errors and, for the checked rates, whether each is within the bound (ALPHA plus
    3 Monte Carlo standard errors at the bound)."""
    rows = []
    for variant, bounded in checks(shape).items():
        r = rates(shape, variant, draws, seed)
        r["bounds"] = "+".join(bounded)
        r["ok"] = all(r[f"p_{b}"] <= bound(draws) for b in bounded)
        rows.append(r)
    for variant in ("power1", "power2"):
        r = rates(shape, variant, power_draws, seed)
        r["bounds"], r["ok"] = "", True
        rows.append(r)
    return rows


def bound(draws: int, alpha: float = verdicts.ALPHA) -> float:
    """The largest observed rate consistent with a true rate of alpha: alpha + 3 Monte Carlo standard errors."""
    return alpha + 3.0 * math.sqrt(alpha * (1 - alpha) / draws)
