"""pFedSD (TPDS 2022): the render cells of its notebooks that are its own (Tables 2, 3, 6-9 use
`reporting.render.accuracy_table`). Each writes its tables and figures through `E` and returns the main table."""
from __future__ import annotations

import pandas as pd

from ..federation.build import build_partition
from ..pipeline import cost
from ..pipeline.progress import tqdm
from ..reporting import render
from ..reporting import tables as report
from ..reporting.notebook import Experiment


def table4(E: Experiment, results: dict) -> pd.DataFrame:
    """Rounds pFedSD needs to reach FedPer's accuracy at its last round, per dataset (and per seed)."""
    curves = report.curves(results, E.metric)
    scale, note = E.pick_scale(curves.setting)
    curves = curves[curves.setting == scale]
    r2r = report.rounds_to_reach(curves, E.P["reference"], E.P["method"], E.metric)
    r2r["dataset"] = r2r["setting"].map(dict(zip(curves.setting, curves.dataset)))
    summary = report.over_seeds(r2r.rename(columns={"target_acc": "fedper_acc"}), ["dataset"],
                                ["fedper_acc", "rounds", "speedup"])
    summary.insert(1, "target_round", r2r.groupby("dataset", sort=False)["target_round"].first().to_numpy())
    paper = E.paper().query("method == @E.P['method']").rename(columns={"value": "paper_rounds",
                                                                       "speedup": "paper_speedup"})
    table = summary.merge(paper[["dataset", "paper_rounds", "paper_speedup"]], on="dataset", how="left")
    E.table(table, f"Table 4: rounds {E.P['method']} needs to reach {E.P['reference']}'s accuracy at its last round",
            note="The paper's target is FedPer after 100 rounds; a profile with fewer rounds uses its own last round. "
                 "NaN: never reached within the run. " + note)
    E.table(r2r, "Table 4, per seed", stem="per_seed")
    fig = report.plot_vs_paper(pd.DataFrame({"dataset": table["dataset"], "setting": f"rounds {E.P['method']} needs",
                                             "reproduced": table["rounds"], "repro_std": float("nan"),
                                             "paper": table["paper_rounds"]}), E.banner, x="dataset", ylabel="rounds")
    E.figure(fig, "vs_paper")
    return table


def _long(table: pd.DataFrame, panels) -> pd.DataFrame:
    """One row per (method, panel) for plot_vs_paper: panels are (label, reproduced column, paper column)."""
    return pd.concat([table.assign(setting=label, reproduced=table[col], repro_std=float("nan"), paper=table[paper_col])
                      for label, col, paper_col in panels])


def table5(E: Experiment, results: dict) -> pd.DataFrame:
    """Mean and standard deviation of accuracy across clients, at each run's best round."""
    clients = report.client_accuracies(results, "best", E.metric)
    scale, note = E.pick_scale(clients.setting)
    clients = clients[(clients.setting == scale) & clients.method.isin(E.P["methods_shown"])]
    sp = report.spread(clients)
    paper = E.paper().rename(columns={"value": "paper_mean", "std": "paper_std_across_clients"})
    table = sp.rename(columns={"std": "std_across_clients", "std_std": "std_across_clients_std",
                               "std_seeds": "std_across_clients_seeds"}).merge(paper, on=["dataset", "method"], how="left")
    table["diff_mean"] = table["mean"] - table["paper_mean"]
    table["diff_std"] = table["std_across_clients"] - table["paper_std_across_clients"]
    E.table(table, "Table 5: personalized accuracy across clients at each run's best round (mean, std across clients; "
            "averaged over seeds)", note=note)
    long = _long(table, (("mean over clients", "mean", "paper_mean"),
                         ("std across clients", "std_across_clients", "paper_std_across_clients")))
    E.figure(report.plot_vs_paper(long.drop(columns="dataset"), E.banner), "vs_paper")
    return table


def fig2(E: Experiment, results: dict) -> pd.DataFrame:
    """The received global model against the client's last local model, on the local test sets, per round."""
    curves = report.curves(results, E.metric)
    curves["model"] = curves.method.map({"fedavg": "received global model", "fedavg_last_local": "last local model"})
    g = report.sns_theme().relplot(data=curves, x="round", y=E.metric, hue="model", col="panel", kind="line",
                                   errorbar="sd", height=3.6, aspect=1.3, facet_kws={"sharey": False})
    g.set_axis_labels("communication round", "accuracy on local test sets (%)")
    g.set_titles("{col_name}")
    report.integer_ticks(g.axes.flat)
    E.figure(g.figure, "forgetting")
    gap = curves.pivot_table(index=["panel", "seed", "round"], columns="model", values=E.metric).reset_index()
    gap["gap"] = gap["last local model"] - gap["received global model"]
    per_seed = gap.groupby(["panel", "seed"], as_index=False)[["received global model", "last local model", "gap"]].mean()
    table = report.over_seeds(per_seed, ["panel"], ["received global model", "last local model", "gap"])
    E.table(table, "Fig. 2: mean over rounds of the accuracy on clients' local test sets (%)",
            note="The paper shows this as a figure only (no numbers to compare); its claim is the sign of the gap.")
    return table


def fig5(E: Experiment) -> list[int]:
    """The partition's bubble chart; returns the training samples per client."""
    cfg = render.partition(E)
    sizes = [len(t) for t in build_partition(cfg)["train"]]
    print(f"train samples per client: min {min(sizes)}, max {max(sizes)}, total {sum(sizes)}")
    return sizes


