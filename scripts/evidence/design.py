"""Designs ranked by detectable effect per CPU-minute (issue 54): which change to a table's mini setting buys the most
evidence for the CPU it costs.

    python scripts/evidence/design.py pfedsd_table2 --reference pfedsd --methods fedper,lg_fedavg,fedfomo --seeds 6
        [--designs base,clients_x2,rounds_x2,full] [--base-seed 2000] [--budget-min 10] [--profile mini]
        [--setting NAME] [--jobs 2] [--out docs/evidence/design] [--summarize]

Each design is the setting with one change (`DESIGNS`): `base` (as it is: more seeds is this design at more seeds),
`clients_x2` (twice the clients over the same images: half as many a client), `rounds_x2` (twice the rounds),
`rounds_half` (half of them: cheaper, at the price of convergence), `full` (every client every round; skipped where the
setting already has it), `tests_x4` (four times each client's test set from images no client holds, training unchanged:
scoring is cheap beside training; `_tests_x4`). For every design the reference and the other
methods train at `--seeds` ordinary pilot seeds (every random stream moves, as a verdict seed's would; from
`--base-seed` up, a range no verdict reads and apart from noise.py's 1000+). Per design and comparison (reference minus
method, paired by seed) it reports the paired difference's mean and SD, the CPU-seconds one seed of the design costs
(the wall time of its runs, one thread each), and the minimum detectable effect (`noise.detectable`: one-sided paired
t at 5 %, 80 % power) at the seeds `--budget-min` CPU-minutes buy, and at 3 seeds. A design the config rules refuse is
reported with the refusal's one line, not trained. Runs live in the results store (resumable; a second call trains
nothing); `--summarize` writes <table>_<reference>.csv and .md to `--out`.
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

_spec = importlib.util.spec_from_file_location("noise", Path(__file__).with_name("noise.py"))
noise = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(noise)

DESIGNS = {
    "base": lambda cfg: {},
    "clients_x2": lambda cfg: {"n_clients": 2 * cfg.n_clients},
    "rounds_x2": lambda cfg: {"rounds": 2 * cfg.rounds},
    "rounds_half": lambda cfg: None if cfg.rounds < 2 else {"rounds": cfg.rounds // 2},
    "full": lambda cfg: None if cfg.participation >= 1.0 else {"participation": 1.0},
    "tests_x4": lambda cfg: _tests_x4(cfg),
    # two changes at once, where the pilots found each acting on its own source (DC-PFL: the scoring floor and
    # non-convergence)
    "tests_x4_rounds_x2": lambda cfg: None if (t := _tests_x4(cfg)) is None else {**t, "rounds": 2 * cfg.rounds},
}


def _tests_x4(cfg) -> dict | None:
    """Four times each client's test set, training unchanged: `random` splits get 3x their mean test size more from
    the images no client holds (`extra_test`, by the client's label shares); SCD's `global_test_by_proportion` a 4x
    `scale` (its default: |test| / |train| of the dataset). Other splits: not a change this script makes."""
    from pflrepro.federation.build import build_partition, raw_dataset
    if cfg.split == "random":
        tests = build_partition(cfg)["test"]
        extra = 3 * round(sum(len(t) for t in tests) / max(len(tests), 1))
        return {"split_params": {**cfg.split_params, "extra_test": extra}} if extra else None
    if cfg.split == "global_test_by_proportion":
        raw = raw_dataset(cfg.dataset)
        scale = cfg.split_params.get("scale") or len(raw.y_test) / len(raw.y_train)
        return {"split_params": {**cfg.split_params, "scale": 4 * scale}}
    return None


def configs(table: str, reference: str, methods, designs, seeds: int, base: int, profile=None, setting=None):
    """({(design, method, seed): RunConfig}, {design: why it was not run}) from the table's params (`setting`, default
    the first), every config validated before anything trains."""
    from pflrepro.federation.config import RunConfig
    from pflrepro.params import ConfigError
    grid = noise.configs(table, reference, methods, ["all"], 2, base, profile, setting)
    per_method = {m: cfg for (m, _, i), cfg in grid.items() if i == 0}
    out, skipped = {}, {}
    for d in designs:
        if d not in DESIGNS:
            raise SystemExit(f"design {d!r}: one of {', '.join(DESIGNS)}")
        change = DESIGNS[d](next(iter(per_method.values())))
        if change is None:
            skipped[d] = "not a change for this setting"
            continue
        try:
            for m, cfg in per_method.items():
                for s in range(base, base + seeds):
                    c = RunConfig.from_dict({**cfg.to_dict(), **change, "seed": s, "seeds": {}})
                    out[(d, m, s)] = c
        except ConfigError as e:
            skipped[d] = str(e).splitlines()[0]
            out = {k: v for k, v in out.items() if k[0] != d}
    return out, skipped


def summarize(results: dict, reference: str, metric: str, budget_min: float) -> pd.DataFrame:
    """Per design and comparison: the paired difference of the best round's `metric` (points) over the seeds, a seed's
    CPU-seconds (every method of the pilot: each run's `cpu_seconds` where every run of the design has it, else its
    wall time, which a shared or niced machine inflates: `priced_by` says which), and the detectable effect at 3 seeds
    and at the seeds the budget buys."""
    rows = []
    for (d, m, s), r in results.items():
        v = 100 * r.metric(metric)
        cpu = r.provenance.get("cpu_seconds")
        rows.append({"design": d, "method": m, "seed": s, "best": float(np.nanmax(v)),
                     "wall_s": float(r.provenance.get("wall_seconds", float("nan"))),
                     "cpu_s": float("nan") if cpu is None else float(cpu)})
    df = pd.DataFrame(rows)
    out = []
    for d, t in df.groupby("design", sort=False):
        by = "cpu" if t.cpu_s.notna().all() else "wall"
        per_seed = t.groupby("seed")[f"{by}_s"].sum()
        cost = float(per_seed.mean())
        afford = max(int(budget_min * 60 // cost), 0) if cost > 0 else 0
        ref = t[t.method == reference].set_index("seed").best
        for m in [x for x in dict.fromkeys(t.method) if x != reference]:
            oth = t[t.method == m].set_index("seed").best
            common = ref.index.intersection(oth.index)
            diff = (ref.loc[common] - oth.loc[common]).to_numpy()
            sd = float(np.std(diff, ddof=1)) if len(diff) > 1 else float("nan")
            out.append({"design": d, "comparison": f"{reference} - {m}", "seeds": len(diff),
                        "mean_diff": float(np.mean(diff)), "sd_diff": sd, "cpu_s_per_seed": cost, "priced_by": by,
                        "mde_3": noise.detectable(sd, 3), "seeds_in_budget": afford,
                        "mde_budget": noise.detectable(sd, afford) if afford >= 2 else float("nan")})
    return pd.DataFrame(out)


def markdown(table: pd.DataFrame, skipped: dict, title: str, budget_min: float) -> str:
    lines = [f"### {title}", "",
             f"| design | comparison | seeds | mean diff | SD of paired diff | CPU-s a seed | detectable at 3 seeds "
             f"| seeds in {budget_min:g} CPU-min | detectable there |", "|---|---|---|---|---|---|---|---|---|"]
    for _, r in table.iterrows():
        lines.append(f"| {r.design} | {r.comparison} | {r.seeds} | {r.mean_diff:+.2f} | {r.sd_diff:.2f} | "
                     f"{r.cpu_s_per_seed:.0f}{'' if r.priced_by == 'cpu' else ' (wall)'} | {r.mde_3:.2f} | "
                     f"{r.seeds_in_budget} | {r.mde_budget:.2f} |")
    for d, why in skipped.items():
        lines.append(f"| {d} | not run: {why} | | | | | | | |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("table")
    ap.add_argument("--reference", required=True)
    ap.add_argument("--methods", default="")
    ap.add_argument("--designs", default=",".join(DESIGNS))
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--base-seed", type=int, default=2000, help="pilot seeds: no verdict reads them (default 2000)")
    ap.add_argument("--budget-min", type=float, default=10.0, help="CPU-minutes a design may spend on this table")
    ap.add_argument("--profile", default=None)
    ap.add_argument("--setting", default=None)
    ap.add_argument("--metric", default="pm_acc_mean")
    ap.add_argument("--jobs", default="auto")
    ap.add_argument("--out", default=str(REPO / "docs" / "evidence" / "design"))
    ap.add_argument("--summarize", action="store_true")
    a = ap.parse_args(argv)
    if a.seeds < 2:
        raise SystemExit("--seeds: at least 2 (a paired SD needs two)")
    if a.base_seed < 100:
        raise SystemExit(f"--base-seed={a.base_seed}: verdict seeds live below 100; pilot seeds must not")
    if not math.isfinite(a.budget_min) or a.budget_min <= 0:
        raise SystemExit(f"--budget-min={a.budget_min}: a positive number of minutes")
    from pflrepro.pipeline import experiments
    cfgs, skipped = configs(a.table, a.reference, [m for m in a.methods.split(",") if m], a.designs.split(","),
                            a.seeds, a.base_seed, a.profile, a.setting)
    for d, why in skipped.items():
        print(f"design {d}: not run ({why})", flush=True)
    print(f"{a.table}: {len(cfgs)} configs", flush=True)
    results = experiments.run_grid(cfgs, progress="log", jobs=a.jobs, name=f"design {a.table}")
    if a.summarize:
        table = summarize(results, a.reference, a.metric, a.budget_min)
        title = (f"{a.table} ({a.profile or 'default profile'}, {a.setting or 'first setting'}), pilot seeds "
                 f"{a.base_seed}-{a.base_seed + a.seeds - 1}, metric {a.metric}")
        noise.write_summary(Path(a.out), f"{a.table}_{a.reference}", table, markdown(table, skipped, title, a.budget_min))


if __name__ == "__main__":
    main()
