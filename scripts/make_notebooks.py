"""Write dvc.yaml's stages from the notebooks, a skeleton for a new notebook, and check both (docs/architecture.md).

    python scripts/make_notebooks.py                        # dvc.yaml: a train and a render stage per paper
    python scripts/make_notebooks.py --new NAME "TITLE"     # notebooks/NAME.ipynb: params, Experiment, run, render, finish
    python scripts/make_notebooks.py --check                # exit 1 when dvc.yaml or a notebook is out of step

The notebooks are the source of their own render cells (edit them in JupyterLab, commit them without outputs); the
cells call package functions (`pflrepro.reporting.render`, `pflrepro.papers.<paper>`). This script never rewrites a
notebook.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from pflrepro.pipeline.experiments import read_params  # noqa: E402
from pflrepro.pipeline.notebooks import params_chain  # noqa: E402
from pflrepro.reporting.replication import PAPERS, _paper_of  # noqa: E402

PARAMS = '''# Parameters (papermill injects overrides after this cell)
profile = None        # None: the profile set in params/{name}.yaml; or smoke, mini, paper
overrides = {{}}        # merged into the profile, e.g. {{"base": {{"lr": 0.05}}}} for a sweep point
out_dir = None        # None: results/{name} and figures/{name}; set it for sweeps
progress = True
jobs = None           # runs trained at once; None: $PFLREPRO_JOBS or auto (CPU cores, 1 on a GPU)
executor = None       # None: $PFLREPRO_EXECUTOR or local; "ray" or "ray:ADDRESS" trains on a Ray cluster (README)'''

SETUP = '''from pflrepro.reporting import render
from pflrepro.reporting.notebook import Experiment

E = Experiment("{name}", profile, overrides, out_dir)'''

RUN = "results = E.run(progress, jobs, executor)   # stored runs are loaded, missing ones trained (resumable)"
RENDER = '''table = render.accuracy_table(E, "{title}")   # or a function of pflrepro.papers.<paper>, or your own cells'''
FINISH = "prov = E.finish()   # writes runs.csv and provenance.json (every run's seed, config and code hash, commit)"


def _notebook(name: str) -> dict:
    return json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text())


def _code(nb: dict) -> list[str]:
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def trains(name: str) -> bool:
    """Whether a notebook trains runs (its run cell calls `E.run`): a stage with runs gets the paper's train stage
    as a dep and DVC metrics; the others (partitions, cost measurements, the toy example) neither."""
    return any("E.run(" in c for c in _code(_notebook(name)))


def notebooks() -> list[str]:
    """The notebooks that have a params file, example first, then each paper's in PAPERS order, tables before
    figures, by number."""
    def key(n):
        m = re.match(r"(.*)_(table|fig)(\d+)$", n)
        paper = _paper(n)
        return (list(PAPERS).index(paper) if paper else -1, m.group(2) != "table" if m else 0,
                int(m.group(3)) if m else 0, n)
    names = [p.stem for p in (ROOT / "notebooks").glob("*.ipynb") if (ROOT / "params" / f"{p.stem}.yaml").exists()]
    return sorted(names, key=key)


DVC_HEADER = """# Every table and figure (written by scripts/make_notebooks.py from notebooks/): per paper,
# train_<paper> trains the runs of all its notebooks in one queue, then render_<paper> renders its notebooks through
# papermill, two at a time (`python -m pflrepro render`); the example has a stage of its own. `dvc repro` runs the
# profile named in each params file (default: mini, offline Fashion-MNIST). Tables and figures are DVC outputs;
# params files are deps as files, with only `profile` a DVC param (make_notebooks.py WHOLE_PARAMS says why); the
# trained runs live in the shared content-addressed store results/runs (key = config + the code it ran), so notebooks
# that render the same runs (Table 2 -> Tables 4, 5, Figs. 6, 7) never train twice and a changed parameter only
# reruns the runs it changes.
"""

FIXED_STAGES = {
    "data": {  # Fashion-MNIST as a tensor cache (checked: decoded-content sha256, shapes, counts)
        "cmd": "mkdir -p results/data && python -m pflrepro data fmnist --save data/fmnist.pt > results/data/fmnist.json",
        "deps": ["pflrepro/data/datasets.py"],
        "outs": ["data/fmnist.pt", "results/data/fmnist.json"],
    },
}


def _params_chain(name: str) -> list[str]:
    return [f"params/{n}.yaml" for n in params_chain(name, ROOT)]


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


# What a stage's command reads of the package (issue 55: every stage depended on all of `pflrepro`, so one paper's
# plugin change marked every paper's stages changed). The driver every stage runs (`python -m pflrepro ...`, the grids,
# the store); what decides a run's numbers (pipeline.store.RESULT_CODE: the layers whole, of algorithms/ the files the
# runs execute); what a render reads (the reporting layer, its paper's plugin and what that imports).
DRIVER = ["pflrepro/__init__.py", "pflrepro/__main__.py", "pflrepro/cli.py", "pflrepro/paths.py", "pflrepro/version.py",
          "pflrepro/pipeline"]
RUN_LAYERS = ["pflrepro/params.py", "pflrepro/settings.py", "pflrepro/data", "pflrepro/core", "pflrepro/federation",
              "pflrepro/algorithms/__init__.py"]


def algorithm_files(names: list[str]) -> list[str]:
    """The algorithm files the runs of `names` execute, in any profile (pipeline.store.result_code of each method's
    algorithm): a change to another algorithm leaves these notebooks' stages clean."""
    from pflrepro.pipeline import experiments
    from pflrepro.pipeline.store import PACKAGE, result_code
    algos = set()
    for n in names:
        for prof in read_params(n).get("profiles", {}):
            p = experiments.load_profile(n, prof)
            algos |= {(over or {}).get("algorithm", m) for m, over in (p.get("methods") or {}).items()}
    files = {f for a in algos for f in result_code(a) if f.parent.name == "algorithms"}
    return sorted(f"pflrepro/{f.relative_to(PACKAGE).as_posix()}" for f in files)


