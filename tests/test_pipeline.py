"""The pipeline: every paper-profile config starts on stand-in data, the example notebook runs
end to end under papermill (a README sweep point; both in make test-full), the CLI, and the DVC wiring."""
import functools
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pflrepro.federation.build import build_partition
from pflrepro.paths import REPO_ROOT
from pflrepro.pipeline import experiments
from pflrepro.pipeline.store import run
from tests.conftest import FMNIST_AVAILABLE

PARAM_FILES = sorted(p.stem for p in (REPO_ROOT / "params").glob("*.yaml"))


@pytest.mark.parametrize("name", PARAM_FILES)
def test_every_file_has_three_valid_profiles(name):
    for prof in experiments.PROFILES:
        configs = experiments.grid(experiments.load_profile(name, prof))  # validates every config
        assert configs, (name, prof)


def test_paper_profiles_train_on_cuda_where_present_and_the_offline_ones_on_the_cpu():
    """Issue 32: 28 of 39 paper profiles said device 'cpu', so a GPU cluster trained them on one CPU thread. Every
    paper config now says 'auto' (CUDA where available); smoke and mini stay 'cpu' (their runs' addresses, and the
    default repro's bit-identical results on every machine, do not depend on a GPU being present)."""
    for name in PARAM_FILES:
        for prof in experiments.PROFILES:
            devices = {c.device for c in experiments.grid(experiments.load_profile(name, prof)).values()}
            assert devices == ({"auto"} if prof == "paper" else {"cpu"}), (name, prof, devices)


@functools.lru_cache(maxsize=None)   # read once per session: collection builds several parametrizations from it
def _paper_configs():
    """Every distinct paper-profile config of every params file (seeds and configs shared between
    files, e.g. Table 5 rendering Table 2's runs, counted once). All of them are validated by
    test_every_file_has_three_valid_profiles."""
    seen = {}
    for name in PARAM_FILES:
        for (method, setting, seed), cfg in experiments.grid(experiments.load_profile(name, "paper")).items():
            seen.setdefault(cfg.replace(seed=0).key(), (f"{name}:{method}:{setting}", cfg))
    return tuple(seen.values())


def _distinct_items(key):
    out = {}
    for ident, cfg in _paper_configs():
        out.setdefault(key(cfg), (ident, cfg))
    return list(out.values())


def _distinct(key):
    """One case per distinct key; `make test` keeps each paper's first (the rest are `full`): every case builds
    a stand-in at its full size, 1-2 s each on a fast machine (2026-11-27), 68 cases in all."""
    seen: set = set()
    cases = []
    for ident, cfg in _distinct_items(key):
        paper = ident.split(":")[0].split("_")[0]
        cases.append(pytest.param(cfg, id=ident, marks=[pytest.mark.full] if paper in seen else []))
        seen.add(paper)
    return cases


def _code_path(cfg):
    """What decides which code a run executes: architecture(s) (their names fix the input shape and
    classes), algorithm and its non-numeric switches (numeric hyperparameters, lr, participation, alpha,
    clients, epochs only change values; partitions and dataset shapes are covered by the tests below)."""
    hp = tuple(sorted((k, v) for k, v in cfg.hparams.items() if isinstance(v, (str, bool)) or v == 0))
    timing = (cfg.clock.get("protocol"), cfg.clock.get("pm_budget"), cfg.schedule.get("mode"))
    return (cfg.model, tuple(cfg.models or ()), cfg.algorithm, hp, timing)


_START_KEYS = (lambda c: _code_path(c)[2:],                                  # each algorithm path
               lambda c: (c.dataset, c.model, tuple(c.models or ())),        # each architecture (mix)
               lambda c: (c.new_clients > 0,))                              # clients left out of training


def _partition(cfg):
    return (cfg.dataset, cfg.pool, cfg.subsample, cfg.partition, json.dumps(cfg.partition_params, sort_keys=True),
            cfg.n_clients, cfg.split, json.dumps(cfg.split_params, sort_keys=True))


