"""Tables beside the paper's, learning curves, and the provenance banner.

Paper numbers live in `paper_numbers/*.csv` (transcribed exactly as printed). They are
read here only to be shown *beside* reproduced values, never used as results.
"""
from __future__ import annotations

import functools
import io
import re
from pathlib import Path

import numpy as np
import pandas as pd

from ..core.clock import time_to
from ..data.datasets import SPECS
from ..paths import REPO_ROOT
from ..pipeline.store import git_commit, RunResult
from . import health
from .plots import (integer_ticks, partition_figure, plot_architectures, plot_client_distribution, plot_curves,
                    plot_vs_paper, save, sns_theme)  # noqa: F401

PAPER_DIR = REPO_ROOT / "paper_numbers"


def paper_table(name: str) -> pd.DataFrame:
    """Load `paper_numbers/<name>.csv` (lines starting with # are the source note)."""
    path = PAPER_DIR / f"{name}.csv"
    return pd.read_csv(path, comment="#")


def paper_source(name: str) -> str:
    lines = (PAPER_DIR / f"{name}.csv").read_text().splitlines()
    return " ".join(line.lstrip("# ") for line in lines if line.startswith("#"))


def score(res: RunResult, metric: str = "pm_acc_mean", how: str = "best") -> float:
    """One number per run, in %: `how` = 'best' (best evaluated round, as most papers report),
    'last_mean' (mean of the last 10 evaluations) or 'final'."""
    return 100.0 * res.summary[metric][how]


def paper_setting(setting: str, dataset: str) -> str:
    """A table spanning datasets names its settings '<dataset> <paper column>' (e.g. 'fmnist 20 clients');
    the paper's CSV has the dataset in its own column, so the prefix is dropped for matching."""
    return setting[len(dataset) + 1:] if setting.startswith(dataset + " ") else setting


def tidy(results: dict, metric: str = "pm_acc_mean") -> pd.DataFrame:
    """{(method, setting, seed): RunResult} -> one row per run with best / last-10 / final scores, the mean over the
    last tenth of its evaluations (`last_tenth`: the metric-robustness check of the claims ledger), its largest
    training-loss spike (pflrepro.reporting.health: ratio, round; nan / empty for none), its health flags ('' = none),
    its smallest client test set and the effective number of test images behind `metric` (`test_n`)."""
    rows = []
    for (method, setting, seed), r in results.items():
        spike, at = health.loss_spike([h.get("train_loss", float("nan")) for h in r.history])
        row = {"method": method, "dataset": r.config.dataset, "setting": paper_setting(setting, r.config.dataset),
               "seed": seed,
               "best": score(r, metric, "best"), "last10": score(r, metric, "last_mean"),
               "final": score(r, metric, "final"), "last_tenth": last_tenth(r.history, metric),
               "best_round": r.summary[metric]["best_round"],
               "loss_spike": round(spike, 3), "spike_round": r.history[at]["round"] if at is not None else None}
        row["health"] = "; ".join(health.warnings(spike, row["best"], row["final"]))
        rows.append({**row, "min_test": min_test(r.path), "test_n": effective_test_n(r.path, metric, getattr(r.config, "pool", "train")),
                     "wall_s": r.provenance["wall_seconds"], "run": r.path.name})
    return pd.DataFrame(rows)


