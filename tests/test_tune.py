"""The grid search of PerFed-CKT's appendix E (pflrepro.pipeline.tune): grid points, the choice, and the record in params."""
import json
import shutil

import pandas as pd
import pytest
import yaml

from pflrepro.params import ConfigError
from pflrepro.paths import REPO_ROOT
from pflrepro.pipeline import tune
from pflrepro.pipeline.experiments import load_profile


def test_points_are_the_cartesian_product_in_grid_order():
    assert tune.points({"lr": [0.1, 0.01], "batch_size": [32, 64]}) == [
        {"lr": 0.1, "batch_size": 32}, {"lr": 0.1, "batch_size": 64},
        {"lr": 0.01, "batch_size": 32}, {"lr": 0.01, "batch_size": 64}]
    assert tune.points({}) == [{}]


def test_nest_turns_dotted_keys_into_run_settings():
    assert tune.nest({"hparams.lam": 2.0, "hparams.tau": 50, "lr": 0.1}) == {"hparams": {"lam": 2.0, "tau": 50},
                                                                           "lr": 0.1}


def test_per_method_axes_apply_to_matching_methods_only():
    spec = {"space": {"lr": [0.1]}, "per_method": {"perfed_ckt_*": {"hparams.lam": [1, 2]}}}
    assert tune.method_space(spec, "perfed_ckt_c3") == {"lr": [0.1], "hparams.lam": [1, 2]}
    assert tune.method_space(spec, "fedavg") == {"lr": [0.1]}


def test_choose_takes_the_best_mean_over_seeds_and_settings_first_on_ties():
    a, b, c = (json.dumps(p) for p in ({"lr": 0.1}, {"lr": 0.01}, {"lr": 0.001}))
    df = pd.DataFrame([
        # fedavg: a = (0.6 + 0.8) / 2 = 0.7, b = (0.9 + 0.4) / 2 = 0.65 -> a, though b holds the single best run
        {"method": "fedavg", "point": a, "seed": 0, "score": 0.6}, {"method": "fedavg", "point": a, "seed": 1, "score": 0.8},
        {"method": "fedavg", "point": b, "seed": 0, "score": 0.9}, {"method": "fedavg", "point": b, "seed": 1, "score": 0.4},
        # ckt: b and c tie at 0.5 -> b, the first in grid order
        {"method": "ckt", "point": a, "seed": 0, "score": 0.3}, {"method": "ckt", "point": b, "seed": 0, "score": 0.5},
        {"method": "ckt", "point": c, "seed": 0, "score": 0.5}])
    chosen = tune.choose(df)
    assert chosen["fedavg"] == {"point": {"lr": 0.1}, "score": pytest.approx(0.7), "runs": 2}
    assert chosen["ckt"]["point"] == {"lr": 0.01} and chosen["ckt"]["runs"] == 1


def test_a_point_with_a_diverged_run_is_never_chosen():
    a, b = json.dumps({"lr": 0.1}), json.dumps({"lr": 0.01})
    df = pd.DataFrame([   # a is best on the setting where it finished, but diverged on the other
        {"method": "m", "point": a, "setting": "s1", "seed": 0, "score": 0.9, "diverged": False},
        {"method": "m", "point": a, "setting": "s2", "seed": 0, "score": float("nan"), "diverged": True},
        {"method": "m", "point": b, "setting": "s1", "seed": 0, "score": 0.5, "diverged": False},
        {"method": "m", "point": b, "setting": "s2", "seed": 0, "score": 0.4, "diverged": False},
        {"method": "n", "point": a, "setting": "s1", "seed": 0, "score": float("nan"), "diverged": True}])
    assert tune.choose(df) == {"m": {"point": {"lr": 0.01}, "score": pytest.approx(0.45), "runs": 2}}


def test_diverged_runs_are_the_started_unfinished_ones_of_a_divergence(tmp_path):
    from pflrepro.core.training import Divergence
    from pflrepro.federation.config import RunConfig
    from pflrepro.pipeline.store import run_dir

    from .conftest import small_cfg
    cfgs = {k: RunConfig.from_dict(small_cfg(seed=k)) for k in range(3)}
    for k, files in ((0, ("config.json", "manifest.json")), (1, ("config.json",))):   # 0 finished, 1 started, 2 not
        d = run_dir(cfgs[k], tmp_path)
        d.mkdir(parents=True)
        for f in files:
            (d / f).write_text("{}")
    assert tune.diverged_runs(Divergence("loss became nan"), cfgs, tmp_path) == [1]
    worker = RuntimeError("fedavg seed 1 failed in a run worker:\nTraceback ...\npflrepro.core.training.Divergence: nan")
    assert tune.diverged_runs(worker, cfgs, tmp_path) == [1]
    assert tune.diverged_runs(ValueError("something else"), cfgs, tmp_path) == []


def test_search_configs_override_only_the_searched_method_and_settings():
    P = {**load_profile("perfed_ckt_table1", "mini"), "seeds": [0]}   # one seed: 2 points x 2 methods
    spec = {"space": {"lr": [0.1, 0.01]}, "per_method": {"perfed_ckt_*": {"hparams.lam": [0.5]}}}
    configs, meta = tune.search_configs(P, spec, ["fedavg", "perfed_ckt_c3"])
    assert len(configs) == 4 and len(meta) == 4
    ckt = [c for (label, *_), c in configs.items() if meta[label][0] == "perfed_ckt_c3"]
    assert sorted(c.lr for c in ckt) == [0.01, 0.1]
    assert all(c.hparams["lam"] == 0.5 and c.hparams["clusters"] == 3 and c.algorithm == "perfed_ckt" for c in ckt)
    assert all(c.batch_size == P["base"]["batch_size"] for c in configs.values())   # not searched: unchanged
    with pytest.raises(ConfigError, match="not in params"):
        tune.search_configs(P, spec, ["no_such_method"])


