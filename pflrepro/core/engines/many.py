"""The training primitive for many clients at once (the batched engine's arithmetic).

`local_train_many` is `training.local_train` for C clients of one architecture: their parameters,
buffers and momentum are stacked along a leading client dimension and one step of all of them is
one call of `vmap(loss)` (`torch.func`) differentiated by ordinary autograd, followed by one SGD update of the stacked
tensors. Per client it does what `local_train` does, in the same order:

- data order: the same `torch.Generator(seed).randperm` per epoch, the same batches (the last
  partial batch of an epoch kept), the same number of steps (`epochs`, or `steps`);
- clients with fewer steps stop early: clients are sorted by step count, so the clients still
  training are always a prefix of the stack and the update touches only that prefix (a finished
  client's weights, momentum and BN statistics are never touched again). At a step where clients
  have different batch sizes (a partial last batch), each batch size is its own `vmap` call on
  the clients having it; padding is never used, so BatchNorm statistics and the loss's mean see
  exactly the client's own samples;
- SGD with momentum, dampening 0 and weight decay as `torch.optim.SGD` computes it
  (d = g + wd w; b = m b + d, b = d on the first step; w = w - lr b), gradient clipping by each
  client's own total norm;
- BatchNorm: each client's running statistics are its own (stacked buffers, updated in place);
- dropout: each client's masks are drawn from its own `torch.Generator(seed)`, the generator
  `local_train` seeds globally with `torch.manual_seed(seed)`, with the shapes and in the order
  `F.dropout`/`F.dropout2d` draw them, so masks are identical to the per-client path on CPU.

Floating point differs from the per-client path only by kernel choice (batched matmuls and
grouped convolutions instead of per-client ones; summation order), see docs/performance.md.

The loss must be a *batchable* term (`training.batchable`): `loss(m, x, y, aux)`, reaching
per-client tensors only through `aux` (`Plan.aux`, plus the batch's rows of `Plan.per_sample`).
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.func import vmap

from ..training import (Divergence, ModelView, TrainStats, body_features, ce_loss, decay_groups, head_only, is_batchable,
                        train_mode)
from . import grouped


class NotBatchable(RuntimeError):
    """These clients cannot be trained together (the per-client path still can)."""


# ---------------------------------------------------------------- dropout with per-client masks
_FEATURE = {nn.Dropout1d: 3, nn.Dropout2d: 4, nn.Dropout3d: 5}


class _Dropouts:
    """While installed, the module's dropout layers apply masks given from outside (one per call,
    in call order) instead of drawing from the global generator; in `record` mode they note the
    noise shape each call would draw (and pass the input through)."""

    def __init__(self, module: nn.Module):
        self.layers = [m for m in module.modules() if isinstance(m, (nn.Dropout, nn.Dropout1d, nn.Dropout2d,
                                                                        nn.Dropout3d, nn.AlphaDropout,
                                                                        nn.FeatureAlphaDropout))]
        self.masks = None     # iterator of masks while stepping
        self.calls = None     # list of (shape, p) while recording

    @contextlib.contextmanager
    def installed(self):
        for m in self.layers:
            m.forward = self._forward_for(m)
        try:
            yield self
        finally:
            for m in self.layers:
                del m.forward

    def _forward_for(self, m):
        def forward(x):
            p = float(m.p)
            if not m.training or p == 0.0:
                return x
            if isinstance(m, (nn.AlphaDropout, nn.FeatureAlphaDropout)):
                raise NotBatchable(f"{type(m).__name__} is not supported by the batched engine")
            if p == 1.0:
                return x * torch.zeros((), dtype=x.dtype, device=x.device)
            if self.calls is not None:          # recording: the noise shape F.dropout* would draw
                if type(m) in _FEATURE:
                    if x.dim() != _FEATURE[type(m)]:
                        raise NotBatchable(f"{type(m).__name__} on a {x.dim()}-d input")
                    shape = tuple(x.shape[:2]) + (1,) * (x.dim() - 2)
                else:
                    shape = tuple(x.shape)
                self.calls.append((shape, p))
                return x
            if self.masks is None:
                raise NotBatchable("dropout called outside the recorded sequence")
            try:
                mask = next(self.masks)
            except StopIteration:
                raise NotBatchable("the loss term called dropout more often than when it was recorded") from None
            return x * mask
        return forward

    @contextlib.contextmanager
    def recording(self):
        self.calls = []
        try:
            yield self.calls
        finally:
            self.calls = None

    @contextlib.contextmanager
    def using(self, masks):
        self.masks = iter(masks)
        try:
            yield
            if next(self.masks, None) is not None:
                raise NotBatchable("the loss term called dropout less often than when it was recorded")
        finally:
            self.masks = None


def draw_masks(calls, gens, device) -> list[torch.Tensor]:
    """Per dropout call, the stacked masks of the clients whose generators are `gens`: for each
    client, in call order, exactly what `F.dropout` draws (bernoulli(1-p), divided by 1-p)."""
    per_client = []
    for g in gens:
        per_client.append([torch.empty(shape).bernoulli_(1.0 - p, generator=g).div_(1.0 - p) for shape, p in calls])
    return [torch.stack([pc[j] for pc in per_client]).to(device) for j in range(len(calls))]


# ---------------------------------------------------------------- pytrees of tensors
def _leaves(tree, prefix=()):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _leaves(v, prefix + (k,))
    elif isinstance(tree, torch.Tensor):
        yield prefix, tree
    elif tree is not None:
        raise NotBatchable(f"aux entry {'.'.join(map(str, prefix))} is a {type(tree).__name__}, not a tensor")


def _signature(tree, rows: bool = False) -> tuple:
    """Structure, shapes and dtypes of a nested dict of tensors (`rows`: shapes without dim 0)."""
    return tuple((p, tuple(t.shape[1:] if rows else t.shape), t.dtype) for p, t in _leaves(tree))


def _same(ts) -> bool:
    t0 = ts[0]
    return all(t.data_ptr() == t0.data_ptr() and t.shape == t0.shape and t.stride() == t0.stride()
               and t.dtype == t0.dtype and t.device == t0.device for t in ts[1:])


def _stack_tree(trees, device, share: bool = True):
    """Stack the same-structured nested dicts along a new dim 0. Returns (tree, in_dims): a leaf
    that is the very same tensor for every client (e.g. FedProx's anchor, the global model) is
    passed once, unbatched (in_dims None). A single client's leaves are always batched: sharing
    gains nothing there, and a shared BatchNorm buffer cannot take a batched in-place update (a
    teacher state run in train mode, as pFedSD's, when only one client in the chunk has one)."""
    share = share and len(trees) > 1
    t0 = trees[0]
    if isinstance(t0, dict):
        out, dims = {}, {}
        for k in t0:
            out[k], dims[k] = _stack_tree([t[k] for t in trees], device, share)
        return out, dims
    if share and _same(trees):
        return t0.detach().to(device), None
    return torch.stack([t.detach().to(device) for t in trees]), 0


def _take(tree, dims, sel):
    """Rows `sel` (a slice or an index tensor) of the batched leaves of a stacked tree."""
    if isinstance(tree, dict):
        return {k: _take(v, dims[k], sel) for k, v in tree.items()}
    if dims is None:
        return tree
    return tree[sel] if isinstance(sel, slice) else tree.index_select(0, sel)


def _pad_rows(ts, device) -> torch.Tensor:
    n = max(len(t) for t in ts)
    out = torch.zeros((len(ts), n) + tuple(ts[0].shape[1:]), dtype=ts[0].dtype, device=device)
    for i, t in enumerate(ts):
        out[i, :len(t)] = t.to(device)
    return out


# ---------------------------------------------------------------- the primitive, for many clients
def sgd_update(params: list, grads: list, bufs: list, *, lr: float, momentum: float, weight_decay: float,
               first: bool) -> None:
    """One in-place step of `torch.optim.SGD` (dampening 0, no Nesterov) on stacked tensors:
    d = g + wd * p; buf = d at the first step, else momentum * buf + d; p -= lr * buf.
    Stacked weights of many clients do not fit in the CPU's cache, so this step is bound by memory
    traffic; torch's fused kernel reads and writes each tensor once (the explicit form below takes
    about twice the passes). `grads` may be overwritten."""
    fused = getattr(torch, "_fused_sgd_", None)
    if fused is not None and all(g.is_contiguous() for g in grads):
        fused(params, grads, bufs, weight_decay=weight_decay, momentum=momentum, lr=lr, dampening=0.0,
              nesterov=False, maximize=False, is_first_step=first)
        return
    for i, (p, d) in enumerate(zip(params, grads)):
        if weight_decay != 0:
            d = d.add_(p, alpha=weight_decay)
        if momentum != 0:
            buf = bufs[i]
            if first:
                buf.copy_(d)
            else:
                buf.mul_(momentum).add_(d)
            d = buf
        p.add_(d, alpha=-lr)


@dataclass
class _Schedule:
    """Per client, the batches `local_train` would take, in the same order. Clients are sorted by step count
    (`order`; `rank[i]` is client i's row), so the clients still training at step t are the first `active[t]`."""
    T: list            # steps per client
    order: list
    rank: dict
    Tmax: int
    idx: torch.Tensor  # (C, Tmax, B) rows of x, y
    loc: torch.Tensor  # (C, Tmax, B) positions in the client's own rows (for per-sample tensors)
    bsz: np.ndarray    # (C, Tmax) batch sizes
    active: np.ndarray


def _schedule(index: list, seeds: list, *, epochs: int, batch_size: int, steps, shuffle: bool = True) -> _Schedule:
    C, B = len(index), batch_size
    n = [int(len(ix)) for ix in index]
    spe = [math.ceil(m / B) for m in n]
    steps = steps if isinstance(steps, (list, tuple)) else [steps] * C      # per client, or one for all
    T = [0 if m == 0 else (st if st is not None else epochs * s) for m, s, st in zip(n, spe, steps)]
    order = sorted(range(C), key=lambda i: -T[i])     # stable: still-training clients form a prefix
    Tmax = max(T) if T else 0
    idx_all = torch.zeros((C, max(Tmax, 1), B), dtype=torch.long)
    loc_all = torch.zeros_like(idx_all)
    bsz = np.zeros((C, max(Tmax, 1)), dtype=np.int64)
    for r, i in enumerate(order):
        if T[i] == 0:
            continue
        gen = torch.Generator().manual_seed(seeds[i])
        rows = index[i].cpu()
        sizes = np.full(spe[i], B, dtype=np.int64)
        sizes[-1] = n[i] - (spe[i] - 1) * B
        for e in range(math.ceil(T[i] / spe[i])):
            perm = torch.randperm(n[i], generator=gen) if shuffle else torch.arange(n[i])
            t0, m = e * spe[i], min(spe[i], T[i] - e * spe[i])
            padded = torch.cat([perm, perm.new_zeros(spe[i] * B - n[i])]).view(spe[i], B)
            loc_all[r, t0:t0 + m] = padded[:m]
            idx_all[r, t0:t0 + m] = rows[padded[:m]]
            bsz[r, t0:t0 + m] = sizes[:m]
    active = (np.array(T)[None, :] > np.arange(Tmax)[:, None]).sum(1)   # clients still training at step t
    return _Schedule(T, order, {i: r for r, i in enumerate(order)}, Tmax, idx_all, loc_all, bsz, active)


@dataclass
class _Stack:
    """The clients' state stacked along a leading client dimension (rows in `_Schedule.order`)."""
    P: dict            # trainable parameters
    FZ: dict           # frozen parameters (shared leaves stay unstacked: fz_dims None)
    fz_dims: dict
    BUF: dict          # buffers (BN statistics)
    MOM: dict          # momentum
    AUX: dict          # the loss term's aux tensors
    aux_dims: dict
    PS: dict           # per-sample tensors, padded to the longest client
    ps_names: list
    UST: dict          # a custom step's state (`Plan.update_state`), one row a client


def _stack(starts, order, train_names, frozen_names, names_b, aux, per_sample, momentum, dev, ustates) -> _Stack:
    st = [starts[i] for i in order]
    P = {nm: torch.stack([s[nm].detach().to(dev) for s in st]).contiguous() for nm in train_names}
    FZ, fz_dims = _stack_tree([{nm: s[nm] for nm in frozen_names} for s in st], dev)
    BUF = {nm: torch.stack([s[nm].detach().to(dev) for s in st]).contiguous() for nm in names_b}
    MOM = {nm: torch.zeros_like(t) for nm, t in P.items()} if momentum else {}
    AUX, aux_dims = _stack_tree([aux[i] for i in order], dev)
    ps_names = list(per_sample[0])
    PS = {nm: _pad_rows([per_sample[i][nm] for i in order], dev) for nm in ps_names}
    UST = _stack_tree([ustates[i] for i in order], dev, share=False)[0] if ustates else {}
    return _Stack(P, FZ, fz_dims, BUF, MOM, AUX, aux_dims, PS, ps_names, UST)


def losses_and_grads(losses, params: dict, *args, extra: tuple = ()):
    """The batched engine's differentiation: `v = losses(leaves, *args)`, one loss value a client (a `vmap`ped loss
    over stacked parameters), then ordinary autograd of `v.sum()`. The gradient of the sum with respect to the stacked
    parameters is each client's own gradient (no tensor that requires a gradient is shared by two clients): what
    `vmap(grad_and_value(loss))` computes, through the same kernels, without `torch.func`'s per-operation bookkeeping
    of a gradient transform, and where `grouped`'s layers may step out of `vmap` (docs/performance.md, "Out of vmap").
    Returns (gradients by name, None where unused; the gradients of the `extra` tensors, which must require them;
    the detached values)."""
    leaves = {nm: t.detach().requires_grad_(True) for nm, t in params.items()}
    with torch.enable_grad():
        v = losses(leaves, *args)
        g = torch.autograd.grad(v.sum(), [*leaves.values(), *extra], allow_unused=True)
    return dict(zip(leaves, g[:len(leaves)])), g[len(leaves):], v.detach()


class _Gradients:
    """One step of one client, `vmap`ped over the active clients: per-client gradients and loss values, with
    each client's dropout masks drawn from its own generator."""

    def __init__(self, module, loss, S: _Stack, sch: _Schedule, x, y, seeds):
        if grouped.pays(module, x, len(sch.order), int(sch.bsz.max())):
            module = grouped.twin(module)      # convolutions and max-pooling as one channels-last kernel
        self.module, self.loss, self.S, self.sch, self.x, self.y = module, loss, S, sch, x, y
        self.names_p = [n for n, _ in module.named_parameters()]
        self.dev = x.device
        self.loc = sch.loc.to(self.dev) if S.ps_names else None
        self.drops = _Dropouts(module)
        ax_dims = {**S.aux_dims, **{nm: 0 for nm in S.ps_names}}
        self.step = vmap(self._client_loss, in_dims=(0, S.fz_dims, 0, ax_dims, 0, 0, 0), randomness="error")
        self.calls_for: dict[int, list] = {}
        self.gens = [torch.Generator().manual_seed(seeds[i]) for i in sch.order] if self.drops.layers else None

    def _client_loss(self, tp, fz, bufs, ax, xb, yb, masks):
        params = {nm: (tp[nm] if nm in tp else fz[nm]) for nm in self.names_p}
        with self.drops.using(masks):
            return self.loss(ModelView(self.module, params, bufs), xb, yb, ax)

    def _step(self, tp, *args):
        """Per-client loss values (`vmap`) and their gradients (`losses_and_grads`); a parameter the loss does not
        reach gets a zero gradient."""
        g, _, v = losses_and_grads(self.step, tp, *args)
        return {nm: (gi if gi is not None else torch.zeros_like(tp[nm])) for nm, gi in g.items()}, v

    def _record_calls(self, b: int):
        """The dropout draws of one step at batch size b (a no-grad dry run of the first client)."""
        S, r0 = self.S, 0
        params = {nm: (S.P[nm][r0] if nm in S.P else _row(S.FZ[nm], S.fz_dims[nm], r0)) for nm in self.names_p}
        bufs = {nm: t[r0].clone() for nm, t in S.BUF.items()}
        ax = {**_row(S.AUX, S.aux_dims, r0), **{nm: S.PS[nm][r0, :b] for nm in S.ps_names}}
        i0 = self.sch.idx[r0, 0, :b]
        with torch.no_grad(), self.drops.recording() as calls:
            self.loss(ModelView(self.module, params, bufs), self.x[i0], self.y[i0], ax)
        return calls

    def _group(self, t: int, A: int, b: int, pos):
        """Gradients of the active clients at positions `pos` (None: all A), whose batch size at step t is b."""
        S, dev = self.S, self.dev
        sel = slice(0, A) if pos is None else torch.as_tensor(pos, device=dev)
        take = (lambda tt: tt[:A]) if pos is None else (lambda tt: tt.index_select(0, sel))
        tp = {nm: take(tt) for nm, tt in S.P.items()}
        bufs = {nm: take(tt) for nm, tt in S.BUF.items()}
        fz = _take(S.FZ, S.fz_dims, sel)
        ax = _take(S.AUX, S.aux_dims, sel)
        bidx = take(self.sch.idx[:, t, :b])
        if S.ps_names:
            lidx = take(self.loc[:, t, :b])
            rows = torch.arange(A, device=dev)[:, None] if pos is None else sel[:, None]
            ax = {**ax, **{nm: S.PS[nm][rows, lidx] for nm in S.ps_names}}
        masks = []
        if self.drops.layers:
            if b not in self.calls_for:
                self.calls_for[b] = self._record_calls(b)
            who = range(A) if pos is None else pos
            masks = draw_masks(self.calls_for[b], [self.gens[r] for r in who], dev)
        try:
            g, v = self._step(tp, fz, bufs, ax, self.x[bidx], self.y[bidx], masks)
        except RuntimeError as e:
            if "randomness" in str(e) and t == 0:
                raise NotBatchable(f"the loss term draws random numbers the batched engine cannot "
                                   f"reproduce per client: {e}") from e
            raise
        if pos is not None:           # gathered copies: BN statistics go back to the stack
            for nm, tt in S.BUF.items():
                tt.index_copy_(0, sel, bufs[nm])
        return sel, g, v

    def __call__(self, t: int, A: int, sizes: np.ndarray):
        """Gradients and loss values of the whole active prefix at step t (one vmap call per batch size)."""
        if (sizes == sizes[0]).all():
            return self._group(t, A, int(sizes[0]), None)[1:]
        parts = [self._group(t, A, int(b), np.flatnonzero(sizes == b)) for b in np.unique(sizes)]
        G = {nm: torch.empty((A,) + tuple(tt.shape[1:]), dtype=tt.dtype, device=self.dev) for nm, tt in self.S.P.items()}
        vals = torch.empty(A, dtype=parts[0][2].dtype, device=self.dev)
        for sel, g, v in parts:
            for nm in G:
                G[nm].index_copy_(0, sel, g[nm])
            vals.index_copy_(0, sel, v)
        return G, vals


def _clip(G: dict, A: int, grad_clip: float) -> None:
    """Each client's gradients scaled to total norm <= grad_clip (as `clip_grad_norm_` per client)."""
    norms = torch.stack([torch.linalg.vector_norm(G[nm].reshape(A, -1), 2, dim=1) for nm in G], 1)
    total = torch.linalg.vector_norm(norms, 2, dim=1)
    coef = torch.clamp(grad_clip / (total + 1e-6), max=1.0)
    for nm in G:
        G[nm].mul_(coef.view((A,) + (1,) * (G[nm].dim() - 1)))


def _check_finite(vals: torch.Tensor, t: int, order: list) -> None:
    if not bool(torch.isfinite(vals).all()):
        r = int(torch.nonzero(~torch.isfinite(vals))[0])
        raise Divergence(f"loss became {vals[r].item()} at local step {t} of the client at "
                         f"position {order[r]} of this batch of clients: the run diverged "
                         f"(lower the learning rate, or check the loss term)")


def local_train_many(module: nn.Module, starts: list[dict], x: torch.Tensor, y: torch.Tensor,
                     index: list[torch.Tensor], *, epochs: int, batch_size: int, lr: float,
                     momentum: float = 0.0, weight_decay: float = 0.0, grad_clip: float = 0.0,
                     bias_decay: bool = True, loss=ce_loss, trainable=None, seeds: list[int],
                     steps: int | list | None = None, aux: list[dict] | None = None,
                     per_sample: list[dict] | None = None, shuffle: bool = True, update=None,
                     update_state: list[dict] | None = None) -> list[tuple[dict, TrainStats]]:
    """`training.local_train` for C clients at once (see the module docstring).

    `module` gives the architecture only (its own weights are not used or changed); client i
    starts from `starts[i]` (a state dict), trains on rows `index[i]` of (`x`, `y`) with seed
    `seeds[i]`, and receives `aux[i]` (plus its rows of `per_sample[i]`) in the loss term.
    `steps` (one for all, or a list: one per client, None = `epochs`) caps each client's steps.
    Returns, per client, its final state dict (views into the stacked tensors: clone what you keep)
    and its TrainStats. A call that moves only the head over a fixed body (`training.head_only`) trains the heads
    on the body's features, computed once per client (`_head_only_many`), as `local_train` does. `shuffle`,
    `update` and `update_state` (one dict a client) as `local_train`'s: a custom step runs `vmap`ped over the
    clients."""
    if not is_batchable(loss):
        raise NotBatchable("the loss term is not batchable (see training.batchable)")
    kw = dict(epochs=epochs, batch_size=batch_size, lr=lr, momentum=momentum, weight_decay=weight_decay,
              grad_clip=grad_clip, bias_decay=bias_decay, seeds=seeds, steps=steps, aux=aux)
    head = head_only(module, trainable, loss, per_sample is not None and any(per_sample))
    if head is not None and all(len(i) for i in index) and shuffle and update is None:
        return _head_only_many(module, head, starts, x, y, index, **kw)
    return _train_many(module, starts, x, y, index, loss=loss, trainable=trainable, per_sample=per_sample,
                       shuffle=shuffle, update=update, update_state=update_state, **kw)


def _train_many(module: nn.Module, starts: list[dict], x: torch.Tensor, y: torch.Tensor, index: list[torch.Tensor],
                *, epochs: int, batch_size: int, lr: float, momentum: float, weight_decay: float, grad_clip: float,
                bias_decay: bool, loss, trainable, seeds: list[int], steps, aux, per_sample, shuffle: bool = True,
                update=None, update_state=None) -> list:
    """`local_train_many`'s general path: every step of every client through the whole module."""
    C, dev = len(starts), x.device
    aux = aux if aux is not None else [{} for _ in range(C)]
    per_sample = per_sample if per_sample is not None else [{} for _ in range(C)]
    names_p = [n for n, _ in module.named_parameters()]
    train_names = [n for n in names_p if trainable is None or trainable(n)]
    frozen_names = [n for n in names_p if not (trainable is None or trainable(n))]
    # ---- schedule: per client, the batches local_train would take, in the same order
    sch = _schedule(index, seeds, epochs=epochs, batch_size=batch_size, steps=steps, shuffle=shuffle)
    sch.idx = sch.idx.to(dev)
    # ---- stacked state (in `order`)
    S = _stack(starts, sch.order, train_names, frozen_names, [n for n, _ in module.named_buffers()], aux,
               per_sample, momentum, dev, update_state if update is not None else None)
    groups = decay_groups(list(S.P), weight_decay, bias_decay)
    tot = torch.zeros(C, dtype=torch.float64, device=dev)
    last = torch.full((C,), float("nan"), dtype=torch.float64, device=dev)
    cnt = np.zeros(C, dtype=np.int64)
    step = _CustomStep(update, S) if update is not None else None
    # ---- one step of one client, vmapped over clients; then one SGD update of the stacked tensors
    grads = _Gradients(module, loss, S, sch, x, y, seeds)
    bad = torch.zeros((), dtype=torch.bool, device=dev)
    with train_mode(grads.module), grads.drops.installed():
        for t in range(sch.Tmax):
            A = int(sch.active[t])
            sizes = sch.bsz[:A, t]
            G, vals = grads(t, A, sizes)
            nb = torch.as_tensor(sizes, dtype=torch.float64, device=dev)
            if dev.type == "cpu":
                _check_finite(vals, t, sch.order)
            else:
                bad |= ~torch.isfinite(vals).all()
            tot[:A] += vals.double() * nb
            last[:A] = vals.double()
            cnt[:A] += sizes
            if grad_clip > 0:
                _clip(G, A, grad_clip)
            if step is not None:
                step(A, G)
                continue
            for names, wd in groups:    # one group (every parameter) unless biases are exempt
                sgd_update([S.P[nm][:A] for nm in names], [G[nm] for nm in names],
                           [S.MOM[nm][:A] for nm in names] if momentum else [],
                           lr=lr, momentum=momentum, weight_decay=wd, first=t == 0)
    if dev.type != "cpu" and bool(bad):
        raise Divergence("a loss became non-finite during batched local training: the run diverged "
                         "(lower the learning rate, or check the loss term)")
    # ---- per client: its state (views into the stack) and its statistics
    return _unstack(module, S, sch, tot.cpu().tolist(), cnt, last.cpu().tolist(), step is not None)


class _CustomStep:
    """A custom step (`training`, "a custom optimiser step") of the active prefix of stacked clients: `vmap`ped over
    them, each with its own parameters, gradients, step state and aux rows (a leaf shared by every client stays
    unbatched)."""

    def __init__(self, update, S: _Stack):
        self.S = S
        self.call = vmap(update, in_dims=(0, 0, 0, S.aux_dims))

    @torch.no_grad()
    def __call__(self, A: int, G: dict) -> None:
        S = self.S
        new, state = self.call({nm: t[:A] for nm, t in S.P.items()}, G, {nm: t[:A] for nm, t in S.UST.items()},
                               _take(S.AUX, S.aux_dims, slice(0, A)))
        for nm, t in S.P.items():
            t[:A].copy_(new[nm])
        for nm, t in S.UST.items():
            t[:A].copy_(state[nm])


def _head_only_many(module: nn.Module, head: nn.Module, starts: list[dict], x: torch.Tensor, y: torch.Tensor,
                    index: list[torch.Tensor], **kw) -> list[tuple[dict, TrainStats]]:
    """`local_train_many` of a call that moves only the head (`training.head_only`): each client's body features
    computed once, with its own body's weights, then the head alone trained for every client at once on them (the
    same batches in the same order: client i's features are rows `rows[i]`). The body comes back as it started."""
    feats, rows, at = [], [], 0
    for s, idx in zip(starts, index):
        body = {n.removeprefix("body."): t for n, t in s.items() if n.startswith("body.")}
        feats.append(body_features(module, x[idx], state=body))
        rows.append(torch.arange(at, at + len(idx), device=x.device))
        at += len(idx)
    heads = [{n.removeprefix("head."): t for n, t in s.items() if n.startswith("head.")} for s in starts]
    out = _train_many(head, heads, torch.cat(feats), torch.cat([y[i] for i in index]), rows, loss=ce_loss,
                      trainable=None, per_sample=None, **kw)
    names = list(module.state_dict())
    return [({n: h[n.removeprefix("head.")] if n.startswith("head.") else s[n] for n in names}, st)
            for s, (h, st) in zip(starts, out)]


def _unstack(module: nn.Module, S: _Stack, sch: _Schedule, tot: list, cnt: np.ndarray, last: list,
             custom: bool) -> list:
    out = []
    for i in range(len(sch.T)):
        r = sch.rank[i]
        state = {}
        for nm in module.state_dict().keys():
            if nm in S.P:
                state[nm] = S.P[nm][r]
            elif nm in S.BUF:
                state[nm] = S.BUF[nm][r]
            else:
                state[nm] = _row(S.FZ[nm], S.fz_dims[nm], r)
        c = int(cnt[r])
        ust = {nm: t[r] for nm, t in S.UST.items()} if custom else None
        out.append((state, TrainStats(tot[r] / max(c, 1), sch.T[i], c, last[r], ust)))
    return out


def _row(tree, dims, r: int):
    """Client r's values of a stacked tree (shared leaves as they are)."""
    if isinstance(tree, dict):
        return {k: _row(v, dims[k], r) for k, v in tree.items()}
    return tree if dims is None else tree[r]