def plugin_files(names: list[str]) -> list[str]:
    """The pflrepro.papers modules the notebooks import, with the papers modules those import (SCD's new clients,
    PerFed-CKT's toy), and the reporting layer they render with."""
    found = {m for n in names for m in re.findall(r"pflrepro\.papers(?: import |\.)(\w+)", "\n".join(_code(_notebook(n))))}
    todo, seen = sorted(found), set()
    while todo:
        m = todo.pop()
        if m in seen or not (ROOT / "pflrepro" / "papers" / f"{m}.py").exists():
            continue
        seen.add(m)
        todo += re.findall(r"^from \.(\w+) import", (ROOT / "pflrepro" / "papers" / f"{m}.py").read_text(), re.M)
    return ["pflrepro/reporting", "pflrepro/papers/__init__.py", *sorted(f"pflrepro/papers/{m}.py" for m in seen)]


def train_stage(paper: str, names: list[str]) -> dict:
    """All of a paper's runs in one queue (pflrepro.pipeline.experiments.train_notebooks): two runs stay busy
    from the first to the last instead of idling at the end of each notebook's short grid."""
    names = [n for n in names if trains(n)]
    chains = sorted({p for n in names for p in _params_chain(n)})
    return {"cmd": f"python -m pflrepro train {' '.join(names)} --out results/train/{paper}.json",
            "deps": [*DRIVER, *RUN_LAYERS, *algorithm_files(names), "data/fmnist.pt", *chains],
            "params": _tracked(chains),
            "outs": [f"results/train/{paper}.json"]}


def _metric(name: str) -> str:
    return read_params(name).get("metric", "pm_acc_mean")


def _deps(name: str) -> list[str]:
    """What a notebook's render reads: itself, the package, the data, its params chain, its paper's train manifest
    (when it has runs), the paper numbers it prints, and the notebook it renders after (`source`)."""
    import yaml
    doc = yaml.safe_load((ROOT / "params" / f"{name}.yaml").read_text()) or {}
    chain = _params_chain(name)
    # A notebook whose runs its paper's train stage trains reads them through that stage's manifest: a change to the
    # code in a run's address changes the runs' addresses, so the manifest, so this stage; one that trains its own
    # (the example) or none depends on that code itself.
    staged = bool(_paper(name) and trains(name))
    deps = [f"notebooks/{name}.ipynb", *DRIVER, *plugin_files([name]),
            *([] if staged else RUN_LAYERS + (algorithm_files([name]) if trains(name) else [])), "data/fmnist.pt",
            *([] if name in WHOLE_PARAMS else chain)]
    if staged:   # its runs are trained (or found) by the paper's train stage first
        deps.append(f"results/train/{_paper(name)}.json")
    tables = {doc.get("paper_table")} | {yaml.safe_load((ROOT / p).read_text()).get("paper_table") for p in chain}
    deps += sorted(f"paper_numbers/{t}.csv" for t in tables if t)
    if doc.get("source") and "profiles" not in doc:   # rendered from another notebook's runs or files: after it
        deps.append(f"results/{doc['source']}")
    return deps


