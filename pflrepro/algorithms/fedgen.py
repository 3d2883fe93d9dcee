"""FedGen (Zhu, Hong & Zhou, ICML 2021, "Data-free knowledge distillation for heterogeneous federated learning"),
a conventional-FL baseline of SCD (Tables 1-2). Settings from the authors' code (zhuangdizhu/FedGen) where the paper
is silent; every choice is in docs/fidelity.md.

Server (before the FedAvg step, the code's order): `gen_steps` Adam steps on a generator G(eps, y) -> feature space
(the heads' input), so that the round's uploaded heads h_k, weighted per label by a_k(y) = n_k^y / sum_j n_j^y, predict
y:  sum_k mean_i a_k(y_i) CE(h_k(G(eps_i, y_i)), y_i) + eta exp(-mean_ij d2(eps_i, eps_j) d1(G_i, G_j)), y ~ p_hat(y).
Client (from round 2), G frozen:  CE(f(x), y) + alpha_t CE(h(G(eps', y')), y') + beta_t KL(softmax(h(G(eps, y))) ||
softmax(f(x))), the KL target detached, y' ~ p_hat(y), alpha_t = max(1e-4, alpha 0.98^(t-1)). G cannot change during
local training, so the generated features are drawn once a round, one pair per training sample (`per_sample`): the
client step stays a batchable Plan.
"""
from __future__ import annotations

import dataclasses
import functools

import torch
import torch.nn.functional as F
from torch import nn

from ..core.aggregation import clone_state, state_bytes
from ..core.clock import model_forward_flops
from ..core.context import Plan
from ..core.seeds import derive_seed
from ..core.training import batchable
from ..data.datasets import SPECS
from ..data.models import build_model
from ..params import MAX_STEPS, Param, check_params
from .base import Algorithm


