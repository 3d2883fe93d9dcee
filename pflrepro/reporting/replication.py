"""One report of the whole reproduction: `python -m pflrepro report [--results DIR] [--figures DIR] [--out DIR]`.

It reads only what the notebooks wrote (`notebook.Experiment`): results/<stage>/{<stem>.md, <stem>.csv,
runs.csv, provenance.json, <stage>.ipynb} and figures/<stage>/*.png (or results/<stage>/figures/*.png for a
notebook run with its own `out_dir`), plus the claims checker's verdicts on the same results
(`claims.check`), and writes into out_dir (default results/report/):

- report.md    GitHub-renderable. Figures are image links by relative path from out_dir (from
               results/report/: ../../figures/<stage>/<x>.png), so they show where the figures are.
- report.html  the same page, self-contained: every figure embedded as a base64 PNG data URI; links to
               local files (the executed notebooks) are shown as plain text, so nothing points outside.
- summary.csv, summary.md   per paper and profile: stages, claims by verdict (holds / partial / fails /
               inconclusive / underpowered / by design / not run), independent tests decided, the headline claims,
               and the compute (wall seconds of the distinct runs used).

Per paper: each stage's title and tables (the reproduced value beside the printed one and the difference,
exactly as the notebook wrote them), figures, profile, provenance (commits, versions, seeds, devices) and
compute, the forking-path log (paper_numbers/forking_paths.yaml), then the paper's claims with their verdicts, effects
and intervals, the same effects on the paper's own numbers, and the numbers that decided them. A stage named in
dvc.yaml, a claims file or its `planned_stages` without outputs is listed as "not reproduced yet".
Nothing here trains, imports torch, or changes a number.
"""
from __future__ import annotations

import argparse
import datetime
import html
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml

from ..pipeline.store import git_commit
from . import claims, forest, health, tier, verdicts
from .html import to_html
from .verdict_md import (_cell, claims_markdown, _count_text, _counts, decide_markdown, _duration, forking_markdown,
                         FORKING_PATHS, forking_paths, _md_table)  # noqa: F401

REPO_ROOT = claims.REPO_ROOT
DVC_FILE = REPO_ROOT / "dvc.yaml"
# The five papers (those with notebooks first); a stage `<id>_<name>` belongs to paper <id>. A paper not
# listed here still gets its section when a claims file or a stage names it.
PAPERS = {"pfedsd": "pFedSD (TPDS 2022)", "dcpfl": "DC-PFL (IJCAI 2024)", "scd": "Spectral co-distillation (NeurIPS 2023)",
          "fedbsd": "FedBSD", "perfed_ckt": "PerFed-CKT"}
NOT_REPRODUCED = "not reproduced yet"
MAIN_STEMS = ("table", "table_wide")      # a stage's tables in this order first: the first one is shown, the rest fold
SKIP_CSV = {"runs"}                      # per-run rows: summarised as provenance and compute
VERSION_KEYS = ("pflrepro", "torch", "numpy", "python")


@dataclass
class Stage:
    name: str
    paper: str
    dir: Path
    exists: bool = False
    profile: str = ""
    banner: str = ""
    title: str = ""
    tables: list = field(default_factory=list)    # [(stem, markdown or None, csv path or None)]
    figures: list = field(default_factory=list)   # [Path]
    runs: list = field(default_factory=list)      # [{path, wall_seconds, seed, git, device, ...}]
    health: list | None = None                    # runs.csv's flagged rows [{run, method, setting, seed, health}]; None = not checked
    notebook: Path | None = None

    @property
    def wall_seconds(self) -> float:
        return sum(r.get("wall_seconds") or 0.0 for r in self.runs)


# ------------------------------------------------------------------ what exists
def _stage_key(name: str):
    """table2 < table10 < fig2 (tables first, then figures, each by number)."""
    m = re.search(r"_(table|fig)(\d+)(.*)$", name)
    return (name.split("_")[0], ("table", "fig").index(m.group(1)), int(m.group(2)), m.group(3)) if m \
        else (name.split("_")[0], 2, 0, name)


