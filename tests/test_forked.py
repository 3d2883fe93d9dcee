"""Clients side by side (`pflrepro.core.engines.forked`): the dealing rule by hand, `fork_map` against the plain loop (order,
one thread a client, the global RNG left where the loop leaves it, a child's exception raised here), a run at two
threads (clients forked) against the same run at one thread (no fork): the same bits. And the evaluation's chunk of
rows (`training.EVAL_ROWS`): the same logits as 2,048 rows at a time."""
import os

import pytest
import torch

from pflrepro.core.engines import forked
from pflrepro.core.training import EVAL_ROWS, Divergence, outputs
from pflrepro.data.models import build_model
from tests.conftest import FMNIST_AVAILABLE, small_cfg


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_deal_by_hand():
    # heaviest first, each to the lightest bin (ties: the lower bin): 5 -> b0; 4 -> b1; 3 (item 2) -> b1 (4 < 5);
    # 3 (item 3) -> b0 (5 < 7); 1 -> b1 (7 < 8); bins in the items' order
    assert forked.deal([5, 4, 3, 3, 1], 2) == [[0, 3], [1, 2, 4]]
    assert forked.deal([1, 1], 3) == [[0], [1]]          # more bins than items: no empty bin
    assert forked.deal([2, 2, 2], 1) == [[0, 1, 2]]


def test_client_procs(monkeypatch, two_threads):
    cpu = torch.device("cpu")
    monkeypatch.delenv(forked.ENV, raising=False)
    assert forked.client_procs(cpu, 10) == 2            # the run's threads
    assert forked.client_procs(cpu, 1) == 1             # one client: nothing to share
    assert forked.client_procs(torch.device("cuda"), 10) == 1
    monkeypatch.setenv(forked.ENV, "1")
    assert forked.client_procs(cpu, 10) == 1
    torch.set_num_threads(1)
    monkeypatch.delenv(forked.ENV)
    assert forked.client_procs(cpu, 10) == 1            # a one-thread run (the repro's jobs) never forks


def test_a_malformed_cap_is_refused_in_one_line_before_any_work(monkeypatch, store):
    import pflrepro
    from pflrepro.federation.config import RunConfig
    from pflrepro.params import ConfigError
    from pflrepro.pipeline.store import run_dir
    monkeypatch.setenv(forked.ENV, "two")
    with pytest.raises(ConfigError, match=r"^PFLREPRO_CLIENT_PROCS='two': not a whole number") as e:
        forked.client_procs(torch.device("cpu"), 10)
    assert "\n" not in str(e.value)
    cfg = small_cfg(rounds=1)
    with pytest.raises(ConfigError, match="PFLREPRO_CLIENT_PROCS"):
        pflrepro.run(cfg, progress=False)
    assert not run_dir(RunConfig.from_dict(cfg), store / "runs").exists()


def _state(i):
    _state.t.fill_(i)           # one tensor reused by every call, as a module's state is
    return _state.t
_state.t = torch.zeros(2)


def test_train_each_keeps_every_result(two_threads):
    """`keep` (the clone of a reused module's state) runs in every process: a child pickles its whole bin at the end,
    so without it each of a child's results would be its last item's state. Below a fork's cost the items run here
    at one thread, `done` right after each `fn`."""
    got = {}
    forked.train_each(_state, [0, 1, 2, 3], lambda i: 1.0, 2, lambda i, r: got.update({i: r.tolist()}),
                      keep=torch.clone)
    assert got == {i: [float(i)] * 2 for i in range(4)}
    events = []
    forked.train_each(lambda i: events.append(("fn", i, torch.get_num_threads())) or i, [0, 1], lambda i: 0.0, 2,
                      lambda i, r: events.append(("done", i)))
    assert events == [("fn", 0, 1), ("done", 0), ("fn", 1, 1), ("done", 1)]
    assert torch.get_num_threads() == 2


def _work(i):
    torch.manual_seed(100 + i)                          # as local_train seeds each client
    return os.getpid(), torch.get_num_threads(), torch.randn(3) * i


