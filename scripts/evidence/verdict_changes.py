"""Which claims' verdicts moved between two checks of the same results (issue 51: the rule before and after).

    python -m pflrepro claims --format json > after.json                       # this checkout's rule
    PYTHONPATH=<a checkout of the old commit> python -m pflrepro claims --format json > before.json
    python scripts/evidence/verdict_changes.py before.json after.json [--out docs/benchmarks/x/verdict_changes.md]

Prints (and writes) the counts per paper before and after, every claim whose verdict moved (old -> new) with the
new rule's reason, the claims now flagged metric-sensitive or contradicted by the paper's own numbers, the power each
paper's claims had at the paper's own effect, and the per-seed spread of the paired effects (min, median, max of the
claims' per-seed sd by paper: how far one table's comparisons are from a common variance).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from pflrepro.reporting.verdict_md import _md_table  # noqa: E402

ORDER = ("holds", "partial", "fails", "inconclusive", "underpowered", "by design", "not run")


def _rows(path: str) -> dict:
    return {(r["paper"], r["id"]): r for r in json.loads(Path(path).read_text())}


def _md(header: list[str], rows: list[list]) -> str:
    return _md_table(header, rows).rstrip("\n")


def _why(r: dict) -> str:
    ev = r.get("evidence", "")
    parts = [p for p in ev.split(" | ") if ": holds" in p or ": fails" in p or "(" in p]
    return (parts[0] if parts else ev)[:260]


def report(before: dict, after: dict) -> str:
    papers = sorted({p for p, _ in after})
    counts = []
    for p in papers:
        b = Counter(r["verdict"] for (pp, _), r in before.items() if pp == p)
        a = Counter(r["verdict"] for (pp, _), r in after.items() if pp == p)
        counts.append([p, *(f"{b[v]} -> {a[v]}" for v in ORDER)])
    moved = [[p, i, before[(p, i)]["verdict"], r["verdict"], r.get("interval", ""), _why(r)]
             for (p, i), r in sorted(after.items()) if (p, i) in before and before[(p, i)]["verdict"] != r["verdict"]]
    flagged = [[p, i, r["verdict"], f"{r.get('robust_verdict')} {r.get('robust_interval', '')}" if r.get("metric_sensitive")
                else "", r.get("paper_check", ""), r.get("quantity_verdict", "")]
               for (p, i), r in sorted(after.items())
               if r.get("metric_sensitive") or r.get("paper_check") or r.get("quantity_verdict") == "fails"]
    power = [[p, i, r["verdict"], f"{100 * r['power']:.0f} %", r.get("paper_gap")]
             for (p, i), r in sorted(after.items()) if r.get("power") is not None]
    spread = []
    for p in papers:
        sds = [r["seed_sd"] for (pp, _), r in after.items() if pp == p and r.get("seed_sd") and r.get("seeds", 0) >= 3]
        if sds:
            spread.append([p, len(sds), f"{min(sds):.3g}", f"{statistics.median(sds):.3g}", f"{max(sds):.3g}",
                           f"{(max(sds) / min(sds)) ** 2:.0f}"])
    return "\n\n".join([
        "Counts per paper (before -> after):", _md(["paper", *ORDER], counts),
        f"Verdicts that moved ({len(moved)}):", _md(["paper", "claim", "before", "after", "effect [90 % CI]", "why"], moved),
        f"Flagged ({len(flagged)}): metric-sensitive, the paper's own numbers disagree, a by-design quantity that fails",
        _md(["paper", "claim", "verdict", "on the last tenth", "paper check", "by-design quantity"], flagged),
        "Power at the paper's own effect (claims where it is known):",
        _md(["paper", "claim", "verdict", "power", "paper's distance from the boundary"], power),
        "Per-seed sd of the claims' paired effects (3+ seeds): the variance ratio max/min says how far a pooled "
        "variance would be from each comparison's own", _md(["paper", "claims", "min", "median", "max", "variance ratio"],
                                                              spread)]) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    text = report(_rows(a.before), _rows(a.after))
    print(text)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