def fig6(E: Experiment, results: dict) -> pd.DataFrame:
    """Learning curves (std bands over seeds); the final-round accuracy and the drop from the best round; every
    method's rounds to FedPer's last-round accuracy; the accuracy at a quarter, half, three quarters and all rounds."""
    curves = render.learning_curves(E, results)
    per_run = curves.sort_values("round").groupby(["panel", "method", "seed"], sort=False)[E.metric] \
        .agg(final="last", best="max").reset_index()
    per_run["drop"] = per_run["best"] - per_run["final"]   # how far a curve ends under its best round (stability)
    table = report.over_seeds(per_run, ["panel", "method"], ["final", "drop"])
    E.table(table, "Fig. 6: final-round accuracy and its drop from the best round (%, mean over seeds)")
    reach = report.rounds_to_target(curves, E.P.get("reference", "fedper"), E.metric)
    E.table(reach, "Fig. 6: rounds each method needs to reach FedPer's accuracy at its last round (blank: never, in "
            "this run; mean over the seeds that reached it)", stem="rounds_to_target")
    E.table(report.at_rounds(curves, E.metric), "Fig. 6: accuracy at a quarter, half, three quarters and all of the "
            "rounds (%)", stem="rounds")
    return table


def fig7(E: Experiment, results: dict) -> pd.DataFrame:
    """The distribution of accuracy across clients, each run at its best round."""
    clients = report.client_accuracies(results, "best", E.metric)
    scale, note = E.pick_scale(clients.setting)
    clients = clients[(clients.setting == scale) & clients.method.isin(E.P["methods_shown"])]
    E.figure(report.plot_client_distribution(clients, E.banner), "client_accuracy")
    table = clients.groupby(["dataset", "method"])["accuracy"].describe().reset_index()
    E.table(table, "Fig. 7: per-client accuracy quantiles (%)", note=note)
    return table


def fig8(E: Experiment) -> pd.DataFrame:
    """pFedSD's accuracy over λ and τ."""
    runs = E.tidy()
    hp = runs.method.str.extract(r"lam=(?P<lam>[0-9.]+),tau=(?P<tau>[0-9.]+)").astype(float)
    runs = runs.join(hp)
    table = report.over_seeds(runs, ["dataset", "tau", "lam"], ["best", "last10"])
    E.table(table, "Fig. 8: pFedSD accuracy (%) over λ and τ (best round; mean over seeds)")
    g = report.sns_theme().catplot(data=runs, x="lam", y="best", hue="tau", col="dataset", kind="point",
                                   errorbar="sd", height=3.4, aspect=1.2, sharey=False)
    g.set_axis_labels("λ", "personalized accuracy (%)")
    g.set_titles("{col_name}")
    E.figure(g.figure, "lambda_tau")
    return table


def table11(E: Experiment, progress=True) -> pd.DataFrame:
    """Communication and computation per client per round, measured (writes costs.csv for Table 10)."""
    rows = [{"method": m, "setting": s, "seed": seed, **cost.measure(cfg)}
            for (m, s, seed), cfg in tqdm(E.configs.items(), desc="measuring", disable=progress is not True)]
    costs = pd.DataFrame(rows)
    costs.to_csv(E.res_dir / "costs.csv", index=False)
    table = costs[["method", "dataset", "mb_per_client", "mparams_per_client", "gflops_per_client",
                   "gmacs_per_client"]].merge(E.paper(), on="method", how="left")
    table["flops_vs_fedavg"] = cost.ratio_to(table, "gmacs_per_client")
    table["paper_flops_vs_fedavg"] = cost.ratio_to(table, "gflops")
    table = table.rename(columns={"comm_mb": "paper_comm_MB", "gflops": "paper_GFLOPs"})
    E.table(table, "Table 11: per client per round, measured (MB = 1e6 bytes as sent; Mparams = what the paper "
            "calls MB; GMACs = what the paper calls GFLOPs)", digits=3)
    long = _long(table, (("communication (M params per client)", "mparams_per_client", "paper_comm_MB"),
                         ("computation, x FedAvg's", "flops_vs_fedavg", "paper_flops_vs_fedavg")))
    E.figure(report.plot_vs_paper(long.drop(columns="dataset"), E.banner, ylabel="per client per round"), "vs_paper")
    return table


def table10(E: Experiment, out_dir=None) -> pd.DataFrame:
    """Time per round split into communication, client and server, from Table 11's measured costs (measured here
    when run standalone or as a sweep point) and the bandwidth in the params file."""
    src = E.res_dir.parent / E.P["source"] / "costs.csv"
    if out_dir is None and src.exists():
        costs = pd.read_csv(src)
    else:  # standalone or a sweep point: measure here
        costs = pd.DataFrame([{"method": m, **cost.measure(cfg)} for (m, s, seed), cfg in E.configs.items()])
    rt = cost.runtime_model(costs, E.P["bandwidth_mbps"], E.P["parallel_clients"])
    rt["time_vs_fedavg"] = cost.ratio_to(rt, "time_s")
    paper = E.paper().rename(columns={"time_s": "paper_time_s", "comm_pct": "paper_comm_pct",
                                      "client_pct": "paper_client_pct", "server_pct": "paper_server_pct"})
    paper["paper_time_vs_fedavg"] = cost.ratio_to(paper, "paper_time_s")
    table = rt[["method", "time_s", "comm_pct", "client_pct", "server_pct", "time_vs_fedavg"]].merge(
        paper, on="method", how="left")
    E.table(table, f"Table 10: seconds per round at {E.P['bandwidth_mbps']} Mbit/s per client, "
            f"{'parallel' if E.P['parallel_clients'] else 'sequential'} clients")
    report.sns_theme()
    ax = table.set_index("method")[["comm_pct", "client_pct", "server_pct"]].plot.barh(stacked=True, figsize=(6, 3.5))
    ax.set_xlabel("% of the round (reproduced)")
    E.figure(ax.figure, "time_split")
    return table
