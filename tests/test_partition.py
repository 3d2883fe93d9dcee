import numpy as np
import pytest

from pflrepro.data import partition as P

# 10 classes x 200 samples in random dataset order
_rs = np.random.RandomState(123)
LABELS = _rs.permutation(np.repeat(np.arange(10), 200))

CASES = {
    "iid": {},
    "dirichlet": {"alpha": 0.5},
    "balanced_dirichlet": {"alpha": 0.5},
    "shards": {"s": 2},
    "n_by_s": {"classes_per_client": 2},
    "classes_uniform_shares": {"classes_per_client": 2},
    "lognormal": {"classes_per_client": 3, "mean_size": 80, "sigma": 0.5},   # deals 20 x 80 of the 2,000
}
FULL_COVER = {"iid", "dirichlet", "balanced_dirichlet", "shards", "n_by_s"}


def test_registries():
    assert set(P.PARTITIONERS) == set(CASES) | {"by_domain"}   # by_domain reads each image's domain: tests/test_domains.py
    assert set(P.SPLITS) == {"random", "perfed_ckt", "global_test_by_proportion", "domain_test"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_partitioner_disjoint_sorted_and_cover(name):
    parts = P.PARTITIONERS[name](LABELS, 20, 0, **CASES[name])
    assert len(parts) == 20
    for p in parts:
        assert p.dtype == np.int64
        assert np.all(np.diff(p) > 0)  # sorted, no duplicates
    allidx = np.concatenate(parts)
    assert len(np.unique(allidx)) == len(allidx)  # disjoint
    assert allidx.min() >= 0 and allidx.max() < len(LABELS)
    if name in FULL_COVER:
        assert len(allidx) == len(LABELS)
    elif name == "lognormal":          # deals n_clients x mean_size (up to rounding), not the whole set
        assert abs(len(allidx) - 20 * 80) <= 20
    else:
        assert len(allidx) >= 0.95 * len(LABELS)


@pytest.mark.parametrize("name", sorted(CASES))
def test_partitioner_deterministic_and_seed_dependent(name):
    state = np.random.get_state()
    a = P.PARTITIONERS[name](LABELS, 20, 7, **CASES[name])
    b = P.PARTITIONERS[name](LABELS, 20, 7, **CASES[name])
    c = P.PARTITIONERS[name](LABELS, 20, 8, **CASES[name])
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    # the global RNG is neither used nor disturbed
    after = np.random.get_state()
    assert np.array_equal(state[1], after[1]) and state[2] == after[2]


def test_iid_sizes():
    parts = P.iid(np.zeros(103, dtype=int), 10, 0)
    assert sorted(len(p) for p in parts) == [10] * 7 + [11] * 3


def test_shards_one_class_per_client():
    labels = np.array([0, 1] * 10)
    parts = P.shards(labels, 2, 0, s=1)
    assert sorted(tuple(np.unique(labels[p])) for p in parts) == [(0,), (1,)]
    parts = P.shards(labels, 4, 3, s=1)
    for p in parts:
        assert len(p) == 5 and len(np.unique(labels[p])) == 1


def test_shards_at_most_s_classes():
    parts = P.shards(LABELS, 50, 1, s=2)  # 100 shards of 20, classes of 200
    counts = P.label_counts(LABELS, parts, 10)
    assert np.all((counts > 0).sum(1) <= 2)
    assert np.all(counts.sum(1) == 40)
    assert np.all(np.isin(counts, [0, 20, 40]))


def test_n_by_s_exact_classes():
    parts = P.n_by_s(LABELS, 20, 0, classes_per_client=2)  # 4 shards of 50 per class
    counts = P.label_counts(LABELS, parts, 10)
    assert np.all((counts > 0).sum(1) == 2)
    assert np.all(np.isin(counts, [0, 50]))
    assert np.all(counts.sum(0) == 200)
    parts = P.n_by_s(LABELS, 20, 1, classes_per_client=5)  # 10 shards of 20 per class
    counts = P.label_counts(LABELS, parts, 10)
    assert np.all((counts > 0).sum(1) == 5) and np.all(np.isin(counts, [0, 20]))


def test_n_by_s_distinct_when_s_does_not_divide_c():
    parts = P.n_by_s(LABELS, 10, 0, classes_per_client=3)  # 3 shards per class
    counts = P.label_counts(LABELS, parts, 10)
    assert np.all((counts > 0).sum(1) == 3)


def test_n_by_s_fedrep_mode_and_assignment_reuse():
    a = P.n_by_s_assignment(10, 100, 2, seed=0, distinct=False)
    assert np.all(np.bincount(a.ravel(), minlength=10) == 20)
    labels = np.repeat(np.arange(10), 100)
    parts = P.n_by_s(labels, 100, 0, classes_per_client=2, distinct=False, assignment=a)
    counts = P.label_counts(labels, parts, 10)
    assert np.all(counts.sum(1) == 10)  # two shards of 5 each
    for i in range(100):
        assert set(np.flatnonzero(counts[i])) == set(a[i])
    d = P.n_by_s_assignment(10, 100, 2, seed=0)
    assert all(len(set(r)) == 2 for r in d)
    assert np.all(np.bincount(d.ravel(), minlength=10) == 20)
    # a second label array split with the same classes per client (FedRep's test set)
    test_labels = np.repeat(np.arange(10), 40)
    tr = P.n_by_s(labels, 100, 0, classes_per_client=2, assignment=d)
    te = P.n_by_s(test_labels, 100, 0, classes_per_client=2, assignment=d)
    for i in range(100):
        assert set(labels[tr[i]]) == set(test_labels[te[i]]) == set(d[i])


def test_classes_uniform_shares_exact_classes_and_sizes():
    labels = np.repeat(np.arange(10), 1000)
    parts = P.classes_uniform_shares(labels, 20, 0, classes_per_client=2)
    counts = P.label_counts(labels, parts, 10)
    assert np.all((counts > 0).sum(1) == 2)
    # each class shared by 4 clients with U(0.4, 0.6) weights normalised over the 4
    lo = int(1000 * 0.4 / (0.4 + 3 * 0.6))
    hi = int(1000 * 0.6 / (0.6 + 3 * 0.4)) + 1
    nz = counts[counts > 0]
    assert nz.min() >= lo and nz.max() <= hi
    assert np.all((counts > 0).sum(0) == 4)
    assert np.all(1000 - counts.sum(0) < 4)  # floor leaves < N*S/C per class
    # S not dividing C: still exactly S distinct classes
    parts = P.classes_uniform_shares(labels, 10, 1, classes_per_client=3)
    assert np.all((P.label_counts(labels, parts, 10) > 0).sum(1) == 3)


def test_classes_uniform_shares_assignment_reuse():
    classes, shares = P.uniform_shares_assignment(10, 20, 2, seed=4)
    assert np.allclose(np.bincount(classes.ravel(), weights=shares.ravel(), minlength=10), 1)
    labels = np.repeat(np.arange(10), 1000)
    test_labels = np.repeat(np.arange(10), 100)
    tr = P.classes_uniform_shares(labels, 20, 0, classes_per_client=2, assignment=(classes, shares))
    te = P.classes_uniform_shares(test_labels, 20, 0, classes_per_client=2, assignment=(classes, shares))
    for i in range(20):
        assert set(labels[tr[i]]) == set(test_labels[te[i]]) == set(classes[i])
        assert abs(len(tr[i]) / 1000 - len(te[i]) / 100) < 0.03


def test_balanced_dirichlet_fmnist_700_each():
    labels = np.random.RandomState(0).permutation(np.repeat(np.arange(10), 7000))
    parts = P.balanced_dirichlet(labels, 100, 0, alpha=0.1)
    assert all(len(p) == 700 for p in parts)
    assert len(np.unique(np.concatenate(parts))) == 70000
    counts = P.label_counts(labels, parts, 10)
    assert (counts.max(1) / 700).mean() > 0.4  # still label-skewed


def test_balanced_dirichlet_buckets_as_drawn():
    labels = np.random.RandomState(0).permutation(np.repeat(np.arange(10), 2000))
    parts = P.balanced_dirichlet(labels, 30, 2, alpha=0.1, equal_slices=False)
    sizes = np.array([len(p) for p in parts])
    assert sizes.sum() == 20000 and len(set(sizes)) > 1
    assert sizes.min() >= int(0.5 * 20000 / 30) - 1
    sl = P.balanced_dirichlet(labels, 30, 2, alpha=0.1, equal_slices=True)
    assert {len(p) for p in sl} <= {666, 667}
    # fewer clients than n_aux
    parts = P.balanced_dirichlet(labels, 4, 0, alpha=1.0)
    assert sum(map(len, parts)) == 20000


def test_dirichlet_large_alpha_uniform_small_alpha_concentrated():
    labels = np.repeat(np.arange(10), 5000)
    counts = P.label_counts(labels, P.dirichlet(labels, 100, 0, alpha=1e4), 10)
    assert counts.min() >= 45 and counts.max() <= 55
    counts = P.label_counts(labels, P.dirichlet(labels, 100, 0, alpha=0.01), 10)
    tot = counts.sum(1)
    nonempty = tot > 0
    dominant = counts.max(1)[nonempty] / tot[nonempty]
    assert np.mean(dominant > 0.9) > 0.5
    assert tot.max() > 1000  # sizes very unbalanced


def test_dirichlet_min_size_and_options():
    labels = np.repeat(np.arange(10), 500)
    parts = P.dirichlet(labels, 20, 0, alpha=0.3, min_size=20)
    assert min(len(p) for p in parts) >= 20
    with pytest.raises(ValueError, match="min_size"):
        P.dirichlet(labels, 100, 0, alpha=0.001, min_size=45, max_retries=5)
    parts = P.dirichlet(labels, 20, 0, alpha=1.0, class_prob=0.3, allocation="sample")
    allidx = np.concatenate(parts)
    assert len(allidx) == len(np.unique(allidx)) == 5000
    counts = P.label_counts(labels, parts, 10)
    assert (counts > 0).sum(1).mean() < 6  # most clients hold few classes


_L200 = np.repeat(np.arange(10), 20)


@pytest.mark.parametrize(
    "fn, n, kwargs, match",
    [
        (P.dirichlet, 20, {"alpha": 0}, "alpha"),
        (P.dirichlet, 20, {"alpha": -1}, "alpha"),
        (P.dirichlet, 20, {"alpha": 1, "min_size": 11}, "min_size"),  # 20 x 11 > 200
        (P.dirichlet, 20, {"alpha": 1, "class_prob": 0}, "class_prob"),
        (P.balanced_dirichlet, 20, {"alpha": 0}, "alpha"),
        (P.balanced_dirichlet, 20, {"alpha": 1, "min_frac": 2}, "min_frac"),
        (P.shards, 20, {"s": 11}, "shards"),  # 220 shards > 200 samples
        (P.shards, 20, {"s": 0}, "positive"),
        (P.n_by_s, 20, {"classes_per_client": 11}, "n_classes"),
        (P.n_by_s, 25, {"classes_per_client": 3}, "multiple"),  # 75 not a multiple of 10
        (P.classes_uniform_shares, 20, {"classes_per_client": 11}, "n_classes"),
        (P.classes_uniform_shares, 25, {"classes_per_client": 3}, "multiple"),
        (P.classes_uniform_shares, 20, {"low": 0.6, "high": 0.4}, "low"),
        (P.iid, 201, {}, "n_clients"),
        (P.iid, 0, {}, "n_clients"),
    ],
)
def test_bad_params(fn, n, kwargs, match):
    with pytest.raises(ValueError, match=match):
        fn(_L200, n, 0, **kwargs)


def test_too_few_samples_per_class():
    with pytest.raises(ValueError, match="fewer samples"):
        P.n_by_s(np.repeat(np.arange(10), 3), 20, 0, classes_per_client=2)  # 4 shards > 3 samples


# ---------------------------------------------------------------- splits

CLIENTS = P.dirichlet(np.repeat(np.arange(10), 500), 30, 0, alpha=0.5)
CLABELS = np.repeat(np.arange(10), 500)


def _check_subset_disjoint(split, clients):
    for i, idx in enumerate(clients):
        parts = [split[k][i] for k in split]
        allp = np.concatenate(parts)
        assert len(np.unique(allp)) == len(allp)
        assert np.all(np.isin(allp, idx))


@pytest.mark.parametrize("fractions", [(0.8, 0.2), (0.8, 0.1, 0.1)])
def test_random_split(fractions):
    sp = P.random_split(CLABELS, CLIENTS, 0, fractions=fractions)
    keys = ["train", "test"] if len(fractions) == 2 else ["train", "val", "test"]
    assert sorted(sp) == sorted(keys)
    _check_subset_disjoint(sp, CLIENTS)
    devs = []
    for i, idx in enumerate(CLIENTS):
        n = len(idx)
        assert sum(len(sp[k][i]) for k in keys) == n  # fractions sum to 1: all used
        for k, f in zip(keys[1:], fractions[1:]):
            assert len(sp[k][i]) == int(np.floor(f * n + 1e-9))
        if n:
            assert len(sp["train"][i]) >= 1
        # stratified: every part follows the client's class proportions
        cnt = np.bincount(CLABELS[idx], minlength=10)
        for k in keys:
            kcnt = np.bincount(CLABELS[sp[k][i]], minlength=10)
            dev = np.abs(kcnt - cnt * len(sp[k][i]) / max(n, 1))
            assert np.all(dev < 2)
            devs.append(dev)
    assert np.mean(np.concatenate(devs) < 1) > 0.99  # floor/ceil of the share
    again = P.random_split(CLABELS, CLIENTS, 0, fractions=fractions)
    assert all(np.array_equal(a, b) for a, b in zip(sp["test"], again["test"]))


def test_random_split_tiny_clients_and_errors():
    labels = np.array([0, 1, 2, 0])
    sp = P.random_split(labels, [np.array([0]), np.array([1, 2]), np.array([], dtype=int)], 0)
    assert [len(x) for x in sp["train"]] == [1, 2, 0]
    sp = P.random_split(labels, [np.array([0])], 0, fractions=(0.2, 0.8))
    assert len(sp["train"][0]) == 1 and len(sp["test"][0]) == 0
    for bad in [(0.9, 0.2), (0.0, 1.0), (1.0,), (0.5, 0.2, 0.2, 0.1), (0.8, -0.1)]:
        with pytest.raises(ValueError):
            P.random_split(labels, [np.array([0, 1])], 0, fractions=bad)
    sp = P.random_split(CLABELS, CLIENTS, 0, fractions=(0.5, 0.2))  # rest unused
    for i, idx in enumerate(CLIENTS):
        assert len(sp["train"][i]) == max(int(0.5 * len(idx)), 1 if len(idx) else 0)


def test_extra_test_adds_unheld_images_by_each_clients_label_shares_and_leaves_training_alone():
    """random_split's `extra_test` (issue 54's larger-test-set design), by hand: client 0 holds classes 0 and 1 in
    shares 2/3 and 1/3, so 3 more tests are 2 of class 0 and 1 of class 1; client 1 (class 2 only) gets 3 of class 2;
    client 2 (shares 1/2, 1/2) gets floor 1 + 1 and the one left over by the largest remainder, the first class on a
    tie: 2 of class 0, 1 of class 1."""
    labels = np.repeat(np.arange(3), 10)
    clients = [np.array([0, 1, 2, 3, 10, 11]), np.array([20, 21, 22, 23]), np.array([4, 5, 12, 13])]
    plain = P.random_split(labels, clients, 7, fractions=(0.5, 0.5))
    more = P.random_split(labels, clients, 7, fractions=(0.5, 0.5), extra_test=3)
    assert all(np.array_equal(a, b) for a, b in zip(plain["train"], more["train"]))       # training unchanged
    held = np.concatenate(clients)
    extras = []
    for i, want in enumerate(([2, 1, 0], [0, 0, 3], [2, 1, 0])):
        assert set(plain["test"][i]) <= set(more["test"][i])
        extra = np.setdiff1d(more["test"][i], plain["test"][i])
        assert np.bincount(labels[extra], minlength=3).tolist() == want
        assert not np.intersect1d(extra, held).size                                    # no client holds them
        extras.append(extra)
    assert len(np.unique(np.concatenate(extras))) == 9                                 # one client each
    again = P.random_split(labels, clients, 7, fractions=(0.5, 0.5), extra_test=3)
    assert all(np.array_equal(a, b) for a, b in zip(more["test"], again["test"]))      # deterministic
    with pytest.raises(ValueError, match="extra_test=7: client 0 needs more images of a class"):
        P.random_split(labels, clients, 7, fractions=(0.5, 0.5), extra_test=7)         # 5 of class 0; 4 are free


def test_perfed_ckt_split():
    labels = np.repeat(np.arange(10), 1000)
    clients = P.dirichlet(labels, 100, 0, alpha=0.5, min_size=20)
    sp = P.perfed_ckt_split(labels, clients, 0)
    assert sorted(sp) == ["test", "train", "val"]
    _check_subset_disjoint(sp, clients)
    seen = set()
    for i, idx in enumerate(clients):
        n = len(idx)
        assert len(sp["val"][i]) == int(np.floor(0.1 * n + 1e-9))
        assert len(sp["test"][i]) == int(np.floor(0.5 * n + 1e-9))
        match = [f for f in (0.1, 0.3, 0.4) if len(sp["train"][i]) == max(1, int(np.floor(f * n + 1e-9)))]
        assert match
        seen.add(match[-1] if len(match) == 1 else None)
        cnt = np.bincount(labels[idx], minlength=10)
        tcnt = np.bincount(labels[sp["test"][i]], minlength=10)
        assert np.all(np.abs(tcnt - cnt * len(sp["test"][i]) / n) < 2)
    assert {0.1, 0.3, 0.4} <= seen


def test_global_test_by_proportion():
    train_labels = np.repeat(np.arange(10), 500)
    test_labels = np.random.RandomState(1).permutation(np.repeat(np.arange(10), 100))
    clients = P.dirichlet(train_labels, 20, 0, alpha=0.5)
    sp = P.global_test_by_proportion(train_labels, clients, 0, test_labels=test_labels)
    assert all(np.array_equal(a, b) for a, b in zip(sp["train"], clients))
    scale = len(test_labels) / len(train_labels)
    for i, idx in enumerate(clients):
        te = sp["test"][i]
        assert len(np.unique(te)) == len(te)  # without replacement within a client
        assert te.size == 0 or (te.min() >= 0 and te.max() < len(test_labels))
        cnt = np.bincount(train_labels[idx], minlength=10)
        tcnt = np.bincount(test_labels[te], minlength=10)
        assert np.array_equal(tcnt, np.minimum(np.floor(cnt * scale + 1e-9).astype(int), 100))
        if len(idx) > 200:
            assert np.abs(tcnt / max(tcnt.sum(), 1) - cnt / cnt.sum()).max() < 0.05
    with pytest.raises(ValueError, match="test_labels"):
        P.global_test_by_proportion(train_labels, clients, 0)


def test_label_counts_and_plot():
    from matplotlib.figure import Figure

    parts = P.dirichlet(LABELS, 20, 0, alpha=0.3)
    counts = P.label_counts(LABELS, parts, 10)
    assert counts.shape == (20, 10) and counts.sum() == len(LABELS)
    fig = P.plot_partition(counts, title="Dir(0.3)")
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert len(ax.collections[0].get_offsets()) == np.count_nonzero(counts)
    big = P.label_counts(CLABELS, P.dirichlet(CLABELS, 100, 0, alpha=0.1), 10)
    fig2 = P.plot_partition(big)
    assert len(fig2.axes[0].collections[0].get_offsets()) == np.count_nonzero(big)
    other = Figure()
    ax3 = other.add_subplot()
    assert P.plot_partition(counts, ax=ax3) is other


# ---------------------------------------------------------------- lognormal (FedRep's FEMNIST setting)
def test_lognormal_hand_computed_equal_sizes_when_sigma_is_zero():
    """sigma = 0: every client has exactly mean_size samples, split evenly over its 3 distinct classes; 10 clients x
    3 classes over 10 classes: each class held by 3 clients (leveled); 9 samples a client = 3 of each class."""
    labels = np.repeat(np.arange(10), 30)
    parts = P.lognormal(labels, 10, seed=0, classes_per_client=3, mean_size=9, sigma=0.0)
    assert [len(p) for p in parts] == [9] * 10
    for p in parts:
        assert sorted(np.bincount(labels[p], minlength=10).tolist())[-3:] == [3, 3, 3]
    holders = np.array([[c in set(labels[p]) for c in range(10)] for p in parts]).sum(0)
    assert holders.tolist() == [3] * 10
    all_idx = np.concatenate(parts)
    assert len(np.unique(all_idx)) == len(all_idx)          # dealt without replacement


def test_share_out_hand_computed():
    """One each first, the rest in proportion, leftovers to the largest remainders; every sample used."""
    # [1, 1, 8] of 5: one each (3), the 2 left in proportion to [0, 0, 7] -> [1, 1, 3] (floor scaling gave [0, 0, 4])
    assert P.share_out(np.array([1, 1, 8]), 5).tolist() == [1, 1, 3]
    # [2, 3, 5] of 6: one each, 3 left over [1, 2, 4]: quotas 3/7, 6/7, 12/7 -> floors [0, 0, 1], remainders
    # 0.43, 0.86, 0.71: the two leftovers to slots 1 and 2 -> [1, 2, 3]
    assert P.share_out(np.array([2, 3, 5]), 6).tolist() == [1, 2, 3]
    # equal asks: 3 x 20 of 30 -> 10 each; fewer samples than slots: proportional from zero, ties to the earlier slot
    assert P.share_out(np.array([20, 20, 20]), 30).tolist() == [10, 10, 10]
    assert P.share_out(np.array([3, 3, 3]), 2).tolist() == [1, 1, 0]
    assert P.share_out(np.array([0, 4, 4]), 2).tolist() == [0, 1, 1]      # a slot asking nothing gets nothing


def test_lognormal_a_skewed_client_never_loses_a_class_to_the_cut():
    """Heavy skew on small classes (each asked for more than it has): every client that asks for all its 3 classes
    (min_size 3: one a class at least) keeps them; floor scaling left some of these clients one or two."""
    labels = np.repeat(np.arange(10), 40)
    parts = P.lognormal(labels, 40, seed=2, classes_per_client=3, mean_size=60, sigma=2.0, min_size=3)
    assert all(len(set(labels[p])) == 3 for p in parts)
    all_idx = np.concatenate(parts)
    assert len(np.unique(all_idx)) == len(all_idx) > 340                 # no replacement; more dealt than floors did


def test_lognormal_a_class_asked_for_more_than_it_has_scales_its_slots_down():
    """mean 60 asks 20 a slot, 3 slots a class = 60 of a class that has 30: every slot gets 20 * 30/60 = 10."""
    labels = np.repeat(np.arange(10), 30)
    parts = P.lognormal(labels, 10, seed=1, classes_per_client=3, mean_size=60, sigma=0.0)
    assert [len(p) for p in parts] == [30] * 10
    assert len(np.unique(np.concatenate(parts))) == 300


def test_lognormal_sizes_average_mean_size_and_are_skewed():
    """FedRep's FEMNIST: 150 clients, 3 classes each, sizes averaging 148 with a log-normal spread; deterministic."""
    labels = np.repeat(np.arange(10), 4000)
    parts = P.lognormal(labels, 150, seed=3, classes_per_client=3, mean_size=148, sigma=1.0)
    sizes = np.array([len(p) for p in parts])
    assert abs(sizes.mean() - 148) < 1.0                   # rounding only
    assert np.median(sizes) < sizes.mean() and sizes.max() > 3 * sizes.mean()   # right-skewed
    assert all(len(set(labels[p])) == 3 for p in parts)
    again = P.lognormal(labels, 150, seed=3, classes_per_client=3, mean_size=148, sigma=1.0)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    with pytest.raises(ValueError, match="multiple"):
        P.lognormal(labels, 149, seed=0, classes_per_client=3)


def test_dirichlet_class_prob_too_small_is_refused_not_spun():
    """Issue 33: class_prob=1e-9 redrew empty rows for ever; now one error at once, naming the smallest usable value."""
    import time
    labels = np.repeat(np.arange(10), 30)
    t = time.perf_counter()
    with pytest.raises(ValueError, match=r"class_prob=1e-09 too small.*class_prob >= 0\.0001"):
        P.dirichlet(labels, 5, seed=0, class_prob=1e-9)
    assert time.perf_counter() - t < 5
    parts = P.dirichlet(labels, 5, seed=0, class_prob=0.5)      # a usable value still partitions every index
    assert sorted(np.concatenate(parts).tolist()) == list(range(300))
