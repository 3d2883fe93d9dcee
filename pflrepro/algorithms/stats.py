"""Class-wise feature statistics shared by DC-PFL, FedGH and FedProto: small pure functions.

Representations z = f_theta(x) are the body's output (`SplitModel.features`). A client's statistics
message holds only the classes it has: `classes` (m,), `counts` (m,), `means` (m, d) and, for DC-PFL,
`covs` (m, d, d). Equations are DC-PFL's (Tang et al., IJCAI 2024).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..core.training import EVAL_ROWS, ce_loss


@torch.no_grad()
def features(net: nn.Module, x: torch.Tensor, batch: int = EVAL_ROWS) -> torch.Tensor:
    """f_theta(x) for a whole client dataset, in eval mode (no dropout)."""
    net.eval()
    return torch.cat([net.features(x[i:i + batch]) for i in range(0, len(x), batch)])


def class_stats(z: torch.Tensor, y: torch.Tensor, cov: bool = True) -> dict:
    """Eq. (6) mean and eq. (7) unbiased covariance (1/(n-1)) of every class present in y.

    A class with a single sample has no unbiased covariance: its `covs` entry is the zero matrix.
    This is harmless for pooling, where eq. (11) weighs the local covariance by (n - 1) = 0.
    Computed in float64, returned in z's dtype (what is uploaded)."""
    classes, counts = torch.unique(y, sorted=True, return_counts=True)
    z64 = z.double()
    means, covs = [], []
    for c, n in zip(classes.tolist(), counts.tolist()):
        zc = z64[y == c]
        mu = zc.mean(0)
        means.append(mu)
        if cov:
            dev = zc - mu
            covs.append(dev.T @ dev / (n - 1) if n >= 2 else torch.zeros(z.shape[1], z.shape[1], dtype=z64.dtype,
                                                                           device=z.device))
    d = z.shape[1]
    out = {"classes": classes, "counts": counts,
           "means": torch.stack(means).to(z.dtype) if means else z.new_zeros(0, d)}
    if cov:
        out["covs"] = torch.stack(covs).to(z.dtype) if covs else z.new_zeros(0, d, d)
    return out


