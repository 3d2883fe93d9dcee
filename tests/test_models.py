import functools

import pytest
import torch
import torch.nn as nn

from pflrepro.data.models import (
    MODELS,
    SplitModel,
    bn_names,
    body_param_names,
    build_model,
    count_params,
    head_param_names,
    is_bn_param,
    layer_param_groups,
)

SHAPES = [(1, 28), (3, 32)]
NUM_CLASSES = 10


@functools.lru_cache(maxsize=None)
def _model(name, in_channels, image_size, num_classes=NUM_CLASSES):
    torch.manual_seed(0)
    return build_model(name, in_channels, num_classes, image_size)


@pytest.mark.parametrize("in_channels,image_size", SHAPES)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_shapes_split_and_head_names(name, in_channels, image_size):
    model = _model(name, in_channels, image_size)
    assert isinstance(model, SplitModel)
    assert isinstance(model.feature_dim, int)
    model.eval()
    x = torch.randn(3, in_channels, image_size, image_size)
    with torch.no_grad():
        out = model(x)
        feats = model.features(x)
        out2 = model.head(feats)
    assert out.shape == (3, NUM_CLASSES)
    assert feats.shape == (3, model.feature_dim)
    torch.testing.assert_close(out, out2)

    head_names = [f"head.{n}" for n, _ in model.head.named_parameters()]
    assert head_param_names(model, 1) == head_names
    assert isinstance(model.head, nn.Linear)
    assert model.head.in_features == model.feature_dim
    # every parameter is either body or head
    all_names = [n for n, _ in model.named_parameters()]
    assert body_param_names(model) + head_names == all_names
    assert all(n.startswith("body.") for n in body_param_names(model))
    # layer groups cover all parameters exactly once, in named_parameters order
    assert [n for g in layer_param_groups(model) for n in g] == all_names
    assert head_param_names(model, 10_000) == all_names


@pytest.mark.parametrize("name", ["cnn_fmnist", "cnn_cifar100", "vgg11", "resnet8", "mobilenetv2"])
def test_train_mode_forward_and_backward(name):
    model = _model(name, 3, 32)
    model.train()
    try:
        out = model(torch.randn(2, 3, 32, 32))
        out.sum().backward()
    finally:
        model.zero_grad(set_to_none=True)
        model.eval()
    assert out.shape == (2, NUM_CLASSES)


