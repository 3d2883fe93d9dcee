"""What is scored, method by method: this file mirrors docs/evaluation.md's table "What is scored, for every
method" for the families its closing paragraph listed as unchecked (FedRep, FedRoD, FedBN, APFL, pFedSD, SCD,
PerFed-CKT, DC-PFL/FedGH, Local, FD, FedProto, FML, FedKD, FedAvg+last-local, L2GD, FedFomo) and completes FedPer
and LG-FedAvg (the shared part too).

Each test runs a tiny federation (4 clients, 2% of Fashion-MNIST, 1-2 rounds, one local epoch) with the round loop
itself (`run_rounds`), then compares, parameter by parameter, the state dict of the model that `evaluate` scores
(`algo.personal_model(k, server, clients.get(k))`, and `algo.global_model(server)` or `averaged_personal_model` for
the generic column) with the pieces the table names: the server state after the last aggregation, the client's
stored state, the client's last upload (recorded by wrapping `algo.upload`; FedKD's deltas by wrapping
`algo.aggregate`), or its architecture's initial weights. Each check is paired with one against the obvious wrong
alternative (the server's copy of a personal part, the client's own upload instead of the average, v_k or w instead
of APFL's mixture, ...), so that scoring the wrong model fails. The column "clients not selected this round" is
checked on the clients a run never selected (`cstate` None, as `evaluate` passes them) and, where a run selects
everybody, by calling `personal_model` with None directly.
"""
import pytest
import torch

from pflrepro.algorithms import ALGORITHMS
from pflrepro.algorithms.fedkd import compress_state
from pflrepro.algorithms.fedproto import NearestPrototype
from pflrepro.core.aggregation import clone_state, plain_average, weighted_average
from pflrepro.core.loop import run_rounds
from pflrepro.core.schedule import sample_clients
from pflrepro.data.models import bn_names
from pflrepro.federation.build import build_context
from pflrepro.federation.config import RunConfig
from tests.conftest import FMNIST_AVAILABLE, small_cfg

needs_fmnist = pytest.mark.skipif(not FMNIST_AVAILABLE, reason="needs offline Fashion-MNIST")
HEAD = {"head.weight", "head.bias"}              # cnn_cifar10's (and cnn_bn's) last linear layer
FC2 = {"body.fc2.weight", "body.fc2.bias"}       # cnn_cifar10's second-to-last parametrised layer


def _ctx(**kw):
    """4 clients, one round, half of them selected: 2 train, 2 are never selected (sample_clients: m = 2)."""
    cfg = RunConfig.from_dict(small_cfg(**{"subsample": 0.02, "n_clients": 4, "rounds": 1, "participation": 0.5,
                                           **kw}))
    return build_context(cfg, torch.device("cpu"))


def _same(a: dict, b: dict, names) -> bool:
    return all(torch.equal(a[n], b[n]) for n in names)


def _moved(a: dict, b: dict, names) -> bool:
    return all(not torch.equal(a[n], b[n]) for n in names)


def _close(a: dict, b: dict, names, rtol=1e-5, atol=1e-6) -> bool:
    """Equal up to float rounding (averages recomputed here, possibly in another order)."""
    return all(torch.allclose(a[n].double(), b[n].double(), rtol=rtol, atol=atol) for n in names)


def _pm(algo, k, server, cstate):
    """State dict of the personalized model `evaluate` scores for client k (None: the GM), copied at once:
    `ctx.model` reuses one module per architecture."""
    net = algo.personal_model(k, server, cstate)
    return None if net is None else clone_state(net.state_dict())


def _gm(algo, server):
    net = algo.global_model(server)
    return None if net is None else clone_state(net.state_dict())


def _averaged_pm(algo, res):
    net = algo.averaged_personal_model(res.server, res.clients)
    return None if net is None else clone_state(net.state_dict())


def _record_uploads(algo) -> dict:
    """Every payload client k uploads, in order (`sent[k][-1]`: its last upload); an instance attribute shadows
    `Algorithm.upload`, which every `finish`/`client_update` here calls as `self.upload`."""
    sent: dict[int, list] = {}
    upload = algo.upload

    def recording(k, net, stats, server, keys=None):
        up = upload(k, net, stats, server, keys=keys)
        sent.setdefault(k, []).append(clone_state(up.payload))
        return up
    algo.upload = recording
    return sent


