"""Parameter names by role: layers, head and body, BatchNorm."""
from __future__ import annotations

import torch.nn as nn

from .base import SplitModel


def _param_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(qualified name, module) of every module owning parameters directly,
    in registration order, walking ``body`` then ``head`` for a SplitModel."""
    if isinstance(model, SplitModel):
        roots = [("body", model.body), ("head", model.head)]
    else:
        roots = [("", model)]
    out: list[tuple[str, nn.Module]] = []
    seen: set[int] = set()
    for prefix, root in roots:
        for name, mod in root.named_modules(prefix=prefix):
            if id(mod) in seen:
                continue
            seen.add(id(mod))
            if any(True for _ in mod.parameters(recurse=False)):
                out.append((name, mod))
    return out


def layer_param_groups(model: nn.Module) -> list[list[str]]:
    """Parameter names grouped per parametrised layer (Linear/Conv/BN/...), in order.

    Each group holds the names (as in ``model.named_parameters()``) of the
    parameters owned directly by one module, e.g. ``["head.weight", "head.bias"]``.
    """
    groups = []
    for name, mod in _param_layers(model):
        pre = f"{name}." if name else ""
        groups.append([pre + p for p, _ in mod.named_parameters(recurse=False)])
    return groups


def head_param_names(model: nn.Module, n_layers: int = 1) -> list[str]:
    """Names of the parameters of the last ``n_layers`` parametrised layers.

    Layers are modules owning parameters directly (Linear, Conv, BatchNorm),
    counted in registration order over body then head.  ``n_layers=1`` gives
    the head's parameters; ``n_layers=2`` is FedPer's "last two layers".
    """
    if n_layers < 0:
        raise ValueError(f"n_layers must be >= 0, got {n_layers}")
    if n_layers == 0:
        return []
    groups = layer_param_groups(model)
    return [n for g in groups[-n_layers:] for n in g]


def body_param_names(model: nn.Module, n_head_layers: int = 1) -> list[str]:
    """All parameter names not in ``head_param_names(model, n_head_layers)``, in order."""
    head = set(head_param_names(model, n_head_layers))
    return [n for n, _ in model.named_parameters() if n not in head]


def bn_names(model: nn.Module) -> set[str]:
    """Names of all parameters *and* buffers that belong to BatchNorm modules
    (weight, bias, running_mean, running_var, num_batches_tracked)."""
    names: set[str] = set()
    for mod_name, mod in model.named_modules():
        if isinstance(mod, nn.modules.batchnorm._NormBase) and not isinstance(
            mod, nn.modules.instancenorm._InstanceNorm
        ):
            pre = f"{mod_name}." if mod_name else ""
            names.update(pre + n for n, _ in mod.named_parameters(recurse=False))
            names.update(pre + n for n, _ in mod.named_buffers(recurse=False))
    return names


def is_bn_param(name: str, model: nn.Module) -> bool:
    """True if ``name`` (a parameter or buffer name) belongs to a BatchNorm module."""
    return name in bn_names(model)


def count_params(model: nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
