"""CIFAR-style VGG with BatchNorm."""
from __future__ import annotations

from typing import Sequence

import torch.nn as nn

from .base import SplitModel, _output_shape


_VGG_CFG = {
    "vgg11": [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "vgg13": [64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
}


class VGG(SplitModel):
    def __init__(self, cfg: Sequence, in_channels: int, num_classes: int, image_size: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c = in_channels
        for v in cfg:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2, ceil_mode=True))
            else:
                layers += [nn.Conv2d(c, v, kernel_size=3, padding=1), nn.BatchNorm2d(v), nn.ReLU()]
                c = v
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(1)]
        body = nn.Sequential(*layers)
        _output_shape(body, in_channels, image_size)  # validates the input size
        self.feature_dim = c
        self.body = body
        self.head = nn.Linear(c, num_classes)


def vgg11(in_channels: int, num_classes: int, image_size: int) -> SplitModel:
    return VGG(_VGG_CFG["vgg11"], in_channels, num_classes, image_size)


def vgg13(in_channels: int, num_classes: int, image_size: int) -> SplitModel:
    return VGG(_VGG_CFG["vgg13"], in_channels, num_classes, image_size)
