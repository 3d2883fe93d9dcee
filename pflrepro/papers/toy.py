"""PERFED-CKT (Cho et al.) linear-regression toy example (Fig. 1) and a numerical check of Theorem 4.2.

Toy (Sec. 3 "Regularization Term", App. E): three clients, true models w_i = theta + zeta_i in R^2,
FedAvg vs. per-client knowledge transfer (KT, eq. 1) "w/o clustering" (alpha_{k,i} = 1/K) and "with
clustering". Everything is closed-form least squares (numpy only).

Choices the paper leaves open (no public code exists; App. E says the code is "in the supplementary
material", which we do not have):
- N(0, sigma_i) in App. E is read with sigma_i as the STANDARD DEVIATION (sigmas 2, 5, 200);
- dataset size n (default 200), label noise z ~ N(0, noise^2) (default noise 1) and the number of
  public points (default 100, drawn U(-10, 10)^d: "the public data range as identical to the input
  data range") are not given;
- the data term is the sum of squares ||X_k w - y_k||^2 (Sec. 4, eq. 13), the distillation term keeps
  eq. 1's lambda/|P| average over public points; with eq. 1's mean data loss F_k = 1/n sum, the same
  minimiser is obtained with lambda/n in place of lambda;
- the teachers are the clients' local least-squares models w_hat_i (the analysis, eqs. 13-14:
  "s_bar_k = sum_i alpha_{k,i} s(w_hat_i)"), i.e. one distillation step, not the iterated algorithm;
  alpha includes the client itself (eq. 1 sums over all i in [K]);
- "KT with clustering": a deterministic Lloyd's c-means (farthest-point initialisation, c = 2) of the
  local models' public outputs P w_hat_i (Sec. 3, eq. 4: the client takes its own cluster's centroid,
  i.e. alpha_{k,i} = 1/|cluster(k)| within the cluster); App. E only says "clients with similar true
  local models have higher weights for each other";
- FedAvg is represented by its fixed point for linear regression (pooled least squares).
Observed (tests/test_perfed_toy.py, 20 seeds, n = 200, noise 1): the Fig. 1 ordering holds (clustered <
uniform < FedAvg for every client; client 2 is a singleton cluster, so its KT model is its local one),
but the purely local model, not drawn in Fig. 1, beats KT with clustering for clients 0 and 1.

Theorem 4.2 (eq. 16, App. B eqs. 44-51). Findings, checked by `theorem42_numeric` (tests/test_perfed_toy.py):
- the optimum of eq. 15/49 is NOT unique: w_tilde (eq. 44) depends on (lambda, alpha) only through
  the coefficients (1-c) + c alpha_kk on w_hat_k and c alpha_ki on w_hat_i (c = lam nu/(beta + lam nu)),
  K equations for K+1 unknowns: a one-parameter family indexed by alpha_kk, all with sum_i alpha_ki = 1;
- the Bayes mean printed as eq. 45 (and so B_k in eq. 16/51) has "A_k beta v_k^2" where eqs. 6-12 give
  "A_k + beta v_k^2" (the printed term is also dimensionally inconsistent with sigma^2). With that
  correction eq. 16 is an exact optimum (lambda* = sigma^2/(v_k^2 nu), the family member with
  alpha_kk = A_k/(sigma^2 + A_k + beta v_k^2)) and sum_i alpha*_ki = 1; as printed it is not optimal
  and its alphas do not sum to 1. The qualitative claim (alpha*_ki proportional to 1/(sigma^2 + beta
  v_i^2) across i != k, i.e. decreasing in v_i) holds for every member of the family.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

METHODS = ("local", "fedavg", "kt_uniform", "kt_clustered")
THEOREM42_FORMS = ("paper", "paper_corrected", "derived")


@dataclass(frozen=True)
class ToyProblem:
    """One draw of the App. E toy: theta (d,), true models (K, d), per-client X (n, d) and y (n,), public P."""
    theta: np.ndarray
    true_models: np.ndarray
    X: list
    y: list
    P: np.ndarray
    seed: int
    sigmas: tuple
    noise: float


def toy_problem(seed=0, n=200, noise=1.0, sigmas=(2.0, 5.0, 200.0), d=2, n_public=100) -> ToyProblem:
    """App. E: "w_i = theta + zeta_i ... theta ... elements are uniformly distributed U(-10, 10) and the
    elements of zeta_i follows the normal distribution N(0, sigma_i), sigma_1 = 2, sigma_2 = 5,
    sigma_3 = 200" (sigma_i taken as the standard deviation); "The range for x is [-10, 10] for all
    elements"; "all clients have identical dataset size"; "the public data range as identical to the
    input data range". Labels y = X w_i + z (Sec. 4), z ~ N(0, noise^2) (noise not given by the paper).
    Draw order with default_rng(seed): theta, zeta_0..zeta_{K-1}, then per client X_i and z_i, then P."""
    rng = np.random.default_rng(seed)
    theta = rng.uniform(-10.0, 10.0, d)
    true = np.stack([theta + rng.normal(0.0, s, d) for s in sigmas])
    X, y = [], []
    for w in true:
        Xi = rng.uniform(-10.0, 10.0, (n, d))
        X.append(Xi)
        y.append(Xi @ w + rng.normal(0.0, noise, n))
    P = rng.uniform(-10.0, 10.0, (n_public, d))
    return ToyProblem(theta, true, X, y, P, seed, tuple(float(s) for s in sigmas), float(noise))


def local_models(problem: ToyProblem) -> np.ndarray:
    """w_hat_k = (X_k^T X_k)^{-1} X_k^T y_k (Sec. 4), one row per client: "locally training in isolation"."""
    return np.stack([np.linalg.solve(X.T @ X, X.T @ y) for X, y in zip(problem.X, problem.y)])


def fedavg_model(problem: ToyProblem) -> np.ndarray:
    """The global model: argmin_w sum_k p_k F_k(w) (Sec. 3, "F(w) = sum_k p_k F_k(w)") with equal p_k
    ("identical dataset size"), i.e. least squares on the pooled data. This is FedAvg's fixed point for
    linear regression (exact with one local step or a vanishing learning rate; the paper gives no FedAvg
    hyper-parameters for the toy)."""
    X, y = np.vstack(problem.X), np.concatenate(problem.y)
    return np.linalg.solve(X.T @ X, X.T @ y)


def kt_models(problem: ToyProblem, alpha, lam=50.0) -> np.ndarray:
    """Per client k: argmin_w ||X_k w - y_k||^2 + lam/|P| sum_{x in P} (s_bar_k(x) - x^T w)^2 (eq. 1's
    regularisation term with eq. 13's sum-of-squares data term), s_bar_k(x) = sum_i alpha_{k,i} x^T w_hat_i
    ("we set s_bar_k = sum_i alpha_{k,i} s(w_hat_i)", eq. 13). Closed form (eq. 14 with many public
    points): (X^T X + lam/|P| P^T P)^{-1} (X^T y + lam/|P| P^T P sum_i alpha_{k,i} w_hat_i).
    lam is eq. 1's lambda (scaled by 1/|P|); eq. 13's lambda_k for one public point is lam/|P| here."""
    alpha = np.asarray(alpha, dtype=float)
    w_hat = local_models(problem)
    G = (lam / len(problem.P)) * problem.P.T @ problem.P
    out = []
    for k, (X, y) in enumerate(zip(problem.X, problem.y)):
        out.append(np.linalg.solve(X.T @ X + G, X.T @ y + G @ (alpha[k] @ w_hat)))
    return np.stack(out)


def alpha_uniform(K: int) -> np.ndarray:
    """KT w/o clustering: "alpha_{k,i} = 1/K" (Sec. 3), "a simple average of all the logits" (App. E)."""
    return np.full((K, K), 1.0 / K)


def kmeans(points, c: int, max_iter: int = 100) -> np.ndarray:
    """Deterministic Lloyd's c-means ("c-means clustering (also known conventionally as the k-means
    clustering algorithm)", Sec. 3). Initialisation (not specified): farthest-point, first centre the
    point farthest from the overall mean, then repeatedly the point farthest from the chosen centres
    (ties: lowest index). Returns the cluster label of each row; an emptied cluster keeps its centre."""
    pts = np.asarray(points, dtype=float).reshape(len(points), -1)
    if not 1 <= c <= len(pts):
        raise ValueError(f"c={c} must be in [1, {len(pts)}]")
    idx = [int(np.argmax(((pts - pts.mean(0)) ** 2).sum(1)))]
    while len(idx) < c:
        dist = np.min([((pts - pts[i]) ** 2).sum(1) for i in idx], axis=0)
        idx.append(int(np.argmax(dist)))
    centres, labels = pts[idx].copy(), None
    for _ in range(max_iter):
        new = np.argmin(((pts[:, None, :] - centres[None]) ** 2).sum(-1), axis=1)
        if labels is not None and np.array_equal(new, labels):
            break
        labels = new
        for j in range(c):
            if np.any(labels == j):
                centres[j] = pts[labels == j].mean(0)
    return labels


def alpha_clustered(problem_or_models, c: int = 2, public=None) -> np.ndarray:
    """KT with clustering: "clients with similar true local models have higher weights for each other"
    (App. E) and the server clusters "the logits by the l2-norm distance" (Sec. 3). We c-means the public
    outputs s_i = P w_hat_i of the local models (a ToyProblem: its local models and P; an array of models:
    those, with `public` as P, or the parameters themselves when public is None) and set
    alpha_{k,i} = 1/|cluster(k)| for i in k's cluster, else 0 (eq. 4: the client uses its centroid)."""
    if isinstance(problem_or_models, ToyProblem):
        models, public = local_models(problem_or_models), problem_or_models.P
    else:
        models = np.asarray(problem_or_models, dtype=float)
    outputs = models if public is None else models @ np.asarray(public, dtype=float).T
    labels = kmeans(outputs, c)
    same = (labels[:, None] == labels[None, :]).astype(float)
    return same / same.sum(1, keepdims=True)