def _selected(ctx, rnd: int) -> list:
    """The clients the synchronous schedule selects in round `rnd` (schedule.Synchronous.dispatch)."""
    return sample_clients(ctx.cfg, rnd, ctx.data.n_train().numpy())


def _who(ctx, res) -> tuple[list, list]:
    """(clients with a state, clients without one)."""
    ks = range(ctx.cfg.n_clients)
    return [k for k in ks if res.clients.get(k)], [k for k in ks if not res.clients.get(k)]


def _weights(ctx, ks) -> list:
    return [float(len(ctx.data.train[k])) for k in ks]


def _one_round_split(ctx, res) -> list:
    trained, never = _who(ctx, res)
    assert trained == _selected(ctx, 1) and len(trained) == 2 and len(never) == 2
    return trained


def _check_own_models(ctx, algo, res, trained_differs):
    """Methods whose PM is the client's own model (cstate['params']) and that keep no GM: a selected client is
    scored on its own trained model (`trained_differs(pm, initial)`), each client on a different one, a client
    never selected on its initial model; the generic column is the plain average of the trained clients' PMs.
    Returns ({client: PM state}, the average's state)."""
    trained = _one_round_split(ctx, res)
    assert algo.global_model(res.server) is None
    pms = {}
    for k in range(ctx.cfg.n_clients):
        c = res.clients.get(k)
        pm = _pm(algo, k, res.server, c)
        init = ctx.initial(k)
        assert set(pm) == set(init)
        if not c:
            assert _same(pm, init, init)                   # never selected: its initial model
            continue
        assert set(c["params"]) == set(init) and _same(pm, c["params"], init)
        assert trained_differs(pm, init)                   # trained, not its initial model
        pms[k] = pm
    a, b = trained
    assert not _same(pms[a], pms[b], pms[a])               # each client's own model
    avg = _averaged_pm(algo, res)
    assert _close(avg, plain_average([res.clients[k]["params"] for k in trained]), avg)
    return pms, avg


def _check_split_scoring(ctx, algo, res, sent, shared, own, key, moving):
    """Methods whose PM is the server's `shared` part + the client's own part (cstate[key], names `own`) and that
    keep no GM: a selected client is scored on the average (not its own upload) and on its own trained part (the
    `moving` names differ from the server's copy); a client never selected on its initial own part; the generic
    column is the shared part + the mean of the trained clients' own parts."""
    g = res.server["params"]
    trained = [k for k in range(ctx.cfg.n_clients) if res.clients.get(k)]
    for k in range(ctx.cfg.n_clients):
        c = res.clients.get(k)
        pm = _pm(algo, k, res.server, c)
        assert set(pm) == set(g)
        assert _same(pm, g, shared)                        # the server's shared part, after this round's average
        if not c:
            assert _same(pm, ctx.initial(k), own)          # never selected: the initial own part
            continue
        assert set(c[key]) == set(own) and _same(pm, c[key], own)
        assert _moved(pm, g, moving)                       # its own trained part, not the server's (initial) copy
        assert not _same(pm, sent[k][-1], shared)          # the average, not its own upload
    assert algo.global_model(res.server) is None
    avg = _averaged_pm(algo, res)
    assert _close(avg, g, shared)
    assert _close(avg, plain_average([res.clients[k][key] for k in trained]), own)


# ---------------------------------------------------------------- FedPer, LG-FedAvg, FedRep
@needs_fmnist
@pytest.mark.parametrize("name, hparams", [("fedper", {}), ("lg_fedavg", {}),
                                           ("fedrep", {"head_epochs": 1, "body_epochs": 1})])
