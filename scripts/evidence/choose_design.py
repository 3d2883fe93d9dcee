"""Apply the default repro's design rule (issue 54; paper_numbers/forking_paths.yaml, 2026-11-29 and its amendment of
2026-11-30) to the pilot tables: which design and how many paired seeds each claimed stage runs.

    python scripts/evidence/choose_design.py [--claims claims.json] [--budget-min 40] [--avx2-ratio 1.31]
        [--out docs/evidence/design/choice.md]

Inputs, none of them a verdict seed's result:
- the stages' runs and their CPU time (`results/train/*.json`, each run's `provenance.json`: `cpu_seconds`, else
  `wall_seconds`, one thread a run), grouped so that stages sharing a run share a design and a seed count;
- the design pilots (`docs/evidence/design/<stage>_<reference>.csv`, pilot seeds 2000+): per design, the SD of each
  paired difference and a seed's CPU-seconds (the design's cost is the pilot's ratio to its base, applied to the
  stage's own cost);
- the claims (`pflrepro claims --format json`): which stage each reads, its comparisons and the paper's effect. Only
  their structure and the paper's numbers are read, never their verdicts, effects or intervals.

A claim is *sized* under a choice when `noise.detectable(SD, n)` is at most the paper's effect (absolute), SD the
pilot SD of the comparison it reads (the largest of its comparisons; the largest of the pilot's where the pilot did
not run one of them); a stage without its own pilot takes its paper's pilot at base, and keeps base. The choice
maximises the number of sized claims, subject to the budget, with n >= 3 on every claimed stage; ties go to fewer
CPU-minutes. Where n >= 3 everywhere cannot fit the budget, the rule's amendment applies: the budget is the least
one that holds n >= 3 everywhere (every stage at 3 seeds, each at its cheapest design among those that size the most
claims at 3 seeds), and nothing beyond it is bought; the table says by how much the budget was missed.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import re
import sys
from collections import defaultdict
from pathlib import Path

import pandas as pd

from pflrepro.reporting.claims.loading import used_methods

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).parent


def _load(name):
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def groups(stages: dict, cost_of: dict) -> list[dict]:
    """Stages that share a run (a config without its seed) in one group: [{stages, keys, seeds, cost}] where `cost`
    is a seed's CPU-seconds over the group's distinct configs (each the mean over its stored seeds)."""
    parent = {s: s for s in stages}

    def find(s):
        while parent[s] != s:
            parent[s] = parent[parent[s]]
            s = parent[s]
        return s
    owner = {}
    for stage, runs in stages.items():
        for key, *_ in runs:
            if key in owner:
                parent[find(stage)] = find(owner[key])
            else:
                owner[key] = stage
    out = defaultdict(lambda: {"stages": set(), "keys": set(), "seeds": set()})
    for stage, runs in stages.items():
        g = out[find(stage)]
        g["stages"].add(stage)
        for key, seed, *_ in runs:
            g["keys"].add(key)
            g["seeds"].add(seed)
    result = []
    for g in out.values():
        g["cost"] = sum(cost_of[k] for k in g["keys"])
        g["seeds"] = len(g["seeds"])
        result.append(g)
    return sorted(result, key=lambda g: sorted(g["stages"])[0])


def run_costs(stages: dict, runs_dir: Path) -> dict:
    """{config key: mean CPU-seconds of its stored seeds}: `cpu_seconds` where the run recorded it, else wall."""
    per = defaultdict(list)
    for name, (key, wall) in {name: (key, wall) for runs in stages.values() for key, _, wall, name in runs}.items():
        prov = json.loads((runs_dir / name / "provenance.json").read_text())     # a run shared by stages: read once
        per[key].append(float(prov.get("cpu_seconds") or wall))
    return {k: sum(v) / len(v) for k, v in per.items()}


def pilots(design_dir: Path, stage_names) -> dict:
    """{stage: {design: {"sd": {(a, b): SD of a - b}, "cost": CPU-s a seed, "priced_by": cpu or wall}}} from every
    pilot csv (`<stage>_<reference>[_<more>].csv`, the stage the longest known name it starts with); a design in two
    files of one stage is read from the one priced by CPU time, else the first."""
    out = {}
    for f in sorted(design_dir.glob("*.csv")):
        t = pd.read_csv(f)
        names = [s for s in stage_names if f.stem.startswith(s + "_")]
        if not names or "sd_diff" not in t.columns:
            continue
        stage = max(names, key=len)
        for d, rows in t.groupby("design", sort=False):
            have = out.get(stage, {}).get(d)
            if have and (have["priced_by"] == "cpu" or "priced_by" not in rows):
                continue
            sd = {tuple(x.strip() for x in c.split(" - ")): float(s) for c, s in zip(rows.comparison, rows.sd_diff)}
            out.setdefault(stage, {})[d] = {"sd": sd, "cost": float(rows.cpu_s_per_seed.iloc[0]),
                                            "priced_by": str(rows["priced_by"].iloc[0]) if "priced_by" in rows else "wall"}
    return out


_PAIR = re.compile(r"^\s*(\w+)\s*[<>]\s*(\w+)(?:\s|$)")     # "a > b", "a < b (margin +1)"


def comparisons(claim: dict) -> list | None:
    """The method pairs a claim's points compare, or None where a point is not one pair the pilot could have run
    (a trend, a ratio, settings of one method). A band or target on a difference ("diff near 0.5") compares the two
    methods the claim reads (`uses`)."""
    out = []
    methods = used_methods(claim)
    for comp in (claim.get("points") or {}):
        m = _PAIR.match(comp)
        if m:
            out.append(m.groups())
        elif comp.startswith("diff near") and len(methods) == 2:
            out.append(tuple(methods))
        else:
            return None
    return out


def claim_sd(claim: dict, pilot: dict) -> float:
    """The SD a claim's comparisons are sized by under one pilot design: the largest of its comparisons that the pilot
    ran, and the largest of the pilot's where it did not run one of them (or a point is not a pair)."""
    sds = pilot["sd"]
    worst = max(sds.values())
    pairs = comparisons(claim)
    if not pairs:
        return worst
    found = [sds.get((a, b), sds.get((b, a))) for a, b in pairs]
    return worst if None in found else max(found)