def toy_errors(problem: ToyProblem, models) -> np.ndarray:
    """Per-client ||w_k - w_k^true||_2; a single (d,) model (FedAvg's global one) is used by every client."""
    models = np.broadcast_to(np.asarray(models, dtype=float), problem.true_models.shape)
    return np.linalg.norm(models - problem.true_models, axis=1)


def toy_models(problem: ToyProblem, lam=50.0, c=2) -> dict:
    """The four methods' models, (K, d) each: local, FedAvg (global, broadcast), KT w/o and with clustering."""
    K = len(problem.true_models)
    return {"local": local_models(problem),
            "fedavg": np.tile(fedavg_model(problem), (K, 1)),
            "kt_uniform": kt_models(problem, alpha_uniform(K), lam),
            "kt_clustered": kt_models(problem, alpha_clustered(problem, c), lam)}


def toy_experiment(seeds=range(10), lam=50.0, c=2, **kw) -> dict:
    """Mean per-client error over seeds for METHODS, beside the Fig. 1 claim "PERFED-CKT with clustering
    yields the model closest to the true model for all clients". `kw` goes to `toy_problem`.
    Returns {method: (K,) mean error, ..., 'per_seed': {method: (S, K)}, 'seeds': tuple}."""
    seeds = tuple(int(s) for s in seeds)
    per = {m: [] for m in METHODS}
    for s in seeds:
        prob = toy_problem(seed=s, **kw)
        for m, w in toy_models(prob, lam, c).items():
            per[m].append(toy_errors(prob, w))
    out = {m: np.mean(per[m], axis=0) for m in METHODS}
    out["per_seed"] = {m: np.asarray(per[m]) for m in METHODS}
    out["seeds"] = seeds
    return out


