"""What the default repro's stages cost per seed, and what 3 paired seeds on every claimed stage would add (issue 54).

    python scripts/evidence/stage_cost.py [--seeds 3] [--out docs/evidence/design/stage_cost.md]

Reads the train manifests (`results/train/<paper>.json`: each notebook's runs), each run's config and its recorded
wall time (`provenance.json`, one thread a run), and the claims (`paper_numbers/*_claims.yaml`: which stages a claim
reads). A run shared by several stages (pFedSD's Tables 2, 4, 5 and Figs. 6, 7 read the same 21 runs) is counted once:
CPU-seconds are summed over distinct runs, and a stage's missing seeds over distinct (config without its seed) keys.
Nothing trains; the numbers are the store's, from the CPU that trained it.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def claimed_stages(claims_dir: Path) -> set:
    import yaml
    out = set()
    for f in sorted(claims_dir.glob("*_claims.yaml")):
        for c in yaml.safe_load(f.read_text()).get("claims", []):
            where = c.get("where")
            if isinstance(where, dict) and "stage" in where:
                out.add(where["stage"])
    return out


def load_runs(train_dir: Path, runs_dir: Path) -> dict:
    """{stage: [(config without seed as a key, seed, wall seconds, run name)]} from every train manifest."""
    out = {}
    for man in sorted(train_dir.glob("*.json")):
        for stage, names in json.loads(man.read_text())["notebooks"].items():
            rows = []
            for n in names:
                cfg = json.loads((runs_dir / n / "config.json").read_text())
                wall = float(json.loads((runs_dir / n / "provenance.json").read_text()).get("wall_seconds", 0.0))
                seed = cfg.pop("seed")
                cfg.pop("seeds", None)
                rows.append((json.dumps(cfg, sort_keys=True), seed, wall, n))
            out[stage] = rows
    return out


def cost_table(stages: dict, claimed: set, target: int) -> tuple[list, dict]:
    """Per stage: seeds, runs, CPU-seconds a seed (its own runs, mean over its seeds), claimed or not; and the totals:
    distinct runs' CPU-seconds now, and what `target` seeds on every claimed stage would add (each missing (config,
    seed) once, priced at the mean wall time of that config's stored seeds)."""
    rows, wall_of, seeds_of = [], {}, defaultdict(set)
    for stage, runs in sorted(stages.items()):
        seeds = sorted({s for _, s, _, _ in runs})
        per_seed = sum(w for *_, w, _ in runs) / max(len(seeds), 1)
        rows.append({"stage": stage, "claimed": stage in claimed, "seeds": len(seeds), "runs": len(runs),
                     "cpu_s_per_seed": per_seed})
        for key, s, w, n in runs:
            wall_of[(key, s)] = w
            seeds_of[key].add(s)
    now = sum(wall_of.values())
    missing = {}
    for stage, runs in stages.items():
        if stage not in claimed:
            continue
        for key in {k for k, *_ in runs}:
            have = seeds_of[key]
            mean = sum(wall_of[(key, s)] for s in have) / len(have)
            for s in range(target):
                if s not in have:
                    missing[(key, s)] = mean
    return rows, {"cpu_s_now": now, "cpu_s_added": sum(missing.values()), "runs_added": len(missing),
                  "distinct_runs": len(wall_of)}


def markdown(rows: list, totals: dict, target: int) -> str:
    lines = ["| stage | claims read it | seeds | runs | CPU-s a seed |", "|---|---|---|---|---|"]
    lines += [f"| {r['stage']} | {'yes' if r['claimed'] else 'no'} | {r['seeds']} | {r['runs']} | "
              f"{r['cpu_s_per_seed']:.0f} |" for r in rows]
    lines += ["", f"Distinct runs {totals['distinct_runs']}, {totals['cpu_s_now'] / 60:.0f} CPU-minutes of training "
              f"(one thread a run). {target} paired seeds on every claimed stage would add {totals['runs_added']} runs, "
              f"{totals['cpu_s_added'] / 60:.0f} CPU-minutes (about {totals['cpu_s_added'] / 120:.0f} minutes of wall on "
              f"2 cores), on the CPU that trained the store."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--results", default=str(REPO / "results"))
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if a.seeds < 1:
        raise SystemExit("--seeds: at least 1")
    res = Path(a.results)
    rows, totals = cost_table(load_runs(res / "train", res / "runs"), claimed_stages(REPO / "paper_numbers"), a.seeds)
    text = markdown(rows, totals, a.seeds)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
