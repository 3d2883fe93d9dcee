"""Datasets: offline Fashion-MNIST checks, stand-ins, and the error for a missing dataset."""
import pytest
import torch

from pflrepro.data.datasets import SPECS, DatasetUnavailable, load_dataset
from tests.conftest import FMNIST_AVAILABLE


@pytest.mark.skipif(not FMNIST_AVAILABLE, reason="Debian dataset-fashion-mnist not installed")
def test_fmnist_offline_shapes_counts():
    ds = load_dataset("fmnist")
    assert ds.x_train.shape == (60000, 1, 28, 28) and ds.x_train.dtype == torch.uint8
    assert ds.x_test.shape == (10000, 1, 28, 28)
    assert ds.y_train.bincount().tolist() == [6000] * 10
    assert ds.y_test.bincount().tolist() == [1000] * 10
    assert "fashion-mnist" in ds.source


@pytest.mark.parametrize("name", ["fake-cifar10", "fake-cifar100", "fake-fmnist", "fake-svhn"])
def test_standins_match_real_shapes(name):
    ds = load_dataset(name, fake_scale=0.01)
    real = SPECS[name[5:]]
    assert ds.x_train.shape[1:] == (real.channels, real.size, real.size)
    assert int(ds.y_train.max()) == real.num_classes - 1
    again = load_dataset(name, fake_scale=0.01)
    assert torch.equal(ds.x_train, again.x_train)  # deterministic


def test_missing_dataset_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("PFLREPRO_DATA", str(tmp_path))
    with pytest.raises(DatasetUnavailable) as e:
        load_dataset("cifar10", download=False)
    msg = str(e.value)
    assert "cifar10" in msg and str(tmp_path) in msg and "download=True" in msg


def test_unknown_dataset():
    with pytest.raises(ValueError, match="available"):
        load_dataset("imagenet")


def test_large_standins_keep_the_image_shape_and_classes_with_fewer_images():
    """iNaturalist's 675,000 images at 64 px would be 8 GB: its stand-in keeps the shape and the 5,089 classes
    (two training images and one test image a class)."""
    real, fake = SPECS["inaturalist"], SPECS["fake-inaturalist"]
    assert (fake.channels, fake.size, fake.num_classes) == (3, 64, 5089) == (real.channels, real.size, real.num_classes)
    assert (real.n_train, real.n_test) == (579184, 95986) and (fake.n_train, fake.n_test) == (2 * 5089, 5089)
    ds = load_dataset("fake-inaturalist")
    assert ds.x_train.shape == (2 * 5089, 3, 64, 64) and ds.y_train.bincount().tolist() == [2] * 5089


def _tiny_spec(name, **kw):
    import dataclasses
    return dataclasses.replace(SPECS[name], **kw)