def plot_toy(problem: ToyProblem, models_by_method: dict, ax=None):
    """Fig. 1 layout: (a) the true models and FedAvg's global model; (b)-(d) client 0, 1, 2: its true
    model, KT w/o clustering and KT with clustering (each a point in R^2). `models_by_method` as returned
    by `toy_models`; `ax`: four axes or None (a new 1x4 figure). Returns the figure."""
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(1, 4, figsize=(16, 4))
    ax = list(np.ravel(ax))
    fig = ax[0].figure
    true = problem.true_models
    ax[0].scatter(true[:, 0], true[:, 1], marker="*", s=150, label="true models")
    for k, w in enumerate(true):
        ax[0].annotate(str(k), w[:2])
    g = np.asarray(models_by_method["fedavg"]).reshape(-1, true.shape[1])[0]
    ax[0].scatter([g[0]], [g[1]], marker="x", s=100, label="FedAvg")
    ax[0].set_title("(a) FedAvg")
    for k, a in enumerate(ax[1:len(true) + 1]):
        a.scatter([true[k, 0]], [true[k, 1]], marker="*", s=150, label=f"true model {k}")
        for m, mk, lab in (("kt_uniform", "s", "KT w/o clustering"), ("kt_clustered", "o", "KT with clustering")):
            w = np.asarray(models_by_method[m])[k]
            a.scatter([w[0]], [w[1]], marker=mk, facecolors="none", s=90, label=lab)
        a.set_title(f"({'bcd'[k] if k < 3 else k}) client {k}")
    for a in ax:
        a.legend(fontsize=7)
        a.set_xlabel("w[0]")
        a.set_ylabel("w[1]")
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------- Theorem 4.2

