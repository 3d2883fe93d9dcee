"""Every table/figure notebook renders on the `smoke` profile.

The notebooks' code cells are executed in this process (papermill's parameter injection done by
hand: profile='smoke', a private out_dir), so a render cell that cannot handle a profile's
settings fails here rather than in `dvc repro` (pFedSD Table 4 once assumed a 100-client setting
that the mini and smoke profiles do not run). The example notebook runs through papermill itself
in tests/test_pipeline.py.
"""
from __future__ import annotations

import json
import os

import matplotlib
import pandas as pd
import pytest

from pflrepro.paths import REPO_ROOT

from .conftest import FMNIST_AVAILABLE

matplotlib.use("Agg")

NOTEBOOKS = sorted(p.stem for p in (REPO_ROOT / "notebooks").glob("*.ipynb") if p.stem != "example")
# `make test` renders two papers' tables (pFedSD Table 2, SCD Table 1); `make test-full` renders every notebook, and
# so does `dvc repro`. A notebook's smoke grid trains: on a fast 2-core machine (2026-11-27) FedBSD Table 1 took 11 s,
# DC-PFL Table 1 16 s, PerFed-CKT Table 1 5 s, and pFedSD Tables 4, 5 (Table 2's runs) kept the other xdist worker
# waiting 8 s; CI's machines ran the suite about 20 times slower than that (docs/performance.md, the fourth cut).
IN_CI = {"pfedsd_table2", "scd_table1"}


def _code_cells(name: str) -> list[str]:
    nb = json.loads((REPO_ROOT / "notebooks" / f"{name}.ipynb").read_text())
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def test_every_paper_notebook_is_listed():
    assert {n.split("_")[0] for n in NOTEBOOKS} == {"pfedsd", "dcpfl", "scd", "fedbsd", "perfed"}
    assert len(NOTEBOOKS) >= 20, NOTEBOOKS
    assert IN_CI <= set(NOTEBOOKS)


@pytest.mark.parametrize("name", NOTEBOOKS + ["example"])
def test_papermill_reads_every_parameter(name, capsys):
    """papermill's parser must see each parameter (`papermill --help-notebook`, `-p`); a comment it
    cannot parse (an '=' in it) drops the parameter from its view with only a printed warning."""
    import nbformat
    from papermill.translators import PythonTranslator
    params = PythonTranslator.inspect(nbformat.v4.new_code_cell(_code_cells(name)[0]))
    assert "Unable to parse" not in capsys.readouterr().out
    assert {p.name for p in params} >= {"profile", "overrides", "out_dir", "progress", "jobs", "executor"}, params


@pytest.fixture(scope="session")
def shared_store(tmp_path_factory):
    """One run store for all notebooks, whichever xdist worker renders them (as `dvc repro` shares results/runs):
    Tables 4, 5 and Figs. 6, 7 render Table 2's runs without training them again. A run another worker is training
    is claimed in the store, so this one waits for it (pflrepro.pipeline.executors.Claims) instead of training it twice."""
    base = tmp_path_factory.getbasetemp()
    # under xdist each worker's basetemp is pytest-N/popen-gwN/: the store goes in pytest-N/, which both share
    store = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "notebook-runs"
    store.mkdir(exist_ok=True)
    return store