def last_tenth(history: list[dict], metric: str = "pm_acc_mean") -> float:
    """The mean of `metric` (in %) over the last tenth of a run's evaluations (at least one): a score without the
    best round's selection over noisy rounds, which favours a noisier curve."""
    vals = [h.get(metric, float("nan")) for h in history]
    if not vals:
        return float("nan")
    k = max(1, -(-len(vals) // 10))
    return 100.0 * float(np.mean(vals[-k:]))


def effective_test_n(run_path: Path, metric: str = "pm_acc_mean", pool: str = "train") -> float:
    """The effective number of test images behind one score of `metric`: an accuracy over them has the binomial
    variance p (1 - p) / test_n. For the mean over K clients of each client's accuracy (n_k test images each):
    K^2 / sum(1 / n_k); weighted by training-set shares w_k: 1 / sum(w_k^2 / n_k); the global model on the union of
    the local test sets (`pool: train+test`): sum(n_k). nan where the stored partition does not tell (the global
    model on the official test set, or no stored partition): the claims ledger then knows no test-set floor."""
    try:
        sizes = _split_sizes(str(run_path))
    except (OSError, ValueError, TypeError):
        return float("nan")
    n = np.array(sizes["test"], dtype=np.float64)
    w = np.array(sizes["train"], dtype=np.float64)
    ok = n > 0
    if not ok.any():
        return float("nan")
    if metric == "pm_acc_mean":
        return float(ok.sum() ** 2 / np.sum(1.0 / n[ok]))
    if metric == "pm_acc_weighted" and len(w) == len(n) and w[ok].sum() > 0:
        share = w[ok] / w[ok].sum()
        return float(1.0 / np.sum(share ** 2 / n[ok]))
    if metric == "gm_acc" and "test" in str(pool):
        return float(n.sum())
    return float("nan")


@functools.lru_cache(maxsize=4096)
def _split_sizes(run_path: str) -> dict[str, list[int]]:
    """{'train': [...], 'test': [...]}: each client's split sizes from a run's stored partition, read once per run
    (a notebook's tables call for them several times)."""
    with np.load(Path(run_path) / "partition.npz") as z:
        return {part: [int(z[f"{part}_{k}"].shape[0]) for k in range(sum(1 for f in z.files if f.startswith(part + "_")))]
                for part in ("train", "test")}


def min_test(run_path: Path) -> float:
    """The smallest local test set of a run's clients (images), from its stored partition; nan where it has none.
    One image of a 7-image test set is 14 points of that client's accuracy: the claims ledger names such cells."""
    try:
        sizes = [n for n in _split_sizes(str(run_path))["test"] if n > 0]
    except (OSError, ValueError, TypeError):   # no stored partition (a run built in memory)
        return float("nan")
    return float(min(sizes)) if sizes else float("nan")


def over_seeds(per_seed: pd.DataFrame, keys: list, cols: list) -> pd.DataFrame:
    """Per-seed rows -> one row per `keys`: each column's mean over seeds, `<col>_std`, `seeds` (how many) and
    `<col>_seeds` ("seed:value;...": what the claims checker pairs seeds with, as `repro_seeds` for `reproduced`)."""
    g = per_seed.groupby(list(keys), sort=False)
    out = g[list(cols)].mean().reset_index()
    out["seeds"] = g["seed"].nunique().to_numpy()
    for c in cols:
        out[f"{c}_std"] = g[c].std().to_numpy()
        out[f"{c}_seeds"] = seed_values(per_seed, list(keys), c)
    return out


def compare(runs: pd.DataFrame, paper: pd.DataFrame | None, on=("method", "setting"), value: str = "best") -> pd.DataFrame:
    """Mean +- std over seeds of `value` (std blank for a single seed), beside the paper's value and the
    difference."""
    on = list(on)
    g = runs.groupby(on, sort=False)
    out = g[value].agg(["mean", "std", "count"]).reset_index()
    # one seed: std stays NaN (printed blank), not 0.00, which would claim a spread of zero
    out["last10"] = g["last10"].mean().values
    out = out.rename(columns={"mean": "reproduced", "std": "repro_std", "count": "seeds"})
    if "seed" in runs.columns:
        out["repro_seeds"] = seed_values(runs, on, value)
    if "min_test" in runs.columns:
        out["min_test"] = g["min_test"].min().to_numpy()
    if "test_n" in runs.columns:        # the fewest effective test images of a seed: the claims' test-set floor
        out["test_n"] = g["test_n"].min().to_numpy()
    if "last_tenth" in runs.columns and "seed" in runs.columns:   # the claims' metric-robustness reading
        out["last_tenth"] = g["last_tenth"].mean().to_numpy()
        out["last_tenth_seeds"] = seed_values(runs, on, "last_tenth")
    if paper is not None:
        p = paper.rename(columns={"value": "paper", "std": "paper_std"})
        if "paper_std" not in p.columns:  # papers that print single numbers (DC-PFL)
            p = p.assign(paper_std=float("nan"))
        keep = [c for c in on if c in p.columns]
        out = out.merge(p[keep + ["paper", "paper_std"]], on=keep, how="left")
        out["diff"] = out["reproduced"] - out["paper"]
        groups = [c for c in on if c != "method"]
        rank = (lambda col: out.groupby(groups, sort=False)[col].rank(ascending=False, method="min")) if groups \
            else (lambda col: out[col].rank(ascending=False, method="min"))
        out["rank"], out["paper_rank"] = rank("reproduced"), rank("paper")  # orderings, side by side
    return out


def seed_values(df: pd.DataFrame, on: list, value: str) -> list[str]:
    """Per group of `on`, in `groupby(on, sort=False)` order (as `compare` aggregates), each seed's `value` as
    "seed:value;..." (`repro_seeds`, the machine column the claims checker pairs seeds with: seed s draws the
    same partition for every method); a blank value is written "nan" (a target that seed never reached)."""
    return [";".join(f"{s}:{v:.6g}" for s, v in sorted(zip(g["seed"], g[value])))
            for _, g in df.groupby(list(on), sort=False)]


def compare_to_paper(runs: pd.DataFrame, paper: pd.DataFrame, paper_column: dict | None, value: str = "best"):
    """`compare_table` when the runs are on the paper's datasets; otherwise (a mini profile on Fashion-MNIST)
    `compare` against the one paper column `paper_column` ({dataset, setting}) names, or, for a setting its
    `per_setting` maps ({setting: {dataset, setting}}: a stand-in for another of the paper's columns), that
    column. Returns the table, the paper rows it was compared with, and `paper_column` (None when the datasets
    match)."""
    if set(runs.dataset) <= set(paper.dataset):
        return compare_table(runs, paper, value=value), paper, None
    per_setting = paper_column.get("per_setting") or {}
    tables, cols = [], []
    for setting, own in runs.groupby("setting", sort=False):
        ref = per_setting.get(setting, paper_column)
        col = paper[(paper.dataset == ref["dataset"]) & (paper.setting == ref["setting"])]
        keep = [c for c in ("method", "value", "std") if c in col.columns]
        tables.append(compare(own, col[keep], on=("dataset", "setting", "method"), value=value))
        cols.append(col)
    return pd.concat(tables, ignore_index=True), pd.concat(cols).drop_duplicates(), paper_column


def paper_column_note(ref: dict | None) -> str:
    """'Paper column: ...' for a table `compare_to_paper` set beside another dataset's paper column(s)."""
    if not ref:
        return ""
    others = "".join(f"; {s}: {c['dataset']} {c['setting']}" for s, c in (ref.get("per_setting") or {}).items())
    return f"Paper column: {ref['dataset']} {ref['setting']}{others} (this profile ran other data)."


def communication(results: dict) -> pd.DataFrame:
    """Parameters communicated over each whole run, uplink plus downlink (float32: bytes / 4), from the byte
    counters every run carries: one row per (method, setting, seed)."""
    rows = []
    for (method, setting, seed), r in results.items():
        last = r.history[-1] if r.history else {"bytes_up": 0, "bytes_down": 0}
        rows.append({"method": method, "setting": paper_setting(setting, r.config.dataset), "seed": seed,
                     "params": (last["bytes_up"] + last["bytes_down"]) / 4, "rounds": r.config.rounds})
    return pd.DataFrame(rows, columns=["method", "setting", "seed", "params", "rounds"])


def sweep_value(setting: str) -> float:
    """The number in a sweep setting's name: 'classes=4' -> 4.0, 'r=20%' -> 20.0."""
    import re
    m = re.search(r"=\s*([0-9.]+)", str(setting))
    return float(m.group(1)) if m else float("nan")


def plot_sweep(table: pd.DataFrame, xlabel: str, title: str = ""):
    """Accuracy against a swept setting (DC-PFL Figs. 2, 3): one line per method, one panel per dataset."""
    sns = sns_theme()
    t = table.assign(x=table["setting"].map(sweep_value))
    g = sns.relplot(data=t, x="x", y="reproduced", hue="method", style="method", col="dataset", kind="line",
                    markers=True, height=3.4, aspect=1.3, facet_kws={"sharey": False, "sharex": False})
    g.set_axis_labels(xlabel, "accuracy (%)")
    g.set_titles("{col_name}")
    if title:
        g.figure.suptitle(title, y=1.04, fontsize=9)
    return g.figure


def compare_table(runs: pd.DataFrame, paper: pd.DataFrame | None, value: str = "best") -> pd.DataFrame:
    """`compare` grouped by dataset, setting and method, matched to the paper on the keys its CSV has
    (a CIFAR-100-only table has no dataset column: its numbers sit beside whatever dataset ran)."""
    return compare(runs, paper, on=("dataset", "setting", "method"), value=value)


def compare_metrics(results: dict, paper: pd.DataFrame | None, metrics: dict, value: str = "best") -> pd.DataFrame:
    """`compare_table` for several metrics of the same runs (SCD's GM and PM columns): `metrics` maps the
    paper CSV's `metric` labels to run metrics, e.g. {"gm": "gm_acc", "pm": "pm_acc_weighted"}; one row
    per (dataset, setting, method, metric). Paper rows without a reproduced run (a method not run in this
    profile) are listed with an empty reproduced value, so nothing the paper printed silently disappears."""
    frames = []
    for label, m in metrics.items():
        p = None if paper is None else paper[paper["metric"] == label].drop(columns=["metric"])
        if p is not None and "std" not in p.columns:     # tables printed without std (SCD Tables 7, 8, 10)
            p = p.assign(std=float("nan"))
        t = compare_table(tidy(results, m), p, value).assign(metric=label)
        if p is not None and len(t):
            keys = [c for c in ("dataset", "setting", "method") if c in p.columns]
            ran = set(map(tuple, t[keys].astype(str).to_numpy()))
            shown = set(map(tuple, t[[c for c in ("dataset", "setting") if c in p.columns]].astype(str).to_numpy()))
            extra = p[[tuple(r) not in ran and tuple(r[:-1]) in shown for r in p[keys].astype(str).to_numpy()]]
            if len(extra):
                t = pd.concat([t, extra.rename(columns={"value": "paper", "std": "paper_std"})
                               [keys + ["paper", "paper_std"]].assign(metric=label)], ignore_index=True)
        frames.append(t)
    return pd.concat(frames, ignore_index=True)


def times_to_targets(results: dict, metric: str, targets, time_keys=("sim_time", "sim_time_cw", "sim_time_wf")) -> pd.DataFrame:
    """SCD Tables 4 and 9: per run, the first simulated time at which `metric` reaches each target (%), on
    each of the run's timelines (its own protocol, and the compute-and-wait / wait-free ones beside it).
    NaN: never reached (or that timeline is not defined: asynchronous runs have one)."""
    rows = []
    for (method, setting, seed), r in results.items():
        for target in targets:
            for key in time_keys:
                rows.append({"method": method, "dataset": r.config.dataset,
                             "setting": paper_setting(setting, r.config.dataset), "seed": seed,
                             "target": target, "timeline": key,
                             "time": time_to(r.history, metric, target / 100.0, key),
                             "final": 100.0 * r.history[-1][metric]})
    return pd.DataFrame(rows)


def speedups(times: pd.DataFrame, pairs: list) -> pd.DataFrame:
    """Speedup = time of the slow configuration / time of the fast one, per target, seed-averaged.
    `pairs`: [{"row": label, "pm_epochs": E, "slow": [method, timeline], "fast": [method, timeline]}, ...]."""
    rows = []
    for p in pairs:
        pick = lambda m, tl: times[(times.method == m) & (times.timeline == tl)]  # noqa: E731
        slow, fast = pick(*p["slow"]), pick(*p["fast"])
        for (dataset, setting, target), s in slow.groupby(["dataset", "setting", "target"], sort=False):
            f = fast[(fast.dataset == dataset) & (fast.setting == setting) & (fast.target == target)]
            merged = s.merge(f, on="seed", suffixes=("_slow", "_fast"))
            ratio = merged["time_slow"] / merged["time_fast"]
            rows.append({"method": p["row"], "pm_epochs": p.get("pm_epochs"), "dataset": dataset, "setting": setting,
                         "target": target,
                         "time_slow": merged["time_slow"].mean(), "time_fast": merged["time_fast"].mean(),
                         "speedup": ratio.mean(), "speedup_std": ratio.std() if len(ratio) > 1 else float("nan"),
                         "seeds": len(ratio), "slow": " / ".join(p["slow"]), "fast": " / ".join(p["fast"])})
    return pd.DataFrame(rows)


def wide(table: pd.DataFrame, columns: str = "setting", value: str = "reproduced") -> pd.DataFrame:
    """Methods as rows, settings as columns: 'reproduced (paper)' cells, the paper's layout."""
    def cell(r):
        s = f"{r[value]:.2f}"
        if r.get("seeds", 1) > 1:
            s += f" ± {r['repro_std']:.2f}"
        if "paper" in r and r["paper"] == r["paper"]:
            s += f" ({r['paper']:.2f})"
        return s
    t = table.assign(cell=table.apply(cell, axis=1))
    return t.pivot_table(index="method", columns=columns, values="cell", aggfunc="first", sort=False).reset_index()


def rounds_to_reach(curves_df: pd.DataFrame, reference: str, method: str, metric: str = "pm_acc_mean",
                    at_round: int | None = None) -> pd.DataFrame:
    """Table 4: the first round at which `method`'s curve reaches `reference`'s accuracy after
    `at_round` rounds (default: its last round), per setting and seed. NaN if never reached."""
    rows = []
    for (setting, seed), g in curves_df.groupby(["setting", "seed"], sort=False):
        ref = g[g.method == reference].sort_values("round")
        cur = g[g.method == method].sort_values("round")
        if ref.empty or cur.empty:
            continue
        last = int(ref["round"].max()) if at_round is None else int(at_round)
        target = float(ref[ref["round"] <= last][metric].iloc[-1])
        hit = cur[cur[metric] >= target]
        r = float(hit["round"].iloc[0]) if len(hit) else float("nan")
        rows.append({"setting": setting, "seed": seed, "target_round": last, "target_acc": target,
                     "rounds": r, "speedup": last / r if r == r else float("nan")})
    return pd.DataFrame(rows)


def rounds_to_target(curves_df: pd.DataFrame, reference: str, metric: str = "pm_acc_mean") -> pd.DataFrame:
    """Every method's first round at which its curve reaches `reference`'s accuracy at the reference's last round
    (Table 4's target, for every method: pFedSD Fig. 6 "the least communication rounds"), per (dataset, setting,
    seed); one row per (dataset, setting, method) with the mean over seeds and each seed's value (`over_seeds`).
    A method that never reached it within the run is blank for that seed ("nan" in `repro_seeds`: the claims
    checker counts it as the slowest where a claim says `missing: worst`)."""
    rows = []
    for (ds, setting, seed), g in curves_df.groupby(["dataset", "setting", "seed"], sort=False):
        ref = g[g.method == reference].sort_values("round")
        if ref.empty:
            continue
        target = float(ref[metric].iloc[-1])
        for method, cur in g.groupby("method", sort=False):
            hit = cur.sort_values("round")
            hit = hit[hit[metric] >= target]
            rows.append({"dataset": ds, "setting": setting, "method": method, "seed": seed, "target": target,
                         "rounds": float(hit["round"].iloc[0]) if len(hit) else float("nan")})
    if not rows:
        return pd.DataFrame(columns=["dataset", "setting", "method", "reproduced", "repro_std", "seeds"])
    out = over_seeds(pd.DataFrame(rows), ["dataset", "setting", "method"], ["rounds", "target"])
    return out.rename(columns={"rounds": "reproduced", "rounds_std": "repro_std", "rounds_seeds": "repro_seeds"})


def rounds_to_shares(curves_df: pd.DataFrame, metric: str = "pm_acc_mean", shares=(0.5, 0.75, 0.9)) -> pd.DataFrame:
    """Every method's first round at which its curve reaches a share of the best final accuracy among the methods
    (per dataset, setting and seed); one row per (dataset, target, method), setting = 'target 50%' etc., with each
    seed's value (blank: never reached; FedBSD Fig. 4 "the fewest number of communication rounds")."""
    rows = []
    for (ds, setting, seed), g in curves_df.groupby(["dataset", "setting", "seed"], sort=False):
        g = g.sort_values("round")
        best_final = g.groupby("method", sort=False)[metric].last().max()
        for share in shares:
            for method, cur in g.groupby("method", sort=False):
                hit = cur[cur[metric] >= share * best_final]
                rows.append({"dataset": ds, "setting": f"target {round(100 * share)}%", "method": method, "seed": seed,
                             "rounds": float(hit["round"].iloc[0]) if len(hit) else float("nan")})
    out = over_seeds(pd.DataFrame(rows), ["dataset", "setting", "method"], ["rounds"])
    return out.rename(columns={"rounds": "reproduced", "rounds_std": "repro_std", "rounds_seeds": "repro_seeds"})


def stability(curves_df: pd.DataFrame, metric: str = "pm_acc_mean") -> pd.DataFrame:
    """How much a learning curve oscillates: the mean absolute change of accuracy between consecutive evaluations
    over the second half of the rounds (points), per run; one row per (dataset, setting, method) with each seed's
    value (FedBSD Fig. 4 "smoother convergence", "FedAvg and FedPAC exhibit instability")."""
    rows = []
    for (ds, setting, method, seed), g in curves_df.groupby(["dataset", "setting", "method", "seed"], sort=False):
        g = g.sort_values("round")
        late = g[g["round"] > g["round"].max() / 2][metric].to_numpy()
        rows.append({"dataset": ds, "setting": setting, "method": method, "seed": seed,
                     "osc": float(np.abs(np.diff(late)).mean()) if len(late) > 1 else float("nan")})
    out = over_seeds(pd.DataFrame(rows), ["dataset", "setting", "method"], ["osc"])
    return out.rename(columns={"osc": "reproduced", "osc_std": "repro_std", "osc_seeds": "repro_seeds"})


def client_accuracies(results: dict, at: str = "best", metric: str = "pm_acc_mean") -> pd.DataFrame:
    """Per-client personalized accuracy (%) of every run at its best evaluated round (or 'final')."""
    rows = []
    for (method, setting, seed), r in results.items():
        if not r.per_client:
            continue
        v = np.array([h[metric] for h in r.history], dtype=np.float64)
        i = int(np.nanargmax(v)) if at == "best" else len(v) - 1
        for k, a in enumerate(r.per_client[i]):
            if a == a:
                rows.append({"method": method, "dataset": r.config.dataset,
                             "setting": paper_setting(setting, r.config.dataset), "seed": seed,
                             "round": r.history[i]["round"], "client": k, "accuracy": 100.0 * a})
    return pd.DataFrame(rows)


def train_sizes(run_path: Path) -> list[int]:
    """Each client's training-set size, from a run's stored partition."""
    return _split_sizes(str(run_path))["train"]


SIZE_GROUPS = ("smallest 25%", "25-50%", "50-75%", "largest 25%")


def by_client_size(results: dict, metric: str = "pm_acc_mean") -> pd.DataFrame:
    """Mean accuracy of the clients in each quarter of a run's training-set sizes (clients ranked by size, ties by
    index), at the run's best round; one row per (dataset, setting, method, size_group) with each seed's value
    (PerFed-CKT: "clients with small training samples still benefit")."""
    clients = client_accuracies(results, "best", metric)
    rows = []
    for (method, setting, seed), r in results.items():
        sizes = np.asarray(train_sizes(r.path))
        rank = np.empty(len(sizes), dtype=np.int64)
        rank[np.argsort(sizes, kind="stable")] = np.arange(len(sizes))
        group = (4 * rank) // len(sizes)
        mine = clients[(clients.method == method) & (clients.seed == seed)
                       & (clients.setting == paper_setting(setting, r.config.dataset))]
        for g, label in enumerate(SIZE_GROUPS):
            acc = mine[np.isin(mine.client.to_numpy(), np.flatnonzero(group == g))]["accuracy"]
            rows.append({"dataset": r.config.dataset, "setting": paper_setting(setting, r.config.dataset),
                         "method": method, "size_group": label, "seed": seed, "acc": acc.mean(),
                         "mean_train_size": float(sizes[group == g].mean())})
    out = over_seeds(pd.DataFrame(rows), ["dataset", "setting", "method", "size_group"], ["acc", "mean_train_size"])
    return out.rename(columns={"acc": "reproduced", "acc_std": "repro_std", "acc_seeds": "repro_seeds"})


def spread(clients: pd.DataFrame) -> pd.DataFrame:
    """Table 5: mean and standard deviation ACROSS CLIENTS, averaged over seeds (with each seed's values:
    `over_seeds`)."""
    per_run = clients.groupby(["dataset", "setting", "method", "seed"], sort=False)["accuracy"] \
        .agg(["mean", lambda a: a.std(ddof=0)]).reset_index()
    per_run.columns = ["dataset", "setting", "method", "seed", "mean", "std"]
    return over_seeds(per_run, ["dataset", "setting", "method"], ["mean", "std"])


def banner(profile: str, dataset: str, note: str = "", seeds=None) -> str:
    g = git_commit()
    s = f"profile={profile} | dataset={dataset} | seeds={list(seeds) if seeds is not None else '?'} | " \
        f"commit={g['commit'][:10]}{'+dirty' if g['dirty'] else ''}"
    if profile != "paper":
        s += " | NOT the paper's setting: compare trends, not absolute numbers"
    return s + (f" | {note}" if note else "")


MACHINE_COLUMNS = ("repro_seeds", "min_test", "test_n", "last_tenth")   # in the CSV for the claims checker, not in
# the markdown a reader sees; so is every `<column>_seeds` (each seed's value of a column: `over_seeds`)
_COUNTS = re.compile(r"(^|_)(rank|seeds|rounds?|clients|runs|epochs|evaluations)$")


def to_markdown(df: pd.DataFrame, title: str, banner_line: str, digits: int = 2) -> str:
    """A plain markdown table (no extra dependency). Counts and ranks (columns named like `rank`, `paper_rank`,
    `seeds`, `rounds`, `target_round`) print as whole numbers when they are (`3`, not `3.00`; a mean rank over
    seeds keeps its decimals)."""
    def fmt(v, col=""):
        if isinstance(v, (float, np.floating)):
            if np.isnan(v):
                return ""
            if _COUNTS.search(str(col)) and float(v).is_integer():
                return str(int(v))
            return f"{v:.{digits}f}"
        return str(v)
    buf = io.StringIO()
    buf.write(f"## {title}\n\n> {banner_line}\n\n")
    cols = [c for c in df.columns if c not in MACHINE_COLUMNS and not str(c).endswith("_seeds")]
    buf.write("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n")
    for _, r in df.iterrows():
        buf.write("| " + " | ".join(fmt(r[c], c) for c in cols) + " |\n")
    return buf.getvalue()


def curves(results: dict, metric: str = "pm_acc_mean") -> pd.DataFrame:
    """Long-format learning curves: method, setting, seed, round, value (%)."""
    rows = []
    for (method, setting, seed), r in results.items():
        ds = r.config.dataset
        for h in r.history:
            rows.append({"method": method, "dataset": ds, "setting": paper_setting(setting, ds), "panel": setting,
                         "seed": seed, "round": h["round"], "sim_time": h.get("sim_time", float("nan")),
                         metric: 100.0 * h[metric]})
    return pd.DataFrame(rows)


def client_curves(results: dict) -> pd.DataFrame:
    """Long-format per-client learning curves (personalized accuracy %, every evaluation): method, setting, seed,
    round, client, and the client's domain where the dataset has one per client (FedBSD Fig. 3)."""
    rows = []
    for (method, setting, seed), r in results.items():
        ds = r.config.dataset
        doms = SPECS[ds].domains if ds in SPECS and r.config.partition == "by_domain" else ()
        for h, accs in zip(r.history, r.per_client):
            for k, a in enumerate(accs):
                rows.append({"method": method, "dataset": ds, "setting": paper_setting(setting, ds), "seed": seed,
                             "round": h["round"], "client": k, "domain": doms[k] if k < len(doms) else f"client {k}",
                             "accuracy": 100.0 * a})
    return pd.DataFrame(rows)


def at_rounds(curves: pd.DataFrame, metric: str, fractions=(0.25, 0.5, 0.75, 1.0)) -> pd.DataFrame:
    """Learning curves read at fractions of each dataset's evaluated rounds (the nearest evaluated round at or
    below): one row per (dataset, round, method), mean and std over seeds, setting = 'round R' (FedBSD Fig. 4:
    "consistently outperforms" is checked at each of these)."""
    rows = []
    for ds, d in curves.groupby("dataset", sort=False):
        evaluated = sorted(d["round"].unique())
        picks = sorted({evaluated[max(0, int(round(f * len(evaluated))) - 1)] for f in fractions})
        picked = d[d["round"].isin(picks)].sort_values(["round", "method"], kind="stable")
        # one groupby order for the means and each seed's values (`repro_seeds` once came out in another order than
        # the means here, pairing a method's seeds with another's mean; tests/test_tables_seeds.py)
        out = picked.groupby(["round", "method"], sort=False)[metric].agg(["mean", "std", "count"]).reset_index()
        if "seed" in picked.columns:
            out["repro_seeds"] = seed_values(picked, ["round", "method"], metric)
        frac = {r: f for f in fractions for r in [evaluated[max(0, int(round(f * len(evaluated))) - 1)]]}
        rows.append(out.assign(dataset=ds, setting="round " + out["round"].astype(str), fraction=out["round"].map(frac)))
    if not rows:
        return pd.DataFrame(columns=["dataset", "setting", "method", "reproduced", "repro_std", "seeds"])
    t = pd.concat(rows, ignore_index=True).rename(columns={"mean": "reproduced", "std": "repro_std", "count": "seeds"})
    return t[["dataset", "setting", "method", "reproduced", "repro_std", "seeds", "fraction"]
             + [c for c in ("repro_seeds",) if c in t.columns]]
