"""A fault-injecting file layer for the run-store tests (test_store_writes.py): every write, rename, move, mkdir,
link, unlink and lock-file creation under one folder goes through it, numbered in the order the process makes them. It can
list them (`ops`), fail the n-th with an OSError (`how="enospc"`: a full disk, half of a write's bytes landing first,
as on a disk that fills mid-write; "erofs": a read-only file system), or SIGKILL the process at the n-th (for a write: after half its bytes, a torn write).

It patches the calls the store, the data cache, the heartbeat and the locks make (`pathlib.Path.write_bytes` and
`write_text`, `os.replace` (and so `Path.replace`), `os.rename`, `os.link`, `shutil.move`, `os.mkdir` (`Path.mkdir`), `os.unlink`
(`Path.unlink`), `os.rmdir`, `os.open` with O_CREAT, `torch.save` to a path), so a new write path in the store is
covered without being named here."""
from __future__ import annotations

import errno
import os
import pathlib
import shutil
import signal
from contextlib import contextmanager

import torch


class Layer:
    def __init__(self, root, at: int | None = None, how: str = "count"):
        self.root, self.at, self.how = os.path.realpath(root), at, how
        self.ops: list[str] = []

    def _mine(self, *paths) -> str | None:
        for p in paths:
            try:
                real = os.path.realpath(os.fspath(p))
            except TypeError:   # a file descriptor
                continue
            if real == self.root or real.startswith(self.root + os.sep):
                return os.path.relpath(real, self.root)
        return None

    def op(self, kind: str, *paths, half=None) -> None:
        """Count one operation on our folder; at the chosen one, fail or die (after `half()`, a torn write)."""
        rel = self._mine(*paths)
        if rel is None:
            return
        n = len(self.ops)
        self.ops.append(f"{kind} {_pattern(rel)}")
        if n != self.at:
            return
        if half is not None:
            half()
        if self.how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        code = {"enospc": errno.ENOSPC, "erofs": errno.EROFS}[self.how]
        raise OSError(code, os.strerror(code), os.fspath(paths[0]))


def _pattern(rel: str) -> str:
    """A path with its run's hash, a pid and a timestamp replaced: the same operation in two runs reads the same."""
    import re
    rel = re.sub(r"-[0-9a-f]{12}(?=$|[/.-])", "-<run>", rel)
    rel = re.sub(r"\.\d+\.tmp$", ".<pid>.tmp", rel)
    return re.sub(r"-\d{8}T\d{6}-\d+", "-<when>", rel)


@contextmanager
def installed(layer: Layer):
    real = {"wb": pathlib.Path.write_bytes, "wt": pathlib.Path.write_text, "replace": os.replace,
            "rename": os.rename, "link": os.link, "move": shutil.move, "mkdir": os.mkdir, "unlink": os.unlink, "rmdir": os.rmdir,
            "open": os.open, "save": torch.save}

    def write_bytes(self, data):
        layer.op("write", self, half=lambda: real["wb"](self, bytes(data)[: len(data) // 2]))
        return real["wb"](self, data)

    def write_text(self, data, *a, **k):
        layer.op("write", self, half=lambda: real["wt"](self, data[: len(data) // 2], *a, **k))
        return real["wt"](self, data, *a, **k)

    def save(obj, f, *a, **k):
        if isinstance(f, (str, os.PathLike)):
            layer.op("write", f, half=lambda: real["wb"](pathlib.Path(f), b"PK\x03\x04 torn"))
        return real["save"](obj, f, *a, **k)

    def two(kind, name):
        def call(src, dst, *a, **k):
            layer.op(kind, dst, src)
            return real[name](src, dst, *a, **k)
        return call

    def one(kind, name):
        def call(p, *a, **k):
            layer.op(kind, p)
            return real[name](p, *a, **k)
        return call

    def open_(p, flags, *a, **k):
        if flags & os.O_CREAT:
            layer.op("create", p)
        return real["open"](p, flags, *a, **k)

    patches = {(pathlib.Path, "write_bytes"): write_bytes, (pathlib.Path, "write_text"): write_text,
               (os, "replace"): two("rename", "replace"), (os, "rename"): two("rename", "rename"),
               (os, "link"): two("link", "link"),
               (shutil, "move"): two("move", "move"), (os, "mkdir"): one("mkdir", "mkdir"),
               (os, "unlink"): one("unlink", "unlink"), (os, "rmdir"): one("rmdir", "rmdir"),
               (os, "open"): open_, (torch, "save"): save}
    saved = {k: getattr(*k) for k in patches}
    try:
        for (obj, name), fn in patches.items():
            setattr(obj, name, fn)
        yield layer
    finally:
        for (obj, name), fn in saved.items():
            setattr(obj, name, fn)