def _paper_of(name: str, papers) -> str:
    return next((p for p in sorted(papers, key=len, reverse=True) if name.startswith(p + "_")), name.split("_")[0])


def _has_outputs(d: Path) -> bool:
    return d.is_dir() and ((d / "provenance.json").exists() or any(d.glob("*.csv")))


def dvc_notebooks() -> set[str]:
    """The notebooks dvc.yaml renders: each stage's `results/<name>` outputs (a paper's render stage has several)."""
    stages = (yaml.safe_load(DVC_FILE.read_text()) or {}).get("stages", {}) if DVC_FILE.exists() else {}
    outs = (o if isinstance(o, str) else next(iter(o)) for st in stages.values() for o in st.get("outs", []))
    return {o.split("/", 1)[1] for o in outs if o.startswith("results/") and o.count("/") == 1}


def expected_stages(results_root: Path, docs: list[dict]) -> dict[str, list[str]]:
    """paper -> its stages (a stage here is one notebook: its table or figure): those with outputs under
    results_root, those dvc.yaml renders (a stage's `results/<name>` outputs), and those the claims files name
    (`where.stage`, `planned_stages`)."""
    papers = set(PAPERS) | {d["paper"] for d in docs}
    names = {d.name for d in results_root.iterdir() if "_" in d.name and _has_outputs(d)} \
        if results_root.is_dir() else set()
    names |= {n for n in dvc_notebooks() if any(n.startswith(p + "_") for p in papers)}
    for d in docs:
        names |= {c["where"]["stage"] for c in d["claims"]} | set(d.get("planned_stages", []))
    out = {p: [] for p in list(PAPERS) + sorted(papers - set(PAPERS))}
    for n in sorted(names, key=_stage_key):
        out.setdefault(_paper_of(n, papers), []).append(n)
    return out


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _title(md: str | None) -> str:
    m = re.search(r"^#+\s+(.+?)\s*$", md or "", re.M)
    return m.group(1) if m else ""


def load_stage(name: str, paper: str, results_root: Path, figures_root: Path) -> Stage:
    d = results_root / name
    st = Stage(name, paper, d, exists=_has_outputs(d))
    if not st.exists:
        return st
    prov = _read_json(d / "provenance.json")
    st.profile, st.banner = prov.get("profile") or "?", prov.get("banner", "")
    stems = {p.stem for p in d.glob("*.md")} | {p.stem for p in d.glob("*.csv")}
    first = {s: i for i, s in enumerate(MAIN_STEMS)}
    for stem in sorted(stems - SKIP_CSV, key=lambda s: (first.get(s, len(first)), s)):
        md = (d / f"{stem}.md").read_text() if (d / f"{stem}.md").exists() else None
        st.tables.append((stem, md, d / f"{stem}.csv" if (d / f"{stem}.csv").exists() else None))
    st.title = next((_title(md) for _, md, _ in st.tables if _title(md)), "")
    figs = {p.name: p for p in sorted((d / "figures").glob("*.png"))}     # a notebook run with out_dir
    figs.update({p.name: p for p in sorted((figures_root / name).glob("*.png"))})
    st.figures = [figs[k] for k in sorted(figs)]
    st.runs = run_records(d, prov, results_root)
    st.health = flagged_runs(d / "runs.csv")
    nb = d / f"{name}.ipynb"
    st.notebook = nb if nb.exists() else None
    return st


