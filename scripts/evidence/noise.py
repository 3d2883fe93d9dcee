"""Where the noise of a table's paired differences comes from: each random source varied alone, the others held fixed.

    python scripts/evidence/noise.py pfedsd_table2 --reference pfedsd [--methods fedavg,fedper,...] [--draws 6]
        [--base-seed 1000] [--sources partition,split,init,order,all] [--profile mini] [--setting NAME]
        [--jobs 2] [--out docs/evidence/noise] [--summarize]

A run's randomness comes from four streams (`seeds` in a run config, pflrepro.federation.config.SEED_STREAMS):
`partition` (which images each client holds), `split` (which of them it tests on), `init` (the initial weights), and
the run's `seed` itself, which with those three pinned moves only the `order` of SGD batches, client sampling and
each algorithm's own draws. For every source this script trains the table's methods at `--draws` values of that
stream with the other streams at `--base-seed` (draw 0, shared by every source, is the base), and `all` moves every
stream together (an ordinary seed). Per source and comparison (reference minus each other method, paired: the two
share every stream) it reports the standard deviation of the paired difference over the draws, of the best round's
personalized accuracy (what the tables read) and of the mean of the last rounds; beside them the round-to-round
spread of the difference over the last rounds (non-convergence) and the test images' own binomial spread (the
variance floor `verdicts.floor_variance` uses, and the independent-binomial bound above it).

Pilot seeds only: the seeds from `--base-seed` up are no verdict's (the repro's verdict seeds are 0-2), so what this
measures may choose a design without touching a verdict. The runs live in the results store (resumable; a second
call trains nothing); `--summarize` writes noise.csv and noise.md to `--out`.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

SOURCES = ("partition", "split", "init", "order", "all")
STREAMS = ("partition", "split", "init")


class Draw(NamedTuple):
    source: str
    draw: int
    seed: int
    seeds: tuple        # ((stream, seed), ...): every stream pinned


def draws(sources, n: int, base: int) -> list[Draw]:
    """The (source, draw) grid: draw 0 is the base (every stream at `base`) for every source; draw i > 0 moves the
    source's stream to base + i (`order`: the run's seed with the three streams pinned at base; `all`: every stream and
    the seed together)."""
    out = []
    for s in sources:
        if s not in SOURCES:
            raise ValueError(f"source {s!r}: one of {', '.join(SOURCES)}")
        for i in range(n):
            pinned = {k: base for k in STREAMS}
            seed = base
            if i:
                if s in STREAMS:
                    pinned[s] = base + i
                else:
                    seed = base + i
                    if s == "all":
                        pinned = {k: base + i for k in STREAMS}
            out.append(Draw(s, i, seed, tuple(sorted(pinned.items()))))
    return out


def configs(table: str, reference: str, methods, sources, n: int, base: int, profile: str | None = None,
            setting: str | None = None) -> dict:
    """{(method, source, draw): RunConfig} from the table's params (the profile's settings for `setting`, default
    its first), every config validated before anything trains."""
    from pflrepro.pipeline import experiments
    p = experiments.load_profile(table, profile)
    grid = experiments.grid(p, {"seeds": [base]})
    settings = list(dict.fromkeys(k[1] for k in grid))
    setting = setting or settings[0]
    if setting not in settings:
        raise SystemExit(f"setting {setting!r}: {table} has {', '.join(settings)}")
    have = [k[0] for k in grid if k[1] == setting]
    methods = list(dict.fromkeys([reference, *(methods or [m for m in have if m != reference])]))
    missing = [m for m in methods if m not in have]
    if missing:
        raise SystemExit(f"methods {missing}: not in {table}'s {setting!r} ({', '.join(have)})")
    out = {}
    for m in methods:
        cfg = grid[(m, setting, base)]
        for d in draws(sources, n, base):
            out[(m, d.source, d.draw)] = cfg.replace(seed=d.seed, seeds=dict(d.seeds))
    return out


def test_sizes(cfg) -> np.ndarray:
    """Each client's number of test images."""
    from pflrepro.federation.build import build_partition
    return np.array([len(t) for t in build_partition(cfg)["test"]], dtype=np.float64)


