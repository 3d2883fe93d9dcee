"""CIFAR-style MobileNetV2."""
from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn as nn
import torch.nn.functional as F

from .base import SplitModel, _output_shape


class InvertedResidual(nn.Module):
    def __init__(self, in_planes: int, out_planes: int, expansion: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        planes = expansion * in_planes
        self.conv1 = nn.Conv2d(in_planes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, groups=planes, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out_planes, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_planes)
        self.shortcut = nn.Sequential()
        if stride == 1 and in_planes != out_planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, out_planes, 1, bias=False),
                nn.BatchNorm2d(out_planes),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.stride == 1:
            out = out + self.shortcut(x)
        return out


# (expansion, out_planes, num_blocks, stride); stride of stage 2 is 1 for CIFAR.
_MOBILENETV2_CFG = [
    (1, 16, 1, 1),
    (6, 24, 2, 1),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
]


class MobileNetV2(SplitModel):
    def __init__(self, in_channels: int, num_classes: int, image_size: int) -> None:
        super().__init__()
        blocks: list[nn.Module] = []
        c = 32
        for expansion, out_planes, n, stride in _MOBILENETV2_CFG:
            for j in range(n):
                blocks.append(InvertedResidual(c, out_planes, expansion, stride if j == 0 else 1))
                c = out_planes
        body = nn.Sequential(
            OrderedDict(
                [
                    ("conv1", nn.Conv2d(in_channels, 32, 3, stride=1, padding=1, bias=False)),
                    ("bn1", nn.BatchNorm2d(32)),
                    ("relu1", nn.ReLU()),
                    ("layers", nn.Sequential(*blocks)),
                    ("conv2", nn.Conv2d(c, 1280, 1, bias=False)),
                    ("bn2", nn.BatchNorm2d(1280)),
                    ("relu2", nn.ReLU()),
                    ("pool", nn.AdaptiveAvgPool2d(1)),
                    ("flatten", nn.Flatten(1)),
                ]
            )
        )
        _output_shape(body, in_channels, image_size)
        self.feature_dim = 1280
        self.body = body
        self.head = nn.Linear(1280, num_classes)


def mobilenetv2(in_channels: int, num_classes: int, image_size: int) -> SplitModel:
    return MobileNetV2(in_channels, num_classes, image_size)