def run_records(stage_dir: Path, prov: dict, results_root: Path) -> list[dict]:
    """One dict per run the stage used: its provenance.json entry (wall_seconds, seed, git, device, torch),
    completed from the run's own provenance.json in the run store (versions; wall time where the stage's
    file has none), else from runs.csv (wall_s)."""
    runs = [{"key": k, **v} for k, v in (prov.get("runs") or {}).items()]
    if not runs and (stage_dir / "runs.csv").exists():
        df = pd.read_csv(stage_dir / "runs.csv")
        runs = [{"key": "/".join(str(r.get(c, "")) for c in ("method", "setting", "seed")), "path": r.get("run"),
                 "seed": r.get("seed"), "dataset": r.get("dataset"), "wall_seconds": r.get("wall_s")}
                for r in df.to_dict("records")]
    for r in runs:
        path = str(r.get("path") or "")
        for store in (results_root / "runs", stage_dir / "runs"):
            own = _read_json(store / path / "provenance.json") if path else {}
            if own:
                r["store"] = str(store.resolve())
                r.update({k: own[k] for k in VERSION_KEYS if k in own})
                if r.get("wall_seconds") is None:
                    r["wall_seconds"] = own.get("wall_seconds")
                break
        w = r.get("wall_seconds")
        r["wall_seconds"] = float(w) if w is not None and w == w else None
    return runs


# ------------------------------------------------------------------ summary
def flagged_runs(runs_csv: Path) -> list[dict] | None:
    """The runs a stage's runs.csv flags (pflrepro.reporting.health), or None where it has no health column (written
    before the check existed, or a stage without runs)."""
    if not runs_csv.exists():
        return None
    df = pd.read_csv(runs_csv, keep_default_na=False)
    if "health" not in df.columns:
        return None
    return [{k: r.get(k) for k in ("run", "method", "setting", "seed", "health")}
            for r in df.to_dict("records") if str(r["health"]).strip()]


def flagged_by_run(stages: list[Stage]) -> dict | None:
    """{run: its runs.csv row + paper + the stages that render it}, each flagged run once; None where no stage
    of `stages` was checked (no runs.csv health column)."""
    checked = [st for st in stages if st.exists and st.health is not None]
    if not checked:
        return None
    flagged: dict = {}
    for st in checked:
        for r in st.health:
            flagged.setdefault(r["run"], {**r, "paper": st.paper, "stages": []})["stages"].append(st.name)
    return flagged


def health_markdown(stages: list[Stage]) -> str:
    """One paragraph, and a table of the flagged runs (each once, with the stages that render it)."""
    flagged = flagged_by_run(stages)
    if flagged is None:
        return ""
    n_runs = len({r.get("path") for st in stages if st.health is not None for r in st.runs})
    head = f"**Run health:** {len(flagged)} of {n_runs} runs flagged (`pflrepro/reporting/health.py`).\n"
    if not flagged:
        return head
    return head + "\n" + _md_table(["run", "method / setting / seed", "stages", "flag"],
                                   [[f"`{k}`", f"{r['method']} / {r['setting']} / {r['seed']}",
                                     ", ".join(f"`{s}`" for s in r["stages"]), r["health"]]
                                    for k, r in flagged.items()])


def _distinct_wall(stages: list[Stage]) -> float:
    """Each run once, however many stages render it (Table 2's runs feed Tables 4, 5, Figs. 6, 7)."""
    seen: dict = {}
    for st in stages:
        for r in st.runs:
            key = (r.get("store", ""), r.get("path") or f"{st.name}/{r.get('key')}")
            seen.setdefault(key, r.get("wall_seconds") or 0.0)
    return sum(seen.values())


