"""Small CNNs and MLPs: pFedSD's, LeNet-size, PerFed-CKT's, FedRep's, FedGH's CNN_1..5 (DC-PFL), FedRep's MLP."""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Sequence

import torch.nn as nn

from .base import ConvFCNet, SplitModel, _mlp_layers


def cnn_fmnist(in_channels: int, num_classes: int, image_size: int) -> SplitModel:
    # pFedSD CNNMnist: relu(maxpool(conv1)); relu(maxpool(dropout2d(conv2))).
    conv = [
        ("conv1", nn.Conv2d(in_channels, 64, kernel_size=5)),
        ("pool1", nn.MaxPool2d(2)),
        ("relu1", nn.ReLU()),
        ("conv2", nn.Conv2d(64, 64, kernel_size=5)),
        ("drop2", nn.Dropout2d(0.5)),
        ("pool2", nn.MaxPool2d(2)),
        ("relu2", nn.ReLU()),
    ]
    return ConvFCNet(conv, [128, 64], in_channels, num_classes, image_size)


def _lenet_conv(in_channels: int, c1: int, c2: int) -> list[tuple[str, nn.Module]]:
    # conv -> ReLU -> max-pool, twice (pool(relu(conv(x))) as in pFedSD/FedRep/FedGH).
    return [
        ("conv1", nn.Conv2d(in_channels, c1, kernel_size=5)),
        ("relu1", nn.ReLU()),
        ("pool1", nn.MaxPool2d(2, 2)),
        ("conv2", nn.Conv2d(c1, c2, kernel_size=5)),
        ("relu2", nn.ReLU()),
        ("pool2", nn.MaxPool2d(2, 2)),
    ]


def cnn_cifar10(in_channels: int, num_classes: int, image_size: int) -> SplitModel:
    return ConvFCNet(_lenet_conv(in_channels, 6, 16), [120, 84], in_channels, num_classes, image_size)


def cnn_ckt(in_channels: int, num_classes: int, image_size: int) -> SplitModel:
    return ConvFCNet(_lenet_conv(in_channels, 6, 16), [120, 100, 84, 50], in_channels, num_classes, image_size)


def cnn_cifar100(
    in_channels: int, num_classes: int, image_size: int, dropout: float = 0.6
) -> SplitModel:
    return ConvFCNet(
        _lenet_conv(in_channels, 64, 128),
        [256, 128],
        in_channels,
        num_classes,
        image_size,
        feature_dropout=dropout,
    )


def cnn_fedrep(in_channels: int, num_classes: int, image_size: int) -> SplitModel:
    return ConvFCNet(_lenet_conv(in_channels, 64, 64), [120, 64], in_channels, num_classes, image_size)


def _fedgh_cnn(conv2_out: int, fc1: int) -> Callable[..., SplitModel]:
    def build(in_channels: int, num_classes: int, image_size: int) -> SplitModel:
        return ConvFCNet(
            _lenet_conv(in_channels, 16, conv2_out), [fc1, 500], in_channels, num_classes, image_size
        )

    return build


cnn1 = _fedgh_cnn(32, 2000)  # FedGH CNN_1
cnn2 = _fedgh_cnn(16, 2000)  # FedGH CNN_2: fewer conv2 filters
cnn3 = _fedgh_cnn(32, 1000)  # FedGH CNN_3: narrower fc1
cnn4 = _fedgh_cnn(32, 800)  # FedGH CNN_4
cnn5 = _fedgh_cnn(32, 500)  # FedGH CNN_5


class MLP(SplitModel):
    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        image_size: int,
        hidden: Sequence[int] = (512, 256, 64),
    ) -> None:
        super().__init__()
        if not hidden:
            raise ValueError("mlp needs at least one hidden layer")
        d_in = in_channels * image_size * image_size
        layers = [("flatten", nn.Flatten(1))] + _mlp_layers([d_in, *hidden])
        self.feature_dim = int(hidden[-1])
        self.body = nn.Sequential(OrderedDict(layers))
        self.head = nn.Linear(self.feature_dim, num_classes)


def mlp(in_channels: int, num_classes: int, image_size: int, hidden: Sequence[int] = (512, 256, 64)) -> SplitModel:
    return MLP(in_channels, num_classes, image_size, hidden=hidden)


def mlp2(in_channels: int, num_classes: int, image_size: int) -> SplitModel:
    return MLP(in_channels, num_classes, image_size, hidden=(512, 256))
