"""The forms: each turns a claim into comparisons (order, order_all, best, trend, ratio, near)."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from ..verdicts import Region
from .loading import _as_list
from .effects import _floor, _fmt, Comparison, Val
from .cells import _match_one, _matches, _num, _ref, _ref_filters, _ref_label, _sweep_key, Evaluator, NotRun


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


def _quantifier(claim: dict) -> str:
    """`aggregate: mean` is the pooled effect (`most`); `aggregate: max` (the cell with the largest effect) is
    `any`: deciding on the cell chosen as the largest needs the Bonferroni level over the cells."""
    agg = claim.get("aggregate")
    return "most" if agg == "mean" else ("any" if agg == "max" else claim.get("quantifier", "all"))


EVALUATORS = {"order": _eval_order, "order_all": _eval_order_all, "best": _eval_best, "trend": _eval_trend,
              "ratio": _eval_ratio, "near": _eval_near}
