"""The batched engine (`pflrepro.core.engines.batched`) against the per-client reference path.

Primitive level: `local_train_many` for C clients equals `training.local_train` called client by
client on the same starts and seeds (momentum, weight decay, gradient clipping, different dataset
sizes, partial last batches, BatchNorm statistics, dropout masks). Round level: every plan-based
algorithm gives the same per-round metrics with engine='batched' and engine='per_client'. Engine
selection and the memory budget fail before round 1 with a message saying what to change.

All data are synthetic (small tensors, or the `fake-fmnist` stand-in), so nothing here needs the
real Fashion-MNIST files and the whole file runs in well under a minute on two CPU cores.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from pflrepro.algorithms import ALGORITHMS
from pflrepro.core.engines import batched, grouped
from pflrepro.core.engines import MemoryBudgetError, NotBatchable, local_train_many, uses_plans
from pflrepro.core.loop import run_rounds
from pflrepro.core.training import batchable, local_train
from pflrepro.federation.build import build_context
from pflrepro.federation.config import RunConfig
from pflrepro.pipeline.store import WALL_COLUMNS


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """One intra-op thread: these kernels are tiny, and on a shared 2-core machine a second
    spinning OpenMP thread makes every step many times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(params=["vmap", "grouped"], autouse=True)
def _conv_kernels(request, monkeypatch):
    """Every test twice: with the batched engine's convolutions as `vmap` runs them (`core.engines.grouped` switched off),
    and through `core.engines.grouped` (one channels-last kernel for all clients) wherever a model has its layers, one client
    included; tests/test_grouped.py checks where the engine uses it on its own."""
    if request.param == "grouped":
        monkeypatch.setattr(grouped, "GROUPED_MIN_ROWS", 0)
        monkeypatch.setattr(grouped, "GROUPED_MIN_CLIENTS", 0)
    else:
        monkeypatch.setattr(grouped, "GROUPED_MIN_CLIENTS", 10 ** 9)
    return request.param


PARAM_ATOL = 1e-5      # final parameters / buffers, batched vs per client (float32, a few dozen steps)
LOSS_RTOL = 1e-5       # TrainStats.loss
ACC_ATOL = 1e-4        # per-round accuracies (round level)
ROUND_LOSS_RTOL = 1e-4  # per-round train_loss (round level)


# ---------------------------------------------------------------- primitive level: helpers
def _mlp(seed: int, *, bn: bool = False, dropout: float = 0.0) -> nn.Module:
    torch.manual_seed(seed)
    layers = [nn.Linear(6, 16)]
    if bn:
        layers.append(nn.BatchNorm1d(16))
    layers.append(nn.ReLU())
    if dropout:
        layers.append(nn.Dropout(dropout))
    layers += [nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 3)]
    return nn.Sequential(*layers)


def _conv(seed: int, *, bn: bool = False, dropout: float = 0.0) -> nn.Module:
    """A tiny CNN on 1x8x8 inputs (BatchNorm2d / Dropout2d act per channel)."""
    torch.manual_seed(seed)
    layers = [nn.Conv2d(1, 4, 3)]
    if bn:
        layers.append(nn.BatchNorm2d(4))
    layers.append(nn.ReLU())
    if dropout:
        layers.append(nn.Dropout2d(dropout))
    layers += [nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 3 * 3, 3)]
    return nn.Sequential(*layers)


