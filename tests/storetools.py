"""Helpers of the run-store fault tests (test_store_faults.py, test_store_defects.py, test_store_writes.py): editing a
checkpoint the way a user or a bad disk would, in the store's record format (store.CKPT_MAGIC, a header and the state)
or, for the tests that must fail on the older store, the plain torch file it wrote before."""
from __future__ import annotations

import io

import torch

from pflrepro.pipeline import store as S


def read_state(path):
    """(header bytes or None, state) of a checkpoint file, whichever format it is in."""
    blob = path.read_bytes()
    magic = getattr(S, "CKPT_MAGIC", None)
    if magic and blob.startswith(magic):
        line, _, payload = blob[len(magic):].partition(b"\n")
        return magic + line + b"\n", torch.load(io.BytesIO(payload), weights_only=True)
    return None, torch.load(io.BytesIO(blob), weights_only=True)


def write_state(path, header, state, rehash: bool = False) -> None:
    """Write `state` back under its old header (so the header's sha256 no longer matches), or as a plain torch file;
    with `rehash`, as a forger would: the header's sha256 (or the older store's checkpoint.sha256) made to match."""
    import hashlib
    import json
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    digest = hashlib.sha256(payload).hexdigest()
    if header is not None and rehash:
        magic = S.CKPT_MAGIC
        fields = json.loads(header[len(magic):])
        header = magic + json.dumps({**fields, "sha256": digest}, sort_keys=True).encode() + b"\n"
    path.write_bytes((header or b"") + payload)
    if header is None and rehash:
        (path.parent / "checkpoint.sha256").write_text(digest)


def edit_checkpoint(path, change, rehash: bool = False) -> None:
    """Apply `change(state)` to a checkpoint in place: what a hand edit or a bit flip in the tensors does."""
    header, state = read_state(path)
    change(state)
    write_state(path, header, state, rehash)


def nudge_first_weight(state) -> None:
    first = next(iter(state["server"]["params"]))
    state["server"]["params"][first] = state["server"]["params"][first] + 1e-3
