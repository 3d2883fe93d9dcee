"""The figures the notebooks draw from tidy tables: curves, reproduced beside the paper, clients' accuracies, a
partition."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from ..data.partition import label_counts, plot_partition
from ..federation.build import build_partition, raw_dataset

def plot_curves(df: pd.DataFrame, metric: str = "pm_acc_mean", title: str = "", ylabel: str = "accuracy (%)",
                x: str = "round"):
    """Learning curves with a band of +- one std over seeds (seaborn), one panel per setting; `x` = "round" or
    "sim_time" (the simulated clock's seconds: SCD Tables 4, 9)."""
    sns = sns_theme()
    # style = hue: methods with identical curves (FedProx at a tiny mu over FedAvg) stay visible as dashes
    g = sns.relplot(data=df, x=x, y=metric, hue="method", style="method", col="panel" if "panel" in df else "setting",
                    kind="line", errorbar="sd", height=3.6, aspect=1.25, facet_kws={"sharey": False})
    g.set_axis_labels("communication round" if x == "round" else "simulated time (s)", ylabel)
    g.set_titles("{col_name}")
    if x == "round":
        integer_ticks(g.axes.flat)
    if title:
        g.figure.suptitle(title, y=1.04, fontsize=10)
    return g.figure


def integer_ticks(axes) -> None:
    """Whole-number ticks on the x axes (communication rounds: no 2.5)."""
    from matplotlib.ticker import MaxNLocator
    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def save(fig, path: Path | str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130, bbox_inches="tight")
    return path


def sns_theme():
    """seaborn with the whitegrid theme (and Agg outside a notebook kernel): what every figure here draws with."""
    import sys

    import matplotlib
    if "ipykernel" not in sys.modules:   # scripts, tests, DVC's report stage: no display; a notebook keeps inline
        matplotlib.use("Agg", force=False)
    import seaborn as sns
    sns.set_theme(style="whitegrid", context="notebook")
    return sns


def plot_vs_paper(table: pd.DataFrame, title: str = "", x: str = "method", ylabel: str = "accuracy (%)"):
    """Reproduced (bars, +- std over seeds) beside the paper's value (black ticks), one panel per setting.
    Plain matplotlib: every table notebook draws this, and importing seaborn (scipy.stats) cost 3.5 s a notebook."""
    from matplotlib.figure import Figure
    t = table.assign(panel=[s if "dataset" not in table or s == d or pd.isna(d) else f"{d} {s}"
                            for d, s in zip(table.get("dataset", table["setting"]), table["setting"].astype(str))])
    panels = list(t.groupby("panel", sort=False))
    cols = min(3, len(panels))
    rows = -(-len(panels) // cols)
    fig = Figure(figsize=(4.8 * cols, 3.4 * rows + 0.9), layout="constrained")
    axes = list(fig.subplots(rows, cols, squeeze=False).flat)
    for ax, (name, sub) in zip(axes, panels):
        xs = np.arange(len(sub))
        rep = pd.to_numeric(sub["reproduced"], errors="coerce").to_numpy(float)
        std = pd.to_numeric(sub["repro_std"], errors="coerce").fillna(0).to_numpy(float)
        ok = np.isfinite(rep)
        ax.bar(xs[ok], rep[ok], color="tab:blue", alpha=0.8)
        spread = ok & (std > 0)   # no std (one seed, a measured cost): no cap, which would read as a paper tick
        if spread.any():
            ax.errorbar(xs[spread], rep[spread], yerr=std[spread], fmt="none", ecolor="k", capsize=2, lw=0.8)
        # the paper has no number for some cells (mini datasets, methods it leaves out): no tick there
        pv = pd.to_numeric(sub["paper"], errors="coerce").to_numpy(float) if "paper" in sub else np.array([])
        if np.isfinite(pv).any():
            ax.scatter(xs[np.isfinite(pv)], pv[np.isfinite(pv)], marker="_", s=400, color="k", zorder=3, label="paper")
        ax.set_xticks(xs, sub[x].astype(str), rotation=45, ha="right")
        ax.set(title=str(name), xlabel=x, ylabel=f"{ylabel}: bars reproduced, — paper")
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    for ax in axes[len(panels):]:   # unused cells of the last row
        ax.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=9)
    return fig


def plot_client_distribution(clients: pd.DataFrame, title: str = ""):
    """pFedSD Fig. 7: histogram of per-client personalized accuracy, one panel per dataset/setting."""
    sns = sns_theme()
    c = clients.assign(panel=clients["dataset"] + " " + clients["setting"].astype(str))
    g = sns.displot(data=c, x="accuracy", hue="method", col="panel", kind="hist", element="step",
                    fill=False, bins=20, height=3.4, aspect=1.4, facet_kws={"sharey": False})
    g.set_axis_labels("client test accuracy (%)", "clients")
    g.set_titles("{col_name}")
    if title:
        g.figure.suptitle(title, y=1.04, fontsize=9)
    return g.figure


def plot_architectures(clients: pd.DataFrame, title: str = ""):
    """PerFed-CKT Fig. 2(a): the share of clients per architecture (left; `clients` has one row per client with
    `model`, `params`, `samples`), and each client's training-set size by architecture (right), smallest model first."""
    sns = sns_theme()
    from matplotlib.figure import Figure
    order = clients.sort_values("params").model.drop_duplicates().tolist()
    share = clients.model.value_counts(normalize=True).reindex(order).mul(100).rename("share").reset_index()
    fig = Figure(figsize=(9, 3.4), layout="constrained")
    a, b = fig.subplots(1, 2)
    sns.barplot(data=share, x="model", y="share", hue="model", order=order, hue_order=order, ax=a, legend=False)
    a.set(xlabel="", ylabel="clients (%)", title="(a) architectures deployed")
    sns.stripplot(data=clients, x="model", y="samples", hue="model", order=order, hue_order=order, ax=b,
                  legend=False, jitter=0.25, size=4)
    b.set(xlabel="", ylabel="training samples", title="dataset size by architecture")
    if title:
        fig.suptitle(title, fontsize=9)
    return fig


def partition_figure(cfg, title: str | None = None):
    """The (clients x classes) bubble chart of a config's training partition (pFedSD Fig. 5)."""
    raw = raw_dataset(cfg.dataset)
    y = (raw.pooled()[1] if cfg.pool == "train+test" else raw.y_train).numpy()
    split = build_partition(cfg)
    return plot_partition(label_counts(y, split["train"], raw.spec.num_classes), title=title or (
        f"{cfg.dataset}: {cfg.partition} {cfg.partition_params}, K={cfg.n_clients} (train, seed {cfg.seed})"))
