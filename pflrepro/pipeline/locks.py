"""Exclusive file locks that never go stale: an `fcntl.flock` on a lock file, dropped by the kernel when its holder
dies however it dies. Used for a grid driver's claims (executors.Claims: one driver trains a run) and for a run's
trainer (store.run: one process trains a run, whoever started it). The lock file is removed on release, under the
lock; a waiter that locked the removed file sees that its inode is gone and locks the new one. Without fcntl
(Windows) nothing is locked."""
from __future__ import annotations

import os
from pathlib import Path


def lock(path: Path, block: bool) -> int | None:
    """An fd holding the lock on `path` (created), or None when `block` is False and another process holds it;
    -1 where there is no fcntl."""
    try:
        import fcntl
    except ImportError:
        return -1
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            current = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            current = False
        if current:
            return fd
        os.close(fd)   # its holder removed the file between our open and our lock: lock the new one


def unlock(path: Path, fd: int) -> None:
    if fd < 0:
        return
    import fcntl
    path.unlink(missing_ok=True)   # still under the lock: a waiter finds a new inode and locks that
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