def test_fork_map_is_the_loop(two_threads):
    items = list(range(5))
    serial = [_work(i) for i in items]
    after_serial = torch.rand(4)
    torch.manual_seed(7)
    out = forked.fork_map(_work, items, [1.0] * 5, 2)
    after_forked = torch.rand(4)
    assert [o[2].tolist() for o in out] == [s[2].tolist() for s in serial]
    assert {o[1] for o in out} == {1}                   # one thread a client, wherever it ran
    assert len({o[0] for o in out}) == 2 and out[-1][0] == os.getpid()   # the last item computed here
    assert torch.equal(after_forked, after_serial)      # the global RNG where the loop leaves it
    assert torch.get_num_threads() == 2                 # restored


def _raises_in_child(i):
    if i == 1:      # bins for 3 equal weights: [[0, 2], [1]]; this process computes the bin holding the last item
        raise Divergence("client 1: loss is nan")
    return i


def test_child_exception_raised_here(two_threads):
    assert forked.deal([1.0] * 3, 2) == [[0, 2], [1]]
    with pytest.raises(Divergence, match="client 1: loss is nan"):
        forked.fork_map(_raises_in_child, [0, 1, 2], [1.0] * 3, 2)

    class Local(Exception):     # a class pickle cannot find: its traceback comes back as text
        pass

    def bad(i):
        if i == 1:
            raise Local("unpicklable")
        return i
    with pytest.raises(RuntimeError, match="Local: unpicklable"):
        forked.fork_map(bad, [0, 1, 2], [1.0] * 3, 2)
    assert torch.get_num_threads() == 2


def test_when_a_fork_pays_by_hand():
    # 10 steps of 32 rows through a 1-MFLOP forward: 10 x (1e-3 + 3 x 1e6 x 32 / 1e11) = 0.0196 s
    assert forked.work_seconds(10, 32, 1e6) == pytest.approx(0.0196)
    # over 2 processes a round saves half its work; a fork pays from 4 x 0.03 s saved, i.e. 0.24 s of work
    assert forked.pays(0.24, 2) and not forked.pays(0.2, 2)
    assert forked.pays(0.18, 3)     # two thirds saved


@pytest.mark.skipif(not FMNIST_AVAILABLE, reason="Fashion-MNIST not installed")
@pytest.mark.parametrize("algorithm,model,forks", [("fedavg", "cnn_fmnist", True), ("pfedsd", "cnn_fmnist", True),
                                                   ("fedavg", "cnn_cifar10", False)])
def test_two_thread_run_keeps_the_one_thread_bits(algorithm, model, forks, store, monkeypatch):
    """At B = 32 these CNNs train client by client under `engine: auto` (docs/performance.md). At two threads a
    round's clients train at one thread each: forked for pFedSD's FMNIST CNN (5 clients x 8 steps of ~15 MFLOP an
    image: ~0.6 s estimated), here one after another for LeNet (~0.06 s: a fork would not pay); either way the
    run's metrics are the one-thread run's bits."""
    import pflrepro
    cfg = small_cfg(algorithm=algorithm, rounds=2, participation=0.5, model=model)
    one = pflrepro.run(cfg, progress=False)
    calls = []
    real = forked.fork_map
    monkeypatch.setattr(forked, "fork_map", lambda *a: calls.append(a[3]) or real(*a))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        two = pflrepro.run(cfg, progress=False, force=True)
    finally:
        torch.set_num_threads(before)
    assert calls == ([2, 2] if forks else [])           # every round's clients split over two processes, or none
    assert (one.provenance["client_procs"], two.provenance["client_procs"]) == (1, 2)
    drop = ("seconds", "eval_seconds")
    assert [{k: v for k, v in r.items() if k not in drop} for r in two.history] == \
        [{k: v for k, v in r.items() if k not in drop} for r in one.history]
    assert two.per_client == one.per_client


@pytest.mark.parametrize("name,shape", [("cnn_fmnist", (1, 28)), ("resnet8", (3, 32)), ("mlp", (1, 28)),
                                        ("cnn_bn", (3, 32))])
def test_eval_rows_same_logits(name, shape):
    torch.manual_seed(0)
    net = build_model(name, shape[0], 10, shape[1])
    x = torch.randn(300, shape[0], shape[1], shape[1])
    assert EVAL_ROWS < 300
    assert torch.equal(outputs(net, x, EVAL_ROWS), outputs(net, x, 2048))
