"""How far the CPU's kernel path moves the default repro's table values and verdicts (issue 54).

Two checkouts of the same commit, each after a full `dvc repro` from an empty run store on the same machine, one with
the default kernels and one with another path (for example `ATEN_CPU_CAPABILITY=avx2`, the kernels an AVX2 CPU runs):

    python scripts/evidence/kernel_paths.py A B --label-a "AVX512 (default)" --label-b "ATEN_CPU_CAPABILITY=avx2" \
        --out docs/evidence/kernel_paths

reads each checkout's `metrics/<stage>.json` (every table value) and runs `python -m pflrepro claims --format json` in
each (every claim's verdict, effect and interval), and writes
- `values.csv`: every table value on both paths and the difference;
- `claims.json`: per claim, each path's verdict, effect and interval. The report reads it
  (`pflrepro.reporting.claims.kernel`) and marks a claim whose verdict differs on the other path, where the claim's
  current effect is one of the two recorded (the same runs);
- `summary.md`: how many values moved and by how much, each table's largest move, and the verdicts that moved.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from pflrepro.reporting.verdict_md import _md_table  # noqa: E402
from pflrepro.reporting.verdicts import DECIDED  # noqa: E402


def flatten(doc, prefix: str = "") -> dict[str, float]:
    """A metrics file's numbers, keyed by their path ('20 clients/fedavg/best')."""
    out: dict[str, float] = {}
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.update(flatten(v, f"{prefix}/{k}" if prefix else str(k)))
    elif isinstance(doc, (int, float)) and not isinstance(doc, bool):
        out[prefix] = float(doc)
    return out


def table_values(checkout: Path) -> dict[tuple[str, str], float]:
    """(stage, key) -> value over a checkout's metrics/<stage>.json (the report's own counts left out)."""
    out = {}
    for f in sorted((checkout / "metrics").glob("*.json")):
        if f.stem == "report":
            continue
        out.update({(f.stem, k): v for k, v in flatten(json.loads(f.read_text())).items()})
    return out


def claims_of(checkout: Path) -> list[dict]:
    """Every claim checked on a checkout's own results, by that checkout's code."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    out = subprocess.run([sys.executable, "-m", "pflrepro", "claims", "--format", "json"], cwd=checkout, env=env,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def compare_values(a: dict, b: dict) -> list[dict]:
    rows = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        d = None if va is None or vb is None else vb - va
        rows.append({"stage": key[0], "value": key[1], "a": va, "b": vb, "diff": d})
    return rows


def claim_pairs(a: list[dict], b: list[dict]) -> list[dict]:
    keep = ("verdict", "effect", "interval", "seeds")
    bb = {(r["paper"], r["id"]): r for r in b}
    return [{"paper": r["paper"], "id": r["id"], "headline": bool(r.get("headline")), "group": r.get("group", ""),
             "a": {k: r.get(k) for k in keep}, "b": {k: bb[(r["paper"], r["id"])].get(k) for k in keep}}
            for r in a if (r["paper"], r["id"]) in bb]


def _md(header: list[str], rows: list[list]) -> str:
    return _md_table(header, rows).rstrip("\n")


def _decided_groups(pairs: list[dict], side: str) -> set:
    return {(p["paper"], p["group"] or p["id"]) for p in pairs if p[side]["verdict"] in DECIDED}


def summary(values: list[dict], pairs: list[dict], label_a: str, label_b: str) -> str:
    both = [v for v in values if v["diff"] is not None]
    moved = [v for v in both if v["diff"] != 0]
    mags = sorted(abs(v["diff"]) for v in moved)
    per_stage = {}
    for v in moved:
        if abs(v["diff"]) > abs(per_stage.get(v["stage"], {"diff": 0})["diff"]):
            per_stage[v["stage"]] = v
    lines = [f"Kernel paths: A = {label_a}, B = {label_b}; the same commit, machine and seeds.", "",
             f"- Table values on both paths: {len(both)}; moved: {len(moved)}"
             + (f" (median |B - A| {statistics.median(mags):.3g}, 90th percentile "
                f"{mags[int(0.9 * (len(mags) - 1))]:.3g}, largest {mags[-1]:.3g})" if mags else "")
             + f"; only on one path: {len(values) - len(both)}."]
    vm = [p for p in pairs if p["a"]["verdict"] != p["b"]["verdict"]]
    dm = [p for p in vm if p["a"]["verdict"] in DECIDED or p["b"]["verdict"] in DECIDED]
    ga, gb = _decided_groups(pairs, "a"), _decided_groups(pairs, "b")
    same = {(p["paper"], p["group"] or p["id"]) for p in pairs
            if p["a"]["verdict"] in DECIDED and p["a"]["verdict"] == p["b"]["verdict"]}
    lines += [f"- Claims: {len(pairs)}; verdicts that moved: {len(vm)}, of which {len(dm)} decided on one path "
              f"(holds, partial or fails).",
              f"- Independent tests decided: {len(ga)} on A, {len(gb)} on B, {len(same)} decided the same on both.", "",
              "Each stage's largest move:", "",
              _md(["stage", "value", "A", "B", "B - A"],
                  [[s, v["value"], f"{v['a']:.4g}", f"{v['b']:.4g}", f"{v['diff']:+.3g}"]
                   for s, v in sorted(per_stage.items())]), "",
              "Verdicts that moved:", "",
              _md(["paper", "claim", "headline", "A", "B", "A: effect [interval]", "B: effect [interval]"],
                  [[p["paper"], p["id"], "yes" if p["headline"] else "", p["a"]["verdict"], p["b"]["verdict"],
                    p["a"]["interval"] or "", p["b"]["interval"] or ""] for p in vm])]
    counts = [[v, Counter(p["a"]["verdict"] for p in pairs)[v], Counter(p["b"]["verdict"] for p in pairs)[v]]
              for v in ("holds", "partial", "fails", "inconclusive", "underpowered", "by design", "not run")]
    return "\n".join(lines + ["", "Counts:", "", _md(["verdict", "A", "B"], counts)]) + "\n"


def write(out: Path, values: list[dict], pairs: list[dict], label_a: str, label_b: str, commit: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with (out / "values.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, ["stage", "value", "a", "b", "diff"])
        w.writeheader()
        w.writerows(values)
    (out / "claims.json").write_text(json.dumps({"a": label_a, "b": label_b, "commit": commit, "claims": pairs},
                                                indent=1) + "\n")
    (out / "summary.md").write_text(summary(values, pairs, label_a, label_b))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", type=Path, help="the checkout repro'd on the default kernels")
    ap.add_argument("b", type=Path, help="the checkout repro'd on the other kernel path")
    ap.add_argument("--label-a", default="default kernels")
    ap.add_argument("--label-b", required=True)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=a.a, capture_output=True, text=True).stdout.strip()
    values = compare_values(table_values(a.a), table_values(a.b))
    pairs = claim_pairs(claims_of(a.a), claims_of(a.b))
    write(a.out, values, pairs, a.label_a, a.label_b, commit)
    print((a.out / "summary.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