def summarize(papers: dict[str, list[Stage]], rows: list[dict], docs: dict[str, dict]) -> list[dict]:
    """One row per (paper, profile of the outputs) with the claims evaluated on those outputs; the claims
    on stages not reproduced yet, and those stages, in a row of their own. `docs`: {paper: its claims file},
    whose `scale_notes[profile]` becomes that row's note."""
    out = []
    for paper, stages in papers.items():
        profile_of = {st.name: st.profile if st.exists else NOT_REPRODUCED for st in stages}
        prows = [r for r in rows if r["paper"] == paper]
        for r in prows:
            profile_of.setdefault(r["stage"], NOT_REPRODUCED)
        profiles = sorted({p for p in profile_of.values() if p != NOT_REPRODUCED})
        for prof in profiles + [NOT_REPRODUCED]:
            sts = [st for st in stages if profile_of[st.name] == prof]
            mine = [r for r in prows if profile_of[r["stage"]] == prof]
            if prof == NOT_REPRODUCED and not sts and not mine and profiles:
                continue
            note = (docs[paper].get("scale_notes") or {}).get(prof, "") if paper in docs else "no claims file yet"
            flagged = flagged_by_run(sts)
            out.append({"paper": paper, "title": PAPERS.get(paper, paper), "profile": prof, "stages": len(sts),
                        **_counts(mine), "claims": len(mine), "independent": claims.independent_tests(mine),
                        "sensitive": sum(bool(r.get("metric_sensitive")) for r in mine),
                        "kernel": sum(bool(r.get("kernel_sensitive")) for r in mine),
                        "headline": claims.headline(mine) if any(r.get("headline") for r in mine) else "",
                        "compute_s": round(_distinct_wall(sts), 1) if prof != NOT_REPRODUCED else None,
                        "flagged": None if flagged is None else len(flagged),
                        "note": note})
    return out


# ------------------------------------------------------------------ markdown
def summary_markdown(summary: list[dict], link: bool = True) -> str:
    """The counts, one short row per paper and profile (each row's note follows in `notes_markdown`)."""
    head = ["paper", "profile", "stages", *claims.VERDICTS, "independent tests decided", "metric-sensitive",
            "kernel-sensitive", "compute", "runs flagged"]
    rows = [[f"[{s['title']}](#paper-{s['paper']})" if link else s["title"], s["profile"], s["stages"],
             *(s[v] for v in claims.VERDICTS), s.get("independent", "—"), s.get("sensitive", 0), s.get("kernel", 0),
             _duration(s["compute_s"]), "—" if s.get("flagged") is None else s["flagged"]] for s in summary]
    return _md_table(head, rows)


def notes_markdown(summary: list[dict]) -> str:
    """Each summary row's note (what the profile runs and what it found), as a list under the table."""
    lines = [f"- **{s['title']}** ({s['profile']}): {s['note']}" for s in summary if s.get("note")]
    return ("\n".join(lines) + "\n") if lines else ""


def headline_markdown(summary: list[dict]) -> str:
    """One line per paper: its headline claims (abstract and main 'best' claims), apart from the secondary ones."""
    lines = [f"- **{s['title']}** ({s['profile']}): {s['headline']}" for s in summary if s.get("headline")]
    return ("**Headline claims** (each paper's abstract and main 'best' claims):\n\n" + "\n".join(lines) + "\n") if lines else ""


def _demote(md: str) -> str:
    """A notebook's markdown under a stage heading: drop its title line, push its other headings below."""
    lines = md.strip().splitlines()
    if lines and lines[0].startswith("#"):
        lines = lines[1:]
    return "\n".join(re.sub(r"^#{1,3}(?=\s)", "####", ln) for ln in lines).strip()


def _csv_markdown(path: Path, max_rows: int = 60) -> str:
    df = pd.read_csv(path)
    rows = [[("" if v != v else f"{v:.2f}") if isinstance(v, float) else v for v in r]
            for r in df.head(max_rows).itertuples(index=False)]
    more = f"\n({len(df) - max_rows} more rows in `{path.name}`)\n" if len(df) > max_rows else ""
    return _md_table([str(c) for c in df.columns], rows) + more


def _rel(path: Path, out_dir: Path) -> str:
    return Path(os.path.relpath(path.resolve(), out_dir.resolve())).as_posix()


