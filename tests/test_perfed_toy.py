"""PERFED-CKT toy example (Fig. 1, App. E) and Theorem 4.2 (eq. 16, App. B): pflrepro.papers.toy."""
import numpy as np
import pytest

from pflrepro.papers import toy


def _hand_problem(P):
    """1-D, two clients: w_hat_0 = 1 (X = [1, 2], y = [1, 2]), w_hat_1 = 3 (X = [1], y = [3])."""
    X = [np.array([[1.0], [2.0]]), np.array([[1.0]])]
    y = [np.array([1.0, 2.0]), np.array([3.0])]
    return toy.ToyProblem(np.zeros(1), np.array([[1.0], [2.0]]), X, y, np.asarray(P, float), 0, (1.0, 1.0), 0.0)


def test_closed_forms_by_hand():
    """Hand computation: lam = 4, P = [1, 1] -> lam/|P| P^T P = 4, s_bar weights 1/2 -> target 2:
    client 0: (5 + 4)^{-1} (5 + 4*2) = 13/9, client 1: (1 + 4)^{-1} (3 + 8) = 11/5. Pooled LS (FedAvg):
    X^T X = 6, X^T y = 8 -> 4/3. Repeating the public point 4 times must not change anything (1/|P|)."""
    p = _hand_problem([[1.0], [1.0]])
    np.testing.assert_allclose(toy.local_models(p), [[1.0], [3.0]], atol=1e-12)
    np.testing.assert_allclose(toy.kt_models(p, toy.alpha_uniform(2), lam=4.0), [[13 / 9], [11 / 5]], atol=1e-12)
    p4 = _hand_problem([[1.0]] * 4)
    np.testing.assert_allclose(toy.kt_models(p4, toy.alpha_uniform(2), lam=4.0), [[13 / 9], [11 / 5]], atol=1e-12)
    # alpha = identity: the teacher is the client's own local model -> KT returns it exactly
    np.testing.assert_allclose(toy.kt_models(p, np.eye(2), lam=4.0), [[1.0], [3.0]], atol=1e-12)
    # alpha = [[0, 1], [1, 0]]: client 0 -> (5 + 4*3)/9 = 17/9, client 1 -> (3 + 4*1)/5 = 7/5
    np.testing.assert_allclose(toy.kt_models(p, [[0, 1], [1, 0]], lam=4.0), [[17 / 9], [7 / 5]], atol=1e-12)
    assert toy.fedavg_model(p) == pytest.approx([4 / 3], abs=1e-12)
    np.testing.assert_allclose(toy.toy_errors(p, toy.fedavg_model(p)), [1 / 3, 2 / 3], atol=1e-12)


def test_toy_problem_generation():
    """App. E draws: theta, x and public points in [-10, 10]; sigma_i is the standard deviation of zeta_i
    (checked on 4000 coordinates with sigmas 2 and 5); y = X w + z with the given noise."""
    p = toy.toy_problem(seed=1, n=50, noise=0.0, sigmas=(2.0, 5.0) * 1000, d=2, n_public=30)
    zeta = p.true_models - p.theta
    assert np.std(zeta[0::2]) == pytest.approx(2.0, rel=0.05)
    assert np.std(zeta[1::2]) == pytest.approx(5.0, rel=0.05)
    assert np.all(np.abs(p.theta) <= 10) and np.all(np.abs(np.vstack(p.X)) <= 10) and np.all(np.abs(p.P) <= 10)
    assert p.P.shape == (30, 2) and all(X.shape == (50, 2) for X in p.X)
    np.testing.assert_allclose(p.y[3], p.X[3] @ p.true_models[3], atol=1e-12)
    q = toy.toy_problem(seed=1)
    np.testing.assert_array_equal(q.theta, toy.toy_problem(seed=1).theta)
    assert not np.array_equal(q.theta, toy.toy_problem(seed=2).theta)


