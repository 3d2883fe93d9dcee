"""A benchmark's result table: <out>/<stem>.csv and <stem>.md (a Markdown table and a footer line), printed."""
from __future__ import annotations

import csv
from pathlib import Path


def write_table(out: Path, stem: str, columns: list[str], rows: list[dict], footer: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"{stem}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows(rows)
    md = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    md += ["| " + " | ".join(str(r[c]) for c in columns) + " |" for r in rows]
    md.append(f"\n{footer}")
    (out / f"{stem}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
