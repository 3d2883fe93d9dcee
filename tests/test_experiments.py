"""Params files: inheritance, per-dataset choices, source files, and the report helpers on hand-made runs."""
import numpy as np
import pandas as pd
import pytest

from pflrepro.params import ConfigError
from pflrepro.pipeline import executors, experiments
from pflrepro.reporting import tables as report
from tests.conftest import FMNIST_AVAILABLE


@pytest.fixture
def params_dir(tmp_path, monkeypatch):
    (tmp_path / "params").mkdir()
    monkeypatch.setattr(experiments, "REPO_ROOT", tmp_path)
    return tmp_path / "params"


PARENT = """
profile: mini
metric: pm_acc_mean
profiles:
  mini:
    seeds: [0, 1]
    base: {dataset: fmnist, n_clients: 4, rounds: 2, lr: 0.05, partition: iid}
    methods: {fedavg: {}, fedprox: {}}
    per_dataset:
      fmnist: {"*": {model: mlp}, fedprox: {hparams: {mu: 0.001}}}
      cifar10: {"*": {model: cnn_cifar10}, fedprox: {hparams: {mu: 0.01}}}
"""


def test_inherit_merges_base_and_replaces_settings_methods_seeds(params_dir):
    (params_dir / "parent.yaml").write_text(PARENT)
    (params_dir / "child.yaml").write_text("""
inherit: parent
paper_table: t
profiles:
  mini:
    seeds: [7]
    base: {rounds: 3}
    settings:
      a: {n_clients: 6}
      b: {dataset: cifar10, per_method: {fedprox: {hparams: {mu: 0.5}}}}
""")
    p = experiments.load_profile("child")
    assert p["seeds"] == [7] and p["paper_table"] == "t" and p["metric"] == "pm_acc_mean"
    assert p["base"] == {"dataset": "fmnist", "n_clients": 4, "rounds": 3, "lr": 0.05, "partition": "iid"}
    g = experiments.grid(p)
    assert set(g) == {(m, s, 7) for m in ("fedavg", "fedprox") for s in ("a", "b")}
    a, b = g[("fedprox", "a", 7)], g[("fedprox", "b", 7)]
    assert (a.model, a.n_clients, a.rounds, a.hparams["mu"]) == ("mlp", 6, 3, 0.001)     # per_dataset fmnist
    assert (b.model, b.n_clients, b.hparams["mu"]) == ("cnn_cifar10", 4, 0.5)           # setting.per_method wins
    assert g[("fedavg", "b", 7)].model == "cnn_cifar10"                                  # "*" applies to every method


def test_setting_overrides_per_dataset_star(params_dir):
    (params_dir / "parent.yaml").write_text(PARENT)
    (params_dir / "c.yaml").write_text("inherit: parent\nprofiles:\n  mini:\n    settings:\n      r: {model: resnet8}\n")
    assert {c.model for c in experiments.grid(experiments.load_profile("c")).values()} == {"resnet8"}


def test_a_setting_may_run_some_methods_only(params_dir):
    (params_dir / "parent.yaml").write_text(PARENT)
    (params_dir / "sweep.yaml").write_text("inherit: parent\nprofiles:\n  mini:\n    settings:\n"
                                           "      a: {}\n      b: {n_clients: 6, methods: [fedprox]}\n")
    g = experiments.grid(experiments.load_profile("sweep"))
    assert {(m, s) for m, s, _ in g} == {("fedavg", "a"), ("fedprox", "a"), ("fedprox", "b")}
    assert g[("fedprox", "b", 0)].n_clients == 6
    (params_dir / "typo.yaml").write_text("inherit: parent\nprofiles:\n  mini:\n    settings:\n"
                                          "      b: {methods: [fedprx]}\n")
    with pytest.raises(ConfigError, match=r"setting=b: methods \['fedprx'\] are not in the profile's methods"):
        experiments.grid(experiments.load_profile("typo"))


def test_source_file_uses_the_source_profiles(params_dir):
    (params_dir / "parent.yaml").write_text(PARENT)
    (params_dir / "view.yaml").write_text("source: parent\nscale: x\n")
    p = experiments.load_profile("view")
    assert p["scale"] == "x" and p["source"] == "parent"
    assert {k: c.key() for k, c in experiments.grid(p).items()} == \
        {k: c.key() for k, c in experiments.grid(experiments.load_profile("parent")).items()}