def provenance_markdown(st: Stage) -> str:
    def uniq(key, fmt=str):
        vals = sorted({fmt(r[key]) for r in st.runs if r.get(key) is not None})
        return ", ".join(vals) if vals else "—"
    commits = uniq("git", lambda g: f"{g.get('commit', '?')[:10]}{' (dirty)' if g.get('dirty') else ''}"
                   if isinstance(g, dict) else str(g))
    versions = "; ".join(f"{k} {uniq(k)}" for k in VERSION_KEYS if any(r.get(k) for r in st.runs)) or "—"
    timed = [r for r in st.runs if r.get("wall_seconds") is not None]
    if not st.runs:
        return (f"- **profile** `{st.profile}`; no training runs recorded (the stage measures or draws without "
                f"training); banner: {st.banner or '—'}\n")
    lines = [f"- **profile** `{st.profile}`; **runs** {len(st.runs)}; **seeds** {uniq('seed')}; "
             f"**datasets** {uniq('dataset')} ({uniq('dataset_source')}); **device** {uniq('device')} "
             f"(CPU kernels {uniq('cpu_capability')})",
             f"- **commit** {commits}; **versions** {versions}; "
             f"**code fingerprints** {len({r.get('code_sha256') for r in st.runs if r.get('code_sha256')})}",
             f"- **compute** {_duration(st.wall_seconds)}: the sum of `wall_seconds` over the {len(timed)} runs it "
             f"used, as each was trained (runs trained side by side overlap in time; a run several stages render "
             f"counts in each of them, once in the paper's total){_eval_share(st.runs)}"]
    return "\n".join(lines) + "\n"


def _eval_share(runs: list) -> str:
    """'; evaluation N % of it' over the runs whose provenance times their evaluation (`eval_every` sets how often)."""
    timed = [r for r in runs if r.get("eval_seconds") is not None and r.get("wall_seconds")]
    if not timed:
        return ""
    share = sum(r["eval_seconds"] for r in timed) / sum(r["wall_seconds"] for r in timed)
    return f"; evaluation {100 * share:.0f} % of it (`eval_every` sets how often a run evaluates)"


def _stage_title(st: Stage) -> str:
    if st.title:
        return st.title
    return ("figure " + ", ".join(p.stem for p in st.figures)) if st.figures else "(no table, no figure)"


def stage_markdown(st: Stage, out_dir: Path, stage_rows: list[dict]) -> str:
    parts = [f'<a id="stage-{st.name}"></a>\n\n### `{st.name}`: {_stage_title(st)}\n']
    for i, (stem, md, csv) in enumerate(st.tables):
        body = _demote(md) if md is not None else _csv_markdown(csv)
        if i == 0:
            parts.append(body + "\n")
        else:
            parts.append(f"<details><summary>{html.escape(stem)}: {html.escape(_title(md) or stem + '.csv')}"
                         f"</summary>\n\n{body}\n\n</details>\n")
    if not st.tables:
        parts.append("(this stage wrote no table)\n")
    parts += [f"![{st.name} {p.stem}]({_rel(p, out_dir)})\n" for p in st.figures]
    parts.append(provenance_markdown(st))
    if st.notebook:
        parts.append(f"Executed notebook: [{st.notebook.name}]({_rel(st.notebook, out_dir)})\n")
    if stage_rows:
        parts.append(f"Claims on this stage: {_count_text(_counts(stage_rows))} (see the checklist below).\n")
    return "\n".join(parts)


