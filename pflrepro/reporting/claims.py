"""The papers' claims about their own results, checked against what a profile reproduced.

Each paper has `paper_numbers/<paper>_claims.yaml`: the sentences its abstract and results sections say
about its own tables, each quoted exactly and given a machine-checkable form over the cells of one
table a notebook writes (`results/<stage>/<table>.csv`). `check()` evaluates every claim on a results
directory (default `results/`, or `$PFLREPRO_RESULTS`, as `experiments.output_dirs`) and returns one
row per claim: paper, id, quote, verdict (holds / fails / undecided / not run), the numbers that
decided it, the cells it was evaluated on, and whether those are the paper's datasets or an offline
stand-in (`mini` runs Fashion-MNIST where a paper ran CIFAR). `python -m pflrepro claims` prints it.

Claims read REPRODUCED values (`reproduced` ± `repro_std` in the accuracy tables, or the column a
claim names); only `near` with `quantity: value` compares with the printed paper column, which is
what that form is for.

Forms (fields beyond the common ones; a *ref* is a method name or a mapping of column filters,
optionally with `column:`/`std:` to read another value column, e.g. `{tau: 3}` or
`{column: last local model}`):

- `order`      a > b (b may be a list: a > each), optionally `by:` a margin in the column's units.
- `order_all`  every ref in `above` > every ref in `below` in a cell (`pairs: any`: at least one pair).
- `best`       a (or the best of a list) beats every other method of the cell, or of `among`
               (minus `exclude`).
- `trend`      a series along an ordered column (`along:` setting by default; `order:` the values, or
               the values present sorted by the number in them) is `increasing`, `decreasing` or has an
               interior `peak`; one series per ref in `series` (default: each method present), or,
               along `method`, one per cell. `steps: all` (default): no step decidedly against the
               direction and the ends decidedly in it; `steps: ends`: the ends only ("tends to"). A peak
               holds when the highest interior point is decidedly above both ends and fails when the
               higher end is decidedly above every interior point.
- `ratio`      num / den (num may be a list), or a column that already is a ratio (`value:` ref, e.g.
               a speedup), against `at_least` and/or `at_most`.
- `near`       a quantity within `tolerance` of a printed number: `value` (each cell against its
               `paper` column), `diff` (a - b), `ratio` (a / b) or `margin` (a - the best other
               method) against `target`.

Common fields: id, quote (verbatim; a sentence broken by a table in the source joins its parts with
"[...]"), section, where {stage, table}, form, column (default `reproduced`), std (default
`repro_std`), select {column: value or list} (the cells a claim is about; default all), group_by
(cell keys; default the key columns dataset/setting/panel/metric/method present and not used by the refs),
quantifier over cells (`all` default, `most` = more than half, `any`), aggregate (`mean` / `max` over
the cells before deciding; `order`, `ratio`, `near`), better (`higher` default / `lower`), min_gap,
noise (`seeds` default / `none` for exact measurements: bytes, MACs), missing (`skip` default / `fails`:
a blank value, e.g. a speedup never reached, decides against the claim), profiles (run only on these
profiles' outputs), paper_datasets (the datasets the paper's sentence is about; other datasets are
reported as a stand-in), paper_view (how the claim reads `paper_numbers/` for the self-check, or false),
note, paper_inconsistent (where the paper's own numbers contradict its sentence: said, not hidden).

THE UNDECIDED RULE. One seed cannot decide a claim inside its noise. Every value gets a noise
half-width e: its standard deviation over seeds where the table has one (n >= 2 seeds; a single seed's
std is blank, see report.compare), otherwise min_gap / 2 (min_gap: the claim's, else the file's, else
DEFAULT_MIN_GAP = 1.0 accuracy point), or 0 for `noise: none`. A difference A - B then carries
e_A + e_B (with seeds: |mean_A - mean_B| <= std_A + std_B is undecided; single seeds: a difference of
at most min_gap is undecided), a ratio A / B carries |A/B| (e_A/|A| + e_B/|B|), a mean over k cells
sqrt(sum e_i^2) / k. A comparison of a quantity q (noise e) with a threshold t is undecided when
|q - t| <= e, else decided by the comparison (with e = 0, by the plain comparison, so `at_most: 1`
holds at exactly 1). `near` compares |q - target| with the tolerance the same way.

PAIRED SEEDS. Seed s draws the same partition and initialisation for every method, and the partition moves
all methods together (3-6 points between seeds on pFedSD Table 2). Where a table has `repro_seeds` (each
seed's value, report.compare) and both sides of a difference ran two or more common seeds, the difference
is paired: its value is the mean of the per-seed differences and its noise their std over seeds, floored
at min_gap / 2 (the same strength as the unpaired rule, a spread and not a standard error). Ratios stay
unpaired.
OVER CELLS. `all` holds when every cell holds and fails when any fails; `most` holds when more than half hold and fails
when at least half fail; `any` holds when one holds and fails when all fail; otherwise undecided.
A claim is `not run` when its table, profile, cells or methods are not in the outputs.

`check(source="paper")` evaluates the same claims on the paper's own printed numbers
(`paper_numbers/<paper_table>.csv` of the stage's params file, or `paper_numbers/<stage>.csv` for a stage
not built yet; its printed std over seeds where it has one): a claim that fails there is either
mis-encoded or marked `paper_inconsistent`, and one so marked must not hold there (tests/test_claims.py).
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]   # = paths.REPO_ROOT (not imported: no torch for a checklist)
CLAIMS_DIR = REPO_ROOT / "paper_numbers"
DEFAULT_MIN_GAP = 1.0
VERDICTS = ("holds", "fails", "undecided", "not run")
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
KEY_COLUMNS = ("dataset", "setting", "panel", "metric", "method")

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
        raise ClaimsError(f"{where}: unknown top-level key(s) {', '.join(unknown)} (allowed: {', '.join(sorted(TOP))})")
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
        raise ClaimsError(f"{name}: unknown form {form!r} (forms: {', '.join(FORMS)})")
    required, optional = FORMS[form]
    missing = sorted(({"quote", "where"} | required) - set(c))
    if missing:
        raise ClaimsError(f"{name}: form {form!r} needs {', '.join(missing)}")
    unknown = sorted(set(c) - COMMON - required - optional)
    if unknown:
        raise ClaimsError(f"{name}: unknown field(s) {', '.join(unknown)} for form {form!r}")
    if not isinstance(c["quote"], str) or len(c["quote"].split()) < 3:
        raise ClaimsError(f"{name}: 'quote' must be the sentence quoted from the paper")
    w = c["where"]
    if not isinstance(w, dict) or not isinstance(w.get("stage"), str) or set(w) - {"stage", "table"}:
        raise ClaimsError(f"{name}: 'where' must be {{stage: <stage name>, table: <csv stem>}}")
    for key, allowed in CHOICES.items():
        if key in c and c[key] not in allowed:
            raise ClaimsError(f"{name}: {key}={c[key]!r}, allowed: {', '.join(allowed)}")
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
            raise ClaimsError(f"{name}: quantity={q!r}, allowed: {', '.join(CHOICES['quantity'])}")
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


# ------------------------------------------------------------------ numbers with noise
@dataclass
class Val:
    label: str
    x: float
    e: float
    rule: str   # "std" (seeds' spread), "min_gap" (one seed or no spread in the table), "exact", "paired"
    per_seed: dict | None = None   # seed -> value, from the table's `repro_seeds` (pairs differences)

    def __str__(self):
        return f"{self.label} {_fmt(self.x)}" + (f"±{_fmt(self.e)}" if self.e else "")


def _parse_seeds(cell) -> dict | None:
    """`repro_seeds` ("0:93.81;1:90.83") -> {0: 93.81, 1: 90.83}; None when blank or malformed."""
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


def minus(a: Val, b: Val, sign: float = 1.0, floor: float = 0.0) -> Val:
    """sign * (a - b) with its noise. Where both carry per-seed values on two or more common seeds, the
    difference is PAIRED: the mean of the per-seed differences, with noise max(their std, floor) (seed s
    draws the same partition and initialisation for every method, so the partition's share of the spread
    cancels). Otherwise unpaired: the difference of the means with noise e_a + e_b."""
    common = sorted(set(a.per_seed or {}) & set(b.per_seed or {}))
    label = f"{a.label}-{b.label}"
    if len(common) >= 2 and a.rule != "exact":
        d = [sign * (a.per_seed[s] - b.per_seed[s]) for s in common]
        return Val(label, float(np.mean(d)), max(float(np.std(d, ddof=1)), floor), "paired",
                   dict(zip(common, d)))
    return Val(label, sign * (a.x - b.x), a.e + b.e, a.rule)


def _paired_text(q: Val) -> str:
    return (f" (paired over seeds {', '.join(map(str, q.per_seed))}: "
            f"{', '.join(f'{d:+.2f}' for d in q.per_seed.values())})") if q.rule == "paired" else ""


def _fmt(x: float) -> str:
    if x != x:
        return "nan"
    return f"{x:.2f}" if abs(x) >= 10 else f"{x:.4g}"


def decide(q: float, e: float, op: str, t: float) -> str:
    """holds / fails / undecided for `q op t`, q carrying noise half-width e (see module docstring)."""
    if q != q:
        return "undecided"
    if e > 0 and abs(q - t) <= e:
        return "undecided"
    ok = {">": q > t, "<": q < t, ">=": q >= t, "<=": q <= t}[op]
    return "holds" if ok else "fails"


def combine(results: list[str], quantifier: str = "all") -> str:
    n = len(results)
    h, f = results.count("holds"), results.count("fails")
    if quantifier == "all":
        return "fails" if f else ("holds" if h == n else "undecided")
    if quantifier == "most":
        return "holds" if h > n / 2 else ("fails" if f >= n / 2 else "undecided")
    return "holds" if h else ("fails" if f == n else "undecided")


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
    """One claim on one table."""

    def __init__(self, claim: dict, table: pd.DataFrame, min_gap: float):
        self.c = claim
        self.df = table
        self.column = claim.get("column", "reproduced")
        self.std = claim.get("std", "repro_std")
        self.min_gap = float(claim.get("min_gap", min_gap))
        self.sign = -1.0 if claim.get("better") == "lower" else 1.0
        self.exact = claim.get("noise") == "none"
        self.missing_fails = claim.get("missing") == "fails"
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
        label = _ref_label(ref)
        if x != x:
            if self.missing_fails:
                return Val(label, float("nan"), 0.0, "blank")
            return None
        per_seed = _parse_seeds(row.get("repro_seeds")) if col == "reproduced" and not self.exact else None
        return Val(label, x, *self._noise(row, d.get("std", self.std)), per_seed)

    def minus(self, a: Val, b: Val, sign: float | None = None) -> Val:
        """a - b (times the claim's sign unless given) with its noise, paired over seeds where it can be."""
        return minus(a, b, self.sign if sign is None else sign, floor=0.0 if self.exact else self.min_gap / 2)

    def _noise(self, row: dict, std_col) -> tuple[float, str]:
        if self.exact:
            return 0.0, "exact"
        s, seeds = _num(row.get(std_col)), _num(row.get("seeds"))
        if s == s and (seeds != seeds or seeds >= 2):
            return s, "std"
        return self.min_gap / 2, "min_gap"

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


def _describe(df: pd.DataFrame) -> str:
    parts = []
    for k in ("dataset", "setting"):
        if k in df.columns:
            parts.append(f"{k}: {', '.join(map(str, pd.unique(df[k])))}")
    return "; ".join(parts) or f"{len(df)} rows"


def _sweep_key(v):
    m = re.search(r"(-?[0-9]+(?:\.[0-9]+)?)", str(v))
    return (0, float(m.group(1)), str(v)) if m else (1, 0.0, str(v))


# ------------------------------------------------------------------ the forms
def _diff(ev: Evaluator, a: Val, b: Val, by: float = 0.0) -> tuple[str, str]:
    if a.x != a.x or b.x != b.x:
        return "fails", f"{a} vs {b}: blank"
    q = ev.minus(a, b)
    r = decide(q.x, q.e, ">", by)
    rel = ">" if ev.sign > 0 else "<"
    return r, (f"{a} {rel} {b}? gap {q.x:+.2f} vs noise {q.e:.2f}{f' + margin {by}' if by else ''}"
               f"{_paired_text(q)}: {r}")


def _eval_order(ev: Evaluator):
    by = float(ev.c.get("by", 0.0))
    per_b: dict[int, list] = {i: [] for i in range(len(_as_list(ev.c["b"])))}
    out = []
    for name, cell in ev.cells():
        a = ev.value(cell, ev.c["a"])
        bs = [ev.value(cell, b) for b in _as_list(ev.c["b"])]
        if a is None or any(b is None for b in bs):
            out.append((name, None, "not in this profile: " + _absent(ev, cell, [ev.c["a"], *_as_list(ev.c["b"])])))
            continue
        if ev.c.get("aggregate"):
            for i, b in enumerate(bs):
                per_b[i].append((name, ev.minus(a, b), f"{a} vs {b}"))
            continue
        res = [_diff(ev, a, b, by) for b in bs]
        out.append((name, combine([r for r, _ in res], "all"), "; ".join(t for _, t in res)))
    for items in per_b.values():   # aggregate: one decision per b on the mean (or max) difference
        for name, q, text in _aggregate(ev, items):
            r = decide(q.x, q.e, ">", by)
            out.append((name, r, f"{q.label} = {q.x:+.2f} vs noise {q.e:.2f}"
                                 f"{f' + margin {by}' if by else ''} [{text}]: {r}"))
    return out


def _eval_order_all(ev: Evaluator):
    out = []
    for name, cell in ev.cells():
        refs = [*_as_list(ev.c["above"]), *_as_list(ev.c["below"])]
        above = [v for v in (ev.value(cell, r) for r in _as_list(ev.c["above"])) if v is not None]
        below = [v for v in (ev.value(cell, r) for r in _as_list(ev.c["below"])) if v is not None]
        if not above or not below:
            out.append((name, None, "not in this profile: " + _absent(ev, cell, refs)))
            continue
        res = [_diff(ev, a, b) for a in above for b in below]
        verdict = combine([r for r, _ in res], ev.c.get("pairs", "all"))
        shown = [t for r, t in res if r == verdict] or [t for _, t in res]   # the pairs that decided it
        note = _absent(ev, cell, refs)
        out.append((name, verdict, "; ".join(shown[:6]) + (f" (absent: {note})" if note else "")))
    return out


def _competitors(ev: Evaluator, cell: pd.DataFrame, exclude_refs: list) -> list:
    if "among" in ev.c:
        refs = _as_list(ev.c["among"])
    else:
        if "method" not in cell.columns:
            raise NotRun("'best' without 'among' needs a method column")
        refs = list(pd.unique(cell["method"]))
    drop = {json.dumps(_ref(r), sort_keys=True) for r in [*exclude_refs, *_as_list(ev.c.get("exclude", []))]}
    return [r for r in refs if json.dumps(_ref(r), sort_keys=True) not in drop]


def _eval_best(ev: Evaluator):
    out = []
    for name, cell in ev.cells():
        a_refs = _as_list(ev.c["a"])
        a_vals = [v for v in (ev.value(cell, r) for r in a_refs) if v is not None]
        if not a_vals:
            out.append((name, None, "not in this profile: " + _absent(ev, cell, a_refs)))
            continue
        a = max(a_vals, key=lambda v: ev.sign * v.x if v.x == v.x else -math.inf)
        comp = [v for v in (ev.value(cell, r) for r in _competitors(ev, cell, a_refs)) if v is not None]
        if not comp:
            out.append((name, None, "no competitor ran in this cell"))
            continue
        res = [_diff(ev, a, b) for b in comp]
        verdict = combine([r for r, _ in res], "all")
        runner = max(comp, key=lambda v: ev.sign * v.x if v.x == v.x else -math.inf)
        against = [t for r, t in res if r == verdict] if verdict != "holds" else []   # what kept it from holding
        text = "; ".join(against) if against else _diff(ev, a, runner)[1] + f" (runner-up of {len(comp)})"
        out.append((name, verdict, text))
    return out


def _eval_trend(ev: Evaluator):
    along = ev.c.get("along", "setting")
    direction, steps = ev.c["direction"], ev.c.get("steps", "all")
    out = []
    for name, cell in ev.cells():
        if along not in cell.columns:
            raise NotRun(f"the table has no column {along!r} to sweep along")
        present = list(pd.unique(cell[along]))
        order = _as_list(ev.c["order"]) if "order" in ev.c else sorted(present, key=_sweep_key)
        if along == "method":
            series = [(None, {})]
        elif "series" in ev.c:
            series = [(r, _ref_filters(r)) for r in _as_list(ev.c["series"])]
        else:
            if "method" not in cell.columns:
                series = [(None, {})]
            else:
                series = [(m, {"method": m}) for m in pd.unique(cell["method"])]
        for ref, filt in series:
            vals = []
            for point in order:
                sub = cell[_matches(cell[along], point)]
                v = ev.value(sub, {**filt, along: point} if along != "method" else point) if len(sub) else None
                if v is not None:
                    v.label = f"{point}"
                    vals.append(v)
            label = " / ".join(x for x in (name if name != "all rows" else "", _ref_label(ref) if ref is not None else "") if x) or name
            need = 3 if direction == "peak" else 2
            if len(vals) < need:
                out.append((label, None, f"{len(vals)} of the {len(order)} points ran ({along}: "
                                         f"{', '.join(map(str, present))}); {direction} needs {need} points"))
                continue
            verdict, text = _trend(vals, direction, steps, ev.minus)
            if len(vals) < len(order):
                text += f" ({len(vals)} of the {len(order)} points ran)"
            out.append((label, verdict, text))
    return out


def _trend(vals: list[Val], direction: str, steps: str, sub) -> tuple[str, str]:
    """`sub(a, b, sign)` is a - b with its noise (`Evaluator.minus`: paired over seeds where it can be)."""
    seq = " -> ".join(str(v) for v in vals)
    def gt(a: Val, b: Val, sign: float = 1.0) -> tuple[str, Val]:
        q = sub(a, b, sign)
        return decide(q.x, q.e, ">", 0), q
    if direction == "peak":
        inner = max(vals[1:-1], key=lambda v: v.x)
        (left, ql), (right, qr) = gt(inner, vals[0]), gt(inner, vals[-1])
        end = max((vals[0], vals[-1]), key=lambda v: v.x)
        if left == "holds" and right == "holds":
            return "holds", f"{seq}: interior max {inner} above both ends{_paired_text(ql)}{_paired_text(qr)}"
        up, qe = gt(end, inner)
        if up == "holds":
            return "fails", f"{seq}: end {end} above every interior point{_paired_text(qe)}"
        return "undecided", f"{seq}: interior max {inner} not decidedly above both ends"
    s = 1.0 if direction == "increasing" else -1.0
    ends, qe = gt(vals[-1], vals[0], s)
    against = [f"{a.label}->{b.label}" for a, b in zip(vals, vals[1:])
               if gt(a, b, s)[0] == "holds"] if steps == "all" else []
    if against:
        return "fails", f"{seq}: step(s) decidedly against {direction}: {', '.join(against)}"
    if ends == "fails":
        return "fails", f"{seq}: ends decidedly against {direction}{_paired_text(qe)}"
    return ends, f"{seq}: ends {'' if ends == 'holds' else 'not decidedly '}{direction}{_paired_text(qe)}"


def _ratio_val(a: Val, b: Val) -> Val:
    r = a.x / b.x if b.x else float("nan")
    e = abs(r) * ((a.e / abs(a.x) if a.x else 0.0) + (b.e / abs(b.x) if b.x else 0.0))
    return Val(f"{a.label}/{b.label}", r, e, a.rule if a.rule == b.rule else "mixed")


def _aggregate(ev: Evaluator, items: list[tuple[str, Val | None, str]]):
    """[(cell, quantity, text)] -> one item when the claim aggregates over cells."""
    how = ev.c.get("aggregate")
    done = [(n, q, t) for n, q, t in items if q is not None]
    if not how or not done:
        return items
    if how == "max":
        n, q, t = max(done, key=lambda it: it[1].x)
        return [(f"max over {len(done)} cells, at {n}", q, t)]
    k = len(done)
    x = sum(q.x for _, q, _ in done) / k
    e = math.sqrt(sum(q.e ** 2 for _, q, _ in done)) / k
    return [(f"mean over {k} cells ({', '.join(n for n, _, _ in done)})", Val("mean", x, e, done[0][1].rule),
             "; ".join(f"{n}: {q}" for n, q, _ in done))]


def _eval_ratio(ev: Evaluator):
    items = []
    for name, cell in ev.cells():
        if "value" in ev.c:
            refs = _as_list(ev.c["value"])
            qs = [ev.value(cell, r) for r in refs]
        else:
            den = ev.value(cell, ev.c["den"])
            refs = [*_as_list(ev.c["num"]), ev.c["den"]]
            nums = [ev.value(cell, r) for r in _as_list(ev.c["num"])]
            qs = [None if (n is None or den is None) else _ratio_val(n, den) for n in nums]
        for q in qs:
            items.append((name, q, "" if q is not None else "not in this profile: " + _absent(ev, cell, refs)))
    out = []
    for name, q, text in _aggregate(ev, items):
        if q is None:
            out.append((name, None, text))
            continue
        if q.x != q.x:
            out.append((name, "fails" if ev.missing_fails else None,
                        f"{q.label} is blank (e.g. a target never reached)" + (": fails" if ev.missing_fails else "")))
            continue
        res = []
        if "at_least" in ev.c:
            res.append(decide(q.x, q.e, ">=", float(ev.c["at_least"])))
        if "at_most" in ev.c:
            res.append(decide(q.x, q.e, "<=", float(ev.c["at_most"])))
        bounds = " and ".join(f"{k.replace('_', ' ')} {ev.c[k]}" for k in ("at_least", "at_most") if k in ev.c)
        verdict = combine(res, "all")
        out.append((name, verdict, f"{q} ({bounds}): {verdict}" + (f" [{text}]" if text and ev.c.get('aggregate') else "")))
    return out


def _eval_near(ev: Evaluator):
    q_kind, tol = ev.c["quantity"], float(ev.c["tolerance"])
    items = []
    for name, cell in ev.cells():
        if q_kind == "value":
            pcol, pstd = ev.c.get("paper_column", "paper"), ev.c.get("paper_std", "paper_std")
            if pcol not in cell.columns:
                raise NotRun(f"the table has no paper column {pcol!r}")
            for i in range(len(cell)):
                row = cell.iloc[[i]]
                label = name + (f" / {row.iloc[0]['method']}" if "method" in row.columns and len(cell) > 1 else "")
                v = ev.value(row, {})
                p = pd.to_numeric(row[pcol], errors="coerce").iloc[0]
                if v is None or p != p:
                    items.append((label, None, "no reproduced or no paper value"))
                    continue
                ps = pd.to_numeric(row[pstd], errors="coerce").iloc[0] if pstd in row.columns else float("nan")
                pv = Val("paper", float(p), float(ps) if ps == ps else 0.0, "printed")
                items.append((label, Val("reproduced-paper", v.x - pv.x, v.e + pv.e, v.rule), f"{v} vs {pv}"))
            continue
        a = ev.value(cell, ev.c["a"])
        if q_kind == "margin":
            comp = [v for v in (ev.value(cell, r) for r in _competitors(ev, cell, [ev.c["a"]])) if v is not None]
            b = max(comp, key=lambda v: ev.sign * v.x) if comp else None
        else:
            b = ev.value(cell, ev.c["b"])
        if a is None or b is None:
            items.append((name, None, "not in this profile: " + _absent(ev, cell, [ev.c["a"], ev.c.get("b", "")])))
            continue
        if q_kind == "ratio":
            q = _ratio_val(a, b)
        else:
            q = ev.minus(a, b)
        items.append((name, q, f"{a} vs {b}{_paired_text(q)}"))
    out = []
    for name, q, text in _aggregate(ev, items):
        if q is None:
            out.append((name, None, text))
            continue
        target = 0.0 if q_kind == "value" else float(ev.c["target"])
        d = abs(q.x - target)
        verdict = decide(d, q.e, "<=", tol)
        out.append((name, verdict, f"{text}: {q.label} = {_fmt(q.x)} vs {'paper' if q_kind == 'value' else _fmt(target)}"
                                   f", off by {_fmt(d)} (tolerance {tol}, noise {_fmt(q.e)}): {verdict}"))
    return out


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


def evaluate(claim: dict, results: Path | str | None = None, doc: dict | None = None,
             source: str = "results") -> dict:
    """One claim -> {paper, id, stage, table, form, quote, verdict, evidence, cells, profile, stand_in}."""
    doc = doc or {}
    where = claim["where"]
    stage, stem = where["stage"], where.get("table", "table")
    row = {"paper": doc.get("paper", ""), "id": claim["id"], "stage": stage, "table": stem,
           "form": claim["form"], "quote": claim["quote"], "verdict": "not run", "evidence": "",
           "cells": [], "profile": None, "stand_in": [], "paper_inconsistent": claim.get("paper_inconsistent", ""),
           "note": claim.get("note", "")}
    try:
        if source == "paper":
            row["profile"] = "paper numbers"
            table = paper_view_table(claim)
        else:
            root = Path(results) if results is not None else _results_root()
            path = root / stage / f"{stem}.csv"
            if not path.exists():
                raise NotRun(f"no {stage}/{stem}.csv under {root}")
            row["profile"] = _profile(path.parent)
            if claim.get("profiles") and row["profile"] not in claim["profiles"]:
                raise NotRun(f"the claim needs profile {' or '.join(claim['profiles'])}; "
                             f"this output is profile {row['profile']}")
            table = pd.read_csv(path)
        ev = Evaluator(claim, table, float(doc.get("min_gap", DEFAULT_MIN_GAP)))
        results_ = EVALUATORS[claim["form"]](ev)
        done = [(n, v, t) for n, v, t in results_ if v is not None]
        skipped = [(n, t) for n, v, t in results_ if v is None]
        if not done:
            raise NotRun("; ".join(f"{n}: {t}" for n, t in skipped) or "nothing to evaluate")
        row["verdict"] = combine([v for _, v, _ in done], claim.get("quantifier", "all"))
        row["cells"] = [{"cell": n, "verdict": v, "numbers": t} for n, v, t in done]
        row["evidence"] = " | ".join(f"{n}: {t}" for n, _, t in done)
        if skipped:
            row["evidence"] += " | not run: " + "; ".join(f"{n} ({t})" for n, t in skipped)
        if source != "paper":
            row["stand_in"] = ev.stand_in(claim.get("paper_datasets", doc.get("paper_datasets")))
    except NotRun as e:
        row["verdict"], row["evidence"] = "not run", str(e)
    return row


def check(results: Path | str | None = None, paper: str | None = None, source: str = "results") -> list[dict]:
    """Every claim of every paper (or one paper) on a results directory, or on the paper's own numbers."""
    rows = []
    for path in claims_files():
        doc = load(path)
        if paper and doc["paper"] != paper:
            continue
        rows += [evaluate(c, results, doc, source) for c in doc["claims"]]
    return rows


# ------------------------------------------------------------------ output
def summary(rows: list[dict]) -> dict:
    out: dict = {}
    for r in rows:
        out.setdefault(r["paper"], {v: 0 for v in VERDICTS})[r["verdict"]] += 1
    return out


def format_text(rows: list[dict]) -> str:
    mark = {"holds": "[x]", "fails": "[!]", "undecided": "[?]", "not run": "[ ]"}
    lines = []
    for paper, counts in summary(rows).items():
        lines.append(f"{paper}: " + ", ".join(f"{n} {v}" for v, n in counts.items()))
        for r in (r for r in rows if r["paper"] == paper):
            extra = f", profile {r['profile']}" if r["profile"] else ""
            if r["stand_in"]:
                extra += f", on {'/'.join(r['stand_in'])} (a stand-in for the paper's datasets)"
            lines.append(f"  {mark[r['verdict']]} {r['verdict']:<9} {r['id']} ({r['stage']}{extra})")
            lines.append(f"      \"{r['quote']}\"")
            lines.append(f"      {r['evidence']}")
            if r["paper_inconsistent"]:
                lines.append(f"      paper's own numbers: {r['paper_inconsistent']}")
            if r["note"]:
                lines.append(f"      note: {r['note']}")
    return "\n".join(lines)


def to_markdown(rows: list[dict]) -> str:
    """The checklist as a markdown table per paper (for the report stage)."""
    def esc(s):
        return str(s).replace("|", "\\|").replace("\n", " ")
    out = []
    for paper, counts in summary(rows).items():
        out.append(f"### {paper}: " + ", ".join(f"{n} {v}" for v, n in counts.items()) + "\n")
        out.append("| verdict | claim | quote | evidence |\n|---|---|---|---|")
        for r in (r for r in rows if r["paper"] == paper):
            where = f"{r['id']}<br>`{r['stage']}`" + (f"<br>stand-in: {'/'.join(r['stand_in'])}" if r["stand_in"] else "")
            ev = r["evidence"] + (f" — paper's own numbers: {r['paper_inconsistent']}" if r["paper_inconsistent"] else "")
            out.append(f"| {r['verdict']} | {esc(where)} | {esc(r['quote'])} | {esc(ev)} |")
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
        print(json.dumps(rows, indent=1))
    elif a.format == "markdown":
        print(to_markdown(rows))
    else:
        print(format_text(rows))
    return 0
