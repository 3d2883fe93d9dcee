"""`train`, `cost` and `tune` take `run`'s key=value settings (issue 32): the last layer of every config of the grid,
`seeds=[..]` for the profile's seeds, refused in one line before anything trains or the run store is written. No test
here trains: grids are built and checked, training and costing are replaced by recorders."""
import json
from types import SimpleNamespace

import pytest
import yaml

from pflrepro import cli
from pflrepro.params import ConfigError
from pflrepro.pipeline import budget, experiments, tune
from pflrepro.pipeline.store import run_dir

PARAMS = """
profile: mini
metric: pm_acc_mean
profiles:
  mini:
    seeds: [0, 1]
    base: {dataset: fmnist, n_clients: 4, rounds: 2, lr: 0.05, partition: dirichlet, partition_params: {alpha: 0.5}}
    settings:
      a: {}
      b: {n_clients: 6, per_method: {fedprox: {lr: 0.01}}}
    methods: {fedavg: {}, fedprox: {hparams: {mu: 0.001}}}
    per_dataset:
      cifar10: {"*": {model: cnn_cifar10}, fedprox: {hparams: {mu: 0.01}}}
  other:
    seeds: [0]
    base: {dataset: fmnist, n_clients: 4, rounds: 2}
    methods: {fedprox: {}}
"""
SPACE = "profiles:\n  mini:\n    space: {lr: [0.1, 0.01]}\n    per_method: {fedprox: {hparams.mu: [0.1, 1.0]}}\n"


