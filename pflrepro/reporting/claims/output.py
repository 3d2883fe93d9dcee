"""The claims' output: the summary, the headline count, text and markdown, and the `claims` verb."""
from __future__ import annotations

import argparse
import json


from .. import verdicts
from .loading import claims_files, ClaimsError, SMALL_TEST, VERDICTS
from .effects import _fmt
from .judging import check


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
    if r.get("kernel_sensitive"):
        k = r["kernel"]
        out.append(f"kernel-sensitive: on {k['path']} (same machine and seeds), {k['verdict']}"
                   + (f" ({k['interval']})" if k.get("interval") else ""))
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