def test_partial_sharing_scores_the_global_shared_part_with_the_clients_own_part(name, hparams):
    """fedper: server's averaged body + own head (last 2 layers); lg_fedavg: server's averaged head (last 2
    layers) + own body; fedrep: server's averaged body + own head (last layer). Never selected: the shared part +
    the initial personal part. Generic column: no GM, the average of PMs (shared part + mean of personal parts)."""
    ctx = _ctx(algorithm=name)
    algo = ALGORITHMS[name](ctx, **hparams)
    sent = _record_uploads(algo)
    res = run_rounds(ctx, algo, progress=False)
    g = res.server["params"]
    shared = [n for n in g if algo.is_shared(n)]
    own = [n for n in g if not algo.is_shared(n)]
    expected_own = {"fedper": HEAD | FC2, "lg_fedavg": set(g) - HEAD - FC2, "fedrep": HEAD}[name]
    assert set(own) == expected_own and shared
    trained = _one_round_split(ctx, res)
    assert all(set(sent[k][-1]) == set(shared) for k in trained)
    assert _close(g, weighted_average([sent[k][-1] for k in trained], _weights(ctx, trained)), shared)
    assert _same(g, ctx.init_state, own)                   # the personal part never reaches the server
    _check_split_scoring(ctx, algo, res, sent, shared, own, "personal", own)


# ---------------------------------------------------------------- FedRoD
@needs_fmnist
@pytest.mark.parametrize("phead_init", ["init", "zeros"])
def test_fedrod_scores_the_server_model_plus_the_clients_personal_head(phead_init):
    """PM = RoD(server params, own personal head): its `net` part is the server's body + generic head, its
    `phead` the personal head the client's last round left (never selected: the initial head, or zeros with
    `phead_init: zeros`). GM = server params."""
    ctx = _ctx(algorithm="fedrod")
    algo = ALGORITHMS["fedrod"](ctx, phead_init=phead_init)
    sent = _record_uploads(algo)
    res = run_rounds(ctx, algo, progress=False)
    g = res.server["params"]
    start = {n: ctx.init_state["head." + n] for n in ("weight", "bias")}
    if phead_init == "zeros":
        start = {n: torch.zeros_like(t) for n, t in start.items()}
    generic_head = {n: g["head." + n] for n in ("weight", "bias")}
    _one_round_split(ctx, res)
    gm = _gm(algo, res.server)
    assert set(gm) == set(g) and _same(gm, g, g)
    for k in range(ctx.cfg.n_clients):
        c = res.clients.get(k)
        pm = _pm(algo, k, res.server, c)
        assert set(pm) == {"net." + n for n in g} | {"phead.weight", "phead.bias"}
        assert all(torch.equal(pm["net." + n], g[n]) for n in g)      # generic part: the server's params
        phead = {n: pm["phead." + n] for n in ("weight", "bias")}
        if not c:
            assert _same(phead, start, start)
            continue
        assert set(c["phead"]) == {"weight", "bias"} and _same(phead, c["phead"], start)
        assert _moved(phead, start, start)                 # the trained personal head, not its start
        assert not _same(phead, generic_head, start)       # not the generic head
        assert not all(torch.equal(pm["net." + n], sent[k][-1][n]) for n in g)   # the average, not its upload


# ---------------------------------------------------------------- FedBN
@needs_fmnist
def test_fedbn_scores_the_server_non_bn_part_with_the_clients_own_bn():
    """PM = server non-BN parameters + the client's own BN layers (weights, biases, running statistics); never
    selected: the initial BN. No GM: the average of PMs (global non-BN + mean of clients' BN)."""
    ctx = _ctx(algorithm="fedbn", model="cnn_bn")
    algo = ALGORITHMS["fedbn"](ctx)
    sent = _record_uploads(algo)
    res = run_rounds(ctx, algo, progress=False)
    g = res.server["params"]
    bn = sorted(bn_names(ctx.model(0)))
    rest = [n for n in g if n not in bn]
    assert bn and rest and set(bn) <= set(g)
    trained = _one_round_split(ctx, res)
    assert all(set(sent[k][-1]) == set(rest) for k in trained)
    assert _same(g, ctx.init_state, bn)                    # BN never reaches the server
    assert _close(g, weighted_average([sent[k][-1] for k in trained], _weights(ctx, trained)), rest)
    trained_bn = [n for n in bn if n.endswith(("weight", "running_mean"))]
    _check_split_scoring(ctx, algo, res, sent, rest, bn, "bn", trained_bn)


