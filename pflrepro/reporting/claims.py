"""The papers' claims about their own results, checked against what a profile reproduced.

Each paper has `paper_numbers/<paper>_claims.yaml`: the sentences its abstract and results sections say
about its own tables, each quoted exactly and given a machine-checkable form over the cells of one
table a notebook writes (`results/<stage>/<table>.csv`). `check()` evaluates every claim on a results
directory (default `results/`, or `$PFLREPRO_RESULTS`, as `experiments.output_dirs`) and returns one
row per claim: its verdict, its effect with a 95 % interval, the same effect on the paper's own printed numbers
and the verdict there, the competitors absent, the smallest per-client test set behind it, the runs it read,
and the numbers that decided it. `python -m pflrepro claims` prints it.

VERDICTS (pflrepro/reporting/verdicts.py has the statistics and the rule in full):
- **holds**: the 95 % interval of the claim's effect lies on the claimed side (for a magnitude: on the claimed
  side and consistent with the claimed magnitude); **partial**: it holds among the competitors that ran, but
  some of the paper's competitors did not run (a `best` claim over 3 of the paper's 7 methods);
- **fails**: the interval lies on the other side, or excludes the claimed magnitude, or (quantifier `all`) one
  cell is decidedly against the claim at the Bonferroni level;
- **inconclusive**: the interval straddles, and the profile could have detected the paper's own effect;
- **underpowered**: the interval straddles and the minimum detectable effect at this profile's seeds and spread
  exceeds the paper's own effect, or there is no interval (fewer than 3 seeds: no verdict from an assumed noise);
- **by design**: a quantity fixed by construction (exact byte counts, the simulated clock's speedups, code
  invariants: the claim's `by_design` says why); evaluated and shown, never counted as support;
- **not run**: its table, profile, cells or methods are not in the outputs.

EFFECTS. A form turns a claim into comparisons (each all must hold), each an effect per cell, computed per seed
over the seeds its values share (paired: seed s draws one partition and initialisation for every method; the
table's `repro_seeds` column, "seed:value;...", or `<column>_seeds` for another column), pooled over the cells
(the mean of the cells' means; a stratified bootstrap over seeds gives the interval). Values without per-seed
entries carry their std over `seeds` (or, for the papers' printed numbers, over the file's `paper_seeds`, default
3) and get a delta-method t interval. `noise: none` values are exact.

Forms (fields beyond the common ones; a *ref* is a method name or a mapping of column filters,
optionally with `column:`/`std:` to read another value column, e.g. `{tau: 3}` or
`{column: last local model}`):

- `order`      a > b (b may be a list: a > each, one comparison per b), optionally `by:` a margin in the column's
               units (a negative `by` reads "as good as": a > b - margin). Effect: a - b.
- `order_all`  every ref in `above` > every ref in `below` in a cell (`pairs: any`: at least one pair): one paired
               comparison per pair, each pooled over the cells; a pair fails the claim only at the Bonferroni level
               over the pairs (`any`: one pair holds at that level).
- `best`       a (or the best of a list, by its mean) beats every other method of the cell, or of `among` (minus
               `exclude`): one paired comparison per competitor (a - b per seed), all must hold, one decidedly
               against at the Bonferroni level over the competitors fails it; the effect shown is the closest
               competitor's. (Not "a minus each seed's best competitor": the maximum of several noisy competitors is
               above each of them, and would fail a method level with them.) Competitors the paper's own table has
               that did not run here make a holding claim `partial`.
- `trend`      a series along an ordered column (`along:` setting by default; `order:` the values, or the values
               present sorted by the number in them) is `increasing`, `decreasing` or has an interior `peak`; one
               series per ref in `series` (default: each method present), or, along `method`, one per cell. The
               series are pooled like cells. Increasing/decreasing: the effect is last - first (in the direction),
               and with `steps: all` (default) no single step may be decidedly against the direction (a guard at
               the Bonferroni level); `steps: ends`: the ends only ("tends to"). Peak: the highest interior point
               (by its mean) minus the higher end of the seed; a monotone series fails it.
- `ratio`      num / den (num may be a list: one comparison each), or a column that already is a ratio (`value:`
               ref, e.g. a speedup), against `at_least` and/or `at_most` (both: a band).
- `near`       a quantity within `tolerance` of a printed number: `value` (each cell against its `paper` column),
               `diff` (a - b), `ratio` (a / b) or `margin` (a - the other method with the best mean, paired over
               seeds) against `target`; diff,
               ratio and margin must also be on the target's side of 0 (ratio: of 1).

Common fields: id, quote (verbatim; a sentence broken by a table in the source joins its parts with
"[...]"), section, where {stage, table}, form, column (default `reproduced`), std (default
`repro_std` for `reproduced`, `<column>_std` otherwise), select {column: value or list} (the cells a claim is about;
default all), group_by (cell keys; default the key columns dataset/setting/panel/metric/method present and not used
by the refs), quantifier over cells (`all` default, `most` = the pooled effect alone, `any` = one cell at the
Bonferroni level), aggregate (`mean`: the pooled effect alone, as `most`; `max`: the cell with the largest effect,
alone), better (`higher` default / `lower`), noise (`seeds` default / `none` for exact measurements: bytes, MACs),
missing (`skip` default; `worst` or `fails`: a blank value, e.g. a target never reached, counts as the worst
possible value, so the method lost), profiles (run only on these profiles' outputs), paper_datasets (the datasets
the paper's sentence is about; other datasets are reported as a stand-in), paper_view (how the claim reads
`paper_numbers/` for the self-check, or false), note, paper_inconsistent (where the paper's own numbers contradict
its sentence: said, not hidden), by_design (why the quantity is fixed by construction), headline (an abstract or
main 'best' claim: listed first). `min_gap` (an assumed noise, no longer used) is accepted in old files.

`check(source="paper")` evaluates the same claims on the paper's own printed numbers
(`paper_numbers/<paper_table>.csv` of the stage's params file, or `paper_numbers/<stage>.csv` for a stage
not built yet; its printed std over `paper_seeds` where it has one, else the point values alone): a claim that
fails there is either mis-encoded or marked `paper_inconsistent`, and one so marked must not hold there
(tests/test_claims.py). Every reproduced row carries that paper-side effect and verdict.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from ..params import did_you_mean
from . import verdicts
from .verdicts import Region, Sample

REPO_ROOT = Path(__file__).resolve().parents[2]   # = paths.REPO_ROOT (not imported: no torch for a checklist)
CLAIMS_DIR = REPO_ROOT / "paper_numbers"
VERDICTS = verdicts.VERDICTS
DEFAULT_PAPER_SEEDS = 3
SMALL_TEST = 30          # a per-client test set under this many images is named beside the verdict
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
KEY_COLUMNS = ("dataset", "setting", "panel", "metric", "method")
# the columns of an accuracy table (`tables.compare`) that its `test_n` (effective test images) is behind
ACCURACY_COLUMNS = ("reproduced", "last10", "last_tenth")
ROBUST_COLUMN = "last_tenth"   # the metric-robustness reading: the mean over the last tenth of the evaluations


COMMON = {"id", "quote", "where", "form", "section", "column", "std", "select", "group_by", "quantifier",
          "aggregate", "better", "min_gap", "noise", "missing", "profiles", "paper_datasets", "paper_view",
          "note", "paper_inconsistent", "by_design", "headline"}
TOP = {"paper", "source", "min_gap", "paper_datasets", "planned_stages", "scale_notes", "claims", "paper_seeds"}
FORMS = {  # form -> (required fields, optional fields)
    "order": ({"a", "b"}, {"by"}),
    "order_all": ({"above", "below"}, {"pairs"}),
    "best": ({"a"}, {"among", "exclude"}),
    "trend": ({"direction"}, {"along", "order", "series", "steps"}),
    "ratio": (set(), {"num", "den", "value", "at_least", "at_most"}),
    "near": ({"quantity", "tolerance"}, {"a", "b", "target", "paper_column", "paper_std", "among", "exclude"}),
}
CHOICES = {"quantifier": ("all", "most", "any"), "aggregate": ("mean", "max"), "better": ("higher", "lower"),
           "noise": ("seeds", "none"), "missing": ("skip", "fails", "worst"), "pairs": ("all", "any"),
           "direction": ("increasing", "decreasing", "peak"), "steps": ("all", "ends"),
           "quantity": ("value", "diff", "ratio", "margin")}


class ClaimsError(ValueError):
    """A claims file that does not validate; the message names the file and the claim id."""


# ------------------------------------------------------------------ loading and validation
def claims_files() -> list[Path]:
    return sorted(CLAIMS_DIR.glob("*_claims.yaml"))


def load(path: Path | str) -> dict:
    """Read and validate one claims file: {paper, claims: [...], ...}. Any problem is one ClaimsError
    naming the file and the claim id."""
    path = Path(path)
    doc = yaml.load(path.read_text(), Loader=_LOADER) or {}
    where = path.name
    if not isinstance(doc, dict) or "paper" not in doc or not isinstance(doc.get("claims"), list):
        raise ClaimsError(f"{where}: needs top-level 'paper' and a list 'claims'")
    unknown = sorted(set(doc) - TOP)
    if unknown:
        raise ClaimsError(f"{where}: unknown top-level key(s) {', '.join(unknown)}{did_you_mean(unknown[0], TOP)} "
                          f"(allowed: {', '.join(sorted(TOP))})")
    if not isinstance(doc.get("min_gap", 1.0), (int, float)):
        raise ClaimsError(f"{where}: min_gap must be a number")
    notes = doc.get("scale_notes", {})   # profile -> why claims cannot show at that scale (the report prints it)
    if not isinstance(notes, dict) or not all(isinstance(v, str) for v in notes.values()):
        raise ClaimsError(f"{where}: scale_notes must map a profile name to a text")
    seen = set()
    for i, c in enumerate(doc["claims"]):
        cid = c.get("id") if isinstance(c, dict) else None
        name = f"{where}: claim {cid!r}" if cid else f"{where}: claim #{i + 1}"
        if not isinstance(c, dict) or not cid:
            raise ClaimsError(f"{name}: needs an 'id'")
        if cid in seen:
            raise ClaimsError(f"{name}: duplicate id")
        seen.add(cid)
        _validate(c, name)
    return doc


def _validate(c: dict, name: str) -> None:
    form = c.get("form")
    if form not in FORMS:
        raise ClaimsError(f"{name}: unknown form {form!r}{did_you_mean(form, FORMS)} (forms: {', '.join(FORMS)})")
    required, optional = FORMS[form]
    missing = sorted(({"quote", "where"} | required) - set(c))
    if missing:
        raise ClaimsError(f"{name}: form {form!r} needs {', '.join(missing)}")
    unknown = sorted(set(c) - COMMON - required - optional)
    if unknown:
        raise ClaimsError(f"{name}: unknown field(s) {', '.join(unknown)}{did_you_mean(unknown[0], COMMON | required | optional)} "
                          f"for form {form!r}")
    if not isinstance(c["quote"], str) or len(c["quote"].split()) < 3:
        raise ClaimsError(f"{name}: 'quote' must be the sentence quoted from the paper")
    w = c["where"]
    if not isinstance(w, dict) or not isinstance(w.get("stage"), str) or set(w) - {"stage", "table"}:
        raise ClaimsError(f"{name}: 'where' must be {{stage: <stage name>, table: <csv stem>}}")
    for key, allowed in CHOICES.items():
        if key in c and c[key] not in allowed:
            raise ClaimsError(f"{name}: {key}={c[key]!r}{did_you_mean(c[key], allowed)}, allowed: {', '.join(allowed)}")
    for key in ("min_gap", "by", "at_least", "at_most", "target", "tolerance"):
        if key in c and not isinstance(c[key], (int, float)):
            raise ClaimsError(f"{name}: {key} must be a number, got {c[key]!r}")
    for key in ("group_by", "order", "profiles", "paper_datasets"):
        if key in c and not isinstance(c[key], list):
            raise ClaimsError(f"{name}: {key} must be a list")
    if "select" in c and not isinstance(c["select"], dict):
        raise ClaimsError(f"{name}: 'select' must be a mapping column -> value or list")
    for key in ("a", "b", "above", "below", "among", "exclude", "series", "num", "den", "value"):
        if key in c:
            for r in _as_list(c[key]):
                if not (isinstance(r, str) or (isinstance(r, dict) and r)):
                    raise ClaimsError(f"{name}: {key} must be a method name or a mapping of column filters")
    if form == "ratio":
        if ("value" in c) == ("num" in c or "den" in c) or ("num" in c) != ("den" in c):
            raise ClaimsError(f"{name}: form 'ratio' needs either num and den, or value")
        if "at_least" not in c and "at_most" not in c:
            raise ClaimsError(f"{name}: form 'ratio' needs at_least and/or at_most")
    if form == "near":
        q = c["quantity"]
        need = {"value": set(), "diff": {"a", "b", "target"}, "ratio": {"a", "b", "target"},
                "margin": {"a", "target"}}.get(q)
        if need is None:
            raise ClaimsError(f"{name}: quantity={q!r}{did_you_mean(q, CHOICES['quantity'])}, allowed: "
                              f"{', '.join(CHOICES['quantity'])}")
        if need - set(c):
            raise ClaimsError(f"{name}: near with quantity {q!r} needs {', '.join(sorted(need - set(c)))}")
    if form == "trend" and c["direction"] == "peak" and c.get("steps") == "ends":
        raise ClaimsError(f"{name}: a peak has no 'steps: ends' reading")
    if "by_design" in c and not (isinstance(c["by_design"], str) and c["by_design"].strip()):
        raise ClaimsError(f"{name}: by_design must say why the quantity is fixed by construction")
    if "headline" in c and not isinstance(c["headline"], bool):
        raise ClaimsError(f"{name}: headline must be true or false")
    if "paper_view" in c and not (c["paper_view"] is False or isinstance(c["paper_view"], dict)):
        raise ClaimsError(f"{name}: paper_view must be false or {{rename: {{...}}, select: {{...}}}}")


def _as_list(x) -> list:
    return list(x) if isinstance(x, (list, tuple)) else [x]



# ------------------------------------------------------------------ values and effects
@dataclass
class Val:
    """One ref's value in one cell: the mean over seeds `x`, its std over seeds `sd` (nan: unknown), the number of
    seeds `n`, each seed's value where the table has them (a blank seed: nan), and the row's keys (its runs)."""
    label: str
    x: float
    sd: float = float("nan")
    n: int = 1
    per_seed: dict | None = None
    exact: bool = False
    keys: dict = field(default_factory=dict)
    min_test: float = float("nan")
    n_test: float = float("nan")          # effective test images behind one seed's value (accuracies only)

    def __str__(self):
        seeds = f" (seeds {', '.join(f'{s}:{_fmt(v)}' for s, v in self.per_seed.items())})" if self.per_seed else ""
        spread = f"±{_fmt(self.sd)}" if self.sd == self.sd and not self.per_seed and not self.exact else ""
        return f"{self.label} {_fmt(self.x)}{spread}{seeds}"


def _parse_seeds(cell) -> dict | None:
    """`repro_seeds` ("0:93.81;1:90.83;2:nan") -> {0: 93.81, 1: 90.83, 2: nan}; None when blank or malformed."""
    if not isinstance(cell, str) or not cell.strip():
        return None
    out = {}
    for part in cell.split(";"):
        seed, _, v = part.partition(":")
        try:
            out[int(seed)] = float(v)
        except ValueError:
            return None
    return out


def _fmt(x: float) -> str:
    return verdicts._fmt(x)


def _delta_se(f, vals: list[Val]) -> tuple[float | None, float | None]:
    """Standard error of f at the means from each value's std over its seeds (delta method, numerical
    derivatives), and its Welch-Satterthwaite degrees of freedom; None when a value f depends on has no spread."""
    xs = np.array([v.x for v in vals], dtype=np.float64)
    var, den = 0.0, 0.0
    for i, v in enumerate(vals):
        if v.exact:
            continue
        h = 1e-4 * max(1.0, abs(xs[i]))
        up, dn = xs.copy(), xs.copy()
        up[i] += h
        dn[i] -= h
        g = (f(list(up)) - f(list(dn))) / (2 * h)
        if g == 0:
            continue
        if v.sd != v.sd or v.n < 2:
            return None, None
        c = g * g * v.sd ** 2 / v.n
        var += c
        den += c * c / (v.n - 1)
    return math.sqrt(var), (var * var / den if den else math.inf)    # Welch-Satterthwaite degrees of freedom


def _floor(kind: str | None, vals: list[Val], means: list[float]) -> float:
    """The test-set floor of one seed's effect (verdicts.floor_variance) for an effect of `kind` over accuracies
    with known test sets; 0 otherwise."""
    if kind is None or any(not (v.n_test == v.n_test) for v in vals) or not all(map(math.isfinite, means)):
        return 0.0
    return verdicts.floor_variance(kind, means, [v.n_test for v in vals])


def effect(name: str, vals: list[Val], f, text: str = "", kind: str | None = None) -> Sample:
    """The effect f([value of each of `vals`]) in one cell: per seed over the seeds all of them share (paired),
    else at the means with a delta-method standard error, or exact where every value is. `kind` ('diff', 'value',
    'ratio'): what the effect is of accuracies, for its test-set floor (verdicts.floor_variance)."""
    xs = [v.x for v in vals]
    if all(v.exact for v in vals):
        return Sample(name, float(f(xs)), exact=True, text=text)
    if all(v.per_seed for v in vals):
        common = sorted(set.intersection(*(set(v.per_seed) for v in vals)))
        if common:
            rows = [[v.per_seed[s] for v in vals] for s in common]
            per = np.array([f(r) for r in rows], dtype=np.float64)
            tie = np.array([all(math.isinf(x) for x in r) for r in rows])
            per[np.isnan(per) & tie] = 0.0          # both never reached the target on that seed: a tie
            means = [float(np.mean([r[i] for r in rows])) for i in range(len(vals))]
            return Sample(name, float(np.mean(per)), values=per, text=text, seeds=tuple(common),
                          floor=_floor(kind, vals, means))
    point = float(f(xs))
    if not math.isfinite(point):          # a method that never reached a target: decided by that alone
        return Sample(name, point, exact=True, text=text)
    se, df = _delta_se(f, vals)
    n = min((v.n for v in vals if not v.exact), default=0)
    return Sample(name, point, se=se, df=df, text=text, n_seeds=n)


@dataclass
class Comparison:
    """One effect over the claim's cells and the region the claim puts it in (a claim: one or several)."""
    label: str
    region: Region
    cells: list = field(default_factory=list)       # [Sample]
    skipped: list = field(default_factory=list)     # [(cell, why)]
    used: list = field(default_factory=list)        # [Val] read (their runs and test sets)
    guard: bool = False                             # can only fail the claim (a trend's steps)
    hold_only: bool = False                         # can only make the claim hold (a bound valid one way only)
    fail_union: int = 1                             # it fails for one of this many candidates chosen by their means
    family: int = 1                                 # comparisons of one kind made at once (a competitor each)
    hold_union: int = 1                             # it holds for one of this many candidates chosen by their
    #                                                 means (the best of a list, a peak's interior point): Bonferroni
    display: bool = False                           # the comparison the claim's effect is shown by
    absent: set = field(default_factory=set)        # competitors blank in a cell (not run there)

    def add(self, name: str, vals: list[Val], f, text: str = "", kind: str | None = None) -> None:
        self.cells.append(effect(name, vals, f, text or "; ".join(str(v) for v in vals), kind))
        self.used += vals


