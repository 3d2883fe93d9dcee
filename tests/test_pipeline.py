"""The pipeline: every paper-profile config starts on stand-in data, the example notebook runs
end to end under papermill, a two-point papermill sweep, the CLI, and the DVC wiring."""
import json
import math
import subprocess
import sys

import pytest
import yaml

from pflrepro import experiments
from pflrepro.runs import REPO_ROOT, build_partition, run
from tests.conftest import FMNIST_AVAILABLE

PARAM_FILES = sorted(p.stem for p in (REPO_ROOT / "params").glob("*.yaml"))


@pytest.mark.parametrize("name", PARAM_FILES)
def test_every_file_has_three_valid_profiles(name):
    for prof in experiments.PROFILES:
        configs = experiments.grid(experiments.load_profile(name, prof))  # validates every config
        assert configs, (name, prof)


def _paper_configs():
    """Every distinct paper-profile config of every params file (seeds and configs shared between
    files, e.g. Table 5 rendering Table 2's runs, counted once). All of them are validated by
    test_every_file_has_three_valid_profiles."""
    seen = {}
    for name in PARAM_FILES:
        for (method, setting, seed), cfg in experiments.grid(experiments.load_profile(name, "paper")).items():
            seen.setdefault(cfg.replace(seed=0).key(), (f"{name}:{method}:{setting}", cfg))
    return list(seen.values())


def _distinct(key):
    out = {}
    for ident, cfg in _paper_configs():
        out.setdefault(key(cfg), (ident, cfg))
    return [pytest.param(cfg, id=ident) for ident, cfg in out.values()]


def _code_path(cfg):
    """What decides which code a run executes: architecture(s) (their names fix the input shape and
    classes), algorithm and its non-numeric switches (numeric hyperparameters, lr, participation, alpha,
    clients, epochs only change values; partitions and dataset shapes are covered by the tests below)."""
    hp = tuple(sorted((k, v) for k, v in cfg.hparams.items() if isinstance(v, (str, bool)) or v == 0))
    timing = (cfg.clock.get("protocol"), cfg.clock.get("pm_budget"), cfg.schedule.get("mode"), cfg.new_clients > 0)
    return (cfg.model, tuple(cfg.models or ()), cfg.algorithm, hp, timing)


def _partition(cfg):
    return (cfg.dataset, cfg.pool, cfg.subsample, cfg.partition, json.dumps(cfg.partition_params, sort_keys=True),
            cfg.n_clients, cfg.split, json.dumps(cfg.split_params, sort_keys=True))


def test_paper_config_counts():
    """Guard for the parametrized start tests below: the paper profiles still yield their >100 configs
    (an emptied or shrunk grid would make those tests pass vacuously), grouped into fewer start cases."""
    configs = _paper_configs()
    assert len(configs) > 100
    assert len(_distinct(_code_path)) < len(configs)  # grouping only ever merges


@pytest.mark.parametrize("cfg", _distinct(_partition))
def test_paper_partition_builds_on_standin(cfg):
    """Every paper-profile partition (exact clients, pool size, rule, split) on the shape-identical stand-in."""
    split = build_partition(cfg.replace(dataset=f"fake-{cfg.dataset}"))
    assert len(split["train"]) == cfg.n_clients and all(len(t) > 0 for t in split["train"])


@pytest.mark.parametrize("cfg", _distinct(lambda c: (c.dataset, c.model, tuple(c.models or ()))))
def test_paper_models_run_on_standin_shapes(cfg):
    """Every (dataset, architecture) pair of the paper profiles: a stand-in batch gives one logit per class."""
    from pflrepro.data import load_dataset
    from pflrepro.models import build_model
    raw = load_dataset(f"fake-{cfg.dataset}")
    x = raw.x_train[:4].float()
    for name in (cfg.model, *(cfg.models or ())):
        net = build_model(name, x.shape[1], raw.spec.num_classes, x.shape[-1])
        assert net(x).shape == (4, raw.spec.num_classes), name


