"""Judging: one claim's verdict from its comparisons (verdicts.py's rule), every claim of the papers, the power and
seeds that would decide them, and which claims read independent runs."""
from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from .. import verdicts
from . import kernel, loading, scale
from .loading import _LOADER, DEFAULT_PAPER_SEEDS, REPO_ROOT, ROBUST_COLUMN, _as_list, claims_files, load, used_keys
from .effects import _fmt, Comparison
from .cells import _filter, _ref_label, Evaluator, NotRun
from .forms import EVALUATORS, _quantifier


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
        return stage if (loading.CLAIMS_DIR / f"{stage}.csv").exists() else None
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
    df = pd.read_csv(loading.CLAIMS_DIR / f"{name}.csv", comment="#")   # as report.paper_table
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
             "paper_check": "", "power": None, "kernel": None, "kernel_sensitive": False}


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
        kernel.mark(rows)
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
    still to run (`decide_seeds`, `decide_cpu_hours`); on a GPU and at the paper's scale, at the device check's
    measured rates (`scale.attach`: `decide_gpu_s`, `paper_scale`). Planning, never a verdict."""
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
        names = _runs_of(r, results_root)
        used = [walls[x] for x in names if x in walls and walls[x] == walls[x]]
        per_seed = sum(used) / r["seeds"] if used and r["seeds"] else None
        to_run = max(n - r["seeds"], 0) if n is not None and n <= MAX_SEEDS else None
        r["decide_cpu_hours"] = per_seed * to_run / 3600 if per_seed is not None and to_run is not None else None
        scale.attach(r, sorted(names), results_root, to_run)


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
    for key, k in used_keys(row).items():
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