def test_alphas_by_hand():
    """Two close clients and one far one: c = 2 -> {0, 1}, {2}; c = 1 -> uniform; c = 3 -> identity."""
    models = np.array([[0.0, 0.0], [0.5, 0.0], [10.0, 10.0]])
    np.testing.assert_allclose(toy.alpha_uniform(3), np.full((3, 3), 1 / 3))
    expected = [[0.5, 0.5, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 1.0]]
    np.testing.assert_allclose(toy.alpha_clustered(models, c=2), expected)
    P = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    np.testing.assert_allclose(toy.alpha_clustered(models, c=2, public=P), expected)
    np.testing.assert_allclose(toy.alpha_clustered(models, c=1), np.full((3, 3), 1 / 3))
    np.testing.assert_allclose(toy.alpha_clustered(models, c=3), np.eye(3))
    # the far client listed first: same partition
    np.testing.assert_allclose(toy.alpha_clustered(models[[2, 0, 1]], c=2), [[1, 0, 0], [0, .5, .5], [0, .5, .5]])
    with pytest.raises(ValueError):
        toy.alpha_clustered(models, c=4)


def test_toy_experiment_fig1_claim():
    """Paper settings (sigmas 2, 5, 200; lam = 50), n = 200, noise 1, 20 seeds. Fig. 1: "PERFED-CKT with
    clustering yields the model closest to the true model for all clients" (among FedAvg, KT w/o and KT
    with clustering). Observed means: local (0.016, 0.014, 0.012), FedAvg (73.8, 70.3, 142.6),
    KT uniform (15.0, 14.0, 28.7), KT clustered (0.74, 0.74, 0.012).
    - clients 0, 1: clustered < uniform < FedAvg, in every seed: the claim holds;
    - client 2: c-means always isolates it (sigma = 200), so its teacher is its own local model and KT
      with clustering returns w_hat_2 exactly: the claim holds, trivially (error = local error);
    - not in Fig. 1: the purely local model beats KT with clustering for clients 0 and 1 (0.016 vs 0.74):
      with n = 200 points and unit noise local least squares is already almost exact, and distilling from
      the other cluster member (true models differ by ~5) only adds bias."""
    r = toy.toy_experiment(range(20))
    ps = r["per_seed"]
    assert r["seeds"] == tuple(range(20)) and ps["kt_clustered"].shape == (20, 3)
    for k in (0, 1):
        assert r["kt_clustered"][k] < r["kt_uniform"][k] < r["fedavg"][k]
        assert np.all(ps["kt_clustered"][:, k] < ps["kt_uniform"][:, k])
        assert r["local"][k] < 0.05 < 0.3 < r["kt_clustered"][k] < 2.0 < 5.0 < r["kt_uniform"][k]
    np.testing.assert_allclose(ps["kt_clustered"][:, 2], ps["local"][:, 2], rtol=1e-9, atol=1e-12)
    assert r["kt_clustered"][2] < r["kt_uniform"][2] < r["fedavg"][2]
    for s in (0, 7):
        np.testing.assert_allclose(toy.alpha_clustered(toy.toy_problem(seed=s)),
                                   [[.5, .5, 0], [.5, .5, 0], [0, 0, 1]])


