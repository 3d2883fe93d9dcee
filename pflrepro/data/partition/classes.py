"""Partitioners by class sets: McMahan's shards, FedRep's n-by-s (FedBSD), FedGH's uniform shares (DC-PFL), FedRep's
log-normal FEMNIST sizes, and one domain a client (FedBN, FedBSD Fig. 3)."""
from __future__ import annotations

import numpy as np

from ._common import _check_labels, _check_n_clients, _class_members, _finish, _n_classes


def shards(labels: np.ndarray, n_clients: int, seed: int, s: int = 2) -> list[np.ndarray]:
    """Pathological non-IID (McMahan et al.; pFedSD Table 3: "each client only holds at
    most s classes ... s is the number of shards per client").

    Indices sorted by label (random order within a class), cut into ``n_clients * s``
    contiguous shards of equal size (sizes differ by at most one when it does not
    divide), and each client gets ``s`` shards drawn at random without replacement.
    A client has at most ``s`` classes (fewer when it draws two shards of one class,
    or more only if a shard straddles a class border, which cannot happen when the
    class sizes are multiples of the shard size, as for FMNIST/CIFAR with the papers'
    settings). Every index is assigned.

    For balanced classes this is equivalent in distribution to pFedSD's public code,
    which uses LG-FedAvg's per-class sharding (``n_by_s(..., distinct=False)``).
    """
    labels = _check_labels(labels)
    n_clients = _check_n_clients(n_clients)
    if isinstance(s, bool) or int(s) != s or s < 1:
        raise ValueError(f"s (shards per client) must be a positive integer, got {s!r}")
    n_shards = n_clients * int(s)
    if n_shards > len(labels):
        raise ValueError(
            f"{n_clients} clients x s={s} = {n_shards} shards but only {len(labels)} samples"
        )
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(labels))
    order = perm[np.argsort(labels[perm], kind="stable")]
    pieces = np.array_split(order, n_shards)
    own = rng.permutation(n_shards).reshape(n_clients, int(s))
    return _finish(np.concatenate([pieces[j] for j in row]) for row in own)


def _leveled_assignment(rng, n_classes: int, n_clients: int, k: int) -> np.ndarray:
    """(n_clients, k) distinct classes per client, each class used n_clients*k/n_classes times.

    The class-picking rule of FedGH's ``gen_classes_per_node`` (pFedHN's generator):
    each pick is uniform among the classes with the most remaining uses, but a
    client never picks a class twice (the code does not exclude it; the two rules
    coincide whenever k divides n_classes, e.g. 2/10 and 10/100).
    """
    per_class = n_clients * k // n_classes
    remaining = np.full(n_classes, per_class, dtype=np.int64)
    out = np.empty((n_clients, k), dtype=np.int64)
    for i in range(n_clients):
        free = np.ones(n_classes, dtype=bool)
        for j in range(k):
            top = remaining[free].max()
            cand = np.flatnonzero(free & (remaining == top))
            c = rng.choice(cand)
            out[i, j] = c
            remaining[c] -= 1
            free[c] = False
    assert remaining.min() >= 0
    return out


def _check_classes_per_client(n_clients, classes_per_client, n_classes, distinct=True):
    if isinstance(classes_per_client, bool) or int(classes_per_client) != classes_per_client \
            or classes_per_client < 1:
        raise ValueError(f"classes_per_client must be a positive integer, got {classes_per_client!r}")
    if distinct and classes_per_client > n_classes:
        raise ValueError(
            f"classes_per_client={classes_per_client} > n_classes={n_classes}"
        )
    if (n_clients * classes_per_client) % n_classes:
        raise ValueError(
            f"n_clients * classes_per_client = {n_clients * classes_per_client} must be a "
            f"multiple of n_classes={n_classes} so every class is used equally often "
            "(as FedRep's and FedGH's generators require)"
        )


