"""What a finished run records about where and how it ran (`provenance.json`): its address, the commit, versions,
device, wall time, bytes and FLOPs."""
from __future__ import annotations

import platform
import subprocess
import sys
import time

import torch

from ..core import engines
from ..core.clock import forward_flops
from ..core.context import Context
from ..federation.config import RunConfig
from ..paths import REPO_ROOT
from ..version import __version__
from .address import code_fingerprint


# Tracked files that `dvc repro` itself rewrites (the lock, the metrics, README's summary block): a checkout
# is not "dirty" because the pipeline ran in it, or every stage after the first would say so.
PIPELINE_OUTPUTS = ("dvc.lock", "metrics", "README.md")


def git_commit() -> dict:
    """HEAD and whether tracked files other than PIPELINE_OUTPUTS differ from it."""
    def git(*a):
        try:
            return subprocess.run(["git", *a], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
        except Exception:
            return ""
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".",
                  *(f":(exclude){p}" for p in PIPELINE_OUTPUTS))
    return {"commit": git("rev-parse", "HEAD") or "unknown", "dirty": bool(changed)}


def model_flops(ctx: Context) -> int | None:
    """Forward FLOPs of one sample through the (first) model, by torch's FLOP counter."""
    try:
        return forward_flops(ctx.make_model(0).to(ctx.device), ctx.data.x[:1])
    except Exception:
        return None


def provenance(cfg: RunConfig, ctx: Context, wall: float, res, git: dict, cpu: float | None = None) -> dict:
    import numpy
    fwd = model_flops(ctx)
    return {
        "config_sha256": cfg.key(), "code_sha256": code_fingerprint(cfg.algorithm), "seed": cfg.seed, "dataset": cfg.dataset, "dataset_source": ctx.data.source,
        "device": str(ctx.device), "torch_threads": torch.get_num_threads(),
        # the ATen kernels this CPU ran (AVX512, AVX2, ...): float rounding, and so the numbers, depend on it
        # (docs/evidence/kernel_paths/; `ATEN_CPU_CAPABILITY=avx2` runs an AVX2 CPU's kernels on an AVX-512 one)
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        # a round's client-by-client training: at most this many forked processes of one thread (core/engines/forked.py)
        "client_procs": engines.client_procs(ctx.device, sys.maxsize),
        "git": git, "pflrepro": __version__, "python": platform.python_version(),
        "torch": torch.__version__, "numpy": numpy.__version__, "platform": platform.platform(),
        "wall_seconds": wall, "resumed_from_round": res.resumed_from,
        # CPU time of the run's process and its forked client trainers, over every segment (None when resumed from a
        # checkpoint that predates the field): its cost on a shared or niced machine, where wall time is not
        "cpu_seconds": None if cpu is None or cpu != cpu else cpu,
        # runs whose clients shared its local training calls (executor "stacked", core/engines/together.py; 1: alone)
        "trained_with_runs": stacker.runs if (stacker := engines.current()) is not None else 1,
        # of which evaluation (every `eval_every` rounds: GM on the global test set, every PM on its local test)
        "eval_seconds": sum(r.get("eval_seconds", 0.0) for r in res.history),
        "bytes_up": res.bytes_up, "bytes_down": res.bytes_down,
        "train_samples": res.samples, "forward_flops_per_sample": fwd,
        # training FLOPs ~ 3x forward (forward + backward wrt inputs and weights)
        "train_flops_estimate": (3 * fwd * res.samples) if fwd else None,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