# Hand-computed parameter counts (10 classes).  conv k x k: k*k*cin*cout + cout;
# linear: din*dout + dout.  Flatten size: 32 -> conv5 28 -> pool 14 -> conv5 10
# -> pool 5 (5x5); 28 -> 24 -> 12 -> 8 -> 4 (4x4).
PARAM_COUNTS = {
    # cnn_fmnist: conv1 25*c*64+64, conv2 25*64*64+64=102464, fc1 F*128+128,
    #   fc2 128*64+64=8256, head 64*10+10=650
    #   (1,28): 1664 + 102464 + 1024*128+128=131200 + 8256 + 650 = 244234
    #   (3,32): 4864 + 102464 + 1600*128+128=204928 + 8256 + 650 = 321162
    ("cnn_fmnist", 1, 28): 244234,
    ("cnn_fmnist", 3, 32): 321162,
    # cnn_cifar10: conv1 25*c*6+6, conv2 25*6*16+16=2416, fc1 F*120+120,
    #   fc2 120*84+84=10164, head 84*10+10=850
    #   (3,32): 456 + 2416 + 400*120+120=48120 + 10164 + 850 = 62006
    #   (1,28): 156 + 2416 + 256*120+120=30840 + 10164 + 850 = 44426
    ("cnn_cifar10", 3, 32): 62006,
    ("cnn_cifar10", 1, 28): 44426,
    # cnn_ckt: cnn_cifar10's convs and fc1, then 120*100+100=12100, 100*84+84=8484, 84*50+50=4250, head 50*10+10=510
    #   (3,32): 456 + 2416 + 48120 + 12100 + 8484 + 4250 + 510 = 76336
    #   (1,28): 156 + 2416 + 30840 + 12100 + 8484 + 4250 + 510 = 58756
    ("cnn_ckt", 3, 32): 76336,
    ("cnn_ckt", 1, 28): 58756,
    # cnn_cifar100: conv1 25*c*64+64, conv2 25*64*128+128=204928, fc1 F*256+256,
    #   fc2 256*128+128=32896, head 128*10+10=1290
    #   (3,32): 4864 + 204928 + 3200*256+256=819456 + 32896 + 1290 = 1063434
    #   (1,28): 1664 + 204928 + 2048*256+256=524544 + 32896 + 1290 = 765322
    ("cnn_cifar100", 3, 32): 1063434,
    ("cnn_cifar100", 1, 28): 765322,
    # cnn_fedrep: conv1 25*c*64+64, conv2 102464, fc1 F*120+120,
    #   fc2 120*64+64=7744, head 650
    #   (3,32): 4864 + 102464 + 1600*120+120=192120 + 7744 + 650 = 307842
    #   (1,28): 1664 + 102464 + 1024*120+120=123000 + 7744 + 650 = 235522
    ("cnn_fedrep", 3, 32): 307842,
    ("cnn_fedrep", 1, 28): 235522,
    # FedGH: conv1 25*c*16+16 (1216 / 416), conv2 25*16*32+32=12832
    #   (cnn2: 25*16*16+16=6416), fc1 F*H+H, fc2 H*500+500, head 500*10+10=5010
    # cnn1 (3,32): 1216 + 12832 + 800*2000+2000=1602000 + 1000500 + 5010 = 2621558
    # cnn1 (1,28): 416 + 12832 + 512*2000+2000=1026000 + 1000500 + 5010 = 2044758
    ("cnn1", 3, 32): 2621558,
    ("cnn1", 1, 28): 2044758,
    # cnn2 (3,32): 1216 + 6416 + 400*2000+2000=802000 + 1000500 + 5010 = 1815142
    # cnn2 (1,28): 416 + 6416 + 256*2000+2000=514000 + 1000500 + 5010 = 1526342
    ("cnn2", 3, 32): 1815142,
    ("cnn2", 1, 28): 1526342,
    # cnn3 (3,32): 1216 + 12832 + 800*1000+1000=801000 + 1000*500+500=500500 + 5010 = 1320558
    # cnn3 (1,28): 416 + 12832 + 512*1000+1000=513000 + 500500 + 5010 = 1031758
    ("cnn3", 3, 32): 1320558,
    ("cnn3", 1, 28): 1031758,
    # cnn4 (3,32): 1216 + 12832 + 800*800+800=640800 + 800*500+500=400500 + 5010 = 1060358
    # cnn4 (1,28): 416 + 12832 + 512*800+800=410400 + 400500 + 5010 = 829158
    ("cnn4", 3, 32): 1060358,
    ("cnn4", 1, 28): 829158,
    # cnn5 (3,32): 1216 + 12832 + 800*500+500=400500 + 500*500+500=250500 + 5010 = 670058
    # cnn5 (1,28): 416 + 12832 + 512*500+500=256500 + 250500 + 5010 = 525258
    ("cnn5", 3, 32): 670058,
    ("cnn5", 1, 28): 525258,
    # mlp 512-256-64: D*512+512, 512*256+256=131328, 256*64+64=16448, head 650
    #   (1,28): 784*512+512=401920 + 131328 + 16448 + 650 = 550346
    #   (3,32): 3072*512+512=1573376 + 131328 + 16448 + 650 = 1721802
    ("mlp", 1, 28): 550346,
    ("mlp", 3, 32): 1721802,
    # resnet8 (3,32): stem 27*16=432 + bn 32; stage1 2*(9*16*16) + 2*32 = 4672;
    #   stage2 9*16*32 + 9*32*32 + 16*32 + 3*64 = 14528;
    #   stage3 9*32*64 + 9*64*64 + 32*64 + 3*128 = 57728; head 64*10+10 = 650
    #   total 432 + 32 + 4672 + 14528 + 57728 + 650 = 78042
    ("resnet8", 3, 32): 78042,
    ("resnet8", 1, 28): 78042 - 2 * 9 * 16,
    # Well-known CIFAR-style counts (e.g. kuangliu/pytorch-cifar, 10 classes).
    ("vgg11", 3, 32): 9231114,
    ("vgg13", 3, 32): 9416010,
    ("resnet18", 3, 32): 11173962,
    ("resnet34", 3, 32): 21282122,
    ("mobilenetv2", 3, 32): 2296922,
    # torchvision's resnet50(num_classes=10): 23,528,522 (the same layout, see the test below)
    ("resnet50", 3, 32): 23528522,
    # mlp2 (1,28): 784*512+512 + 512*256+256 + 256*10+10 = 401920 + 131328 + 2570
    ("mlp2", 1, 28): 535818,
}


def test_resnet50_is_torchvisions_layout():
    """SCD Table 3's ResNet-50 (iNaturalist's 5,089 classes): every parameter and buffer has torchvision's shape,
    in torchvision's order (stem, four Bottleneck stages, fc), so torchvision's weights would load by position."""
    import torchvision
    ours = build_model("resnet50", 3, 5089, 64)
    ref = torchvision.models.resnet50(num_classes=5089)
    assert [tuple(t.shape) for t in ours.state_dict().values()] == [tuple(t.shape) for t in ref.state_dict().values()]
    x = torch.zeros(2, 3, 64, 64)
    assert ours.features(x).shape == (2, 2048) and ours.eval()(x).shape == (2, 5089)


