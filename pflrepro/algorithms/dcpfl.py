"""DC-PFL (Tang et al., IJCAI 2024): dual calibration-based personalised FL, Algorithm 1.

Client k = its heterogeneous feature extractor f_theta_k + the homogeneous global classifier g_phi.
Client, round t: start from (theta_k, phi^t) and minimise eq. (4) by SGD (eq. 5)
    L = 1/|D_k| sum CE(g_phi(f_theta(x)), y)                    (eq. 2, supervised)
      + lambda * 1/|D_k| sum ||f_theta(x) - mu^t_y||^2           (eq. 3, feature-extractor-level calibration)
(round 1, or no global means yet: CE only); then upload, per class it holds, the count, the mean and
the unbiased covariance of its representations (eq. 6-7).
Server: for each client of S^t in turn, one gradient step phi <- phi - eta_phi grad 1/|C_k| sum_c
CE(g_phi(mu_{c,k}), c) (eq. 8-9); pool global means and covariances (eq. 10-11); draw |G_c| virtual
features from N(mu_c, Sigma_c), |G_c| proportional to |D^c| and sum_c |G_c| = n_virtual; fine-tune phi
on them with CE (eq. 12, global-classifier-level calibration); broadcast phi^{t+1} and mu^{t+1}.
Ablations (Table 1): `lam: 0` is "w/o AL", `calibrate: false` is "w/o GC".
A class absent from round t keeps its last global mean; phi^0 is the first client architecture's
initial header. Evaluation and the rest are FedGH's (this class extends it: same split, same client
state {"body", "head"}).
"""
from __future__ import annotations

import torch

from ..core.aggregation import state_bytes
from ..core.seeds import derive_seed
from ..core.training import local_train
from ..params import MAX_EPOCHS, Param
from .fedgh import FedGH
from .stats import (
    aligned_ce,
    carry_targets,
    pool_class,
    pool_means,
    sample_gaussian,
    targets_bytes,
    train_head_on_means,
    virtual_counts,
)


class DCPFL(FedGH):
    name = "dcpfl"
    upload_cov = True
    HPARAMS = {
        "lam": Param(float, 0.01, "lambda of eq. 4 (paper: no value given); 0 = 'w/o AL'", low=0.0),
        "align": Param(str, "sq", "eq. 3 distance: 'sq' ||.||^2 per sample, 'l2' ||.||, 'mse' ||.||^2 / d",
                       choices=("sq", "l2", "mse")),
        "calibrate": Param(bool, True, "global classifier calibration on virtual features; False = 'w/o GC'"),
        "n_virtual": Param(int, 1000, "sum_c |G_c| (Table 3; paper uses 1,000)", low=1, high=10**6),
        "server_lr": Param(float, 0.01, "eta_phi (Sec. 6.1: SGD, lr 0.01 for the global classifier)",
                           low=0.0, low_open=True),
        "server_epochs": Param(int, 1, "epochs of eq. 12 over the virtual features (paper: unstated)", low=0, high=MAX_EPOCHS),
        "server_batch": Param(int, 64, "batch size of eq. 12 (paper: unstated)", low=1),
        "cov_shrink": Param(float, 0.0, "Sigma <- (1-a) Sigma + a tr(Sigma)/d I before sampling", low=0.0, high=1.0),
        "cov_jitter": Param(float, 1e-5, "eps = jitter * tr(Sigma)/d added to the diagonal, x10 until Cholesky "
                            "succeeds", low=0.0, low_open=True),
        "eval_head": FedGH.HPARAMS["eval_head"],
    }

    def server_init(self):
        server = super().server_init()
        C, d = server["head"]["head.weight"].shape
        dev = server["head"]["head.weight"].device
        return {**server, "means": torch.zeros(C, d, device=dev), "has_mean": torch.zeros(C, dtype=torch.bool, device=dev)}

    # ---- client side: eq. (2)-(4)
    def loss(self, rnd, k, server, cstate):
        # first round: "the selected clients only calculate the supervised loss"
        return aligned_ce(self.hp["lam"], server["means"], server["has_mean"], self.hp["align"])

    def down_bytes(self, server):
        sent = state_bytes(server["head"])
        if self.hp["lam"] > 0:  # the global means are broadcast only when the auxiliary loss uses them
            sent += targets_bytes(server["means"], server["has_mean"])
        return sent

    # ---- server side: eq. (8)-(12)
    def aggregate(self, rnd, server, updates, clients):
        msgs = [u.payload for u in updates]
        head = self.header(server)
        train_head_on_means(head, [(m["means"], m["classes"]) for m in msgs], self.hp["server_lr"])  # eq. 8-9
        n, mu = pool_means(msgs, server["means"].shape[0])                                            # eq. 10
        means, has_mean = carry_targets(server["means"], server["has_mean"], n, mu)
        if self.hp["calibrate"] and self.hp["server_epochs"] > 0:                                     # eq. 11-12
            z, y = self.virtual_features(rnd, msgs, n)
            local_train(head, z.to(server["means"].device, server["means"].dtype), y.to(server["means"].device),
                        epochs=self.hp["server_epochs"], batch_size=self.hp["server_batch"], lr=self.hp["server_lr"],
                        seed=derive_seed(self.ctx.cfg.seed, rnd, 0xDC, 2))
        return {**server, "head": self.header_state(head), "means": means, "has_mean": has_mean}

    def virtual_features(self, rnd, msgs, n):
        """G_c ~ N(mu_c, Sigma_c) (eq. 10-11 pooling) with |G_c| = n_virtual * |D^c| / sum |D^c'| (rounded
        by largest remainder); CPU float64, server RNG from (seed, round)."""
        gen = torch.Generator().manual_seed(derive_seed(self.ctx.cfg.seed, rnd, 0xDC, 1))
        sizes = virtual_counts(n, self.hp["n_virtual"])
        zs, ys = [], []
        for c in torch.nonzero(sizes).flatten().tolist():
            rows = [(m, i) for m in msgs for i in torch.nonzero(m["classes"] == c).flatten().tolist()]
            _, mu_c, sigma_c = pool_class(torch.stack([m["counts"][i] for m, i in rows]),
                                          torch.stack([m["means"][i] for m, i in rows]),
                                          torch.stack([m["covs"][i] for m, i in rows]))
            zs.append(sample_gaussian(mu_c, sigma_c, int(sizes[c]), gen, self.hp["cov_shrink"], self.hp["cov_jitter"]))
            ys.append(torch.full((int(sizes[c]),), c, dtype=torch.long))
        return torch.cat(zs), torch.cat(ys)