# ------------------------------------------------------------------ tables
class NotRun(Exception):
    """The claim cannot be evaluated on these outputs (the reason is the message)."""


def _matches(series: pd.Series, value) -> pd.Series:
    vals = _as_list(value)
    if pd.api.types.is_numeric_dtype(series):
        try:
            nums = [float(v) for v in vals]
            return series.astype(float).isin(nums)
        except (TypeError, ValueError):
            pass
    return series.astype(str).isin([str(v) for v in vals])


def _match_one(v, want) -> bool:
    """A cell value against a filter value or list (numbers compared as numbers: tau 3 matches 3.0)."""
    for w in _as_list(want):
        if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool):
            if _num(w) == float(v):
                return True
        elif str(v) == str(w):
            return True
    return False


def _filter(df: pd.DataFrame, filters: dict, what: str) -> pd.DataFrame:
    for col, val in filters.items():
        if col not in df.columns:
            raise NotRun(f"{what}: the table has no column {col!r} (claim and table disagree)")
        df = df[_matches(df[col], val)]
    return df


def _num(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def _ref(r) -> dict:
    return {"method": r} if isinstance(r, str) else dict(r)


def _ref_filters(r) -> dict:
    return {k: v for k, v in _ref(r).items() if k not in ("column", "std")}


def _ref_label(r) -> str:
    d = _ref(r)
    f = _ref_filters(r)
    label = " ".join(str(v) if k == "method" else f"{k}={v}" for k, v in f.items())
    return " ".join(x for x in (label, f"[{d['column']}]" if "column" in d else "") if x)


class Evaluator:
    """One claim on one table (the reproduced one, or the paper's printed numbers: `paper`)."""

    def __init__(self, claim: dict, table: pd.DataFrame, paper: bool = False, paper_seeds: int = DEFAULT_PAPER_SEEDS):
        self.c = claim
        self.df = table
        self.paper = paper
        self.paper_seeds = int(paper_seeds)
        self.column = claim.get("column", "reproduced")
        self.sign = -1.0 if claim.get("better") == "lower" else 1.0
        self.exact = claim.get("noise") == "none"
        self.worst = claim.get("missing") in ("fails", "worst")
        self._cache: dict = {}

    def _records(self, cell: pd.DataFrame) -> list[dict]:
        hit = self._cache.get(id(cell))
        if hit is None or hit[0] is not cell:
            hit = self._cache[id(cell)] = (cell, cell.to_dict("records"))
        return hit[1]

    # -- one value
    def value(self, cell: pd.DataFrame, ref) -> Val | None:
        """The ref's value in a cell; None if it did not run there (or is blank and blanks are skipped)."""
        d = _ref(ref)
        col = d.get("column", self.column)
        if col not in self.df.columns:
            raise NotRun(f"the table has no column {col!r} (claim and table disagree)")
        filters = _ref_filters(ref)
        for k in filters:
            if k not in cell.columns:
                raise NotRun(f"ref {_ref_label(ref)}: the table has no column {k!r} (claim and table disagree)")
        rows = [r for r in self._records(cell) if all(_match_one(r[k], v) for k, v in filters.items())]
        if len(rows) == 0:
            return None
        if len(rows) > 1:
            raise NotRun(f"ref {_ref_label(ref)} matches {len(rows)} rows of one cell: give group_by or a filter")
        row = rows[0]
        x = _num(row[col])
        worst = -self.sign * math.inf
        if x != x and not self.worst:
            return None
        keys = {k: row[k] for k in ("dataset", "setting", "method") if k in row}
        v = Val(_ref_label(ref), worst if x != x else x, keys=keys, min_test=_num(row.get("min_test")),
                n_test=_num(row.get("test_n")) if col in ACCURACY_COLUMNS and not self.paper else float("nan"))
        if self.exact:
            v.exact = True
            return v
        v.sd, v.n = self._spread(row, d, col)
        if not self.paper:
            seeds = _parse_seeds(row.get("repro_seeds" if col == "reproduced" else f"{col}_seeds"))
            if seeds:
                v.per_seed = {s: (worst if y != y else y) for s, y in seeds.items()} if self.worst else \
                    {s: y for s, y in seeds.items() if y == y}
                v.n = len(v.per_seed)
        return v

    def _spread(self, row: dict, ref: dict, col: str) -> tuple[float, int]:
        """(std over seeds, seeds) of a value: its std column (the ref's or claim's `std`, else `repro_std` for
        `reproduced`, else `<column>_std`); the paper's printed std is over `paper_seeds`."""
        std_col = ref.get("std", self.c.get("std", "repro_std" if col == "reproduced" or self.paper else f"{col}_std"))
        s = _num(row.get(std_col))
        if self.paper:
            return s, self.paper_seeds
        n = _num(row.get("seeds"))
        return s, (int(n) if n == n else 1)

    # -- cells
    def ref_columns(self) -> set:
        cols = set()
        for key in ("a", "b", "above", "below", "among", "exclude", "series", "num", "den", "value"):
            for r in _as_list(self.c.get(key, [])):
                cols |= set(_ref_filters(r))
        if self.c["form"] == "best" or (self.c["form"] == "near" and self.c["quantity"] == "margin"):
            cols.add("method")
        if self.c["form"] == "trend":
            cols.add(self.c.get("along", "setting"))
        return cols

    def cells(self) -> list[tuple[str, pd.DataFrame]]:
        df = _filter(self.df, self.c.get("select", {}), "select")
        if df.empty:
            raise NotRun(f"no rows match select {self.c.get('select')} ({_describe(self.df)})")
        keys = self.c.get("group_by")
        if keys is None:
            used = self.ref_columns()
            keys = [k for k in KEY_COLUMNS if k in df.columns and k not in used]
            if self.c["form"] == "trend" and self.c.get("along", "setting") != "method":
                keys = [k for k in keys if k != "method"]   # one series per method, inside a cell
        missing = [k for k in keys if k not in df.columns]
        if missing:
            raise NotRun(f"group_by {missing}: no such column (claim and table disagree)")
        if not keys:
            return [("all rows", df)]
        def name(vals):
            return " / ".join(str(v) if col in KEY_COLUMNS else f"{col}={v}" for col, v in zip(keys, vals))
        return [(name(k if isinstance(k, tuple) else (k,)), g) for k, g in df.groupby(keys, sort=False)]

    def stand_in(self, paper_datasets) -> list[str]:
        df = _filter(self.df, self.c.get("select", {}), "select")
        if "dataset" not in df.columns or not paper_datasets:
            return []
        return sorted(set(df["dataset"].dropna().astype(str)) - set(paper_datasets))   # paper rows not run: no dataset

    def methods(self) -> set[str]:
        """The methods of the claim's selected rows."""
        try:
            df = _filter(self.df, self.c.get("select", {}), "select")
        except NotRun:
            return set()
        return set(df["method"].dropna().astype(str)) if "method" in df.columns else set()



def _describe(df: pd.DataFrame) -> str:
    parts = []
    for k in ("dataset", "setting"):
        if k in df.columns:
            parts.append(f"{k}: {', '.join(map(str, pd.unique(df[k])))}")
    return "; ".join(parts) or f"{len(df)} rows"


def _sweep_key(v):
    m = re.search(r"(-?[0-9]+(?:\.[0-9]+)?)", str(v))
    return (0, float(m.group(1)), str(v)) if m else (1, 0.0, str(v))



# ------------------------------------------------------------------ the forms: claim -> comparisons
def _absent(ev: Evaluator, cell: pd.DataFrame, refs: list) -> str:
    gone = []
    for r in refs:
        if r == "":
            continue
        try:
            if ev.value(cell, r) is None:
                gone.append(_ref_label(r))
        except NotRun:
            gone.append(_ref_label(r))
    return ", ".join(gone)


def _rel(ev: Evaluator) -> str:
    return ">" if ev.sign > 0 else "<"


def _eval_order(ev: Evaluator) -> list[Comparison]:
    by = float(ev.c.get("by", 0.0))
    a_ref, out = ev.c["a"], []
    for b_ref in _as_list(ev.c["b"]):
        label = f"{_ref_label(a_ref)} {_rel(ev)} {_ref_label(b_ref)}" + (f" (margin {by:+g})" if by else "")
        comp = Comparison(label, Region(">", by))
        for name, cell in ev.cells():
            a, b = ev.value(cell, a_ref), ev.value(cell, b_ref)
            if a is None or b is None:
                comp.skipped.append((name, "not in this profile: " + _absent(ev, cell, [a_ref, b_ref])))
                continue
            comp.add(name, [a, b], lambda v: ev.sign * (v[0] - v[1]), kind="diff")
        out.append(comp)
    for c in out:
        c.family = len(out)
    return out


def _pairwise(ev: Evaluator, label, pairs, skipped: list) -> list[Comparison]:
    """One comparison per (a, b) pair, pooled over the cells where both ran: `pairs` yields (cell, a Val, b Val)."""
    comps: dict = {}
    for name, a, b in pairs:
        comp = comps.setdefault((a.label, b.label), Comparison(label(a, b), Region(">", 0.0)))
        comp.add(name, [a, b], lambda v: ev.sign * (v[0] - v[1]), kind="diff")
    out = list(comps.values())
    for c in out:
        c.family = len(out)
    if out:
        out[0].skipped += skipped
    return out or [Comparison(label(None, None), Region(">", 0.0), skipped=skipped)]


def _eval_order_all(ev: Evaluator) -> list[Comparison]:
    """Every ref above > every ref below: one paired comparison per pair (`pairs: any`: one pair must hold)."""
    refs = [*_as_list(ev.c["above"]), *_as_list(ev.c["below"])]
    pairs, skipped = [], []
    for name, cell in ev.cells():
        above = [v for v in (ev.value(cell, r) for r in _as_list(ev.c["above"])) if v is not None]
        below = [v for v in (ev.value(cell, r) for r in _as_list(ev.c["below"])) if v is not None]
        if not above or not below:
            skipped.append((name, "not in this profile: " + _absent(ev, cell, refs)))
            continue
        pairs += [(name, a, b) for a in above for b in below]
    return _pairwise(ev, lambda a, b: f"{a.label if a else 'above'} {_rel(ev)} {b.label if b else 'below'}",
                     pairs, skipped)


def _competitors(ev: Evaluator, cell: pd.DataFrame, exclude_refs: list) -> list:
    if "among" in ev.c:
        refs = _as_list(ev.c["among"])
    else:
        if "method" not in cell.columns:
            raise NotRun("'best' without 'among' needs a method column")
        refs = list(pd.unique(cell["method"]))
    drop = {json.dumps(_ref(r), sort_keys=True) for r in [*exclude_refs, *_as_list(ev.c.get("exclude", []))]}
    return [r for r in refs if json.dumps(_ref(r), sort_keys=True) not in drop]


def _leader(ev: Evaluator, vals: list[Val]) -> Val:
    """The value with the best mean (the claim's direction): a fixed competitor, so that its per-seed values pair."""
    return max(vals, key=lambda v: ev.sign * v.x if v.x == v.x else -math.inf)


def _eval_best(ev: Evaluator) -> list[Comparison]:
    """a (the best of a list, by its mean) beats every other method: one paired comparison per competitor, pooled
    over the cells; it holds when every one holds, fails when one is decidedly against (Bonferroni over the
    competitors). Per-seed "a minus the best competitor of that seed" would favour the competitors: the maximum of
    several noisy competitors is above each of them."""
    a_refs = _as_list(ev.c["a"])
    pairs, skipped, blank = [], [], set()
    for name, cell in ev.cells():
        a_vals = [v for v in (ev.value(cell, r) for r in a_refs) if v is not None]
        if not a_vals:
            skipped.append((name, "not in this profile: " + _absent(ev, cell, a_refs)))
            continue
        rivals = _competitors(ev, cell, a_refs)
        got = [(r, ev.value(cell, r)) for r in rivals]
        blank |= {_ref_label(r) for r, v in got if v is None and _has_row(ev, cell, r)}
        others = [v for _, v in got if v is not None]
        if not others:
            skipped.append((name, "no competitor ran in this cell"))
            continue
        a = _leader(ev, a_vals)
        pairs += [(name, a, b) for b in others]
    comps = _pairwise(ev, lambda a, b: f"{a.label if a else '/'.join(map(_ref_label, a_refs))} {_rel(ev)} "
                                       f"{b.label if b else 'every other'}", pairs, skipped)
    for c in comps:
        c.hold_union = len(a_refs)     # the best of a list, chosen by its mean: it holds at alpha / len(list)
        c.absent = blank
    return comps


def _has_row(ev: Evaluator, cell: pd.DataFrame, ref) -> bool:
    """Whether a ref has a row in the cell (blank or not): a row with a blank value is a competitor that did not
    run there, which makes a holding claim partial."""
    filters = _ref_filters(ref)
    if any(k not in cell.columns for k in filters):
        return False
    return any(all(_match_one(r[k], v) for k, v in filters.items()) for r in ev._records(cell))


def _series_points(ev: Evaluator, cell: pd.DataFrame, along: str, order: list, filt: dict) -> list[Val]:
    vals = []
    for point in order:
        sub = cell[_matches(cell[along], point)]
        v = ev.value(sub, {**filt, along: point} if along != "method" else point) if len(sub) else None
        if v is not None:
            v.label = f"{point}"
            vals.append(v)
    return vals


def _eval_trend(ev: Evaluator) -> list[Comparison]:
    along = ev.c.get("along", "setting")
    direction, steps = ev.c["direction"], ev.c.get("steps", "all")
    ends = Comparison(f"{direction} along {along}" + (" (ends)" if direction != "peak" else
                                                     " (highest interior point minus the first)"), Region(">", 0.0))
    last = Comparison(f"{direction} along {along} (highest interior point minus the last)", Region(">", 0.0))
    guard = Comparison(f"no step against {direction}", Region(">", 0.0), guard=True)
    s = -1.0 if direction == "decreasing" else 1.0
    for name, cell in ev.cells():
        if along not in cell.columns:
            raise NotRun(f"the table has no column {along!r} to sweep along")
        present = list(pd.unique(cell[along]))
        order = _as_list(ev.c["order"]) if "order" in ev.c else sorted(present, key=_sweep_key)
        if along == "method" or ("series" not in ev.c and "method" not in cell.columns):
            series = [(None, {})]
        elif "series" in ev.c:
            series = [(r, _ref_filters(r)) for r in _as_list(ev.c["series"])]
        else:
            series = [(m, {"method": m}) for m in pd.unique(cell["method"])]
        for ref, filt in series:
            vals = _series_points(ev, cell, along, order, filt)
            label = " / ".join(x for x in (name if name != "all rows" else "",
                                           _ref_label(ref) if ref is not None else "") if x) or name
            need = 3 if direction == "peak" else 2
            if len(vals) < need:
                ends.skipped.append((label, f"{len(vals)} of the {len(order)} points ran ({along}: "
                                            f"{', '.join(map(str, present))}); {direction} needs {need} points"))
                continue
            seq = " -> ".join(str(v) for v in vals)
            if direction == "peak":     # the interior point with the highest mean, above both ends: chosen by its
                i = 1 + int(np.argmax([v.x for v in vals[1:-1]]))     # mean, so it holds at alpha / (interior points)
                ends.add(label, [vals[i], vals[0]], lambda v: v[0] - v[1], seq, kind="diff")
                last.add(label, [vals[i], vals[-1]], lambda v: v[0] - v[1], seq, kind="diff")
                ends.hold_union = last.hold_union = max(ends.hold_union, len(vals) - 2)
                ends.family = last.family = 2
                continue
            ends.add(label, [vals[0], vals[-1]], lambda v: s * (v[1] - v[0]), seq, kind="diff")
            if steps == "all":
                for a, b in zip(vals, vals[1:]):
                    guard.add(f"{label}: {a.label}->{b.label}", [a, b], lambda v: s * (v[1] - v[0]), kind="diff")
    if direction == "peak":
        return [ends, last]
    return [ends, guard] if guard.cells else [ends]


def _ratio_region(c: dict) -> Region:
    if "at_least" in c and "at_most" in c:
        return Region("band", lo=float(c["at_least"]), hi=float(c["at_most"]))
    return Region(">=", float(c["at_least"])) if "at_least" in c else Region("<=", float(c["at_most"]))


def _ratio(v):
    return v[0] / v[1] if v[1] else float("nan")


def _eval_ratio(ev: Evaluator) -> list[Comparison]:
    region = _ratio_region(ev.c)
    if "value" in ev.c:
        pairs = [(r, None) for r in _as_list(ev.c["value"])]
    else:
        pairs = [(r, ev.c["den"]) for r in _as_list(ev.c["num"])]
    out = []
    for num, den in pairs:
        comp = Comparison(_ref_label(num) + (f" / {_ref_label(den)}" if den is not None else ""), region)
        for name, cell in ev.cells():
            vals = [ev.value(cell, num)] + ([ev.value(cell, den)] if den is not None else [])
            if any(v is None for v in vals):
                comp.skipped.append((name, "not in this profile: " + _absent(ev, cell, [num] + ([den] if den else []))))
                continue
            comp.add(name, vals, (lambda v: v[0]) if den is None else _ratio, kind=None if den is None else "ratio")
        out.append(comp)
    for c in out:
        c.family = len(out)
    return out


def _near_region(q_kind: str, target: float, tol: float) -> Region:
    null = {"diff": 0.0, "margin": 0.0, "ratio": 1.0}.get(q_kind)
    if null is not None and target == null:
        null = None
    return Region("band", lo=target - tol, hi=target + tol, null=null,
                  above=None if null is None else target > null)


def _eval_near(ev: Evaluator) -> list[Comparison]:
    q_kind, tol = ev.c["quantity"], float(ev.c["tolerance"])
    if q_kind == "value":
        return [_near_value(ev, tol)]
    if q_kind == "margin":
        return _near_margin(ev, tol)
    comp = Comparison(f"{q_kind} near {ev.c['target']}", _near_region(q_kind, float(ev.c["target"]), tol))
    for name, cell in ev.cells():
        a = ev.value(cell, ev.c["a"])
        b = ev.value(cell, ev.c["b"])
        if a is None or b is None:
            comp.skipped.append((name, "not in this profile: " + _absent(ev, cell, [ev.c["a"], ev.c.get("b", "")])))
            continue
        if q_kind == "ratio":
            comp.add(name, [a, b], _ratio, kind="ratio")
        else:
            comp.add(name, [a, b], lambda v: ev.sign * (v[0] - v[1]), kind="diff")
    return [comp]


def _near_margin(ev: Evaluator, tol: float) -> list[Comparison]:
    """a's margin over the best other method, M = a - max_j b_j, within target ± tol (and above 0 where the target
    is), by two estimates that each bound M one way:
    - U = a - b_J for one competitor J, the one with the best mean (over the cells, when the claim pools them;
      per cell otherwise): U >= M for any J, so U <= hi shows M <= hi (it holds), and U < lo (or U <= 0 where the
      claim has a side) shows M is below (it fails); J is chosen by its mean, so both at alpha / the number of
      competitors;
    - L = per seed, a minus the best competitor OF THAT SEED: its mean is at most M, so L >= lo shows M >= lo (it
      holds), and L > hi shows M > hi (it fails).
    U is the effect shown. Each pairs its seeds with a's."""
    full = _near_region("margin", float(ev.c["target"]), tol)
    lower = Region(">", full.null) if full.null is not None and full.null >= full.lo else Region(">=", full.lo)
    lab = f"margin over the best other near {ev.c['target']}"
    u_hold = Comparison(f"{lab}: a - the best by its mean (at most {_fmt(full.hi)})", Region("<=", full.hi),
                        display=True, hold_only=True)
    u_fail = Comparison(f"{lab}: a - the best by its mean ({lower})", lower, guard=True)
    l_hold = Comparison(f"{lab}: a - each seed's best ({lower})", lower, hold_only=True)
    l_fail = Comparison(f"{lab}: a - each seed's best (not above {_fmt(full.hi)})", Region("<=", full.hi), guard=True)
    cells = []
    for name, cell in ev.cells():
        a = ev.value(cell, ev.c["a"])
        bs = [v for v in (ev.value(cell, r) for r in _competitors(ev, cell, [ev.c["a"]])) if v is not None]
        if a is None or not bs:
            u_hold.skipped.append((name, "not in this profile: " + _absent(ev, cell, [ev.c["a"]])))
            continue
        cells.append((name, a, bs))
    pooled = _quantifier(ev.c) == "most"
    common = set.intersection(*({b.label for b in bs} for _, _, bs in cells)) if cells else set()
    overall = {lab_: np.mean([ev.sign * b.x for _, _, bs in cells for b in bs if b.label == lab_]) for lab_ in common}
    for name, a, bs in cells:
        lead = next(b for b in bs if b.label == max(overall, key=overall.get)) if pooled and overall else _leader(ev, bs)
        for comp in (u_hold, u_fail):
            comp.add(name, [a, lead], lambda v: ev.sign * (v[0] - v[1]), kind="diff")
            comp.hold_union = comp.fail_union = max(comp.hold_union, len(bs))
        for comp in (l_hold, l_fail):
            comp.add(name, [a, *bs], lambda v: min(ev.sign * (v[0] - x) for x in v[1:]))
            comp.cells[-1].floor = _floor("diff", [a, lead], [a.x, lead.x])
    return [u_hold, u_fail, l_hold, l_fail]


def _near_value(ev: Evaluator, tol: float) -> Comparison:
    pcol = ev.c.get("paper_column", "paper")
    comp = Comparison("reproduced - paper", Region("band", lo=-tol, hi=tol))
    for name, cell in ev.cells():
        if pcol not in cell.columns:
            raise NotRun(f"the table has no paper column {pcol!r}")
        for i in range(len(cell)):
            row = cell.iloc[[i]]
            label = name + (f" / {row.iloc[0]['method']}" if "method" in row.columns and len(cell) > 1 else "")
            v = ev.value(row, {})
            p = _num(row[pcol].iloc[0])
            if v is None or p != p:
                comp.skipped.append((label, "no reproduced or no paper value"))
                continue
            comp.add(label, [v], lambda x, p=p: x[0] - p, f"{v} vs paper {_fmt(p)}", kind="value")
    return comp


EVALUATORS = {"order": _eval_order, "order_all": _eval_order_all, "best": _eval_best, "trend": _eval_trend,
              "ratio": _eval_ratio, "near": _eval_near}




# ------------------------------------------------------------------ one claim, all claims
def _results_root() -> Path:
    """runs.results_root(): $PFLREPRO_RESULTS or results/ (what experiments.output_dirs writes under)."""
    return Path(os.environ.get("PFLREPRO_RESULTS", REPO_ROOT / "results"))


def _profile(stage_dir: Path) -> str | None:
    prov = stage_dir / "provenance.json"
    if prov.exists():
        try:
            return json.loads(prov.read_text()).get("profile")
        except (ValueError, OSError):
            return None
    return None


@functools.lru_cache(maxsize=None)
def _paper_table_name(stage: str) -> str | None:
    """params/<stage>.yaml's `paper_table`, following `inherit:` / `source:` as experiments.read_params
    does (read here without importing the training stack); for a stage with no params file yet, the
    paper_numbers CSV of the same name, if there is one."""
    seen = set()
    if not (REPO_ROOT / "params" / f"{stage}.yaml").exists():
        return stage if (CLAIMS_DIR / f"{stage}.csv").exists() else None
    while stage and stage not in seen:
        seen.add(stage)
        path = REPO_ROOT / "params" / f"{stage}.yaml"
        if not path.exists():
            return None
        doc = yaml.load(path.read_text(), Loader=_LOADER) or {}
        if doc.get("paper_table"):
            return doc["paper_table"]
        stage = doc.get("inherit") or (doc.get("source") if "profiles" not in doc else None)
    return None


def paper_view_table(claim: dict) -> pd.DataFrame:
    """The paper's own numbers shaped like the claim's table (the self-check): `value` -> the claim's
    column (and `paper`), `std` -> its std column, plus the claim's paper_view rename/select."""
    view = claim.get("paper_view", {})
    if view is False:
        raise NotRun("the claim is not checkable on the printed numbers (paper_view: false)")
    stage = claim["where"]["stage"]
    name = _paper_table_name(stage)
    if not name:
        raise NotRun(f"no paper_numbers table for stage {stage}")
    df = pd.read_csv(CLAIMS_DIR / f"{name}.csv", comment="#")   # as report.paper_table
    rename = {"value": claim.get("column", "reproduced"), "std": claim.get("std", "repro_std")}
    rename.update((view or {}).get("rename", {}))
    if "value" in df.columns:
        df["paper"] = df["value"]
    df = df.rename(columns=rename)
    return _filter(df, (view or {}).get("select", {}), "paper_view select")


def _table(claim: dict, results, source: str, row: dict) -> pd.DataFrame:
    if source == "paper":
        row["profile"] = "paper numbers"
        return paper_view_table(claim)
    stage, stem = claim["where"]["stage"], claim["where"].get("table", "table")
    root = Path(results) if results is not None else _results_root()
    path = root / stage / f"{stem}.csv"
    if not path.exists():
        raise NotRun(f"no {stage}/{stem}.csv under {root}")
    row["profile"] = _profile(path.parent)
    if claim.get("profiles") and row["profile"] not in claim["profiles"]:
        raise NotRun(f"the claim needs profile {' or '.join(claim['profiles'])}; this output is profile {row['profile']}")
    return pd.read_csv(path)


def _quantifier(claim: dict) -> str:
    """`aggregate: mean` is the pooled effect (`most`); `aggregate: max` (the cell with the largest effect) is
    `any`: deciding on the cell chosen as the largest needs the Bonferroni level over the cells."""
    agg = claim.get("aggregate")
    return "most" if agg == "mean" else ("any" if agg == "max" else claim.get("quantifier", "all"))


def _mode(claim: dict) -> str:
    """How a claim's comparisons combine: 'any' (one must hold: `pairs: any`), else 'all'."""
    return "any" if claim.get("pairs") == "any" else "all"


def _levels(claim: dict, comps: list[Comparison]) -> list[tuple[float, float]]:
    """(hold_alpha, fail_alpha) of each comparison of a claim, so that at the claim's boundary it holds and fails
    wrongly at most ALPHA each. All comparisons must hold (intersection-union: each at its own level); one against
    fails the claim, so failing is corrected over every test that could fail it (Bonferroni, Holm's first step:
    each cell of an `all` comparison or a guard is one, a pooled or `any` comparison one). Under `pairs: any` the
    claim holds when one comparison holds (Bonferroni over them) and fails only when all fail (each at its own
    level). A comparison that holds for a candidate chosen by its means (`hold_union`) holds at alpha / that many."""
    q = _quantifier(claim)
    base = [verdicts.default_levels(q, max(len(c.cells), 1), c.guard) for c in comps]
    hold = [h / c.hold_union for (h, _), c in zip(base, comps)]
    if _mode(claim) == "any":
        return [(h / len(comps), f / c.fail_union) for h, (_, f), c in zip(hold, base, comps)]
    tests = sum((len(c.cells) if (q == "all" or (c.guard and q != "most")) else 1) * c.fail_union
                for c in comps if not c.hold_only)
    return [(h, verdicts.ALPHA / max(tests, 1)) for h in hold]


def _paper_point_verdict(comp: Comparison, d: verdicts.Decision, quantifier: str) -> None:
    """The paper's printed numbers without a printed spread: the claim read on the point values alone (the
    quantifier as in verdicts.decide: `all` needs every cell's value on the claimed side)."""
    if d.ci is not None or d.point != d.point:
        return
    if comp.guard:
        d.verdict = "holds"
        return
    d.method, d.why = "point values (no spread printed)", ""
    pooled = comp.region.side(d.point, d.point)
    sides = [comp.region.side(s.point, s.point) for s in comp.cells]
    if quantifier == "any":
        d.verdict = "holds" if "in" in sides else ("fails" if all(x == "out" for x in sides) else "inconclusive")
    elif quantifier == "most" or pooled != "in":
        d.verdict = {"in": "holds", "out": "fails"}.get(pooled, "inconclusive")
    else:
        d.verdict = "holds" if all(x == "in" for x in sides) else "inconclusive"


def _absent_competitors(claim: dict, ev: Evaluator) -> list[str]:
    """A `best` claim's competitors that the paper's table (or `among`) has and that did not run here."""
    if claim["form"] != "best":
        return []
    skip = {_ref_label(r) for r in [*_as_list(claim["a"]), *_as_list(claim.get("exclude", []))]}
    if "among" in claim:
        wanted = {_ref_label(r) for r in _as_list(claim["among"]) if isinstance(r, str)}
    else:
        try:
            df = paper_view_table(claim)
        except (NotRun, OSError, ValueError):
            return []
        wanted = set(df["method"].dropna().astype(str)) if "method" in df.columns else set()
    return sorted(wanted - skip - ev.methods())


def _evidence(comps: list[Comparison], decisions: list[verdicts.Decision], max_cells: int = 8) -> str:
    parts = []
    for c, d in zip(comps, decisions):
        if c.guard:
            if d.cells_against:
                parts.append(f"{c.label}: decidedly against at {', '.join(d.cells_against)}")
            continue
        head = f"{c.label}: effect {d.interval_text()} vs {c.region}"
        head += f" ({d.method})" if d.method else ""
        head += f": {d.verdict}" + (f" ({d.why})" if d.why else "")
        if d.cells_against:
            head += f"; cells against: {', '.join(d.cells_against)}"
        if d.left_out:
            head += f"; left out (fewer than {verdicts.MIN_SEEDS} seeds): {', '.join(d.left_out)}"
        cells = "; ".join(f"{s.name}: {s.text}" for s in c.cells[:max_cells])
        more = f" (+{len(c.cells) - max_cells} cells)" if len(c.cells) > max_cells else ""
        parts.append(f"{head} [{cells}{more}]")
        if c.skipped:
            parts.append("not run: " + "; ".join(f"{n} ({t})" for n, t in c.skipped[:max_cells]))
    return " | ".join(parts)


def _main(comps: list[Comparison], decisions: list) -> tuple:
    """The comparison a claim's effect is shown by: of a family (a competitor each), the closest one (its smallest
    effect); otherwise the first that is not a guard."""
    pairs = [(c, d) for c, d in zip(comps, decisions) if not c.guard]
    shown = [(c, d) for c, d in pairs if c.display]
    if shown:
        return shown[0]
    if len(pairs) > 1 and all(c.family > 1 for c, _ in pairs):
        return min(pairs, key=lambda cd: cd[1].point if cd[1].point == cd[1].point else math.inf)
    return pairs[0]


def _paper_effect(paper: dict | None, comp: Comparison) -> float | None:
    """The paper's own effect for a comparison: the mean of its printed cells that this comparison's cells match
    (pFedSD's Fashion-MNIST 20-client column for the mini's), else its effect over all its cells."""
    if not paper:
        return None
    same = [paper["cells"][s.name] for s in comp.cells if s.name in paper["cells"]]
    same = [x for x in same if x == x]
    return float(np.mean(same)) if same else paper["pooled"]


def _decide(claim: dict, comps: list[Comparison], paper_points: dict | None, source: str) -> list[verdicts.Decision]:
    out = []
    for c, (hold, fail) in zip(comps, _levels(claim, comps)):
        pe = _paper_effect((paper_points or {}).get(c.label), c)
        d = verdicts.decide(c.cells, c.region, _quantifier(claim), pe, guard=c.guard, hold_alpha=hold, fail_alpha=fail,
                            hold_only=c.hold_only)
        if source == "paper":
            d.left_out = []
            if d.ci is not None and d.verdict in ("inconclusive", "underpowered"):
                d.verdict = "inconclusive"
                d.why = "the printed spread does not decide it"
            _paper_point_verdict(c, d, _quantifier(claim))
        out.append(d)
    return out


@dataclass
class Judgement:
    """A claim judged on one table: its verdict (before `partial` and `by design`), the comparisons and their
    decisions, and the evaluator (what it read)."""
    verdict: str
    comps: list
    decisions: list
    ev: Evaluator


def judge(claim: dict, table: pd.DataFrame, paper: bool = False, paper_points: dict | None = None,
          paper_seeds: int = DEFAULT_PAPER_SEEDS) -> Judgement:
    """One claim on one table in memory (the reproduced one, or the paper's printed numbers: `paper`); raises NotRun
    when there is nothing to evaluate. `benchmarks/bench_calibration.py` judges simulated tables with it."""
    ev = Evaluator(claim, table, paper=paper, paper_seeds=paper_seeds)
    comps = EVALUATORS[claim["form"]](ev)
    if not any(c.cells for c in comps if not c.guard):
        raise NotRun("; ".join(f"{n}: {t}" for c in comps for n, t in c.skipped) or "nothing to evaluate")
    comps = [c for c in comps if c.cells]
    decisions = _decide(claim, comps, paper_points, "paper" if paper else "results")
    return Judgement(verdicts.combine([d.verdict for d in decisions], _mode(claim)), comps, decisions, ev)


EMPTY_ROW = {"verdict": "not run", "evidence": "", "cells": [], "profile": None, "stand_in": [], "effect": None,
             "ci": None, "interval": "", "method": "", "seeds": 0, "mde": None, "points": {}, "absent": [],
             "min_test": None, "uses": [], "paper_effect": None, "paper_interval": "", "paper_verdict": "",
             "seed_sd": None, "paper_gap": None, "mde3": None, "region": "", "bounds": [], "cell_ci": [],
             "quantity_verdict": "", "robust_verdict": "", "robust_interval": "", "metric_sensitive": False,
             "paper_check": "", "power": None}


def evaluate(claim: dict, results: Path | str | None = None, doc: dict | None = None,
             source: str = "results") -> dict:
    """One claim -> {paper, id, stage, table, form, quote, verdict, effect, ci, interval, seeds, mde, paper_effect,
    paper_verdict, absent, min_test, uses, evidence, cells, profile, stand_in, quantity_verdict, robust_verdict,
    metric_sensitive, paper_check, ...} (module docstring)."""
    doc = doc or {}
    stage, stem = claim["where"]["stage"], claim["where"].get("table", "table")
    row = {"paper": doc.get("paper", ""), "id": claim["id"], "stage": stage, "table": stem,
           "form": claim["form"], "quote": claim["quote"], **{k: (v.copy() if isinstance(v, (list, dict)) else v)
                                                             for k, v in EMPTY_ROW.items()},
           "paper_inconsistent": claim.get("paper_inconsistent", ""), "note": claim.get("note", ""),
           "by_design": claim.get("by_design", ""), "headline": bool(claim.get("headline", False))}
    paper = None
    if source != "paper":
        paper = evaluate(claim, None, doc, source="paper")
        row.update(paper_effect=paper["effect"], paper_interval=paper["interval"] or paper["evidence"][:200],
                   paper_verdict=paper["verdict"])
        row["paper_check"] = paper_check(claim, paper["verdict"])
    try:
        table = _table(claim, results, source, row)
        j = judge(claim, table, source == "paper", None if source == "paper" else paper["points"],
                  doc.get("paper_seeds", DEFAULT_PAPER_SEEDS))
        _describe_judgement(row, j, paper)
        verdict = _undecided_by_power(j.verdict, row)
        if source != "paper":
            row["stand_in"] = j.ev.stand_in(claim.get("paper_datasets", doc.get("paper_datasets")))
            row["absent"] = sorted(set(_absent_competitors(claim, j.ev)) | {a for c in j.comps for a in c.absent})
            if verdict == "holds" and row["absent"]:
                verdict = "partial"
            _robustness(row, claim, table, paper, verdict)
            if claim.get("by_design"):       # shown, never counted; the quantity's own verdict stays visible
                row["quantity_verdict"], verdict = verdict, "by design"
        row["verdict"] = verdict
    except NotRun as e:
        row["verdict"], row["evidence"] = "not run", str(e)
    return row


def _describe_judgement(row: dict, j: Judgement, paper: dict | None) -> None:
    """Fill a claim's row from its judgement: the effect shown (its main comparison), the interval, the cells,
    the region and its bounds (for the forest plot), the per-seed spread, the paper's gap, the runs read."""
    main, d = _main(j.comps, j.decisions)
    row.update(effect=d.point, ci=d.ci, interval=d.interval_text(), method=d.method, seeds=d.seeds, mde=d.mde,
               points={c.label: {"pooled": x.point, "cells": {s.name: s.point for s in c.cells}}
                       for c, x in zip(j.comps, j.decisions)}, evidence=_evidence(j.comps, j.decisions),
               region=str(main.region), bounds=main.region.boundary(),
               cell_ci=[[n, list(c) if c is not None else None] for n, c in d.cell_ci.items()])
    row["region_spec"] = {"op": main.region.op, "t": main.region.t, "lo": main.region.lo, "hi": main.region.hi,
                          "null": main.region.null, "above": main.region.above}
    row["cells"] = [{"cell": s.name, "effect": s.point, "seeds": s.n, "numbers": s.text} for s in main.cells]
    spread = [float(np.var(s.values, ddof=1)) for s in main.cells
              if s.values is not None and s.n >= 2 and np.all(np.isfinite(s.values))]
    row["seed_sd"] = math.sqrt(float(np.mean(spread))) if spread else None   # per-seed sd of the main effect
    pe = _paper_effect((paper or {}).get("points", {}).get(main.label), main)
    row["paper_gap"] = main.region.gap(pe) if pe is not None and pe == pe else None
    needed = [d for c, d in zip(j.comps, j.decisions) if not c.guard]
    any_pair = j.ev.c.get("pairs") == "any"
    row["power"] = _claim_power([d.power for d in needed], any_pair)
    if row["power"] is not None and row["power"] < verdicts.POWER:   # planning: the seeds that would give 80 %
        row["seeds_for_power"] = seeds_needed(lambda n: _claim_power([d.power_at(n) for d in needed], any_pair))
    used = [v for c in j.comps for v in c.used]
    row["uses"] = sorted({json.dumps({k: str(x) for k, x in v.keys.items()}, sort_keys=True) for v in used if v.keys})
    tests = [v.min_test for v in used if v.min_test == v.min_test]
    row["min_test"] = int(min(tests)) if tests else None


def _claim_power(powers: list, any_pair: bool) -> float | None:
    """A claim's power from its comparisons' (each needed: the product; `pairs: any`: one of them); None if one is
    unknown."""
    if not powers or any(p is None for p in powers):
        return None
    return 1 - float(np.prod([1 - p for p in powers])) if any_pair else float(np.prod(powers))


def _undecided_by_power(verdict: str, row: dict) -> str:
    """A claim that neither holds nor fails is *inconclusive* when this profile had at least POWER (80 %) to hold it
    were the paper's own effects true (every comparison it needs, `row['power']`), *underpowered* below; where that
    power is not known, the comparisons' own labels (`verdicts.combine`) stand."""
    if verdict not in ("inconclusive", "underpowered") or row.get("power") is None:
        return verdict
    return "inconclusive" if row["power"] >= verdicts.POWER else "underpowered"


def _robustness(row: dict, claim: dict, table: pd.DataFrame, paper: dict | None, verdict: str) -> None:
    """The same claim on the mean over the last tenth of the evaluations (ROBUST_COLUMN) instead of the best round,
    where the table has it per seed and the claim reads the best-round column: `metric_sensitive` when a decided
    verdict is not the same there."""
    refs = [r for k in ("a", "b", "above", "below", "among", "exclude", "series", "num", "den", "value")
            for r in _as_list(claim.get(k, []))]
    if claim.get("column", "reproduced") != "reproduced" or any(isinstance(r, dict) and "column" in r for r in refs) \
            or not {ROBUST_COLUMN, f"{ROBUST_COLUMN}_seeds"} <= set(table.columns) or claim.get("noise") == "none":
        return
    alt = {**claim, "column": ROBUST_COLUMN}
    alt.pop("std", None)
    try:
        j = judge(alt, table, paper_points=None if paper is None else paper["points"])
    except NotRun:
        return
    robust = "partial" if j.verdict == "holds" and row["absent"] else j.verdict
    if robust in ("inconclusive", "underpowered"):       # labelled as the best-round reading is (its power)
        robust = _undecided_by_power(robust, row)
    _, d = _main(j.comps, j.decisions)
    row["robust_verdict"], row["robust_interval"] = robust, d.interval_text()
    row["metric_sensitive"] = verdict in verdicts.DECIDED and robust != verdict


def paper_check(claim: dict, paper_verdict: str) -> str:
    """The sentence against the paper's own printed numbers, computed whenever claims are checked: '' when they
    agree (or cannot be checked), else what disagrees."""
    marked = claim.get("paper_inconsistent", "")
    if paper_verdict == "fails":
        return "the paper's own printed numbers contradict this sentence" + ("" if marked else " (not marked)")
    if marked and paper_verdict == "holds":
        return "marked inconsistent, yet the paper's printed numbers support the sentence"
    return ""


def check(results: Path | str | None = None, paper: str | None = None, source: str = "results") -> list[dict]:
    """Every claim of every paper (or one paper) on a results directory, or on the paper's own numbers; each row
    with its independence group (claims that read the same runs share one: `independence`)."""
    rows = []
    for path in claims_files():
        doc = load(path)
        if paper and doc["paper"] != paper:
            continue
        rows += [evaluate(c, results, doc, source) for c in doc["claims"]]
    groups = independence(rows, Path(results) if results is not None else _results_root())
    for r in rows:
        r["group"] = groups.get((r["paper"], r["id"]), "")
    if source != "paper":
        power_at_three_seeds(rows)
        what_would_decide(rows, Path(results) if results is not None else _results_root())
    return rows


def _in_points(r: dict) -> bool:
    """A claim whose effect is a difference of accuracies (points) on a stage's main table."""
    return r["table"] == "table" and r["form"] in ("order", "order_all", "best", "trend", "near") and \
        not str(r.get("interval", "")).startswith("nan")


def power_at_three_seeds(rows: list[dict]) -> None:
    """A claim left without an interval (fewer than 3 seeds) is underpowered; what would 3 seeds detect? Its
    detectable effect at 3 paired seeds, `mde3` = (t_.95,2 + t_.80,2) x sd / sqrt(3), with sd the median per-seed
    spread of the same paper's accuracy-difference claims that ran 3 or more seeds: an estimate for planning, never
    used to decide a verdict. Said in the row's evidence beside the paper's own effect."""
    from scipy import stats
    factor = float((stats.t.ppf(1 - verdicts.ALPHA, 2) + stats.t.ppf(verdicts.POWER, 2)) / math.sqrt(3))
    for paper in {r["paper"] for r in rows}:
        mine = [r for r in rows if r["paper"] == paper and _in_points(r)]
        ref = [r["seed_sd"] for r in mine if r["seeds"] >= verdicts.MIN_SEEDS and r["seed_sd"] is not None]
        if not ref:
            continue
        sd = float(np.median(ref))
        for r in mine:
            if r["verdict"] != "underpowered" or r["ci"] is not None:
                continue
            r["mde3"] = factor * sd
            verdict = ("" if r["paper_gap"] is None else
                       f"; the paper's effect ({_fmt(r['paper_gap'])}) would be "
                       f"{'detectable' if r['paper_gap'] > r['mde3'] else 'too small still'}")
            r["evidence"] = (f"at 3 paired seeds this profile would detect about {_fmt(r['mde3'])} (spread "
                             f"borrowed from {len(ref)} of this paper's 3-seed claims, median sd {_fmt(sd)})"
                             f"{verdict} | " + r["evidence"])


MAX_SEEDS = 100   # "more than 100 paired seeds" is what the planning below says beyond this


def seeds_needed(power_at, target: float = verdicts.POWER) -> int | None:
    """The fewest paired seeds n (at least MIN_SEEDS) at which the claim would hold with probability >= `target` were
    the paper's own effects true, at this profile's per-seed spread: `power_at(n)` is the claim's power at n seeds
    (every comparison and cell it needs, at their levels: `verdicts.power` with `n`). None: not known (no spread, or
    the paper's effect is not beyond the boundary); MAX_SEEDS + 1: more than MAX_SEEDS."""
    for n in range(verdicts.MIN_SEEDS, MAX_SEEDS + 1):
        p = power_at(n)
        if p is None:
            return None
        if p >= target:
            return n
    return MAX_SEEDS + 1


def what_would_decide(rows: list[dict], results_root: Path) -> None:
    """For each undecided headline claim: the paired seeds at which it would hold with 80 % power were the paper's own
    effects true (`seeds_needed`: every comparison and cell it needs, at this profile's per-seed spreads), and what
    they would cost on this machine: the measured wall time of the runs the claim read, per seed, times the seeds
    still to run (`decide_seeds`, `decide_cpu_hours`). Planning, never a verdict."""
    for r in rows:
        if not r.get("headline") or r["verdict"] not in ("inconclusive", "underpowered"):
            continue
        n = r.get("seeds_for_power")
        if r.get("power") is not None and r["power"] >= verdicts.POWER:
            n = r["seeds"]              # inconclusive: the seeds already had the power; the effect is not there
        r["decide_seeds"] = n
        r["decide_note"] = ("these seeds had the power: an effect of the paper's size would likely have shown" if n == r["seeds"] else
                            f"at least {verdicts.MIN_SEEDS} (no spread at {r['seeds']} seed)" if r["seeds"] <
                            verdicts.MIN_SEEDS else "")
        n = verdicts.MIN_SEEDS if n is None and r["seeds"] < verdicts.MIN_SEEDS else n
        runs = _stage_runs(results_root, r["stage"])
        walls = {} if runs is None or "wall_s" not in runs.columns else dict(zip(runs["run"].astype(str),
                                                                                 pd.to_numeric(runs["wall_s"], errors="coerce")))
        used = [walls[x] for x in _runs_of(r, results_root) if x in walls and walls[x] == walls[x]]
        per_seed = sum(used) / r["seeds"] if used and r["seeds"] else None
        r["decide_cpu_hours"] = (per_seed * max(n - r["seeds"], 0) / 3600 if per_seed is not None and n is not None
                                 and n <= MAX_SEEDS else None)


def _stage_runs(results_root: Path, stage: str) -> pd.DataFrame | None:
    path = results_root / stage / "runs.csv"
    try:
        return pd.read_csv(path, keep_default_na=False) if path.exists() else None
    except (OSError, ValueError):
        return None


def _runs_of(row: dict, results_root: Path) -> set[str]:
    """The runs a claim read: its values' (dataset, setting, method) keys matched in its stage's runs.csv; where
    that cannot be matched, the stage's table itself stands for them."""
    runs = _stage_runs(results_root, row["stage"])
    out = set()
    for key in row["uses"]:
        k = json.loads(key)
        hit = None
        if runs is not None and "run" in runs.columns:
            m = np.ones(len(runs), dtype=bool)
            for col, val in k.items():
                if col in runs.columns:
                    m &= runs[col].astype(str).to_numpy() == val
            hit = set(runs.loc[m, "run"].astype(str)) if m.any() else None
        out |= hit if hit else {f"{row['stage']}/{row['table']}:{key}"}
    return out


def independence(rows: list[dict], results_root: Path) -> dict:
    """(paper, id) -> group label: claims that read any run in common are one group (union-find); a group is named
    after its first claim. The summary counts groups, not claims, as independent tests."""
    parent: dict = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x
    owner: dict = {}
    for r in rows:
        if r["verdict"] == "not run":
            continue
        me = (r["paper"], r["id"])
        find(me)
        for run in _runs_of(r, results_root):
            if run in owner:
                parent[find(me)] = find(owner[run])
            else:
                owner[run] = me
    first = {}
    for r in rows:
        me = (r["paper"], r["id"])
        if me in parent:
            first.setdefault(find(me), r["id"])
    return {me: first[find(me)] for me in parent}


# ------------------------------------------------------------------ output
def summary(rows: list[dict]) -> dict:
    out: dict = {}
    for r in rows:
        out.setdefault(r["paper"], {v: 0 for v in VERDICTS})[r["verdict"]] += 1
    return out


def independent_tests(rows: list[dict]) -> int:
    """How many independence groups decided something (holds, partial or fails): claims read from the same runs
    count once."""
    return len({(r["paper"], r.get("group") or r["id"]) for r in rows if r["verdict"] in verdicts.DECIDED})


def headline(rows: list[dict]) -> str:
    """The paper's headline claims (abstract and main 'best' claims) in one line: 'holds 1, fails 2 of 3 (ids)'."""
    top = [r for r in rows if r.get("headline")]
    if not top:
        return "no headline claim marked"
    counts = {v: sum(r["verdict"] == v for r in top) for v in VERDICTS}
    return ", ".join(f"{n} {v}" for v, n in counts.items() if n) + f" of {len(top)} (" + \
        ", ".join(f"{r['id']}: {r['verdict']}" for r in top) + ")"


def paper_text(r: dict) -> str:
    """The claim on the paper's own printed numbers: its effect and verdict there."""
    if not r.get("paper_verdict"):
        return ""
    if r["paper_verdict"] == "not run":
        return "not checkable on the printed numbers"
    return f"{r['paper_interval'] or _fmt(r['paper_effect'])}: {r['paper_verdict']}"


def _flags(r: dict) -> list[str]:
    out = []
    if r.get("absent"):
        out.append(f"absent: {', '.join(r['absent'])}")
    if r.get("mde3") is not None:
        out.append(f"at 3 seeds: detectable about {_fmt(r['mde3'])}"
                   + ("" if r.get("paper_gap") is None else f" (the paper's effect {_fmt(r['paper_gap'])})"))
    if r.get("min_test") is not None and r["min_test"] < SMALL_TEST:
        out.append(f"smallest client test set {r['min_test']} images")
    if r.get("stand_in"):
        out.append(f"on {'/'.join(r['stand_in'])} (a stand-in for the paper's datasets)")
    if r.get("by_design"):
        q = r.get("quantity_verdict")
        out.append(f"by design: {r['by_design']}" + (f" (the quantity itself: {q})" if q else ""))
    if r.get("power") is not None and r["verdict"] not in ("holds", "partial", "by design"):
        out.append(f"power at the paper's own effect: {100 * r['power']:.0f} %")
    if r.get("metric_sensitive"):
        out.append(f"metric-sensitive: on the mean of the last tenth of the rounds, {r['robust_verdict']} "
                   f"({r['robust_interval']})")
    if r.get("paper_check"):
        out.append(r["paper_check"])
    if r.get("group") and r["group"] != r["id"]:
        out.append(f"same runs as {r['group']}")
    return out


def format_text(rows: list[dict]) -> str:
    mark = {"holds": "[x]", "partial": "[~]", "fails": "[!]", "inconclusive": "[?]", "underpowered": "[.]",
            "by design": "[=]", "not run": "[ ]"}
    lines = []
    for paper, counts in summary(rows).items():
        mine = [r for r in rows if r["paper"] == paper]
        lines.append(f"{paper}: " + ", ".join(f"{n} {v}" for v, n in counts.items())
                     + f"; independent tests decided: {independent_tests(mine)}")
        lines.append(f"  headline: {headline(mine)}")
        for r in mine:
            extra = f", profile {r['profile']}" if r["profile"] else ""
            lines.append(f"  {mark[r['verdict']]} {r['verdict']:<12} {r['id']} ({r['stage']}{extra})")
            lines.append(f"      \"{r['quote']}\"")
            if r.get("interval"):
                lines.append(f"      effect {r['interval']}" + (f"; paper's numbers: {paper_text(r)}" if paper_text(r) else ""))
            for f in _flags(r):
                lines.append(f"      {f}")
            lines.append(f"      {r['evidence']}")
            if r["paper_inconsistent"]:
                lines.append(f"      paper's own numbers: {r['paper_inconsistent']}")
            if r["note"]:
                lines.append(f"      note: {r['note']}")
    return "\n".join(lines)


def esc(s) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def to_markdown(rows: list[dict]) -> str:
    """The checklist as a markdown table per paper (for the report stage)."""
    out = []
    for paper, counts in summary(rows).items():
        mine = [r for r in rows if r["paper"] == paper]
        out.append(f"### {paper}: " + ", ".join(f"{n} {v}" for v, n in counts.items() if n) + "\n")
        out.append(f"Headline: {headline(mine)}. Independent tests decided: {independent_tests(mine)}.\n")
        out.append("| verdict | claim | quote | effect [95 % CI] | paper's numbers | evidence |\n|---|---|---|---|---|---|")
        for r in mine:
            where = f"{r['id']}<br>`{r['stage']}`" + "".join(f"<br>{f}" for f in _flags(r))
            ev = r["evidence"] + (f" — paper's own numbers: {r['paper_inconsistent']}" if r["paper_inconsistent"] else "")
            out.append(f"| {r['verdict']} | {esc(where)} | {esc(r['quote'])} | {esc(r.get('interval', ''))} | "
                       f"{esc(paper_text(r))} | {esc(ev)} |")
        out.append("")
    return "\n".join(out)


def cli(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="pflrepro claims", description="Check the papers' claims on reproduced tables.")
    add_arguments(ap)
    return run_cli(ap.parse_args(argv))


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--results", help="results directory (default: $PFLREPRO_RESULTS or results/)")
    ap.add_argument("--paper", help="one paper (pfedsd, dcpfl, scd, ...)")
    ap.add_argument("--on-paper-numbers", action="store_true",
                    help="evaluate on the papers' own printed numbers (the self-check)")
    ap.add_argument("--format", choices=("text", "markdown", "json"), default="text")


def run_cli(a) -> int:
    try:
        rows = check(a.results, a.paper, "paper" if a.on_paper_numbers else "results")
    except ClaimsError as e:
        print(f"claims error: {e}")
        return 2
    if not rows:
        print(f"no claims for paper {a.paper!r}; files: {', '.join(p.name for p in claims_files())}")
        return 2
    if a.format == "json":
        print(json.dumps(rows, indent=1, default=str))
    elif a.format == "markdown":
        print(to_markdown(rows))
    else:
        print(format_text(rows))
    return 0
