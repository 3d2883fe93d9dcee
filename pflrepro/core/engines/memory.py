"""Memory of a batched call: what one client needs (weights, gradients, momentum, activations), how many clients a
chunk holds under `memory_budget_mb`, and the refusal before round 1 of a run that cannot fit."""
from __future__ import annotations

import math

import torch
from torch import nn

from ..context import Context, Plan
from ..training import ModelView, ce_loss, is_batchable, train_mode
from .many import _leaves


class MemoryBudgetError(RuntimeError):
    """One client needs more memory than `memory_budget_mb` allows."""


# ---------------------------------------------------------------- memory
def client_bytes(module: nn.Module, plan: Plan, batch_size: int, x: torch.Tensor, y: torch.Tensor,
                 rows: torch.Tensor) -> dict:
    """Estimated bytes one client adds to a chunk: stacked trainable weights x 4 (weights, gradients,
    momentum, the transforms' temporaries), frozen weights, buffers x 2, its aux and per-sample
    tensors, its schedule, and activations: every module output of one forward of the loss term
    (student and any teacher), measured on a batch, x 3 (kept for backward, gradients, temporaries)."""
    names = [n for n, _ in module.named_parameters()]
    tr = plan.trainable
    pb = {n: plan.start[n].numel() * plan.start[n].element_size() for n in names}
    trainable = sum(v for n, v in pb.items() if tr is None or tr(n))
    frozen = sum(pb.values()) - trainable
    buffers = sum(plan.start[n].numel() * plan.start[n].element_size() for n, _ in module.named_buffers())
    aux = sum(t.numel() * t.element_size() for _, t in _leaves(plan.aux))
    ps = sum(t.numel() * t.element_size() for _, t in _leaves(plan.per_sample))
    b = int(min(batch_size, max(len(rows), 1)))
    b = max(b, min(2, len(rows)))
    act = _activation_bytes(module, plan, x[rows[:b]], y[rows[:b]]) / max(b, 1) * batch_size
    sample = x[:1].numel() * x.element_size() + 8
    epochs = plan.epochs or 1
    schedule = 16 * (epochs * len(rows) + batch_size)
    parts = {"weights": 4 * trainable + frozen + 2 * buffers, "aux": aux + ps, "activations": 3 * act,
             "batch": batch_size * sample + schedule}
    parts["total"] = sum(parts.values())
    return parts


def _activation_bytes(module, plan, xb, yb) -> int:
    total = [0]

    def hook(_m, _i, out):
        for o in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(o, torch.Tensor):
                total[0] += o.numel() * o.element_size()
    leaves = [m for m in module.modules() if not any(True for _ in m.children())]
    handles = [m.register_forward_hook(hook) for m in leaves]
    names_p = {n for n, _ in module.named_parameters()}
    params = {n: t for n, t in plan.start.items() if n in names_p}
    bufs = {n: t.clone() for n, t in plan.start.items() if n not in names_p}
    ax = {**plan.aux, **{k: v[:len(yb)] for k, v in plan.per_sample.items()}}
    try:
        with torch.no_grad(), train_mode(module):
            loss = plan.loss if is_batchable(plan.loss) else ce_loss
            loss(ModelView(module, params, bufs), xb, yb, ax)
    finally:
        for h in handles:
            h.remove()
    return total[0]


def chunk_size(need: int, budget_mb: float, n: int) -> int:
    return max(0, min(n, int(budget_mb * 2**20 // max(need, 1))))


def _need(ctx: Context, k: int, plan: Plan) -> dict:
    return client_bytes(ctx.model(k), plan, ctx.cfg.batch_size, ctx.data.x, ctx.data.y, ctx.data.train[k])


def _too_big(ctx: Context, k: int, need: dict) -> str:
    mb = need["total"] / 2**20
    return (f"memory_budget_mb={ctx.cfg.memory_budget_mb:g}: one client of model {ctx.arch(k)!r} needs about "
            f"{mb:.0f} MB in the batched engine (weights/gradients/momentum {need['weights'] / 2**20:.0f} MB, "
            f"activations at batch_size={ctx.cfg.batch_size} {need['activations'] / 2**20:.0f} MB, aux "
            f"{need['aux'] / 2**20:.0f} MB); raise memory_budget_mb to at least {math.ceil(mb)}, lower "
            f"batch_size, or use engine='per_client'")