def testable(claim: dict) -> bool:
    return claim["verdict"] not in ("not run", "by design") and claim.get("paper_effect") is not None


# The designs issue 54 names (more seeds is every design at more seeds): more clients over the same data, larger
# per-client test sets, more rounds, full participation, and the pilot's one combination of two of them. Half the
# rounds (`rounds_half`, priced by the pilots) is not one: it buys CPU by moving the setting away from the paper's.
CANDIDATES = ("base", "clients_x2", "tests_x4", "rounds_x2", "full", "tests_x4_rounds_x2")
STRUCTURAL = {"rounds_x2": 2.0, "rounds_half": 0.5, "tests_x4_rounds_x2": 2.0}


def cost_ratio(design: str, pilot: dict, base: dict) -> float:
    """A design's cost over its base: the pilot's ratio where both were priced by CPU time; otherwise (a pilot priced
    by the wall time of a shared machine) what the design changes: rounds scale training, test images only scoring."""
    if pilot["priced_by"] == "cpu" and base["priced_by"] == "cpu":
        return pilot["cost"] / base["cost"]
    return STRUCTURAL.get(design, 1.0)


def options(group: dict, claims: list, pilot: dict | None, detectable, max_seeds: int) -> list[dict]:
    """Every (design, n) a group may run: its cost (CPU-s) and how many of its claims it sizes."""
    designs = pilot or {"base": None}
    base_cost = pilot["base"]["cost"] if pilot and "base" in pilot else None
    out = []
    for d, p in designs.items():
        ratio = cost_ratio(d, p, pilot["base"]) if p and base_cost else 1.0
        for n in range(3, max_seeds + 1):
            rel = [detectable(claim_sd(c, p), n) / max(abs(float(c["paper_effect"])), 1e-9) for c in claims] if p else []
            out.append({"design": d, "n": n, "cost": group["cost"] * ratio * n,
                        "sized": sum(1 for r in rel if r <= 1 + 1e-12),
                        "rel": sum(rel) / len(rel) if rel else float("inf")})
    return out


