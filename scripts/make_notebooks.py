"""Write the table/figure notebooks (committed without outputs; `dvc repro` executes them).

Each notebook is three parts: a papermill `parameters` cell, `Experiment(...)` + `run`, and the
render cells below. Edit the render code here, rerun `python scripts/make_notebooks.py`, commit.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from pflrepro.pipeline.experiments import read_params  # noqa: E402
from pflrepro.reporting.replication import PAPERS, _paper_of  # noqa: E402

PARAMS = '''# Parameters (papermill injects overrides after this cell)
profile = None        # None: the profile set in params/{name}.yaml; or smoke, mini, paper
overrides = {{}}        # merged into the profile, e.g. {{"base": {{"lr": 0.05}}}} for a sweep point
out_dir = None        # None: results/{name} and figures/{name}; set it for sweeps
progress = True
jobs = None           # runs trained at once; None: $PFLREPRO_JOBS or auto (CPU cores, 1 on a GPU)
executor = None       # None: $PFLREPRO_EXECUTOR or local; "ray" or "ray:ADDRESS" trains on a Ray cluster (README)'''

SETUP = '''import pandas as pd
from pflrepro.reporting import tables as report
from pflrepro.reporting.notebook import Experiment

E = Experiment("{name}", profile, overrides, out_dir)'''

RUN = "results = E.run(progress, jobs, executor)   # stored runs are loaded, missing ones trained (resumable)"

ACCURACY_TABLE = '''table = report.compare_table(E.tidy(), E.paper())
E.table(table, "{title} (personalized accuracy %, best round ± std over seeds; last10 = mean of the last 10 evaluations)")
E.table(report.wide(table), "{title}: reproduced ± std (paper)", stem="table_wide")
E.figure(report.plot_vs_paper(table, E.banner), "vs_paper")'''

SCD_TABLE = '''paper = E.paper().drop(columns=["dataset"])   # the paper ran {dataset}; its cells sit beside whatever ran here
table = report.compare_metrics(results, paper, {{"gm": "gm_acc", "pm": "pm_acc_weighted"}})
E.table(table, "{title} (GM = global test accuracy, PM = weighted mean of local test accuracies; %, best round ± std over seeds)",
        note="Paper cells in parentheses are Remark 4.1's: a generic method's PM is its GM on the local test sets, a "
             "PFL method without a GM is scored by its averaged PMs; ours are computed the same way. A method with "
             "an empty reproduced value is not run in this profile.")
wide = report.wide(table.assign(column=table.setting.astype(str) + " " + table.metric.str.upper()), columns="column")
E.table(wide, "{title}: reproduced ± std (paper)", stem="table_wide")
E.figure(report.plot_vs_paper(table.assign(setting=table.setting.astype(str) + " " + table.metric.str.upper()),
                              E.banner), "vs_paper")'''

SCD_SWEEP = '''paper = E.paper().drop(columns=["dataset"])
paper = paper.assign(method="{key}=" + paper["{key}"].map("{{:g}}".format)).drop(columns=["{key}"])   # runs are named so
table = report.compare_metrics(results, paper, {{"gm": "gm_acc", "pm": "pm_acc_weighted"}})
table.insert(3, "{key}", table["method"].map(report.sweep_value))
E.table(table, "{title} (GM and PM accuracy %, best round; paper: CIFAR-10)")
table = table.assign(x=table["{key}"], panel=table["setting"].astype(str) + " " + table["metric"].str.upper())
import seaborn as sns
g = sns.relplot(data=table, x="x", y="reproduced", col="panel", kind="line", marker="o", height=3.2, aspect=1.2,
                facet_kws={{"sharey": False}})
for ax, (_, sub) in zip(g.axes.flat, table.groupby("panel", sort=False)):
    ax.plot(sub["x"], sub["paper"], "k--", marker="_", label="paper (CIFAR-10)")
g.set_axis_labels("{xlabel}", "accuracy (%): reproduced, -- paper")
g.set_titles("{{col_name}}")
E.figure(g.figure, "sweep")'''

SCD_TIME = '''times = report.times_to_targets(results, E.metric, E.P["targets"])
times.to_csv(E.res_dir / "times.csv", index=False)
table = report.speedups(times, E.P["pairs"])
paper = E.paper().rename(columns={{"speedup": "paper_speedup"}})
table = table.merge(paper[["method", "pm_epochs", "target", "paper_speedup"]], on=["method", "pm_epochs", "target"], how="left")
E.table(table, "{title}: time to reach the target PM accuracy (simulated seconds) and the speedup",
        note="Simulated time (pflrepro.core.clock; rates and bandwidths in the run config, docs/fidelity.md). "
             "NaN: the target was not reached within the run. Speedup = time_slow / time_fast.", digits=3)
curves = report.curves(results, E.metric)
E.figure(report.plot_curves(curves, E.metric, title=E.banner, ylabel="PM accuracy (%)", x="sim_time"), "time_curves")'''

FINISH = "prov = E.finish()   # writes runs.csv and provenance.json (every run's seed, config and code hash, commit)"
NO_RUN = {"pfedsd_fig5", "pfedsd_table10", "pfedsd_table11", "perfed_ckt_fig1", "perfed_ckt_fig2"}  # no accuracy runs: partition / cost measurements

FEDBSD_TABLE = '''paper = E.paper()   # a profile on other data (mini: Fashion-MNIST) sits beside the paper column its params name
table, _, ref = report.compare_to_paper(E.tidy(), paper, E.P["paper_column"], value="last10")
missing = sorted(set(paper.method) - set(table.method))
E.table(table, "Table 1 (personalized accuracy %, mean of the last 10 evaluations as the paper; best round beside)",
        note="FedBSD's own row is lost in our copy of the paper: its paper cell is empty, not zero. "
             + (f"Paper rows not run here: {', '.join(missing)}. " if missing else "")
             + report.paper_column_note(ref))
E.figure(report.plot_vs_paper(table, E.banner), "vs_paper")'''

FEDBSD_FIG4 = '''runs = E.tidy()   # one row per run, in `results` order: add what the sweeps read from each run's config
runs["algorithm"] = [r.config.algorithm for r in results.values()]
runs["S"] = [r.config.partition_params["classes_per_client"] for r in results.values()]
runs["E"] = [r.config.hparams.get("body_epochs") for r in results.values()]
variant = runs.method.str.contains(" E=")
sweep = report.compare(runs[~variant].assign(setting="S=" + runs.S.astype(str)), None, ("dataset", "setting", "method"), "last10")
E.table(sweep, "Fig. 4 (left): personalized accuracy vs classes per client S (mean of the last 10 evaluations %)")
at = runs[variant][["dataset", "setting"]].drop_duplicates()          # the default S of each dataset
ep = runs.merge(at, on=["dataset", "setting"])
ep = ep[ep.algorithm.isin(["fedrep", "fedbsd"])].assign(method=lambda d: d.algorithm, setting=lambda d: "E=" + d.E.astype(int).astype(str))
epochs = report.compare(ep, None, ("dataset", "setting", "method"), "last10")
E.table(epochs, "Fig. 4 (middle): accuracy vs backbone epochs a round, FedRep and FedBSD at the default S (%)", stem="epochs")
default_s = set(map(tuple, at.to_numpy()))
base = {k: r for k, r in results.items() if " E=" not in k[0] and (r.config.dataset, report.paper_setting(k[1], r.config.dataset))
        in default_s}
curves = report.curves(base, E.metric)
rounds = report.at_rounds(curves, E.metric, (0.25, 0.5, 0.75, 1.0))
E.table(rounds, "Fig. 4 (right): accuracy at a quarter, half, three quarters and all of the rounds, default S (%)",
        stem="rounds")
E.figure(report.plot_sweep(sweep, "classes per client S", E.banner), "heterogeneity")
E.figure(report.plot_sweep(epochs, "backbone epochs a round", E.banner), "epochs")
E.figure(report.plot_curves(curves, E.metric, title=E.banner, ylabel="personalized accuracy (%)"), "rounds")'''

FEDBSD_FIG3 = '''table = report.compare(E.tidy(), None, ("dataset", "setting", "method"), "last10")
E.table(table, "Fig. 3: personalized accuracy, mean over the clients (one domain each; mean of the last 10 evaluations %)",
        note="Fig. 3 is a figure without printed numbers: no paper column. Its claims are checked on these tables.")
clients = report.client_curves(results)
last = clients.groupby(["dataset", "setting", "domain", "method", "seed"], sort=False).apply(
    lambda d: d[d["round"].isin(sorted(d["round"].unique())[-10:])]["accuracy"].mean()).rename("last10").reset_index()
last["best"] = clients.groupby(["dataset", "setting", "domain", "method", "seed"], sort=False)["accuracy"].max().values
domains = report.compare(last, None, ("dataset", "setting", "domain", "method"), "last10")
E.table(domains, "Fig. 3: each client's accuracy on its own domain's test set (mean of its last 10 evaluations %)",
        stem="domains")
comm = report.communication(results)
comm = comm.assign(per_round_M=comm.params / comm.rounds / 1e6).groupby(["setting", "method"], as_index=False, sort=False)
E.table(comm["per_round_M"].mean().rename(columns={"per_round_M": "reproduced"}),
        "Parameters sent up and down a round, all clients together (millions; FedBN and FedBSD keep BN local, FedBSD "
        "the head too)", stem="communication", digits=4)
import seaborn as sns
sns.set_theme(style="whitegrid")
g = sns.relplot(data=clients, x="round", y="accuracy", hue="method", style="method", col="domain", row="setting",
                kind="line", errorbar="sd", height=2.8, aspect=1.1, facet_kws={"sharey": False})
g.set_axis_labels("communication round", "accuracy on its domain (%)")
g.set_titles("{row_name}: {col_name}")
report.integer_ticks(g.axes.flat)
E.figure(g.figure, "clients")
curves = report.curves(results, E.metric)
E.figure(report.plot_curves(curves, E.metric, title=E.banner, ylabel="mean accuracy over the clients (%)"), "rounds")'''

PERFED_TABLE = '''runs = E.tidy()
gm = report.tidy({{k: r for k, r in results.items() if k[0] in E.P["gm_rows"]}}, "gm_local_acc_mean")
if len(gm):   # "(GM)" rows: the same runs scored by their global model on the clients' test sets
    runs = pd.concat([runs, gm.assign(method=gm.method.map(E.P["gm_rows"]))], ignore_index=True)
paper = E.paper()   # a profile on other data (mini: Fashion-MNIST) sits beside the paper column its params name
table, pc, ref = report.compare_to_paper(runs, paper, E.P["paper_column"], value="best")
comm = report.communication(results)       # parameters sent up and down over the whole run, per run
comm = pd.concat([comm, comm[comm.method.isin(list(E.P["gm_rows"]))].assign(method=lambda d: d.method.map(E.P["gm_rows"]))])
comm = comm.groupby(["setting", "method"], as_index=False)["params"].mean()
table = table.merge(comm.assign(comm_M=comm.params / 1e6)[["setting", "method", "comm_M"]], on=["setting", "method"], how="left")
keys = ["method"] if ref else ["setting", "method"]
table = table.merge(pc[keys].assign(paper_comm_M=pc["comm_e7"] * 10), on=keys, how="left")
missing = sorted(set(pc.method) - set(table.method))
E.table(table, "{title} (average test accuracy over all clients %, best round ± std over seeds; communication: "
        "parameters sent up and down over the whole run, in millions)",
        note=(f"Paper rows not run in this profile: {{', '.join(missing)}}. " if missing else "")
             + (f"Paper column: {{ref['dataset']}} {{ref['setting']}} (this profile ran other data, models and "
                "rounds: compare orderings and ratios, not numbers). " if ref else "")
             + "Our communication counts the centroids once per receiving client; the paper's CKT cells fit one "
               "broadcast per round (docs/fidelity.md). " + E.P.get("extra", {{}}).get("note", ""))
E.figure(report.plot_vs_paper(table, E.banner), "vs_paper")'''

PERFED_TOY = '''import numpy as np
from pflrepro.papers import toy
T = E.P["extra"]["toy"]
kw = dict(n=T["n"], noise=T["noise"], n_public=T["n_public"])
exp = toy.toy_experiment(range(T["seeds"]), lam=T["lam"], c=T["clusters"], **kw)
names = {"fedavg": "FedAvg", "kt_uniform": "KT w/o clustering", "kt_clustered": "KT with clustering (PerFed-CKT)",
         "local": "local least squares"}
rows = [{"setting": f"client {k}", "method": m, "reproduced": float(exp[m][k]),
         "repro_std": float(exp["per_seed"][m][:, k].std(ddof=1)), "seeds": len(exp["seeds"]),
         "wins": float((exp["per_seed"][m][:, k] <= exp["per_seed"]["kt_clustered"][:, k]).mean())}
        for m in names for k in range(len(exp[m]))]
table = pd.DataFrame(rows)
E.table(table, "Fig. 1: distance of each client's model to its true model (mean over seeds, lower is better; "
        "wins = share of seeds where the method is at least as close as KT with clustering)", digits=3,
        note="The paper shows one draw as a picture: its claim is the ordering, checked here over many seeds. "
             "'local least squares' is not in Fig. 1; with the sizes we chose (not stated) a client alone is "
             "already close (docs/fidelity.md).")
prob = toy.toy_problem(seed=0, **kw)
E.figure(toy.plot_toy(prob, toy.toy_models(prob, T["lam"], T["clusters"])), "toy")
rng = np.random.default_rng(0)
checks = []
for i in range(T["theorem_instances"]):
    K, sigma2, beta, nu = 4, float(rng.uniform(0.5, 2)), float(rng.uniform(0.5, 2)), float(rng.uniform(0.5, 2))
    v, w_hats = rng.uniform(0.3, 3.0, K), rng.normal(size=(K, 2))
    lam_n, alpha_n, ex_n = toy.theorem42_numeric(0, sigma2, beta, nu, v, w_hats)
    for form in ("paper", "paper_corrected"):
        lam_f, alpha_f = toy.theorem42_optimum(0, sigma2, beta, nu, v, form=form)
        checks.append({"instance": i, "closed_form": form, "lambda": lam_f, "sum_alpha": float(np.sum(alpha_f)),
                       "excess": toy.theorem42_excess(0, lam_f, alpha_f, sigma2, beta, nu, v, w_hats),
                       "numeric_excess": ex_n})
checks = pd.DataFrame(checks)
E.table(checks.groupby("closed_form", as_index=False).agg(instances=("instance", "count"), max_excess=("excess", "max"),
        median_excess=("excess", "median"), max_numeric_excess=("numeric_excess", "max"),
        sum_alpha_min=("sum_alpha", "min"), sum_alpha_max=("sum_alpha", "max")),
        "Theorem 4.2: excess risk E||w~ - w||^2 - its minimum, at eq. 16 (as printed, and with eq. 45's A_k beta v_k^2 "
        "read as A_k + beta v_k^2) against a numerical minimisation", stem="theorem42", digits=6)'''


NOTEBOOKS = {
    "pfedsd_table2": ("pFedSD Table 2: personalized accuracy, Dirichlet α = 0.1",
                      "Seven methods at two scales (K=20, r=100%; K=100, r=10%). The same runs feed Tables 4, 5 and Figs. 6, 7.",
                      [ACCURACY_TABLE.format(title="Table 2")]),
    "pfedsd_table3": ("pFedSD Table 3: personalized accuracy, pathological non-IID (s shards per client)",
                      "s = 2 for Fashion-MNIST and CIFAR-10, s = 20 for CIFAR-100 (McMahan shards).",
                      [ACCURACY_TABLE.format(title="Table 3")]),
    "pfedsd_table4": ("pFedSD Table 4: rounds pFedSD needs to reach FedPer's final accuracy",
                      "K=100, r=10%, Dirichlet 0.1. Read from Table 2's runs (nothing is retrained).",
                      ['''curves = report.curves(results, E.metric)
scale, note = E.pick_scale(curves.setting)
curves = curves[curves.setting == scale]
r2r = report.rounds_to_reach(curves, E.P["reference"], E.P["method"], E.metric)
r2r["dataset"] = r2r["setting"].map(dict(zip(curves.setting, curves.dataset)))
summary = r2r.groupby("dataset", as_index=False).agg(target_round=("target_round", "first"),
                                                       fedper_acc=("target_acc", "mean"),
                                                       rounds=("rounds", "mean"), speedup=("speedup", "mean"))
paper = E.paper().query("method == @E.P['method']").rename(columns={"value": "paper_rounds", "speedup": "paper_speedup"})
table = summary.merge(paper[["dataset", "paper_rounds", "paper_speedup"]], on="dataset", how="left")
E.table(table, f"Table 4: rounds {E.P['method']} needs to reach {E.P['reference']}'s accuracy at its last round",
        note="The paper's target is FedPer after 100 rounds; a profile with fewer rounds uses its own last round. "
             "NaN: never reached within the run. " + note)
E.table(r2r, "Table 4, per seed", stem="per_seed")
fig = report.plot_vs_paper(pd.DataFrame({"dataset": table["dataset"], "setting": f"rounds {E.P['method']} needs",
                                         "reproduced": table["rounds"], "repro_std": float("nan"),
                                         "paper": table["paper_rounds"]}), E.banner, x="dataset", ylabel="rounds")
E.figure(fig, "vs_paper")''']),
    "pfedsd_table5": ("pFedSD Table 5: mean and standard deviation of accuracy across clients",
                      "100-client scenario. Read from Table 2's runs (nothing is retrained).",
                      ['''clients = report.client_accuracies(results, "best", E.metric)
scale, note = E.pick_scale(clients.setting)
clients = clients[(clients.setting == scale) & clients.method.isin(E.P["methods_shown"])]
sp = report.spread(clients)
paper = E.paper().rename(columns={"value": "paper_mean", "std": "paper_std_across_clients"})
table = sp.rename(columns={"mean": "mean", "std": "std_across_clients"}).merge(
    paper, on=["dataset", "method"], how="left")
table["diff_mean"] = table["mean"] - table["paper_mean"]
table["diff_std"] = table["std_across_clients"] - table["paper_std_across_clients"]
E.table(table, "Table 5: personalized accuracy across clients at each run's best round (mean, std across clients; averaged over seeds)",
        note=note)
long = pd.concat([table.assign(setting=label, reproduced=table[col], repro_std=float("nan"), paper=table[paper_col])
                  for label, col, paper_col in (("mean over clients", "mean", "paper_mean"),
                                                ("std across clients", "std_across_clients", "paper_std_across_clients"))])
E.figure(report.plot_vs_paper(long.drop(columns="dataset"), E.banner), "vs_paper")''']),
    "pfedsd_fig2": ("pFedSD Fig. 2: the received global model forgets what the local model knew",
                    "FedAvg on 100 non-IID clients. On each client's local test set: the global model it is about to "
                    "receive vs its own model from the last round it trained. Both curves come from identical training "
                    "(`fedavg_last_local` only scores differently).",
                    ['''curves = report.curves(results, E.metric)
curves["model"] = curves.method.map({"fedavg": "received global model", "fedavg_last_local": "last local model"})
import seaborn as sns
sns.set_theme(style="whitegrid")
g = sns.relplot(data=curves, x="round", y=E.metric, hue="model", col="panel", kind="line", errorbar="sd",
                height=3.6, aspect=1.3, facet_kws={"sharey": False})
g.set_axis_labels("communication round", "accuracy on local test sets (%)")
g.set_titles("{col_name}")
report.integer_ticks(g.axes.flat)
E.figure(g.figure, "forgetting")
gap = curves.pivot_table(index=["panel", "seed", "round"], columns="model", values=E.metric).reset_index()
gap["gap"] = gap["last local model"] - gap["received global model"]
table = gap.groupby("panel", as_index=False)[["received global model", "last local model", "gap"]].mean()
E.table(table, "Fig. 2: mean over rounds of the accuracy on clients' local test sets (%)",
        note="The paper shows this as a figure only (no numbers to compare); its claim is the sign of the gap.")''']),
    "pfedsd_fig5": ("pFedSD Fig. 5: how each class's samples scatter over 20 clients",
                    "Balanced Dirichlet α = 0.1; dot area ∝ number of samples of a class on a client. No training.",
                    ['''cfg = next(iter(E.configs.values()))
E.figure(report.partition_figure(cfg), "partition")
from pflrepro.federation.build import build_partition
split = build_partition(cfg)
sizes = [len(t) for t in split["train"]]
print(f"train samples per client: min {min(sizes)}, max {max(sizes)}, total {sum(sizes)}")''']),
    "pfedsd_fig6": ("pFedSD Fig. 6: personalized accuracy per round (std bands over seeds)",
                    "Top: K=20, r=100%. Bottom: K=100, r=10%. Read from Table 2's runs (nothing is retrained).",
                    ['''curves = report.curves(results, E.metric)
E.figure(report.plot_curves(curves, E.metric, title=E.banner, ylabel="personalized accuracy (%)"), "learning_curves")
last = curves.groupby(["panel", "method", "seed"]).apply(lambda g: g.sort_values("round")[E.metric].iloc[-1]).rename("final")
E.table(last.groupby(["panel", "method"]).agg(["mean", "std"]).reset_index(), "Fig. 6: final-round accuracy (%)")''']),
    "pfedsd_fig7": ("pFedSD Fig. 7: distribution of accuracy across clients",
                    "100-client scenario, each run at its best round. Read from Table 2's runs (nothing is retrained).",
                    ['''clients = report.client_accuracies(results, "best", E.metric)
scale, note = E.pick_scale(clients.setting)
clients = clients[(clients.setting == scale) & clients.method.isin(E.P["methods_shown"])]
E.figure(report.plot_client_distribution(clients, E.banner), "client_accuracy")
E.table(clients.groupby(["dataset", "method"])["accuracy"].describe().reset_index(), "Fig. 7: per-client accuracy quantiles (%)",
        note=note)''']),
    "pfedsd_table6": ("pFedSD Table 6: participation ratio r ∈ {20%, 60%, 100%}",
                      "The paper runs CIFAR-100 (K=20); `mini` runs Fashion-MNIST: compare trends across r, not values.",
                      [ACCURACY_TABLE.format(title="Table 6")]),
    "pfedsd_table7": ("pFedSD Table 7: data heterogeneity, Dirichlet α ∈ {0.01, 0.1, 1}",
                      "The paper runs CIFAR-100 (K=20, r=60%); `mini` runs Fashion-MNIST: compare trends across α.",
                      [ACCURACY_TABLE.format(title="Table 7")]),
    "pfedsd_table8": ("pFedSD Table 8: ResNet-8 and MobileNetV2",
                      "The paper runs CIFAR-100; `mini` runs the same architectures on a small Fashion-MNIST sample.",
                      [ACCURACY_TABLE.format(title="Table 8")]),
    "pfedsd_table9": ("pFedSD Table 9: the regulariser toward the previous personalized model",
                      "L2 on parameters, EWC (diagonal Fisher of v_k), MSE between logits, KL (pFedSD).",
                      [ACCURACY_TABLE.format(title="Table 9")]),
    "pfedsd_fig8": ("pFedSD Fig. 8: effects of λ and τ",
                    "pFedSD with λ ∈ {0.01, 0.1, 0.5, 1} and τ ∈ {1, 3}. The paper gives a figure only: no numbers to compare.",
                    ['''runs = E.tidy()
hp = runs.method.str.extract(r"lam=(?P<lam>[0-9.]+),tau=(?P<tau>[0-9.]+)").astype(float)
runs = runs.join(hp)
table = runs.groupby(["dataset", "tau", "lam"], as_index=False).agg(best=("best", "mean"), best_std=("best", "std"),
                                                                   last10=("last10", "mean"))
E.table(table, "Fig. 8: pFedSD accuracy (%) over λ and τ (best round; mean over seeds)")
import seaborn as sns
sns.set_theme(style="whitegrid")
g = sns.catplot(data=runs, x="lam", y="best", hue="tau", col="dataset", kind="point", errorbar="sd",
                height=3.4, aspect=1.2, sharey=False)
g.set_axis_labels("λ", "personalized accuracy (%)")
g.set_titles("{col_name}")
E.figure(g.figure, "lambda_tau")''']),
    "pfedsd_table11": ("pFedSD Table 11: communication and computation per client per round",
                       "Measured, not estimated: bytes each client downloads + uploads, FLOPs of its local training "
                       "(torch's FLOP counter). Beside them the paper's units: its \"MB\" match millions of parameters "
                       "exchanged and its \"FLOPs\" pytorch-OpCounter multiply-accumulates (see docs/fidelity.md).",
                       ['''from pflrepro.pipeline import cost
from pflrepro.pipeline.progress import tqdm
rows = [{"method": m, "setting": s, "seed": seed, **cost.measure(cfg)}
        for (m, s, seed), cfg in tqdm(E.configs.items(), desc="measuring", disable=progress is not True)]
costs = pd.DataFrame(rows)
costs.to_csv(E.res_dir / "costs.csv", index=False)
paper = E.paper()
table = costs[["method", "dataset", "mb_per_client", "mparams_per_client", "gflops_per_client", "gmacs_per_client"]].merge(
    paper, on="method", how="left")
table["flops_vs_fedavg"] = cost.ratio_to(table, "gmacs_per_client")
table["paper_flops_vs_fedavg"] = cost.ratio_to(table, "gflops")
table = table.rename(columns={"comm_mb": "paper_comm_MB", "gflops": "paper_GFLOPs"})
E.table(table, "Table 11: per client per round, measured (MB = 1e6 bytes as sent; Mparams = what the paper "
        "calls MB; GMACs = what the paper calls GFLOPs)", digits=3)
long = pd.concat([table.assign(setting=label, reproduced=table[col], repro_std=float("nan"), paper=table[paper_col])
                  for label, col, paper_col in (("communication (M params per client)", "mparams_per_client", "paper_comm_MB"),
                                                ("computation, x FedAvg's", "flops_vs_fedavg", "paper_flops_vs_fedavg"))])
E.figure(report.plot_vs_paper(long.drop(columns="dataset"), E.banner, ylabel="per client per round"), "vs_paper")''']),
    "pfedsd_table10": ("pFedSD Table 10: time per round, split into communication, client and server",
                       "Compute and server times are measured on this machine (Table 11's runs); communication comes from "
                       "the measured bytes and the bandwidth stated in the params file. Absolute seconds depend on the "
                       "hardware: compare the split and the ratios between methods.",
                       ['''from pflrepro.pipeline import cost
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
table = rt[["method", "time_s", "comm_pct", "client_pct", "server_pct", "time_vs_fedavg"]].merge(paper, on="method", how="left")
E.table(table, f"Table 10: seconds per round at {E.P['bandwidth_mbps']} Mbit/s per client, "
        f"{'parallel' if E.P['parallel_clients'] else 'sequential'} clients")
import seaborn as sns
sns.set_theme(style="whitegrid")
ax = table.set_index("method")[["comm_pct", "client_pct", "server_pct"]].plot.barh(stacked=True, figsize=(6, 3.5))
ax.set_xlabel("% of the round (reproduced)")
E.figure(ax.figure, "time_split")''']),
    # ---------------------------------------------------------------- DC-PFL (IJCAI 2024)
    "dcpfl_table1": ("DC-PFL Table 1: homogeneous models (CNN_1), with the ablations",
                     "Three scales with 10 clients per round: (K=10, 100%), (K=50, 20%), (K=100, 10%). `rank` / "
                     "`paper_rank`: the ordering of methods within each column.",
                     [ACCURACY_TABLE.format(title="DC-PFL Table 1")]),
    "dcpfl_table2": ("DC-PFL Table 2: heterogeneous feature extractors (CNN_1..CNN_5, client k gets k mod 5)",
                     "Every method here runs through the same round loop with per-client architectures. Methods that "
                     "average whole models cannot run (marked below, like the paper, which omits FedAvg).",
                     [ACCURACY_TABLE.format(title="DC-PFL Table 2"),
                      '''from pflrepro.algorithms import ALGORITHMS
homogeneous_only = sorted(a for a, c in ALGORITHMS.items() if not c.heterogeneous)
print("cannot run with heterogeneous models (they average whole models):", ", ".join(homogeneous_only))''']),
    "dcpfl_table3": ("DC-PFL Table 3: number of generated virtual samples Σ|G_c|",
                     "DC-PFL with Σ|G_c| ∈ {600, 800, 1000, 2000, 5000} beside FedGH, at the three scales of Table 1.",
                     [ACCURACY_TABLE.format(title="DC-PFL Table 3")]),
    "dcpfl_fig2": ("DC-PFL Fig. 2: accuracy against the number of classes per client",
                   "K=10, all participating. The paper gives a figure only: no numbers to compare; its claim is DC-PFL on "
                   "top everywhere and accuracy falling as clients hold more classes.",
                   ['''table = report.compare_table(E.tidy(), None)
E.table(table, "DC-PFL Fig. 2: personalized accuracy (%) by classes per client")
E.figure(report.plot_sweep(table, "classes per client", E.banner), "classes")''']),
    "dcpfl_fig3": ("DC-PFL Fig. 3: accuracy against the client participation rate",
                   "K=100. The paper gives a figure only: no numbers to compare; its claim is DC-PFL on top at every rate "
                   "and accuracy falling as the rate grows.",
                   ['''table = report.compare_table(E.tidy(), None)
E.table(table, "DC-PFL Fig. 3: personalized accuracy (%) by participation rate")
E.figure(report.plot_sweep(table, "client participation rate", E.banner), "participation")''']),
    # ---------------------------------------------------------------- spectral co-distillation (NeurIPS 2023)
    "scd_table1": ("SCD Table 1: GM and PM accuracy, CIFAR-10 Dirichlet α ∈ {1, 0.5, 0.1}",
                   "The paper's eleven methods (`mini` leaves out pFedMe, and trains FedGen at its code's lr 0.01: at the mini's 0.05 it diverges). The paper runs "
                   "CIFAR-10 with ResNet-18 and 100 clients; `mini` runs Fashion-MNIST with 20 clients.",
                   [SCD_TABLE.format(title="SCD Table 1", dataset="CIFAR-10")]),
    "scd_table2": ("SCD Table 2: GM and PM accuracy, CIFAR-100 Dirichlet α ∈ {1, 0.1}",
                   "The paper runs CIFAR-100 (ResNet-34, 50 clients); offline `mini` has no second dataset, so it shows "
                   "Table 1's Fashion-MNIST runs at α = 1 and 0.1 beside the CIFAR-100 numbers (shared runs, not retrained).",
                   [SCD_TABLE.format(title="SCD Table 2", dataset="CIFAR-100")]),
    "scd_table3": ("SCD Table 3: GM and PM accuracy, iNaturalist-2017 Dirichlet α = 0.1",
                   "The paper runs iNaturalist-2017 (ResNet-50, 20 clients, batch 128, lr 0.003; input size not stated, "
                   "64 px here); only the `paper` profile can run it. Offline `mini` shows Table 1's Fashion-MNIST runs "
                   "at α = 0.1 of the table's seven methods beside the iNaturalist numbers (shared runs, not retrained).",
                   [SCD_TABLE.format(title="SCD Table 3", dataset="iNaturalist-2017")]),
    "scd_table4": ("SCD Table 4: wait-free speedups to 40% / 80% PM accuracy",
                   "SCD, Ditto and FedRoD at E_p = 3 and 5 PM epochs, compute-and-wait against wait-free, on the "
                   "simulated clock (the paper gives no device or network model: see docs/fidelity.md).",
                   [SCD_TIME.format(title="SCD Table 4")]),
    "scd_table5": ("SCD Table 5: ablation (without the GM-side term, the PM-side term, both)",
                   "λ_G = 0 is \"w/o SCD-GM\" (the GM step is then FedAvg's), λ_p = 0 is \"w/o SCD-PM\".",
                   [SCD_TABLE.format(title="SCD Table 5", dataset="CIFAR-10")]),
    "scd_table6": ("SCD Table 6: the truncation ratio τ", "τ = 0: no GM-side term; τ = 1: no truncation.",
                   [SCD_SWEEP.format(title="SCD Table 6", key="tau", xlabel="τ")]),
    "scd_table7": ("SCD Table 7: λ_G, the weight of the GM-side spectral term", "CIFAR-10 α = 1 in the paper.",
                   [SCD_SWEEP.format(title="SCD Table 7", key="lam", xlabel="λ_G")]),
    "scd_table8": ("SCD Table 8: λ_p, the weight of the PM-side spectral term", "CIFAR-10 α = 1 in the paper.",
                   [SCD_SWEEP.format(title="SCD Table 8", key="lam", xlabel="λ_p")]),
    "scd_table9": ("SCD Table 9: wait-free against FedAsync and FedBuff (Ditto)",
                   "Speedups over vanilla Ditto (synchronous, compute-and-wait) to 40% / 80% PM accuracy, on the "
                   "simulated clock. FedAsync and FedBuff run through the same round loop (pflrepro.core.schedule).",
                   [SCD_TIME.format(title="SCD Table 9")]),
    "scd_table10": ("SCD Table 10: partial participation c ∈ {0.1, 0.2}",
                    "CIFAR-10 α = 1 in the paper (whose caption here repeats Table 7's).",
                    [SCD_TABLE.format(title="SCD Table 10", dataset="CIFAR-10")]),
    "scd_fig3": ("SCD Fig. 3: new clients fine-tuned from the global model",
                 "The last clients of the partition never train; after the last round each fine-tunes the final global "
                 "model on its own data for 5 or 10 epochs (pflrepro.papers.newclients). The paper shows a figure only: no "
                 "numbers to compare; its claim is SCD on top.",
                 ['''from pflrepro.papers.newclients import new_client_accuracy
rows = [{"method": m, "dataset": r.config.dataset, "setting": s, "seed": seed, "epochs": e,
         "acc": 100 * new_client_accuracy(r, e)["acc"]}
        for (m, s, seed), r in results.items() for e in E.P["finetune_epochs"]]
table = (pd.DataFrame(rows).groupby(["dataset", "setting", "epochs", "method"], as_index=False, sort=False)
         .agg(reproduced=("acc", "mean"), repro_std=("acc", "std"), seeds=("acc", "count")))
E.table(table, "SCD Fig. 3: new clients' weighted mean local test accuracy (%) after fine-tuning the final GM")
import seaborn as sns
sns.set_theme(style="whitegrid")
g = sns.catplot(data=table, x="method", y="reproduced", hue="epochs", col="setting", kind="bar", height=3.6, aspect=1.6)
g.set_axis_labels("", "new clients' accuracy (%)")
g.set_titles("{col_name}")
g.tick_params(axis="x", rotation=30)
E.figure(g.figure, "new_clients")''']),
    "fedbsd_table1": ("FedBSD Table 1: personalized accuracy in FedRep's (N, S) settings",
                      "N clients with S classes each; FedBSD against the FedRep-family baselines. FedBSD's own printed "
                      "row is lost in our copy of the paper, so its cell shows the reproduction alone.",
                      [FEDBSD_TABLE]),
    "fedbsd_fig3": ("FedBSD Fig. 3: multi-domain federations, one domain per client",
                    "Each client holds one domain (the paper: Digits' five and DomainNet's six; offline: five feature "
                    "shifts of Fashion-MNIST) and is tested on its own domain; FedBSD (BN layers local, as FedBN) "
                    "against FedAvg, FedProx and FedBN, accuracy per client over the rounds.",
                    [FEDBSD_FIG3]),
    "fedbsd_fig4": ("FedBSD Fig. 4: data heterogeneity, backbone epochs and rounds",
                    "Left: classes per client S swept (smaller S: more heterogeneous). Middle: the backbone's local "
                    "epochs in FedRep and FedBSD. Right: personalized accuracy per round at the default S. Runs "
                    "shared with Table 1 are read from the store, not retrained.",
                    [FEDBSD_FIG4]),
    "perfed_ckt_table1": ("PerFed-CKT Table 1: accuracy and communication, model-homogeneous",
                          "K clients with Dir(0.01) data, a fraction C of them a round; PerFed-CKT (c clusters) "
                          "exchanges soft decisions on a small unlabeled public set, the baselines exchange models.",
                          [PERFED_TABLE.format(title="Table 1")]),
    "perfed_ckt_table2": ("PerFed-CKT Table 2: accuracy and communication, model-heterogeneous",
                          "Clients train different architectures; only soft decisions on the public set travel, so "
                          "only methods that exchange no weights (Local, PerFed-CKT) can run here.",
                          [PERFED_TABLE.format(title="Table 2")]),
    "perfed_ckt_fig1": ("PerFed-CKT Fig. 1: the linear-regression toy example, and Theorem 4.2",
                        "Three clients whose true models are theta + zeta_i (sigma 2, 5, 200): FedAvg's one model, "
                        "co-distillation from all clients (KT w/o clustering) and from the client's cluster (KT with "
                        "clustering). No federated training: closed-form least squares.",
                        [PERFED_TOY]),
    "perfed_ckt_fig2": ("PerFed-CKT Fig. 2: architectures deployed and the data each client holds",
                        "Table 2's federation: (a) the share of clients per architecture, a larger dataset drawing "
                        "a larger model (`model_assign: size`); (b) samples per label and client (bubble area). "
                        "No training.",
                        ['''from pflrepro.federation.build import arch_params, build_partition, client_archs
cfg = next(iter(E.configs.values()))
split = build_partition(cfg)
sizes = [len(t) for t in split["train"]]
clients = pd.DataFrame({"client": range(len(sizes)), "samples": sizes, "model": client_archs(cfg, sizes) or cfg.model})
clients["params"] = clients.model.map(arch_params(cfg))
E.figure(report.plot_architectures(clients, E.banner), "architectures")
E.figure(report.partition_figure(cfg), "partition")
table = clients.groupby(["model", "params"], as_index=False).agg(clients=("client", "size"), samples_mean=("samples", "mean"),
                                                                  samples_min=("samples", "min"), samples_max=("samples", "max"))
table["share_%"] = 100 * table.clients / len(clients)
E.table(table.sort_values("params"), "Fig. 2(a): clients per architecture and their training-set sizes",
        note=f"Assignment: model_assign={cfg.model_assign!r} (docs/fidelity.md, PerFed-CKT). The paper shows this as a "
             "figure only: no numbers to compare.")''']),
}


def cell(kind: str, source: str, tags=None) -> dict:
    c = {"cell_type": kind, "metadata": {"tags": tags} if tags else {}, "source": source.splitlines(keepends=True)}
    if kind == "code":
        c.update(execution_count=None, outputs=[])
    return c


def notebook(name: str, title: str, intro: str, render: list[str]) -> dict:
    md = (f"# {title}\n\n{intro}\n\nParams in `params/{name}.yaml` (profiles `smoke`, `mini` = the offline default, "
          f"`paper` = the paper's settings). Run with `dvc repro {name}`, papermill, or here in JupyterLab. "
          "Every output states its profile, dataset, seeds and commit; paper numbers (from `paper_numbers/`) "
          "are shown beside the reproduced ones, never used as results.")
    cells = [cell("markdown", md), cell("code", PARAMS.format(name=name), ["parameters"]),
             cell("code", SETUP.format(name=name))] + ([] if name in NO_RUN else [cell("code", RUN)])
    cells += [cell("code", r) for r in render] + [cell("code", FINISH)]
    return {"cells": cells, "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                                         "language_info": {"name": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


DVC_HEADER = """# Every table and figure, one stage per notebook (generated by scripts/make_notebooks.py: edit there).
# `dvc repro` runs the profile named in each params file (default: mini, offline Fashion-MNIST). Tables and
# figures are DVC outputs; params files are deps as files, with only `profile` a DVC param (make_notebooks.py
# WHOLE_PARAMS says why); the trained runs live in the shared content-addressed store results/runs
# (key = config + the code it ran), so stages that render the same runs (Table 2 -> Tables 4, 5, Figs. 6, 7)
# never train twice and a changed parameter only reruns the runs it changes.
"""

FIXED_STAGES = {
    "data": {  # Fashion-MNIST as a tensor cache (checked: decoded-content sha256, shapes, counts)
        "cmd": "mkdir -p results/data && python -m pflrepro data fmnist --save data/fmnist.pt > results/data/fmnist.json",
        "deps": ["pflrepro/data/datasets.py"],
        "outs": ["data/fmnist.pt", "results/data/fmnist.json"],
    },
}


def _params_chain(name: str) -> list[str]:
    import yaml
    out, cur = [], name
    while cur:
        out.append(f"params/{cur}.yaml")
        doc = yaml.safe_load((ROOT / "params" / f"{cur}.yaml").read_text()) or {}
        cur = doc.get("inherit") or (doc.get("source") if "profiles" not in doc else None)
    return out


# Params files are stage deps as files (any change reruns the stage) and DVC params only for the `profile` key
# that switches a paper's profile. Tracking every value as a DVC param made dvc.lock 350 KB (each stage repeated
# its paper's common file), and DVC parses and rewrites the whole lock at every stage: about 8 s a stage, 6 minutes
# of a default repro. The example keeps all its values tracked: README's `dvc exp` sweep shows the swept value.
WHOLE_PARAMS = {"example"}


def _tracked(files: list[str], whole: bool = False) -> list:
    import yaml
    if whole:
        return [{p: None} for p in files]
    return [{p: ["profile"]} for p in files if "profile" in (yaml.safe_load((ROOT / p).read_text()) or {})]


def _paper(name: str) -> str | None:
    """The paper a notebook belongs to (replication.PAPERS' keys are the name prefixes), or None."""
    p = _paper_of(name, PAPERS)
    return p if p in PAPERS else None


def train_stage(paper: str, names: list[str]) -> dict:
    """All of a paper's runs in one queue (pflrepro.pipeline.experiments.train_notebooks): two runs stay busy
    from the first to the last instead of idling at the end of each notebook's short grid."""
    names = [n for n in names if n not in NO_RUN]
    chains = sorted({p for n in names for p in _params_chain(n)})
    return {"cmd": f"python -m pflrepro train {' '.join(names)} --out results/train/{paper}.json",
            "deps": ["pflrepro", "data/fmnist.pt", *chains], "params": _tracked(chains),
            "outs": [f"results/train/{paper}.json"]}


def _metric(name: str) -> str:
    return read_params(name).get("metric", "pm_acc_mean")


def stage(name: str) -> dict:
    import yaml
    doc = yaml.safe_load((ROOT / "params" / f"{name}.yaml").read_text()) or {}
    chain = _params_chain(name)
    whole = name in WHOLE_PARAMS
    deps = [f"notebooks/{name}.ipynb", "pflrepro", "data/fmnist.pt", *([] if whole else chain)]
    if _paper(name) and name not in NO_RUN:   # its runs are trained (or found) by the paper's train stage first
        deps.append(f"results/train/{_paper(name)}.json")
    tables = {doc.get("paper_table")} | {yaml.safe_load((ROOT / p).read_text()).get("paper_table") for p in chain}
    deps += sorted(f"paper_numbers/{t}.csv" for t in tables if t)
    if doc.get("source") and "profiles" not in doc:   # rendered from another stage's runs: run after it
        deps.append(f"results/{doc['source']}")
    return {"cmd": f"mkdir -p results/{name} && papermill notebooks/{name}.ipynb results/{name}/{name}.ipynb "
                   "--no-progress-bar -p progress log",
            "deps": deps, "params": _tracked(chain, whole), "outs": [f"results/{name}", f"figures/{name}"],
            **({} if name in NO_RUN else {"metrics": [{f"metrics/{name}.json": {"cache": False}}]})}


def write_dvc_yaml() -> None:
    import yaml
    stages = dict(FIXED_STAGES)
    built = [n for n in ["example", *NOTEBOOKS] if (ROOT / "notebooks" / f"{n}.ipynb").exists()]
    for paper in PAPERS:
        mine = [n for n in built if _paper(n) == paper]
        if any(n not in NO_RUN for n in mine):
            stages[f"train_{paper}"] = train_stage(paper, mine)
    for name in built:
        stages[name] = stage(name)
    papers = [n for n in stages if n not in FIXED_STAGES and n != "example" and not n.startswith("train_")]
    stages["report"] = {  # the replication report: every paper's tables, figures and claims checklist, last
        "cmd": "python -m pflrepro report --results results --figures figures --out results/report",
        "deps": ["pflrepro/reporting/claims.py", "pflrepro/reporting/health.py", "pflrepro/reporting/replication.py", "paper_numbers"]
                + [f"results/{n}" for n in papers] + [f"figures/{n}" for n in papers],
        "outs": ["results/report"],
    }
    # learning curves where DVC users look (`dvc plots show`, `dvc plots diff` between experiments): every training
    # notebook's curves.csv (pflrepro.reporting.notebook.plot_curves_csv), one line per curve (template .dvc/plots/curves.json)
    metric = {n: _metric(n) for n in built if "metrics" in stages[n]}
    plots = [{f"results/{n}/curves.csv": {"x": "round", "y": m, "template": "curves", "title": n,
                                           "y_label": f"{m} (%)"}} for n, m in metric.items()]
    text = yaml.safe_dump({"stages": stages, "plots": plots}, sort_keys=False, width=120).replace(": null", ":")
    (ROOT / "dvc.yaml").write_text(DVC_HEADER + text)
    print("wrote dvc.yaml", len(stages), "stages")


def main(names=None) -> None:
    for name, (title, intro, render) in NOTEBOOKS.items():
        if (names and name not in names) or not (ROOT / "params" / f"{name}.yaml").exists():
            continue
        nb = notebook(name, title, intro, render)
        for i, c in enumerate(nb["cells"]):
            c["id"] = f"{name}-{i}"
        (ROOT / "notebooks" / f"{name}.ipynb").write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
        print("wrote", f"notebooks/{name}.ipynb")
    write_dvc_yaml()


if __name__ == "__main__":
    main(sys.argv[1:])