# ---------------------------------------------------------------- APFL
@needs_fmnist
@pytest.mark.parametrize("adaptive, model", [(False, "cnn_cifar10"), (True, "cnn_bn")])
def test_apfl_scores_the_alpha_mixture_of_v_k_and_the_current_server_model(adaptive, model):
    """PM = alpha_k v_k + (1 - alpha_k) w on every float entry (BN running statistics too: `cnn_bn`), w the
    server model after aggregation; non-float entries are v_k's. Never selected: w. GM = w."""
    ctx = _ctx(algorithm="apfl", model=model)
    algo = ALGORITHMS["apfl"](ctx, alpha=0.25, adaptive=adaptive)
    sent = _record_uploads(algo)
    res = run_rounds(ctx, algo, progress=False)
    w = res.server["params"]
    floats = [n for n in w if w[n].is_floating_point()]
    ints = [n for n in w if n not in floats]
    assert bool(ints) == (model == "cnn_bn")               # BN's num_batches_tracked
    trained = _one_round_split(ctx, res)
    assert _close(w, weighted_average([sent[k][-1] for k in trained], _weights(ctx, trained)), floats)
    gm = _gm(algo, res.server)
    assert set(gm) == set(w) and _same(gm, w, w)
    for k in range(ctx.cfg.n_clients):
        c = res.clients.get(k)
        pm = _pm(algo, k, res.server, c)
        assert set(pm) == set(w)
        if not c:
            assert _same(pm, w, w)                         # no v_k yet: w
            continue
        a, v = float(c["alpha"]), c["v"]
        assert 0.0 < a < 1.0
        if not adaptive:
            assert a == 0.25
        want = {n: a * v[n] + (1 - a) * w[n] for n in floats}
        assert _close(pm, want, floats)
        assert _same(pm, v, ints)
        assert not _close(pm, v, floats)                   # the mixture, not v_k
        assert not _close(pm, w, floats)                   # nor the GM


# ---------------------------------------------------------------- pFedSD
@needs_fmnist
def test_pfedsd_scores_v_k_the_clients_last_upload():
    """PM = v_k = cstate['params'], the model the client trained and uploaded in its last round (before
    averaging); never selected: the GM (None). GM = server params, the plain mean of the last round's uploads.
    3 of 4 clients per round over 2 rounds: at least two clients train twice (the KD round)."""
    ctx = _ctx(algorithm="pfedsd", rounds=2, participation=0.75)
    algo = ALGORITHMS["pfedsd"](ctx)
    sent = _record_uploads(algo)
    res = run_rounds(ctx, algo, progress=False)
    g = res.server["params"]
    picks = [_selected(ctx, r) for r in (1, 2)]
    trained, never = _who(ctx, res)
    assert trained == sorted(set(picks[0]) | set(picks[1]))
    assert {k: len(s) for k, s in sent.items()} == {k: sum(k in p for p in picks) for k in trained}
    assert sum(len(s) == 2 for s in sent.values()) >= 2
    assert _close(g, plain_average([sent[k][-1] for k in picks[1]]), g)   # Algorithm 1 line 9: plain mean
    gm = _gm(algo, res.server)
    assert set(gm) == set(g) and _same(gm, g, g)
    for k in range(ctx.cfg.n_clients):
        c = res.clients.get(k)
        if not c:
            assert algo.personal_model(k, res.server, c) is None
            continue
        pm = _pm(algo, k, res.server, c)
        assert set(c["params"]) == set(g) == set(pm) and _same(pm, c["params"], g)
        assert _same(pm, sent[k][-1], g)                   # v_k is its last upload
        assert not _same(pm, g, g)                         # not the averaged GM
        if len(sent[k]) == 2:
            assert not _same(pm, sent[k][0], g)            # the last round's, not the first
    assert algo.personal_model(0, res.server, None) is None   # a client without v_k: the GM


