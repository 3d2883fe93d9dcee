"""Convolution and max-pooling for many clients at once as one channels-last kernel (the batched engine, CPU).

Under `vmap`, PyTorch runs a convolution of C clients (stacked weights) as one grouped convolution in NCHW memory
order, and a max-pooling likewise; its batching rules cannot keep channels-last (NHWC), the order in which oneDNN
runs both fastest on the CPU (docs/performance.md, "Channels-last batches" and "Grouped channels-last steps").
Here the two layers step out of `vmap` for their own call: they take the physical tensors under the batched ones
(the C clients' activations as one channels-last tensor `[B, C * channels, H, W]`, each client's block of channels
its own), run one convolution with `groups * C`, or one max-pooling over all channels, and hand the result back to
`vmap` as a batched tensor. Per client this computes what `nn.Conv2d` and `nn.MaxPool2d` compute (the same values
and gradients; the sums are ordered as oneDNN orders them in NHWC, so results move at float rounding).

The gradients are PyTorch's own: the physical tensors carry ordinary autograd history, which is how the batched
engine differentiates (ordinary autograd over `vmap`, `batched._Gradients`); the backward runs the same grouped
channels-last kernels. Where the innermost transform is not this `vmap` (under `torch.func.grad`, which must see
every operation), the layers run as `nn.Conv2d` and `nn.MaxPool2d` do, so they are correct under any transform and
fast under the engine's. (The twelfth session's version was a pair of `autograd.Function`s with `vmap` rules: the
same kernels, with about 0.5 ms of `torch.func` bookkeeping a call; docs/performance.md, "Out of vmap".)

`twin(module)` is a copy of `module` whose plain `nn.Conv2d` and `nn.MaxPool2d` layers are these (the same parameter
and buffer names, so `functional_call` and the stacked state fit it unchanged); outside `vmap` they run the ordinary
kernels. `pays(module, x, clients, batch)` says where the batched engine uses the twin: on the CPU, for a
convolutional model of the measured layers (`MEASURED_LAYERS`), from two clients (`GROUPED_MIN_CLIENTS`) and the
smallest step measured (`GROUPED_MIN_ROWS`); measured in `benchmarks/bench_grouped.py`."""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch._C import _functorch as _ft

CL = torch.channels_last
GROUPED_MIN_CLIENTS = 2  # one client has nothing to group (measured 0.91-1.04x, rerun 0.93-1.03x: bench_grouped.py)
GROUPED_MIN_ROWS = 10    # clients x batch size: the smallest step measured (2 x 5: 1.18-1.22x, rerun 1.13-1.23x)


def _fold(x: torch.Tensor, dim, clients: int) -> torch.Tensor:
    """A client-stacked activation (client dimension `dim`, None = shared by all) as one channels-last
    `[B, clients * channels, H, W]` tensor: a view when the layout already is (this module's outputs), else a copy."""
    x = x.unsqueeze(1).expand(x.shape[0], clients, *x.shape[1:]) if dim is None else x.movedim(dim, 1)
    v = x.reshape(x.shape[0], -1, *x.shape[3:])
    return v if v.is_contiguous(memory_format=CL) else v.contiguous(memory_format=CL)


