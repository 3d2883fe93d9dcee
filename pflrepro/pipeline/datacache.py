"""The tensor caches (data/<name>.pt, written by `python -m pflrepro data NAME --save` and the DVC `data` stage) are
read before the hash-checked source files (pflrepro.data.datasets.load_dataset): a cache must hold exactly the
checked content, or runs would train on something else under the same content address. `check(name)` verifies a
cache against the decoded-content sha256 of its source (Fashion-MNIST: `datasets.FMNIST_SHA256`, the digests the IDX
loader checks) before a run reads it. A cache that does not load or does not match is moved aside (never deleted),
the user is told in one line, and it is rebuilt from the checked source. Datasets with no published digest (the
user's CIFAR, iNaturalist caches) are not checked here: their cache is only as good as the files it was made from."""
from __future__ import annotations

import functools
import hashlib
import os
import sys
import time

import torch

from ..data import datasets as D


def _digests(d: dict) -> dict:
    """The cache's content as the source's digests see it: decoded uint8 images and labels, per file."""
    return {"train-images-idx3-ubyte.gz": d["x_train"], "train-labels-idx1-ubyte.gz": d["y_train"],
            "t10k-images-idx3-ubyte.gz": d["x_test"], "t10k-labels-idx1-ubyte.gz": d["y_test"]}


def problem(name: str) -> str | None:
    """Why the cache of `name` cannot be used (None: it is fine, or there is none, or no digest to check it by)."""
    path = D.tensor_cache_dir() / f"{name}.pt"
    if name != "fmnist" or not path.exists():
        return None
    try:
        d = torch.load(path, map_location="cpu", weights_only=True)
        parts = _digests(d)
    except Exception as e:   # noqa: BLE001 - torch's unpickler, zip, a missing key: the cache is unusable
        return f"does not load ({type(e).__name__})"
    for fname, t in parts.items():
        data = t.to(torch.uint8).contiguous().numpy().tobytes() if torch.is_tensor(t) else b""
        if not torch.is_tensor(t) or t.dtype.is_floating_point or hashlib.sha256(data).hexdigest() != D.FMNIST_SHA256[fname]:
            return f"its {fname.split('-')[0]} {'images' if 'images' in fname else 'labels'} differ from Fashion-MNIST's " \
                   "(sha256 of the decoded content)"
    return None


@functools.cache   # once per process and dataset
def check(name: str) -> str | None:
    """Verify the cache of `name`; a bad one is moved aside and rebuilt from the checked source. Returns what was
    wrong (None: nothing)."""
    why = problem(name)
    if why is None:
        return None
    path = D.tensor_cache_dir() / f"{name}.pt"
    dest = path.with_name(f"{path.name}.bad-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
    os.replace(path, dest)
    print(f"[pflrepro] tensor cache {path}: {why}; moved to {dest}, rebuilt from the checked source", file=sys.stderr,
          flush=True)
    D.save_tensor_cache(D.load_dataset(name), path)
    return why
