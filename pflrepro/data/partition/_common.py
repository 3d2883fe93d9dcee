"""What every partitioner and split shares: argument checks, the Dirichlet draw, cutting by proportions, and the
redraw-until-accepted loop."""
from __future__ import annotations

from typing import Callable, TypeVar

import numpy as np

T = TypeVar("T")


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


def redraw(draw: Callable[[], T], accept: Callable[[T], bool], tries: int, fail: str) -> T:
    """`draw()` again until `accept` takes it (a whole partition, or one balancing group, redrawn until its smallest
    client holds enough: SCD's and FedDF's/pFedSD's codes loop so); ValueError(`fail`) after `tries` draws."""
    for _ in range(tries):
        out = draw()
        if accept(out):
            return out
    raise ValueError(fail)
