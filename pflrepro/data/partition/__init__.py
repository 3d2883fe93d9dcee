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

from ...params import Param
from .classes import (by_domain, classes_uniform_shares, lognormal, n_by_s, n_by_s_assignment, share_out, shards,
                      uniform_shares_assignment)
from .dirichlet import balanced_dirichlet, dirichlet, iid
from .inspect import label_counts, plot_partition
from .splits import domain_test, global_test_by_proportion, perfed_ckt_split, random_split

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
    "share_out",
    "by_domain",
    "domain_test",
    "label_counts",
    "plot_partition",
    "PARTITIONERS",
    "SPLITS",
]

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

SPLITS: dict[str, Callable[..., dict[str, list[np.ndarray]]]] = {
    "random": random_split,
    "perfed_ckt": perfed_ckt_split,
    "global_test_by_proportion": global_test_by_proportion,
    "domain_test": domain_test,
}


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
               "stratify": Param(bool, True, "split each client's classes proportionally"),
               "extra_test": Param(int, 0, "more test images a client, from images no client holds, by the client's "
                                   "label proportions (issue 54's design; 0: none, the papers' split)", low=0)},
    "perfed_ckt": {"train_choices": Param(tuple, (0.1, 0.3, 0.4), "train fraction drawn per client from these"),
                   "val_fraction": Param(float, 0.1, "", low=0.0, high=1.0),
                   "test_fraction": Param(float, 0.5, "", low=0.0, high=1.0, low_open=True),   # every client tests
                   "stratify": Param(bool, True, "")},
    "domain_test": {},
    "global_test_by_proportion": {"scale": Param(float, None, "local test size = scale x train size "
                                                 "(default |test|/|train|)", low=1e-3, high=100.0)},
}
