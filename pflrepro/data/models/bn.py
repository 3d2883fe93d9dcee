"""Networks with a BatchNorm after every layer (FedBN's models, FedBSD Fig. 3)."""
from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from .base import SplitModel, _output_shape


def _conv_bn(name: str, c_in: int, c_out: int, k: int, pool: bool, **kw) -> list[tuple[str, nn.Module]]:
    layers = [(f"conv{name}", nn.Conv2d(c_in, c_out, k, **kw)), (f"bn{name}", nn.BatchNorm2d(c_out)),
              (f"relu{name}", nn.ReLU())]
    return layers + ([(f"pool{name}", nn.MaxPool2d(2, 2))] if pool else [])


class BatchNorm1dAnyBatch(nn.BatchNorm1d):
    """BatchNorm1d that accepts a training batch of one sample (torch refuses it: no variance to estimate; a
    client's last batch can hold one image) by normalising it with the running statistics, left unchanged.
    Any larger batch is plain BatchNorm1d."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and x.shape[0] == 1:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)
        return super().forward(x)


class ConvBNNet(SplitModel):
    """Conv stack -> flatten -> (Linear, BatchNorm1d, ReLU)* (body) -> Linear (head)."""

    def __init__(self, conv_layers, fc_dims: Sequence[int], in_channels: int, num_classes: int,
                 image_size: int) -> None:
        super().__init__()
        conv_layers = list(conv_layers)
        flat_dim = int(torch.Size(_output_shape(nn.Sequential(OrderedDict(conv_layers)), in_channels,
                                                image_size)).numel())
        layers = conv_layers + [("flatten", nn.Flatten(1))]
        for i, (d_in, d_out) in enumerate(zip([flat_dim, *fc_dims[:-1]], fc_dims), start=1):
            layers += [(f"fc{i}", nn.Linear(d_in, d_out)), (f"bn_fc{i}", BatchNorm1dAnyBatch(d_out)),
                       (f"relu_fc{i}", nn.ReLU())]
        self.feature_dim = int(fc_dims[-1])
        self.body = nn.Sequential(OrderedDict(layers))
        self.head = nn.Linear(self.feature_dim, num_classes)


def cnn_bn(in_channels: int, num_classes: int, image_size: int) -> SplitModel:
    conv = _conv_bn("1", in_channels, 16, 5, True) + _conv_bn("2", 16, 32, 5, True)
    return ConvBNNet(conv, [64], in_channels, num_classes, image_size)


def digits_bn(in_channels: int, num_classes: int, image_size: int) -> SplitModel:
    conv = (_conv_bn("1", in_channels, 64, 5, True, stride=1, padding=2) + _conv_bn("2", 64, 64, 5, True, padding=2)
            + _conv_bn("3", 64, 128, 5, False, padding=2))
    return ConvBNNet(conv, [2048, 512], in_channels, num_classes, image_size)


def alexnet_bn(in_channels: int, num_classes: int, image_size: int) -> SplitModel:
    """FedBN's AlexNet at 256x256 exactly; on inputs too small for a 3x3/2 max-pool (tests build every model at
    28x28) that pool is left out, so the same builder serves the shape checks."""
    side = (image_size + 4 - 11) // 4 + 1

    def pool(name):
        nonlocal side
        if side < 3:
            return []
        side = (side - 3) // 2 + 1
        return [(name, nn.MaxPool2d(3, 2))]
    conv = _conv_bn("1", in_channels, 64, 11, False, stride=4, padding=2) + pool("pool1")
    conv += _conv_bn("2", 64, 192, 5, False, padding=2) + pool("pool2")
    conv += (_conv_bn("3", 192, 384, 3, False, padding=1) + _conv_bn("4", 384, 256, 3, False, padding=1)
             + _conv_bn("5", 256, 256, 3, False, padding=1) + pool("pool5") + [("avgpool", nn.AdaptiveAvgPool2d((6, 6)))])
    return ConvBNNet(conv, [4096, 4096], in_channels, num_classes, image_size)