# ---------------------------------------------------------------- SCD
@needs_fmnist
def test_scd_scores_w_p_the_pm_trained_after_the_gm_step():
    """PM = w_p = cstate['params'], trained after the GM step of the client's last round (Ditto's
    `then_personal`); never selected: the GM (None). GM = server params, the n_k-weighted mean of the uploaded
    GMs."""
    ctx = _ctx(algorithm="scd", rounds=2, participation=0.75)
    algo = ALGORITHMS["scd"](ctx)
    sent = _record_uploads(algo)
    res = run_rounds(ctx, algo, progress=False)
    g = res.server["params"]
    picks = [_selected(ctx, r) for r in (1, 2)]
    trained, never = _who(ctx, res)
    assert trained == sorted(set(picks[0]) | set(picks[1]))
    assert _close(g, weighted_average([sent[k][-1] for k in picks[1]], _weights(ctx, picks[1])), g)
    gm = _gm(algo, res.server)
    assert set(gm) == set(g) and _same(gm, g, g)
    for k in range(ctx.cfg.n_clients):
        c = res.clients.get(k)
        if not c:
            assert algo.personal_model(k, res.server, c) is None
            continue
        pm = _pm(algo, k, res.server, c)
        assert set(c["params"]) == set(g) == set(pm) and _same(pm, c["params"], g)
        assert not _same(pm, sent[k][-1], g)               # w_p, not the GM it uploaded (w_G,i)
        assert not _same(pm, g, g)                         # nor the averaged GM
    assert algo.personal_model(0, res.server, None) is None


# ---------------------------------------------------------------- PerFed-CKT
@needs_fmnist
def test_perfed_ckt_scores_the_clients_own_local_model():
    """PM = the client's own local model cstate['params']; never selected: its initial model. The server holds
    only centroids (no GM): the generic column is the average of PMs."""
    ctx = _ctx(algorithm="perfed_ckt", public={"size": 50})
    algo = ALGORITHMS["perfed_ckt"](ctx, tau=2, public_batch=16)
    res = run_rounds(ctx, algo, progress=False)
    assert set(res.server) == {"centroids"}
    _check_own_models(ctx, algo, res, trained_differs=lambda a, b: not _same(a, b, a))


# ---------------------------------------------------------------- DC-PFL (and FedGH, whose evaluation it inherits)
@needs_fmnist
@pytest.mark.parametrize("name, eval_head", [("dcpfl", "global"), ("dcpfl", "local"), ("fedgh", "global")])
def test_dcpfl_scores_the_clients_own_extractor_with_the_current_global_header(name, eval_head):
    """PM = the client's own extractor (cstate['body']) + the server's current header (after this round's
    calibration); `eval_head: local`: + its locally trained header (cstate['head']). Never selected: the
    architecture's initial extractor + the current header. No GM: the mean of extractors + the global header."""
    ctx = _ctx(algorithm=name)
    hp = {"eval_head": eval_head, **({"n_virtual": 100} if name == "dcpfl" else {})}
    algo = ALGORITHMS[name](ctx, **hp)
    res = run_rounds(ctx, algo, progress=False)
    head = res.server["head"]
    init = ctx.init_state
    body = [n for n in init if n not in HEAD]
    assert set(head) == HEAD and _moved(head, init, HEAD)   # the header trained on the server
    trained = _one_round_split(ctx, res)
    assert algo.global_model(res.server) is None
    bodies = {}
    for k in range(ctx.cfg.n_clients):
        c = res.clients.get(k)
        pm = _pm(algo, k, res.server, c)
        assert set(pm) == set(init)
        if not c:
            assert _same(pm, ctx.initial(k), body) and _same(pm, head, HEAD)
            continue
        assert set(c["body"]) == set(body) and set(c["head"]) == HEAD
        assert _same(pm, c["body"], body)                  # its own extractor
        assert _moved(pm, ctx.initial(k), body)            # trained, not the initial one
        if eval_head == "global":
            assert _same(pm, head, HEAD) and not _same(pm, c["head"], HEAD)
        else:
            assert _same(pm, c["head"], HEAD) and not _same(pm, head, HEAD)
        bodies[k] = pm
    a, b = trained
    assert not _same(bodies[a], bodies[b], body)
    avg = _averaged_pm(algo, res)
    assert _close(avg, plain_average([res.clients[k]["body"] for k in trained]), body)
    assert _same(avg, head, HEAD)