def test_paper_config_counts():
    """Guard for the parametrized start tests below: the paper profiles still yield their >100 configs
    (an emptied or shrunk grid would make those tests pass vacuously), grouped into fewer start cases."""
    configs = _paper_configs()
    assert len(configs) > 100
    cases = _start_cases()
    assert len(cases) < len(configs)  # grouping only ever merges
    started = [c.values[0] for c in cases]
    for key in _START_KEYS[1:]:
        assert {key(c) for _, c in configs} <= {key(c) for c in started}  # every architecture starts
    paths = {_START_KEYS[0](c) for c in started}
    assert all(_START_KEYS[0](c) in paths for _, c in configs)          # and every algorithm path
    assert _STARTED_IN_CI <= {c.id for c in cases}                      # `make test`'s cases still exist


@pytest.mark.parametrize("cfg", _distinct(_partition))
def test_paper_partition_builds_on_standin(cfg):
    """Every paper-profile partition (exact clients, pool size, rule, split) on the shape-identical stand-in."""
    split = build_partition(cfg.replace(dataset=f"fake-{cfg.dataset}"))
    assert len(split["train"]) == cfg.n_clients and all(len(t) > 0 for t in split["train"])


@pytest.mark.parametrize("cfg", _distinct(lambda c: (c.dataset, c.model, tuple(c.models or ()))))
def test_paper_models_run_on_standin_shapes(cfg):
    """Every (dataset, architecture) pair of the paper profiles: a stand-in batch gives one logit per class."""
    from pflrepro.data.datasets import load_dataset
    from pflrepro.data.models import build_model
    raw = load_dataset(f"fake-{cfg.dataset}")
    x = raw.x_train[:4].float()
    for name in (cfg.model, *(cfg.models or ())):
        net = build_model(name, x.shape[1], raw.spec.num_classes, x.shape[-1])
        assert net(x).shape == (4, raw.spec.num_classes), name


# A round of a deep paper model costs seconds a step on 2 cores: an algorithm path whose first paper config
# trains one is started on the smallest network of the same family (residual blocks with batch norm); the deep
# model itself starts with the first algorithm that runs it (its own case below).
_SMALLER = {"resnet18": "resnet8", "resnet34": "resnet8", "mobilenetv2": "resnet8",
            "vgg11": "cnn_ckt", "vgg13": "cnn_ckt"}   # PerFed-CKT's VGGs: its own small CNN (conv, pool, fc)


def _start_cases():
    """One start case per code path: every paper architecture (or architecture mix) with the first algorithm
    that runs on it, every algorithm path (algorithm, its switches, the timing variant) on the first paper
    config that runs it (on a smaller network of the same family where that config trains a deep one), and
    clients left out of training. The cross product adds no code path: an algorithm sees a model only through
    its parameters and its body/head split, which every model offers alike (and every (dataset, model) pair is
    also checked by test_paper_models_run_on_standin_shapes)."""
    out: dict = {}
    for i, key in enumerate(_START_KEYS):
        for ident, cfg in _distinct_items(key):
            if i == 0 and cfg.model in _SMALLER and not cfg.models:
                cfg, ident = cfg.replace(model=_SMALLER[cfg.model]), f"{ident}:{_SMALLER[cfg.model]}"
            out.setdefault(_code_path(cfg) + (cfg.dataset, cfg.new_clients > 0), (ident, cfg, i))
    # `make test` starts the cases in _STARTED_IN_CI (a paper's data shapes, model and paper hyperparameters, one
    # round: 1-3 s each on a fast 2-core machine, 2026-11-27, where the other papers' first cases took 4-16 s and
    # CI's machines ran the suite about 20 times slower). `make test-full` starts every case: every algorithm entry,
    # its switch and timing variants (SCD's E_p, wait-free, ablations and asynchronous servers, pFedSD's
    # regularisers, ...) and a round of each deep architecture (ResNet-18/34/50, MobileNetV2, VGG). In `make test`
    # the algorithms train on Fashion-MNIST in their own tests (learning; a batched round equal to per-client
    # training), and test_paper_models_run_on_standin_shapes checks each paper's first (dataset, architecture) pair
    return [pytest.param(cfg, id=ident, marks=[] if ident in _STARTED_IN_CI else [pytest.mark.full])
            for ident, cfg, _ in out.values()]