def rows_of(results: dict, metric: str, last: int) -> pd.DataFrame:
    """One row per run: best and last-`last` mean of `metric` (in %), its last rounds' curve, the clients' test sizes."""
    rows = []
    for (m, s, i), r in results.items():
        v = 100 * r.metric(metric)
        rows.append({"method": m, "source": s, "draw": i, "best": float(np.nanmax(v)),
                     "last": float(np.nanmean(v[-last:])), "curve": v[-last:], "n_eff": _n_eff(test_sizes(r.config)),
                     "wall_s": float(r.provenance.get("wall_seconds", float("nan")))})
    return pd.DataFrame(rows)


def _n_eff(n_k: np.ndarray) -> float:
    """Test images of a mean over clients of each client's accuracy, in the binomial's terms: K^2 / sum(1 / n_k)."""
    n_k = n_k[n_k > 0]
    return float(len(n_k) ** 2 / np.sum(1.0 / n_k)) if len(n_k) else float("nan")


def decompose(rows: pd.DataFrame, reference: str) -> pd.DataFrame:
    """Per comparison (reference - other) and source: the paired difference's mean and SD over the draws, of the best
    round and of the last rounds' mean; its round-to-round SD over the last rounds (mean over draws); the test
    images' floor SD and independent-binomial SD of one draw's difference (at the base draw's accuracies)."""
    from pflrepro.reporting.verdicts import floor_variance
    out = []
    ref = rows[rows.method == reference].set_index(["source", "draw"])
    for other in [m for m in dict.fromkeys(rows.method) if m != reference]:
        oth = rows[rows.method == other].set_index(["source", "draw"])
        for source in dict.fromkeys(rows.source):
            a, b = ref.loc[source], oth.loc[source]
            common = a.index.intersection(b.index)
            a, b = a.loc[common], b.loc[common]
            d_best, d_last = (a.best - b.best).to_numpy(), (a["last"] - b["last"]).to_numpy()
            within = [float(np.std(np.asarray(x) - np.asarray(y), ddof=1)) for x, y in zip(a.curve, b.curve)
                      if len(x) > 1]
            pa, pb, n = a.best.iloc[0] / 100, b.best.iloc[0] / 100, float(a.n_eff.iloc[0])
            out.append({"comparison": f"{reference} - {other}", "source": source, "draws": len(common),
                        "mean_best": float(np.mean(d_best)), "sd_best": _sd(d_best),
                        "mean_last": float(np.mean(d_last)), "sd_last": _sd(d_last),
                        "sd_within_last": float(np.mean(within)) if within else float("nan"),
                        "sd_test_floor": math.sqrt(floor_variance("diff", [100 * pa, 100 * pb], [n])),
                        "sd_test_binomial": 100 * math.sqrt((pa * (1 - pa) + pb * (1 - pb)) / n),
                        "n_test_eff": n})
    return pd.DataFrame(out)


def _sd(x: np.ndarray) -> float:
    return float(np.std(x, ddof=1)) if len(x) > 1 else float("nan")


def detectable(sd: float, seeds: int) -> float:
    """Minimum detectable effect of the report's rule (one-sided paired t at 5 %, 80 % power) at `seeds` seeds whose
    paired differences have standard deviation `sd`: (t_.95 + t_.80 at seeds - 1 df) * sd / sqrt(seeds)."""
    from pflrepro.reporting.verdicts import ALPHA, POWER, t_quantile
    if seeds < 2 or not sd == sd:
        return float("nan")
    return float((t_quantile(1 - ALPHA, seeds - 1) + t_quantile(POWER, seeds - 1)) * sd / math.sqrt(seeds))


