"""Datasets as tensors, a registry, offline Fashion-MNIST and deterministic stand-ins.

A dataset is held once as uint8 images (N, C, H, W) plus int64 labels for the train
and test halves; `FedData` then normalises once to float32 and clients index into it.
No DataLoader anywhere: a client's batch is `x[idx]`.

Lookup order for a real dataset:
0. The tensor cache data/<name>.pt written by the DVC `data` stage (uint8 tensors); Fashion-MNIST's is checked
   against its source's digests before it is read, and rebuilt from the checked source when it differs.
1. Fashion-MNIST only: the Debian package `dataset-fashion-mnist`
   (IDX .gz under /usr/share/datasets/fashion-mnist/, checked by decoded content).
2. A torchvision root (`$PFLREPRO_DATA`, default `~/.cache/pflrepro/data`) that
   already holds the files.
3. torchvision's download (only if `download=True`; fails offline).
Anything else raises `DatasetUnavailable` saying what to install or where to put files.

A set without a torchvision class carries its own `loader` in its spec (tried after the tensor cache):
`inaturalist` (SCD Table 3) decodes the official iNaturalist-2017 release once, resized to 64 px, and writes the
cache; `femnist` (FedBSD Table 1) reads LEAF's json files, letters a-j. A set too large to synthesise at full size
names a smaller `stand_in` count (same image shape and classes).

A multi-domain dataset (FedBSD Fig. 3: one domain per client) names its `domains` and carries its own
`loader` in its spec; its `RawDataset` gives every image's domain (`d_train`, `d_test`), which the
`by_domain` partitioner reads. `fmnist-domains` is built offline from Fashion-MNIST; `digits` and
`domainnet` read files the user puts under `$PFLREPRO_DATA` (see their loaders).
"""
from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..params import did_you_mean
from ..paths import sweep_stale_tmp, write_atomic

DEBIAN_FMNIST = Path("/usr/share/datasets/fashion-mnist")

# sha256 of the *decoded* uint8 arrays (the Debian files are recompressed, so the
# upstream .gz md5s differ; the decoded content must not).
FMNIST_SHA256 = {
    "train-images-idx3-ubyte.gz": "2e487a6c89124f78f2d7521542223cafe96f7123c3ca13d447772ac6ecbb3012",
    "train-labels-idx1-ubyte.gz": "657fbd221bfc9f4198cc14b5619cc33ec57c58dd0e47af4d99d6650759e869a7",
    "t10k-images-idx3-ubyte.gz": "c867c93ff95360594e8ec3287995350b824dd110b11595c0e13d5423f621867a",
    "t10k-labels-idx1-ubyte.gz": "3d0e6c6ea990b53b6f8f500a41cac93881d981b315f84578b7d915342ade01e9",
}


class DatasetUnavailable(RuntimeError):
    """A dataset is neither on disk nor downloadable: the message says what to do."""


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    channels: int
    size: int
    num_classes: int
    n_train: int
    n_test: int
    mean: tuple
    std: tuple
    torchvision_cls: str | None = None
    domains: tuple = ()                  # a multi-domain set: its domains' names, in client order
    loader: Callable | None = None       # loader(spec) -> RawDataset, for sets without a torchvision class
    stand_in: tuple | None = None        # (n_train, n_test) of the stand-in where the real counts are too many to
                                         # synthesise (per-image shape and classes stay the real set's)
    exact_counts: bool = True            # n_train/n_test are the real set's counts, checked on load; False where
                                         # the files decide them (LEAF's sampling options, user-prepared domains)


SPECS = {
    s.name: s
    for s in [
        DatasetSpec("fmnist", 1, 28, 10, 60000, 10000, (0.2860,), (0.3530,), "FashionMNIST"),
        DatasetSpec("mnist", 1, 28, 10, 60000, 10000, (0.1307,), (0.3081,), "MNIST"),
        DatasetSpec("emnist", 1, 28, 62, 697932, 116323, (0.1736,), (0.3317,), "EMNIST"),
        DatasetSpec("cifar10", 3, 32, 10, 50000, 10000, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616), "CIFAR10"),
        DatasetSpec("cifar100", 3, 32, 100, 50000, 10000, (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762), "CIFAR100"),
        DatasetSpec("svhn", 3, 32, 10, 73257, 26032, (0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970), "SVHN"),
    ]
}


