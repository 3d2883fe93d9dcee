"""Convolution and max-pooling for many clients at once as one channels-last kernel (the batched engine, CPU).

Under `vmap`, PyTorch runs a convolution of C clients (stacked weights) as one grouped convolution in NCHW memory
order, and a max-pooling likewise; its batching rules cannot keep channels-last (NHWC), the order in which oneDNN
runs both fastest on the CPU (docs/performance.md, "Channels-last batches" and "Grouped channels-last steps").
Here the two layers are `autograd.Function`s with their own `vmap` rules: the C clients' activations are kept as
one channels-last tensor `[B, C * channels, H, W]` from layer to layer (each client's block of channels is its own),
a convolution is one call with `groups * C`, a max-pooling one call over all channels, and so are their backward
passes. Per client this computes what `nn.Conv2d` and `nn.MaxPool2d` compute (the same values and gradients; the
sums are ordered as oneDNN orders them in NHWC, so results move at float rounding).

`twin(module)` is a copy of `module` whose plain `nn.Conv2d` and `nn.MaxPool2d` layers use these functions (the
same parameter and buffer names, so `functional_call` and the stacked state fit it unchanged); outside `vmap` they
run the ordinary kernels. `pays(module, x, clients, batch)` says where the batched engine uses the twin: on the CPU,
for a convolutional model of the measured layers (`MEASURED_LAYERS`), when `clients * batch >= GROUPED_MIN_ROWS`
(below that the Python cost of the custom functions outweighs the kernels' gain); measured in
`benchmarks/bench_grouped.py`."""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

CL = torch.channels_last
GROUPED_MIN_ROWS = 128   # clients x batch size from which the twin measured faster (bench_grouped.py)


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


def _clients(in_dims, tensors) -> int:
    return next(t.shape[d] for t, d in zip(tensors, in_dims) if t is not None and d is not None)


class Conv(torch.autograd.Function):
    """`F.conv2d(x, w, b, stride, padding, dilation, groups)`; under `vmap`, one grouped channels-last call."""

    @staticmethod
    def forward(x, w, b, stride, padding, dilation, groups):
        return F.conv2d(x, w, b, stride, padding, dilation, groups)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, w, b = inputs[:3]
        ctx.save_for_backward(x, w)
        ctx.geometry = inputs[3:]
        ctx.has_bias = b is not None

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        need = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2]]
        gx, gw, gb = ConvBackward.apply(g, x, w, need, *ctx.geometry)
        return (gx if need[0] else None), (gw if need[1] else None), (gb if need[2] else None), None, None, None, None

    @staticmethod
    def vmap(info, in_dims, x, w, b, stride, padding, dilation, groups):
        C = _clients(in_dims[:3], (x, w, b))
        ws = _stacked(w, in_dims[1], C)
        bs = _stacked(b, in_dims[2], C)
        out = F.conv2d(_fold(x, in_dims[0], C), ws.reshape(-1, *ws.shape[2:]), None if bs is None else bs.reshape(-1),
                       stride, padding, dilation, groups * C)
        return _unfold(out, C), 1


def _conv_backward(g, x, w, need, stride, padding, dilation, groups):
    """`aten.convolution_backward` for what `need` asks (input, weight, bias); zeros of the right shape stand in
    for a gradient not asked for (a Function returns tensors)."""
    gx, gw, gb = torch.ops.aten.convolution_backward(g, x, w, [w.shape[0]] if need[2] else None, stride, padding,
                                                     dilation, False, [0, 0], groups, need)
    return (gx if gx is not None else x.new_zeros(()).expand(x.shape),
            gw if gw is not None else w.new_zeros(()).expand(w.shape),
            gb if gb is not None else w.new_zeros(()).expand(w.shape[0]))