_STARTED_IN_CI = {"pfedsd_common:pfedme:default", "scd_common:scd:default:resnet8", "dcpfl_common:local:default",
                  "example:fedavg:20 clients"}


def _classes(cfg) -> int:
    from pflrepro.data.datasets import SPECS
    return SPECS[cfg.dataset].num_classes


@pytest.fixture
def cut_test_sets(monkeypatch):
    """Stand-ins whose global test set is cut to 2% (at least 2 per class of up to 100 classes): evaluating 20 personal
    ResNets on CIFAR's 10,000 test images took 200 of a start case's 250 seconds; iNaturalist's training half
    is cut to 600 images too (its 10,178 through ResNet-50 took 110 s)."""
    from pflrepro.data.datasets import RawDataset
    from pflrepro.federation import build

    real = build.raw_dataset

    def cut(name):
        raw = real(name)
        if not name.startswith("fake-"):
            return raw
        n = max(2 * min(raw.spec.num_classes, 100), len(raw.y_test) // 50)   # iNaturalist's 5,089 classes: 200
        m = 600 if raw.spec.num_classes > 1000 else len(raw.y_train)   # and 600 of its 10,178 training images
        if raw.d_test is None:
            return RawDataset(raw.spec, raw.x_train[:m], raw.y_train[:m], raw.x_test[:n], raw.y_test[:n], source=raw.source)
        import dataclasses

        import torch
        keep = torch.randperm(len(raw.y_test), generator=torch.Generator().manual_seed(0))[:n].sort().values
        return dataclasses.replace(raw, x_test=raw.x_test[keep], y_test=raw.y_test[keep], d_test=raw.d_test[keep])   # every domain keeps some
    monkeypatch.setattr(build, "raw_dataset", cut)


@pytest.mark.parametrize("cfg", _start_cases())
def test_paper_config_starts_on_standin(cfg, tmp_path, cut_test_sets):
    """Every code path of the paper profiles (dataset shapes, model(s), algorithm and variant, batch
    size, clients, partition rule) runs one round on the stand-in; samples and local epochs are cut
    (1% of the pool, 0.2% under plain Dirichlet, one epoch, 2% of the test set) so that it takes seconds."""
    # epochs an algorithm counts itself (FedRep's 10 head + 5 body, SCD's E_p = 5) cut to one as well (0 keeps
    # its meaning "as local_epochs")
    # its own (PerFed-CKT's tau = 50 local steps, FedDF's 100 distillation steps) cut to one as well, and the public
    # set to 100 stand-in images (PerFed-CKT's clients score all of it twice a round)
    hp = {n: 1 if (n.endswith("epochs") or n.endswith("steps") or n == "tau") and isinstance(v, int)
          and not isinstance(v, bool) and v > 1 else v for n, v in cfg.hparams.items()}
    public = {**cfg.public, "dataset": f"fake-{cfg.public['dataset'] or cfg.dataset}",
              "size": min(cfg.public["size"], 100)} if cfg.public.get("size") else cfg.public
    fake = cfg.replace(dataset=f"fake-{cfg.dataset}", rounds=1, subsample=min(cfg.subsample, 0.01), local_epochs=1,
                       hparams=hp, public=public)
    if cfg.partition == "dirichlet":
        # plain Dirichlet over 100 clients leaves clients empty on 1% of the pool: 6 clients on 0.2% of it, each
        # with data (the exact partition is built at full size by test_paper_partition_builds_on_standin), and
        # batches of at least 50, so that every epoch is one step (batch size and clients change values, not
        # code paths)
        # iNaturalist's stand-in (cut to 600 images of 5,089 classes by `cut_test_sets`): SCD code's multinomial
        # allocation, since splitting a class of one image by exact proportions gives it to the last client
        many = _classes(cfg) > 1000
        fake = fake.replace(n_clients=6, new_clients=min(cfg.new_clients, 2), batch_size=max(cfg.batch_size, 50),
                            subsample=min(cfg.subsample, 0.002 * max(1, _classes(cfg) // 30)),
                            partition_params={**cfg.partition_params, "min_size": 1,
                                              **({"allocation": "sample"} if many else {})})
    if cfg.partition == "lognormal":
        # FedRep's FEMNIST deals 150 x 148 images; 2% of the stand-in (80 a class) holds 150 clients of 3 on average
        fake = fake.replace(subsample=min(cfg.subsample, 0.02), partition_params={**cfg.partition_params, "mean_size": 3})
    if cfg.split == "global_test_by_proportion":
        # SCD's local tests draw |test| / |train| of each class a client holds: on 1 % of the pool and 2 % of the test
        # set, no client would get one (refused before round 1, build_context): draw as many as it trains on
        fake = fake.replace(split_params={**cfg.split_params, "scale": 1.0})
    res = run(fake, root=tmp_path, progress=False)
    assert len(res.history) == 1 and res.history[0]["round"] == 1
    assert math.isfinite(res.history[0]["train_loss"])


# the README's papermill sweep, point by point on the smoke profile, each through papermill and its own kernel (two
# processes: 14 s a point on a fast machine, about 160 s on a slow CI-like one, 2026-11-27): in `make test-full`;
# lr = 0.05 is not the profile's 0.01, so the override is seen reaching the runs. `make test` starts papermill's
# kernel in test_notebooks.py::test_papermill_refuses_an_unknown_parameter_end_to_end
@pytest.mark.skipif(not FMNIST_AVAILABLE, reason="needs offline Fashion-MNIST")
@pytest.mark.full
@pytest.mark.parametrize("lr", [0.01, 0.05])
def test_example_notebook_sweep_point(tmp_path, lr):
    nb = REPO_ROOT / "notebooks" / "example.ipynb"
    out = tmp_path / f"lr{lr}"
    out.mkdir()
    cmd = [sys.executable, "-m", "papermill", str(nb), str(out / "example.ipynb"), "-p", "profile", "smoke",
           "-p", "out_dir", str(out), "-p", "progress", "False", "-y", yaml.safe_dump({"overrides": {"base": {"lr": lr}}})]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=1800,   # cwd elsewhere: paths
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PFLREPRO_JOBS": "1"})  # resolve from repo root
    assert proc.returncode == 0, proc.stderr[-3000:]
    for f in ("table.md", "table.csv", "runs.csv", "provenance.json", "figures/learning_curves.png", "figures/partition.png",
              "metrics.json", "curves.csv"):                    # the last two: the stage's DVC metrics and plots
        assert (out / f).stat().st_size > 0, f
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["profile"] == "smoke" and len(prov["runs"]) == 3
    table = (out / "table.md").read_text()
    assert "profile=smoke" in table and "90.15" in table  # paper value shown beside
    assert {json.loads(p.read_text())["lr"] for p in (out / "runs").glob("*/config.json")} == {lr}
    smoke = yaml.safe_load((REPO_ROOT / "params" / "example.yaml").read_text())["profiles"]["smoke"]
    assert smoke["base"]["lr"] != 0.05   # make test's point is not the profile's own lr: the override did reach the runs


def test_cli_list_and_config_error(capsys):
    """In this process (a Python subprocess took 80 s to start on a slow CI-like machine, 2026-11-27): `python -m
    pflrepro` itself runs in tests/test_readme.py's CLI commands."""
    from pflrepro.__main__ import main
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "fedprox" in out and "balanced_dirichlet" in out
    assert main(["run", "lr=-1"]) == 2 and "lr=-1.0: must be > 0.0" in capsys.readouterr().err


def _make_notebooks():
    """scripts/make_notebooks.py (not a package: loaded from its path)."""
    spec = importlib.util.spec_from_file_location("make_notebooks", REPO_ROOT / "scripts" / "make_notebooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_dvc_yaml_and_notebooks_are_in_step():
    """`make_notebooks.py --check`: dvc.yaml is what the script writes from notebooks/, and every notebook has its
    parameters cell, its Experiment, E.finish() last and no outputs."""
    mk = _make_notebooks()
    assert mk.problems() == []
    assert mk.main(["--check"]) == 0


def test_the_check_finds_what_is_out_of_step(tmp_path, monkeypatch):
    """A notebook without E.finish(), with outputs, or naming another notebook's Experiment is reported; so is a
    dvc.yaml that is not what the script writes."""
    mk = _make_notebooks()
    nb = mk.skeleton("pfedsd_table2", "Table 2")
    assert mk.notebook_problems("pfedsd_table2", nb) == []
    bad = json.loads(json.dumps(nb))
    bad["cells"][-1]["source"] = ["print('done')\n"]
    bad["cells"][3]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["x"]}]
    found = mk.notebook_problems("pfedsd_table3", bad)
    assert len(found) == 3 and any("E.finish()" in p for p in found) and any("outputs" in p for p in found)
    monkeypatch.setattr(mk, "dvc_yaml_text", lambda: "stages: {}\n")
    assert any("dvc.yaml differs" in p for p in mk.problems())


def test_a_new_notebook_skeleton_gets_a_stage(tmp_path, monkeypatch):
    """`--new NAME TITLE` writes a notebook in step, never overwrites one, and the stage it gets trains and writes
    DVC metrics."""
    mk = _make_notebooks()
    monkeypatch.setattr(mk, "ROOT", tmp_path)
    (tmp_path / "notebooks").mkdir()
    assert mk.main(["--new", "mypaper_table1", "My Table 1"]) == 0
    assert mk.main(["--new", "mypaper_table1", "again"]) == 2
    nb = json.loads((tmp_path / "notebooks" / "mypaper_table1.ipynb").read_text())
    assert mk.notebook_problems("mypaper_table1", nb) == [] and mk.trains("mypaper_table1")


def _renders(dvc: dict) -> dict[str, str]:
    """notebook -> the stage that renders it (the one with its results/<name> output)."""
    return {o[len("results/"):]: s for s, st in dvc.items() for o in st.get("outs", [])
            if isinstance(o, str) and o.startswith("results/") and o.count("/") == 1 and s != "report"}


def _names(nb: str, cmd: str) -> bool:
    """A stage's command renders this notebook (`pflrepro render ... NAME ...`, or papermill on it)."""
    return nb in cmd.split() or f"notebooks/{nb}.ipynb" in cmd.split()


def test_dvc_stages_cover_every_notebook_and_params():
    dvc = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())["stages"]
    whole = _make_notebooks().WHOLE_PARAMS   # the stages whose params files are all DVC params
    notebooks = sorted(p.stem for p in (REPO_ROOT / "notebooks").glob("*.ipynb"))
    owner = _renders(dvc)
    for nbname in notebooks:
        assert nbname in owner, f"notebook {nbname} has no DVC stage"
        st = dvc[owner[nbname]]
        assert f"notebooks/{nbname}.ipynb" in st["deps"]
        assert _names(nbname, st["cmd"]), (nbname, st["cmd"])
        tracked = {next(iter(p)) for p in st["params"]}   # a params file is a dep, or (WHOLE_PARAMS) all its values
        assert f"params/{nbname}.yaml" in set(st["deps"]) | tracked, nbname    # are DVC params
        for p in st["params"]:   # a paper stage's DVC params: only the `profile` key (dvc.lock stays small)
            if nbname not in whole:
                assert next(iter(p.values())) == ["profile"] and next(iter(p)) in st["deps"], nbname
        assert f"figures/{nbname}" in st["outs"]
        assert not {d for d in st["deps"] if d.startswith("results/")} & set(st["outs"])   # DVC: no stage reads its own
    for nbname in notebooks:  # a stage declaring DVC metrics has a notebook that writes them (the full repro once
        if {f"metrics/{nbname}.json": {"cache": False}} in dvc[owner[nbname]].get("metrics", []):   # failed at the
            src = (REPO_ROOT / "notebooks" / f"{nbname}.ipynb").read_text()   # example stage: its hand-written
            assert "E.finish()" in src or "write_metrics_and_curves(" in src, nbname   # notebook never did)
    for nbname in notebooks:  # committed clean: outputs come from dvc repro
        assert '"output_type"' not in (REPO_ROOT / "notebooks" / f"{nbname}.ipynb").read_text()


def test_each_paper_trains_its_runs_in_one_stage_before_its_notebooks():
    """train_<paper> lists every notebook of that paper that trains and reads all their params files; render_<paper>
    renders every notebook of the paper, after the train stage's manifest (so DVC runs it after)."""
    dvc = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())["stages"]
    train = {s[len("train_"):]: st for s, st in dvc.items() if s.startswith("train_")}
    render = {s[len("render_"):]: st for s, st in dvc.items() if s.startswith("render_")}
    assert set(train) == set(render) == {"pfedsd", "dcpfl", "scd", "fedbsd", "perfed_ckt"}
    with_runs = set()
    for paper, st in render.items():
        names = st["cmd"].split()[4:]
        assert st["cmd"].startswith("python -m pflrepro render ") and names
        assert sorted(names) == sorted(p.stem for p in (REPO_ROOT / "notebooks").glob(f"{paper}_*.ipynb")), paper
        assert [d for d in st["deps"] if d.startswith("results/train/")] == [f"results/train/{paper}.json"], paper
        trained = train[paper]["cmd"].split("--out")[0].split()[4:]
        assert set(trained) <= set(names), paper
        assert {f"params/{n}.yaml" for n in trained} <= set(train[paper]["deps"]), paper
        assert {next(iter(p)) for p in st["plots"]} == {f"metrics/{n}.curves.csv" for n in trained}, paper
        with_runs |= set(trained)
    assert with_runs == {n for n in _renders(dvc) if n != "example" and _make_notebooks().trains(n)}


