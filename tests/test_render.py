"""`python -m pflrepro render` (pflrepro.pipeline.notebooks): a paper's notebooks through papermill, several at a
time, sources first, `alone` ones alone, a failure named in one line and what needs it skipped."""
from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from pflrepro.params import ConfigError
from pflrepro.paths import REPO_ROOT
from pflrepro.pipeline import notebooks


def test_the_plan_orders_by_source_and_keeps_measurements_alone():
    after, alone = notebooks.plan(["pfedsd_table2", "pfedsd_table4", "pfedsd_table10", "pfedsd_table11"])
    assert after == {"pfedsd_table2": set(), "pfedsd_table4": {"pfedsd_table2"}, "pfedsd_table10": {"pfedsd_table11"},
                     "pfedsd_table11": set()}
    assert alone == {"pfedsd_table11"}   # it times rounds: nothing beside it
    assert notebooks.plan(["pfedsd_table4"]) == ({"pfedsd_table4": set()}, set())   # a source not rendered here


def _fake_root(tmp_path, docs: dict) -> object:
    for name, doc in docs.items():
        (tmp_path / "notebooks").mkdir(exist_ok=True)
        (tmp_path / "params").mkdir(exist_ok=True)
        (tmp_path / "notebooks" / f"{name}.ipynb").write_text("{}")
        (tmp_path / "params" / f"{name}.yaml").write_text(json.dumps(doc))
    return tmp_path


def test_bad_names_are_refused_before_any_work(tmp_path):
    root = _fake_root(tmp_path, {"a_table1": {}, "a_table2": {"source": "a_table3"},
                                 "a_table3": {"source": "a_table2"}})
    ran = []
    with pytest.raises(ConfigError, match=r"'a_table9': notebooks/a_table9.ipynb and params/a_table9.yaml do not "
                                          "exist"):
        notebooks.render(["a_table1", "a_table9"], root=root, run=lambda *a: ran.append(a), pool=ThreadPoolExecutor(1))
    with pytest.raises(ConfigError, match="named twice"):
        notebooks.plan(["a_table1", "a_table1"], root)
    with pytest.raises(ConfigError, match="a_table2, a_table3 name each other as `source`"):
        notebooks.plan(["a_table1", "a_table2", "a_table3"], root)
    assert ran == []


class Recorder:
    """A fake `run`: sleeps, records who ran beside whom, fails the names it is told to."""
    def __init__(self, fail=()):
        self.lock, self.now, self.log, self.fail = threading.Lock(), set(), [], set(fail)

    def __call__(self, name, parameters, root):
        with self.lock:
            self.log.append(("start", name, frozenset(self.now)))
            self.now.add(name)
        time.sleep(0.05)
        with self.lock:
            self.now.discard(name)
            self.log.append(("end", name, frozenset(self.now)))
        assert parameters == {"progress": "log"}
        return 0.05, "ValueError: boom" if name in self.fail else ""


def test_two_at_a_time_sources_first_and_alone_alone(tmp_path):
    docs = {"p_table1": {}, "p_table2": {"source": "p_table1"}, "p_table3": {}, "p_table4": {"alone": True},
            "p_table5": {}, "p_table6": {"source": "p_table4"}}
    root = _fake_root(tmp_path, docs)
    rec, said = Recorder(), []
    failed = notebooks.render(list(docs), jobs=2, root=root, run=rec, pool=ThreadPoolExecutor(2),
                              say=lambda s, **k: said.append(s))
    assert failed == {}
    starts = [(n, beside) for kind, n, beside in rec.log if kind == "start"]
    ends = [n for kind, n, _ in rec.log if kind == "end"]
    assert sorted(n for n, _ in starts) == sorted(docs) and max(len(b) for _, b in starts) == 1   # two at a time
    assert starts[0] == ("p_table4", frozenset())                       # alone first: nothing to wait for
    assert all("p_table4" not in b for _, b in starts)                  # nothing started beside it
    order = [n for n, _ in starts]
    assert ends.index("p_table1") < order.index("p_table2") and ends.index("p_table4") < order.index("p_table6")
    assert said[-1].startswith("render: 6 of 6 notebooks in ") and "2 at a time" in said[-1]
    assert sum("rendered in" in s for s in said) == 6


def test_a_failure_is_named_and_what_needs_it_is_skipped(tmp_path):
    root = _fake_root(tmp_path, {"p_table1": {}, "p_table2": {"source": "p_table1"}, "p_table3": {}})
    said = []
    failed = notebooks.render(["p_table1", "p_table2", "p_table3"], jobs=2, root=root, run=Recorder({"p_table1"}),
                              pool=ThreadPoolExecutor(2), say=lambda s, **k: said.append(s))
    assert failed == {"p_table1": "ValueError: boom",
                      "p_table2": "not rendered: it renders after p_table1, which failed"}
    assert any(s.startswith("render: [") and "p_table1 FAILED ValueError: boom" in s for s in said)
    assert "failed: p_table1, p_table2" in said[-1] and said[-1].startswith("render: 1 of 3 notebooks")