def paper_markdown(paper: str, stages: list[Stage], rows: list[dict], out_dir: Path,
                   scale_notes: dict | None = None) -> str:
    done = [st for st in stages if st.exists]
    missing = [st.name for st in stages if not st.exists]
    parts = [f'<a id="paper-{paper}"></a>\n\n## {PAPERS.get(paper, paper)} (`{paper}`)\n']
    if not stages and not rows:
        return "\n".join(parts + [f"**{NOT_REPRODUCED.capitalize()}:** no notebook stage and no claims file yet.\n"])
    parts += [
             f"{len(done)} of {len(stages)} stages reproduced; compute {_duration(_distinct_wall(done) if done else None)} "
             f"(distinct runs); claims: {_count_text(_counts(rows)) if rows else 'no claims file yet'}"
             f"{f'; independent tests decided: {claims.independent_tests(rows)}' if rows else ''}.\n"]
    if any(r.get("headline") for r in rows):
        parts.append(f"**Headline claims:** {claims.headline(rows)}.\n")
        parts.append(decide_markdown(rows))
    parts += [f"**Scale ({prof}):** {text}\n" for prof, text in (scale_notes or {}).items()
              if prof in {st.profile for st in done}]
    if done:
        parts.append(_md_table(["stage", "title", "profile", "runs", "compute", "claims"],
                               [[f"[{st.name}](#stage-{st.name})", _stage_title(st), st.profile, len(st.runs),
                                 _duration(st.wall_seconds if st.runs else None), _count_text(_counts([r for r in rows if r["stage"] == st.name]))]
                                for st in done]))
    parts.append(f"**{NOT_REPRODUCED.capitalize()}:** " + (", ".join(f"`{m}`" for m in missing) or "none") + "\n")
    parts.append(health_markdown(done))
    parts.append(forking_markdown(paper))
    parts += [stage_markdown(st, out_dir, [r for r in rows if r["stage"] == st.name]) for st in done]
    if rows:
        parts.append(claims_markdown(rows))
    return "\n".join(parts)


RULE_TEXT = (
    "Claims are the papers' own sentences about their results, checked on the reproduced tables "
    "(`pflrepro/reporting/claims.py`, the statistics in `verdicts.py`). Each claim's effect (a difference, a margin "
    "over the best competitor, a ratio, the ends of a series) is computed per seed, paired where the methods share a "
    "seed's partition, and tested per cell with a paired t test over the seeds (never below the variance the test "
    "images alone give an accuracy: a spread of 0 is not certainty). **holds**: the one-sided 95 % bound on the "
    "claimed side clears the claim's boundary in every cell and every comparison the claim makes (a band: the whole "
    f"interval inside it); the interval shown is the {verdicts.INTERVAL_NAME} whose ends are those bounds. "
    "**partial**: holds, but some of the paper's competitors did not run (or ran blank); **fails**: one cell or "
    "comparison is against the claim at 5 % divided by the number of such tests (Holm); **inconclusive**: neither, "
    "although this profile had at least 80 % power to hold the claim were the paper's own effects true; "
    "**underpowered**: neither, with less power than that, or a cell has no interval (fewer than 3 seeds: no verdict "
    "from an assumed noise); **by design**: a quantity fixed by construction, shown with its own result and "
    "never counted; **not run**. At each claim's boundary P(holds) and P(fails) are each at most 5 %, measured by "
    "simulation for every claim shape used (`benchmarks/bench_calibration.py`, docs/evidence.md \"Calibrated "
    "verdicts\"). *metric-sensitive*: a decided verdict that is not the same on the mean of the last tenth of the "
    "rounds (the tables score the best round, which favours a noisier curve). *kernel-sensitive*: a verdict that is not "
    "the same when the same runs are trained on another kernel path of the CPU (ATEN_CPU_CAPABILITY=avx2 against the "
    "default, docs/evidence/kernel_paths/: float rounding alone moved it). *Independent tests*: claims read from "
    "the same runs count once. A profile other than `paper` runs smaller settings on offline stand-in data: its "
    "verdicts speak about trends there, not about the paper's numbers. Compute: the wall time of the distinct runs "
    "the outputs used.\n")


def forests_markdown(papers: dict, out_dir: Path) -> str:
    """'Verdicts at a glance': each paper's forest plot (written by write_report into out_dir)."""
    figs = [(p, out_dir / f"forest_{p}.png") for p in papers if (out_dir / f"forest_{p}.png").exists()]
    if not figs:
        return ""
    return "### Verdicts at a glance\n\n" + "\n".join(
        f"[{PAPERS.get(p, p)}](#paper-{p})\n\n![{PAPERS.get(p, p)}: claims]({path.name})\n" for p, path in figs)