@pytest.mark.skipif(not FMNIST_AVAILABLE, reason="needs offline Fashion-MNIST")
@pytest.mark.parametrize("name", [pytest.param(n, marks=[] if n in IN_CI else [pytest.mark.full]) for n in NOTEBOOKS])
def test_notebook_renders_on_smoke(name, tmp_path, shared_store):
    import matplotlib.pyplot as plt
    (tmp_path / "runs").symlink_to(shared_store, target_is_directory=True)  # out_dir/runs is the store
    cells = _code_cells(name)
    assert cells[0].lstrip().startswith("# Parameters"), "first code cell must be the parameters cell"
    ns: dict = {}
    exec(compile(cells[0], f"{name}[params]", "exec"), ns)
    ns.update(profile="smoke", out_dir=str(tmp_path), progress=False)   # what papermill would inject
    for i, src in enumerate(cells[1:], 1):
        exec(compile(src, f"{name}[cell {i}]", "exec"), ns)
    plt.close("all")
    outputs = [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix in (".md", ".png", ".csv")]
    assert any(p.suffix in (".md", ".png") for p in outputs), outputs
    prov = json.loads((tmp_path / "provenance.json").read_text())
    assert prov["profile"] == "smoke" and prov["notebook"] == name
    evals = [len(r.history) for r in ns["E"].results.values()]
    for md in tmp_path.rglob("*.md"):
        text = md.read_text()
        assert "profile=smoke" in text, md
        if "| last10 |" in text and min(evals) < 10:     # said, not silently the mean of fewer evaluations
            assert "last10: these runs have" in text, md
    import re
    renamed = [s_ for (_, s_, _), c in ns["E"].configs.items()
               if (m := re.search(r"(\d+) clients", str(s_))) and int(m.group(1)) != c.n_clients]
    if renamed and (tmp_path / "table.md").exists() and "| setting |" in (tmp_path / "table.md").read_text():
        assert "Settings keep the paper's names; this profile ran" in (tmp_path / "table.md").read_text()
    if name in ("pfedsd_table4", "pfedsd_table5", "pfedsd_table11"):   # tables that once drew no figure
        assert (tmp_path / "figures" / "vs_paper.png").stat().st_size > 0
    if prov["runs"]:      # what `dvc metrics show` reads (a sweep point keeps it in its out_dir)
        m = json.loads((tmp_path / "metrics.json").read_text())
        cells = [v for s_, by_method in m.items() if s_ != "profile" for v in by_method.values()]
        assert m["profile"] == "smoke" and cells and all(set(v) == {"best", "last10"} for v in cells), m
        curves = pd.read_csv(tmp_path / "curves.csv")   # what `dvc plots show` draws, one line per curve
        assert list(curves.columns) == ["round", "curve", ns["E"].metric] and len(curves) > 0
        assert curves["curve"].nunique() == len({(k[0], k[1]) for k in ns["E"].configs}) and curves["round"].min() >= 0


def test_a_papermill_parameter_the_notebook_does_not_declare_stops_it():
    """`papermill ... -p profle smoke` only printed "Passed unknown parameter" and ran the default profile (issue 16):
    the notebook stops, naming the parameter, from the kernel's input history (its own parameters cell declares,
    papermill's injected "# Parameters" cell sets). Interactive use (no injected cell) is never checked."""
    from pflrepro.params import ConfigError
    from pflrepro.reporting.notebook import check_injected_parameters
    own = _code_cells("pfedsd_table2")[0]
    assert own.startswith("# Parameters (")
    check_injected_parameters(["", own, '# Parameters\nprofile = "smoke"\nout_dir = "x"\n', "E = 1"])   # declared
    check_injected_parameters(["", own, "profle = 'smoke'"])        # typed by hand in JupyterLab: not papermill's
    with pytest.raises(ConfigError, match=r"papermill parameter 'profle'.*did you mean 'profile'.*declared: executor"):
        check_injected_parameters(["", own, '# Parameters\nprofle = "smoke"\n'])


def test_papermill_refuses_an_unknown_parameter_end_to_end(tmp_path):
    """The real thing on the example notebook (it stops in its setup cell, before any run)."""
    import papermill
    from papermill.exceptions import PapermillExecutionError
    with pytest.raises(PapermillExecutionError, match="papermill parameter 'profle'"):
        papermill.execute_notebook(str(REPO_ROOT / "notebooks" / "example.ipynb"), str(tmp_path / "out.ipynb"),
                                   parameters={"profle": "smoke", "out_dir": str(tmp_path)}, progress_bar=False,
                                   cwd=str(REPO_ROOT))
