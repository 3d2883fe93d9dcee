"""Per-client splits of each client's indices into train / (val) / test."""
from __future__ import annotations

import numpy as np

from ._common import _check_labels, _finish, _n_classes
from .inspect import label_counts


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
    extra_test: int = 0,
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

    ``extra_test`` (not in any paper; issue 54's design with larger per-client test sets): each client's test set
    also gets this many images that no client holds, by the client's own label proportions (``more_tests``). Training
    is unchanged: the split above is drawn first, by the same generator, so train, val and the original tests are
    the same images as with ``extra_test=0``.
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
    if extra_test:
        extra = more_tests(labels, clients, extra_test, seed)
        out["test"] = [np.sort(np.concatenate([t, e])) for t, e in zip(out["test"], extra)]
    return out


def more_tests(labels: np.ndarray, clients: list[np.ndarray], size: int, seed: int) -> list[np.ndarray]:
    """`size` more test images a client from the images no client holds, by the client's label proportions:
    class c gets the largest-remainder rounding of size x (the client's share of c), each image to one client at
    most (clients in order), drawn by a generator of its own (the split's draws stay as they were)."""
    if size < 0:
        raise ValueError(f"extra_test={size}: must be >= 0")
    held = np.concatenate(clients + [np.empty(0, np.int64)])
    free = np.setdiff1d(np.arange(len(labels)), held)
    rng = np.random.default_rng([seed, 0x7E57])
    n_classes = int(labels.max()) + 1 if len(labels) else 0
    pools = {c: list(rng.permutation(free[labels[free] == c])) for c in range(n_classes)}
    out = []
    for i, idx in enumerate(clients):
        share = np.bincount(labels[idx], minlength=n_classes) / max(len(idx), 1)
        want = np.floor(share * size).astype(np.int64)
        rest = np.argsort(-(share * size - want), kind="stable")[: size - int(want.sum())] if len(idx) else []
        want[rest] += 1
        if any(want[c] > len(pools[c]) for c in range(n_classes)):
            raise ValueError(f"extra_test={size}: client {i} needs more images of a class than the pool has free")
        out.append(np.sort(np.asarray([pools[c].pop() for c in range(n_classes) for _ in range(want[c])],
                                      np.int64)))
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