def markdown(table: pd.DataFrame, rows: pd.DataFrame, title: str) -> str:
    """The decomposition as one markdown table per comparison, sources as rows, with the share of `all`'s variance each
    source alone explains and the detectable effect at 3 seeds from `all`."""
    lines = [f"### {title}", ""]
    for comp, t in table.groupby("comparison", sort=False):
        total = t[t.source == "all"]
        v_all = float(total.sd_best.iloc[0]) ** 2 if len(total) else float("nan")
        lines += [f"**{comp}** (paired differences, points; {int(t.draws.max())} draws a source)", "",
                  "| source varied alone | mean diff, best | SD, best | share of `all`'s variance | SD, last-rounds mean "
                  "| round-to-round SD (last rounds) |", "|---|---|---|---|---|---|"]
        for _, r in t.iterrows():
            share = r.sd_best ** 2 / v_all if v_all == v_all and v_all > 0 else float("nan")
            lines.append(f"| {r.source} | {r.mean_best:+.2f} | {r.sd_best:.2f} | {share:.0%} | {r.sd_last:.2f} | "
                         f"{r.sd_within_last:.2f} |")
        r0 = t.iloc[0]
        lines += ["", f"Test images alone (n_eff = {r0.n_test_eff:.0f} a seed): floor SD {r0.sd_test_floor:.2f}, "
                  f"independent-binomial SD {r0.sd_test_binomial:.2f}. Detectable effect from `all`'s SD: "
                  f"{detectable(float(total.sd_best.iloc[0]), 3):.2f} at 3 seeds, "
                  f"{detectable(float(total.sd_best.iloc[0]), 6):.2f} at 6, "
                  f"{detectable(float(total.sd_best.iloc[0]), 10):.2f} at 10." if len(total) else "", ""]
    cpu = rows.wall_s.sum() / 60
    lines.append(f"Runs: {len(rows)}, {cpu:.0f} CPU-minutes of wall time in all (one thread each).")
    return "\n".join(lines) + "\n"


def write_summary(out: Path, stem: str, table: pd.DataFrame, text: str) -> None:
    """<stem>.csv (the table) and <stem>.md (`text`) in `out`, and the markdown printed."""
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / f"{stem}.csv", index=False)
    (out / f"{stem}.md").write_text(text)
    print(text)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("table")
    ap.add_argument("--reference", required=True, help="the paper's method: every difference is it minus another")
    ap.add_argument("--methods", default="", help="comma-separated (default: every method of the setting)")
    ap.add_argument("--sources", default=",".join(SOURCES))
    ap.add_argument("--draws", type=int, default=6)
    ap.add_argument("--base-seed", type=int, default=1000, help="pilot seeds: no verdict reads them (default 1000)")
    ap.add_argument("--profile", default=None)
    ap.add_argument("--setting", default=None)
    ap.add_argument("--metric", default="pm_acc_mean")
    ap.add_argument("--last", type=int, default=3, help="rounds the last-rounds mean and round-to-round SD read")
    ap.add_argument("--jobs", default="auto")
    ap.add_argument("--out", default=str(REPO / "docs" / "evidence" / "noise"))
    ap.add_argument("--summarize", action="store_true", help="write noise.csv / noise.md (trains what is missing)")
    a = ap.parse_args(argv)
    if a.draws < 2:
        raise SystemExit("--draws: at least 2 (draw 0 is the base)")
    if a.base_seed < 100:
        raise SystemExit(f"--base-seed={a.base_seed}: verdict seeds live below 100; pilot seeds must not")
    from pflrepro.pipeline import experiments
    cfgs = configs(a.table, a.reference, [m for m in a.methods.split(",") if m], a.sources.split(","), a.draws,
                   a.base_seed, a.profile, a.setting)
    print(f"{a.table}: {len(cfgs)} configs ({len(set(c.key() for c in cfgs.values()))} runs)", flush=True)
    results = experiments.run_grid(cfgs, progress="log", jobs=a.jobs, name=f"noise {a.table}")
    if a.summarize:
        rows = rows_of(results, a.metric, a.last)
        table = decompose(rows, a.reference)
        title = (f"{a.table} ({a.profile or 'default profile'}), pilot seeds {a.base_seed}+, {a.draws} draws, "
                 f"metric {a.metric}")
        write_summary(Path(a.out), f"{a.table}_{a.reference}", table, markdown(table, rows, title))


if __name__ == "__main__":
    main()