@pytest.mark.parametrize("key", sorted(PARAM_COUNTS))
def test_param_counts(key):
    name, c, s = key
    assert count_params(_model(name, c, s)) == PARAM_COUNTS[key]


def test_cnn_cifar100_with_100_classes():
    # head 128*100+100 = 12900 instead of 1290
    assert count_params(build_model("cnn_cifar100", 3, 100, 32)) == 1063434 - 1290 + 12900


@pytest.mark.parametrize("name", ["cnn1", "cnn2", "cnn3", "cnn4", "cnn5"])
@pytest.mark.parametrize("in_channels,image_size", SHAPES)
def test_fedgh_feature_dim(name, in_channels, image_size):
    model = _model(name, in_channels, image_size)
    assert model.feature_dim == 500
    assert model.head.in_features == 500


def test_fedper_last_two_layers_cnn_fmnist():
    model = _model("cnn_fmnist", 1, 28)
    names = head_param_names(model, 2)
    assert names == ["body.fc2.weight", "body.fc2.bias", "head.weight", "head.bias"]
    params = dict(model.named_parameters())
    assert params["body.fc2.weight"].shape == (64, 128)
    assert params["head.weight"].shape == (NUM_CLASSES, 64)
    assert head_param_names(model, 0) == []
    with pytest.raises(ValueError):
        head_param_names(model, -1)


def test_unknown_model_raises():
    with pytest.raises(ValueError) as info:
        build_model("no_such_net", 3, 10, 32)
    msg = str(info.value)
    assert "no_such_net" in msg
    for name in MODELS:
        assert name in msg


def test_bn_names():
    for name in ["vgg11", "resnet8"]:
        model = _model(name, 3, 32)
        names = bn_names(model)
        assert names
        assert names <= set(model.state_dict())
        assert any(n.endswith("running_mean") for n in names)
        assert any(n.endswith("num_batches_tracked") for n in names)
        assert not any(n.startswith("head.") for n in names)
        assert all("conv" not in n.rsplit(".", 2)[-2] for n in names)
    resnet8 = _model("resnet8", 3, 32)
    assert is_bn_param("body.bn1.weight", resnet8)
    assert is_bn_param("body.bn1.running_var", resnet8)
    assert not is_bn_param("body.conv1.weight", resnet8)
    assert bn_names(_model("cnn_cifar10", 3, 32)) == set()
    assert bn_names(_model("cnn_cifar10", 1, 28)) == set()


def test_in_channels_follow_dataset():
    for name in MODELS:
        first = next(m for m in _model(name, 1, 28).modules() if isinstance(m, (nn.Conv2d, nn.Linear)))
        if isinstance(first, nn.Conv2d):
            assert first.in_channels == 1
        else:
            assert first.in_features == 28 * 28


def test_deterministic_given_seed():
    x = torch.randn(2, 3, 32, 32)
    outs = []
    for _ in range(2):
        torch.manual_seed(123)
        m = build_model("resnet8", 3, 10, 32).eval()
        outs.append(m(x))
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)


def test_mlp_hidden_kwarg():
    m = build_model("mlp", 1, 10, 28, hidden=(200, 100))
    assert m.feature_dim == 100
    assert count_params(m) == 784 * 200 + 200 + 200 * 100 + 100 + 100 * 10 + 10


def test_too_small_image_raises():
    with pytest.raises(ValueError):
        build_model("cnn_cifar10", 3, 10, 8)


@pytest.mark.parametrize("name", ["cnn_cifar10", "resnet8"])
def test_functional_call_and_vmap(name):
    from torch.func import functional_call, stack_module_state, vmap

    model = _model(name, 3, 32).eval()
    x = torch.randn(4, 3, 32, 32)
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    with torch.no_grad():
        ref = model(x)
        out = functional_call(model, {**params, **buffers}, (x,))
        torch.testing.assert_close(out, ref)

        # a population of 3 clients, each with its own copy of the model
        clients = [build_model(name, 3, 10, 32).eval() for _ in range(3)]
        p, b = stack_module_state(clients)

        def f(pi, bi, xi):
            return functional_call(model, {**pi, **bi}, (xi,))

        outs = vmap(f, in_dims=(0, 0, None))(p, b, x)
        assert outs.shape == (3, 4, NUM_CLASSES)
        torch.testing.assert_close(outs[1], clients[1](x), rtol=1e-4, atol=1e-5)