def test_params_errors_are_clear(params_dir):
    (params_dir / "a.yaml").write_text("inherit: b\n")
    (params_dir / "b.yaml").write_text("inherit: a\n")
    with pytest.raises(ConfigError, match="cycle"):
        experiments.load_profile("a")
    (params_dir / "p.yaml").write_text(PARENT)
    with pytest.raises(ConfigError, match="defines mini"):
        experiments.load_profile("p", "paper")
    (params_dir / "bad.yaml").write_text("inherit: p\nprofiles:\n  mini:\n    setings: {}\n")
    with pytest.raises(ConfigError, match="setings: unknown key"):
        experiments.load_profile("bad")
    with pytest.raises(ConfigError, match="does not exist"):
        experiments.load_profile("nope")


def test_misspelt_file_keys_and_metrics_stop_before_any_run(params_dir):
    """`profle: smoke` was ignored (the default profile ran) and `metric: pm_acc_maen` failed with a KeyError after
    every run had trained (issue 16): both stop at reading the params, naming the key and what is allowed."""
    (params_dir / "p.yaml").write_text(PARENT)
    (params_dir / "typo.yaml").write_text("inherit: p\nprofle: smoke\n")
    with pytest.raises(ConfigError, match=r"params/typo.yaml: profle: unknown key \(did you mean 'profile'\?\)"):
        experiments.load_profile("typo")
    (params_dir / "m.yaml").write_text("inherit: p\nmetric: pm_acc_maen\n")
    with pytest.raises(ConfigError, match=r"metric='pm_acc_maen': unknown key \(did you mean 'pm_acc_mean'\?\); "
                                          r"allowed: gm_acc, pm_acc_mean"):
        experiments.load_profile("m")
    (params_dir / "ok.yaml").write_text("inherit: p\nmetric: gm_acc\n")
    assert experiments.load_profile("ok")["metric"] == "gm_acc"


@pytest.mark.skipif(not FMNIST_AVAILABLE, reason="needs offline Fashion-MNIST")
def test_a_grid_needing_a_missing_dataset_stops_before_its_first_run(tmp_path, monkeypatch, store):
    """A paper grid whose later rows need CIFAR-10 (absent here) trained its Fashion-MNIST rows for hours before
    failing: the local executor loads every dataset the runs read before training any of them."""
    from pflrepro.data import datasets as data
    from pflrepro.federation.config import RunConfig
    from pflrepro.pipeline import executors
    monkeypatch.setenv("PFLREPRO_DATA", str(tmp_path / "no-data"))
    fm = RunConfig.from_dict({"dataset": "fmnist", "subsample": 0.01, "n_clients": 2, "rounds": 1})
    cifar = fm.replace(dataset="cifar10")
    trained = []
    monkeypatch.setattr("pflrepro.pipeline.parallel.train_all", lambda configs, *a, **k: trained.extend(configs))
    with pytest.raises(data.DatasetUnavailable, match="cifar10"):
        executors.LocalExecutor(1).train_all([fm, cifar], tmp_path / "runs")
    assert trained == []
    executors.LocalExecutor(1).train_all([fm], tmp_path / "runs")   # what is there passes the check
    assert trained == [fm]


def test_rounds_to_reach_hand_made_curves():
    rows = []
    for m, accs in {"fedper": [10, 40, 60, 70], "pfedsd": [30, 65, 72, 80]}.items():
        rows += [{"method": m, "setting": "s", "seed": 0, "round": r + 1, "acc": a} for r, a in enumerate(accs)]
    out = report.rounds_to_reach(pd.DataFrame(rows), "fedper", "pfedsd", "acc")
    assert out.loc[0, "target_acc"] == 70 and out.loc[0, "rounds"] == 3 and out.loc[0, "speedup"] == pytest.approx(4 / 3)
    out = report.rounds_to_reach(pd.DataFrame(rows), "pfedsd", "fedper", "acc")   # never reaches 80
    assert np.isnan(out.loc[0, "rounds"])


def test_spread_is_std_across_clients_then_mean_over_seeds():
    c = pd.DataFrame({"dataset": "d", "setting": "s", "method": "m", "seed": [0, 0, 1, 1],
                      "accuracy": [50.0, 70.0, 60.0, 60.0]})
    out = report.spread(c)
    assert out.loc[0, "mean"] == 60.0 and out.loc[0, "std"] == pytest.approx((10.0 + 0.0) / 2)


def test_paper_setting_strips_dataset_prefix():
    assert report.paper_setting("fmnist 20 clients", "fmnist") == "20 clients"
    assert report.paper_setting("r=20%", "fmnist") == "r=20%"


