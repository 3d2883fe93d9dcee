"""FedDF (Lin, Kong, Stich & Jaggi, NeurIPS 2020, "Ensemble distillation for robust model fusion in federated
learning"), a non-personalized PerFed-CKT baseline (Table 1 homogeneous, Table 2 heterogeneous).

A round is FedAvg's (E epochs of SGD on CE, uploads averaged by n_k), then server-side ensemble distillation
(the paper's Algorithm 1): the student x_t starts at the averaged model and takes `distill_steps` steps on
mini-batches d of the unlabeled public set,
    x_{t,j} = x_{t,j-1} - eta d KL( sigma(1/|S_t| sum_k f(x_k^t, d)), sigma(f(x_{t,j-1}, d)) ) / d x_{t,j-1},
i.e. KL(teacher ensemble || student) with the ensemble = the plain mean of the received models' logits
("AvgLogits"; `ensemble='avg_probs'` averages the softmax outputs instead, the code's `avg_probs` scheme).
Settings from the authors' code (epfml/federated-learning-public-code, codes/FedDF-code/pcode/aggregation/
noise_knowledge_transfer.py, defaults): Adam `student_learning_rate=1e-3` with `CosineAnnealingLR` over the
total number of server batches, `batch_size=128`, `KL_temperature=1` with `F.kl_div(F.log_softmax(s / T),
F.softmax(t / T), reduction="batchmean")` (no T^2 factor), `clip_grad_norm_(..., 5)`, teachers in eval mode,
student in train mode, uniform teacher weights `1.0 / len(_teachers)`.
Choices where the paper/code differ from what is built:
  - steps: the paper distils for up to 10^4 steps ("total_n_server_pseudo_batches=1000 * 10") with early stopping
    on a held-out validation set ("early_stopping_server_batches", evaluated every 100 batches); the server has no
    labeled validation set here (PerFed-CKT's public set is unlabeled), so `distill_steps` (default 100) fixed
    steps, no early stopping, the last student is kept;
  - public batches: epoch-wise random permutations of P (the code's shuffled DataLoader), from a generator seeded
    by derive_seed(seed, round, 0xDF), the last partial batch kept; dropout in the student from derive_seed(seed,
    round, 0xDF, 1);
  - the code's default `update_student_scheme="avg_losses"` (mean of per-teacher KLs) is not built: the paper's
    Algorithm 1 distils from the averaged logits;
  - heterogeneous models (the paper's Sec. 3 "heterogeneous systems", PerFed-CKT Table 2): one prototype model per
    architecture; a client starts from its architecture's prototype; the server averages each architecture's
    uploads (a prototype with no upload this round keeps its state), then distils EVERY prototype from the one
    ensemble of all received models (each through its own architecture); a client's personal model is its
    architecture's prototype. Student seeds per architecture: derive_seed(seed, round, 0xDF, 2, crc32(name)).
Bytes as FedAvg (the public set is at the server).
"""
from __future__ import annotations

import dataclasses
import zlib

import torch
import torch.nn.functional as F

from ..core.aggregation import clone_state, weighted_average
from ..core.seeds import derive_seed
from ..core.training import outputs
from ..params import MAX_STEPS, Param, check_params
from .base import Algorithm


def ensemble_target(teacher_logits: list, temperature: float = 1.0, ensemble: str = "avg_logits") -> torch.Tensor:
    """The teacher distribution: sigma(mean_k z_k / T) ('avg_logits', Algorithm 1) or mean_k sigma(z_k / T)."""
    z = torch.stack(teacher_logits)
    if ensemble == "avg_logits":
        return F.softmax(z.mean(0) / temperature, dim=-1)
    return F.softmax(z / temperature, dim=-1).mean(0)


def distill_loss(student_logits: torch.Tensor, target: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """KL(target || sigma(s / T)), averaged over the batch (the code's F.kl_div(..., reduction='batchmean'))."""
    return F.kl_div(F.log_softmax(student_logits / temperature, dim=-1), target, reduction="batchmean")


def distill(net, public: torch.Tensor, target: torch.Tensor, *, steps: int, batch_size: int, lr: float,
            temperature: float, gen: torch.Generator, clip: float = 5.0) -> float:
    """Train `net` in place for `steps` Adam steps (cosine-annealed lr) on KL(target || student) over public
    mini-batches; returns the mean loss over the steps."""
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(steps, 1))
    net.train()
    order, pos, total = torch.randperm(len(public), generator=gen), 0, 0.0
    for _ in range(steps):
        if pos >= len(order):
            order, pos = torch.randperm(len(public), generator=gen), 0
        idx = order[pos:pos + batch_size].to(public.device)
        pos += batch_size
        opt.zero_grad(set_to_none=True)
        loss = distill_loss(net(public[idx]), target[idx], temperature)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
        opt.step()
        sched.step()
        total += loss.item()
    return total / max(steps, 1)