def theorem42_bayes_mean(k, sigma2, beta, v, w_hats) -> np.ndarray:
    """E[w_k | all data] from eqs. 6-12 in matrix form with X_i^T X_i = beta I (the theorem's assumption):
    Sigma_i = sigma^2 (X^T X)^{-1} + v_i^2 I (6), Sigma_bar_{\\k} (7), theta_bar_{\\k} (8),
    Sigma_tilde_k (10), Sigma_bar_k (11), and the mean part of (12). Independent of the scalar algebra."""
    w_hats = np.asarray(w_hats, dtype=float)
    K, d = w_hats.shape
    I = np.eye(d)
    noise = sigma2 * np.linalg.inv(beta * I)
    inv = [np.linalg.inv(noise + v[i] ** 2 * I) for i in range(K)]
    others = [i for i in range(K) if i != k]
    S_bar = np.linalg.inv(sum(inv[i] for i in others))
    theta_bar = S_bar @ sum(inv[i] @ w_hats[i] for i in others)
    S_tilde = S_bar + v[k] ** 2 * I
    S_k = np.linalg.inv(np.linalg.inv(S_tilde) + np.linalg.inv(noise))
    return S_k @ np.linalg.inv(noise) @ w_hats[k] + S_k @ np.linalg.inv(S_tilde) @ theta_bar


def theorem42_estimator(k, lam, alpha, beta, nu, w_hats) -> np.ndarray:
    """w_tilde_k of eq. 14 with X_k^T X_k = beta I and P^T P = nu I:
    (beta I + lam nu I)^{-1} (beta w_hat_k + lam nu sum_i alpha_{k,i} w_hat_i) (= eq. 44)."""
    w_hats = np.asarray(w_hats, dtype=float)
    d = w_hats.shape[1]
    M = (beta + lam * nu) * np.eye(d)
    return np.linalg.solve(M, beta * w_hats[k] + lam * nu * (np.asarray(alpha, dtype=float) @ w_hats))


def theorem42_excess(k, lam, alpha, sigma2, beta, nu, v, w_hats) -> float:
    """E||w_tilde_k - w_k||^2 - tr(Sigma_bar_k) = ||w_tilde_k - E[w_k | data]||^2 (eq. 49 minus the
    part "varsigma_k" that depends on neither lambda nor alpha); 0 at an optimum."""
    diff = theorem42_estimator(k, lam, alpha, beta, nu, w_hats) - theorem42_bayes_mean(k, sigma2, beta, v, w_hats)
    return float(diff @ diff)


def theorem42_optimum(k, sigma2, beta, nu, v, form="paper", alpha_self=0.0):
    """(lambda*_k, alpha*_{k,.}) in closed form; A_k = (sum_{i != k} 1/(sigma^2 + beta v_i^2))^{-1}.
    form='paper': eq. 16 as printed, "lambda*_k = sigma^2/v_k^2 nu, alpha*_{k,i} = B_k/(sigma^2 + beta v_i^2)",
      "B_k = A_k (sigma^2 + beta v_k^2)/(sigma^2 + A_k beta v_k^2)", for every i in [K] (k included);
    form='paper_corrected': the same with A_k + beta v_k^2 in B_k's denominator (what eqs. 6-12 give);
      an exact optimum with sum_i alpha_ki = 1;
    form='derived': matching eq. 44 to the Bayes mean a w_hat_k + (1-a) theta_bar_{\\k},
      a = (A_k + beta v_k^2)/(sigma^2 + A_k + beta v_k^2), for a chosen alpha_kk = alpha_self < a:
      c = (1-a)/(1-alpha_self), lambda = beta c/(nu (1-c)), alpha_ki = (1-alpha_self) A_k/(sigma^2 + beta v_i^2)."""
    v = np.asarray(v, dtype=float)
    K = len(v)
    var = sigma2 + beta * v ** 2
    A = 1.0 / sum(1.0 / var[i] for i in range(K) if i != k)
    if form in ("paper", "paper_corrected"):
        denom = sigma2 + (A * beta * v[k] ** 2 if form == "paper" else A + beta * v[k] ** 2)
        B = A * var[k] / denom
        return sigma2 / (v[k] ** 2 * nu), B / var
    if form != "derived":
        raise ValueError(f"form={form!r}: allowed {THEOREM42_FORMS}")
    a = (A + beta * v[k] ** 2) / (sigma2 + A + beta * v[k] ** 2)
    if not alpha_self < a:
        raise ValueError(f"alpha_self={alpha_self} must be < {a} (lambda >= 0)")
    c = (1.0 - a) / (1.0 - alpha_self)
    alpha = (1.0 - alpha_self) * A / var
    alpha[k] = alpha_self
    return beta * c / (nu * (1.0 - c)), alpha