def _git_now() -> str:
    g = git_commit()
    return "unknown" if g["commit"] == "unknown" else g["commit"][:10] + ("+dirty" if g["dirty"] else "")


def report_markdown(papers: dict[str, list[Stage]], rows: list[dict], summary: list[dict], results_root: Path,
                    out_dir: Path, scale_notes: dict[str, dict] | None = None) -> str:
    """The whole report; `scale_notes`: {paper: {profile: why its claims cannot show at that scale}}."""
    now = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    parts = ["# Reproduction report\n",
             f"Generated {now} by `python -m pflrepro report` (code at {_git_now()}) from `{results_root}`.\n",
             "## Summary\n",
             summary_markdown(summary),
             headline_markdown(summary),
             forests_markdown(papers, out_dir),
             "### How a verdict is decided\n",
             RULE_TEXT,
             "### What each profile runs, and what it found\n",
             notes_markdown(summary),
             "Against independent implementations: baselines the papers share were trained beside PFLlib's own code "
             "on one identical setting and three paired seeds (`scripts/crosscheck/pfllib.py`, which lists them; the "
             "table and what it can resolve: docs/evidence.md, \"Eight baselines against PFLlib\" and the methods "
             "added beside them), and FedAvg and pFedSD beside the pFedSD authors' own code (CGCL-codes/pFedSD, "
             "`scripts/crosscheck/pfedsd_authors.py`; docs/evidence.md, \"FedAvg and pFedSD against the pFedSD "
             "authors' code\").\n",
             tier.tier_markdown()]
    flagged = flagged_by_run([st for sts in papers.values() for st in sts])
    if flagged is not None:
        checked = [st for sts in papers.values() for st in sts if st.exists and st.health is not None]
        per = ", ".join(f"{PAPERS.get(p, p)}: {n}" for p in papers
                        if (n := sum(1 for v in flagged.values() if v["paper"] == p)))
        parts.append(f"Run health: {len(flagged)} run{'' if len(flagged) == 1 else 's'} flagged" + (f" ({per}; listed under each paper)" if per else "")
                     + f" ({len(checked)} stage{'' if len(checked) == 1 else 's'} checked; {health.rule()}). The tables score each run's best "
                     "round, which a collapsed or falling run would flatter.\n")
    for paper, stages in papers.items():
        parts.append(paper_markdown(paper, stages, [r for r in rows if r["paper"] == paper], out_dir,
                                    (scale_notes or {}).get(paper)))
    return "\n".join(parts)


# ------------------------------------------------------------------ entry points
def write_report(results_root: Path, figures_root: Path, out_dir: Path) -> dict:
    """Write report.md, report.html, summary.csv and summary.md into out_dir; return their paths, the
    summary rows, the claims rows and each stage's status (reproduced / not reproduced yet)."""
    results_root, figures_root, out_dir = Path(results_root), Path(figures_root), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    docs = [claims.load(p) for p in claims.claims_files()]
    rows = claims.check(results_root)
    papers = {p: [load_stage(n, p, results_root, figures_root) for n in names]
              for p, names in expected_stages(results_root, docs).items()}
    summary = summarize(papers, rows, {d["paper"]: d for d in docs})
    for p in papers:
        path = out_dir / f"forest_{p}.png"
        if not forest.save([r for r in rows if r["paper"] == p], PAPERS.get(p, p), path) and path.exists():
            path.unlink()
    md = report_markdown(papers, rows, summary, results_root, out_dir,
                         {d["paper"]: d.get("scale_notes") or {} for d in docs})
    paths = {"markdown": out_dir / "report.md", "html": out_dir / "report.html",
             "summary_csv": out_dir / "summary.csv", "summary_md": out_dir / "summary.md"}
    paths["markdown"].write_text(md)
    paths["html"].write_text(to_html(md, out_dir))
    pd.DataFrame(summary).to_csv(paths["summary_csv"], index=False)
    paths["summary_md"].write_text("# Reproduction summary\n\n" + summary_markdown(summary, link=False) + "\n"
                                   + notes_markdown(summary))
    stages = {st.name: (st.profile if st.exists else NOT_REPRODUCED) for sts in papers.values() for st in sts}
    return {**paths, "summary": summary, "claims": rows, "stages": stages}


