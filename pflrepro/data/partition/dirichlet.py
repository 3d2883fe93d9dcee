"""Partitioners by label skew and size: IID, the per-class Dirichlet (SCD, PerFed-CKT) and FedDF's balanced Dirichlet
(pFedSD)."""
from __future__ import annotations

import numpy as np

from ._common import _check_labels, _check_n_clients, _class_members, _dirichlet, _finish, _n_classes, _split_by_proportions, redraw


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

    def draw():
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
        return _finish(np.concatenate(lst) if lst else np.empty(0, np.int64) for lst in parts)

    return redraw(draw, lambda out: min(len(p) for p in out) >= min_size, max_retries,
                  f"dirichlet: no draw in {max_retries} tries gave every client >= {min_size} samples (alpha={alpha}, "
                  f"{n_clients} clients, {len(labels)} samples); lower min_size or raise alpha")


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
    def draw():
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
        return lists, held

    lists, _ = redraw(draw, lambda out: out[1].min() >= target, max_retries,
                      f"balanced_dirichlet: no draw in {max_retries} tries gave every client of a group of {k} clients "
                      f">= {target} samples (alpha={alpha}); lower min_frac or raise alpha")
    return [np.concatenate(lst) if lst else np.empty(0, np.int64) for lst in lists]
