"""Verdicts that float rounding moves: the claims whose verdict differs between two kernel paths of the CPU.

`scripts/evidence/kernel_paths.py` runs the claims on two full repros of one commit on one machine, with the
default kernels (A) and another path (B: `ATEN_CPU_CAPABILITY=avx2`, the kernels an AVX2 CPU runs), and writes each
claim's verdict, effect and interval on both to `docs/evidence/kernel_paths/claims.json` (KERNEL_CHECK). `mark`
reads it beside a check: a claim whose current effect and verdict are those of one path (the same runs, rounded the
same way) gets `kernel` = the other path's {path, verdict, interval}, and `kernel_sensitive` when the two verdicts
differ. A claim whose effect is neither path's was not checked on these runs (a later design, another machine's
rounding): it gets no mark, and the report says the check covers the recorded commit's runs only.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from .loading import REPO_ROOT

KERNEL_CHECK = REPO_ROOT / "docs" / "evidence" / "kernel_paths" / "claims.json"


def _same(x, y) -> bool:
    if x is None or y is None:
        return x is None and y is None
    return math.isclose(float(x), float(y), rel_tol=1e-9, abs_tol=1e-12) or (x != x and y != y)


def _matches(row: dict, side: dict) -> bool:
    return side.get("verdict") == row["verdict"] and _same(side.get("effect"), row.get("effect")) \
        and (side.get("interval") or "") == (row.get("interval") or "")


def mark(rows: list[dict], path: Path | str | None = None) -> None:
    """Add `kernel` and `kernel_sensitive` to each row the recorded check covers (module docstring)."""
    p = Path(path) if path is not None else KERNEL_CHECK
    if not p.exists():
        return
    doc = json.loads(p.read_text())
    pairs = {(c["paper"], c["id"]): c for c in doc.get("claims", [])}
    labels = {"a": doc.get("a", "A"), "b": doc.get("b", "B")}
    for r in rows:
        c = pairs.get((r["paper"], r["id"]))
        if c is None or r["verdict"] == "not run":
            continue
        for me, other in (("a", "b"), ("b", "a")):
            if _matches(r, c[me]):
                r["kernel"] = {"path": labels[other], "verdict": c[other]["verdict"],
                               "interval": c[other].get("interval") or "", "commit": doc.get("commit", "")}
                r["kernel_sensitive"] = c[other]["verdict"] != r["verdict"]
                break
