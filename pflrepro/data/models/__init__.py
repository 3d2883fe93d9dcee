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

from typing import Callable

import numpy as np

from .base import ConvFCNet, SplitModel
from .small import (cnn1, cnn2, cnn3, cnn4, cnn5, cnn_cifar10, cnn_cifar100, cnn_ckt, cnn_fedrep, cnn_fmnist, MLP, mlp,
                    mlp2)
from .vgg import VGG, vgg11, vgg13
from .resnet import BasicBlock, Bottleneck, ResNet, resnet18, resnet34, resnet50, resnet8, ResNetBody
from .mobilenet import InvertedResidual, MobileNetV2, mobilenetv2
from .bn import alexnet_bn, BatchNorm1dAnyBatch, cnn_bn, ConvBNNet, digits_bn
from .names import bn_names, body_param_names, count_params, head_param_names, is_bn_param, layer_param_groups

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
    "ASSIGNERS",
    "assign_models",
    # the architectures and their parts, re-exported from the family modules
    "ConvFCNet", "MLP", "VGG", "ResNet", "ResNetBody", "BasicBlock", "Bottleneck", "MobileNetV2", "InvertedResidual",
    "ConvBNNet", "BatchNorm1dAnyBatch", *(
        "cnn_fmnist cnn_cifar10 cnn_cifar100 cnn_ckt cnn_fedrep cnn1 cnn2 cnn3 cnn4 cnn5 mlp mlp2 vgg11 vgg13 resnet8 "
        "resnet18 resnet34 resnet50 mobilenetv2 cnn_bn digits_bn alexnet_bn").split(),
]


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