# ---------------------------------------------------------------- Local, FD (own whole model, nothing averaged)
@needs_fmnist
@pytest.mark.parametrize("name", ["local", "fd"])
def test_own_model_methods_score_the_clients_last_local_model(name):
    """local, fd: PM = the client's own model as its last local round left it (cstate['params']); never selected:
    its architecture's initial model. The server holds no weights (Local: nothing; FD: per-label outputs): no GM,
    the generic column is the plain average of the PMs of the clients that have trained."""
    ctx = _ctx(algorithm=name)
    algo = ALGORITHMS[name](ctx)
    res = run_rounds(ctx, algo, progress=False)
    assert set(res.server) == ({"table", "counts", "round"} if name == "fd" else set())
    pms, avg = _check_own_models(ctx, algo, res, trained_differs=lambda a, b: _moved(a, b, a))
    assert not _same(avg, pms[_one_round_split(ctx, res)[0]], avg) and not _same(avg, ctx.init_state, avg)


# ---------------------------------------------------------------- FedProto
@needs_fmnist
@pytest.mark.parametrize("inference", ["classifier", "prototype"])
def test_fedproto_scores_the_clients_own_model(inference):
    """PM = the client's own whole model (cstate['params']); `inference: prototype`: the same network wrapped to
    predict the nearest *current* global prototype (server `protos`, `has_proto`). Never selected: the
    architecture's initial model. No GM: the plain mean of the clients' models."""
    ctx = _ctx(algorithm="fedproto")
    algo = ALGORITHMS["fedproto"](ctx, inference=inference)
    res = run_rounds(ctx, algo, progress=False)
    protos, has = res.server["protos"], res.server["has_proto"]
    assert set(res.server) == {"protos", "has_proto"} and bool(has.any())
    assert bool((protos[has].abs().sum(1) > 0).all())      # pooled this round (they start at zero)
    trained = _one_round_split(ctx, res)
    assert algo.global_model(res.server) is None
    pms = {}
    for k in range(ctx.cfg.n_clients):
        c = res.clients.get(k)
        net = algo.personal_model(k, res.server, c)
        init = ctx.initial(k)
        if inference == "prototype":
            assert isinstance(net, NearestPrototype)
            assert torch.equal(net.protos, protos) and torch.equal(net.has, has)   # the current global prototypes
            assert set(net.state_dict()) == {"net." + n for n in init}
            pm = {n[len("net."):]: t.detach().clone() for n, t in net.state_dict().items()}
        else:
            assert not isinstance(net, NearestPrototype)
            pm = clone_state(net.state_dict())
        assert set(pm) == set(init)
        if not c:
            assert _same(pm, init, init)
            continue
        assert set(c["params"]) == set(init) and _same(pm, c["params"], init)
        assert _moved(pm, init, init)                      # trained, not its initial model
        pms[k] = pm
    a, b = trained
    assert not _same(pms[a], pms[b], pms[a])
    avg = _averaged_pm(algo, res)
    assert _close(avg, plain_average([res.clients[k]["params"] for k in trained]), avg)


# ---------------------------------------------------------------- FML
@needs_fmnist
def test_fml_scores_the_local_model_and_the_averaged_meme_model():
    """PM = the client's own local model (cstate['params']); never selected: its initial model. GM = server
    params, the n_k-weighted average of the uploaded meme models. The meme model here has the clients'
    architecture (`shared_model: cnn_cifar10`), so "not the meme" compares values, not just shapes."""
    ctx = _ctx(algorithm="fml")
    algo = ALGORITHMS["fml"](ctx, shared_model="cnn_cifar10")
    sent = _record_uploads(algo)
    res = run_rounds(ctx, algo, progress=False)
    g = res.server["params"]
    init = ctx.init_state
    assert set(g) == set(init)
    trained = _one_round_split(ctx, res)
    assert _close(g, weighted_average([sent[k][-1] for k in trained], _weights(ctx, trained)), g)
    gm = _gm(algo, res.server)
    assert set(gm) == set(g) and _same(gm, g, g)           # the averaged meme model
    for k in trained:
        assert not _same(gm, res.clients[k]["params"], g)  # not a client's local model
        assert not _same(sent[k][-1], res.clients[k]["params"], g)   # the upload is the meme, not the local model
    for k in range(ctx.cfg.n_clients):
        c = res.clients.get(k)
        pm = _pm(algo, k, res.server, c)
        assert set(pm) == set(ctx.initial(k))
        if not c:
            assert _same(pm, ctx.initial(k), pm)
            continue
        assert set(c) == {"params"} and _same(pm, c["params"], pm)
        assert _moved(pm, ctx.initial(k), pm)              # trained
        assert not _same(pm, g, pm)                        # the local model, not the (averaged) meme
        assert not _same(pm, sent[k][-1], pm)              # nor its own meme