def test_plot_toy_smoke():
    """Four panels like Fig. 1, each with the points drawn."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p = toy.toy_problem(seed=0)
    fig = toy.plot_toy(p, toy.toy_models(p))
    assert len(fig.axes) == 4
    assert fig.axes[0].get_title().startswith("(a)") and fig.axes[3].get_title() == "(d) client 2"
    assert all(len(a.collections) >= 3 for a in fig.axes[1:])
    plt.close(fig)


# ----------------------------------------------------------------------------- Theorem 4.2

SIMPLE = dict(k=0, sigma2=1.0, beta=1.0, nu=1.0, v=np.array([1.0, 2.0, 3.0]))


def test_theorem42_closed_forms_by_hand():
    """sigma^2 = beta = nu = 1, v = (1, 2, 3), k = 0: sigma^2 + beta v^2 = (2, 5, 10), A_0 = 10/3.
    Paper as printed: lambda = 1, B = (10/3) 2 / (1 + 10/3) = 20/13, alpha = (10, 4, 2)/13, sum 16/13.
    Corrected (A + beta v^2): B = 5/4, alpha = (5/8, 1/4, 1/8), sum 1, lambda = 1.
    Derived with alpha_00 = 0: a = 13/16, c = 3/16, lambda = 3/13, alpha = (0, 2/3, 1/3)."""
    lam, a = toy.theorem42_optimum(**SIMPLE, form="paper")
    assert lam == pytest.approx(1.0) and a == pytest.approx(np.array([10, 4, 2]) / 13, abs=1e-12)
    lam, a = toy.theorem42_optimum(**SIMPLE, form="paper_corrected")
    assert lam == pytest.approx(1.0) and a == pytest.approx([5 / 8, 1 / 4, 1 / 8], abs=1e-12)
    lam, a = toy.theorem42_optimum(**SIMPLE, form="derived")
    assert lam == pytest.approx(3 / 13, abs=1e-12) and a == pytest.approx([0, 2 / 3, 1 / 3], abs=1e-12)


def test_theorem42_paper_as_printed_is_not_optimal():
    """With w_hat_i = e_i the estimator / Bayes mean ARE the coefficient vectors on (w_hat_0, w_hat_1, w_hat_2).
    Bayes mean, eqs. 6-12: (13/16, 1/8, 1/16) = (0.8125, 0.125, 0.0625). The printed eq. 45,
    1/(1 + sigma^2/beta v_0^2) = 1/2 on w_hat_0 plus A sigma^2/(sigma^2 + A beta v_0^2) = 10/13 times
    (1/2, 1/5, 1/10), gives (23/26, 2/13, 1/13) = (0.8846, 0.1538, 0.0769), summing to 29/26: eq. 45 is
    wrong. Eq. 16 as printed matches eq. 44 to that wrong eq. 45 exactly (the matching step is right), so
    its excess ||w_tilde - E w||^2 = 0.00624 > 0. With A + beta v^2 in place of A beta v^2 (corrected B_k)
    the Bayes mean is reproduced exactly. The theorem's qualitative claim (alpha_ki proportional to
    1/(sigma^2 + beta v_i^2) over i != k) holds for the printed form too."""
    W = np.eye(3)
    bayes = toy.theorem42_bayes_mean(SIMPLE["k"], SIMPLE["sigma2"], SIMPLE["beta"], SIMPLE["v"], W)
    np.testing.assert_allclose(bayes, [13 / 16, 1 / 8, 1 / 16], atol=1e-12)
    lam, a = toy.theorem42_optimum(**SIMPLE, form="paper")
    est = toy.theorem42_estimator(0, lam, a, 1.0, 1.0, W)
    np.testing.assert_allclose(est, [23 / 26, 2 / 13, 1 / 13], atol=1e-12)
    excess = toy.theorem42_excess(0, lam, a, 1.0, 1.0, 1.0, SIMPLE["v"], W)
    assert excess == pytest.approx(np.sum((est - bayes) ** 2)) and excess == pytest.approx(0.006241, abs=1e-5)
    A = 10 / 3
    eq45 = np.array([0.5, 0, 0]) + A / (1 + A) * np.array([1 / 2, 1 / 5, 1 / 10])
    np.testing.assert_allclose(eq45, est, atol=1e-12)
    assert np.max(np.abs(eq45 - bayes)) > 0.07 and eq45.sum() == pytest.approx(29 / 26)
    lam_c, a_c = toy.theorem42_optimum(**SIMPLE, form="paper_corrected")
    assert toy.theorem42_excess(0, lam_c, a_c, 1.0, 1.0, 1.0, SIMPLE["v"], W) < 1e-25
    _, a_d = toy.theorem42_optimum(**SIMPLE, form="derived")
    np.testing.assert_allclose(a[1:] / a[1:].sum(), a_d[1:], atol=1e-12)


def _instances():
    rng = np.random.default_rng(2024)
    for j in range(3):
        K, d = 4, 6
        yield dict(k=j, sigma2=rng.uniform(0.3, 3.0), beta=rng.uniform(0.5, 5.0), nu=rng.uniform(0.5, 5.0),
                   v=rng.uniform(0.2, 3.0, K)), rng.normal(0.0, 3.0, (K, d))


@pytest.mark.parametrize("inst", range(3))
def test_theorem42_numeric_matches_closed_forms(inst):
    """The generic numerical minimiser of eq. 49 (alpha_kk held fixed) finds zero excess and agrees with
    (i) our derived closed form at alpha_kk = 0 and (ii) the CORRECTED eq. 16 when alpha_kk is held at that
    form's alpha_kk = A_k/(sigma^2 + A_k + beta v_k^2): lambda* = sigma^2/(v_k^2 nu) is then optimal.
    The printed eq. 16 has positive excess (8.5e-5, 8.8e-4, 0.74 on these instances, against < 1e-20 at
    the optimum) and its alphas sum to 0.98, 0.73, 2.50 (the corrected and derived forms sum to 1)."""
    kw, W = list(_instances())[inst]
    lam_n, a_n, ex = toy.theorem42_numeric(**kw, w_hats=W)
    lam_d, a_d = toy.theorem42_optimum(**kw, form="derived")
    assert ex < 1e-20
    assert lam_n == pytest.approx(lam_d, rel=1e-6) and np.max(np.abs(a_n - a_d)) < 1e-6
    lam_c, a_c = toy.theorem42_optimum(**kw, form="paper_corrected")
    lam_n2, a_n2, ex2 = toy.theorem42_numeric(**kw, w_hats=W, alpha_self=a_c[kw["k"]])
    assert ex2 < 1e-20 and lam_n2 == pytest.approx(kw["sigma2"] / (kw["v"][kw["k"]] ** 2 * kw["nu"]), rel=1e-6)
    assert np.max(np.abs(a_n2 - a_c)) < 1e-6
    lam_p, a_p = toy.theorem42_optimum(**kw, form="paper")
    assert toy.theorem42_excess(kw["k"], lam_p, a_p, kw["sigma2"], kw["beta"], kw["nu"], kw["v"], W) > 1e-6
    assert abs(a_p.sum() - 1.0) > 1e-3


def test_theorem42_family_sum_to_one_and_ordering():
    """The optimum is a one-parameter family (alpha_kk free): every alpha_kk < a gives zero excess with a
    different lambda; every member has sum_i alpha_ki = 1, so enforcing eq. 1's constraint changes
    nothing; alpha*_ki decreases with v_i over i != k (the theorem's claim) for all three forms."""
    kw, W = next(_instances())
    lams = []
    for t in (-0.2, 0.0, 0.3):
        lam, a, ex = toy.theorem42_numeric(**kw, w_hats=W, alpha_self=t)
        assert ex < 1e-20 and a.sum() == pytest.approx(1.0, abs=1e-9)
        lams.append(lam)
    assert lams[0] < lams[1] < lams[2]
    lam1, a1, _ = toy.theorem42_numeric(**kw, w_hats=W, sum_to_one=True)
    assert lam1 == pytest.approx(lams[1], rel=1e-6)
    np.testing.assert_allclose(a1, toy.theorem42_optimum(**kw, form="derived")[1], atol=1e-6)
    others = [i for i in range(4) if i != kw["k"]]
    order = np.argsort(kw["v"][others])
    for form in toy.THEOREM42_FORMS:
        a = toy.theorem42_optimum(**kw, form=form)[1][others]
        assert np.all(np.diff(a[order]) < 0)
    with pytest.raises(ValueError):
        toy.theorem42_optimum(**kw, form="derived", alpha_self=0.999)