def _outputs(names: list[str]) -> dict:
    """outs, and for the notebooks with runs their DVC metrics and curves (uncached: committed)."""
    runs = [n for n in names if trains(n)]
    return {"outs": [o for n in names for o in (f"results/{n}", f"figures/{n}")],
            **({"metrics": [{f"metrics/{n}.json": {"cache": False}} for n in runs],
                "plots": [{f"metrics/{n}.curves.csv": {"cache": False}} for n in runs]} if runs else {})}


def stage(name: str) -> dict:
    """A notebook's own stage (the example: its params are whole DVC params, for README's `dvc exp` sweep)."""
    return {"cmd": f"mkdir -p results/{name} && papermill notebooks/{name}.ipynb results/{name}/{name}.ipynb "
                   "--no-progress-bar -p progress log",
            "deps": _deps(name), "params": _tracked(_params_chain(name), name in WHOLE_PARAMS), **_outputs([name])}


def render_stage(names: list[str]) -> dict:
    """A paper's notebooks, rendered by papermill two at a time (`python -m pflrepro render`, pflrepro.pipeline.
    notebooks: sources first, `alone` ones alone). DVC runs stages one after another, and one stage per notebook left
    a core idle for the 7 minutes of rendering in a default repro (docs/performance.md, "Notebooks two at a time")."""
    own = {f"results/{n}" for n in names}
    deps = list(dict.fromkeys(d for n in names for d in _deps(n) if d not in own))   # its own outputs: order only
    chains = sorted({p for n in names for p in _params_chain(n)})
    return {"cmd": f"python -m pflrepro render {' '.join(names)}", "deps": deps, "params": _tracked(chains),
            **_outputs(names)}


def dvc_yaml_text() -> str:
    """dvc.yaml as this script writes it: the data stage, a train and a render stage per paper, the example's stage,
    the report."""
    import yaml
    stages = dict(FIXED_STAGES)
    built = notebooks()
    for paper in PAPERS:
        mine = [n for n in built if _paper(n) == paper]
        if any(trains(n) for n in mine):
            stages[f"train_{paper}"] = train_stage(paper, mine)
    for name in built:
        if not _paper(name):
            stages[name] = stage(name)
    for paper in PAPERS:
        mine = [n for n in built if _paper(n) == paper]
        if mine:
            stages[f"render_{paper}"] = render_stage(mine)
    papers = [n for n in built if _paper(n)]
    stages["report"] = {  # the replication report: every paper's tables, figures and claims checklist, last
        "cmd": "python -m pflrepro report --results results --figures figures --out results/report --metrics "
               "metrics/report.json",
        "deps": ["pflrepro/reporting/claims", "pflrepro/reporting/forest.py", "pflrepro/reporting/health.py",
                 "pflrepro/reporting/replication.py", "pflrepro/reporting/tier.py", "pflrepro/reporting/verdicts.py",
                 "pflrepro/reporting/verdict_md.py", "pflrepro/reporting/html.py",
                 "pflrepro/pipeline/budget.py", "params",   # the paper profiles' cost (reporting/claims/scale.py)
                 "paper_numbers", "docs/device",   # docs/device: the paper-scale tier's run records (reporting/tier.py)
                                                   # and the device check's measured rates (reporting/claims/scale.py)
                 "docs/evidence/kernel_paths"]     # the kernel-path check (reporting/claims/kernel.py)
                + [f"results/{n}" for n in papers] + [f"figures/{n}" for n in papers],
        "outs": ["results/report"],
        "metrics": [{"metrics/report.json": {"cache": False}}],   # the verdicts per paper, compact
    }
    # learning curves where DVC users look (`dvc plots show`, `dvc plots diff` between experiments): every training
    # notebook's metrics/<name>.curves.csv (pflrepro.reporting.notebook.plot_curves_csv; committed like the metrics, so a
    # fresh clone draws them), one line per curve (template .dvc/plots/curves.json)
    metric = {n: _metric(n) for n in built if trains(n)}
    plots = [{f"metrics/{n}.curves.csv": {"x": "round", "y": m, "template": "curves", "title": n,
                                           "y_label": f"{m} (%)"}} for n, m in metric.items()]
    return DVC_HEADER + yaml.safe_dump({"stages": stages, "plots": plots}, sort_keys=False, width=120).replace(": null", ":")


