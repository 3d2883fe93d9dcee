"""FedBSD: the render cells of its notebooks (Table 1, Figs. 3 and 4). Each writes its tables and figures through `E`
and returns the main table."""
from __future__ import annotations

import pandas as pd

from ..reporting import tables as report
from ..reporting.notebook import Experiment


def table1(E: Experiment) -> pd.DataFrame:
    """Personalized accuracy (mean of the last 10 evaluations, as the paper) beside the paper column the params name."""
    paper = E.paper()   # a profile on other data (mini: Fashion-MNIST) sits beside the paper column its params name
    table, _, ref = report.compare_to_paper(E.tidy(), paper, E.P["paper_column"], value="last10")
    missing = sorted(set(paper.method) - set(table.method))
    E.table(table, "Table 1 (personalized accuracy %, mean of the last 10 evaluations as the paper; best round beside)",
            note="FedBSD's own row is lost in our copy of the paper: its paper cell is empty, not zero. "
                 + (f"Paper rows not run here: {', '.join(missing)}. " if missing else "")
                 + report.paper_column_note(ref))
    E.figure(report.plot_vs_paper(table, E.banner), "vs_paper")
    return table


def _domain_scores(clients: pd.DataFrame) -> pd.DataFrame:
    """Each client's mean accuracy over its last 10 evaluations, and its best, on its own domain."""
    keys = ["dataset", "setting", "domain", "method", "seed"]
    last = clients.groupby(keys, sort=False).apply(
        lambda d: d[d["round"].isin(sorted(d["round"].unique())[-10:])]["accuracy"].mean()).rename("last10").reset_index()
    last["best"] = clients.groupby(keys, sort=False)["accuracy"].max().values
    return last


def fig3(E: Experiment, results: dict) -> pd.DataFrame:
    """Multi-domain federations: mean accuracy, each client on its own domain, parameters sent, curves per client."""
    sns = report.sns_theme()
    table = report.compare(E.tidy(), None, ("dataset", "setting", "method"), "last10")
    E.table(table, "Fig. 3: personalized accuracy, mean over the clients (one domain each; mean of the last 10 "
            "evaluations %)", note="Fig. 3 is a figure without printed numbers: no paper column. Its claims are "
            "checked on these tables.")
    clients = report.client_curves(results)
    domains = report.compare(_domain_scores(clients), None, ("dataset", "setting", "domain", "method"), "last10")
    E.table(domains, "Fig. 3: each client's accuracy on its own domain's test set (mean of its last 10 evaluations %)",
            stem="domains")
    comm = report.communication(results)
    comm = comm.assign(per_round_M=comm.params / comm.rounds / 1e6).groupby(["setting", "method"], as_index=False,
                                                                           sort=False)
    E.table(comm["per_round_M"].mean().rename(columns={"per_round_M": "reproduced"}),
            "Parameters sent up and down a round, all clients together (millions; FedBN and FedBSD keep BN local, "
            "FedBSD the head too)", stem="communication", digits=4)
    g = sns.relplot(data=clients, x="round", y="accuracy", hue="method", style="method", col="domain", row="setting",
                    kind="line", errorbar="sd", height=2.8, aspect=1.1, facet_kws={"sharey": False})
    g.set_axis_labels("communication round", "accuracy on its domain (%)")
    g.set_titles("{row_name}: {col_name}")
    report.integer_ticks(g.axes.flat)
    E.figure(g.figure, "clients")
    curves = report.curves(results, E.metric)
    E.figure(report.plot_curves(curves, E.metric, title=E.banner, ylabel="mean accuracy over the clients (%)"),
             "rounds")
    return table


def fig4(E: Experiment, results: dict) -> pd.DataFrame:
    """Accuracy against classes per client S (left), backbone epochs (middle) and rounds at the default S (right)."""
    runs = E.tidy()   # one row per run, in `results` order: add what the sweeps read from each run's config
    runs["algorithm"] = [r.config.algorithm for r in results.values()]
    runs["S"] = [r.config.partition_params["classes_per_client"] for r in results.values()]
    runs["E"] = [r.config.hparams.get("body_epochs") for r in results.values()]
    variant = runs.method.str.contains(" E=")
    sweep = report.compare(runs[~variant].assign(setting="S=" + runs.S.astype(str)), None,
                           ("dataset", "setting", "method"), "last10")
    E.table(sweep, "Fig. 4 (left): personalized accuracy vs classes per client S (mean of the last 10 evaluations %)")
    at = runs[variant][["dataset", "setting"]].drop_duplicates()          # the default S of each dataset
    ep = runs.merge(at, on=["dataset", "setting"])
    ep = ep[ep.algorithm.isin(["fedrep", "fedbsd"])].assign(method=lambda d: d.algorithm,
                                                          setting=lambda d: "E=" + d.E.astype(int).astype(str))
    epochs = report.compare(ep, None, ("dataset", "setting", "method"), "last10")
    E.table(epochs, "Fig. 4 (middle): accuracy vs backbone epochs a round, FedRep and FedBSD at the default S (%)",
            stem="epochs")
    default_s = set(map(tuple, at.to_numpy()))
    base = {k: r for k, r in results.items() if " E=" not in k[0]
            and (r.config.dataset, report.paper_setting(k[1], r.config.dataset)) in default_s}
    curves = report.curves(base, E.metric)
    rounds = report.at_rounds(curves, E.metric, (0.25, 0.5, 0.75, 1.0))
    E.table(rounds, "Fig. 4 (right): accuracy at a quarter, half, three quarters and all of the rounds, default S (%)",
            stem="rounds")
    E.table(report.rounds_to_shares(curves, E.metric), "Fig. 4 (right): rounds to reach 50, 75 and 90 % of the best "
            "final accuracy among the methods, default S (blank: never, in this run)", stem="rounds_to_target")
    E.table(report.stability(curves, E.metric), "Fig. 4 (right): oscillation, the mean absolute change of accuracy "
            "between consecutive evaluations over the second half of the rounds, default S (points)", stem="stability")
    E.figure(report.plot_sweep(sweep, "classes per client S", E.banner), "heterogeneity")
    E.figure(report.plot_sweep(epochs, "backbone epochs a round", E.banner), "epochs")
    E.figure(report.plot_curves(curves, E.metric, title=E.banner, ylabel="personalized accuracy (%)"), "rounds")
    return sweep