@pytest.fixture
def params(tmp_path, monkeypatch):
    """params/p.yaml and params/tune/p.yaml in a private repo root; a private run store ($PFLREPRO_RESULTS)."""
    (tmp_path / "params" / "tune").mkdir(parents=True)
    (tmp_path / "params" / "p.yaml").write_text(PARAMS)
    (tmp_path / "params" / "tune" / "p.yaml").write_text(SPACE)
    monkeypatch.setattr(experiments, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(tune, "REPO_ROOT", tmp_path)
    monkeypatch.setenv("PFLREPRO_RESULTS", str(tmp_path / "results"))
    return tmp_path


def _no_training(monkeypatch):
    """Make any attempt to train (or load) runs fail the test."""
    def refuse(*a, **k):
        raise AssertionError("a run was about to train")
    monkeypatch.setattr(experiments, "run_grid", refuse)
    monkeypatch.setattr(tune, "run_tolerating_divergence", refuse)


def _files(root):
    return sorted(root.rglob("*")) if root.exists() else []


def test_overrides_are_the_last_layer_of_every_config(params):
    """An override beats base, setting, per_method and method layers in every config; a `partition` override starts
    its params afresh (merge_run), a dotted one merges into the layers' params; no override is the grid as before."""
    P = experiments.load_profile("p")
    g = experiments.grid(P, {"lr": 0.2, "n_clients": 8, "partition": "iid", "device": "auto"})
    assert len(g) == 8                                                  # 2 settings x 2 methods x 2 seeds
    assert {(c.lr, c.n_clients, c.partition, c.partition_params == {}, c.device) for c in g.values()} == {
        (0.2, 8, "iid", True, "auto")}                                  # setting b's per_method lr 0.01 is beaten
    assert {c.hparams["mu"] for k, c in g.items() if k[0] == "fedprox"} == {0.001}   # what no override sets stays
    alpha = experiments.grid(P, {"partition_params": {"alpha": 0.1}})
    assert {(c.partition, c.partition_params["alpha"]) for c in alpha.values()} == {("dirichlet", 0.1)}
    untouched = experiments.grid(P)
    assert untouched[("fedprox", "b", 0)].lr == 0.01 and untouched[("fedavg", "a", 0)].partition == "dirichlet"
    assert experiments.grid(P, {}) == untouched == experiments.grid(P, None)


def test_hparams_override_for_an_algorithm_without_it_names_the_method(params):
    """hparams.mu applied to every run suits fedprox only: fedavg's config is refused, naming the method and key
    (documented in the verbs' help); a grid of fedprox alone takes it."""
    with pytest.raises(ConfigError, match=r"^\[p/mini\] method=fedavg setting=a: hparams\.mu=0\.1: unknown key"):
        experiments.grid(experiments.load_profile("p"), {"hparams": {"mu": 0.1}})
    g = experiments.grid(experiments.load_profile("p", "other"), {"hparams": {"mu": 0.1}})
    assert [c.hparams["mu"] for c in g.values()] == [0.1]


def test_a_dataset_override_takes_that_datasets_per_dataset_choices(params):
    """dataset=cifar10 on the command line runs cifar10's per_dataset layers (its model, FedProx's mu), as a params
    file naming cifar10 would."""
    g = experiments.grid(experiments.load_profile("p"), {"dataset": "cifar10"})
    assert {c.model for c in g.values()} == {"cnn_cifar10"}
    assert g[("fedprox", "a", 0)].hparams["mu"] == 0.01


def test_seeds_override_replaces_the_profiles_seeds(params):
    """seeds=[..] is not a run setting: it replaces the profile's seeds list; the other keys still apply."""
    g = experiments.grid(experiments.load_profile("p"), {"seeds": [3], "rounds": 1})
    assert sorted(g) == [("fedavg", "a", 3), ("fedavg", "b", 3), ("fedprox", "a", 3), ("fedprox", "b", 3)]
    assert {(c.seed, c.rounds) for c in g.values()} == {(3, 1)}


@pytest.mark.parametrize("bad", [[], [-1], 0, "0", [True], [0.5], None])
def test_bad_seeds_are_refused_naming_the_key(params, bad):
    """seeds must be a non-empty list of integers >= 0."""
    with pytest.raises(ConfigError, match=r"^\[p/mini\] seeds=.*: expected a non-empty list of integers >= 0"):
        experiments.grid(experiments.load_profile("p"), {"seeds": bad})


@pytest.mark.parametrize("key", ["seed", "algorithm"])
def test_seed_and_algorithm_are_not_grid_overrides(params, key):
    """A grid's seeds and methods set `seed` and `algorithm`: one value for every run would collapse the seeds or
    relabel every method's runs, so both are refused, naming the key."""
    with pytest.raises(ConfigError, match=rf"^\[p/mini\] {key}=.*: not an override of a grid"):
        experiments.grid(experiments.load_profile("p"), {key: 1 if key == "seed" else "fedavg"})


def test_profile_overrides_of_a_notebook_still_compose(params):
    """A notebook's papermill `overrides` (profile-shaped, load_profile) works as before; the command line's come
    after it."""
    P = experiments.load_profile("p", overrides={"base": {"lr": 0.3}, "seeds": [5]})
    assert {(c.lr, c.seed) for k, c in experiments.grid(P).items() if k[:2] == ("fedavg", "a")} == {(0.3, 5)}
    assert {c.lr for c in experiments.grid(P, {"lr": 0.4}).values()} == {0.4}


def test_parse_overrides_refuses_malformed_pairs_as_config_errors():
    """Not key=value, a key both a value and settings, or a value that is not YAML: a ConfigError naming it (one
    line from main, rc 2), where `run foo` used to exit 1."""
    assert cli.parse_overrides(["a=1", "b.c=x", "seeds=[0, 2]"]) == {"a": 1, "b": {"c": "x"}, "seeds": [0, 2]}
    for pairs, msg in [(["foo"], "expected key=value, got 'foo'"), (["=1"], "expected key=value"),
                       (["h=1", "h.mu=2"], "h.mu=2: h is set to a value"), (["seeds=[0"], "seeds=[0: not valid YAML")]:
        with pytest.raises(ConfigError, match=msg.replace("[", r"\[")):
            cli.parse_overrides(pairs)


def test_cost_takes_overrides_anywhere_on_its_line(params, monkeypatch, capsys):
    """`cost p --profile mini x=..` and `cost p x=.. --profile mini y=..`: every key=value reaches every config, the
    header names them; nothing is measured or trained (grid_cost is replaced by a recorder)."""
    _no_training(monkeypatch)
    seen = []
    monkeypatch.setattr(budget, "grid_cost", lambda cfgs, jobs=None: seen.append(cfgs) or {})
    monkeypatch.setattr(budget, "describe", lambda cost, label: f"COST {label}")
    assert cli.main(["cost", "p", "rounds=3", "--profile", "mini", "device=auto", "seeds=[0]"]) == 0
    assert capsys.readouterr().out.strip() == "COST p/mini rounds=3 device=auto seeds=[0]"
    assert len(seen[0]) == 4 and {(c.rounds, c.device, c.seed) for c in seen[0]} == {(3, "auto", 0)}
    assert cli.main(["cost", "p", "--profile", "mini", "local_epochs=1"]) == 0
    assert {c.local_epochs for c in seen[1]} == {1} and len(seen[1]) == 8


@pytest.mark.parametrize("argv, names", [
    (["train", "p", "roundz=3"], "roundz=3: unknown key"),
    (["train", "p", "--profile", "mini", "rounds=0"], "rounds=0: must be >= 1"),
    (["train", "p", "hparams.mu=0.1"], "method=fedavg setting=a: hparams.mu=0.1: unknown key"),
    (["train", "p", "seeds=[-1]"], "seeds=[-1]: expected a non-empty list"),
    (["train", "p", "seeds=[0"], "seeds=[0: not valid YAML"),
    (["cost", "p", "--profile", "mini", "device=tpu"], "device='tpu'"),
    (["tune", "p", "--profile", "mini", "roundz=2"], "roundz=2: unknown key"),
    (["tune", "p", "--profile", "mini", "hparams.mu=0.5"], "hparams.mu: `tune` searches it"),
])
def test_a_bad_override_is_one_line_rc_2_and_leaves_the_store_empty(params, monkeypatch, capsys, argv, names):
    """train, cost and tune refuse a bad key or value as `run` does: exit 2, one stderr line `config error: ...`
    naming the key, before any run trains or anything is written under $PFLREPRO_RESULTS."""
    _no_training(monkeypatch)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("config error: ") and names in err, err
    assert _files(params / "results") == []


def test_train_threads_overrides_to_every_notebooks_grid_and_the_manifest(params, monkeypatch, capsys):
    """`train p --profile mini device=cpu rounds=3 seeds=[0]`: the queue holds the overridden configs only, and the
    manifest records the overrides (a manifest without them is unchanged)."""
    queued = {}

    def fake_run_grid(configs, root=None, **kw):
        queued.update(configs)
        return {k: SimpleNamespace(path=run_dir(c, root)) for k, c in configs.items()}
    monkeypatch.setattr(experiments, "run_grid", fake_run_grid)
    out = params / "m.json"
    assert cli.main(["train", "p", "--profile", "mini", "device=cpu", "rounds=3", "seeds=[0]", "--out", str(out)]) == 0
    assert len(queued) == 4 and {(c.device, c.rounds, c.seed) for c in queued.values()} == {("cpu", 3, 0)}
    manifest = json.loads(out.read_text())
    assert manifest["overrides"] == {"device": "cpu", "rounds": 3, "seeds": [0]} and len(manifest["notebooks"]["p"]) == 4
    assert "overrides" not in experiments.train_notebooks(["p"], "mini")


def test_tune_applies_overrides_to_every_point_and_records_them(params, monkeypatch):
    """`tune p rounds=1 seeds=[2]`: every point of every method runs with them; chosen.yaml records them beside the
    choice; a key the space searches (lr) is refused, as every point would be one run."""
    P, spec = experiments.load_profile("p"), tune.load_space("p", "mini")
    configs, _ = tune.search_configs(P, spec, None, {"rounds": 1, "seeds": [2]})
    assert len(configs) == (2 + 4) * 2 and {(c.rounds, c.seed) for c in configs.values()} == {(1, 2)}
    with pytest.raises(ConfigError, match=r"^\[p/mini\] lr: `tune` searches it"):
        tune.search_configs(P, spec, None, {"lr": 0.5})
    monkeypatch.setattr(tune, "run_tolerating_divergence", lambda configs, root, **kw: ({
        k: SimpleNamespace(summary={"pm_acc_mean": {"best": c.lr}}) for k, c in configs.items()}, {}))
    r = tune.tune("p", "mini", overrides={"rounds": 1})
    chosen = yaml.safe_load((r["out"] / "chosen.yaml").read_text())
    assert chosen["overrides"] == {"rounds": 1} and chosen["chosen"]["fedavg"]["point"] == {"lr": 0.1}


def test_tune_cli_passes_its_overrides(params, monkeypatch, capsys):
    """`tune p --profile mini rounds=2`: the key=value after an option reaches tune() parsed."""
    seen = {}

    def fake_tune(*args):
        seen["overrides"] = args[-1]
        return {"chosen": {}, "out": params}
    monkeypatch.setattr(tune, "tune", fake_tune)
    assert cli.main(["tune", "p", "--profile", "mini", "rounds=2", "clock.sigma=1"]) == 0
    assert seen["overrides"] == {"rounds": 2, "clock": {"sigma": 1}}


def test_a_verb_without_names_or_with_an_unknown_option_is_refused_by_argparse(params, capsys):
    """Only key=value pairs where notebook names belong, or an unknown --option, stop in argparse (rc 2), never
    becoming an override."""
    for argv in (["cost", "rounds=3"], ["train", "p", "--bogus=1"]):
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == 2
    assert "unrecognized arguments: --bogus=1" in capsys.readouterr().err
