"""PerFed-CKT: the render cells of its notebooks (Tables 1 and 2, Figs. 1 and 2). Each writes its tables and figures
through `E` and returns the main table."""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..federation.build import arch_params, build_partition, client_archs
from ..reporting import render
from ..reporting import tables as report
from ..reporting.notebook import Experiment
from . import toy


def _with_gm_rows(E: Experiment, results: dict, runs: pd.DataFrame) -> pd.DataFrame:
    """The "(GM)" rows: the same runs scored by their global model on the clients' test sets."""
    gm = report.tidy({k: r for k, r in results.items() if k[0] in E.P["gm_rows"]}, "gm_local_acc_mean")
    if not len(gm):
        return runs
    return pd.concat([runs, gm.assign(method=gm.method.map(E.P["gm_rows"]))], ignore_index=True)


def _communication(E: Experiment, results: dict) -> pd.DataFrame:
    """Parameters sent up and down over the whole run, mean per (setting, method), "(GM)" rows included."""
    comm = report.communication(results)
    comm = pd.concat([comm, comm[comm.method.isin(list(E.P["gm_rows"]))].assign(
        method=lambda d: d.method.map(E.P["gm_rows"]))])
    return comm.groupby(["setting", "method"], as_index=False)["params"].mean()


def accuracy_and_communication(E: Experiment, results: dict, title: str) -> pd.DataFrame:
    """Average test accuracy over all clients (best round) and parameters communicated, beside the paper's."""
    runs = _with_gm_rows(E, results, E.tidy())
    paper = E.paper()   # a profile on other data (mini: Fashion-MNIST) sits beside the paper column its params name
    table, pc, ref = report.compare_to_paper(runs, paper, E.P["paper_column"], value="best")
    comm = _communication(E, results)
    table = table.merge(comm.assign(comm_M=comm.params / 1e6)[["setting", "method", "comm_M"]],
                        on=["setting", "method"], how="left")
    keys = ["method"] if ref else ["setting", "method"]
    table = table.merge(pc[keys].assign(paper_comm_M=pc["comm_e7"] * 10), on=keys, how="left")
    missing = sorted(set(pc.method) - set(table.method))
    E.table(table, f"{title} (average test accuracy over all clients %, best round ± std over seeds; communication: "
            "parameters sent up and down over the whole run, in millions)",
            note=(f"Paper rows not run in this profile: {', '.join(missing)}. " if missing else "")
                 + (f"Paper column: {ref['dataset']} {ref['setting']} (this profile ran other data, models and "
                    "rounds: compare orderings and ratios, not numbers). " if ref else "")
                 + "Our communication counts the centroids once per receiving client; the paper's CKT cells fit one "
                   "broadcast per round (docs/fidelity.md). " + E.P.get("extra", {}).get("note", ""))
    E.figure(report.plot_vs_paper(table, E.banner), "vs_paper")
    E.table(report.by_client_size(results, E.metric), f"{title}: accuracy of the clients in each quarter of the "
            "training-set sizes (%, best round)", stem="by_size")
    return table


TOY_METHODS = {"fedavg": "FedAvg", "kt_uniform": "KT w/o clustering", "kt_clustered": "KT with clustering (PerFed-CKT)",
               "local": "local least squares"}


def toy_fig1(E: Experiment) -> pd.DataFrame:
    """Fig. 1: each client's distance to its true model, per method, over the params' seeds; and one draw drawn."""
    T = E.P["extra"]["toy"]
    kw = dict(n=T["n"], noise=T["noise"], n_public=T["n_public"])
    exp = toy.toy_experiment(range(T["seeds"]), lam=T["lam"], c=T["clusters"], **kw)
    rows = [{"setting": f"client {k}", "method": m, "reproduced": float(exp[m][k]),
             "repro_std": float(exp["per_seed"][m][:, k].std(ddof=1)), "seeds": len(exp["seeds"]),
             "wins": float((exp["per_seed"][m][:, k] <= exp["per_seed"]["kt_clustered"][:, k]).mean())}
            for m in TOY_METHODS for k in range(len(exp[m]))]
    table = pd.DataFrame(rows)
    E.table(table, "Fig. 1: distance of each client's model to its true model (mean over seeds, lower is better; "
            "wins = share of seeds where the method is at least as close as KT with clustering)", digits=3,
            note="The paper shows one draw as a picture: its claim is the ordering, checked here over many seeds. "
                 "'local least squares' is not in Fig. 1; with the sizes we chose (not stated) a client alone is "
                 "already close (docs/fidelity.md).")
    prob = toy.toy_problem(seed=0, **kw)
    E.figure(toy.plot_toy(prob, toy.toy_models(prob, T["lam"], T["clusters"])), "toy")
    return table


def theorem42(E: Experiment) -> pd.DataFrame:
    """Theorem 4.2's closed form (as printed, and corrected) against a numerical minimisation, on random instances."""
    T = E.P["extra"]["toy"]
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
    table = checks.groupby("closed_form", as_index=False).agg(
        instances=("instance", "count"), max_excess=("excess", "max"), median_excess=("excess", "median"),
        max_numeric_excess=("numeric_excess", "max"), sum_alpha_min=("sum_alpha", "min"),
        sum_alpha_max=("sum_alpha", "max"))
    E.table(table, "Theorem 4.2: excess risk E||w~ - w||^2 - its minimum, at eq. 16 (as printed, and with eq. 45's "
            "A_k beta v_k^2 read as A_k + beta v_k^2) against a numerical minimisation", stem="theorem42", digits=6)
    return table


def architectures_fig2(E: Experiment) -> pd.DataFrame:
    """Fig. 2: (a) the share of clients per architecture and their training-set sizes, (b) the partition."""
    cfg = next(iter(E.configs.values()))
    sizes = [len(t) for t in build_partition(cfg)["train"]]
    clients = pd.DataFrame({"client": range(len(sizes)), "samples": sizes,
                            "model": client_archs(cfg, sizes) or cfg.model})
    clients["params"] = clients.model.map(arch_params(cfg))
    E.figure(report.plot_architectures(clients, E.banner), "architectures")
    render.partition(E)
    table = clients.groupby(["model", "params"], as_index=False).agg(
        clients=("client", "size"), samples_mean=("samples", "mean"), samples_min=("samples", "min"),
        samples_max=("samples", "max"))
    table["share_%"] = 100 * table.clients / len(clients)
    table = table.sort_values("params")
    E.table(table, "Fig. 2(a): clients per architecture and their training-set sizes",
            note=f"Assignment: model_assign={cfg.model_assign!r} (docs/fidelity.md, PerFed-CKT). The paper shows this "
                 "as a figure only: no numbers to compare.")
    return table
