"""The paper-scale tier: runs the device check trained at a paper's own settings (scripts/gpu_check.py, its
`runs.tar.gz`), read back as verified run records, and the paired comparisons they decide, beside mini's verdicts.

A lease's records live in `docs/device/<lease>/runs/<table>/<setting>/<method>/<run>/` (the tar unpacked there), with
`tier.json` in each setting's folder naming the table, setting, the paper's dataset and the metric. Every record is
verified as the store serves a run (`store.verify`: its files against its manifest, its config.json the config it
ran); one that does not verify is named and left out. The comparisons are the paper's own method (`PAPER_METHOD`)
against each other method of its setting, paired by seed, at the best round (the papers' metric), decided by the
report's rule (`verdicts.decide`) with the paper's printed difference as the effect to detect. A row trained on
Fashion-MNIST at a CIFAR setting is read beside the CIFAR cell: the paper's effect is a reference, not a target.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..federation.config import RunConfig
from ..paths import REPO_ROOT
from ..pipeline.experiments import read_params
from ..pipeline.store import Damaged, verify
from .verdicts import decide, Region, Sample

TIER_ROOT = REPO_ROOT / "docs" / "device"
# the paper's own method in each table the device check trains (scripts/gpu_check.py SLICES)
PAPER_METHOD = {"pfedsd_table2": "pfedsd", "fedbsd_table1": "fedbsd", "dcpfl_table1": "dcpfl",
                "perfed_ckt_table1": "perfed_ckt_c3", "scd_table1": "scd"}


def paper_values(name: str) -> dict:
    """{(dataset, setting, method): printed value} of a params file's paper table (paper_numbers/<paper_table>.csv;
    where the table prints the GM and the PM, the PM)."""
    import pandas as pd

    table = read_params(name).get("paper_table")
    path = REPO_ROOT / "paper_numbers" / f"{table}.csv"
    if not table or not path.exists():
        return {}
    df = pd.read_csv(path, comment="#")
    if "metric" in df.columns:
        df = df[df["metric"] == "pm"]
    return {(r.dataset, str(r.setting), r.method): float(r.value) for r in df.itertuples()}


def paper_value(paper: dict, dataset: str, setting: str, method: str) -> float:
    """A printed cell by (dataset, setting, method), the setting with or without its dataset prefix."""
    return paper.get((dataset, setting, method), paper.get((dataset, setting.removeprefix(f"{dataset} "), method),
                                                           float("nan")))


def paired_claims(rows: list[dict], curves: list[dict], metric: str) -> list[dict]:
    """The paper's own method (PAPER_METHOD) against each other method of one setting, paired by seed (a 90 % interval
    over >= 3 seeds: verdicts.decide; the paper's own difference as the effect to detect). `rows`: per run its table,
    setting, method, seed, rounds planned, rounds done and paper value; `curves`: per evaluated round its method,
    seed, round and metric. Each pair is compared at the rounds both runs reached (the best round up to there: the
    papers' "best round"), so a run stopped by a lease is compared at its horizon, and the row says so."""
    ref = PAPER_METHOD.get(rows[0]["table"], rows[0]["method"])
    planned = rows[0]["rounds"]
    if not any(r["method"] == ref for r in rows):
        return []
    done = {(r["method"], r["seed"]): r["rounds_done"] for r in rows}
    paper = {r["method"]: r["paper"] for r in rows}

    def best(method, seed, horizon):
        return max(c[metric] for c in curves if c["method"] == method and c["seed"] == seed and c["round"] <= horizon)
    out = []
    for m in dict.fromkeys(r["method"] for r in rows if r["method"] != ref):
        seeds = sorted(s for (mm, s), d in done.items() if mm == m and d and done.get((ref, s)))
        horizons = [min(done[(ref, s)], done[(m, s)]) for s in seeds]
        diffs = np.array([best(ref, s, h) - best(m, s, h) for s, h in zip(seeds, horizons)])
        effect = paper[ref] - paper[m]
        name = f"{ref} > {m} ({rows[0]['table']}, {rows[0]['setting']})"
        at = f"rounds <= {min(horizons)} of {planned}" if horizons and min(horizons) < planned else f"{planned} rounds"
        if not len(diffs):
            out.append({"claim": name, "verdict": "not run", "seeds": 0, "paper_effect": effect})
            continue
        d = decide([Sample(name, float(diffs.mean()), values=diffs)], Region(">", 0.0),
                   paper_effect=effect if math.isfinite(effect) else None)
        out.append({"claim": name, "verdict": d.verdict, "seeds": len(diffs), "at": at, "effect": d.interval_text(),
                    "paper_effect": effect, "per_seed": " ".join(f"{v:+.2f}" for v in diffs)})
    return out


@dataclass
class Setting:
    lease: str
    table: str
    setting: str
    paper_dataset: str
    metric: str
    rows: list
    curves: list


def read_tier(root: Path = TIER_ROOT) -> tuple[list[Setting], list[str]]:
    """Every lease's verified records under `root`, per (lease, table, setting); and one line per record refused."""
    out, refused = [], []
    for index in sorted(Path(root).glob("*/runs/*/*/tier.json")):
        meta = json.loads(index.read_text())
        st = Setting(index.parents[3].name, meta["table"], meta["setting"], meta["paper_dataset"], meta["metric"], [], [])
        paper = paper_values(meta["table"])
        for folder in sorted(p for p in index.parent.glob("*/*") if p.is_dir()):
            method = folder.parent.name
            try:
                cfg = RunConfig.from_dict(json.loads((folder / "config.json").read_text()))
                res = verify(folder, cfg)
            except (Damaged, OSError, ValueError) as e:
                refused.append(f"{folder.relative_to(root)}: {type(e).__name__}: {e}")
                continue
            vals = [100 * h[st.metric] for h in res.history]
            st.rows.append({"table": st.table, "setting": st.setting, "method": method, "seed": cfg.seed,
                            "dataset": cfg.dataset, "rounds": cfg.rounds, "rounds_done": res.history[-1]["round"],
                            "best": max(vals), "final": vals[-1],
                            "paper": paper_value(paper, st.paper_dataset, st.setting, method)})
            st.curves += [{"method": method, "seed": cfg.seed, "round": h["round"], st.metric: v}
                          for h, v in zip(res.history, vals)]
        out.append(st)
    return out, refused


def tier_markdown(root: Path = TIER_ROOT) -> str:
    """The report's section: per lease and setting, each method's mean best accuracy over its seeds beside the
    paper's cell, and the paired comparisons they decide."""
    settings, refused = read_tier(root)
    head = ("### The paper-scale tier (device check)\n\nRuns trained by `scripts/gpu_check.py` at a paper's own "
            "settings on Fashion-MNIST, committed as verified run records (`docs/device/<lease>/runs/`), and the "
            "paired comparisons they decide (the paper's method against each other, by the report's rule).\n\n")
    if not settings:
        return head + ("No run records yet: a lent GPU's check writes them (`runs.tar.gz`, unpacked into "
                       "`docs/device/<lease>/`; DEVELOPERS.md). The 2026-11-28 H200 lease predates records: its "
                       "tables are in docs/evidence.md.\n")
    parts = [head]
    for st in settings:
        if not st.rows:
            continue
        claims = paired_claims(st.rows, st.curves, st.metric)
        means = {}
        for r in st.rows:
            means.setdefault(r["method"], []).append(r)
        lines = [f"**{st.table}, {st.setting}** on {st.rows[0]['dataset']} (lease `{st.lease}`; paper cells: "
                 f"{st.paper_dataset})\n", "| method | seeds | rounds | best (mean) | paper |", "|---|---|---|---|---|"]
        for m, rs in means.items():
            lines.append(f"| {m} | {len(rs)} | {min(r['rounds_done'] for r in rs)} of {rs[0]['rounds']} | "
                         f"{np.mean([r['best'] for r in rs]):.2f} | {rs[0]['paper']:.2f} |")
        lines += ["", "| comparison | verdict | seeds | at | effect [90 %] | paper's effect |", "|---|---|---|---|---|---|"]
        lines += [f"| {c['claim']} | {c['verdict']} | {c['seeds']} | {c.get('at', '')} | {c.get('effect', '')} | "
                  f"{c['paper_effect']:.2f} |" for c in claims]
        parts.append("\n".join(lines) + "\n")
    if refused:
        parts.append("Records that did not verify (left out):\n\n" + "\n".join(f"- {r}" for r in refused) + "\n")
    return "\n".join(parts)
