"""The model base class (a body and a head, the split every personalization method reads) and the blocks the
architectures share."""
from __future__ import annotations

from collections import OrderedDict
from typing import Iterable, Sequence

import torch
import torch.nn as nn


class SplitModel(nn.Module):
    """A classifier split into ``body`` (feature extractor) and ``head``.

    Subclasses assign ``self.body``, ``self.head`` and ``self.feature_dim``
    (``body`` must be registered before ``head`` so that module registration
    order walks body then head).  They can also be given to the constructor.
    """

    feature_dim: int

    def __init__(
        self,
        body: nn.Module | None = None,
        head: nn.Module | None = None,
        feature_dim: int | None = None,
    ) -> None:
        super().__init__()
        if body is not None:
            self.body = body
        if head is not None:
            self.head = head
        if feature_dim is not None:
            self.feature_dim = int(feature_dim)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def _output_shape(module: nn.Module, in_channels: int, image_size: int) -> torch.Size:
    """Per-sample output shape of ``module`` on a zero image (eval mode, no grad)."""
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            out = module(torch.zeros(1, in_channels, image_size, image_size))
    except RuntimeError as exc:  # e.g. image too small for the conv stack
        raise ValueError(
            f"input of shape ({in_channels}, {image_size}, {image_size}) is not "
            f"supported by this model: {exc}"
        ) from exc
    finally:
        module.train(was_training)
    return out.shape[1:]


def _mlp_layers(
    dims: Sequence[int], prefix: str = "fc", start: int = 1
) -> list[tuple[str, nn.Module]]:
    """Linear+ReLU layers mapping dims[0] -> dims[1] -> ... -> dims[-1]."""
    layers: list[tuple[str, nn.Module]] = []
    for i, (d_in, d_out) in enumerate(zip(dims[:-1], dims[1:]), start=start):
        layers.append((f"{prefix}{i}", nn.Linear(d_in, d_out)))
        layers.append((f"relu_{prefix}{i}", nn.ReLU()))
    return layers


class ConvFCNet(SplitModel):
    """Conv stack -> flatten -> fully connected stack (body) -> Linear (head).

    ``conv_layers`` is a list of ``(name, module)``; ``fc_dims`` are the hidden
    widths after flattening (the last one is ``feature_dim``);
    ``feature_dropout`` (if > 0) adds ``nn.Dropout`` at the end of the body.
    """

    def __init__(
        self,
        conv_layers: Iterable[tuple[str, nn.Module]],
        fc_dims: Sequence[int],
        in_channels: int,
        num_classes: int,
        image_size: int,
        feature_dropout: float = 0.0,
    ) -> None:
        super().__init__()
        conv_layers = list(conv_layers)
        flat_dim = int(
            torch.Size(
                _output_shape(nn.Sequential(OrderedDict(conv_layers)), in_channels, image_size)
            ).numel()
        )
        layers = conv_layers + [("flatten", nn.Flatten(1))]
        layers += _mlp_layers([flat_dim, *fc_dims])
        if feature_dropout > 0:
            layers.append(("drop", nn.Dropout(feature_dropout)))
        self.flat_dim = flat_dim
        self.feature_dim = int(fc_dims[-1]) if fc_dims else flat_dim
        self.body = nn.Sequential(OrderedDict(layers))
        self.head = nn.Linear(self.feature_dim, num_classes)
