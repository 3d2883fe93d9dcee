"""Evaluation does not score a model twice (issue 35): the round loop's scorer reuses the score of the same weights on
the same images, from this evaluation or the previous one, and must give exactly what scoring everything gives."""
from __future__ import annotations

import torch
from torch import nn

from pflrepro.core import loop
from pflrepro.pipeline import store

TINY = dict(dataset="fmnist", subsample=0.02, n_clients=6, participation=0.34, rounds=4, local_epochs=1,
            model="cnn_cifar10", batch_size=16, lr=0.05, seed=3)


def _count(monkeypatch) -> list:
    calls = [0]
    real = loop.accuracy

    def counted(*a, **k):
        calls[0] += 1
        return real(*a, **k)
    monkeypatch.setattr(loop, "accuracy", counted)
    return calls


def _history(res) -> list:
    return [{k: v for k, v in r.items() if "seconds" not in k} for r in res.history] + [res.per_client]


def test_cached_evaluation_is_identical_to_scoring_everything(monkeypatch, tmp_path):
    """Local, Ditto (with the GM on every client's test as well) and FedAvg: every metric and every client's score
    equal with and without the reuse, and the reuse skips what did not change (2 of 6 clients train a round)."""
    calls = _count(monkeypatch)
    cases = {"local": {}, "ditto": {"eval_gm_local": True}, "fedavg": {"eval_gm_local": True}}
    for algo, extra in cases.items():
        cfg = {**TINY, "algorithm": algo, **extra}
        calls[0] = 0
        cached = _history(store.run(cfg, root=tmp_path / "a", progress=False))
        n_cached = calls[0]
        with monkeypatch.context() as m:
            m.setattr(loop, "_HASH_BYTES_PER_FLOP", 0.0)     # never worth it: every model scored
            calls[0] = 0
            full = _history(store.run(cfg, root=tmp_path / "b", progress=False))
        assert cached == full, algo
        assert n_cached < calls[0], (algo, n_cached, calls[0])


POOLED = dict(pool="train+test", split="random", split_params={"fractions": [0.8, 0.2]})


def test_the_global_model_scored_once_on_pooled_local_tests_is_identical(monkeypatch, tmp_path):
    """pFedSD's and DC-PFL's pooled train+test: the global test set is the clients' local tests, so the GM's
    predictions on it give every client's GM score too (FedAvg, pFedSD's clients not trained yet, eval_gm_local);
    the same metrics as scoring each client's test set apart, with no client-by-client scoring for FedAvg."""
    from pflrepro.data.fed import FedData
    calls = _count(monkeypatch)
    for algo, extra in {"fedavg": {"eval_gm_local": True}, "pfedsd": {}, "fedper": {}}.items():
        cfg = {**TINY, **POOLED, "algorithm": algo, **extra}
        calls[0] = 0
        pooled = _history(store.run(cfg, root=tmp_path / "a", progress=False))
        n_pooled = calls[0]
        with monkeypatch.context() as m:
            m.setattr(FedData, "pooled_tests", lambda self: self)     # as before: each test set scored apart
            m.setattr(loop, "_HASH_BYTES_PER_FLOP", 0.0)
            calls[0] = 0
            apart = _history(store.run(cfg, root=tmp_path / "b", progress=False))
        assert pooled == apart, algo
        assert n_pooled < calls[0] or algo == "fedper", (algo, n_pooled, calls[0])
        if algo == "fedavg":
            assert n_pooled == 0


def test_pooled_tests_are_found_only_where_they_are_the_clients_tests():
    import torch as t

    from pflrepro.federation.build import build_context
    from pflrepro.federation.config import RunConfig
    ctx = build_context(RunConfig.from_dict({**TINY, **POOLED, "algorithm": "fedavg"}), t.device("cpu"))
    d, o = ctx.data, ctx.data.test_offsets
    assert o is not None and o[-1] == len(d.y_test) and len(o) == d.n_clients + 1
    for k in range(d.n_clients):
        assert t.equal(d.x_test[o[k]:o[k + 1]], d.client_test(k)[0])
    assert build_context(RunConfig.from_dict({**TINY, "algorithm": "fedavg"}), t.device("cpu")).data.test_offsets is None
    shuffled = d.__class__(**{**d.__dict__, "test_offsets": None, "test": list(reversed(d.test))})
    assert shuffled.pooled_tests().test_offsets is None        # another order: not the same images row for row


def test_a_changed_model_is_scored_again_and_a_wrapper_always(monkeypatch):
    from pflrepro.federation.build import build_context
    from pflrepro.federation.config import RunConfig
    calls = _count(monkeypatch)
    ctx = build_context(RunConfig.from_dict({**TINY, "algorithm": "local"}), torch.device("cpu"))
    net = ctx.model(0)
    x, y = ctx.data.client_test(0)
    score, done = loop._scorer(ctx)
    a = score(0, net, x, y)
    assert score(0, net, x, y) == a and calls[0] == 1          # the same weights, the same images: reused
    done()
    score, done = loop._scorer(ctx)
    assert score(0, net, x, y) == a and calls[0] == 1          # unchanged since the previous evaluation
    with torch.no_grad():
        net.head.bias[0] += 1.0
    score(0, net, x, y)
    assert calls[0] == 2                                       # one weight changed: scored again
    score("gm", net, *ctx.data.client_test(1))
    assert calls[0] == 3                                       # other images: scored
    wrapper = nn.Sequential(net)
    score(0, wrapper, x, y)
    score(0, wrapper, x, y)
    assert calls[0] == 5                                       # not one of pflrepro's architectures: always scored
    done()
    assert len(ctx.eval_scores) == 3                           # what this evaluation asked for (old weights, new, gm)