class ConvBackward(torch.autograd.Function):
    """`Conv`'s gradients (input, weight, bias); under `vmap`, one grouped channels-last call."""

    @staticmethod
    def forward(g, x, w, need, stride, padding, dilation, groups):
        return _conv_backward(g, x, w, need, stride, padding, dilation, groups)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError("no second derivatives through grouped.Conv")

    @staticmethod
    def vmap(info, in_dims, g, x, w, need, stride, padding, dilation, groups):
        C = _clients(in_dims[:3], (g, x, w))
        ws = _stacked(w, in_dims[2], C)
        gx, gw, gb = _conv_backward(_fold(g, in_dims[0], C), _fold(x, in_dims[1], C), ws.reshape(-1, *ws.shape[2:]),
                                    need, stride, padding, dilation, groups * C)
        return (_unfold(gx, C), gw.reshape(ws.shape), gb.reshape(C, -1)), (1, 0, 0)


class MaxPool(torch.autograd.Function):
    """`F.max_pool2d` (values and the indices the backward uses); under `vmap`, one channels-last call."""

    @staticmethod
    def forward(x, kernel, stride, padding, dilation, ceil):
        return torch.ops.aten.max_pool2d_with_indices(x, kernel, stride, padding, dilation, ceil)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0], output[1])
        ctx.mark_non_differentiable(output[1])
        ctx.geometry = inputs[1:]

    @staticmethod
    def backward(ctx, g, _g_indices):
        x, idx = ctx.saved_tensors
        return MaxPoolBackward.apply(g, x, idx, *ctx.geometry), None, None, None, None, None

    @staticmethod
    def vmap(info, in_dims, x, kernel, stride, padding, dilation, ceil):
        C = x.shape[in_dims[0]]
        out, idx = torch.ops.aten.max_pool2d_with_indices(_fold(x, in_dims[0], C), kernel, stride, padding,
                                                          dilation, ceil)
        return (_unfold(out, C), _unfold(idx, C)), (1, 1)


class MaxPoolBackward(torch.autograd.Function):
    """`MaxPool`'s input gradient; under `vmap`, one channels-last call."""

    @staticmethod
    def forward(g, x, idx, kernel, stride, padding, dilation, ceil):
        return torch.ops.aten.max_pool2d_with_indices_backward(g, x, kernel, stride, padding, dilation, ceil, idx)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError("no second derivatives through grouped.MaxPool")

    @staticmethod
    def vmap(info, in_dims, g, x, idx, kernel, stride, padding, dilation, ceil):
        C = _clients(in_dims[:3], (g, x, idx))
        gx = torch.ops.aten.max_pool2d_with_indices_backward(_fold(g, in_dims[0], C), _fold(x, in_dims[1], C),
                                                             kernel, stride, padding, dilation, ceil,
                                                             _fold(idx, in_dims[2], C))
        return _unfold(gx, C), 1


def _pair(v) -> list[int]:
    return [v, v] if isinstance(v, int) else list(v)


class GroupedConv2d(nn.Conv2d):
    """`nn.Conv2d` through `Conv` (same parameters, same values)."""

    def forward(self, x):
        return Conv.apply(x, self.weight, self.bias, list(self.stride), list(self.padding), list(self.dilation),
                          self.groups)


class GroupedMaxPool2d(nn.MaxPool2d):
    """`nn.MaxPool2d` through `MaxPool` (same values)."""

    def forward(self, x):
        stride = self.stride if self.stride is not None else self.kernel_size
        return MaxPool.apply(x, _pair(self.kernel_size), _pair(stride), _pair(self.padding), _pair(self.dilation),
                             self.ceil_mode)[0]


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


def pays(module: nn.Module, x: torch.Tensor, clients: int, batch: int) -> bool:
    """Whether the batched engine should train `clients` clients at batch size `batch` through `twin(module)`: on the
    CPU, from GROUPED_MIN_ROWS rows a step, for a model with a plain convolution made of the measured layers only."""
    leaves = [m for m in module.modules() if not list(m.children())]
    return (x.device.type == "cpu" and clients * batch >= GROUPED_MIN_ROWS
            and any(_convertible(m) is GroupedConv2d for m in leaves)
            and all(type(m) in MEASURED_LAYERS for m in leaves))