def _best_alpha(k, lam, alpha_self, beta, nu, w_hats, target, sum_to_one):
    """For fixed lambda, eq. 14 is affine in alpha: least squares for alpha_{k,i != k} (alpha_kk fixed);
    with sum_to_one the last free alpha is eliminated as 1 - alpha_self - sum of the others."""
    K = len(w_hats)
    free = [i for i in range(K) if i != k]
    base = np.zeros(K)
    base[k] = alpha_self
    if sum_to_one:
        base[free[-1]] = 1.0 - alpha_self
    w0 = theorem42_estimator(k, lam, base, beta, nu, w_hats)
    cols, dirs = [], []
    for i in free[:-1] if sum_to_one else free:
        e = np.zeros(K)
        e[i] = 1.0
        if sum_to_one:
            e[free[-1]] = -1.0
        dirs.append(e)
        cols.append(theorem42_estimator(k, lam, base + e, beta, nu, w_hats) - w0)
    coef = np.linalg.lstsq(np.stack(cols, 1), target - w0, rcond=None)[0] if cols else np.zeros(0)
    alpha = base + (np.stack(dirs).T @ coef if cols else 0.0)
    return alpha, float(np.linalg.norm(theorem42_estimator(k, lam, alpha, beta, nu, w_hats) - target))


def theorem42_numeric(k, sigma2, beta, nu, v, w_hats, alpha_self=0.0, sum_to_one=False, tol=1e-13, n_grid=161):
    """Numerically minimise eq. 49, E[||w_tilde_k - w_k||^2 | w_hat_k, theta_bar_{\\k}], i.e. the
    distance between eq. 14's minimiser and the eq. 6-12 Bayes mean, over lambda_k and alpha_{k,i != k}
    with alpha_kk = alpha_self held fixed (the optimum is a one-parameter family in alpha_kk; see the
    module docstring). Inner: linear least squares in alpha; outer: a log-lambda grid, then golden
    section on the profiled distance. sum_to_one enforces eq. 1's sum_i alpha_ki = 1 (Theorem 4.2
    does not state it). Needs d >= K for the alphas to be identified (w_hats linearly independent).
    Returns (lambda, alpha (K,), excess = squared distance)."""
    w_hats = np.asarray(w_hats, dtype=float)
    target = theorem42_bayes_mean(k, sigma2, beta, v, w_hats)

    def f(loglam):
        return _best_alpha(k, np.exp(loglam), alpha_self, beta, nu, w_hats, target, sum_to_one)[1]

    grid = np.log(beta / nu) + np.linspace(np.log(1e-8), np.log(1e8), n_grid)
    j = int(np.argmin([f(x) for x in grid]))
    lo, hi = grid[max(j - 1, 0)], grid[min(j + 1, len(grid) - 1)]
    g = (np.sqrt(5.0) - 1.0) / 2.0
    x1, x2 = hi - g * (hi - lo), lo + g * (hi - lo)
    f1, f2 = f(x1), f(x2)
    while hi - lo > tol:
        if f1 <= f2:
            hi, x2, f2 = x2, x1, f1
            x1 = hi - g * (hi - lo)
            f1 = f(x1)
        else:
            lo, x1, f1 = x1, x2, f2
            x2 = lo + g * (hi - lo)
            f2 = f(x2)
    lam = float(np.exp((lo + hi) / 2.0))
    alpha, dist = _best_alpha(k, lam, alpha_self, beta, nu, w_hats, target, sum_to_one)
    return lam, alpha, dist ** 2
