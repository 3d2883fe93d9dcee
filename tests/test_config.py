"""Config validation: one message naming the key, the value and what is allowed."""
import numpy as np
import pytest

from pflrepro.federation.config import RunConfig
from pflrepro.params import ConfigError


@pytest.mark.parametrize("bad, words", [
    ({"rounds": "ten"}, ["rounds", "'ten'", "int"]),
    ({"lr": -0.1}, ["lr", "-0.1", "> 0"]),
    ({"participation": 1.5}, ["participation", "1.5", "<= 1"]),
    ({"learning_rate": 0.1}, ["learning_rate", "unknown key", "lr"]),
    ({"algorithm": "fedsgd"}, ["algorithm", "fedsgd", "fedavg"]),
    ({"model": "resnet1000"}, ["model", "resnet1000", "cnn1"]),
    ({"dataset": "imagenet"}, ["dataset", "imagenet", "fmnist"]),
    ({"partition": "dirichlet", "partition_params": {"alpha": 0}}, ["partition_params.alpha", "0", "> 0"]),
    ({"partition": "shards", "partition_params": {"alpha": 0.1}}, ["partition_params.alpha", "unknown key", "s"]),
    ({"algorithm": "fedprox", "hparams": {"mu": -1}}, ["hparams.mu", "-1", ">= 0"]),
    ({"algorithm": "fedavg", "hparams": {"mu": 0.1}}, ["hparams.mu", "unknown key"]),
    ({"split_params": {"fractions": [0.9, 0.3]}}, ["split_params.fractions", "summing to <= 1"]),
    ({"sampling": "greedy"}, ["sampling", "greedy", "uniform"]),
    ({"device": "tpu"}, ["device", "tpu", "cuda"]),
])
def test_bad_values_name_key_value_and_allowed(bad, words):
    with pytest.raises(ConfigError) as e:
        RunConfig.from_dict(bad)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_defaults_and_key_stability():
    a = RunConfig.from_dict({"algorithm": "fedprox", "lr": 0.1})
    assert a.hparams == {"mu": 0.01}
    b = RunConfig.from_dict({"lr": 0.1, "algorithm": "fedprox", "hparams": {"mu": 0.01}})
    assert a.key() == b.key()                      # defaults filled -> same content address
    assert a.key() != a.replace(seed=1).key()
    assert RunConfig.from_dict({"weight_decay": "1e-5"}).weight_decay == 1e-5  # YAML 1.1 quirk


def test_heterogeneous_models_need_an_algorithm_that_exchanges_no_whole_model():
    with pytest.raises(ConfigError, match="averages whole models"):
        RunConfig.from_dict({"algorithm": "fedavg", "model": "cnn1", "models": ["cnn1", "cnn2"]})
    assert RunConfig.from_dict({"algorithm": "local", "model": "cnn1", "models": ["cnn1", "cnn2"]}).models == ("cnn1", "cnn2")
    assert RunConfig.from_dict({"algorithm": "fedavg", "model": "cnn1", "models": ["cnn1", "cnn1"]}).models == ("cnn1", "cnn1")
    with pytest.raises(ConfigError, match="must be one of models"):   # the server state is built with `model`
        RunConfig.from_dict({"algorithm": "lg_fedavg", "model": "cnn_fmnist", "models": ["cnn4", "cnn5"]})


def test_client_architecture_cycles_through_models_and_the_server_uses_model():
    from pflrepro.federation.build import client_archs
    het = RunConfig.from_dict({"algorithm": "local", "model": "cnn2", "models": ["cnn1", "cnn2", "cnn3"]})
    assert client_archs(het, [5, 9, 1, 4, 4]) == ("cnn1", "cnn2", "cnn3", "cnn1", "cnn2") and het.heterogeneous
    same = RunConfig.from_dict({"algorithm": "fedavg", "model": "cnn1", "models": ["cnn1", "cnn1"]})
    assert not same.heterogeneous and client_archs(same, [3, 3]) == ("cnn1", "cnn1")
    plain = RunConfig.from_dict({"algorithm": "fedavg", "model": "cnn1"})
    assert not plain.heterogeneous and client_archs(plain, [3, 3]) == ()   # () = every client (and the server) has `model`


def test_size_assignment_draws_larger_models_for_larger_datasets():
    """PerFed-CKT Table 2: rank ~ Binomial(m - 1, n_k / max n). A client with the largest dataset always draws
    the largest model, an empty one the smallest; in between the mean rank is (m - 1) * n_k / max n."""
    from pflrepro.data.models import assign_models
    n_params = {"big": 300, "mid": 200, "small": 100}
    models = ["small", "big", "mid"]                                  # order given does not matter: ranked by size
    assert assign_models(models, [100, 0, 100, 0], "size", n_params, seed=3) == ["big", "small", "big", "small"]
    draws = assign_models(models, [1000] + [250] * 4000, "size", n_params, seed=0)[1:]
    rank = np.array([{"small": 0, "mid": 1, "big": 2}[d] for d in draws])
    assert abs(rank.mean() - 2 * 0.25) < 0.05                        # Binomial(2, 0.25): mean 0.5
    assert abs((rank == 0).mean() - 0.75 ** 2) < 0.03                 # P(rank 0) = 0.5625
    assert assign_models(models, [7, 3, 5], "cycle", n_params, seed=0) == ["small", "big", "mid"]