README_START, README_END = "<!-- report-summary:start -->", "<!-- report-summary:end -->"


def readme_with_summary(readme: str, summary: list[dict], stamp: str) -> str:
    """README text with the block between README_START and README_END replaced by the summary table and a line
    saying where it came from (`stamp`: commit, date, what ran). The markers must be there, once each."""
    if readme.count(README_START) != 1 or readme.count(README_END) != 1 or \
            readme.index(README_START) > readme.index(README_END):
        raise ValueError(f"README needs one {README_START} ... {README_END} block for the summary")
    head, rest = readme.split(README_START)
    _, tail = rest.split(README_END)
    top = headline_markdown(summary)
    return (f"{head}{README_START}\n{summary_markdown(summary, link=False)}\n" + (f"{top}\n" if top else "")
            + f"**What each profile runs, and what it found:**\n\n{notes_markdown(summary)}\n{stamp}\n{README_END}{tail}")


def verdict_metrics(summary: list[dict]) -> dict:
    """The summary as a small DVC metrics file: per paper (and profile, where a paper's outputs have several), how
    many of its claims have each verdict, the independent tests decided, and how many runs run health flagged."""
    out: dict = {}
    for row in summary:
        if row["profile"] == NOT_REPRODUCED and not row["claims"]:
            continue
        several = sum(r["paper"] == row["paper"] and r["profile"] != NOT_REPRODUCED for r in summary) > 1
        key = f"{row['paper']} ({row['profile']})" if several or row["profile"] == NOT_REPRODUCED else row["paper"]
        out[key] = {"profile": row["profile"], **{v.replace(" ", "_"): row[v] for v in claims.VERDICTS},
                    "claims": row["claims"], "independent_tests": row.get("independent"),
                    "metric_sensitive": row.get("sensitive", 0), "kernel_sensitive": row.get("kernel", 0),
                    "runs_flagged": row["flagged"]}
    return out


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--readme", help="also put the summary table into this README (between its report-summary "
                    "markers), stamped with the commit and date")
    ap.add_argument("--results", help="results directory (default: $PFLREPRO_RESULTS or results/)")
    ap.add_argument("--figures", help="figures directory (default: figures/)")
    ap.add_argument("--out", help="where to write the report (default: <results>/report)")
    ap.add_argument("--metrics", help="also write the claims' verdicts per paper here as a compact DVC metrics file "
                    "(what `dvc metrics show metrics/report.json` and `dvc exp show` read)")


def run_cli(a) -> int:
    results = Path(a.results) if a.results else claims._results_root()
    try:
        out = write_report(results, Path(a.figures) if a.figures else REPO_ROOT / "figures",
                           Path(a.out) if a.out else results / "report")
    except claims.ClaimsError as e:
        print(f"claims error: {e}")
        return 2
    print(summary_markdown(out["summary"], link=False))
    for k in ("html", "markdown", "summary_csv", "summary_md"):
        print(f"wrote {out[k]}")
    if getattr(a, "metrics", None):
        path = Path(a.metrics)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(verdict_metrics(out["summary"]), indent=1) + "\n")
        print(f"wrote {path}")
    if getattr(a, "readme", None):
        import datetime

        g = git_commit()
        stamp = (f"Measured by `dvc repro` at commit {g.get('commit', '?')[:10]}{' (dirty)' if g.get('dirty') else ''}, "
                 f"{datetime.date.today().isoformat()}; the full report: `results/report/report.html` after `dvc repro`.")
        path = Path(a.readme)
        path.write_text(readme_with_summary(path.read_text(), out["summary"], stamp))
        print(f"wrote the summary into {path}")
    return 0