def test_every_training_stage_has_its_curves_as_a_dvc_plot():
    """`dvc plots show` draws metrics/<name>.curves.csv (written by Experiment.finish, checked on every notebook
    in tests/test_notebooks.py; an uncached plots output of the stage that renders the notebook, committed like its
    metrics) with the committed template, one line per curve."""
    doc = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())
    plots = {next(iter(p)): next(iter(p.values())) for p in doc["plots"]}
    drawn = set()
    for name, st in doc["stages"].items():
        metrics = {next(iter(m)) for m in st.get("metrics", [])}
        for p in st.get("plots", []):   # the notebooks with runs (the report has metrics, no curves)
            path, = p
            nb = path[len("metrics/"):-len(".curves.csv")]
            spec = plots[path]
            assert (spec["x"], spec["template"]) == ("round", "curves"), nb
            assert spec["y"] == experiments.read_params(nb).get("metric", "pm_acc_mean"), nb
            assert p == {path: {"cache": False}} and f"metrics/{nb}.json" in metrics, nb   # curves and metrics both
            drawn.add(nb)
        if name != "report":
            assert metrics == {f"metrics/{nb}.json" for nb in drawn if _names(nb, st["cmd"])}, name
    assert drawn == {next(iter(p))[len("metrics/"):-len(".curves.csv")] for p in doc["plots"]}
    template = json.loads((REPO_ROOT / ".dvc" / "plots" / "curves.json").read_text())
    assert template["encoding"]["color"]["field"] == "curve" and template["data"]["values"] == "<DVC_METRIC_DATA>"