def _add_stand_ins() -> None:
    """Stand-ins: same shapes, class counts (and domains) as the real set, deterministic content."""
    for n in [n for n in SPECS if not n.startswith("fake-")]:
        spec = SPECS[n]
        n_tr, n_te = spec.stand_in or (spec.n_train, spec.n_test)
        SPECS[f"fake-{n}"] = dataclasses.replace(spec, name=f"fake-{n}", torchvision_cls=None, loader=None,
                                                 n_train=n_tr, n_test=n_te, stand_in=None)


@dataclass
class RawDataset:
    """uint8 images (N, C, H, W) and int64 labels, train and test halves."""
    spec: DatasetSpec
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    source: str
    d_train: torch.Tensor | None = None   # multi-domain sets: each image's domain (index into spec.domains)
    d_test: torch.Tensor | None = None

    def pooled(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Train and test concatenated (pFedSD partitions the union)."""
        return torch.cat([self.x_train, self.x_test]), torch.cat([self.y_train, self.y_test])

    def domains(self, pool: str) -> torch.Tensor | None:
        """Each pool image's domain (`pool` 'train' or 'train+test'), None for a single-domain set."""
        if self.d_train is None:
            return None
        return self.d_train if pool == "train" else torch.cat([self.d_train, self.d_test])


def data_root() -> Path:
    return Path(os.environ.get("PFLREPRO_DATA", Path.home() / ".cache" / "pflrepro" / "data"))


def read_idx_gz(path: Path) -> np.ndarray:
    """Decode one IDX file (uint8 payload), gzip-compressed."""
    with gzip.open(path, "rb") as f:
        buf = f.read()
    magic = int.from_bytes(buf[:4], "big")
    if magic >> 8 != 0x08:  # 0x08 = unsigned byte payload
        raise ValueError(f"{path}: not a uint8 IDX file (magic {magic:#x})")
    ndim = magic & 0xFF
    dims = [int.from_bytes(buf[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    arr = np.frombuffer(buf, dtype=np.uint8, offset=4 + 4 * ndim)
    if arr.size != int(np.prod(dims)):
        raise ValueError(f"{path}: payload has {arr.size} bytes, header says {dims}")
    return arr.reshape(dims)


def _load_fmnist_idx(folder: Path, verify: bool = True) -> RawDataset:
    arrays = {}
    for fname, digest in FMNIST_SHA256.items():
        a = read_idx_gz(folder / fname)
        if verify and hashlib.sha256(a.tobytes()).hexdigest() != digest:
            raise DatasetUnavailable(f"{folder / fname}: decoded content does not match Fashion-MNIST "
                                     f"(sha256 mismatch); the file is corrupt or a different dataset")
        arrays[fname] = a
    spec = SPECS["fmnist"]
    ds = RawDataset(spec,
                    torch.from_numpy(arrays["train-images-idx3-ubyte.gz"].copy()).unsqueeze(1),
                    torch.from_numpy(arrays["train-labels-idx1-ubyte.gz"].astype(np.int64)),
                    torch.from_numpy(arrays["t10k-images-idx3-ubyte.gz"].copy()).unsqueeze(1),
                    torch.from_numpy(arrays["t10k-labels-idx1-ubyte.gz"].astype(np.int64)),
                    source=str(folder))
    _check_shapes(ds)
    return ds


def _check_shapes(ds: RawDataset) -> None:
    """Image shapes and label range; the counts too, unless the files decide them (`DatasetSpec.exact_counts`)."""
    s = ds.spec
    want_tr, want_te = (s.n_train, s.channels, s.size, s.size), (s.n_test, s.channels, s.size, s.size)
    got_tr, got_te = tuple(ds.x_train.shape), tuple(ds.x_test.shape)
    if not s.exact_counts:
        got_tr, got_te, want_tr, want_te = got_tr[1:], got_te[1:], want_tr[1:], want_te[1:]
    if got_tr != want_tr or got_te != want_te:
        raise DatasetUnavailable(f"{s.name}: shapes {tuple(ds.x_train.shape)}/{tuple(ds.x_test.shape)}, "
                                 f"expected {want_tr}/{want_te}")
    if int(ds.y_train.max()) >= s.num_classes or int(ds.y_train.min()) < 0:
        raise DatasetUnavailable(f"{s.name}: labels outside [0, {s.num_classes})")


def _load_torchvision(spec: DatasetSpec, root: Path, download: bool) -> RawDataset:
    import torchvision.datasets as tvd

    cls = getattr(tvd, spec.torchvision_cls)

    def get(train: bool):
        if spec.name == "svhn":
            d = cls(str(root), split="train" if train else "test", download=download)
            x, y = torch.from_numpy(np.asarray(d.data)), torch.as_tensor(np.asarray(d.labels))
        elif spec.name == "emnist":
            d = cls(str(root), split="byclass", train=train, download=download)
            x, y = torch.as_tensor(np.asarray(d.data)).transpose(1, 2), torch.as_tensor(np.asarray(d.targets))
        else:
            d = cls(str(root), train=train, download=download)
            x, y = torch.as_tensor(np.asarray(d.data)), torch.as_tensor(np.asarray(d.targets))
        if x.ndim == 3:
            x = x.unsqueeze(1)
        elif x.shape[-1] == 3:  # CIFAR stores NHWC
            x = x.permute(0, 3, 1, 2)
        return x.contiguous().to(torch.uint8), y.long()

    try:
        xtr, ytr = get(True)
        xte, yte = get(False)
    except Exception as e:  # torchvision raises RuntimeError/URLError/OSError depending on the case
        how = ("it could not be downloaded (no internet?)" if download else "download=False")
        raise DatasetUnavailable(
            f"Dataset '{spec.name}' is not available: no files under {root} and {how}.\n"
            f"  Fix: put torchvision's {spec.torchvision_cls} files under {root} (or set PFLREPRO_DATA),"
            f" or run once with internet access and download=True."
            + ("\n  Offline alternative: `apt-get install dataset-fashion-mnist`." if spec.name == "fmnist" else "")
            + f"\n  (underlying error: {type(e).__name__}: {e})") from e
    ds = RawDataset(spec, xtr, ytr, xte, yte, source=f"torchvision:{root}")
    _check_shapes(ds)
    return ds


def _fake(spec: DatasetSpec, scale: float = 1.0) -> RawDataset:
    """Deterministic stand-in with the real set's shapes: class-dependent blobs + noise,
    so a model can learn a little (tests prove paper configs *start*, nothing more)."""
    g = torch.Generator().manual_seed(1234)
    n_tr, n_te = max(1, int(spec.n_train * scale)), max(1, int(spec.n_test * scale))
    protos = torch.randint(0, 256, (spec.num_classes, spec.channels, spec.size, spec.size), generator=g,
                           dtype=torch.int16)

    def make(n):
        y = torch.arange(n) % spec.num_classes
        y = y[torch.randperm(n, generator=g)]
        noise = torch.randint(-60, 61, (n, spec.channels, spec.size, spec.size), generator=g, dtype=torch.int16)
        return noise.add_(protos[y]).clamp_(0, 255).to(torch.uint8), y

    xtr, ytr = make(n_tr)
    xte, yte = make(n_te)
    dom = (lambda n: torch.arange(n) * len(spec.domains) // n) if spec.domains else (lambda n: None)  # noqa: E731
    return RawDataset(spec, xtr, ytr, xte, yte, source="synthetic stand-in", d_train=dom(n_tr), d_test=dom(n_te))


def tensor_cache_dir() -> Path:
    """Where `python -m pflrepro data NAME --save` puts tensor caches (the DVC `data` stage)."""
    return Path(os.environ.get("PFLREPRO_TENSOR_CACHE", Path(__file__).resolve().parents[2] / "data"))


def save_tensor_cache(ds: RawDataset, path: Path) -> Path:
    """uint8/int64 tensors only, so `torch.load(weights_only=True)` reads it back safely. Written by rename (a
    temporary file per process, removed when the write fails: a full disk leaves nothing behind)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale_tmp(path.parent)   # a killed writer's
    write_atomic(path, lambda tmp: torch.save({"name": ds.spec.name, "source": ds.source, "x_train": ds.x_train,
                                               "y_train": ds.y_train, "x_test": ds.x_test, "y_test": ds.y_test}, tmp))
    return path


def _cache_parts(d: dict) -> dict:
    """A cache's content as the source's digests see it: decoded uint8 images and labels, per file."""
    return {"train-images-idx3-ubyte.gz": d["x_train"], "train-labels-idx1-ubyte.gz": d["y_train"],
            "t10k-images-idx3-ubyte.gz": d["x_test"], "t10k-labels-idx1-ubyte.gz": d["y_test"]}


def _cache_problem(d) -> str | None:
    """Why a loaded Fashion-MNIST cache is not Fashion-MNIST (None: its content has the published digests)."""
    try:
        parts = _cache_parts(d)
    except (KeyError, TypeError) as e:
        return f"does not hold a dataset ({type(e).__name__})"
    for fname, t in parts.items():
        ok = torch.is_tensor(t) and not t.dtype.is_floating_point and hashlib.sha256(
            t.to(torch.uint8).contiguous().numpy().tobytes()).hexdigest() == FMNIST_SHA256[fname]
        if not ok:
            return (f"its {fname.split('-')[0]} {'images' if 'images' in fname else 'labels'} differ from "
                    "Fashion-MNIST's (sha256 of the decoded content)")
    return None


CACHE_REBUILT: dict = {}   # name -> why its tensor cache was set aside and rebuilt, in this process (the `data` verb)


def _rebuild_tensor_cache(spec: DatasetSpec, path: Path, why: str) -> RawDataset:
    """Set a bad cache aside (never deleted), say so in one line, and rebuild it from the checked source."""
    import sys
    import time
    dest = path.with_name(f"{path.name}.bad-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
    print(f"[pflrepro] tensor cache {path}: {why}; set aside as {dest}, rebuilt from the checked source",
          file=sys.stderr, flush=True)
    CACHE_REBUILT[spec.name] = why
    ds = _load_source(spec, download=False)
    try:   # kept aside first (a second name for it), then replaced in one rename: a kill leaves the bad cache, which
        os.link(path, dest)                                  # the next read finds again, or the good one
    except OSError:
        shutil.copy2(path, dest)   # a file system without hard links
    save_tensor_cache(ds, path)
    return ds


def _load_tensor_cache(spec: DatasetSpec, path: Path) -> RawDataset:
    """A tensor cache, checked before anything reads it: Fashion-MNIST's against the decoded-content sha256 of its
    source (`FMNIST_SHA256`, the digests the IDX loader checks), so a run never trains on something else under the
    same content address; one that does not load or does not match is set aside and rebuilt from the checked source.
    Datasets with no published digest (the user's CIFAR, iNaturalist caches) are only as good as their files."""
    try:
        d = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:   # noqa: BLE001 - torch's unpickler, zip: the cache is unusable
        if spec.name == "fmnist":
            return _rebuild_tensor_cache(spec, path, f"does not load ({type(e).__name__})")
        raise DatasetUnavailable(f"{path}: the tensor cache does not load ({type(e).__name__}); delete it or write "
                                 f"it again (`python -m pflrepro data {spec.name} --save {path}`)") from None
    if spec.name == "fmnist" and (why := _cache_problem(d)) is not None:
        return _rebuild_tensor_cache(spec, path, why)
    if not isinstance(d, dict) or d.get("name") != spec.name:
        raise DatasetUnavailable(f"{path}: holds dataset {d.get('name') if isinstance(d, dict) else None!r}, "
                                 f"not {spec.name!r}")
    ds = RawDataset(spec, d["x_train"], d["y_train"], d["x_test"], d["y_test"], source=f"{d['source']} (cache {path})")
    _check_shapes(ds)
    return ds


def load_dataset(name: str, download: bool = False, fake_scale: float = 1.0) -> RawDataset:
    """Load a registered dataset as uint8 tensors (see module docstring for lookup order;
    a tensor cache written by the DVC `data` stage, data/<name>.pt, is tried first, checked: `_load_tensor_cache`)."""
    if name not in SPECS:
        raise ValueError(f"unknown dataset '{name}'{did_you_mean(name, DATASETS)}; available: {', '.join(DATASETS)}")
    spec = SPECS[name]
    if name.startswith("fake-"):
        return _fake(spec, fake_scale)
    cached = tensor_cache_dir() / f"{name}.pt"
    sweep_stale_tmp(cached.parent)   # a killed writer's
    if cached.exists() and not spec.domains:   # the cache holds no domain ids
        return _load_tensor_cache(spec, cached)
    return _load_source(spec, download)


def _load_source(spec: DatasetSpec, download: bool) -> RawDataset:
    if spec.loader is not None:
        return spec.loader(spec)
    if spec.name == "fmnist":
        for folder in (DEBIAN_FMNIST, data_root() / "FashionMNIST" / "raw"):
            if all((folder / f).exists() for f in FMNIST_SHA256):
                return _load_fmnist_idx(folder)
    return _load_torchvision(spec, data_root(), download)


# ---------------------------------------------------------------- multi-domain sets (FedBSD Fig. 3)
FMNIST_DOMAINS = ("original", "inverted", "rotated", "noisy", "lowres")


def fmnist_domain_transform(x: torch.Tensor, domain: str, seed: int = 0) -> torch.Tensor:
    """One feature shift of uint8 Fashion-MNIST images (N, 1, 28, 28); labels keep their meaning.
    original; inverted (255 - x); rotated (90 degrees counter-clockwise); noisy (+ Gaussian noise, std 64,
    clamped); lowres (4x4 average-pooled to 7x7, then upsampled by nearest neighbour back to 28x28)."""
    if domain == "original":
        return x.clone()
    if domain == "inverted":
        return 255 - x
    if domain == "rotated":
        return torch.rot90(x, 1, dims=(2, 3)).contiguous()
    if domain == "noisy":
        g = torch.Generator().manual_seed(seed)
        return (x.float() + 64.0 * torch.randn(x.shape, generator=g)).round().clamp(0, 255).to(torch.uint8)
    if domain == "lowres":
        small = torch.nn.functional.avg_pool2d(x.float(), 4)
        return torch.nn.functional.interpolate(small, scale_factor=4, mode="nearest").round().to(torch.uint8)
    raise ValueError(f"unknown Fashion-MNIST domain {domain!r}; known: {FMNIST_DOMAINS}")


def _domain_ids(n: int, n_domains: int, seed: int) -> torch.Tensor:
    """Disjoint, equal-sized (up to one) random domains for n images, from a fixed seed."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    d = torch.empty(n, dtype=torch.long)
    d[perm] = torch.arange(n) * n_domains // n
    return d


def _load_fmnist_domains(spec: DatasetSpec) -> RawDataset:
    """Fashion-MNIST split into len(spec.domains) disjoint random fifths (train and test halves alike), each
    fifth under its domain's feature shift (`fmnist_domain_transform`): FedBN's Digits setting (same labels,
    shifted features, one domain per client) built offline."""
    base = load_dataset("fmnist")
    out = {}
    for half, x, salt in (("train", base.x_train, 0xD0), ("test", base.x_test, 0xD1)):
        d = _domain_ids(len(x), len(spec.domains), salt)
        x = x.clone()
        for i, dom in enumerate(spec.domains):
            idx = torch.nonzero(d == i).flatten()
            x[idx] = fmnist_domain_transform(x[idx], dom, seed=salt * 16 + i)
        out[half] = (x, d)
    return RawDataset(spec, out["train"][0], base.y_train, out["test"][0], base.y_test,
                      source=f"{base.source} under the domain shifts {', '.join(spec.domains)}",
                      d_train=out["train"][1], d_test=out["test"][1])


def _not_offline(spec: DatasetSpec, fix: str, missing=()) -> DatasetUnavailable:
    """The error for a set pflrepro reads from files the user provides and never downloads."""
    return DatasetUnavailable(f"Dataset '{spec.name}' is not available offline and pflrepro does not download it.\n"
                              f"  Fix: {fix}" + (f"\n  Missing: {', '.join(map(str, missing))}" if missing else ""))


def _load_domain_files(spec: DatasetSpec) -> RawDataset:
    """A multi-domain set from files the user provides (no public torchvision class reads them):
    `$PFLREPRO_DATA/<name>/<domain>_train.npz` and `<domain>_test.npz` for every domain, each holding uint8 `x`
    (N, H, W, C) or (N, C, H, W) already resized to the spec's size and channels, and integer labels `y`
    (see docs/fidelity.md "FedBSD Fig. 3" for how FedBN prepares them)."""
    folder = data_root() / spec.name
    xs, ys, ds = {"train": [], "test": []}, {"train": [], "test": []}, {"train": [], "test": []}
    missing = [str(folder / f"{dom}_{half}.npz") for dom in spec.domains for half in ("train", "test")
               if not (folder / f"{dom}_{half}.npz").exists()]
    if missing:
        raise _not_offline(spec, f"put one file per domain and half under {folder} (or set PFLREPRO_DATA): "
                           f"{', '.join(f'{d}_{{train,test}}.npz' for d in spec.domains)}, each with uint8 `x` of shape "
                           f"(N, {spec.size}, {spec.size}, {spec.channels}) or (N, {spec.channels}, {spec.size}, "
                           f"{spec.size}) and integer labels `y` in [0, {spec.num_classes}).", missing)
    for i, dom in enumerate(spec.domains):
        for half in ("train", "test"):
            with np.load(folder / f"{dom}_{half}.npz", allow_pickle=False) as f:
                x, y = torch.from_numpy(np.asarray(f["x"], np.uint8)), torch.from_numpy(np.asarray(f["y"], np.int64))
            if x.ndim == 4 and x.shape[-1] == spec.channels and x.shape[1] != spec.channels:
                x = x.permute(0, 3, 1, 2)
            if tuple(x.shape[1:]) != (spec.channels, spec.size, spec.size) or len(x) != len(y):
                raise DatasetUnavailable(f"{folder / f'{dom}_{half}.npz'}: x {tuple(x.shape)}, y {tuple(y.shape)}; "
                                         f"expected (N, {spec.channels}, {spec.size}, {spec.size}) and (N,)")
            if len(y) and (int(y.min()) < 0 or int(y.max()) >= spec.num_classes):
                raise DatasetUnavailable(f"{folder / f'{dom}_{half}.npz'}: labels outside [0, {spec.num_classes})")
            xs[half].append(x.contiguous())
            ys[half].append(y)
            ds[half].append(torch.full((len(y),), i, dtype=torch.long))
    cat = lambda t, h: torch.cat(t[h])   # noqa: E731
    return RawDataset(spec, cat(xs, "train"), cat(ys, "train"), cat(xs, "test"), cat(ys, "test"), source=str(folder),
                      d_train=cat(ds, "train"), d_test=cat(ds, "test"))


# ---------------------------------------------------------------- sets read from their own files
INATURALIST_FILES = ("train2017.json", "val2017.json")


def _square_rgb(path: Path, size: int) -> np.ndarray:
    """One image as (3, size, size) uint8: shorter side resized to `size` (bilinear), centre crop."""
    from PIL import Image

    with Image.open(path) as im:
        im = im.convert("RGB")
        scale = size / min(im.size)
        im = im.resize((max(size, round(im.size[0] * scale)), max(size, round(im.size[1] * scale))),
                       Image.BILINEAR)
        left, top = (im.size[0] - size) // 2, (im.size[1] - size) // 2
        return np.asarray(im.crop((left, top, left + size, top + size)), dtype=np.uint8).transpose(2, 0, 1)


def _read_coco_split(root: Path, ann_file: str, size: int, workers: int | None = None,
                     block: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """iNaturalist's COCO-style annotation file: `images` (id, file_name relative to `root`) and `annotations`
    (image_id, category_id); images in id order. The ~675,000 JPEGs are decoded by `workers` threads (default:
    one per CPU; Pillow releases the GIL while it decodes and resizes), a block at a time, each image written to
    its own row, so the tensor is the same whatever the number of threads."""
    from concurrent.futures import ThreadPoolExecutor

    with open(root / ann_file) as f:
        meta = json.load(f)
    label = {a["image_id"]: a["category_id"] for a in meta["annotations"]}
    images = sorted(meta["images"], key=lambda im: im["id"])
    x = torch.empty((len(images), 3, size, size), dtype=torch.uint8)
    decode = lambda im: _square_rgb(root / im["file_name"], size)   # noqa: E731
    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
        for start in range(0, len(images), block):
            for i, arr in enumerate(pool.map(decode, images[start:start + block]), start):
                x[i] = torch.from_numpy(arr.copy())
            done = min(start + block, len(images))
            if done // 20000 > start // 20000 or done == len(images):
                print(f"{ann_file}: {done:,}/{len(images):,} images decoded", flush=True)
    return x, torch.tensor([label[im["id"]] for im in images], dtype=torch.int64)


def _load_inaturalist(spec: DatasetSpec) -> RawDataset:
    """iNaturalist-2017 (SCD Table 3) from its official release under `$PFLREPRO_DATA/inaturalist/`: the
    annotation files train2017.json and val2017.json and the image folder they name (train_val_images/...).
    Train = the 579,184 training images, test = the 95,986 validation images (the test labels are not public).
    Every image is resized (shorter side) and centre-cropped to spec.size: SCD does not state its input size,
    and 675,000 images at 224 px are 100 GB of uint8, more than a tensor in memory can hold (docs/fidelity.md).
    Decoding takes hours once; the result is saved as the tensor cache data/inaturalist.pt, read after that."""
    root = data_root() / spec.name
    missing = [str(root / f) for f in INATURALIST_FILES if not (root / f).exists()]
    if missing:
        raise _not_offline(spec, f"put the iNaturalist-2017 release (train_val_images/ and "
                           f"{', '.join(INATURALIST_FILES)}) under {root} (or set PFLREPRO_DATA); the first load "
                           f"decodes it to {tensor_cache_dir() / spec.name}.pt.", missing)
    xtr, ytr = _read_coco_split(root, INATURALIST_FILES[0], spec.size)
    xte, yte = _read_coco_split(root, INATURALIST_FILES[1], spec.size)
    ds = RawDataset(spec, xtr, ytr, xte, yte, source=f"{root} (resized to {spec.size}x{spec.size})")
    _check_shapes(ds)
    save_tensor_cache(ds, tensor_cache_dir() / f"{spec.name}.pt")
    return ds


FEMNIST_LETTERS = np.arange(36, 46)   # LEAF's (EMNIST ByClass) labels of the lowercase letters a-j


def _leaf_folder(root: Path, half: str) -> Path | None:
    for d in (root / "data" / half, root / half):   # LEAF writes data/femnist/data/{train,test}/*.json
        if d.is_dir() and any(d.glob("*.json")):
            return d
    return None


def _read_leaf(folder: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Every user's samples of the letters a-j from LEAF's json files ({"users", "user_data": {user: {"x": rows
    of 784 floats in [0, 1], "y": labels}}}), labels 0-9 for a-j. Writers are not kept: FedRep's setting deals
    the samples out again (partition `lognormal`). Ink is made bright on a dark background as in EMNIST (LEAF
    stores it the other way round), so the EMNIST normalisation applies."""
    xs, ys = [], []
    for f in sorted(folder.glob("*.json")):
        with open(f) as fh:
            blob = json.load(fh)
        for user in blob["users"]:
            d = blob["user_data"][user]
            y = np.asarray(d["y"], dtype=np.int64)
            keep = np.isin(y, FEMNIST_LETTERS)
            if keep.any():
                xs.append(np.asarray(d["x"], dtype=np.float32).reshape(len(y), -1)[keep])
                ys.append(np.searchsorted(FEMNIST_LETTERS, y[keep]))
    if not xs:
        raise DatasetUnavailable(f"{folder}: no samples of the letters a-j (LEAF labels 36-45)")
    x = np.concatenate(xs)
    if x.mean() > 0.5:   # white background
        x = 1.0 - x
    x = torch.from_numpy(np.rint(np.clip(x, 0.0, 1.0) * 255).astype(np.uint8)).reshape(len(x), 1, 28, 28)
    return x, torch.from_numpy(np.concatenate(ys))


def _load_leaf_femnist(spec: DatasetSpec) -> RawDataset:
    """FEMNIST (FedBSD/FedRep Table 1) from LEAF's preprocessed json files under `$PFLREPRO_DATA/femnist/`
    (`data/train/*.json` and `data/test/*.json`, as LEAF's `./preprocess.sh` writes them), restricted to the ten
    letters a-j (FedRep: "we restrict the dataset to 10 handwritten letters")."""
    root = data_root() / spec.name
    folders = {half: _leaf_folder(root, half) for half in ("train", "test")}
    if None in folders.values():
        raise _not_offline(spec, f"run LEAF's FEMNIST preprocessing (github.com/TalwalkarLab/leaf, data/femnist: "
                           f"./preprocess.sh -s niid --sf 1.0 -k 0 -t sample) and put its data/train and data/test "
                           f"folders of json files under {root / 'data'} (or set PFLREPRO_DATA).")
    (xtr, ytr), (xte, yte) = _read_leaf(folders["train"]), _read_leaf(folders["test"])
    ds = RawDataset(spec, xtr, ytr, xte, yte, source=f"{root} (LEAF json, letters a-j)")
    _check_shapes(ds)
    return ds


for _s in [
    # 60,000 / 10,000 Fashion-MNIST images, a fifth per domain
    DatasetSpec("fmnist-domains", 1, 28, 10, 60000, 10000, (0.2860,), (0.3530,), domains=FMNIST_DOMAINS,
                loader=_load_fmnist_domains),
    # pixels in [0, 1] as FedBN (ToTensor, no normalisation). FedBN's Digits (every domain resized to 28x28 RGB,
    # 10 % of a domain = 743 training images a client); the stand-in's test halves: 1,000 a domain (the real
    # test files may differ in size)
    DatasetSpec("digits", 3, 28, 10, 5 * 743, 5 * 1000, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0),
                domains=("svhn", "mnistm", "synth", "mnist", "usps"), loader=_load_domain_files, exact_counts=False),
    # FedBN's DomainNet: the 10 most common classes, six domains, 256x256 RGB; the stand-in's sizes: 100 training
    # and 50 test images a domain (FedBN trains on 5 % of the smallest domain's training set)
    DatasetSpec("domainnet", 3, 256, 10, 6 * 100, 6 * 50, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0),
                domains=("clipart", "infograph", "painting", "quickdraw", "real", "sketch"),
                loader=_load_domain_files, exact_counts=False),
    # iNaturalist-2017 at 64 px (docs/fidelity.md "SCD Table 3"), ImageNet's normalisation; the stand-in: two
    # training images and one test image a class, 64 px like the real set
    DatasetSpec("inaturalist", 3, 64, 5089, 579184, 95986, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225),
                loader=_load_inaturalist, stand_in=(2 * 5089, 5089)),
    # LEAF FEMNIST, letters a-j, EMNIST's normalisation; its counts depend on LEAF's sampling options, so the
    # numbers here only size the stand-in (4,000 training images a letter: room for FedRep's 150 x 148)
    DatasetSpec("femnist", 1, 28, 10, 40000, 4000, (0.1736,), (0.3317,), loader=_load_leaf_femnist, exact_counts=False),
]:
    SPECS[_s.name] = _s
_add_stand_ins()
DATASETS = sorted(SPECS)