def n_by_s_assignment(
    n_classes: int, n_clients: int, classes_per_client: int, seed: int, distinct: bool = True
) -> np.ndarray:
    """The (n_clients, S) class list of ``n_by_s``; pass it back as ``assignment=``
    to split a second label array (e.g. the test set) with the same classes per client,
    as FedRep does with ``rand_set_all``.

    ``distinct=False``: FedRep's rule exactly: the multiset {every class x N*S/C} is
    shuffled and reshaped to (N, S), so a client can get two shards of one class.
    ``distinct=True``: every client gets S distinct classes (leveled random assignment,
    see ``_leveled_assignment``); rows are then shuffled.
    """
    n_clients = _check_n_clients(n_clients)
    _check_classes_per_client(n_clients, classes_per_client, n_classes, distinct)
    rng = np.random.default_rng(seed)
    return _n_by_s_assignment(rng, n_classes, n_clients, int(classes_per_client), distinct)


def _n_by_s_assignment(rng, n_classes, n_clients, k, distinct):
    if not distinct:
        pool = np.repeat(np.arange(n_classes), n_clients * k // n_classes)
        return rng.permutation(pool).reshape(n_clients, k)
    return rng.permutation(_leveled_assignment(rng, n_classes, n_clients, k))


def n_by_s(
    labels: np.ndarray,
    n_clients: int,
    seed: int,
    classes_per_client: int = 2,
    distinct: bool = True,
    assignment: np.ndarray | None = None,
    n_classes: int | None = None,
) -> list[np.ndarray]:
    """FedRep's "(N, S)" setting (FedRep utils/sampling.py ``noniid``; FedBSD reuses it).

    Each class is shuffled and cut into ``N*S/C`` shards of equal size (the first
    ``n_c mod (N*S/C)`` shards one larger, as FedRep's leftover rule); the class list
    of every client is drawn (see ``n_by_s_assignment``) and each (client, class) slot
    takes one random unused shard of that class. With ``distinct=True`` (default) every
    client has exactly S distinct classes; ``distinct=False`` is FedRep's code, where
    a client can receive two shards of the same class (about 1 client in 10 for
    CIFAR-10, N=100, S=2) and so has fewer than S classes. Every index is assigned
    when each class has at least N*S/C samples.

    FedRep shards each class in dataset order; this shuffles within the class first
    (the same thing for datasets stored in random order). FedRep's ``double`` branch
    (label list x50 when a client would have < 100 samples) only matters for its
    with-replacement test sampling and is not reproduced. ``assignment`` reuses a
    class list from ``n_by_s_assignment`` (FedRep splits its test set that way).
    Requires N*S to be a multiple of C.
    """
    labels = _check_labels(labels)
    n_clients = _check_n_clients(n_clients)
    n_classes = _n_classes(labels, n_classes)
    _check_classes_per_client(n_clients, classes_per_client, n_classes, distinct)
    k = int(classes_per_client)
    per_class = n_clients * k // n_classes
    rng = np.random.default_rng(seed)
    if assignment is None:
        assignment = _n_by_s_assignment(rng, n_classes, n_clients, k, distinct)
    assignment = np.asarray(assignment)
    if assignment.shape != (n_clients, k):
        raise ValueError(f"assignment must have shape ({n_clients}, {k}), got {assignment.shape}")
    members = _class_members(labels, n_classes, rng)
    small = [c for c in range(n_classes) if len(members[c]) < per_class]
    if small:
        raise ValueError(
            f"classes {small[:5]} have fewer samples than the {per_class} shards per class "
            f"that {n_clients} clients x {k} classes need"
        )
    pools = [list(np.array_split(members[c], per_class)) for c in range(n_classes)]
    for c in range(n_classes):
        order = rng.permutation(per_class)  # FedRep pops a random shard each time
        pools[c] = [pools[c][j] for j in order]
    parts = []
    for row in assignment:
        parts.append(np.concatenate([pools[int(c)].pop() for c in row]))
    return _finish(parts)


def uniform_shares_assignment(
    n_classes: int,
    n_clients: int,
    classes_per_client: int,
    seed: int,
    low: float = 0.4,
    high: float = 0.6,
) -> tuple[np.ndarray, np.ndarray]:
    """FedGH's ``gen_classes_per_node``: (classes, shares), both (n_clients, S).

    For every class, ``N*S/C`` weights are drawn from U(low, high) and normalised to
    sum to 1 over the clients that will hold the class; classes are picked for the
    clients in order (see ``_leveled_assignment``) and each pick takes the next weight
    of its class. ``shares[i, j]`` is the fraction of class ``classes[i, j]`` that
    client i receives. Pass the pair back as ``assignment=`` to split a second label
    array with the same classes and shares, as FedGH does for its val and test sets.
    """
    n_clients = _check_n_clients(n_clients)
    _check_classes_per_client(n_clients, classes_per_client, n_classes)
    _check_low_high(low, high)
    rng = np.random.default_rng(seed)
    return _uniform_shares_assignment(rng, n_classes, n_clients, int(classes_per_client), low, high)


def _check_low_high(low, high):
    if not (0 < low <= high):
        raise ValueError(f"need 0 < low <= high, got low={low}, high={high}")


def _uniform_shares_assignment(rng, n_classes, n_clients, k, low, high):
    per_class = n_clients * k // n_classes
    weights = rng.uniform(low, high, size=(n_classes, per_class))
    weights /= weights.sum(axis=1, keepdims=True)
    classes = _leveled_assignment(rng, n_classes, n_clients, k)
    used = np.zeros(n_classes, dtype=np.int64)
    shares = np.empty((n_clients, k))
    for i in range(n_clients):
        for j in range(k):
            c = classes[i, j]
            shares[i, j] = weights[c, used[c]]
            used[c] += 1
    return classes, shares


def classes_uniform_shares(
    labels: np.ndarray,
    n_clients: int,
    seed: int,
    classes_per_client: int = 2,
    low: float = 0.4,
    high: float = 0.6,
    assignment: tuple[np.ndarray, np.ndarray] | None = None,
    n_classes: int | None = None,
) -> list[np.ndarray]:
    """FedGH / DC-PFL: each client gets ``classes_per_client`` classes with random shares.

    Follows FedGH's public generator (LipingYi/FedGH, FedGH_Codes/experiments/dataset.py,
    ``gen_classes_per_node`` + ``gen_data_split``, itself pFedHN's): every class is
    shared by ``N*S/C`` clients; the clients' raw weights are drawn from U(low, high)
    (0.4, 0.6) and normalised over the class, so each holder gets ~C/(N*S) of the
    class give or take ~20%; client i takes ``int(n_c * share)`` samples of class c,
    consecutive from the class's shuffled index list. Because of the floor, up to
    N*S/C - 1 samples per class stay unassigned (as in the code).

    Every client has exactly S distinct classes (the code can repeat a class when S
    does not divide C; see ``_leveled_assignment``). Requires N*S to be a multiple of C
    (the code's assert is commented out and it crashes otherwise).
    """
    labels = _check_labels(labels)
    n_clients = _check_n_clients(n_clients)
    n_classes = _n_classes(labels, n_classes)
    _check_classes_per_client(n_clients, classes_per_client, n_classes)
    _check_low_high(low, high)
    k = int(classes_per_client)
    rng = np.random.default_rng(seed)
    if assignment is None:
        assignment = _uniform_shares_assignment(rng, n_classes, n_clients, k, low, high)
    classes, shares = (np.asarray(a) for a in assignment)
    if classes.shape != (n_clients, k) or shares.shape != (n_clients, k):
        raise ValueError(f"assignment arrays must have shape ({n_clients}, {k})")
    members = _class_members(labels, n_classes, rng)
    cursor = np.zeros(n_classes, dtype=np.int64)
    parts = []
    for i in range(n_clients):
        mine = []
        for c, p in zip(classes[i], shares[i]):
            c = int(c)
            take = int(len(members[c]) * p)
            mine.append(members[c][cursor[c] : cursor[c] + take])
            cursor[c] += take
        parts.append(np.concatenate(mine))
    return _finish(parts)


def share_out(want: np.ndarray, have: int) -> np.ndarray:
    """``have`` samples over slots that ask ``want`` (more in all than ``have``): every slot that asks gets one
    first (where ``have`` covers them all), then the rest goes in proportion to what each still asks, floored,
    the leftover one by one to the largest remainders (ties: the earlier slot). Sums to ``have`` exactly."""
    want = np.asarray(want, dtype=np.int64)
    base = np.minimum(want, 1) if have >= int((want > 0).sum()) else np.zeros_like(want)
    rest, left = want - base, int(have - base.sum())
    quota = rest * left / max(int(rest.sum()), 1)
    got = np.floor(quota).astype(np.int64)
    got[np.argsort(-(quota - got), kind="stable")[:left - int(got.sum())]] += 1
    return base + got


def lognormal(
    labels: np.ndarray,
    n_clients: int,
    seed: int,
    classes_per_client: int = 3,
    mean_size: float = 148.0,
    sigma: float = 1.0,
    min_size: int = 1,
    n_classes: int | None = None,
) -> list[np.ndarray]:
    """FedRep's FEMNIST setting (FedBSD Table 1): "we restrict the dataset to 10 handwritten letters and assign
    samples to clients according to a log-normal distribution ... N = 150 clients with an average of 148
    samples/client", S = 3 classes each.

    The generator behind FedRep's files (Ditto's) is not in our references, so the rule is ours, stated in
    full (docs/fidelity.md "FedBSD FEMNIST"): each client's S distinct classes are a leveled random assignment
    (every class held by N*S/C clients, as ``n_by_s``); its size is ``w_k / mean(w) * mean_size`` with
    ``w ~ LogNormal(0, sigma)`` (so the sizes average ``mean_size`` exactly), rounded, at least ``min_size``,
    and split as evenly as possible over its S classes. A class asked for more samples than it has is shared
    out over its slots (``share_out``: one each first, the rest in proportion to the requests), so no client
    loses a class to the cut; samples are dealt without replacement.
    """
    labels = _check_labels(labels)
    n_clients = _check_n_clients(n_clients)
    n_classes = _n_classes(labels, n_classes)
    _check_classes_per_client(n_clients, classes_per_client, n_classes)
    if not mean_size > 0 or not sigma >= 0 or int(min_size) < 0:
        raise ValueError(f"lognormal needs mean_size > 0, sigma >= 0, min_size >= 0; got {mean_size}, {sigma}, "
                         f"{min_size}")
    k = int(classes_per_client)
    rng = np.random.default_rng(seed)
    classes = rng.permutation(_leveled_assignment(rng, n_classes, n_clients, k))
    w = rng.lognormal(0.0, float(sigma), n_clients)
    sizes = np.maximum(int(min_size), np.rint(w / w.mean() * float(mean_size)).astype(np.int64))
    want = sizes[:, None] // k + (np.arange(k)[None, :] < (sizes % k)[:, None])   # (clients, k) per slot
    members = _class_members(labels, n_classes, rng)
    for c in range(n_classes):
        slot = classes == c
        asked = int(want[slot].sum())
        if asked > len(members[c]):   # share out what this class has
            want[slot] = share_out(want[slot], len(members[c]))
    taken = np.zeros(n_classes, dtype=np.int64)
    parts = []
    for i in range(n_clients):
        mine = []
        for j in range(k):
            c, n = classes[i, j], int(want[i, j])
            mine.append(members[c][taken[c]: taken[c] + n])
            taken[c] += n
        parts.append(np.concatenate(mine))
    return _finish(parts)


def by_domain(labels: np.ndarray, n_clients: int, seed: int, domains=None) -> list[np.ndarray]:
    """One domain per client (FedBN, FedBSD Fig. 3: "Each dataset serves as a client"): client k gets every
    index whose domain is k. ``domains`` (one integer per label) comes from a multi-domain dataset
    (``pflrepro.data.datasets``: the run passes it to a partitioner marked ``uses_domains``); ``n_clients`` must equal
    the number of domains. ``seed`` is unused: the assignment is fixed by the data."""
    labels = _check_labels(labels)
    if domains is None:
        raise ValueError("partition 'by_domain' needs a multi-domain dataset (one with `domains`, e.g. "
                         "fmnist-domains, digits, domainnet)")
    domains = np.asarray(domains, dtype=np.int64)
    if domains.shape != labels.shape:
        raise ValueError(f"by_domain: {domains.shape[0]} domain ids for {labels.shape[0]} labels")
    n_dom = int(domains.max()) + 1 if len(domains) else 0
    if n_clients != n_dom:
        raise ValueError(f"by_domain: n_clients={n_clients}, but the data have {n_dom} domains (one client each)")
    return _finish([np.flatnonzero(domains == k) for k in range(n_clients)])


by_domain.uses_domains = True   # the run passes each pool index's domain
