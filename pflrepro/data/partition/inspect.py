"""Inspecting a partition: label counts per client and their picture."""
from __future__ import annotations

import numpy as np

from ._common import _check_labels


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