class FedDF(Algorithm):
    name = "feddf"
    generic = True
    heterogeneous = True    # one prototype model per architecture (below)
    needs_public = True     # RunConfig refuses a run without `public.size`
    HPARAMS = {
        "distill_steps": Param(int, 100, "server distillation steps per round (paper: up to 10^4 with early stopping "
                               "on a validation set; none here)", low=0, high=MAX_STEPS),
        "distill_lr": Param(float, 1e-3, "Adam learning rate of the student (code: student_learning_rate=1e-3), "
                            "cosine-annealed over the steps", low=0.0),
        "distill_batch": Param(int, 128, "public samples per distillation step (code: batch_size=128)", low=1),
        "temperature": Param(float, 1.0, "softmax temperature T of teachers and student (code: KL_temperature=1)",
                             low=1e-6),
        "ensemble": Param(str, "avg_logits", "teacher: softmax of the mean logits (Algorithm 1) or mean of softmaxes",
                          choices=("avg_logits", "avg_probs")),
    }

    @classmethod
    def server_work(cls, cfg):
        """Each architecture's student trains distill_steps batches; the round's teachers score P once (a forward
        pass, a third of a training pass). Mini PerFed-CKT: about 3x the clients' work, 9x with three architectures."""
        hp = check_params("hparams", cfg.hparams, cls.HPARAMS)
        students = len(set(cfg.models)) if cfg.heterogeneous else 1
        teachers = max(1.0, cfg.n_clients * cfg.participation)
        return students * hp["distill_steps"] * hp["distill_batch"] + teachers * cfg.public.get("size", 0) / 3

    def __init__(self, ctx, **hparams):
        super().__init__(ctx, **hparams)
        self.hetero = ctx.cfg.heterogeneous
        self.first = {}                       # architecture -> a client that has it (builds its modules)
        for k in range(ctx.data.n_clients):
            self.first.setdefault(ctx.arch(k), k)

    def server_init(self):
        s = super().server_init()
        if not self.hetero:
            return s
        return {**s, "protos": {a: clone_state(self.ctx.initial(k)) for a, k in self.first.items() if a != self.ctx.cfg.model}}

    def prototype(self, arch: str, server: dict) -> dict:
        return server["params"] if arch == self.ctx.cfg.model else server["protos"][arch]

    # ---- client side (heterogeneous: from the architecture's prototype; the message names the client)
    def plan(self, rnd, k, server, cstate):
        p = super().plan(rnd, k, server, cstate)
        return dataclasses.replace(p, start=self.prototype(self.ctx.arch(k), server)) if self.hetero else p

    def finish(self, rnd, k, server, cstate, state, stats):
        up, c = super().finish(rnd, k, server, cstate, state, stats)
        if self.hetero:
            up.payload = {"client": torch.tensor(k), "params": up.payload}
        return up, c

    # ---- server side
    def aggregate(self, rnd, server, updates, clients):
        if self.hetero:
            return self.aggregate_hetero(rnd, server, updates)
        new = super().aggregate(rnd, server, updates, clients)          # x_t: the weighted average
        if not updates or self.hp["distill_steps"] == 0:
            return new
        return {**new, "params": self.fuse(rnd, new["params"], [u.payload for u in updates])}

    def aggregate_hetero(self, rnd, server, updates):
        groups: dict = {}
        for u in updates:
            groups.setdefault(self.ctx.arch(int(u.payload["client"])), []).append(u)
        starts = {a: weighted_average([u.payload["params"] for u in g], [u.weight for u in g]) if g
                  else self.prototype(a, server) for a in self.first for g in [groups.get(a, [])]}
        if updates and self.hp["distill_steps"] > 0:
            hp, P = self.hp, self.ctx.data.x_public
            target = ensemble_target([outputs(self.ctx.model(int(u.payload["client"]), u.payload["params"]), P)
                                      for u in updates], hp["temperature"], hp["ensemble"])
            starts = {a: self.distil(rnd, self.first[a], st, target, (2, zlib.crc32(a.encode())))
                      for a, st in starts.items()}
        return {**server, "params": starts[self.ctx.cfg.model],
                "protos": {a: st for a, st in starts.items() if a != self.ctx.cfg.model}}

    def fuse(self, rnd: int, start: dict, teachers: list) -> dict:
        """The student, started at `start`, distilled from the ensemble of `teachers` (states) on the public set."""
        hp, P = self.hp, self.ctx.data.x_public
        target = ensemble_target([outputs(self.ctx.model(-1, t), P) for t in teachers], hp["temperature"],
                                 hp["ensemble"])
        return self.distil(rnd, -1, start, target)

    def distil(self, rnd: int, k: int, start: dict, target: torch.Tensor, salt: tuple = ()) -> dict:
        """Client k's architecture (-1: the server's) started at `start`, distilled toward `target`."""
        hp, P = self.hp, self.ctx.data.x_public
        net = self.ctx.model(k, start)
        gen = torch.Generator().manual_seed(derive_seed(self.ctx.cfg.seed, rnd, 0xDF, *salt))
        torch.manual_seed(derive_seed(self.ctx.cfg.seed, rnd, 0xDF, 1, *salt))   # dropout in the student
        distill(net, P, target, steps=hp["distill_steps"], batch_size=hp["distill_batch"], lr=hp["distill_lr"],
                temperature=hp["temperature"], gen=gen)
        return clone_state(net.state_dict())

    # ---- evaluation (heterogeneous: each client scores its architecture's prototype)
    def personal_model(self, k, server, cstate):
        return self.ctx.model(k, self.prototype(self.ctx.arch(k), server)) if self.hetero else None
