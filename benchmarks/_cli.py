"""What the in-process benchmarks share: their common arguments, and torch's thread count set for the measurement
and given back after (so an in-process caller, the test, keeps its own)."""
from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

import torch


def parser(doc: str, quick_help: str, repeats: int) -> argparse.ArgumentParser:
    """--quick, --repeats, --threads (default 1: a `dvc repro` worker's) and --out (default benchmarks/out)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--repeats", type=int, default=repeats)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "out"))
    return ap


@contextlib.contextmanager
def torch_threads(n: int):
    """torch at `n` threads inside the block, the caller's count restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