def _data(kind: str, n: int = 200, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((n, 6) if kind == "mlp" else (n, 1, 8, 8), generator=g)
    flat = x.reshape(n, -1)
    y = (flat[:, 0] > 0).long() + (flat[:, 1] > 0.5).long()
    return x, y


def _indices(sizes, n: int, seed: int = 1) -> list[torch.Tensor]:
    """Disjoint client index sets of the given sizes."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    cuts = np.cumsum([0, *sizes])
    assert cuts[-1] <= n
    return [perm[a:b] for a, b in zip(cuts[:-1], cuts[1:])]


def _per_client(build, starts, x, y, index, seeds, **kw):
    """The reference: `local_train` client by client, each on a fresh module holding its start."""
    out = []
    for s, ix, sd in zip(starts, index, seeds):
        net = build(0)
        net.load_state_dict(s)
        stats = local_train(net, x[ix], y[ix], seed=sd, **kw)
        out.append(({n: t.detach().clone() for n, t in net.state_dict().items()}, stats))
    return out


def _batched(build, starts, x, y, index, seeds, **kw):
    res = local_train_many(build(0), starts, x, y, index, seeds=seeds, **kw)
    return [({n: t.detach().clone() for n, t in st.items()}, stats) for st, stats in res]


def _assert_states_close(got: dict, want: dict, atol: float = PARAM_ATOL, what: str = ""):
    assert set(got) == set(want)
    for n in want:
        if torch.is_floating_point(want[n]):
            torch.testing.assert_close(got[n], want[n], atol=atol, rtol=0, msg=lambda m: f"{what}{n}: {m}")
        else:   # num_batches_tracked: exact
            assert torch.equal(got[n], want[n]), f"{what}{n}: {got[n]} != {want[n]}"


def _assert_stats_equal(got, want, what=""):
    assert got.steps == want.steps, f"{what}steps {got.steps} != {want.steps}"
    assert got.samples == want.samples, f"{what}samples {got.samples} != {want.samples}"
    assert got.loss == pytest.approx(want.loss, rel=LOSS_RTOL), f"{what}loss {got.loss} != {want.loss}"


def _max_diff(a: dict, b: dict) -> float:
    return max(float((a[n].double() - b[n].double()).abs().max()) for n in a if torch.is_floating_point(a[n]))


OPT = dict(batch_size=8, lr=0.05, momentum=0.9, weight_decay=1e-3, grad_clip=1.0)


# ---------------------------------------------------------------- 1. primitive equivalence
def test_local_train_many_equals_local_train_per_client():
    """Sizes 37, 10, 64, 23 at batch 8: 5, 2, 8, 3 steps per epoch with last batches of 5, 2, 8
    and 7 samples, so at most steps the stacked clients have different batch sizes and the short
    clients finish early; different starts and seeds per client."""
    x, y = _data("mlp")
    sizes = [37, 10, 64, 23]
    index = _indices(sizes, len(y))
    starts = [_mlp(10 + i).state_dict() for i in range(len(sizes))]
    seeds = [101, 7, 55, 3]
    kw = dict(epochs=2, **OPT)
    want = _per_client(_mlp, starts, x, y, index, seeds, **kw)
    got = _batched(_mlp, starts, x, y, index, seeds, **kw)
    for i, ((gs, gst), (ws, wst)) in enumerate(zip(got, want)):
        _assert_stats_equal(gst, wst, f"client {i}: ")
        assert wst.steps == 2 * math.ceil(sizes[i] / 8) and wst.samples == 2 * sizes[i]
        _assert_states_close(gs, ws, what=f"client {i}: ")
        assert _max_diff(gs, starts[i]) > 1e-2, "the client did not train at all"
    # the equality is not vacuous: gradient clipping is active (clip=1.0 changes the result)
    unclipped = _per_client(_mlp, starts, x, y, index, seeds, **{**kw, "grad_clip": 0.0})
    assert max(_max_diff(u[0], w[0]) for u, w in zip(unclipped, want)) > 100 * PARAM_ATOL


def test_local_train_many_exempts_biases_from_weight_decay_as_local_train():
    """`bias_decay=False` (FedRep's code): the batched primitive equals the per-client one, and it is not the
    all-decayed update (a weight decay of 0.5 makes the difference visible after two epochs)."""
    x, y = _data("mlp")
    sizes = [37, 10]
    index = _indices(sizes, len(y))
    starts = [_mlp(10 + i).state_dict() for i in range(len(sizes))]
    kw = dict(epochs=2, **{**OPT, "weight_decay": 0.5})
    want = _per_client(_mlp, starts, x, y, index, [1, 2], bias_decay=False, **kw)
    got = _batched(_mlp, starts, x, y, index, [1, 2], bias_decay=False, **kw)
    for (gs, gst), (ws, wst) in zip(got, want):
        _assert_stats_equal(gst, wst)
        _assert_states_close(gs, ws)
    every = _per_client(_mlp, starts, x, y, index, [1, 2], **kw)
    assert max(_max_diff({n: t for n, t in u[0].items() if "bias" in n}, {n: t for n, t in w[0].items() if "bias" in n})
               for u, w in zip(every, want)) > 100 * PARAM_ATOL

def test_local_train_many_steps_cap_and_trainable_subset():
    """`steps` caps training mid-epoch, `trainable` freezes the first layer (no weight decay on it)."""
    x, y = _data("mlp")
    sizes = [30, 12, 50]
    index = _indices(sizes, len(y), seed=2)
    starts = [_mlp(20 + i).state_dict() for i in range(3)]
    seeds = [1, 2, 3]
    kw = dict(epochs=1, steps=5, trainable=lambda n: not n.startswith("0."), **OPT)
    want = _per_client(_mlp, starts, x, y, index, seeds, **kw)
    got = _batched(_mlp, starts, x, y, index, seeds, **kw)
    for i, ((gs, gst), (ws, wst)) in enumerate(zip(got, want)):
        _assert_stats_equal(gst, wst, f"client {i}: ")
        assert gst.steps == 5
        _assert_states_close(gs, ws, what=f"client {i}: ")
        assert torch.equal(gs["0.weight"], starts[i]["0.weight"])   # frozen: untouched


def test_local_train_many_per_client_steps():
    """A list of `steps` caps each client on its own (the wait-free clock gives each PM its own budget);
    None in the list means the client's full `epochs`."""
    x, y = _data("mlp")
    sizes = [30, 12, 50]
    index = _indices(sizes, len(y), seed=3)
    starts = [_mlp(30 + i).state_dict() for i in range(3)]
    seeds, caps = [4, 5, 6], [7, None, 2]
    got = _batched(_mlp, starts, x, y, index, seeds, epochs=2, steps=caps, **OPT)
    for i, cap in enumerate(caps):
        (ws, wst), = _per_client(_mlp, [starts[i]], x, y, [index[i]], [seeds[i]], epochs=2, steps=cap, **OPT)
        gs, gst = got[i]
        _assert_stats_equal(gst, wst, f"client {i}: ")
        assert gst.steps == (cap if cap is not None else 2 * math.ceil(sizes[i] / OPT["batch_size"]))
        _assert_states_close(gs, ws, what=f"client {i}: ")


# ---------------------------------------------------------------- 2. finished clients are left alone
def test_finished_clients_are_not_touched_afterwards():
    """Client 0 has 1 step per epoch (6 samples), client 1 has 7 (50 samples): client 0 stops after
    3 steps while client 1 runs 18 more. Its weights and BN statistics must be those of the
    per-client path, i.e. no further momentum / weight-decay update and no BN update after its
    last step (one extra step would move it far more than the tolerance, checked below)."""
    x, y = _data("mlp")
    index = _indices([6, 50], len(y), seed=3)
    build = lambda s: _mlp(s, bn=True)           # noqa: E731
    starts = [build(30).state_dict(), build(31).state_dict()]
    seeds = [5, 6]
    kw = dict(epochs=3, **OPT)
    want = _per_client(build, starts, x, y, index, seeds, **kw)
    got = _batched(build, starts, x, y, index, seeds, **kw)
    # the order of `starts` must not matter either: the long client first, then the short one
    got_rev = _batched(build, starts[::-1], x, y, index[::-1], seeds[::-1], **kw)[::-1]
    for res in (got, got_rev):
        assert [s.steps for _, s in res] == [3, 21]
        for i in range(2):
            _assert_stats_equal(res[i][1], want[i][1], f"client {i}: ")
            # the finished client: 3 steps, float rounding only (tighter than PARAM_ATOL)
            _assert_states_close(res[i][0], want[i][0], atol=1e-6 if i == 0 else PARAM_ATOL, what=f"client {i}: ")
        assert int(res[0][0]["1.num_batches_tracked"]) == 3      # BN counted its 3 steps, no more
    # discrimination: one more local step of client 0 moves it by much more than the tolerance
    longer = _per_client(build, starts[:1], x, y, index[:1], seeds[:1], **{**kw, "epochs": 4})
    assert _max_diff(longer[0][0], want[0][0]) > 1e-3


# ---------------------------------------------------------------- 3. BatchNorm
@pytest.mark.parametrize("kind", ["mlp", "conv"])
def test_batchnorm_running_statistics_are_per_client(kind):
    build = (lambda s: _mlp(s, bn=True)) if kind == "mlp" else (lambda s: _conv(s, bn=True))
    x, y = _data(kind, n=120)
    sizes = [21, 34, 13]                  # last batches of 5, 2, 5 samples (never 1: BN needs >= 2)
    index = _indices(sizes, len(y), seed=4)
    starts = [build(40 + i).state_dict() for i in range(3)]
    seeds = [11, 12, 13]
    kw = dict(epochs=2, **OPT)
    want = _per_client(build, starts, x, y, index, seeds, **kw)
    got = _batched(build, starts, x, y, index, seeds, **kw)
    bn = [n for n in starts[0] if "running_" in n or "num_batches" in n]
    assert len(bn) == 3
    for i in range(3):
        _assert_stats_equal(got[i][1], want[i][1], f"client {i}: ")
        _assert_states_close(got[i][0], want[i][0], what=f"client {i}: ")
        assert int(got[i][0][bn[2]]) == want[i][1].steps
    # each client's statistics are its own: they differ between clients
    assert not torch.allclose(got[0][0][bn[0]], got[1][0][bn[0]], atol=1e-3)


@batchable
def _teacher_kd_loss(m, xb, yb, aux):
    """pFedSD's shape of loss term: a teacher state (with BatchNorm buffers) run in train mode."""
    with torch.no_grad():
        t = m.run(aux["teacher"], xb, train=True)
    logits = m(xb)
    return torch.nn.functional.cross_entropy(logits, yb) + ((logits - t) ** 2).mean()


@pytest.mark.parametrize("n_clients", [1, 2])
def test_teacher_state_with_batchnorm_in_train_mode(n_clients):
    """A chunk of one client used to pass its teacher's BN buffers unbatched (shared), and BatchNorm
    refused the batched in-place update (pFedSD Table 8 mini, MobileNetV2, a round where only one
    selected client had a teacher). One or two clients: equal to the per-client path."""
    build = lambda s: _conv(s, bn=True)
    x, y = _data("conv", n=80)
    index = _indices([21, 34][:n_clients], len(y), seed=5)
    starts = [build(50 + i).state_dict() for i in range(n_clients)]
    teachers = [build(60 + i).state_dict() for i in range(n_clients)]
    seeds = [21, 22][:n_clients]
    kw = dict(epochs=1, loss=_teacher_kd_loss, **OPT)
    want = []
    for s, t, ix, sd in zip(starts, teachers, index, seeds):
        net = build(0)
        net.load_state_dict(s)
        stats = local_train(net, x[ix], y[ix], seed=sd, aux={"teacher": t}, **kw)
        want.append(({n: v.detach().clone() for n, v in net.state_dict().items()}, stats))
    got = _batched(build, starts, x, y, index, seeds, aux=[{"teacher": t} for t in teachers], **kw)
    for i in range(n_clients):
        _assert_stats_equal(got[i][1], want[i][1], f"client {i}: ")
        _assert_states_close(got[i][0], want[i][0], what=f"client {i}: ")


# ---------------------------------------------------------------- 4. dropout
@pytest.mark.parametrize("kind", ["mlp", "conv"])
def test_dropout_masks_equal_the_per_client_path(kind):
    """nn.Dropout (mlp) and nn.Dropout2d (conv): masks drawn per client from its own seed, so on
    CPU the batched result equals the per-client one."""
    build = (lambda s: _mlp(s, dropout=0.3)) if kind == "mlp" else (lambda s: _conv(s, dropout=0.3))
    x, y = _data(kind, n=120)
    sizes = [21, 34, 9]
    index = _indices(sizes, len(y), seed=5)
    starts = [build(50 + i).state_dict() for i in range(3)]
    seeds = [21, 22, 23]
    kw = dict(epochs=2, **OPT)
    want = _per_client(build, starts, x, y, index, seeds, **kw)
    got = _batched(build, starts, x, y, index, seeds, **kw)
    for i in range(3):
        _assert_stats_equal(got[i][1], want[i][1], f"client {i}: ")
        _assert_states_close(got[i][0], want[i][0], what=f"client {i}: ")
    # discrimination: other seeds (other masks, other data order) give clearly other weights
    other = _per_client(build, starts, x, y, index, [s + 1000 for s in seeds], **kw)
    assert min(_max_diff(o[0], w[0]) for o, w in zip(other, want)) > 100 * PARAM_ATOL


# ---------------------------------------------------------------- round level: helpers
@pytest.fixture(scope="module", autouse=True)
def _small_standin():
    """The stand-in Fashion-MNIST at 1% scale (600 train / 100 test images): the global test set
    that every round evaluates on stays small too."""
    from pflrepro.data.datasets import load_dataset
    from pflrepro.federation import build
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(build._RAW_CACHE, "fake-fmnist", load_dataset("fake-fmnist", fake_scale=0.01))
        yield


def _round_cfg(algorithm: str, engine: str, hparams: dict | None = None, **kw) -> dict:
    """A tiny run on the (small) stand-in Fashion-MNIST: 4 clients of unequal sizes (Dirichlet), 2 rounds."""
    base = dict(algorithm=algorithm, hparams=hparams or {}, dataset="fake-fmnist", subsample=0.5,
                n_clients=4, partition="dirichlet", partition_params={"alpha": 1.0, "min_size": 40},
                split="random", split_params={"fractions": [0.8, 0.2]}, model="cnn_cifar10", rounds=2,
                local_epochs=1, batch_size=16, lr=0.05, momentum=0.9, weight_decay=1e-4, grad_clip=5.0,
                engine=engine)
    base.update(kw)
    return base


class _Spy:
    """Counts calls of the batched primitive (chunk sizes) while installed."""

    def __init__(self, monkeypatch):
        self.chunks: list[int] = []
        real = batched.local_train_many

        def spy(module, starts, *a, **kw):
            self.chunks.append(len(starts))
            return real(module, starts, *a, **kw)
        monkeypatch.setattr(batched, "local_train_many", spy)


def _run(cfg: dict, **kw):
    c = RunConfig.from_dict(cfg)
    ctx = build_context(c, torch.device("cpu"))
    algo = ALGORITHMS[c.algorithm](ctx, **c.hparams)
    return run_rounds(ctx, algo, progress=False, **kw)


def _assert_same_as_per_client(got, cfg: dict):
    """An `auto` fallback is the per-client path itself: every metric equal, not just close."""
    want = _run({**cfg, "engine": "per_client"})
    drop = WALL_COLUMNS  # wall time is not a metric
    assert [{k: v for k, v in h.items() if k not in drop} for h in got.history] == \
        [{k: v for k, v in h.items() if k not in drop} for h in want.history]
    assert got.per_client == want.per_client


def _assert_same_history(got, want):
    assert len(got.history) == len(want.history) == 2
    for g, w in zip(got.history, want.history):
        assert g["round"] == w["round"]
        assert g["bytes_up"] == w["bytes_up"] and g["bytes_down"] == w["bytes_down"]
        assert g["train_loss"] == pytest.approx(w["train_loss"], rel=ROUND_LOSS_RTOL), (g, w)
        for m in ("gm_acc", "pm_acc_mean", "pm_acc_weighted", "pm_acc_std", "pm_acc_min"):
            if math.isnan(w[m]):
                assert math.isnan(g[m]), (m, g, w)
            else:
                assert g[m] == pytest.approx(w[m], abs=ACC_ATOL), (m, g, w)
    np.testing.assert_allclose(np.array(got.per_client, dtype=float), np.array(want.per_client, dtype=float),
                               atol=ACC_ATOL, rtol=0)
    assert got.samples == want.samples


def _flat(tree, prefix=""):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _flat(v, f"{prefix}{k}.")
    elif isinstance(tree, torch.Tensor):
        yield prefix[:-1], tree


def _assert_same_states(got, want, atol=1e-4):
    """Server and client states (weights after 2 rounds) agree too, not only the metrics."""
    g = dict(_flat({"server": got.server, "clients": got.clients}))
    w = dict(_flat({"server": want.server, "clients": want.clients}))
    assert set(g) == set(w) and w
    for n in w:
        if torch.is_floating_point(w[n]):
            torch.testing.assert_close(g[n], w[n], atol=atol, rtol=0, msg=lambda m: f"{n}: {m}")
        else:
            assert torch.equal(g[n], w[n]), n


# ---------------------------------------------------------------- 5. round-level equivalence
PLANNED = sorted(n for n, cls in ALGORITHMS.items() if uses_plans(cls.__new__(cls)))

# extra settings per algorithm (kept cheap), and extra variants of the plan-based ones
_HP = {"fedavg_ft": {"ft_epochs": 1}, "fedprox_ft": {"ft_epochs": 1}, "scaffold_ft": {"ft_epochs": 1},
       "feddf": {"distill_steps": 3},
       "fedala": {"num_pre_loss": 1}}     # round 2's first ALA stops after its second pass: 2 ALA calls, then training
_EXTRA = {"feddf": {"public": {"size": 40}},     # algorithms that distil on an unlabeled public set
          # FedRep's round is many steps (head epochs, then the body) at momentum 0.9: at lr 0.05 the two engines'
          # float rounding (3e-7 on round 1's loss) grew to 3 % on round 2's on an AMD EPYC host (a near tie in
          # max-pooling routes a gradient differently; momentum 0 agrees to 1e-9), while accuracies matched; at
          # lr 0.02 the engines agree to 1e-8 on both rounds. The comparison tests the engine, not a chaotic regime.
          "fedrep": {"lr": 0.02}}
_VARIANTS = [
    # wait-free with the window budget: each client's PM gets its own step count, still one batched call
    ("scd", {}, {"clock": {"protocol": "wait_free", "pm_budget": "window"}}),
    ("pfedsd", {"teacher": "stored"}, {}),
    ("pfedsd", {"teacher": "recompute", "teacher_mode": "eval"}, {}),
    ("pfedsd", {"reg": "ewc", "lam": 0.1}, {}),
    ("pfedsd", {"reg": "l2", "lam": 0.1}, {}),
    ("pfedsd", {"reg": "mse_prob"}, {}),
    # pFedSD's own CNN has Dropout2d: student and teacher (train mode) draw masks in the loss term
    ("pfedsd", {"teacher": "recompute", "teacher_mode": "train"}, {"model": "cnn_fmnist"}),
]
# heterogeneous models: one group (and one batched call) per architecture and round
# (LG-FedAvg shares the head: FedGH's CNN-4/CNN-5 both end in a 500 -> 10 layer)
_HETERO = [("local", {}, {"models": ["cnn_cifar10", "mlp"]}),
           ("lg_fedavg", {"head_layers": 1}, {"model": "cnn4", "models": ["cnn4", "cnn5"]})]


def _id(n, hp, kw):
    return "-".join([n] + [f"{k}={'+'.join(v) if isinstance(v, list) else v}" for k, v in {**hp, **kw}.items()])


# a second plan after the first (`context.Then`: Ditto's and SCD's PM, FedRep's body): two batched calls a round
_TWO_PHASE = {"ditto", "scd", "fedrep", "fedala"}
ROUND_CASES = ([pytest.param(n, _HP.get(n, {}), _EXTRA.get(n, {}), [4] * (4 if n in _TWO_PHASE else 2), id=n)
                for n in PLANNED]
               + [pytest.param(n, hp, kw, [4] * (4 if n in _TWO_PHASE else 2), id=_id(n, hp, kw))
                  for n, hp, kw in _VARIANTS]
               + [pytest.param(n, hp, kw, [2, 2, 2, 2], id=_id(n, hp, kw)) for n, hp, kw in _HETERO])


def test_plan_based_algorithms_are_discovered():
    """The round-level comparison covers at least these (so it cannot silently become empty)."""
    for name in ("fedavg", "fedprox", "pfedsd", "fedper", "lg_fedavg", "local", "fedavg_last_local"):
        assert name in PLANNED, PLANNED
    assert "fedgh" not in PLANNED      # overrides client_update


@pytest.mark.parametrize("algorithm, hparams, extra, chunks", ROUND_CASES)
def test_batched_round_equals_per_client(monkeypatch, algorithm, hparams, extra, chunks):
    spy = _Spy(monkeypatch)
    ref = _run(_round_cfg(algorithm, "per_client", hparams, **extra))
    assert spy.chunks == []                       # the reference never touches the batched engine
    got = _run(_round_cfg(algorithm, "batched", hparams, **extra))
    assert spy.chunks == chunks, spy.chunks       # the 4 clients trained together (per architecture and phase), each round
    _assert_same_history(got, ref)
    _assert_same_states(got, ref)


# ---------------------------------------------------------------- 6. engine selection
def test_auto_trains_grouped_convolutions_per_client_on_cpu(monkeypatch):
    """On a CPU, engine='auto' leaves architectures with grouped (depthwise) convolutions to the
    per-client path, which is faster there; 'batched' still batches them; other models batch, below the rules'
    batch size, client count and parameter bounds (`batched.slower_batched`)."""
    assert batched.slower_batched(nn.Sequential(nn.Conv2d(4, 4, 3, groups=4)), torch.device("cpu"))
    assert not batched.slower_batched(nn.Sequential(nn.Conv2d(4, 4, 3, groups=4)), torch.device("cuda"))
    assert not batched.slower_batched(_conv(0), torch.device("cpu"))
    # a convolution at B >= 32 on a CPU batches only through `grouped` and with BATCHED_CONV_MIN_CLIENTS clients
    cpu, many = torch.device("cpu"), batched.BATCHED_CONV_MIN_CLIENTS
    assert not batched.slower_batched(_conv(0), cpu, batch_size=31, clients=2)
    assert batched.slower_batched(_conv(0), cpu, batch_size=32, clients=many - 1)
    assert not batched.slower_batched(_conv(0), cpu, batch_size=32, clients=many)
    assert batched.slower_batched(_conv(0, bn=True), cpu, batch_size=32, clients=many)     # BatchNorm: no `grouped`
    assert not batched.slower_batched(_conv(0, bn=True), cpu, batch_size=31, clients=2)
    assert not batched.slower_batched(_conv(0), torch.device("cuda"), batch_size=64)
    # MLPs batch at any batch size, up to BATCHED_MAX_PARAMS parameters (then their stacked state leaves the caches)
    assert not batched.slower_batched(nn.Sequential(nn.Flatten(), nn.Linear(4, 2)), cpu, batch_size=512)
    big = nn.Linear(1000, batched.BATCHED_MAX_PARAMS // 1000)      # one bias over the bound
    assert batched.slower_batched(big, cpu, batch_size=16, clients=many)
    assert not batched.slower_batched(big, torch.device("cuda"), batch_size=16, clients=many)
    spy = _Spy(monkeypatch)
    cfg = _round_cfg("fedavg", "auto", model="mobilenetv2", n_clients=2, rounds=1, subsample=0.04,
                     partition_params={"alpha": 1.0, "min_size": 8})
    auto = _run(cfg)
    assert spy.chunks == []
    _assert_same_as_per_client(auto, cfg)
    _run({**cfg, "engine": "batched"})
    assert spy.chunks == [2]


def test_batched_engine_refuses_client_update_algorithms_before_round_1(monkeypatch):
    spy = _Spy(monkeypatch)
    cfg = RunConfig.from_dict(_round_cfg("fedgh", "batched", rounds=1))
    ctx = build_context(cfg, torch.device("cpu"))
    algo = ALGORITHMS["fedgh"](ctx, **cfg.hparams)
    assert not uses_plans(algo)
    calls = []
    monkeypatch.setattr(algo, "client_update", lambda *a, **k: calls.append("client_update"))
    with pytest.raises(NotBatchable) as e:
        run_rounds(ctx, algo, progress=False, on_checkpoint=lambda s: calls.append("checkpoint"))
    msg = str(e.value)
    assert "'fedgh'" in msg and "client_update" in msg and "per_client" in msg and "auto" in msg, msg
    assert calls == [] and spy.chunks == []      # nothing ran
    # engine='auto' runs it, client by client
    res = _run(_round_cfg("fedgh", "auto", rounds=1))
    assert len(res.history) == 1 and spy.chunks == []
    _assert_same_as_per_client(res, _round_cfg("fedgh", "auto", rounds=1))


# ---------------------------------------------------------------- 7. memory budget
def test_tiny_memory_budget_fails_before_round_1(monkeypatch):
    spy = _Spy(monkeypatch)
    cfg = RunConfig.from_dict(_round_cfg("fedavg", "batched", memory_budget_mb=0.01))
    ctx = build_context(cfg, torch.device("cpu"))
    algo = ALGORITHMS["fedavg"](ctx)
    calls = []
    monkeypatch.setattr(algo, "aggregate", lambda *a, **k: calls.append("aggregate"))
    with pytest.raises(MemoryBudgetError, match="memory_budget_mb=0.01") as e:
        run_rounds(ctx, algo, progress=False, on_checkpoint=lambda s: calls.append("checkpoint"))
    assert "per_client" in str(e.value)
    assert calls == [] and spy.chunks == []
    # engine='auto' with the same budget falls back to per-client training (with a warning)
    with pytest.warns(UserWarning, match="memory_budget_mb"):
        res = _run(_round_cfg("fedavg", "auto", memory_budget_mb=0.01, rounds=1))
    assert len(res.history) == 1 and spy.chunks == []
    _assert_same_as_per_client(res, _round_cfg("fedavg", "auto", memory_budget_mb=0.01, rounds=1))


def test_memory_budget_chunks_clients_with_the_same_result(monkeypatch):
    n = 5
    cfg = RunConfig.from_dict(_round_cfg("fedprox", "batched", n_clients=n, memory_budget_mb=1e6))
    ctx = build_context(cfg, torch.device("cpu"))
    algo = ALGORITHMS["fedprox"](ctx, **cfg.hparams)
    server = algo.server_init()
    need = batched._need(ctx, 0, algo.plan(1, 0, server, None))["total"]
    budget = 2.5 * need / 2**20                   # room for 2 clients, not 3
    assert batched.chunk_size(need, budget, n) == 2

    spy = _Spy(monkeypatch)
    whole = _run(_round_cfg("fedprox", "batched", n_clients=n, memory_budget_mb=1e6))
    assert spy.chunks == [n, n]
    spy.chunks.clear()
    chunked = _run(_round_cfg("fedprox", "batched", n_clients=n, memory_budget_mb=budget))
    assert spy.chunks == [2, 2, 1, 2, 2, 1], spy.chunks
    _assert_same_history(chunked, whole)
    _assert_same_states(chunked, whole)


@pytest.mark.parametrize("momentum, weight_decay", [(0.0, 0.0), (0.0, 1e-2), (0.9, 0.0), (0.9, 1e-2)])
@pytest.mark.parametrize("contiguous", [True, False])      # False: the explicit (non-fused) form
def test_sgd_update_matches_torch_sgd(momentum, weight_decay, contiguous):
    from pflrepro.core.engines.many import sgd_update
    g0 = torch.Generator().manual_seed(0)
    ps = [torch.randn(4, 3, 5, generator=g0), torch.randn(4, 7, generator=g0)]
    ref = [p.clone().requires_grad_() for p in ps]
    opt = torch.optim.SGD(ref, lr=0.1, momentum=momentum, weight_decay=weight_decay)
    bufs = [torch.zeros_like(p) for p in ps] if momentum else []
    for t in range(3):
        gs = [torch.randn(p.shape, generator=g0) for p in ps]
        for r, g in zip(ref, gs):
            r.grad = g.clone()
        opt.step()
        mine = [g.clone() if contiguous else torch.cat([g, g], -1)[..., :g.shape[-1]] for g in gs]
        assert all(m.is_contiguous() == contiguous for m in mine)
        sgd_update(ps, mine, bufs, lr=0.1, momentum=momentum, weight_decay=weight_decay, first=t == 0)
    for p, r in zip(ps, ref):
        torch.testing.assert_close(p, r.detach(), rtol=0, atol=1e-6)
