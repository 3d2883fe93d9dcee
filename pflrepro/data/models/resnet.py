"""ResNets: FedDF/pFedSD's ResNet-8, CIFAR-style ResNet-18/34, torchvision's ResNet-50 layout."""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from .base import SplitModel, _output_shape


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out = out + self.shortcut(x)
        return F.relu(out)


class Bottleneck(nn.Module):
    """ResNet-50's block: 1x1 reduce, 3x3 (stride here, as torchvision), 1x1 expand by 4, projection shortcut."""
    expansion = 4

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(in_planes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != out:
            self.shortcut = nn.Sequential(nn.Conv2d(in_planes, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + self.shortcut(x))


class ResNetBody(nn.Module):
    """Stem, stages of ``block``, global average pool. ``imagenet_stem``: 7x7/2 conv and 3x3/2 max-pool (torchvision's
    ResNets, for ImageNet-like inputs); otherwise the CIFAR stem (3x3/1 conv, no pool)."""

    def __init__(
        self,
        in_channels: int,
        widths: Sequence[int],
        blocks: Sequence[int],
        strides: Sequence[int],
        block: type = BasicBlock,
        imagenet_stem: bool = False,
    ) -> None:
        super().__init__()
        k, s, p = (7, 2, 3) if imagenet_stem else (3, 1, 1)
        self.conv1 = nn.Conv2d(in_channels, widths[0], k, stride=s, padding=p, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.stem_pool = nn.MaxPool2d(3, stride=2, padding=1) if imagenet_stem else nn.Identity()
        in_planes = widths[0]
        for i, (w, n, st) in enumerate(zip(widths, blocks, strides), start=1):
            stage = []
            for j in range(n):
                stage.append(block(in_planes, w, st if j == 0 else 1))
                in_planes = w * block.expansion
            self.add_module(f"layer{i}", nn.Sequential(*stage))
        self.num_stages = len(widths)
        self.out_dim = in_planes
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.stem_pool(F.relu(self.bn1(self.conv1(x))))
        for i in range(1, self.num_stages + 1):
            out = getattr(self, f"layer{i}")(out)
        return torch.flatten(self.pool(out), 1)


class ResNet(SplitModel):
    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        image_size: int,
        widths: Sequence[int],
        blocks: Sequence[int],
        strides: Sequence[int],
        pfedsd_init: bool = False,
        **body_kw,
    ) -> None:
        super().__init__()
        body = ResNetBody(in_channels, widths, blocks, strides, **body_kw)
        _output_shape(body, in_channels, image_size)
        self.feature_dim = body.out_dim
        self.body = body
        self.head = nn.Linear(body.out_dim, num_classes)
        if pfedsd_init:
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                elif isinstance(m, nn.BatchNorm2d):
                    nn.init.ones_(m.weight)
                    nn.init.zeros_(m.bias)


def resnet8(in_channels: int, num_classes: int, image_size: int) -> SplitModel:
    return ResNet(in_channels, num_classes, image_size, (16, 32, 64), (1, 1, 1), (1, 2, 2), pfedsd_init=True)


def resnet18(in_channels: int, num_classes: int, image_size: int) -> SplitModel:
    return ResNet(in_channels, num_classes, image_size, (64, 128, 256, 512), (2, 2, 2, 2), (1, 2, 2, 2))


def resnet34(in_channels: int, num_classes: int, image_size: int) -> SplitModel:
    return ResNet(in_channels, num_classes, image_size, (64, 128, 256, 512), (3, 4, 6, 3), (1, 2, 2, 2))


def resnet50(in_channels: int, num_classes: int, image_size: int) -> SplitModel:
    return ResNet(in_channels, num_classes, image_size, (64, 128, 256, 512), (3, 4, 6, 3), (1, 2, 2, 2),
                  block=Bottleneck, imagenet_stem=True)