def test_inaturalist_loader_reads_the_coco_files_resizes_and_caches(tmp_path, monkeypatch):
    """The official layout (annotation json + image folder) on three tiny images: shorter side to `size`, centre
    crop, labels from the annotations, train and val halves, and the tensor cache written for the next load."""
    import json

    import numpy as np
    from PIL import Image

    from pflrepro.data import datasets as data
    root = tmp_path / "inaturalist"
    (root / "train_val_images" / "Aves").mkdir(parents=True)
    specs = {"train2017.json": [(7, (12, 8), 2), (3, (8, 8), 0)], "val2017.json": [(5, (8, 16), 1)]}
    for ann, images in specs.items():
        meta = {"images": [], "annotations": []}
        for img_id, (w, h), label in images:
            rgb = np.zeros((h, w, 3), np.uint8)
            rgb[:, w // 2:] = 200                     # right half bright
            fname = f"train_val_images/Aves/{img_id}.png"
            Image.fromarray(rgb).save(root / fname)
            meta["images"].append({"id": img_id, "file_name": fname, "width": w, "height": h})
            meta["annotations"].append({"id": img_id, "image_id": img_id, "category_id": label})
        (root / ann).write_text(json.dumps(meta))
    monkeypatch.setenv("PFLREPRO_DATA", str(tmp_path))
    monkeypatch.setenv("PFLREPRO_TENSOR_CACHE", str(tmp_path / "cache"))
    spec = _tiny_spec("inaturalist", size=4, num_classes=3, n_train=2, n_test=1)
    ds = data._load_inaturalist(spec)
    assert ds.x_train.shape == (2, 3, 4, 4) and ds.x_test.shape == (1, 3, 4, 4)
    assert ds.y_train.tolist() == [0, 2] and ds.y_test.tolist() == [1]      # id order: image 3, then image 7
    # image 7 is 12x8: scaled to 6x4, cropped to columns 1..4 of it, so the left two stay dark and the right two bright
    assert ds.x_train[1, :, :, :2].max() < 60 and ds.x_train[1, :, :, 2:].min() > 140
    assert (tmp_path / "cache" / "inaturalist.pt").exists()
    # decoded by threads a block at a time: the same tensor whatever the threads and block size
    one = data._read_coco_split(root, "train2017.json", 4, workers=1, block=1)
    many = data._read_coco_split(root, "train2017.json", 4, workers=3, block=2)
    assert torch.equal(one[0], many[0]) and torch.equal(one[0], ds.x_train) and torch.equal(one[1], many[1])
    # the real set's counts are checked: two images where the spec says three is an error
    with pytest.raises(DatasetUnavailable, match=r"shapes \(2, 3, 4, 4\)"):
        data._load_inaturalist(_tiny_spec("inaturalist", size=4, num_classes=3, n_train=3, n_test=1))
    with pytest.raises(DatasetUnavailable, match="train2017.json"):
        monkeypatch.setenv("PFLREPRO_DATA", str(tmp_path / "nothing"))
        data._load_inaturalist(spec)


def test_leaf_femnist_loader_keeps_letters_a_to_j_and_makes_ink_bright(tmp_path, monkeypatch):
    """LEAF's json (users, user_data with 784-float rows in [0, 1] on a white background): labels 36-45 (a-j) kept
    as 0-9, every other label dropped, pixels inverted to EMNIST's dark background and scaled to uint8."""
    import json

    from pflrepro.data import datasets as data
    white = [1.0] * 784
    ink = [1.0] * 783 + [0.0]                       # one black pixel, last
    for half, users in {"train": {"u1": ([white, ink, white], [36, 45, 5]), "u2": ([ink], [40])},
                        "test": {"u1": ([white], [37])}}.items():
        folder = tmp_path / "femnist" / "data" / half
        folder.mkdir(parents=True)
        blob = {"users": list(users), "num_samples": [len(y) for _, y in users.values()],
                "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()}}
        (folder / "all_data_0.json").write_text(json.dumps(blob))
    monkeypatch.setenv("PFLREPRO_DATA", str(tmp_path))
    ds = data._load_leaf_femnist(SPECS["femnist"])
    assert ds.y_train.tolist() == [0, 9, 4] and ds.y_test.tolist() == [1]     # label 5 (a digit) dropped
    assert ds.x_train.shape == (3, 1, 28, 28) and ds.x_train.dtype == torch.uint8
    assert ds.x_train[0].max() == 0                                         # white page -> 0
    assert ds.x_train[1].flatten()[-1] == 255 and ds.x_train[1].flatten()[:-1].max() == 0
    monkeypatch.setenv("PFLREPRO_DATA", str(tmp_path / "nothing"))
    with pytest.raises(DatasetUnavailable, match="preprocess.sh"):
        data._load_leaf_femnist(SPECS["femnist"])


@pytest.mark.skipif(not FMNIST_AVAILABLE, reason="Debian dataset-fashion-mnist not installed")
@pytest.mark.parametrize("pool", ["train", "train+test"])
def test_a_run_with_extra_tests_trains_on_the_same_images_and_tests_on_more(pool):
    """`split_params.extra_test` through the run's data: every client's training tensors are the same images, its test
    set has `extra_test` more (which images: tests/test_partition.py); with pool train+test the GM's test set (the
    union of the clients' tests) grows with them."""
    from pflrepro.federation.build import build_data
    from pflrepro.federation.config import RunConfig
    base = {"dataset": "fmnist", "subsample": 0.02, "n_clients": 5, "partition": "dirichlet", "pool": pool,
            "partition_params": {"alpha": 0.5}, "split": "random", "model": "mlp"}
    plain = build_data(RunConfig.from_dict(base), torch.device("cpu"))
    cfg = RunConfig.from_dict({**base, "split_params": {"extra_test": 40}})
    assert cfg.split_params["extra_test"] == 40
    more = build_data(cfg, torch.device("cpu"))
    for k in range(5):
        assert torch.equal(plain.client_train(k)[0], more.client_train(k)[0])
        assert len(more.client_test(k)[1]) == len(plain.client_test(k)[1]) + 40
    if pool == "train+test":
        assert len(more.y_test) == len(plain.y_test) + 5 * 40
