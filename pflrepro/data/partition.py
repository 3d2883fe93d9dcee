"""Label-based federated partitions and per-client train/val/test splits.

Pure functions on a 1-D array of integer labels. Nothing here touches images,
tensors, files or the global RNG: every function builds its own
``np.random.default_rng(seed)``, so the same arguments always give the same result.

Partitioners (registered in ``PARTITIONERS``)::

    fn(labels, n_clients, seed, **params) -> list[np.ndarray]

return one sorted int64 array of indices into ``labels`` per client; the arrays are
pairwise disjoint. ``iid``, ``shards``, ``dirichlet`` and ``balanced_dirichlet``
assign every index; ``n_by_s`` and ``classes_uniform_shares`` may leave a few
(see their docstrings).

Splits (registered in ``SPLITS``)::

    fn(labels, client_indices, seed, **params) -> dict[str, list[np.ndarray]]

return per-client index arrays under ``'train'``, ``'test'`` and, where the split has
one, ``'val'``. All of them index ``labels``, except the ``'test'`` arrays of
``global_test_by_proportion``, which index ``test_labels``.

``by_domain`` + ``domain_test`` (one domain per client, FedBN/FedBSD Fig. 3) read each image's domain from
a multi-domain dataset (``pflrepro.data.datasets``), which the run passes to a function marked ``uses_domains``.

Which paper uses which (the sources of every choice the papers leave open are given
in each docstring):

========================  ==================================================
pFedSD (Dir, balanced)    ``balanced_dirichlet`` + ``random`` (0.8, 0.2)
pFedSD (pathological s)   ``shards`` (McMahan), or ``n_by_s(distinct=False)``
                          for the public code's LG-FedAvg sampler
SCD                       ``dirichlet`` + ``global_test_by_proportion``
PerFed-CKT                ``dirichlet`` (alpha=0.01) + ``perfed_ckt``
FedBSD (FedRep setups)    ``n_by_s``; FEMNIST: ``lognormal``
DC-PFL (FedGH setup)      ``classes_uniform_shares`` + ``random`` (0.8, 0.1, 0.1)
========================  ==================================================
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..params import Param

__all__ = [
    "iid",
    "dirichlet",
    "balanced_dirichlet",
    "shards",
    "n_by_s",
    "n_by_s_assignment",
    "lognormal",
    "classes_uniform_shares",
    "uniform_shares_assignment",
    "random_split",
    "perfed_ckt_split",
    "global_test_by_proportion",
    "label_counts",
    "plot_partition",
    "PARTITIONERS",
    "SPLITS",
]


# ----------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------


def _check_labels(labels) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be a 1-D array, got shape {labels.shape}")
    if labels.size and not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be integers, got dtype {labels.dtype}")
    if labels.size and labels.min() < 0:
        raise ValueError("labels must be non-negative class ids")
    return labels.astype(np.int64, copy=False)


def _check_n_clients(n_clients, n_samples: int | None = None) -> int:
    if isinstance(n_clients, bool) or int(n_clients) != n_clients or n_clients < 1:
        raise ValueError(f"n_clients must be a positive integer, got {n_clients!r}")
    n_clients = int(n_clients)
    if n_samples is not None and n_clients > n_samples:
        raise ValueError(
            f"n_clients={n_clients} is larger than the number of samples ({n_samples}): "
            "some clients would get no data"
        )
    return n_clients


def _n_classes(labels: np.ndarray, n_classes: int | None) -> int:
    inferred = int(labels.max()) + 1 if labels.size else 0
    if n_classes is None:
        return inferred
    if n_classes < inferred:
        raise ValueError(f"n_classes={n_classes} but labels contain class {inferred - 1}")
    return int(n_classes)


def _class_members(labels: np.ndarray, n_classes: int, rng) -> list[np.ndarray]:
    """Indices of each class, each list randomly shuffled."""
    order = np.argsort(labels, kind="stable")
    bounds = np.searchsorted(labels[order], np.arange(n_classes + 1))
    out = []
    for c in range(n_classes):
        members = order[bounds[c] : bounds[c + 1]].copy()
        rng.shuffle(members)
        out.append(members)
    return out


def _finish(parts) -> list[np.ndarray]:
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def _dirichlet(rng, alpha: float, k: int) -> np.ndarray:
    """One draw of Dir_k(alpha); redrawn in the (tiny-alpha) case of a degenerate sample."""
    for _ in range(100):
        p = rng.dirichlet(np.full(k, float(alpha)))
        s = p.sum()
        if np.all(np.isfinite(p)) and s > 0:
            return p / s
    # every draw underflowed: the limit alpha -> 0 puts all mass on one client
    p = np.zeros(k)
    p[rng.integers(k)] = 1.0
    return p


def _split_by_proportions(members: np.ndarray, p: np.ndarray) -> list[np.ndarray]:
    """Consecutive pieces of ``members`` with sizes from floor(cumsum(p) * n)."""
    cuts = (np.cumsum(p) * len(members)).astype(np.int64)[:-1]
    return np.split(members, cuts)


# ----------------------------------------------------------------------------
# partitioners
# ----------------------------------------------------------------------------


def iid(labels: np.ndarray, n_clients: int, seed: int) -> list[np.ndarray]:
    """Random equal split: a permutation cut into ``n_clients`` parts.

    Sizes differ by at most one (the first ``len % n_clients`` clients get one more);
    every index is assigned.
    """
    labels = _check_labels(labels)
    n_clients = _check_n_clients(n_clients, len(labels))
    rng = np.random.default_rng(seed)
    return _finish(np.array_split(rng.permutation(len(labels)), n_clients))


def dirichlet(
    labels: np.ndarray,
    n_clients: int,
    seed: int,
    alpha: float = 0.5,
    min_size: int = 0,
    max_retries: int = 1000,
    class_prob: float = 1.0,
    allocation: str = "split",
    n_classes: int | None = None,
) -> list[np.ndarray]:
    """Per-class symmetric Dirichlet over clients (SCD appendix B; PerFed-CKT Dir_K(alpha)).

    For every class j a vector d_j ~ Dir_N(alpha) over the N clients is drawn and the
    class's (shuffled) samples are allocated by those proportions: client k gets the
    k-th consecutive piece, the cut points being ``floor(cumsum(d_j) * n_j)`` (SCD:
    "if the second entry of d_1 equals 0.05, then client 2 would be randomly allocated
    with 5% of the data samples"). Client sizes are therefore unbalanced, increasingly
    so as alpha shrinks. Every index is assigned.

    ``min_size``: if > 0, the whole draw is repeated until every client holds at least
    ``min_size`` samples; after ``max_retries`` failed draws a ``ValueError`` explains
    that the constraint is unreachable for this alpha. Neither paper states a minimum,
    so the default 0 allows empty clients (with alpha=0.01 and 100 clients most
    clients are empty: each class lands almost entirely on one or two clients).

    Options reproducing SCD's public code rather than the paper's text (jimmyc96/
    spectral-dis-FL util/data.py calls ``non_iid_dirichlet_sampling(y_train, num_classes,
    p, num_users, seed, alpha_dirichlet)``; its util/sampling.py is not in our index,
    the signature is FedCorr's util/sampling.py, which this follows):
      ``class_prob`` = p: each client holds each class independently with probability p
        (rows redrawn until every client holds a class and every class has a holder);
        the Dirichlet is then over the holders of that class only. The paper's rule is
        p = 1 (default). The code's README example uses p = 0.7, alpha = 10.
      ``allocation="sample"``: each sample is sent to a client drawn from d_j
        (a multinomial allocation, as in the code) instead of the exact floor split.
    """
    labels = _check_labels(labels)
    n_clients = _check_n_clients(n_clients)
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    if min_size < 0 or min_size * n_clients > len(labels):
        raise ValueError(
            f"min_size={min_size} is impossible: {n_clients} clients x {min_size} > "
            f"{len(labels)} samples"
        )
    if not 0 < class_prob <= 1:
        raise ValueError(f"class_prob must be in (0, 1], got {class_prob}")
    if allocation not in ("split", "sample"):
        raise ValueError(f"allocation must be 'split' or 'sample', got {allocation!r}")
    if max_retries < 1:
        raise ValueError("max_retries must be >= 1")
    n_classes = _n_classes(labels, n_classes)
    rng = np.random.default_rng(seed)
    members = _class_members(labels, n_classes, rng)

    for _ in range(max_retries):
        holders = _class_holders(rng, n_clients, n_classes, class_prob)
        parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
        for c in range(n_classes):
            idx = rng.permutation(members[c])
            who = holders[c]
            p = _dirichlet(rng, alpha, len(who))
            if allocation == "split":
                pieces = _split_by_proportions(idx, p)
            else:
                owner = rng.choice(len(who), size=len(idx), p=p)
                pieces = [idx[owner == k] for k in range(len(who))]
            for k, piece in zip(who, pieces):
                parts[k].append(piece)
        out = _finish(np.concatenate(lst) if lst else np.empty(0, np.int64) for lst in parts)
        if min(len(p) for p in out) >= min_size:
            return out
    raise ValueError(
        f"dirichlet: no draw in {max_retries} tries gave every client >= {min_size} "
        f"samples (alpha={alpha}, {n_clients} clients, {len(labels)} samples); "
        "lower min_size or raise alpha"
    )


def _class_holders(rng, n_clients: int, n_classes: int, class_prob: float) -> list[np.ndarray]:
    if class_prob >= 1:
        return [np.arange(n_clients)] * n_classes
    hold = 1.0 - (1.0 - class_prob) ** n_classes      # P(a client's row holds some class)
    if hold < 1e-3:   # the redraw below would spin (class_prob=1e-9 ran for ever: issue 33)
        raise ValueError(f"class_prob={class_prob} too small: with {n_classes} classes a client holds any class with "
                         f"probability {hold:.2g}; use class_prob >= {1 - (1 - 1e-3) ** (1 / n_classes):.2g}")
    for _ in range(10000):
        phi = rng.random((n_clients, n_classes)) < class_prob
        empty = ~phi.any(axis=1)
        for _ in range(100000):  # as the code: redraw rows of clients holding no class
            if not empty.any():
                break
            phi[empty] = rng.random((int(empty.sum()), n_classes)) < class_prob
            empty = ~phi.any(axis=1)
        if phi.any(axis=0).all():
            return [np.flatnonzero(phi[:, c]) for c in range(n_classes)]
    raise ValueError(f"class_prob={class_prob} too small: some class never gets a holder")


def balanced_dirichlet(
    labels: np.ndarray,
    n_clients: int,
    seed: int,
    alpha: float = 0.1,
    n_aux: int = 10,
    min_frac: float = 0.5,
    equal_slices: bool = True,
    max_retries: int = 10000,
    n_classes: int | None = None,
) -> list[np.ndarray]:
    """pFedSD's "balanced partition strategy with Dirichlet distribution following [FedDF]".

    Follows ``build_non_iid_by_dirichlet`` + ``DataPartitioner`` of the FedDF public code
    (epfml/federated-learning-public-code, codes/FedDF-code/pcode/datasets/partition_data.py),
    which pFedSD's code (CGCL-codes/pFedSD, same file) reuses unchanged:

    1. Shuffle all indices and cut them into groups of ``n_aux`` clients: each group
       but the last takes ``n_aux * len // n_clients`` consecutive indices, the last
       takes the rest and the remaining clients.
    2. In a group of size G with k clients, for every class in turn draw
       p ~ Dir_k(alpha), zero the share of each client that already holds >= G/k
       samples (the "balance" step), renormalise and split the class's samples of this
       group by floor(cumsum(p) * n). Repeat the whole group's draw until the smallest
       client holds >= int(min_frac * G / k) samples (at most ``max_retries`` times,
       then ``ValueError``; the code loops forever).
    3. ``equal_slices=True`` (the code's behaviour): concatenate the clients' lists
       (group by group, client by client, each list in the order it was filled,
       i.e. class by class) and cut that sequence into N consecutive slices of equal
       size. This is why every client of the public code ends with exactly len/N
       samples (Fashion-MNIST train+test 70,000 over 100 clients: 700 each); a slice
       is mostly one Dirichlet bucket plus the border of its neighbour. The code
       drops the last ``len % N`` samples; here they go one each to the first clients,
       so every index is assigned.
       ``equal_slices=False``: return the Dirichlet buckets as drawn (sizes vary,
       bounded below by ``min_frac`` of the group average and roughly above by G/k
       plus one class's share).

    With fewer than ``n_aux`` clients the group size is ``n_clients`` (the code asserts
    ``n_aux <= n_clients`` instead). Note: pFedSD's code seeds this step with a
    module-level ``np.random.RandomState(7)``; here ``seed`` controls it.
    """
    labels = _check_labels(labels)
    n_clients = _check_n_clients(n_clients, len(labels))
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    if n_aux < 1:
        raise ValueError(f"n_aux must be >= 1, got {n_aux}")
    if not 0 <= min_frac <= 1:
        raise ValueError(f"min_frac must be in [0, 1], got {min_frac}")
    if max_retries < 1:
        raise ValueError("max_retries must be >= 1")
    n_classes = _n_classes(labels, n_classes)
    rng = np.random.default_rng(seed)
    n = len(labels)

    perm = rng.permutation(n)
    group = min(n_aux, n_clients)
    n_groups = -(-n_clients // group)
    step = group * n // n_clients
    buckets: list[np.ndarray] = []
    left = n_clients
    for g in range(n_groups):
        idx = perm[g * step : (n if g == n_groups - 1 else (g + 1) * step)]
        k = min(group, left)
        left -= k
        buckets.extend(_balanced_group(rng, idx, labels[idx], k, n_classes, alpha,
                                       min_frac, max_retries))
    if not equal_slices:
        return _finish(buckets)
    seq = np.concatenate(buckets)
    return _finish(np.array_split(seq, n_clients))


def _balanced_group(rng, idx, lab, k, n_classes, alpha, min_frac, max_retries):
    size = len(idx)
    fair = size / k
    target = int(min_frac * size / k)
    by_class = [idx[lab == c] for c in range(n_classes)]  # keeps the shuffled order
    for _ in range(max_retries):
        lists: list[list[np.ndarray]] = [[] for _ in range(k)]
        held = np.zeros(k, dtype=np.int64)
        for members in by_class:
            if len(members) == 0:
                continue
            open_ = held < fair
            p = _dirichlet(rng, alpha, k) * open_
            if p.sum() <= 0:  # every open client drew ~0: give it to one open client
                p = np.zeros(k)
                p[rng.choice(np.flatnonzero(open_))] = 1.0
            p = p / p.sum()
            for j, piece in enumerate(_split_by_proportions(members, p)):
                if len(piece):
                    lists[j].append(piece)
                    held[j] += len(piece)
        if held.min() >= target:
            return [np.concatenate(lst) if lst else np.empty(0, np.int64) for lst in lists]
    raise ValueError(
        f"balanced_dirichlet: no draw in {max_retries} tries gave every client of a group "
        f"of {k} clients >= {target} samples (alpha={alpha}); lower min_frac or raise alpha"
    )


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


PARTITIONERS: dict[str, Callable[..., list[np.ndarray]]] = {
    "iid": iid,
    "dirichlet": dirichlet,
    "balanced_dirichlet": balanced_dirichlet,
    "shards": shards,
    "n_by_s": n_by_s,
    "classes_uniform_shares": classes_uniform_shares,
    "by_domain": by_domain,
    "lognormal": lognormal,
}


# ----------------------------------------------------------------------------
# per-client splits
# ----------------------------------------------------------------------------


def _check_clients(labels, client_indices):
    labels = _check_labels(labels)
    out = []
    for i, idx in enumerate(client_indices):
        idx = np.asarray(idx, dtype=np.int64)
        if idx.ndim != 1 or (idx.size and (idx.min() < 0 or idx.max() >= len(labels))):
            raise ValueError(f"client {i}: indices out of range for {len(labels)} labels")
        out.append(idx)
    return labels, out


def _stratified_cut(rng, lab: np.ndarray, sizes) -> list[np.ndarray]:
    """Cut positions 0..n-1 into segments of the given sizes, stratified by class.

    Per class, the count for each segment is first rounded systematically
    (``floor(m_c * F_k + u_c)`` differences, F_k the cumulative fractions, u_c a random
    offset), which keeps every class total exact and every cell at the floor or ceil
    of its proportional share m_c * s_k / n. The segment totals are then made exact by
    moving single samples between segments, each time from the class whose move keeps
    the cells closest to proportional. Finally each class's (shuffled) members are
    dealt out by those counts.
    """
    n = len(lab)
    sizes = np.asarray(sizes, dtype=np.int64)
    if n == 0:
        return [np.empty(0, np.int64) for _ in sizes]
    classes, inv = np.unique(lab, return_inverse=True)
    m = np.bincount(inv).astype(np.int64)
    frac = sizes / n
    cumf = np.cumsum(sizes) / n
    cumf[-1] = 1.0
    u = rng.random(len(classes))
    cum = np.floor(m[:, None] * cumf[None, :] + u[:, None]).astype(np.int64)
    cum[:, -1] = m  # floor(m + u) with 0 <= u < 1
    a = np.diff(cum, axis=1, prepend=0)
    target = m[:, None] * frac[None, :]
    d = sizes - a.sum(0)
    while np.any(d != 0):
        k = int(np.argmin(d))  # segment with the most surplus
        j = int(np.argmax(d))  # segment with the largest deficit
        score = (a[:, k] - target[:, k]) - (a[:, j] - target[:, j])
        score = np.where(a[:, k] > 0, score + 1e-9 * rng.random(len(m)), -np.inf)
        c = int(np.argmax(score))
        a[c, k] -= 1
        a[c, j] += 1
        d[k] += 1
        d[j] -= 1
    out = [[] for _ in sizes]
    for ci in range(len(classes)):
        pos = rng.permutation(np.flatnonzero(inv == ci))
        for seg, piece in enumerate(np.split(pos, np.cumsum(a[ci])[:-1])):
            out[seg].append(piece)
    return [np.concatenate(o) for o in out]


def _segments(rng, idx, lab, sizes, stratify):
    """Sizes for the named parts plus one trailing 'unused' part; returns the named parts."""
    n = len(idx)
    full = list(sizes) + [n - sum(sizes)]
    if stratify:
        segs = _stratified_cut(rng, lab, full)
    else:
        segs = np.split(rng.permutation(n), np.cumsum(full)[:-1])
    return [np.sort(idx[s]) for s in segs[:-1]]


def random_split(
    labels: np.ndarray,
    client_indices,
    seed: int,
    fractions=(0.8, 0.2),
    stratify: bool = True,
) -> dict[str, list[np.ndarray]]:
    """Random per-client split: (train, test) or (train, val, test) fractions.

    pFedSD: (0.8, 0.2) ("All datasets are split randomly by an 80-20 ratio"). DC-PFL:
    (0.8, 0.1, 0.1) ("partitioned into three distinct subsets: training, evaluation,
    and testing, with an 8:1:1 allocation ratio"); the order is train, val, test.

    Sizes: val and test get ``floor(f * n)`` (pFedSD's code uses ``int(f * n)``);
    train gets the rest when the fractions sum to 1, else ``floor(f_train * n)`` and
    the remainder is unused. A non-empty client always has >= 1 training sample.

    ``stratify=True`` (default): the split is stratified by class within the client
    (``_stratified_cut``), so train/val/test each follow the client's own label
    distribution: a class's count in a part is the floor or ceil of its proportional
    share, except in rare cases where fixing the part sizes costs one more sample; pFedSD's code splits plainly at random
    (``stratify=False``), which matches only in expectation.
    """
    labels, clients = _check_clients(labels, client_indices)
    fr = np.asarray(fractions, dtype=float)
    if fr.ndim != 1 or len(fr) not in (2, 3):
        raise ValueError(f"fractions must have 2 (train, test) or 3 (train, val, test) entries, got {fractions!r}")
    if np.any(fr < 0) or fr[0] <= 0 or fr.sum() > 1 + 1e-9:
        raise ValueError(f"fractions must be >= 0, train > 0, sum <= 1; got {fractions!r}")
    names = ["train", "test"] if len(fr) == 2 else ["train", "val", "test"]
    whole = abs(fr.sum() - 1) <= 1e-9
    rng = np.random.default_rng(seed)
    out: dict[str, list[np.ndarray]] = {k: [] for k in names}
    for idx in clients:
        n = len(idx)
        rest = [int(np.floor(f * n + 1e-9)) for f in fr[1:]]
        n_train = n - sum(rest) if whole else int(np.floor(fr[0] * n + 1e-9))
        sizes = _ensure_train([n_train] + rest, n)
        for name, seg in zip(names, _segments(rng, idx, labels[idx], sizes, stratify)):
            out[name].append(seg)
    return out


def _ensure_train(sizes: list[int], n: int) -> list[int]:
    """Give train one sample when it rounded to zero (from the unused rest, else the
    largest other part)."""
    sizes = list(sizes)
    if n > 0 and sizes[0] == 0:
        if sum(sizes) < n:
            sizes[0] = 1
        else:
            j = 1 + int(np.argmax(sizes[1:]))
            sizes[j] -= 1
            sizes[0] = 1
    return sizes


def perfed_ckt_split(
    labels: np.ndarray,
    client_indices,
    seed: int,
    train_choices=(0.1, 0.3, 0.4),
    val_fraction: float = 0.1,
    test_fraction: float = 0.5,
    stratify: bool = True,
) -> dict[str, list[np.ndarray]]:
    """PerFed-CKT appendix E: "we partition each client dataset by a {0.1, 0.3, 0.4}/0.1/0.5
    ratio where the ratio for the training dataset is chosen by random from
    {0.1, 0.3, 0.4} for each client".

    Per client the train fraction is drawn uniformly from ``train_choices``; sizes are
    ``floor(f * n)`` for train, val and test (no code is public; floor is our choice).
    The three fractions sum to 0.7, 0.9 or 1.0, and the paper says nothing about the
    rest (0.3, 0.1 or 0), so the remainder is left unused: it is in no returned set
    (the paper's motivation, "clients may not have sufficient labeled data samples for
    training", fits discarding it). A non-empty client always gets >= 1 training
    sample. Stratified by class within the client as in ``random_split``.
    """
    labels, clients = _check_clients(labels, client_indices)
    choices = np.asarray(train_choices, dtype=float)
    if choices.ndim != 1 or choices.size == 0 or np.any(choices <= 0):
        raise ValueError(f"train_choices must be positive fractions, got {train_choices!r}")
    if val_fraction < 0 or test_fraction < 0 or choices.max() + val_fraction + test_fraction > 1 + 1e-9:
        raise ValueError("train + val + test fractions must not exceed 1")
    rng = np.random.default_rng(seed)
    out: dict[str, list[np.ndarray]] = {"train": [], "val": [], "test": []}
    for idx in clients:
        n = len(idx)
        f = choices[rng.integers(len(choices))]
        sizes = [int(np.floor(x * n + 1e-9)) for x in (f, val_fraction, test_fraction)]
        sizes = _ensure_train(sizes, n)
        for name, seg in zip(("train", "val", "test"), _segments(rng, idx, labels[idx], sizes, stratify)):
            out[name].append(seg)
    return out


def global_test_by_proportion(
    labels: np.ndarray,
    client_indices,
    seed: int,
    test_labels: np.ndarray | None = None,
    scale: float | None = None,
    n_classes: int | None = None,
) -> dict[str, list[np.ndarray]]:
    """SCD: local test sets drawn from the global test set by the client's class proportions.

    SCD appendix B: "we perform sampling for the local test sets according to the
    distribution of training data for each respective client, where sampling is
    performed without replacement on the test set of the corresponding benchmark
    dataset". Client train = all of its partitioned samples (``'train'`` indexes
    ``labels``); ``'test'`` holds indices into ``test_labels`` (required keyword).

    Size rule from SCD's public code (jimmyc96/spectral-dis-FL, util/data.py): client i
    gets ``floor(count_train[i, c] / n_train_total * n_test)`` test samples of class c,
    i.e. its train counts scaled by |test| / |train| (``scale`` overrides that factor),
    capped at the number of class-c test samples. Sampling is without replacement
    within a client and independent across clients, so two clients' test sets may
    share samples (as in the code).
    """
    labels, clients = _check_clients(labels, client_indices)
    if test_labels is None:
        raise ValueError("global_test_by_proportion needs test_labels= (the global test labels)")
    test_labels = _check_labels(test_labels)
    n_classes = max(_n_classes(labels, n_classes), _n_classes(test_labels, n_classes))
    counts = label_counts(labels, clients, n_classes)
    total = counts.sum()
    if scale is None:
        scale = len(test_labels) / total if total else 0.0
    if scale < 0:
        raise ValueError(f"scale must be >= 0, got {scale}")
    want = np.floor(counts * scale + 1e-9).astype(np.int64)
    by_class = [np.flatnonzero(test_labels == c) for c in range(n_classes)]
    avail = np.array([len(b) for b in by_class])
    want = np.minimum(want, avail[None, :])
    rng = np.random.default_rng(seed)
    tests = []
    for i in range(len(clients)):
        picks = [rng.choice(by_class[c], size=want[i, c], replace=False)
                 for c in range(n_classes) if want[i, c] > 0]
        tests.append(np.sort(np.concatenate(picks)) if picks else np.empty(0, np.int64))
    return {"train": [np.sort(idx) for idx in clients], "test": tests}


def domain_test(labels: np.ndarray, client_indices, seed: int, test_domains=None) -> dict[str, list[np.ndarray]]:
    """One domain per client (``by_domain``): client k trains on all of its pool indices and is tested on every
    image of the official test half whose domain is k (FedBN: each domain's own test set, "accuracy analysis
    is conducted for each client on the corresponding test dataset", FedBSD Sec. 4.1). The 'test' arrays index
    the test half (``test_domains``: one domain id per test image, passed by the run). ``seed`` is unused."""
    labels, client_indices = _check_clients(labels, client_indices)
    if test_domains is None:
        raise ValueError("split 'domain_test' needs a multi-domain dataset (one with `domains`)")
    test_domains = np.asarray(test_domains, dtype=np.int64)
    train = _finish(client_indices)
    return {"train": train, "test": _finish(np.flatnonzero(test_domains == k) for k in range(len(train)))}


domain_test.uses_domains = True            # the run passes the test half's domains
domain_test.tests_from_test_half = True    # its 'test' arrays index the official test half


SPLITS: dict[str, Callable[..., dict[str, list[np.ndarray]]]] = {
    "random": random_split,
    "perfed_ckt": perfed_ckt_split,
    "global_test_by_proportion": global_test_by_proportion,
    "domain_test": domain_test,
}


# ----------------------------------------------------------------------------
# inspection
# ----------------------------------------------------------------------------


def label_counts(labels: np.ndarray, client_indices, n_classes: int) -> np.ndarray:
    """(n_clients, n_classes) int64 matrix of per-client class counts."""
    labels = _check_labels(labels)
    out = np.zeros((len(client_indices), int(n_classes)), dtype=np.int64)
    for i, idx in enumerate(client_indices):
        lab = labels[np.asarray(idx, dtype=np.int64)]
        if lab.size and lab.max() >= n_classes:
            raise ValueError(f"label {lab.max()} >= n_classes={n_classes}")
        out[i] = np.bincount(lab, minlength=n_classes)
    return out


def plot_partition(counts: np.ndarray, ax=None, title: str | None = None):
    """Clients x classes bubble chart (as pFedSD Fig. 5), bubble area ~ sample count.

    x = client id, y = class label; one point per non-zero (client, class) cell, so
    ``ax.collections[0].get_offsets()`` has ``np.count_nonzero(counts)`` rows. Built on
    ``matplotlib.figure.Figure`` (no pyplot state, no display needed); returns the Figure.
    """
    from matplotlib.figure import Figure

    counts = np.asarray(counts)
    if counts.ndim != 2:
        raise ValueError(f"counts must be (clients, classes), got shape {counts.shape}")
    n_clients, n_classes = counts.shape
    if ax is None:
        width = min(max(4.0, 1.5 + 0.16 * n_clients), 24.0)
        height = min(max(3.0, 1.2 + 0.3 * n_classes), 16.0)
        fig = Figure(figsize=(width, height), layout="constrained")
        ax = fig.add_subplot()
    else:
        fig = ax.figure
    ci, cj = np.nonzero(counts)
    vals = counts[ci, cj].astype(float)
    # the largest bubble fills about one grid cell of the smaller spacing
    fig_w, fig_h = fig.get_size_inches()
    cell_pt = 72.0 * min(fig_w / max(n_clients, 1), fig_h / max(n_classes, 1))
    max_area = (0.95 * cell_pt) ** 2
    sizes = vals / vals.max() * max_area if vals.size else vals
    ax.scatter(ci, cj, s=sizes, alpha=0.7, linewidths=0, color="tab:green")
    ax.set_xlim(-0.7, n_clients - 0.3)
    ax.set_ylim(-0.7, n_classes - 0.3)
    xstep = max(1, int(np.ceil(n_clients / 25)))
    ystep = max(1, int(np.ceil(n_classes / 25)))
    ax.set_xticks(np.arange(0, n_clients, xstep))
    ax.set_yticks(np.arange(0, n_classes, ystep))
    ax.set_xlabel("Client ID")
    ax.set_ylabel("Class label")
    ax.grid(True, linewidth=0.3, alpha=0.5)
    ax.set_axisbelow(True)
    if title:
        ax.set_title(title)
    return fig


# ---------------------------------------------------------------- the settings each rule takes (checked by RunConfig)

_alpha = Param(float, 0.5, "Dirichlet concentration (smaller = more skewed)", low=0.0, low_open=True)
_cpc = Param(int, 2, "classes per client", low=1)

PARTITION_SCHEMAS: dict[str, dict[str, Param]] = {
    "iid": {},
    "dirichlet": {
        "alpha": _alpha,
        "min_size": Param(int, 0, "redraw until every client has this many samples", low=0),
        "class_prob": Param(float, 1.0, "SCD code option: P(client holds a class)", low=0.0, high=1.0, low_open=True),
        "allocation": Param(str, "split", "'split' (paper: exact proportions) or 'sample' (SCD code: multinomial)",
                            choices=("split", "sample")),
    },
    "balanced_dirichlet": {
        "alpha": Param(float, 0.1, _alpha.help, low=0.0, low_open=True),
        "n_aux": Param(int, 10, "clients per balancing group (FedDF/pFedSD code)", low=1),
        "min_frac": Param(float, 0.5, "redraw until the smallest client has this share of the average", low=0.0, high=1.0),
        "equal_slices": Param(bool, True, "pFedSD code: concatenate and cut into equal slices"),
    },
    "shards": {"s": Param(int, 2, "shards (= max classes) per client", low=1)},
    "n_by_s": {"classes_per_client": _cpc,
               "distinct": Param(bool, True, "each client's classes are distinct (FedRep)")},
    "classes_uniform_shares": {"classes_per_client": _cpc,
                               "low": Param(float, 0.4, "share lower bound", low=0.0, high=1.0),
                               "high": Param(float, 0.6, "share upper bound", low=0.0, high=1.0)},
    "by_domain": {},
    "lognormal": {"classes_per_client": Param(int, 3, "distinct classes per client (FedRep's FEMNIST: 3)", low=1),
                  "mean_size": Param(float, 148.0, "average samples a client (FedRep's FEMNIST: 148)", low=1.0,
                                     high=1e6),
                  "sigma": Param(float, 1.0, "shape of the log-normal sizes (ours: not stated)", low=0.0, high=10.0),
                  "min_size": Param(int, 1, "smallest client", low=0, high=10**6)},
}

SPLIT_SCHEMAS: dict[str, dict[str, Param]] = {
    "random": {"fractions": Param(tuple, (0.8, 0.2), "(train, test) or (train, val, test) fractions"),
               "stratify": Param(bool, True, "split each client's classes proportionally")},
    "perfed_ckt": {"train_choices": Param(tuple, (0.1, 0.3, 0.4), "train fraction drawn per client from these"),
                   "val_fraction": Param(float, 0.1, "", low=0.0, high=1.0),
                   "test_fraction": Param(float, 0.5, "", low=0.0, high=1.0, low_open=True),   # every client tests
                   "stratify": Param(bool, True, "")},
    "domain_test": {},
    "global_test_by_proportion": {"scale": Param(float, None, "local test size = scale x train size "
                                                 "(default |test|/|train|)", low=1e-3, high=100.0)},
}
