"""Spectral co-distillation (NeurIPS 2023): the render cells of its notebooks. Each writes its tables and figures
through `E` and returns the main table."""
from __future__ import annotations

import pandas as pd

from ..reporting import tables as report
from ..reporting.notebook import Experiment
from .newclients import new_client_accuracy

GM_PM = {"gm": "gm_acc", "pm": "pm_acc_weighted"}


def gm_pm_table(E: Experiment, results: dict, title: str, dataset: str) -> pd.DataFrame:
    """GM and PM accuracy per method and setting beside the paper's (which ran `dataset`), scored as Remark 4.1."""
    paper = E.paper().drop(columns=["dataset"])   # the paper ran `dataset`; its cells sit beside whatever ran here
    table = report.compare_metrics(results, paper, GM_PM)
    E.table(table, f"{title} (GM = global test accuracy, PM = weighted mean of local test accuracies; %, best round ± "
            "std over seeds)",
            note="Paper cells in parentheses are Remark 4.1's: a generic method's PM is its GM on the local test sets, a "
                 "PFL method without a GM is scored by its averaged PMs; ours are computed the same way. A method with "
                 "an empty reproduced value is not run in this profile.")
    column = table.setting.astype(str) + " " + table.metric.str.upper()
    E.table(report.wide(table.assign(column=column), columns="column"), f"{title}: reproduced ± std (paper)",
            stem="table_wide")
    E.figure(report.plot_vs_paper(table.assign(setting=column), E.banner), "vs_paper")
    return table


def sweep(E: Experiment, results: dict, title: str, key: str, xlabel: str) -> pd.DataFrame:
    """GM and PM accuracy along one hyperparameter (`key`), beside the paper's CIFAR-10 curve."""
    import seaborn as sns
    paper = E.paper().drop(columns=["dataset"])
    paper = paper.assign(method=f"{key}=" + paper[key].map("{:g}".format)).drop(columns=[key])   # runs are named so
    table = report.compare_metrics(results, paper, GM_PM)
    table.insert(3, key, table["method"].map(report.sweep_value))
    E.table(table, f"{title} (GM and PM accuracy %, best round; paper: CIFAR-10)")
    table = table.assign(x=table[key], panel=table["setting"].astype(str) + " " + table["metric"].str.upper())
    g = sns.relplot(data=table, x="x", y="reproduced", col="panel", kind="line", marker="o", height=3.2, aspect=1.2,
                    facet_kws={"sharey": False})
    for ax, (_, sub) in zip(g.axes.flat, table.groupby("panel", sort=False)):
        ax.plot(sub["x"], sub["paper"], "k--", marker="_", label="paper (CIFAR-10)")
    g.set_axis_labels(xlabel, "accuracy (%): reproduced, -- paper")
    g.set_titles("{col_name}")
    E.figure(g.figure, "sweep")
    return table


def time_to_target(E: Experiment, results: dict, title: str) -> pd.DataFrame:
    """Simulated time to the params' target PM accuracies, and the speedups of the params' pairs (writes times.csv)."""
    times = report.times_to_targets(results, E.metric, E.P["targets"])
    times.to_csv(E.res_dir / "times.csv", index=False)
    table = report.speedups(times, E.P["pairs"])
    paper = E.paper().rename(columns={"speedup": "paper_speedup"})
    table = table.merge(paper[["method", "pm_epochs", "target", "paper_speedup"]], on=["method", "pm_epochs", "target"],
                        how="left")
    E.table(table, f"{title}: time to reach the target PM accuracy (simulated seconds) and the speedup",
            note="Simulated time (pflrepro.core.clock; rates and bandwidths in the run config, docs/fidelity.md). "
                 "NaN: the target was not reached within the run. Speedup = time_slow / time_fast.", digits=3)
    curves = report.curves(results, E.metric)
    E.figure(report.plot_curves(curves, E.metric, title=E.banner, ylabel="PM accuracy (%)", x="sim_time"),
             "time_curves")
    return table


def new_clients(E: Experiment, results: dict) -> pd.DataFrame:
    """Fig. 3: the clients that never trained fine-tune the final GM for each of the params' epoch counts."""
    sns = report.sns_theme()
    rows = [{"method": m, "dataset": r.config.dataset, "setting": s, "seed": seed, "epochs": e,
             "acc": 100 * new_client_accuracy(r, e)["acc"]}
            for (m, s, seed), r in results.items() for e in E.P["finetune_epochs"]]
    table = report.over_seeds(pd.DataFrame(rows), ["dataset", "setting", "epochs", "method"], ["acc"]).rename(
        columns={"acc": "reproduced", "acc_std": "repro_std", "acc_seeds": "repro_seeds"})
    E.table(table, "SCD Fig. 3: new clients' weighted mean local test accuracy (%) after fine-tuning the final GM")
    g = sns.catplot(data=table, x="method", y="reproduced", hue="epochs", col="setting", kind="bar", height=3.6,
                    aspect=1.6)
    g.set_axis_labels("", "new clients' accuracy (%)")
    g.set_titles("{col_name}")
    g.tick_params(axis="x", rotation=30)
    E.figure(g.figure, "new_clients")
    return table
