"""Validation schemas for partitioner and split settings (see pflrepro.partition).

Kept beside the config machinery so a bad `partition_params` value fails at config time,
before any data is loaded, with the key, the value and what is allowed."""
from .config import Param

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
                  "mean_size": Param(float, 148.0, "average samples a client (FedRep's FEMNIST: 148)", low=0.0,
                                     low_open=True),
                  "sigma": Param(float, 1.0, "shape of the log-normal sizes (ours: not stated)", low=0.0),
                  "min_size": Param(int, 1, "smallest client", low=0)},
}

SPLIT_SCHEMAS: dict[str, dict[str, Param]] = {
    "random": {"fractions": Param(tuple, (0.8, 0.2), "(train, test) or (train, val, test) fractions"),
               "stratify": Param(bool, True, "split each client's classes proportionally")},
    "perfed_ckt": {"train_choices": Param(tuple, (0.1, 0.3, 0.4), "train fraction drawn per client from these"),
                   "val_fraction": Param(float, 0.1, "", low=0.0, high=1.0),
                   "test_fraction": Param(float, 0.5, "", low=0.0, high=1.0),
                   "stratify": Param(bool, True, "")},
    "domain_test": {},
    "global_test_by_proportion": {"scale": Param(float, None, "local test size = scale x train size "
                                                 "(default |test|/|train|)", low=0.0, low_open=True)},
}

PUBLIC_SCHEMA: dict[str, Param] = {
    "dataset": Param(str, "", "dataset the unlabeled public set is drawn from ('' = the run's own dataset)"),
    "split": Param(str, "train", "which half of it: 'train' or 'test'", choices=("train", "test")),
    "size": Param(int, 0, "number of public samples |P| (0 = no public set); drawn uniformly without replacement, "
                  "never from samples the run's clients or test sets use", low=0),
}