class Generator(nn.Module):
    """G(eps, y): [noise, one-hot y] -> Linear -> BatchNorm1d -> ReLU -> Linear (code: `Generator`, no embedding)."""

    def __init__(self, noise_dim: int, n_classes: int, hidden: int, out_dim: int):
        super().__init__()
        self.n_classes = n_classes
        self.net = nn.Sequential(nn.Linear(noise_dim + n_classes, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
                                 nn.Linear(hidden, out_dim))

    def forward(self, eps, y):
        return self.net(torch.cat([eps, F.one_hot(y, self.n_classes).to(eps.dtype)], 1))


def diversity_loss(eps: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
    """exp(-mean_ij [mean_d (eps_i - eps_j)^2] [mean_d |G_i - G_j|]) (code: DiversityLoss(metric='l1'))."""
    noise = (eps[:, None] - eps[None]).pow(2).mean(-1)
    return torch.exp(-(noise * (feats[:, None] - feats[None]).abs().mean(-1)).mean())


def teacher_loss(feats, y, heads: list, weights: torch.Tensor) -> torch.Tensor:
    """sum_k mean_i a_k(y_i) CE(h_k(feats_i), y_i), heads = [(W_k, b_k)], weights[k, c] = a_k(c)."""
    return sum((weights[k][y] * F.cross_entropy(F.linear(feats, W, b), y, reduction="none")).mean()
               for k, (W, b) in enumerate(heads))


@batchable
def fedgen_loss(m, x, y, aux):
    """The client's objective on one batch; aux: generated features of the batch's labels (`feat_y`), of sampled
    labels `y_gen` (`feat_gen`), and the round's alpha_t, beta_t."""
    logits, W, b = m(x), m.params["head.weight"], m.params["head.bias"]
    target = F.softmax(F.linear(aux["feat_y"], W, b), -1).detach()
    kd = F.kl_div(F.log_softmax(logits, -1), target, reduction="batchmean")
    gen = F.cross_entropy(F.linear(aux["feat_gen"], W, b), aux["y_gen"])
    return F.cross_entropy(logits, y) + aux["alpha"] * gen + aux["beta"] * kd


@functools.lru_cache(maxsize=16)
def _dims(model: str, dataset: str) -> tuple:
    """(feature dim, classes, forward FLOPs of one image) of a registry model on a dataset."""
    s = SPECS[dataset]
    with torch.random.fork_rng(devices=[]):
        d = build_model(model, s.channels, s.num_classes, s.size).head.in_features
    return d, s.num_classes, model_forward_flops(model, s.channels, s.num_classes, s.size)


class FedGen(Algorithm):
    name = "fedgen"
    HPARAMS = {
        "alpha": Param(float, 10.0, "weight of CE on generated features, decayed 0.98 a round (code: generative_alpha"
                       "=10)", low=0.0),
        "beta": Param(float, 10.0, "weight of the KL to the generated features' prediction, decayed 0.98 a round "
                      "(code: generative_beta=10, mnist/celeb)", low=0.0),
        "decay": Param(float, 0.98, "per-round decay of alpha, beta and the generator lr (code: 0.98)", low=0.0, high=1.0),
        "gen_hidden": Param(int, 256, "generator hidden units (code GENERATORCONFIGS: mnist 256, cifar 512)", low=1),
        "noise_dim": Param(int, 32, "generator noise dimension (code GENERATORCONFIGS: mnist 32, cifar 64)", low=1),
        "gen_lr": Param(float, 3e-4, "generator Adam lr (code: ensemble_lr=3e-4)", low=0.0, low_open=True),
        "gen_wd": Param(float, 1e-2, "generator Adam weight decay (code: weight_decay=1e-2)", low=0.0),
        "gen_steps": Param(int, 50, "generator steps per round (code: ensemble_epochs // n_teacher_iters x "
                           "n_teacher_iters = 50)", low=0, high=MAX_STEPS),
        "gen_batch": Param(int, 0, "generator batch; 0 = the run's batch_size (code: train_generator(batch_size))",
                           low=0),
        "eta": Param(float, 1.0, "diversity-loss weight (code: ensemble_eta=1)", low=0.0),
        "noise": Param(str, "gaussian", "eps ~ N(0, I) (paper) or U[0, 1) (code: torch.rand)",
                       choices=("gaussian", "uniform")),
        "labels": Param(str, "prior", "y ~ p_hat(y), the label prior from the uploaded counts (paper) or uniform "
                        "over the labels present (code)", choices=("prior", "uniform")),
    }

    @classmethod
    def server_work(cls, cfg):
        """gen_steps batches through the generator and the round's teacher heads, in image training passes."""
        hp = check_params("hparams", cfg.hparams, cls.HPARAMS)
        d, c, flops = _dims(cfg.model, cfg.dataset)
        teachers = max(1.0, cfg.n_clients * cfg.participation)
        per = 2 * ((hp["noise_dim"] + c) * hp["gen_hidden"] + hp["gen_hidden"] * d) + teachers * 2 * d * c
        return hp["gen_steps"] * (hp["gen_batch"] or cfg.batch_size) * per / max(flops, 1)

    def __init__(self, ctx, **hparams):
        super().__init__(ctx, **hparams)
        self.C = ctx.data.spec.num_classes
        d = ctx.model(-1).head.in_features
        self._gen = Generator(self.hp["noise_dim"], self.C, self.hp["gen_hidden"], d).to(ctx.device)  # work buffer

    def generator(self, state: dict) -> Generator:
        self._gen.load_state_dict(state)
        return self._gen

    def server_init(self):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(self.ctx.cfg.seed, 0xFE6))
            gen = Generator(self.hp["noise_dim"], self.C, self.hp["gen_hidden"], self._gen.net[-1].out_features)
        gen = {n: t.to(self.ctx.device) for n, t in gen.state_dict().items()}
        opt = {"step": torch.zeros(())} | {f"{s}.{n}": torch.zeros_like(t) for n, t in self._gen.named_parameters()
                                           for s in ("m", "v")}
        return {**super().server_init(), "gen": gen, "gen_opt": opt,
                "prior": torch.full((self.C,), 1.0 / self.C, device=self.ctx.device)}

    def draw(self, n: int, p: torch.Tensor, g: torch.Generator):
        """n labels ~ p (or uniform over p's support) and their noise, from generator g."""
        q = p.cpu() if self.hp["labels"] == "prior" else (p.cpu() > 0).float()
        y = torch.multinomial(q, n, replacement=True, generator=g)
        eps = torch.randn(n, self.hp["noise_dim"], generator=g) if self.hp["noise"] == "gaussian" \
            else torch.rand(n, self.hp["noise_dim"], generator=g)
        return y.to(self.ctx.device), eps.to(self.ctx.device)

    # ---- client side
    def plan(self, rnd, k, server, cstate):
        if rnd <= 1:                                  # the code regularises from its second round on
            return Plan(start=server["params"])
        y = self.ctx.data.client_train(k)[1]
        g = torch.Generator().manual_seed(derive_seed(self.ctx.cfg.seed, rnd, k, 0xFE6))
        gen, (y_gen, eps_gen) = self.generator(server["gen"]).eval(), self.draw(len(y), server["prior"], g)
        _, eps = self.draw(len(y), server["prior"], g)
        with torch.no_grad():
            ps = {"feat_y": gen(eps, y.to(eps.device)), "feat_gen": gen(eps_gen, y_gen), "y_gen": y_gen}
        decay = self.hp["decay"] ** (rnd - 1)         # alpha_t, beta_t: the code's exp_lr_scheduler(glob_iter)
        aux = {n: torch.tensor(max(1e-4, self.hp[n] * decay)) for n in ("alpha", "beta")}
        return Plan(start=server["params"], loss=fedgen_loss, per_sample={n: t.to(y.device) for n, t in ps.items()},
                    aux={n: t.to(y.device) for n, t in aux.items()})

    def finish(self, rnd, k, server, cstate, state, stats):
        up = self.upload(k, state, stats, server)
        counts = torch.bincount(self.ctx.data.client_train(k)[1].cpu(), minlength=self.C).float()
        up.payload["label_counts"] = counts
        up.bytes_up += state_bytes({"c": counts})
        up.bytes_down += state_bytes(server["gen"])   # the generator is broadcast with the model
        return up, None

    # ---- server side
    def aggregate(self, rnd, server, updates, clients):
        counts = torch.stack([u.payload["label_counts"] for u in updates]).to(self.ctx.device) if updates else None
        plain = [dataclasses.replace(u, payload={n: t for n, t in u.payload.items() if n != "label_counts"})
                 for u in updates]
        new = super().aggregate(rnd, server, plain, clients)
        if not updates or self.hp["gen_steps"] == 0:
            return new
        heads = [(u.payload["head.weight"], u.payload["head.bias"]) for u in plain]
        return {**new, **self.train_generator(rnd, server, heads, counts)}

    def train_generator(self, rnd: int, server: dict, heads: list, counts: torch.Tensor) -> dict:
        """gen_steps Adam steps on J(w) from the round's heads; Adam moments carried in server state."""
        hp, gen = self.hp, self.generator(server["gen"]).train()
        opt = torch.optim.Adam(gen.parameters(), lr=hp["gen_lr"] * hp["decay"] ** (rnd - 1), weight_decay=hp["gen_wd"])
        so = server["gen_opt"]
        for n, p in gen.named_parameters():
            opt.state[p] = {"step": so["step"].clone(), "exp_avg": so[f"m.{n}"].clone(), "exp_avg_sq": so[f"v.{n}"].clone()}
        weights = counts / counts.sum(0).clamp_min(1)
        prior = counts.sum(0) / counts.sum()
        g = torch.Generator().manual_seed(derive_seed(self.ctx.cfg.seed, rnd, 0xFE6))
        heads = [(W.detach(), b.detach()) for W, b in heads]
        for _ in range(hp["gen_steps"]):
            y, eps = self.draw(hp["gen_batch"] or self.ctx.cfg.batch_size, prior, g)
            feats = gen(eps, y)
            loss = teacher_loss(feats, y, heads, weights) + hp["eta"] * diversity_loss(eps, feats)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        st = {n: opt.state[p] for n, p in gen.named_parameters()}
        return {"gen": clone_state(gen.state_dict()), "prior": prior,
                "gen_opt": {"step": next(iter(st.values()))["step"].detach().clone()}
                | {f"m.{n}": s["exp_avg"].detach().clone() for n, s in st.items()}
                | {f"v.{n}": s["exp_avg_sq"].detach().clone() for n, s in st.items()}}