def test_model_assign_is_checked_against_the_registry():
    a = RunConfig.from_dict({"algorithm": "local", "model": "cnn1", "models": ["cnn1", "cnn2"]})
    assert a.replace(model_assign="size").key() != a.key()
    with pytest.raises(ConfigError, match="model_assign"):
        a.replace(model_assign="biggest")


def test_a_validated_config_validates_again():
    """Settings whose default is None (split_params.scale) survive to_dict -> from_dict (run workers do this)."""
    from pflrepro.federation.config import RunConfig
    cfg = RunConfig.from_dict({"split": "global_test_by_proportion"})
    assert cfg.split_params["scale"] is None
    assert RunConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("given, message", [
    ({"lr": float("nan")}, "lr=nan"), ({"lr": float("inf")}, "lr=inf"),
    ({"lr": "nan"}, "lr=nan"),                                        # the CLI's lr=nan arrives as the string 'nan'
    ({"momentum": float("nan")}, "momentum=nan"), ({"weight_decay": float("inf")}, "weight_decay=inf"),
    ({"subsample": float("nan")}, "subsample=nan"),
    ({"algorithm": "fedprox", "hparams": {"mu": float("nan")}}, "hparams.mu=nan"),
    ({"algorithm": "fedprox", "hparams": {"mu": float("inf")}}, "hparams.mu=inf"),
    ({"clock": {"gflops": float("inf")}}, "clock.gflops=inf"),
])
def test_nan_and_inf_are_refused_for_every_float_setting(given, message):
    """nan passes every range check (its comparisons are False) and inf every unbounded one: lr=nan passed
    validation and failed as a divergence at the first step. Param.check refuses both, naming key and value."""
    with pytest.raises(ConfigError) as e:
        RunConfig.from_dict(given)
    assert str(e.value) == f"{message}: must be a finite number"


@pytest.mark.parametrize("algorithm, key", [("ditto", "pm_epochs"), ("fedrep", "head_epochs"), ("pfedme", "K"),
                                            ("scd", "pm_epochs"), ("feddf", "distill_steps"), ("fedavg_ft", "ft_epochs")])
def test_epoch_and_step_settings_have_an_upper_bound(algorithm, key):
    """Issue 33: `hparams.pm_epochs=1e9` and the like ran for ever; every epoch- or step-like setting is bounded."""
    with pytest.raises(ConfigError, match=rf"hparams\.{key}=1000000000: must be <= "):
        RunConfig.from_dict({"algorithm": algorithm, "hparams": {key: 10**9}})
    with pytest.raises(ConfigError, match=r"local_epochs=5000: must be <= 1000"):
        RunConfig.from_dict({"algorithm": "fedavg", "local_epochs": 5000})


@pytest.mark.parametrize("bad, near", [
    ({"lrr": 0.1}, "'lr'"),
    ({"algorithm": "pfedds"}, "'pfedsd'"),
    ({"partition": "dirichelt"}, "'dirichlet'"),
    ({"model": "cnn_fmnst"}, "'cnn_fmnist'"),
    ({"dataset": "fmnst"}, "'fmnist'"),
    ({"split": "randm"}, "'random'"),
    ({"device": "cdua"}, "'cuda'"),
    ({"algorithm": "fedprox", "hparams": {"mu_": 0.1}}, "'mu'"),
    ({"algorithm": "pfedsd", "hparams": {"teachr": "last"}}, "'teacher'"),
    ({"partition": "dirichlet", "partition_params": {"alpah": 0.1}}, "'alpha'"),
    ({"schedule": {"mdoe": "sync"}}, "'mode'"),
])
def test_a_near_miss_gets_did_you_mean(bad, near):
    """Every registry (algorithms, datasets, partitioners, splits, models) and every settings schema (the run's,
    an algorithm's hyperparameters, a partitioner's, the schedule's) names the close match of a typo."""
    with pytest.raises(ConfigError) as e:
        RunConfig.from_dict(bad)
    assert f"(did you mean {near}?)" in str(e.value), str(e.value)


def test_no_did_you_mean_when_nothing_is_close():
    with pytest.raises(ConfigError) as e:
        RunConfig.from_dict({"algorithm": "zzzzzz"})
    assert "did you mean" not in str(e.value)