def test_dvc_plots_show_draws_every_stage_in_a_fresh_clone(tmp_path):
    """Issue 33: `dvc plots show` failed in a fresh clone (the curves were stage outputs, not in git, and there is no
    remote). The committed curves draw there: every training stage's, with data and no error."""
    dvc = Path(sys.executable).with_name("dvc")
    if not dvc.exists():
        pytest.skip("dvc is not installed beside this Python")
    subprocess.run(["git", "clone", "-q", str(REPO_ROOT), str(tmp_path / "clone")], check=True)
    out = subprocess.run([str(dvc), "plots", "show", "--json"], cwd=tmp_path / "clone", capture_output=True,
                         text=True, env={**os.environ, "DVC_NO_ANALYTICS": "1"}, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout)
    assert not doc.get("errors"), doc.get("errors")
    shown = {k.split("::", 1)[-1]: v for k, v in doc["data"].items()}
    stages = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())["stages"]
    wanted = {next(iter(p)) for st in stages.values() for p in st.get("plots", [])}
    assert wanted <= set(shown), wanted - set(shown)
    for path in wanted:   # each drawn with its rows (round, curve, the stage's metric)
        values = shown[path][0]["content"]["data"]["values"]
        assert values and {"round", "curve"} <= set(values[0]), path


def test_dvc_lock_records_the_code_and_params_at_head():
    """The committed dvc.lock is what `dvc repro` produced from this very code and these params: `dvc status` on a
    fresh clone may say outputs and the data cache are missing (nothing ran here), never that a stage's code,
    notebook, params or paper numbers changed since the lock was written (refresh it: `dvc repro`, then commit
    dvc.lock)."""
    dvc = Path(sys.executable).with_name("dvc")
    if not dvc.exists():
        pytest.skip("dvc is not installed next to this Python")
    r = subprocess.run([str(dvc), "status", "--json"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-2000:]
    stale = {}
    for stage, changes in json.loads(r.stdout or "{}").items():
        for change in changes:
            if isinstance(change, str):                       # "changed command", "always changed", ...
                stale.setdefault(stage, []).append(change)
                continue
            deps = change.get("changed deps", {})
            stale_deps = [d for d in deps if d.split("/")[0] in ("pflrepro", "notebooks", "params", "paper_numbers")]
            if stale_deps:
                stale.setdefault(stage, []).extend(f"{d}: {deps[d]}" for d in stale_deps)
    assert not stale, f"dvc.lock is older than the code or params: {stale}"


def test_dvc_lock_stays_small():
    """DVC parses dvc.lock two or three times and rewrites it at every stage it runs (ruamel, pure Python: ~1 s per
    100 KB). With every params value tracked it was 350 KB, about 8 s a stage and 6 minutes of a default repro;
    params files are file deps now and `profile` the only DVC param of a paper stage."""
    size = (REPO_ROOT / "dvc.lock").stat().st_size
    assert size < 120_000, f"dvc.lock is {size:,} bytes: is a stage tracking whole params files again?"


def test_report_stage_runs_after_every_table():
    dvc = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())["stages"]
    deps = set(dvc["report"]["deps"])
    for nbname in (p.stem for p in (REPO_ROOT / "notebooks").glob("*.ipynb")):
        if nbname != "example":
            assert f"results/{nbname}" in deps and f"figures/{nbname}" in deps, nbname


