"""What a grid costs before it runs: training FLOPs, and time on this machine and on a GPU.

    python -m pflrepro cost pfedsd_table2 --profile paper      # every run of the notebook's grid
    budget.grid_cost(configs)                                   # {rows per model, totals}

Per run: training FLOPs = 3 x forward FLOPs of one sample (torch's FLOP counter on the run's model; forward +
backward, the convention runs' provenance.json uses) x the sample passes `parallel.work` counts (rounds x the
participating clients' samples x local epochs x the algorithm's relative cost, plus the server's work, e.g.
FedDF's distillation). Evaluation is not counted. A run with several architectures (`models`) is costed at
their mean.

Time on this machine: each model's training rate is *measured* here (a few SGD steps at the run's batch size
and `threads` threads), so the estimate carries this CPU's real speed for that model; wall time = CPU time /
runs at once. It is a lower bound: a whole run also evaluates, samples and sets up its clients, and the mini
runs' provenance (train_flops_estimate / wall_seconds) shows them reaching a third to half of the step rate
for the small CNNs (docs/performance.md, "What a paper profile costs"). Time on a GPU: FLOPs / GPU_FLOPS, a *stated* rate, not a measurement (no GPU has been lent to
this project): small CNNs at batch 16-64 keep a GPU's cores far from busy, so treat it as a lower bound.
"""
from __future__ import annotations

import functools
import time

import torch

from ..core.clock import forward_flops as count
from ..data.datasets import SPECS
from ..data.models import build_model
from ..federation.config import RunConfig
from . import parallel
from .parallel import work

GPU_FLOPS = 10e12   # stated: about half an A100's 19.5 TFLOP/s FP32 peak, sustained on ResNet-size batches
GPU_NAME = "a GPU sustaining 10 TFLOP/s (half an A100's FP32 peak)"
# A larger batch_size is measured at this batch: the FLOP rate has stopped growing well before it (the papers' batches
# are 10 to 64), and a step at batch_size=10**9 allocated terabytes (issue 33: a traceback before the run started).
RATE_BATCH_MAX = 256


@functools.lru_cache(maxsize=None)
def forward_flops(model: str, dataset: str) -> int:
    """FLOPs of one sample's forward pass of `model` on `dataset`'s image shape (no data needed)."""
    s = SPECS[dataset]
    return count(build_model(model, s.channels, s.num_classes, s.size), torch.zeros(1, s.channels, s.size, s.size))


@functools.lru_cache(maxsize=None)
def train_rate(model: str, dataset: str, batch: int, threads: int, steps: int = 3) -> float:
    """Training FLOP/s of `model` on this machine: SGD steps on a random batch, timed after one warm-up."""
    s = SPECS[dataset]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(0)
        net = build_model(model, s.channels, s.num_classes, s.size)
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        x, y = torch.randn(batch, s.channels, s.size, s.size), torch.randint(0, s.num_classes, (batch,))

        def step():
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
        step()
        t = time.perf_counter()
        for _ in range(steps):
            step()
        secs = (time.perf_counter() - t) / steps
    finally:
        torch.set_num_threads(before)
    return 3 * forward_flops(model, dataset) * batch / secs


def run_flops(cfg: RunConfig) -> float:
    archs = sorted({cfg.model, *cfg.models}) if cfg.models else [cfg.model]
    fwd = sum(forward_flops(m, cfg.dataset) for m in archs) / len(archs)
    return 3 * fwd * work(cfg)


def grid_cost(configs, jobs: int | None = None, gpu_flops: float = GPU_FLOPS) -> dict:
    """Cost of training every distinct config in `configs` (an iterable of RunConfig), `jobs` at once on this
    machine (None: parallel.resolve_jobs's auto). Returns {"rows": per (model, dataset), "total": ...}."""
    configs = list({c.key(): c for c in configs}.values())
    if not configs:
        return {"rows": [], "total": {"runs": 0, "tflops": 0.0, "cpu_hours": 0.0, "wall_hours": 0.0,
                                      "gpu_hours": 0.0}, "jobs": 0, "threads": 0}
    jobs = jobs or parallel.resolve_jobs("auto", configs)
    threads = parallel.threads_per_run(jobs)
    groups: dict[tuple, list] = {}
    for c in configs:
        groups.setdefault((c.model if not c.models else "+".join(sorted({c.model, *c.models})), c.dataset,
                           c.batch_size), []).append(c)
    rows = []
    for (model, dataset, batch), cs in sorted(groups.items()):
        flops = sum(run_flops(c) for c in cs)
        at = min(batch, RATE_BATCH_MAX)
        rate = sum(train_rate(m, dataset, at, threads) for m in model.split("+")) / len(model.split("+"))
        rows.append({"model": model, "dataset": dataset, "batch": batch, "runs": len(cs), "tflops": flops / 1e12,
                     "rate_gflops": rate / 1e9, "cpu_hours": flops / rate / 3600,
                     "gpu_hours": flops / gpu_flops / 3600})
    cpu = sum(r["cpu_hours"] for r in rows)
    total = {"runs": len(configs), "tflops": sum(r["tflops"] for r in rows), "cpu_hours": cpu,
             "wall_hours": cpu / min(jobs, len(configs)), "gpu_hours": sum(r["gpu_hours"] for r in rows)}
    return {"rows": rows, "total": total, "jobs": jobs, "threads": threads}


def hours(h: float) -> str:
    if h < 1 / 60:
        return f"{h * 3600:.0f} s"
    if h < 1:
        return f"{h * 60:.0f} min"
    return f"{h:.1f} h" if h < 48 else f"{h / 24:.1f} days"


def describe(cost: dict, label: str = "grid") -> str:
    """A few lines a user reads before a long grid starts."""
    t = cost["total"]
    lines = [f"[{label}] cost of {t['runs']} runs to train: {t['tflops']:,.1f} TFLOPs (training, estimated); "
             f"this machine: >= {hours(t['wall_hours'])} ({cost['jobs']} at once, {cost['threads']} thread(s) each; "
             f"{hours(t['cpu_hours'])} run time); {GPU_NAME}: >= {hours(t['gpu_hours'])}"]
    for r in cost["rows"]:
        lines.append(f"    {r['runs']:>4} x {r['model']} on {r['dataset']} (B={r['batch']}): {r['tflops']:,.1f} TFLOPs, "
                     f"measured {r['rate_gflops']:.1f} GFLOP/s here -> {hours(r['cpu_hours'])}")
    return "\n".join(lines)
