"""Render cells several notebooks share: each writes its tables (`E.table`: markdown + CSV under results/<name>/)
and figures (`E.figure`: PNG under figures/<name>/), shows them inline, and returns the main table.

A notebook cell calls one of these in a line; what is one paper's own lives in `pflrepro.papers.<paper>`."""
from __future__ import annotations

import pandas as pd

from . import tables as report
from .notebook import Experiment


def accuracy_table(E: Experiment, title: str) -> pd.DataFrame:
    """Personalized accuracy per method and setting beside the paper's (best round ± std over seeds, and the mean
    of the last 10 evaluations); the same as a wide table (one column per setting) and as a figure."""
    table = report.compare_table(E.tidy(), E.paper())
    E.table(table, f"{title} (personalized accuracy %, best round ± std over seeds; last10 = mean of the last 10 "
            "evaluations)")
    E.table(report.wide(table), f"{title}: reproduced ± std (paper)", stem="table_wide")
    E.figure(report.plot_vs_paper(table, E.banner), "vs_paper")
    return table


def sweep(E: Experiment, title: str, xlabel: str, stem: str) -> pd.DataFrame:
    """A figure without printed numbers: accuracy per method along the swept setting (no paper column)."""
    table = report.compare_table(E.tidy(), None)
    E.table(table, title)
    E.figure(report.plot_sweep(table, xlabel, E.banner), stem)
    return table


def learning_curves(E: Experiment, results: dict, ylabel: str = "personalized accuracy (%)",
                    stem: str = "learning_curves") -> pd.DataFrame:
    """Accuracy per round, mean and std band over seeds, one line per method (a panel per setting)."""
    curves = report.curves(results, E.metric)
    E.figure(report.plot_curves(curves, E.metric, title=E.banner, ylabel=ylabel), stem)
    return curves


def partition(E: Experiment, stem: str = "partition"):
    """The (clients x classes) bubble chart of the grid's first config; returns that config."""
    cfg = next(iter(E.configs.values()))
    E.figure(report.partition_figure(cfg), stem)
    return cfg
