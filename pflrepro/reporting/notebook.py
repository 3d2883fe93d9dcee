"""What every table/figure notebook does, so notebooks stay three cells: params, run, render.

    E = Experiment("pfedsd_table2", profile, overrides, out_dir)   # profile + grid, validated
    results = E.run(progress)                                       # content-addressed, resumable
    E.table(report.compare(E.tidy(results), E.paper()), "Table 2")  # beside the paper, with banner
    E.figure(fig, "curves")
    E.finish(results)                                               # runs.csv + provenance.json

Outputs: results/<name>/{<stem>.md, <stem>.csv, runs.csv, provenance.json}, figures/<name>/*.png
(or everything under `out_dir` for a sweep point).
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ..params import did_you_mean
from ..paths import REPO_ROOT
from ..pipeline import experiments
from . import tables as report


def _assigned(source: str) -> set[str]:
    import ast
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    return {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)}


def check_injected_parameters(history: list[str] | None = None) -> None:
    """papermill only warns about a parameter the notebook does not declare (`-p profle smoke` printed "Passed
    unknown parameter" and ran the default profile): stop instead, naming it and the declared ones. Reads the
    kernel's input history: the notebook's parameters cell (first line "# Parameters (papermill ...") declares,
    papermill's injected cell (first line exactly "# Parameters") sets. Outside a papermill run, nothing to check."""
    if history is None:
        try:
            from IPython import get_ipython
            ip = get_ipython()
        except ImportError:
            ip = None
        history = list(ip.user_ns.get("In", [])) if ip is not None else []
    first = [(src.split("\n", 1)[0].strip(), src) for src in history]
    declared = set().union(*(_assigned(src) for head, src in first if head.startswith("# Parameters (")))
    injected = set().union(*(_assigned(src) for head, src in first if head == "# Parameters"))
    unknown = sorted(injected - declared)
    if declared and unknown:
        raise experiments.ConfigError(f"papermill parameter {unknown[0]!r}: the notebook declares no such parameter"
                                      f"{did_you_mean(unknown[0], declared)}; declared: "
                                      + ", ".join(sorted(declared)))


class Experiment:
    def __init__(self, name: str, profile: str | None = None, overrides: dict | None = None,
                 out_dir: str | None = None, verbose: bool = True):
        check_injected_parameters()
        self.name, self.out_dir = name, out_dir
        self.P = experiments.load_profile(name, profile, overrides)
        self.profile = self.P["profile"]
        # the committed metrics/<name>.json are the params file's own profile's, unchanged: a render on another profile
        # or with overrides writes its metrics beside its results instead (issue 55: a smoke render overwrote them)
        self.committed = out_dir is None and not overrides and self.profile == experiments.default_profile(name)
        self.metric = self.P.get("metric", "pm_acc_mean")
        self.res_dir, self.fig_dir, self.store = experiments.output_dirs(name, out_dir)
        self.configs = experiments.grid(self.P)  # every config validated before anything runs
        self.datasets = sorted({c.dataset for c in self.configs.values()})
        self.banner = report.banner(self.profile, ",".join(self.datasets), seeds=self.P["seeds"])
        self.results: dict = {}
        if verbose:
            print(f"{name}: profile={self.profile}, {len(self.configs)} runs, store {self.store}")

    # ---- run
    def run(self, progress: bool | str = True, jobs: int | str | None = None, executor: str | None = None) -> dict:
        """Load stored runs, train missing ones (on `executor`, "local" or "ray[:ADDRESS]": pflrepro.pipeline.executors;
        locally `jobs` at once: pflrepro.pipeline.parallel); `progress`: True (bars), False, or "log" (plain lines to the
        terminal, as `dvc repro` runs it: pflrepro.pipeline.progress)."""
        self.results = experiments.run_grid(self.configs, root=self.store, progress=progress, jobs=jobs,
                                            name=self.name, executor=executor,
                                            announce_cost=self.profile == "paper")
        return self.results

    # ---- data for rendering
    def tidy(self, results: dict | None = None) -> pd.DataFrame:
        return report.tidy(results if results is not None else self.results, self.metric)

    def paper(self, name: str | None = None) -> pd.DataFrame:
        return report.paper_table(name or self.P["paper_table"])

    def pick_scale(self, available) -> tuple[str, str]:
        """(setting, note): the setting named by the params file's `scale` if this profile ran it,
        else the available one with the most clients, with a note saying so (mini runs pFedSD's
        20-client setting only, so Table 4, Table 5 and Fig. 7 show that one there)."""
        wanted = self.P.get("scale")
        clients = {report.paper_setting(s, c.dataset): c.n_clients for (_, s, _), c in self.configs.items()}
        avail = sorted(set(available), key=lambda s: (clients.get(s, 0), s))
        if wanted in avail:
            return wanted, ""
        if not avail:
            raise ValueError(f"{self.name}: the runs have no setting to show (wanted {wanted!r})")
        return avail[-1], (f"Profile {self.profile!r} has no {wanted!r} setting; this shows {avail[-1]!r}, "
                           f"the largest it ran.")

    # ---- outputs
    def metrics_path(self) -> Path:
        """metrics/<name>.json (what `dvc metrics show` and `dvc exp show` read; a DVC stage's metrics file, kept in
        git) for the default run, or <out_dir>/metrics.json for a sweep point."""
        return metrics_path(self.name, self.out_dir, self.res_dir, self.committed)

    def table(self, df: pd.DataFrame, title: str, stem: str = "table", note: str = "", digits: int = 2) -> str:
        """Write <stem>.md (banner + table + paper source) and <stem>.csv; return the markdown."""
        md = report.to_markdown(df, title, self.banner, digits=digits)
        if self.P.get("paper_table"):
            md += "\nPaper column: " + report.paper_source(self.P["paper_table"]) + "\n"
        if note:
            md += "\n" + note.strip() + "\n"
        md += self._client_count_note(df)
        evals = [len(r.history) for r in self.results.values()]
        if "last10" in df.columns and evals and min(evals) < 10:
            md += (f"\nlast10: these runs have {min(evals)}" + (f"-{max(evals)}" if max(evals) != min(evals) else "") +
                   " evaluations; where fewer than 10, last10 is the mean of all of them.\n")
        (self.res_dir / f"{stem}.md").write_text(md)
        df.to_csv(self.res_dir / f"{stem}.csv", index=False)
        _display_markdown(md)
        return md

    def _client_count_note(self, df: pd.DataFrame) -> str:
        """Settings are named after the paper's ('20 clients'); a profile may run fewer (smoke): say so."""
        import re
        shown = set(df["setting"].astype(str)) if "setting" in df else set()
        ran: dict[str, set] = {}
        for (_, setting, _), cfg in self.configs.items():
            m = re.search(r"(\d+) clients", str(setting))
            if m and int(m.group(1)) != cfg.n_clients and (not shown or str(setting) in shown
                                                          or report.paper_setting(setting, cfg.dataset) in shown):
                ran.setdefault(str(setting), set()).add(cfg.n_clients)
        if not ran:
            return ""
        return "\nSettings keep the paper's names; this profile ran " + "; ".join(
            f"'{s}' with {', '.join(map(str, sorted(n)))} clients" for s, n in sorted(ran.items())) + ".\n"

    def figure(self, fig, stem: str) -> None:
        """Save a figure as figures/<name>/<stem>.png, its title line carrying the banner, and show it inline
        when a notebook runs this (JupyterLab, or papermill's executed copy)."""
        if getattr(fig, "_suptitle", None) is None:
            fig.suptitle(self.banner, y=1.02, fontsize=8)
        _display_figure(fig, report.save(fig, self.fig_dir / f"{stem}.png"))

    def finish(self, results: dict | None = None) -> dict:
        """runs.csv (one row per run) and provenance.json (profile, banner, every run's origin)."""
        results = results if results is not None else self.results
        if results:
            runs = self.tidy(results)
            runs.to_csv(self.res_dir / "runs.csv", index=False)
            for r in runs[runs["health"] != ""].itertuples(index=False):   # pflrepro.reporting.health: read its curve
                print(f"health: {r.method} / {r.setting} / seed {r.seed} ({r.run}): {r.health}")
        prov = {"notebook": self.name, "profile": self.profile, "banner": self.banner,
                "runs": {"/".join(map(str, k)): {"path": str(r.path.name),
                                                  **{x: r.provenance.get(x) for x in (
                                                      "config_sha256", "code_sha256", "seed", "dataset",
                                                      "dataset_source", "device", "wall_seconds", "eval_seconds",
                                                      "git", "torch")}}
                         for k, r in results.items()}}
        (self.res_dir / "provenance.json").write_text(json.dumps(prov, indent=2))
        if results:
            write_metrics_and_curves(self.name, results, self.metric, self.profile, self.res_dir, self.out_dir,
                                     self.committed)
        print(json.dumps({k: prov[k] for k in ("notebook", "profile", "banner")}, indent=2))
        return prov


def metrics_path(name: str, out_dir, res_dir: Path, committed: bool = True) -> Path:
    """metrics/<name>.json beside results/ for a DVC stage (the params file's own profile, no overrides: `committed`),
    <res_dir>/metrics.json otherwise (a sweep point's <out_dir>, or another profile's render)."""
    if out_dir or not committed:
        return Path(res_dir) / "metrics.json"
    root = experiments.results_root()
    return (REPO_ROOT if root == REPO_ROOT / "results" else root) / "metrics" / f"{name}.json"


def curves_path(name: str, out_dir, res_dir: Path, committed: bool = True) -> Path:
    """metrics/<name>.curves.csv beside the metrics for a DVC stage (committed like them, so `dvc plots show` draws
    every stage's curves in a fresh clone), <res_dir>/curves.csv otherwise (as `metrics_path`)."""
    if out_dir or not committed:
        return Path(res_dir) / "curves.csv"
    return metrics_path(name, out_dir, res_dir).with_name(f"{name}.curves.csv")


def write_metrics_and_curves(name: str, results: dict, metric: str, profile: str, res_dir: Path, out_dir=None,
                             committed: bool = True) -> None:
    """The DVC metrics file (metrics_path) and the DVC plots file (curves_path) of a notebook's runs; with
    `committed` False (another profile than the params file's, or overrides) they go beside the results, and the
    committed ones stay as they are."""
    path = metrics_path(name, out_dir, res_dir, committed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(run_metrics(report.tidy(results, metric), profile), indent=1))
    plot_curves_csv(results, metric).to_csv(curves_path(name, out_dir, res_dir, committed), index=False)
    if not committed and not out_dir:
        print(f"{name}: profile {profile!r} (or overrides) is not what dvc repro renders: its metrics are in "
              f"{path} and {path.with_name('curves.csv')}; metrics/{name}.json is left as committed")


def plot_curves_csv(results: dict, metric: str) -> pd.DataFrame:
    """curves.csv, what `dvc plots show` / `dvc plots diff` draw (template .dvc/plots/curves.json, one line per
    `curve`): round, curve ("method", or "method / setting" when the runs have several settings), the metric in %
    (mean over seeds; rounds without an evaluation are skipped)."""
    several = len({setting for _, setting, _ in results}) > 1
    rows = [{"round": h["round"], "curve": f"{method} / {setting}" if several else method, metric: 100.0 * h[metric]}
            for (method, setting, _), r in results.items() for h in r.history if h.get(metric) is not None]
    if not rows:
        return pd.DataFrame(columns=["round", "curve", metric])
    out = pd.DataFrame(rows).groupby(["curve", "round"], sort=False, as_index=False)[metric].mean()
    return out[["round", "curve", metric]].round({metric: 3})


def run_metrics(runs: pd.DataFrame, profile: str) -> dict:
    """Per setting and method, the mean over seeds of the best-round and last-10 scores (%), for DVC:
    {"profile": ..., "<setting>": {"<method>": {"best": .., "last10": ..}}}."""
    out: dict = {"profile": profile}
    for r in report.compare(runs, None, ("setting", "method")).itertuples(index=False):
        out.setdefault(str(r.setting), {})[str(r.method)] = {"best": round(float(r.reproduced), 4),
                                                            "last10": round(float(r.last10), 4)}
    return out


def show_figure(fig, path: Path | str) -> None:
    """Save `fig` as `path` (PNG) and show it inline in a notebook (nothing outside IPython); returns None, so a
    cell ending with it prints no path."""
    _display_figure(fig, report.save(fig, path))


def _display_figure(fig, png: Path) -> None:
    """Show the saved PNG once in a notebook (what is shown is what was saved; pyplot's own figure is closed, so
    the inline backend does not show it a second time at the end of the cell); nothing outside IPython."""
    try:
        from IPython import get_ipython
        from IPython.display import Image, display
    except ImportError:
        return
    if get_ipython() is None:
        return
    display(Image(filename=str(png)))
    import matplotlib.pyplot as plt
    if plt.fignum_exists(getattr(fig, "number", -1)):
        plt.close(fig)


def _display_markdown(md: str) -> None:
    try:
        from IPython import get_ipython
        from IPython.display import Markdown, display
        if get_ipython() is not None:
            display(Markdown(md))
            return
    except ImportError:
        pass
    print(md)
