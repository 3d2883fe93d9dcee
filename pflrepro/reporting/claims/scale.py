"""What deciding an undecided headline claim would cost on a GPU, at rates the device check measured (issue 54: "the
seeds or scale ... CPU-hours, GPU-minutes from the measured rates").

Two figures a claim, both planning, never a verdict:
  - the paired seeds still to run at mini, on a GPU: the training FLOPs of the runs the claim read (each run's
    `train_flops_estimate`, provenance.json), per seed, times the seeds to run, at the FLOP rate the H200 reached on
    mini's own workload (`MINI_WORKLOAD`, the fastest engine);
  - the paper's scale: the claim's methods in every setting of its stage's `paper` profile, three seeds (the paper's),
    their training FLOPs (`budget.run_flops`, no data needed), at the rate the H200 reached on the paper-scale small
    CNN workload (`PAPER_WORKLOAD`: 100 clients, 10 a round, B = 64). A larger model (VGG-11, ResNet-18) fills a GPU
    better than that CNN, so its hours are an upper bound there.
The rates are the benchmark rows of the device check's lease folders (`docs/device/<lease>/*/bench_engines.csv`,
scripts/gpu_check.py step 2); without a lease on record, both figures are left out.
"""
from __future__ import annotations

import csv
import functools
import json
from pathlib import Path

from ...paths import REPO_ROOT
from .loading import used_methods

DEVICE_ROOT = REPO_ROOT / "docs" / "device"
MINI_WORKLOAD = "a_mini"          # cnn_cifar10 on Fashion-MNIST, 20 clients, B = 16 (benchmarks/bench_engines.py)
PAPER_WORKLOAD = "b_paper_b64"    # cnn_cifar10 at 32 x 32, 100 clients, 10 a round, B = 64


@functools.lru_cache(maxsize=None)
def measured_rates(root: Path = DEVICE_ROOT) -> dict:
    """{workload: (FLOP/s, lease)}: the fastest engine's achieved training rate on a CUDA device, from the newest lease
    that measured the workload (leases are named by date, so the newest sorts last)."""
    rows = []       # (lease, rate, workload): sorted, the newest lease's fastest engine comes last for each workload
    for f in root.glob("*/*/bench_engines.csv"):
        with open(f) as fh:
            rows += [(f.parent.parent.name, float(r["achieved_flops"]), r["workload"]) for r in csv.DictReader(fh)
                     if r.get("device") == "cuda" and r.get("achieved_flops")]
    return {w: (rate, lease) for lease, rate, w in sorted(rows)}


def seed_flops(run_names, results_root: Path, seeds: int) -> float | None:
    """Training FLOPs per seed of the named runs (their provenance's estimate); None where a run has none."""
    total = 0.0
    for name in run_names:
        try:
            total += float(json.loads((results_root / "runs" / name / "provenance.json").read_text())
                           ["train_flops_estimate"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
    return total / seeds if seeds and total else None


@functools.lru_cache(maxsize=None)
def paper_flops(stage: str, methods: tuple) -> float | None:
    """Training FLOPs of `methods` in every setting of the stage's `paper` profile (its seeds); None without one."""
    from ...pipeline.budget import run_flops    # here: it builds models to count FLOPs, needed only for this column
    from ...pipeline.experiments import grid, load_profile    # the same: only this column reads the paper profiles
    try:
        configs = grid(load_profile(stage, "paper"))
    except Exception:       # noqa: BLE001  a stage without a paper profile, or one that renders another's runs
        return None
    cfgs = [c for (m, _, _), c in configs.items() if m in methods]
    return sum(run_flops(c) for c in cfgs) if cfgs else None


def attach(row: dict, run_names, results_root: Path, seeds_to_run: int | None) -> None:
    """Add `decide_gpu_s` (the seeds still to run, on the measured GPU) and `paper_scale` (TFLOPs and GPU hours of the
    paper's scale) to an undecided headline claim's row, where the rates are on record."""
    rates = measured_rates(DEVICE_ROOT)
    every_run_known = all("/" not in n for n in run_names)     # "/" names a table standing in for unmatched runs
    if MINI_WORKLOAD in rates and seeds_to_run is not None and every_run_known:
        per_seed = seed_flops(run_names, results_root, row["seeds"])
        if per_seed is not None:
            row["decide_gpu_s"] = per_seed * seeds_to_run / rates[MINI_WORKLOAD][0]
    methods = used_methods(row)
    flops = paper_flops(row["stage"], methods) if methods else None
    if PAPER_WORKLOAD in rates and flops:
        row["paper_scale"] = {"tflops": flops / 1e12, "gpu_s": flops / rates[PAPER_WORKLOAD][0],
                              "lease": rates[PAPER_WORKLOAD][1]}