def test_switching_partition_rule_drops_the_other_rules_params():
    from pflrepro.pipeline.experiments import merge_run
    base = {"partition": "balanced_dirichlet", "partition_params": {"alpha": 0.1}, "split_params": {"fractions": [0.8, 0.2]}}
    got = merge_run(base, {"partition": "shards", "partition_params": {"s": 2}})
    assert got["partition_params"] == {"s": 2} and got["split_params"] == {"fractions": [0.8, 0.2]}
    assert merge_run(base, {"partition_params": {"min_frac": 0.3}})["partition_params"] == {"alpha": 0.1, "min_frac": 0.3}


@pytest.mark.skipif(not FMNIST_AVAILABLE, reason="needs offline Fashion-MNIST")
def test_train_notebooks_trains_shared_runs_once_and_lists_them(params_dir, store):
    (params_dir / "parent.yaml").write_text(PARENT.replace("n_clients: 4", "n_clients: 4, subsample: 0.01")
                                            .replace("seeds: [0, 1]", "seeds: [0]"))
    (params_dir / "view.yaml").write_text("source: parent\n")                 # the same runs, rendered again
    (params_dir / "more.yaml").write_text("inherit: parent\nprofiles:\n  mini:\n    methods: {fedavg: {}, local: {}}\n")
    m = experiments.train_notebooks(["parent", "view", "more"], progress=False)
    want = {n: sorted(experiments.run_dir(c, store / "runs").name for c in experiments.grid(experiments.load_profile(n)).values())
            for n in ("parent", "view", "more")}
    assert m["notebooks"] == want and m["notebooks"]["view"] == m["notebooks"]["parent"]
    stored = sorted(p.parent.name for p in (store / "runs").glob("*/summary.json"))
    assert stored == sorted(set(want["parent"]) | set(want["more"])) and len(stored) == 3   # fedavg shared by all three
    stamp = {p: p.stat().st_mtime_ns for p in (store / "runs").glob("*/summary.json")}
    assert experiments.train_notebooks(["more"], progress=False)["notebooks"]["more"] == want["more"]
    assert stamp == {p: p.stat().st_mtime_ns for p in (store / "runs").glob("*/summary.json")}  # found, not retrained


@pytest.mark.parametrize("call, near", [
    (lambda: experiments.load_profile("pfedsd_tabel2"), "'pfedsd_table2'"),
    (lambda: experiments.load_profile("pfedsd_table2", "mni"), "'mini'"),
    (lambda: executors.resolve("stackd", None, []), "'stacked'"),
])
def test_notebook_profile_and_executor_typos_get_did_you_mean(call, near):
    with pytest.raises(ConfigError) as e:
        call()
    assert f"(did you mean {near}?)" in str(e.value), str(e.value)


def test_methods_extend_adds_to_an_inherited_list_instead_of_replacing_it(tmp_path, monkeypatch):
    """An inheriting file's `methods:` replaces its parent's list whole (the documented rule); `methods_extend:` adds to
    it, and a method already listed gets the extension's overrides merged into its own."""
    (tmp_path / "params").mkdir()
    (tmp_path / "params" / "parent.yaml").write_text(
        "profiles:\n  mini:\n    seeds: [0]\n    base: {rounds: 2}\n    methods: {fedavg: {}, fedprox: {hparams: {mu: 0.1}}}\n")
    (tmp_path / "params" / "replaces.yaml").write_text("inherit: parent\nprofiles:\n  mini:\n    methods: {ditto: {}}\n")
    (tmp_path / "params" / "extends.yaml").write_text(
        "inherit: parent\nprofiles:\n  mini:\n    methods_extend: {ditto: {}, fedprox: {lr: 0.5}}\n")
    (tmp_path / "params" / "bad.yaml").write_text("inherit: parent\nprofiles:\n  mini:\n    methods_extend: [ditto]\n")
    monkeypatch.setattr(experiments, "REPO_ROOT", tmp_path)
    assert list(experiments.load_profile("replaces", "mini")["methods"]) == ["ditto"]
    p = experiments.load_profile("extends", "mini")
    assert list(p["methods"]) == ["fedavg", "fedprox", "ditto"] and "methods_extend" not in p
    assert p["methods"]["fedprox"] == {"hparams": {"mu": 0.1}, "lr": 0.5}
    with pytest.raises(ConfigError, match=r"methods_extend=\['ditto'\]: expected a mapping"):
        experiments.load_profile("bad", "mini")