def write_dvc_yaml() -> None:
    (ROOT / "dvc.yaml").write_text(dvc_yaml_text())
    print("wrote dvc.yaml")


def skeleton(name: str, title: str) -> dict:
    """A new notebook: title, params cell, Experiment, run, one render cell to edit, finish."""
    def cell(kind: str, source: str, tags=None) -> dict:
        c = {"cell_type": kind, "metadata": {"tags": tags} if tags else {}, "source": source.splitlines(keepends=True)}
        if kind == "code":
            c.update(execution_count=None, outputs=[])
        return c
    md = (f"# {title}\n\nParams in `params/{name}.yaml` (profiles `smoke`, `mini`, `paper`). Run with `python -m "
          f"pflrepro render {name}`, papermill, or here in JupyterLab (`dvc repro` renders it with its paper's "
          "notebooks). Render cells call `pflrepro.reporting.render` and "
          "`pflrepro.papers`: edit them here and keep them (docs/architecture.md).")
    cells = [cell("markdown", md), cell("code", PARAMS.format(name=name), ["parameters"]),
             cell("code", SETUP.format(name=name)), cell("code", RUN), cell("code", RENDER.format(title=title)),
             cell("code", FINISH)]
    for i, c in enumerate(cells):
        c["id"] = f"{name}-{i}"
    return {"cells": cells, "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                                         "language_info": {"name": "python"}}, "nbformat": 4, "nbformat_minor": 5}


def notebook_problems(name: str, nb: dict) -> list[str]:
    """A notebook's structure: a papermill `parameters` cell first, `Experiment("<its name>", ...)`, `E.finish()`
    last, no outputs committed."""
    out = []
    code_cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
    code = _code(nb)
    if not code_cells or "parameters" not in code_cells[0]["metadata"].get("tags", []):
        out.append(f"notebooks/{name}.ipynb: its first code cell is not tagged `parameters` (papermill)")
    if not any(re.search(rf"Experiment\(\s*[\"']{name}[\"']", c) for c in code):
        out.append(f"notebooks/{name}.ipynb: no `Experiment(\"{name}\", ...)` cell")
    if not code or "E.finish()" not in code[-1]:
        out.append(f"notebooks/{name}.ipynb: its last code cell does not call `E.finish()`")
    if any(c.get("outputs") or c.get("execution_count") is not None for c in code_cells):
        out.append(f"notebooks/{name}.ipynb: committed with outputs (clear them: outputs come from dvc repro)")
    return out


def problems() -> list[str]:
    """What is out of step: dvc.yaml against what this script writes, and each notebook's structure."""
    out = []
    if (ROOT / "dvc.yaml").read_text() != dvc_yaml_text():
        out.append("dvc.yaml differs from what `python scripts/make_notebooks.py` writes: run it and commit dvc.yaml")
    for name in notebooks():
        out += notebook_problems(name, _notebook(name))
    return out


def main(argv: list[str]) -> int:
    if argv[:1] == ["--check"]:
        found = problems()
        print("\n".join(found) if found else f"dvc.yaml and {len(notebooks())} notebooks in step")
        return 1 if found else 0
    if argv[:1] == ["--new"]:
        if len(argv) != 3:
            print('usage: make_notebooks.py --new NAME "TITLE"', file=sys.stderr)
            return 2
        name, title = argv[1], argv[2]
        path = ROOT / "notebooks" / f"{name}.ipynb"
        if path.exists():
            print(f"{path.relative_to(ROOT)} exists: not overwritten", file=sys.stderr)
            return 2
        path.write_text(json.dumps(skeleton(name, title), indent=1, ensure_ascii=False) + "\n")
        print(f"wrote {path.relative_to(ROOT)}; next: params/{name}.yaml (profiles), paper_numbers/{name}.csv, "
              "then `python scripts/make_notebooks.py` for its stage")
        return 0
    write_dvc_yaml()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