# ---------------------------------------------------------------- FedKD
@needs_fmnist
def test_fedkd_scores_the_mentor_and_the_mentee_as_gm():
    """PM = the client's own mentor (cstate['mentor']); never selected: its initial model. GM = the mentee, server
    params = the previous server params + the n_k-weighted average of the uploaded (SVD-compressed) deltas,
    compressed again. The mentee has the clients' architecture here (`shared_model: cnn_cifar10`)."""
    ctx = _ctx(algorithm="fedkd")
    algo = ALGORITHMS["fedkd"](ctx, shared_model="cnn_cifar10")
    seen = []
    aggregate = algo.aggregate

    def recording(rnd, server, updates, clients):
        seen.append((clone_state(server["params"]), [clone_state(u.payload) for u in updates],
                     [u.weight for u in updates]))
        return aggregate(rnd, server, updates, clients)
    algo.aggregate = recording
    res = run_rounds(ctx, algo, progress=False)
    g = res.server["params"]
    init = ctx.init_state
    trained = _one_round_split(ctx, res)
    (before, deltas, weights), = seen
    assert weights == _weights(ctx, trained) and set(g) == set(before) == set(init)
    step, _ = compress_state(weighted_average(deltas, weights), algo.energy(1))
    assert _close(g, {n: before[n] + step[n] for n in g}, g)
    assert not _same(g, before, g)                         # the mentee moved
    gm = _gm(algo, res.server)
    assert set(gm) == set(g) and _same(gm, g, g)
    for k in range(ctx.cfg.n_clients):
        c = res.clients.get(k)
        pm = _pm(algo, k, res.server, c)
        assert set(pm) == set(ctx.initial(k))
        if not c:
            assert _same(pm, ctx.initial(k), pm)
            continue
        assert set(c) == {"mentor", "proj"} and _same(pm, c["mentor"], pm)
        assert _moved(pm, ctx.initial(k), pm)              # the trained mentor
        assert not _same(pm, g, pm) and not _same(pm, before, pm)   # not the mentee (after or before the round)
        assert not _same(gm, c["mentor"], g)               # and the GM is not a mentor


# ---------------------------------------------------------------- the 2-round schedule: [1, 3], then [1, 2]
def _two_rounds(ctx) -> tuple[list, list]:
    """`_ctx(rounds=2)` selects clients 1, 3 in round 1 and 1, 2 in round 2: 1 trains twice, 3 only in round 1
    (its PM predates the last aggregation), 0 never."""
    picks = [_selected(ctx, r) for r in (1, 2)]
    assert picks == [[1, 3], [1, 2]]
    return picks, sorted(set(picks[0]) | set(picks[1]))


# ---------------------------------------------------------------- FedAvg + last local
@needs_fmnist
def test_fedavg_last_local_scores_the_clients_last_upload():
    """PM = the model the client trained and uploaded in its last round (cstate['params'], before averaging);
    never selected: the GM (None). GM = server params, FedAvg's n_k-weighted mean of the last round's uploads."""
    ctx = _ctx(algorithm="fedavg_last_local", rounds=2)
    algo = ALGORITHMS["fedavg_last_local"](ctx)
    sent = _record_uploads(algo)
    res = run_rounds(ctx, algo, progress=False)
    g = res.server["params"]
    picks, trained = _two_rounds(ctx)
    assert _who(ctx, res) == (trained, [0])
    assert {k: len(s) for k, s in sent.items()} == {1: 2, 2: 1, 3: 1}
    assert _close(g, weighted_average([sent[k][-1] for k in picks[1]], _weights(ctx, picks[1])), g)
    gm = _gm(algo, res.server)
    assert set(gm) == set(g) and _same(gm, g, g)
    for k in trained:
        c = res.clients[k]
        pm = _pm(algo, k, res.server, c)
        assert set(pm) == set(g) and _same(pm, c["params"], g)
        assert _same(pm, sent[k][-1], g)                   # its last upload
        assert not _same(pm, g, g)                         # not the averaged server model
        if len(sent[k]) == 2:
            assert not _same(pm, sent[k][0], g)            # the last round's, not the first
    assert algo.personal_model(0, res.server, res.clients.get(0)) is None