def test_papermill_in_a_worker_process_reports_the_cell_error_in_one_line(tmp_path):
    """The real path (spawned worker, papermill, a kernel) on the example notebook, stopped in its setup cell by a
    misspelt parameter: one line naming it, exit status 1 from the CLI's `main`, the partial notebook kept."""
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "params").mkdir()
    for sub in ("notebooks/example.ipynb", "params/example.yaml"):
        (tmp_path / sub).write_text((REPO_ROOT / sub).read_text())
    said = []
    failed = notebooks.render(["example"], parameters={"profle": "smoke"}, root=tmp_path,
                              say=lambda s, **k: said.append(s))
    assert list(failed) == ["example"] and "\n" not in failed["example"]
    assert "papermill parameter 'profle'" in failed["example"] and "results/example/example.ipynb" in failed["example"]
    assert (tmp_path / "results" / "example" / "example.ipynb").exists()


def test_the_cli_refuses_bad_jobs_and_unknown_notebooks_in_one_line(capsys):
    from pflrepro.cli import main
    assert main(["render", "pfedsd_table2", "--jobs", "0"]) == 2
    assert capsys.readouterr().err.strip() == "config error: --jobs 0: must be >= 1"
    assert main(["render", "pfedsd_table99"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("config error: render 'pfedsd_table99': notebooks/pfedsd_table99.ipynb") and "\n" not in err


def test_a_verb_builds_only_its_own_parser():
    """`python -m pflrepro render ...` (each render stage) no longer builds every verb's parser: those of `claims`,
    `report` and `tune` import the reporting layer, scipy and torch (5.7 s before the first notebook started)."""
    import subprocess
    import sys
    code = ("import sys; from pflrepro.cli import main; rc = main(['render', 'pfedsd_table99']); "
            "print(rc, 'torch' in sys.modules, 'pflrepro.reporting.claims' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["2", "False", "False"], out.stdout + out.stderr[-2000:]
    code = ("import sys; from pflrepro.cli import main; main(['list']); "
            "print('pflrepro.reporting.claims' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert out.stdout.split()[-1] == "False", out.stderr[-2000:]


def test_render_profile_is_passed_to_the_notebooks_and_checked_first(capsys):
    """`render --profile smoke` renders on that profile (papermill's `profile` parameter); a profile a notebook does not
    define is refused in one line before any work, with the close match."""
    from pflrepro.cli import main
    assert notebooks.profiles("pfedsd_table4") >= {"smoke", "mini", "paper"}     # through `source: pfedsd_table2`
    assert main(["render", "pfedsd_table2", "--profile", "smok"]) == 2
    err = capsys.readouterr().err.strip()
    assert "render --profile smok (did you mean 'smoke'?)" in err and "\n" not in err
    seen = {}

    def fake(a_names, jobs, parameters=None, say=print, **kw):
        seen.update(names=a_names, parameters=parameters)
        return {}
    import pflrepro.pipeline.notebooks as nb
    real, nb.render = nb.render, fake
    try:
        assert main(["render", "pfedsd_table2", "--profile", "smoke"]) == 0
    finally:
        nb.render = real
    assert seen == {"names": ["pfedsd_table2"], "parameters": {"profile": "smoke"}}


def test_a_render_on_another_profile_leaves_the_committed_metrics(tmp_path, monkeypatch):
    """Issue 55's trap: rendering a notebook on `smoke` overwrote the committed metrics/<name>.json. Now only the
    params file's own profile without overrides writes there; any other render writes beside its results."""
    from pflrepro.reporting import notebook
    monkeypatch.setattr(notebook.experiments, "results_root", lambda: tmp_path / "results")
    for profile, overrides, committed in (("smoke", None, False), ("mini", {"base": {"lr": 0.1}}, False),
                                          ("mini", None, True), (None, None, True)):
        E = notebook.Experiment("pfedsd_table2", profile, overrides, verbose=False)
        assert E.committed is committed, (profile, overrides)
        path = E.metrics_path()
        if committed:
            assert path == tmp_path / "results" / "metrics" / "pfedsd_table2.json"   # a private store: its own metrics/
        else:
            assert path == E.res_dir / "metrics.json"
    written = []
    monkeypatch.setattr(notebook, "run_metrics", lambda runs, profile: {"profile": profile})
    monkeypatch.setattr(notebook.report, "tidy", lambda results, metric: None)
    monkeypatch.setattr(notebook, "plot_curves_csv", lambda results, metric: __import__("pandas").DataFrame())
    notebook.write_metrics_and_curves("pfedsd_table2", {}, "pm_acc_mean", "smoke", tmp_path / "res", None, False)
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert written == ["res/curves.csv", "res/metrics.json"]