def test_a_paper_plugin_or_algorithm_change_marks_only_the_stages_that_read_it():
    """Issue 55: every stage depended on all of `pflrepro`, so editing one paper's plugin marked every paper's stages
    changed. Now no stage depends on the whole package; a paper's plugin is a dependency of its own render stage
    only, and an algorithm file only of the stages whose runs execute it (FedBSD's algorithm: FedBSD's stages)."""
    import yaml
    stages = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())["stages"]
    deps = {name: set(s.get("deps", [])) for name, s in stages.items()}
    assert not any("pflrepro" in d for d in deps.values())
    for paper in ("pfedsd", "scd", "fedbsd", "perfed_ckt"):
        readers = {n for n, d in deps.items() if f"pflrepro/papers/{paper}.py" in d}
        assert readers == {f"render_{paper}"}, (paper, readers)
    readers = {n for n, d in deps.items() if "pflrepro/algorithms/fedbsd.py" in d}
    assert readers == {"train_fedbsd"}, readers      # its render stage reads the runs through the train manifest
    assert "results/train/fedbsd.json" in deps["render_fedbsd"]
    assert {"pflrepro/core", "pflrepro/data", "pflrepro/federation", "pflrepro/settings.py"} <= deps["train_pfedsd"]
    assert "pflrepro/reporting" not in deps["train_pfedsd"] and "pflrepro/reporting" in deps["render_pfedsd"]
