"""Seed streams (`seeds`): each random source of a run can be pinned apart from `seed`, so a noise study varies one
source with the others held fixed (scripts/evidence/noise.py). Unpinned, every stream is the run's seed: the same
partition, split and weights as before the streams existed (tests/golden holds the metrics)."""
import numpy as np
import pytest
import torch

from pflrepro.federation.build import build_context, build_partition
from pflrepro.federation.config import SEED_STREAMS, RunConfig
from pflrepro.params import ConfigError

from .conftest import small_cfg


def _parts(cfg):
    return build_partition(cfg)


def _same_split(a, b):
    return all(np.array_equal(x, y) for key in ("train", "test") for x, y in zip(a[key], b[key]))


def _cfg(**kw):
    return RunConfig.from_dict(small_cfg(partition="dirichlet", partition_params={"alpha": 0.3}, **kw))


def test_unpinned_streams_follow_the_seed_and_pinning_them_to_it_changes_nothing():
    plain = _cfg(seed=3)
    pinned = _cfg(seed=3, seeds={"partition": 3, "split": 3, "init": 3})
    assert plain.seeds == {} and all(plain.stream_seed(s) == 3 for s in SEED_STREAMS)
    assert _same_split(_parts(plain), _parts(pinned))
    a, b = build_context(plain, torch.device("cpu")), build_context(pinned, torch.device("cpu"))
    assert all(torch.equal(a.init_state[n], b.init_state[n]) for n in a.init_state)
    assert plain.key() != pinned.key()          # a different request, addressed apart


def test_each_stream_moves_only_its_own_source():
    base = _cfg(seed=0, seeds={"partition": 0, "split": 0, "init": 0})
    ctx0 = build_context(base, torch.device("cpu"))
    p0 = _parts(base)
    # the partition stream: which samples each client holds (its train and test sets both move)
    part = _cfg(seed=0, seeds={"partition": 1, "split": 0, "init": 0})
    held = [np.sort(np.concatenate([tr, te])) for tr, te in zip(p0["train"], p0["test"])]
    moved = [np.sort(np.concatenate([tr, te])) for tr, te in zip(_parts(part)["train"], _parts(part)["test"])]
    assert not all(np.array_equal(x, y) for x, y in zip(held, moved))
    ctx = build_context(part, torch.device("cpu"))
    assert all(torch.equal(ctx0.init_state[n], ctx.init_state[n]) for n in ctx0.init_state)
    # the split stream: each client holds the same samples, split differently into train and test
    split = _parts(_cfg(seed=0, seeds={"partition": 0, "split": 1, "init": 0}))
    same_pool = [np.sort(np.concatenate([tr, te])) for tr, te in zip(split["train"], split["test"])]
    assert all(np.array_equal(x, y) for x, y in zip(held, same_pool))
    assert not _same_split(p0, split)
    # the init stream: the weights move, the data does not
    init = _cfg(seed=0, seeds={"partition": 0, "split": 0, "init": 1})
    assert _same_split(p0, _parts(init))
    ctx = build_context(init, torch.device("cpu"))
    assert not all(torch.equal(ctx0.init_state[n], ctx.init_state[n]) for n in ctx0.init_state)
    # the run's seed with every stream pinned: the same data and weights (what moves is SGD order, sampling)
    order = _cfg(seed=1, seeds={"partition": 0, "split": 0, "init": 0})
    assert _same_split(p0, _parts(order))
    ctx = build_context(order, torch.device("cpu"))
    assert all(torch.equal(ctx0.init_state[n], ctx.init_state[n]) for n in ctx0.init_state)


@pytest.mark.parametrize("bad, words", [
    ({"seeds": {"partiton": 1}}, ["seeds.partiton", "unknown key", "did you mean 'partition'?"]),
    ({"seeds": {"init": -1}}, ["seeds.init", "-1", ">= 0"]),
    ({"seeds": {"split": 1.5}}, ["seeds.split", "expected int"]),
    ({"seeds": [1, 2]}, ["seeds", "expected dict"]),
])
def test_bad_streams_are_refused_in_one_line(bad, words):
    with pytest.raises(ConfigError) as e:
        RunConfig.from_dict(bad)
    assert "\n" not in str(e.value)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_a_config_with_pinned_streams_validates_again():
    cfg = _cfg(seed=2, seeds={"init": 5})
    assert RunConfig.from_dict(cfg.to_dict()) == cfg and cfg.stream_seed("init") == 5
    assert cfg.stream_seed("partition") == 2