# ---------------------------------------------------------------- L2GD
@needs_fmnist
def test_l2gd_scores_x_k_not_the_mix():
    """PM = x_k = cstate['params'], the client's own model as trained (and uploaded) in its last round, not mixed
    with x_bar; never selected: (1 - theta) initial + theta x_bar (x_bar after this round's aggregation).
    GM = server x_bar, the n_k-weighted mean of the last round's uploads."""
    theta = 0.5
    ctx = _ctx(algorithm="l2gd", rounds=2)
    algo = ALGORITHMS["l2gd"](ctx, theta=theta)
    sent = _record_uploads(algo)
    res = run_rounds(ctx, algo, progress=False)
    g = res.server["params"]
    picks, trained = _two_rounds(ctx)
    assert _who(ctx, res) == (trained, [0])
    assert _close(g, weighted_average([sent[k][-1] for k in picks[1]], _weights(ctx, picks[1])), g)
    gm = _gm(algo, res.server)
    assert set(gm) == set(g) and _same(gm, g, g)
    for k in trained:
        c = res.clients[k]
        pm = _pm(algo, k, res.server, c)
        assert set(pm) == set(g) and _same(pm, c["params"], g)
        assert _same(pm, sent[k][-1], g)                   # x_k as uploaded in its last round
        mix = algo.mixed(k, res.server, c)
        assert not _close(pm, mix, g)                      # not the mix with the current x_bar
        assert not _same(pm, g, g)                         # nor x_bar
        if len(sent[k]) == 2:
            assert not _same(pm, sent[k][0], g)
    pm0 = _pm(algo, 0, res.server, res.clients.get(0))
    init = ctx.initial(0)
    assert _close(pm0, {n: (1 - theta) * init[n] + theta * g[n] for n in g}, g)
    assert not _close(pm0, init, g) and not _close(pm0, g, g)   # the mix, neither of its ends


# ---------------------------------------------------------------- FedFomo
@needs_fmnist
def test_fedfomo_scores_the_server_tables_copy_of_the_clients_last_upload():
    """PM = server['models'][k], the table's copy of client k's last upload (FOMO-updated, then trained); FedFomo
    keeps no client state (cstate always None). Never uploaded: the common init `init_state`. No GM: the plain
    average of every stored model (also those of clients not selected in the last round)."""
    ctx = _ctx(algorithm="fedfomo", rounds=2)
    algo = ALGORITHMS["fedfomo"](ctx)
    sent = _record_uploads(algo)
    res = run_rounds(ctx, algo, progress=False)
    table = res.server["models"]
    init = ctx.init_state
    picks, uploaded = _two_rounds(ctx)
    assert _who(ctx, res) == ([], [0, 1, 2, 3])            # no client state: evaluate passes None
    assert sorted(int(j) for j in table) == uploaded
    assert {k: len(s) for k, s in sent.items()} == {1: 2, 2: 1, 3: 1}
    assert algo.global_model(res.server) is None
    for k in range(ctx.cfg.n_clients):
        pm = _pm(algo, k, res.server, None)
        assert set(pm) == set(init)
        if k not in sent:
            assert str(k) not in table and _same(pm, init, init)
            continue
        assert _same(pm, table[str(k)], init) and _same(pm, sent[k][-1], init)   # its last upload
        assert _moved(pm, init, init)                      # not the common init
        if len(sent[k]) == 2:
            assert not _same(pm, sent[k][0], init)         # the last round's upload, not the first
    assert not _same(_pm(algo, 1, res.server, None), _pm(algo, 2, res.server, None), init)
    avg = _averaged_pm(algo, res)
    assert _close(avg, plain_average([table[str(k)] for k in uploaded]), init)
    assert not _close(avg, plain_average([sent[k][-1] for k in picks[1]]), init)   # all stored, not this round's