COST_TIE = 0.10


def choose(opts: list[list[dict]], budget: float, step: float = 5.0) -> tuple[list[dict], bool]:
    """One option a group maximising the claims sized within `budget` CPU-s (ties: fewer CPU-s). Where 3 seeds on
    every group do not fit, the amendment's choice: each group at 3 seeds and its cheapest design, a design within
    `COST_TIE` of the cheapest counting as as cheap (then: most claims sized, the smallest mean ratio of detectable to
    paper effect, base). Returns (choice, fits)."""
    at3 = []
    for g in opts:
        three = [o for o in g if o["n"] == 3]
        cheapest = min(o["cost"] for o in three)
        near = [o for o in three if o["cost"] <= (1 + COST_TIE) * cheapest]
        at3.append(min(near, key=lambda o: (-o["sized"], o["rel"], o["design"] != "base", o["cost"])))
    if sum(o["cost"] for o in at3) > budget:
        return at3, False
    units = int(budget // step)
    best = {0: (0, 0.0, [])}
    for g in opts:
        nxt = {}
        for used, (val, cost, picks) in best.items():
            for o in g:
                u = used + math.ceil(o["cost"] / step)
                if u > units:
                    continue
                cand = (val + o["sized"], cost + o["cost"], picks + [o])
                if u not in nxt or (cand[0], -cand[1]) > (nxt[u][0], -nxt[u][1]):
                    nxt[u] = cand
        best = nxt
    val, cost, picks = max(best.values(), key=lambda v: (v[0], -v[1]))
    return picks, True


def _paper(stage: str) -> str:
    return stage.split("_table")[0].split("_fig")[0]


def table(groups_: list, claims: list, pil: dict, noise, budget_cpu: float, max_seeds: int, claimed: set):
    """The rule applied: one row a group (its choice beside what it runs now) and whether the budget held."""
    by_stage = defaultdict(list)
    for c in claims:
        if testable(c):
            by_stage[c["stage"]].append(c)
    papers = {_paper(s): p for s, p in pil.items()}
    opts, rows, fixed = [], [], 0.0
    for g in groups_:
        cl = [c for s in g["stages"] for c in by_stage.get(s, [])]
        own = next((pil[s] for s in sorted(g["stages"]) if s in pil), None)
        paper = _paper(sorted(g["stages"])[0])
        pilot = own or ({"base": papers[paper]["base"]} if paper in papers else None)
        now = options(g, cl, pilot and {"base": pilot["base"]}, noise.detectable, max(g["seeds"], 3))
        now_sized = next(o["sized"] for o in now if o["n"] == max(g["seeds"], 3)) if g["seeds"] >= 3 else 0
        if not g["stages"] & claimed:
            fixed += g["cost"] * g["seeds"]
            continue
        opts.append(options(g, cl, pilot, noise.detectable, max_seeds))
        rows.append({"stages": ", ".join(sorted(g["stages"])), "claims": len(cl), "pilot": "own" if own else
                     ("paper's, base" if pilot else "none"), "seeds_now": g["seeds"],
                     "cpu_min_now": g["cost"] * g["seeds"] / 60, "sized_now": now_sized})
    picks, fits = choose(opts, budget_cpu - fixed)
    for r, o in zip(rows, picks):
        r.update(design=o["design"], n=o["n"], cpu_min=o["cost"] / 60, sized=o["sized"])
    return pd.DataFrame(rows), fits, fixed


def markdown(t: pd.DataFrame, fits: bool, fixed: float, budget_cpu: float, scale: dict) -> str:
    cpu_now = t.cpu_min_now.sum() + fixed / 60
    cpu_new = t.cpu_min.sum() + fixed / 60
    wall = lambda cpu: cpu * 60 * scale["wall_per_cpu"] / 60  # noqa: E731
    lines = ["| stages (sharing runs) | testable claims | pilot | seeds now | CPU-min now | sized now | design | seeds "
             "| CPU-min | sized |", "|---|---|---|---|---|---|---|---|---|---|"]
    for _, r in t.iterrows():
        lines.append(f"| {r.stages} | {r.claims} | {r.pilot} | {r.seeds_now} | {r.cpu_min_now:.1f} | {r.sized_now} "
                     f"| {r.design} | {r.n} | {r.cpu_min:.1f} | {r.sized} |")
    lines += ["", f"Claims sized (detectable effect at most the paper's): {int(t.sized_now.sum())} now, "
              f"{int(t.sized.sum())} under the choice, of {int(t.claims.sum())} testable claims on claimed stages.",
              f"Training CPU (this store's CPU, one thread a run, stages no claim reads included): {cpu_now:.0f} "
              f"CPU-minutes now, {cpu_new:.0f} under the choice; projected wall on 2 cores {wall(cpu_now):.0f} and "
              f"{wall(cpu_new):.0f} minutes here, {wall(cpu_now) * scale['avx2']:.0f} and "
              f"{wall(cpu_new) * scale['avx2']:.0f} on the AVX2 EPYC (x{scale['avx2']:.2f}).",
              f"Budget: {budget_cpu / 60:.0f} CPU-minutes ({scale['budget_min']:.0f} AVX2 minutes). " +
              ("The choice fits it." if fits else
               f"n >= 3 on every claimed stage does not fit it (it needs {cpu_new:.0f}): the amendment's choice, "
               f"{cpu_new - budget_cpu / 60:.0f} CPU-minutes over.")]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--claims", default=None, help="`pflrepro claims --format json` output (default: run it)")
    ap.add_argument("--results", default=str(REPO / "results"))
    ap.add_argument("--design-dir", default=str(REPO / "docs" / "evidence" / "design"))
    ap.add_argument("--budget-min", type=float, default=40.0, help="AVX2 wall minutes for the whole repro (rule: 40)")
    ap.add_argument("--avx2-ratio", type=float, default=55 / 42, help="AVX2 wall / this CPU's (docs/performance.md)")
    ap.add_argument("--ref-wall-min", type=float, default=57 + 59 / 60,
                    help="the wall of the repro that filled --results, on this CPU (default: 57:59, the empty-store "
                    "repro at 513f5e0, issue 54's design; the design was chosen against 1e69f3b's store: 41:59)")
    ap.add_argument("--max-seeds", type=int, default=12)
    ap.add_argument("--designs", default=",".join(CANDIDATES), help="the candidate designs (the issue's list)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if a.budget_min <= 0 or a.avx2_ratio <= 0 or a.max_seeds < 3:
        raise SystemExit("--budget-min and --avx2-ratio: positive; --max-seeds: at least 3")
    sc, noise = _load("stage_cost"), _load("noise")
    res = Path(a.results)
    stages = sc.load_runs(res / "train", res / "runs")
    claimed = sc.claimed_stages(REPO / "paper_numbers")
    cost_of = run_costs(stages, res / "runs")
    gs = groups(stages, cost_of)
    if a.claims:
        claims = json.loads(Path(a.claims).read_text())
    else:
        import subprocess
        claims = json.loads(subprocess.run([sys.executable, "-m", "pflrepro", "claims", "--format", "json"],
                                           check=True, capture_output=True, text=True, cwd=REPO).stdout)
    total_cpu_min = sum(g["cost"] * g["seeds"] for g in gs) / 60
    scale = {"wall_per_cpu": a.ref_wall_min / total_cpu_min, "avx2": a.avx2_ratio, "budget_min": a.budget_min}
    budget_cpu = a.budget_min / a.avx2_ratio / scale["wall_per_cpu"] * 60
    keep = set(a.designs.split(","))
    pil = {s: {d: p for d, p in ds.items() if d in keep} for s, ds in pilots(Path(a.design_dir), set(stages)).items()}
    t, fits, fixed = table(gs, claims, pil, noise, budget_cpu, a.max_seeds, claimed)
    text = markdown(t, fits, fixed, budget_cpu, scale)
    if a.out:
        Path(a.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