@pytest.mark.parametrize("name", sorted(p.stem for p in (REPO_ROOT / "params" / "tune").glob("*.yaml")))
def test_every_profile_of_every_space_file_builds_valid_configs(name):
    """A space file's keys are real run settings at every profile (a typo'd key fails validation here)."""
    for profile in ("smoke", "mini", "paper"):
        P = load_profile(name, profile)
        configs, _ = tune.search_configs(P, tune.load_space(name, profile))
        assert configs


def test_a_setting_that_lists_its_methods_keeps_the_searched_one_or_is_left_out():
    """Fig. 4's "S=5" runs FedAvg, FedRep and FedBSD only: searching FedBSD keeps it there with FedBSD alone;
    searching FedPer (S = 2 only) leaves it out."""
    P = {"name": "t", "profile": "p", "settings": {"S=2": {}, "S=5": {"lr": 0.1, "methods": ["fedavg", "fedbsd"]}},
         "methods": {"fedavg": {}, "fedbsd": {"hparams": {"a": 0.5}}, "fedper": {}}}
    q = tune.only(P, "fedbsd", {"hparams": {"a": 0.5, "temperature": 1.0}})
    assert q["methods"] == {"fedbsd": {"hparams": {"a": 0.5, "temperature": 1.0}}}
    assert q["settings"] == {"S=2": {}, "S=5": {"lr": 0.1, "methods": ["fedbsd"]}}
    assert tune.only(P, "fedper", {})["settings"] == {"S=2": {}}
    assert "settings" not in tune.only({"methods": {"fedavg": {}}}, "fedavg", {})


def test_the_perfed_ckt_paper_space_is_appendix_e_grid():
    paper = tune.load_space("perfed_ckt_table1", "paper")   # appendix E's grid, exactly
    assert paper["space"] == {"lr": [0.1, 0.05, 0.01, 0.005, 0.001], "batch_size": [32, 64, 128]}
    assert paper["per_method"]["perfed_ckt_*"] == {"hparams.tau": [10, 30, 50], "hparams.public_batch": [32, 64, 128],
                                                   "hparams.lam": [0.05, 0.1, 0.5, 1, 2, 4]}


def test_a_bad_space_is_refused_with_one_line(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="params/tune/pfedsd_table2.yaml does not exist"):
        tune.load_space("pfedsd_table2", "mini")
    with pytest.raises(ConfigError, match="defines smoke, mini, paper"):
        tune.load_space("perfed_ckt_table1", "evidence")


def test_apply_records_the_choice_in_params_keeping_comments(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("profile: mini  # keep me\nprofiles:\n  mini:\n    methods:\n      fedavg: {}\n"
                    "      ckt: {algorithm: perfed_ckt, hparams: {clusters: 3}}   # and me\n      other: {}\n")
    tune.apply(path, "mini", {"fedavg": {"point": {"lr": 0.05}}, "ckt": {"point": {"hparams.lam": 2.0, "lr": 0.01}}})
    text = path.read_text()
    assert "# keep me" in text and "# and me" in text
    methods = yaml.safe_load(text)["profiles"]["mini"]["methods"]
    assert methods == {"fedavg": {"lr": 0.05}, "ckt": {"algorithm": "perfed_ckt", "hparams": {"clusters": 3, "lam": 2.0},
                                                       "lr": 0.01}, "other": {}}


def test_tune_runs_the_smoke_grid_and_writes_scores(tmp_path, monkeypatch):
    """End to end at smoke: 2 learning rates x 2 methods train as ordinary runs, the scores and the choice are
    written, and --apply records it in (a copy of) the params."""
    monkeypatch.setenv("PFLREPRO_RESULTS", str(tmp_path / "results"))
    params = tmp_path / "repo" / "params"
    shutil.copytree(REPO_ROOT / "params", params)
    monkeypatch.setattr(tune, "REPO_ROOT", tmp_path / "repo")
    space = tune.load_space("perfed_ckt_table1", "smoke")
    space["per_method"]["fedavg"] = {"lr": [0.05, 0.01, 1e6]}   # 1e6: diverges, and the search goes on without it
    monkeypatch.setattr(tune, "load_space", lambda name, profile: space)
    r = tune.tune("perfed_ckt_table1", "smoke", progress=False, write=True)
    df = pd.read_csv(r["out"] / "scores.csv")
    assert len(df) == 5 and set(df["method"]) == {"fedavg", "perfed_ckt_c1"}
    assert df[df["diverged"]]["point"].tolist() == ['{"lr": 1000000.0}'] and df[df["diverged"]]["score"].isna().all()
    df = df[~df["diverged"]]
    assert df["score"].between(0, 1).all()
    for method, c in r["chosen"].items():
        assert c["score"] == pytest.approx(df[df["method"] == method]["score"].max())
    written = yaml.safe_load((params / "perfed_ckt_table1.yaml").read_text())["profiles"]["smoke"]["methods"]
    assert written["fedavg"]["lr"] == r["chosen"]["fedavg"]["point"]["lr"]
    assert written["perfed_ckt_c1"]["hparams"]["lam"] == 2.0
    assert yaml.safe_load((r["out"] / "chosen.yaml").read_text())["chosen"] == r["chosen"]
