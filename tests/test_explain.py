"""`python -m pflrepro explain`: every setting of a run with the params file and layer it comes from."""
import pytest

from pflrepro.params import ConfigError
from pflrepro.pipeline import experiments, explain


def _origins(*a, **k) -> dict:
    return {key: (value, origin) for key, value, origin in explain.origins(*a, **k)}


def test_each_setting_names_the_file_and_layer_it_comes_from():
    o = _origins("pfedsd_table2", "fedprox", "fmnist 20 clients", "mini")
    assert o["lr"] == (0.005, "params/pfedsd_table2.yaml: profiles.mini.base")             # the notebook's own base
    assert o["momentum"] == (0.9, "params/pfedsd_common.yaml: profiles.mini.base")         # inherited
    assert o["n_clients"][1] == "params/pfedsd_table2.yaml: settings.'fmnist 20 clients'"
    assert o["hparams.mu"][1] == "params/pfedsd_common.yaml: per_dataset.fmnist.fedprox"
    assert o["algorithm"] == ("fedprox", "the grid: the method's algorithm, the profile's first seed")
    assert o["grad_clip"] == (0.0, "default: pflrepro/settings.py (RUN_SCHEMA)")
    assert o["partition_params.n_aux"][1] == "default: pflrepro/data/partition (PARTITION_SCHEMAS)"
    o = _origins("pfedsd_table2", "pfedsd", "fmnist 20 clients", "mini")
    assert o["hparams.tau"][1] == "params/pfedsd_common.yaml: methods.pfedsd"
    assert o["hparams.teacher"][1] == "default: pflrepro/algorithms/pfedsd.py (PFedSD.HPARAMS)"


def test_the_command_line_is_the_last_layer_and_a_switched_partition_starts_afresh():
    o = _origins("pfedsd_table2", "fedavg", "fmnist 20 clients", "mini",
                 {"lr": 0.02, "partition": "dirichlet", "partition_params": {"alpha": 0.3}})
    assert o["lr"] == (0.02, "the command line (key=value)")
    assert o["partition_params.alpha"] == (0.3, "the command line (key=value)")
    assert o["partition_params.min_size"][1].startswith("default:")     # not pFedSD's balanced_dirichlet settings


def test_every_mini_run_of_every_notebook_is_rebuilt_by_its_layers():
    """The replay checks itself against `experiments.grid` (RuntimeError on a mismatch): every method and setting of
    every params file's mini profile."""
    import glob
    import os
    n = 0
    for f in sorted(glob.glob(str(experiments.REPO_ROOT / "params" / "*.yaml"))):
        name = os.path.basename(f)[:-5]
        if "mini" not in experiments.read_params(name).get("profiles", {}):
            continue
        p = experiments.load_profile(name, "mini")
        runs = {(m, s) for m, s, _ in experiments.grid(p)}
        for m, s in runs:
            explain.origins(name, m, s, "mini")
            n += 1
    assert n > 200


def test_a_method_or_setting_that_does_not_run_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="method 'fedsgd'"):
        explain.origins("pfedsd_table2", "fedsgd", "fmnist 20 clients", "mini")
    with pytest.raises(ConfigError, match="setting 'cifar'"):
        explain.origins("pfedsd_table2", "fedavg", "cifar", "mini")


def test_the_explain_verb(capsys):
    from pflrepro.cli import main
    assert main(["explain", "pfedsd_table2", "fedprox", "lr=0.03"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("# pfedsd_table2 (mini), method fedprox, setting 'fmnist 20 clients'")
    assert any(line.startswith("lr = 0.03") and line.endswith("# the command line (key=value)") for line in out)
