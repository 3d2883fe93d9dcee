"""Reading a claim's cells from its table (`Evaluator`): filters, references, the rows a form compares."""
from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from .loading import _as_list, ACCURACY_COLUMNS, DEFAULT_PAPER_SEEDS, KEY_COLUMNS
from .effects import _parse_seeds, Val


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