def pool_means(stats: list[dict], num_classes: int, weighted: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. (10): mu_c = sum_k |D_k^c| mu_{c,k} / sum_k |D_k^c| over the messages that hold class c.
    `weighted=False`: plain mean over those messages (FedProto's public code). Returns (|D^c| (C,),
    mu (C, d)) in float64; classes nobody holds have count 0 and a zero mean."""
    d = stats[0]["means"].shape[1]
    dev = stats[0]["means"].device
    n = torch.zeros(num_classes, dtype=torch.float64, device=dev)
    w = torch.zeros(num_classes, dtype=torch.float64, device=dev)
    s = torch.zeros(num_classes, d, dtype=torch.float64, device=dev)
    for m in stats:
        c, cnt = m["classes"], m["counts"].double()
        wt = cnt if weighted else torch.ones_like(cnt)
        n.index_add_(0, c, cnt)
        w.index_add_(0, c, wt)
        s.index_add_(0, c, wt[:, None] * m["means"].double())
    return n, s / w.clamp_min(1e-300)[:, None]


def pool_class(counts: torch.Tensor, means: torch.Tensor, covs: torch.Tensor) -> tuple[float, torch.Tensor, torch.Tensor]:
    """Eq. (10)-(11) for one class from K clients' (|D_k^c|, mu_{c,k}, Sigma_{c,k}):
    Sigma_c = sum_k (n_k - 1)/(N - 1) Sigma_k + sum_k n_k/(N - 1) mu_k mu_k^T - N/(N - 1) mu_c mu_c^T,
    i.e. exactly the unbiased covariance of the concatenated features. With N < 2 it is undefined:
    we return the zero matrix (the sampler's regulariser then draws near mu_c)."""
    n = counts.double()
    mu_k = means.double()
    big_n = float(n.sum())
    mu = (n[:, None] * mu_k).sum(0) / big_n
    if big_n < 2:
        return big_n, mu, torch.zeros(mu.shape[0], mu.shape[0], dtype=torch.float64, device=mu.device)
    scatter = ((n - 1)[:, None, None] * covs.double()).sum(0) + torch.einsum("k,ki,kj->ij", n, mu_k, mu_k) \
        - big_n * torch.outer(mu, mu)
    return big_n, mu, scatter / (big_n - 1)


def virtual_counts(class_counts: torch.Tensor, total: int) -> torch.Tensor:
    """|G_c| proportional to |D^c| / sum_c' |D^c'| with sum_c |G_c| = total exactly (largest remainder:
    floor of the quotas, the leftover one each to the largest fractional parts, ties to the lower class)."""
    n = class_counts.double().cpu()
    if float(n.sum()) <= 0:
        return torch.zeros(len(n), dtype=torch.long)
    quota = total * n / n.sum()
    base = quota.floor().long()
    left = total - int(base.sum())
    frac = quota - base.double()
    order = sorted(range(len(n)), key=lambda c: (-float(frac[c]), c))
    for c in order[:left]:
        base[c] += 1
    return base


def sample_gaussian(mu: torch.Tensor, sigma: torch.Tensor, n: int, gen: torch.Generator,
                    shrink: float = 0.0, jitter: float = 1e-5, tries: int = 8) -> torch.Tensor:
    """n draws from N(mu, Sigma) (float64, CPU, generator `gen`), robust to singular Sigma.

    Sigma (d x d from a few hundred samples, or zero) is symmetrised, shrunk toward its mean variance,
    (1 - shrink) Sigma + shrink * s I with s = tr(Sigma)/d, then eps I is added with eps = jitter * s,
    multiplied by 10 until the Cholesky factorisation succeeds (at most `tries` times). Should it still
    fail, or Sigma be non-finite, the diagonal (clamped at 0) is used. Never raises."""
    mu, sigma = mu.double().cpu(), sigma.double().cpu()
    d = mu.shape[0]
    if not torch.isfinite(sigma).all():
        sigma = torch.zeros(d, d, dtype=torch.float64)
    sigma = (sigma + sigma.T) / 2
    eye = torch.eye(d, dtype=torch.float64)
    s = max(float(sigma.diagonal().mean()), 1e-12)
    sigma = (1 - shrink) * sigma + shrink * s * eye
    eps, chol = jitter * s, None
    for _ in range(tries):
        L, info = torch.linalg.cholesky_ex(sigma + eps * eye)
        if int(info) == 0 and torch.isfinite(L).all():
            chol = L
            break
        eps *= 10
    if chol is None:
        chol = torch.diag(sigma.diagonal().clamp_min(0).add(eps).sqrt())
    return mu + torch.randn(n, d, generator=gen, dtype=torch.float64) @ chol.T


def alignment_loss(z: torch.Tensor, y: torch.Tensor, targets: torch.Tensor, has: torch.Tensor,
                   kind: str = "sq") -> torch.Tensor:
    """Pull each representation toward its class's global target (DC-PFL eq. 3, FedProto's L_R).
    kind `sq`: mean over the batch of ||z - t_y||^2; `l2`: of ||z - t_y|| (unsquared norm);
    `mse`: sum ||z - t_y||^2 / (batch * d), torch's MSELoss as in FedProto's code.
    Samples whose class has no target contribute 0 but still count in the batch (as FedProto's code)."""
    mask = has[y].to(z.dtype)
    sq = ((z - targets[y].to(z.dtype)) ** 2).sum(1) * mask
    if kind == "sq":
        return sq.mean()
    if kind == "mse":
        return sq.sum() / z.numel()
    if kind == "l2":
        return (sq.clamp_min(1e-12).sqrt() * mask).mean()
    raise ValueError(f"alignment kind {kind!r}: use 'sq', 'l2' or 'mse'")



def aligned_ce(lam: float, targets: torch.Tensor, has: torch.Tensor, kind: str):
    """The local loss of DC-PFL (eq. 4, targets = global class means) and FedProto (targets = global
    prototypes): CE(head(f(x)), y) + lam * alignment_loss(f(x), y, targets). Plain CE while no class
    has a target yet (the first round) or when lam = 0."""
    if lam == 0 or not bool(has.any()):
        return ce_loss

    def loss(net, x, y):
        z = net.features(x)
        return F.cross_entropy(net.head(z), y) + lam * alignment_loss(z, y, targets, has, kind)
    return loss


def carry_targets(old: torch.Tensor, has: torch.Tensor, n: torch.Tensor, pooled: torch.Tensor):
    """New per-class targets where a class was seen this round (n > 0), the last ones elsewhere;
    returns (targets, has_target)."""
    seen = n > 0
    return torch.where(seen[:, None], pooled.to(old.dtype), old), has | seen


def targets_bytes(targets: torch.Tensor, has: torch.Tensor) -> int:
    """Bytes of the per-class targets a client downloads (only the classes that have one)."""
    return int(has.sum()) * targets[0].numel() * targets.element_size()

def train_head_on_means(head: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], lr: float,
                        passes: int = 1) -> None:
    """Plain gradient steps on the header, one per (representations, labels) group, in order:
    phi <- phi - lr * grad mean_i CE(g_phi(z_i), y_i). DC-PFL eq. (8)-(9): one group per client
    (the 1/|C_k| mean over its classes); FedGH: one class mean per step."""
    params = list(head.parameters())
    for _ in range(passes):
        for z, y in batches:
            loss = F.cross_entropy(head(z.to(params[0].dtype)), y)
            grads = torch.autograd.grad(loss, params)
            with torch.no_grad():
                for p, g in zip(params, grads):
                    p.sub_(lr * g)