@pytest.mark.parametrize("cfg", _distinct(_code_path))
def test_paper_config_starts_on_standin(cfg, tmp_path):
    """Every code path of the paper profiles (dataset shapes, model(s), algorithm and variant, batch
    size, clients, partition rule) runs one round on the stand-in; samples and local epochs are cut
    (1% of the pool, one epoch) so that it takes seconds."""
    fake = cfg.replace(dataset=f"fake-{cfg.dataset}", rounds=1, subsample=min(cfg.subsample, 0.01), local_epochs=1)
    if cfg.partition == "dirichlet":
        # plain Dirichlet over 100 clients leaves clients empty on 1% of the pool: 20 clients, each with data
        # (the exact partition is built at full size by test_paper_partition_builds_on_standin), and batches
        # of at least 50 (batch size changes values, not code paths)
        fake = fake.replace(n_clients=20, new_clients=min(cfg.new_clients, 4), batch_size=max(cfg.batch_size, 50),
                            partition_params={**cfg.partition_params, "min_size": 1})
    res = run(fake, root=tmp_path, progress=False)
    assert len(res.history) == 1 and res.history[0]["round"] == 1
    assert math.isfinite(res.history[0]["train_loss"])


@pytest.mark.skipif(not FMNIST_AVAILABLE, reason="needs offline Fashion-MNIST")
def test_example_notebook_and_two_point_sweep(tmp_path):
    nb = REPO_ROOT / "notebooks" / "example.ipynb"
    for lr in (0.01, 0.05):  # the README's papermill sweep, over the smoke profile
        out = tmp_path / f"lr{lr}"
        cmd = [sys.executable, "-m", "papermill", str(nb), str(out / "example.ipynb"), "-p", "profile", "smoke",
               "-p", "out_dir", str(out), "-p", "progress", "False", "-y", yaml.safe_dump({"overrides": {"base": {"lr": lr}}})]
        out.mkdir()
        r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True)  # cwd elsewhere: paths resolve from repo root
        assert r.returncode == 0, r.stderr[-3000:]
        for f in ("table.md", "table.csv", "runs.csv", "provenance.json", "figures/learning_curves.png", "figures/partition.png"):
            assert (out / f).stat().st_size > 0, f
        prov = json.loads((out / "provenance.json").read_text())
        assert prov["profile"] == "smoke" and len(prov["runs"]) == 3
        table = (out / "table.md").read_text()
        assert "profile=smoke" in table and "90.15" in table  # paper value shown beside
    lrs = set()
    for lr in (0.01, 0.05):
        cfgs = [json.loads(p.read_text())["lr"] for p in (tmp_path / f"lr{lr}" / "runs").glob("*/config.json")]
        lrs |= set(cfgs)
    assert lrs == {0.01, 0.05}


def test_cli_list_and_config_error():
    r = subprocess.run([sys.executable, "-m", "pflrepro", "list"], capture_output=True, text=True, cwd=REPO_ROOT)
    assert r.returncode == 0 and "fedprox" in r.stdout and "balanced_dirichlet" in r.stdout
    r = subprocess.run([sys.executable, "-m", "pflrepro", "run", "lr=-1"], capture_output=True, text=True, cwd=REPO_ROOT)
    assert r.returncode == 2 and "lr=-1.0: must be > 0.0" in r.stderr


def test_dvc_stages_cover_every_notebook_and_params():
    dvc = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())["stages"]
    notebooks = sorted(p.stem for p in (REPO_ROOT / "notebooks").glob("*.ipynb"))
    for nbname in notebooks:
        assert nbname in dvc, f"notebook {nbname} has no DVC stage"
        st = dvc[nbname]
        assert f"notebooks/{nbname}.ipynb" in st["deps"]
        assert any(f"params/{nbname}.yaml" in (p if isinstance(p, str) else next(iter(p))) for p in st["params"])
        outs = [o if isinstance(o, str) else next(iter(o)) for o in st["outs"]]
        assert f"figures/{nbname}" in outs
    for nbname in notebooks:  # committed clean: outputs come from dvc repro
        assert '"output_type"' not in (REPO_ROOT / "notebooks" / f"{nbname}.ipynb").read_text()


def test_report_stage_runs_after_every_table():
    dvc = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())["stages"]
    deps = set(dvc["report"]["deps"])
    for nbname in (p.stem for p in (REPO_ROOT / "notebooks").glob("*.ipynb")):
        if nbname != "example":
            assert f"results/{nbname}" in deps and f"figures/{nbname}" in deps, nbname
