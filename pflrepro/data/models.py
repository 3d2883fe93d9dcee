"""Model registry for image classification with an explicit backbone/head split.

Every model is a :class:`SplitModel` with

* ``model.body``: images ``(N, C, H, W)`` -> flat features ``(N, feature_dim)``
* ``model.head``: features -> logits ``(N, num_classes)`` (always one ``nn.Linear``)

so that ``model(x) == model.head(model.features(x))``.  Personalised FL methods
select parameter subsets by name with :func:`head_param_names` (FedPer, LG-FedAvg,
FedRep, FedBSD) and :func:`bn_names` (FedBN-style "BN excluded" aggregation).

Registered models (``MODELS`` keys) and where their definitions come from:

``cnn_fmnist``
    pFedSD ``CNNMnist`` (CGCL-codes/pFedSD, ``pcode/models/simple_cnns.py``):
    conv 5x5 ->64, max-pool 2, ReLU; conv 5x5 64->64, Dropout2d(0.5), max-pool 2,
    ReLU; fc ->128, ReLU; fc 128->64, ReLU; fc 64->classes.
``cnn_cifar10``
    pFedSD ``CNNCifar`` (LeNet-5 style): conv 5x5 ->6, ReLU, pool; conv 6->16, ReLU,
    pool; fc ->120 ->84 ->classes (ReLU between).  Conv and fc biases on (pFedSD's
    ``--w_conv_bias``/``--w_fc_bias`` default to True).
``cnn_cifar100``
    pFedSD ``CNNCifar100``: conv 5x5 ->64, ReLU, pool; conv 64->128, ReLU, pool;
    fc ->256, ReLU; fc 256->128, ReLU, Dropout(0.6); fc 128->classes.  (The dropout
    sits on the 128-d feature, i.e. at the end of the body.)
``cnn_ckt``
    PerFed-CKT's CNN (appendix E): "2 convolutional layers with max pooling and 4 hidden fully
    connected linear layers of units [120, 100, 84, 50]"; conv channels unstated: LeNet's 6/16 5x5.
``cnn_fedrep``
    FedRep ``CNNCifar`` (Nets.py of the FedRep code base): conv 5x5 ->64, ReLU,
    pool; conv 64->64, ReLU, pool; fc ->120 ->64 ->classes.  Some copies of that
    file apply ``Dropout(0.6)`` to the *logits* (``self.drop(self.fc3(x))``, with
    ``self.drop`` not always defined); dropout on the logits is deliberately left
    out here, because it would sit outside the body/head split.
``cnn1`` .. ``cnn5``
    FedGH ``CNN_1`` .. ``CNN_5`` (LipingYi/FedGH, ``Models/CNNs.py``): conv 5x5
    ->16, ReLU, pool; conv 16->32 (``CNN_2``: 16->16), ReLU, pool; fc1 ->2000
    (``CNN_3/4/5``: 1000/800/500), ReLU; fc2 ->500, ReLU (the 500-d
    representation); fc3 500->classes.
``cnn_bn``
    A small CNN with a BatchNorm layer after every conv and hidden fc layer (FedBSD Fig. 3's offline
    stand-in for FedBN's models: "a BN layer is added after each convolutional layer or fully-connected
    layer"): conv 5x5 ->16, BN, ReLU, pool; conv 16->32, BN, ReLU, pool; fc ->64, BN1d, ReLU; fc 64->classes.
``digits_bn``
    FedBN's ``DigitModel`` (med-air/FedBN, ``nets/models.py``), FedBSD Fig. 3's Digits model ("three
    convolutional layers and three fully-connected layers"): conv 5x5 ->64, BN, ReLU, pool; conv 5x5 64->64,
    BN, ReLU, pool; conv 5x5 64->128 (pad 2), BN, ReLU; fc ->2048, BN1d, ReLU; fc 2048->512, BN1d, ReLU;
    fc 512->classes.
``alexnet_bn``
    FedBN's ``AlexNet`` with BN (FedBSD Fig. 3's DomainNet model, 256x256 inputs): conv 11x11/4 ->64,
    conv 5x5 ->192, conv 3x3 ->384, ->256, ->256 (BN + ReLU after each, max-pools after 1, 2, 5), adaptive
    average pool 6x6; fc ->4096, BN1d, ReLU; fc 4096->4096, BN1d, ReLU; fc 4096->classes.
``mlp``
    FedRep/LG-FedAvg ``MLP``: flatten, 512, 256, 64 hidden units with ReLU, then
    64->classes (the public code has *three* hidden layers 512-256-64; the
    softmax at the end of that code is dropped, we return logits).  Hidden sizes
    are configurable via ``hidden=(...)``.
``vgg11``, ``vgg13``
    CIFAR-style VGG with BatchNorm (conv3x3-BN-ReLU blocks, 5 max-pools, 512-d
    feature, one Linear classifier).  Pools use ``ceil_mode=True`` (identical to
    floor mode for 32x32, but lets 28x28 reach 1x1) followed by a global average
    pool.
``resnet8``
    FedDF/pFedSD ``ResNet_cifar`` with depth 8: 3x3 stem (16 ch), three stages of
    one BasicBlock each (16/32/64 ch, strides 1/2/2), global average pool,
    Linear(64, classes).  Same init as pFedSD (He-normal fan-out convs, BN 1/0).
``resnet18``, ``resnet34``
    CIFAR-style ResNets (3x3 stem, no max-pool), BasicBlock [2,2,2,2] /
    [3,4,6,3], 64..512 ch, global average pool, Linear(512, classes).
``resnet50``
    torchvision's ResNet-50 layout (SCD Table 3, iNaturalist): ImageNet stem (7x7/2 conv, 3x3/2 max-pool),
    Bottleneck [3,4,6,3] (stride in the 3x3 conv), 256..2048 ch, global average pool, Linear(2048, classes);
    PyTorch's default init.
``mobilenetv2``
    CIFAR-style MobileNetV2 (stem stride 1, second stage stride 1), 1280-d
    feature, Linear(1280, classes).

All models take ``in_channels`` and ``image_size`` from the dataset; flatten
sizes are found with a dummy forward pass (eval mode, zeros, no RNG use) at
construction time.  No in-place ops are used, so models work with
``torch.func.functional_call``/``vmap``.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Iterable, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = [
    "SplitModel",
    "MODELS",
    "build_model",
    "register_model",
    "layer_param_groups",
    "head_param_names",
    "body_param_names",
    "bn_names",
    "is_bn_param",
    "count_params",
]


# ---------------------------------------------------------------------------
# Base class
# ---------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------
# Small CNNs (pFedSD, FedRep, FedGH)
# ---------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------
# VGG (CIFAR style, with BatchNorm)
# ---------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------
# ResNets (CIFAR style)
# ---------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------
# MobileNetV2 (CIFAR style)
# ---------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------
# CNNs with BatchNorm after every layer (FedBN; FedBSD Fig. 3)
# ---------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------

MODELS: dict[str, Callable[..., SplitModel]] = {
    "cnn_fmnist": cnn_fmnist,
    "cnn_cifar10": cnn_cifar10,
    "cnn_cifar100": cnn_cifar100,
    "cnn_ckt": cnn_ckt,
    "cnn_fedrep": cnn_fedrep,
    "cnn1": cnn1,
    "cnn2": cnn2,
    "cnn3": cnn3,
    "cnn4": cnn4,
    "cnn5": cnn5,
    "mlp": mlp,
    "mlp2": mlp2,
    "vgg11": vgg11,
    "vgg13": vgg13,
    "resnet8": resnet8,
    "resnet18": resnet18,
    "resnet34": resnet34,
    "resnet50": resnet50,
    "mobilenetv2": mobilenetv2,
    "cnn_bn": cnn_bn,
    "digits_bn": digits_bn,
    "alexnet_bn": alexnet_bn,
}


def register_model(name: str, builder: Callable[..., SplitModel] | None = None):
    """Register ``builder(in_channels, num_classes, image_size, **kw)``; usable as a decorator."""

    def _register(fn: Callable[..., SplitModel]) -> Callable[..., SplitModel]:
        if name in MODELS:
            raise ValueError(f"model {name!r} is already registered")
        MODELS[name] = fn
        return fn

    return _register(builder) if builder is not None else _register


def _assign_cycle(models: list, sizes: np.ndarray, n_params: dict, rng: np.random.Generator) -> list:
    """Client k gets models[k % len(models)] (a name listed twice gets twice the share)."""
    return [models[k % len(models)] for k in range(len(sizes))]


def _assign_size(models: list, sizes: np.ndarray, n_params: dict, rng: np.random.Generator) -> list:
    """PerFed-CKT Sec. 5: "the probability of a larger model getting assigned to a client is proportional to the
    client's dataset size". Ours: the m distinct models ranked by parameter count (0 = smallest); client k draws
    rank ~ Binomial(m - 1, n_k / max_j n_j), so its expected rank is proportional to its dataset size and the
    largest client draws the largest model."""
    order = sorted(dict.fromkeys(models), key=lambda m: (n_params[m], m))
    q = np.asarray(sizes, dtype=float) / max(float(np.max(sizes)), 1.0)
    return [order[r] for r in rng.binomial(len(order) - 1, q)]


ASSIGNERS: dict[str, Callable[..., list]] = {"cycle": _assign_cycle, "size": _assign_size}


def assign_models(models, sizes, assign: str, n_params: dict, seed: int) -> list:
    """Each client's architecture name (`RunConfig.models` by `model_assign`), from its training-set size."""
    return ASSIGNERS[assign](list(models), np.asarray(sizes), n_params, np.random.default_rng(seed))


def build_model(name: str, in_channels: int, num_classes: int, image_size: int, **kwargs) -> SplitModel:
    """Build registered model ``name`` for ``in_channels`` x ``image_size``^2 inputs.

    Extra keyword arguments go to the builder (e.g. ``hidden=`` for ``mlp``).
    """
    try:
        builder = MODELS[name]
    except KeyError:
        raise ValueError(
            f"unknown model {name!r}; available models: {', '.join(sorted(MODELS))}"
        ) from None
    model = builder(int(in_channels), int(num_classes), int(image_size), **kwargs)
    model.name = name
    model.in_channels = int(in_channels)
    model.num_classes = int(num_classes)
    model.image_size = int(image_size)
    return model


# ---------------------------------------------------------------------------
# Parameter-name utilities
# ---------------------------------------------------------------------------


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