def _unfold(v: torch.Tensor, clients: int) -> torch.Tensor:
    """`[B, clients * channels, H, W]` back to `[B, clients, channels, H, W]` (client dimension 1), as a view."""
    return v.reshape(v.shape[0], clients, v.shape[1] // clients, *v.shape[2:])


def _stacked(t: torch.Tensor | None, dim, clients: int) -> torch.Tensor | None:
    """A per-client tensor with its client dimension first (a shared one expanded to every client)."""
    if t is None:
        return None
    return t.unsqueeze(0).expand(clients, *t.shape) if dim is None else t.movedim(dim, 0)


def _outside(*tensors) -> tuple[int, list] | None:
    """The level of the innermost transform when it is a `vmap` that batches one of `tensors`, and each tensor's
    (physical tensor, client dimension or None); None when the layer must run as the plain one (no `vmap`, or
    another transform innermost)."""
    level = _ft.maybe_current_level()
    if level is None:
        return None
    phys, batched = [], False
    for t in tensors:
        if t is not None and _ft.is_batchedtensor(t) and _ft.maybe_get_level(t) == level:
            phys.append(_ft._unwrap_batched(t, level))
            batched = True
        elif t is not None and _ft.maybe_get_level(t) not in (-1, None):   # wrapped by another transform
            return None
        else:
            phys.append((t, None))
    return (level, phys) if batched else None


def _pair(v) -> list[int]:
    return [v, v] if isinstance(v, int) else list(v)


class GroupedConv2d(nn.Conv2d):
    """`nn.Conv2d`; directly under `vmap`, one grouped channels-last convolution of every client (same parameters,
    same values)."""

    def forward(self, x):
        out = _outside(x, self.weight, self.bias)
        if out is None:
            return super().forward(x)
        level, ((xp, dx), (wp, dw), (bp, db)) = out
        C = next(t.shape[d] for t, d in ((xp, dx), (wp, dw), (bp, db)) if d is not None)
        ws, bs = _stacked(wp, dw, C), _stacked(bp, db, C)
        y = F.conv2d(_fold(xp, dx, C), ws.reshape(-1, *ws.shape[2:]), None if bs is None else bs.reshape(-1),
                     self.stride, self.padding, self.dilation, self.groups * C)
        return _ft._add_batch_dim(_unfold(y, C), 1, level)


class GroupedMaxPool2d(nn.MaxPool2d):
    """`nn.MaxPool2d`; directly under `vmap`, one channels-last pooling of every client's channels (same values)."""

    def forward(self, x):
        out = _outside(x)
        if out is None:
            return super().forward(x)
        level, ((xp, dx),) = out
        C = xp.shape[dx]
        stride = self.stride if self.stride is not None else self.kernel_size
        y = F.max_pool2d(_fold(xp, dx, C), _pair(self.kernel_size), _pair(stride), _pair(self.padding),
                         _pair(self.dilation), self.ceil_mode)
        return _ft._add_batch_dim(_unfold(y, C), 1, level)


def _convertible(m: nn.Module) -> type | None:
    if type(m) is nn.Conv2d and m.padding_mode == "zeros" and not isinstance(m.padding, str):
        return GroupedConv2d
    if type(m) is nn.MaxPool2d and not m.return_indices:
        return GroupedMaxPool2d
    return None


def twin(module: nn.Module) -> nn.Module:
    """A copy of `module` whose plain convolutions and max-poolings run through this module's functions (other
    layers, and convolutions with another padding mode, as they are)."""
    twin_ = copy.deepcopy(module)
    for m in twin_.modules():
        cls = _convertible(m)
        if cls is not None:
            m.__class__ = cls
    return twin_


# The layers of the models measured (the LeNet-size CNNs of pFedSD, SCD, FedBSD, PerFed-CKT and DC-PFL). Others
# (BatchNorm, adaptive pooling) take the activations in this module's layout through slower batching rules.
MEASURED_LAYERS = (nn.Conv2d, nn.MaxPool2d, nn.ReLU, nn.Flatten, nn.Linear, nn.Dropout, nn.Dropout2d, nn.Identity)


def covers(module: nn.Module) -> bool:
    """Whether `twin(module)` runs `module`'s convolutions through this module: a model with a plain convolution,
    made of the measured layers only."""
    leaves = [m for m in module.modules() if not list(m.children())]
    return any(_convertible(m) is GroupedConv2d for m in leaves) and all(type(m) in MEASURED_LAYERS for m in leaves)


def pays(module: nn.Module, x: torch.Tensor, clients: int, batch: int) -> bool:
    """Whether the batched engine should train `clients` clients at batch size `batch` through `twin(module)`: on the
    CPU, from GROUPED_MIN_CLIENTS clients and GROUPED_MIN_ROWS rows a step, for a model it `covers`."""
    return (x.device.type == "cpu" and clients >= GROUPED_MIN_CLIENTS and clients * batch >= GROUPED_MIN_ROWS
            and covers(module))
