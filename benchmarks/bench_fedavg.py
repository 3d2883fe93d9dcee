"""FedAvg throughput on this machine, set against the machine's own matmul peak.

    python benchmarks/bench_fedavg.py [--rounds N] [--repeats R] [--out DIR] [--quick] [--test-cap N]

1. Matmul peak: best FLOP/s (2 n^3 / t) of float32 `torch.mm` on square matrices,
   with torch's default thread count, after warm-up; measured before and after the
   workloads, the best counts.
2. A fixed FedAvg workload on real Fashion-MNIST (20 IID clients, all participating,
   1 local epoch, B=64, SGD lr 0.01 momentum 0.9, 10% of the train pool), once with
   `cnn_cifar10` (small LeNet) and once with `cnn_fmnist` (pFedSD's FMNIST CNN). One
   warm-up run of 1 round, then `run_rounds` is timed R times (default 3, the fastest
   counts) over N rounds (default 5) with eval_every = N, so only one evaluation falls
   in each timed window; that evaluation is timed again on its own and subtracted to
   give training-only seconds per round.
   (The global model is evaluated on the first 1000 test images only, by default:
   evaluation is not what is measured, and a full one would dominate the run time.)
3. Per workload: s/round, training samples/s, forward FLOPs/sample (torch's
   FlopCounterMode on one sample), achieved training FLOP/s ~ 3 x forward FLOPs x
   samples/s, and achieved / measured peak. Printed as a markdown table and written
   to <out>/bench_fedavg.csv and <out>/bench_fedavg.md.

Nothing is written into the results store: `run_rounds` is called directly.
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from pflrepro.algorithms import ALGORITHMS  # noqa: E402
from pflrepro.core.loop import evaluate, run_rounds  # noqa: E402
from pflrepro.federation.build import build_context  # noqa: E402
from pflrepro.federation.config import RunConfig  # noqa: E402

MODELS = ("cnn_cifar10", "cnn_fmnist")
COLUMNS = ("workload", "model", "rounds", "repeats", "clients", "samples_per_round", "s_per_round", "eval_s",
           "train_s_per_round", "spread", "samples_per_s", "fwd_flops_per_sample", "achieved_flops",
           "peak_flops", "ratio_to_peak", "threads")


def matmul_peak(sizes=(1024, 2048), reps: int = 8, warmup: int = 2, device: torch.device | None = None) -> dict[int, float]:
    """Best FLOP/s of float32 torch.mm per square size n (2 n^3 FLOPs per product), on `device`
    (default CPU; CUDA is synchronized around each product). The one peak every benchmark uses."""
    device = device or torch.device("cpu")

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    out = {}
    for n in sizes:
        g = torch.Generator().manual_seed(n)
        a = torch.randn(n, n, generator=g).to(device)
        b = torch.randn(n, n, generator=g).to(device)
        c = torch.empty(n, n, device=device)
        for _ in range(warmup):
            torch.mm(a, b, out=c)
        best = math.inf
        for _ in range(reps):
            sync()
            t0 = time.perf_counter()
            torch.mm(a, b, out=c)
            sync()
            best = min(best, time.perf_counter() - t0)
        out[n] = 2.0 * n ** 3 / best
        del a, b, c
    return out


def _cpu_seconds() -> tuple[float, float] | None:
    """(CPU-seconds busy on the whole machine from /proc/stat, CPU-seconds of this process)."""
    try:
        import resource
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
        busy = (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return busy, ru.ru_utime + ru.ru_stime
    except (OSError, ValueError, ImportError, IndexError):
        return None


def _other_cpu_share(before, after, wall: float) -> float:
    """Share of all cores' time that other processes used between two _cpu_seconds() (nan if unknown)."""
    if before is None or after is None or wall <= 0:
        return float("nan")
    others = (after[0] - before[0]) - (after[1] - before[1])
    return max(others, 0.0) / ((os.cpu_count() or 1) * wall)


def forward_flops(ctx) -> int:
    """Forward FLOPs of one sample (as pflrepro.pipeline.store.model_flops, but failing loudly)."""
    net = ctx.make_model(0).to(ctx.device).eval()
    with FlopCounterMode(display=False) as fc, torch.no_grad():
        net(ctx.data.x[:1])
    return int(fc.get_total_flops())


def workload_config(model: str, rounds: int, subsample: float) -> RunConfig:
    return RunConfig.from_dict(dict(
        algorithm="fedavg", dataset="fmnist", pool="train", partition="iid", n_clients=20,
        participation=1.0, model=model, rounds=rounds, local_epochs=1, batch_size=64, lr=0.01,
        momentum=0.9, subsample=subsample, eval_every=rounds, checkpoint_every=rounds, seed=0,
        device="cpu"))


def bench_workload(model: str, rounds: int, subsample: float, test_cap: int | None = None,
                   repeats: int = 1) -> dict:
    device = torch.device("cpu")
    cfg = workload_config(model, rounds, subsample)
    ctx = build_context(cfg, device)
    if test_cap:  # a smaller global test set: evaluation is taken out of the throughput anyway
        ctx.data.x_test, ctx.data.y_test = ctx.data.x_test[:test_cap], ctx.data.y_test[:test_cap]
    # warm-up: the same federation, one round (allocator, kernels, first-touch costs)
    ctx.cfg = cfg.replace(rounds=1, eval_every=1, checkpoint_every=1)
    run_rounds(ctx, ALGORITHMS["fedavg"](ctx), progress=False)
    # timed, `repeats` times: `rounds` rounds from the same initial weights (the same work
    # each time, deterministically), one evaluation at the end; the fastest repeat counts
    ctx.cfg = cfg
    walls, evals, trains, samples = [], [], [], set()
    for _ in range(repeats):
        algo = ALGORITHMS["fedavg"](ctx)
        t0 = time.perf_counter()
        res = run_rounds(ctx, algo, progress=False)
        wall = time.perf_counter() - t0
        # that one evaluation, timed on its own and taken out of the training time
        t0 = time.perf_counter()
        evaluate(ctx, algo, res.server, res.clients)
        eval_s = time.perf_counter() - t0
        walls.append(wall)
        evals.append(eval_s)
        trains.append(max(wall - eval_s, 0.5 * wall) / rounds)  # guard against timing noise
        samples.add(res.samples)
    assert len(samples) == 1, f"repeats processed different sample counts: {samples}"
    best = min(range(repeats), key=trains.__getitem__)
    train_s = trains[best]
    samples_per_round = samples.pop() / rounds
    sps = samples_per_round / train_s
    fwd = forward_flops(ctx)
    achieved = 3.0 * fwd * sps
    return {
        "workload": f"fedavg-fmnist-{model}", "model": model, "rounds": rounds, "repeats": repeats,
        "clients": cfg.n_clients, "samples_per_round": samples_per_round, "s_per_round": walls[best] / rounds,
        "eval_s": evals[best], "train_s_per_round": train_s, "spread": max(trains) / train_s,
        "samples_per_s": sps, "fwd_flops_per_sample": fwd, "achieved_flops": achieved,
        "threads": torch.get_num_threads(),
    }


def _fmt(v) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, int):
        return str(v)
    if abs(v) >= 1e6:
        return f"{v:.3e}"
    if abs(v) >= 100:
        return f"{v:.1f}"
    return f"{v:.4g}"


def markdown(rows: list[dict], first: dict[int, float], last: dict[int, float], header: list[str]) -> str:
    lines = [*header, ""]
    lines.append("| matmul n | FLOP/s before | FLOP/s after |")
    lines.append("|---:|---:|---:|")
    lines += [f"| {n} | {first[n] / 1e9:.1f} G | {last[n] / 1e9:.1f} G |" for n in first]
    lines.append("")
    cols = ("model", "samples_per_round", "s_per_round", "eval_s", "train_s_per_round", "spread", "samples_per_s",
            "fwd_flops_per_sample", "achieved_flops", "ratio_to_peak")
    lines.append("| " + " | ".join(cols) + " |")
    lines.append("|" + "|".join(["---"] + ["---:"] * (len(cols) - 1)) + "|")
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r[c]) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=None, help="timed rounds per repeat (default 5; --quick: 1)")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed runs per workload, the fastest counts (default 3; --quick: 1)")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "out", help="output folder")
    p.add_argument("--quick", action="store_true",
                   help="tiny settings for tests: subsample 0.02, 1 timed round, only n=1024 matmuls, "
                        "global test set cut to 500 images")
    p.add_argument("--test-cap", type=int, default=None,
                   help="evaluate the global model on the first N test images only (default 1000; --quick: 500; "
                        "0 = all 10000); the clients' local test sets are unchanged")
    a = p.parse_args(argv)
    rounds = a.rounds if a.rounds is not None else (1 if a.quick else 5)
    repeats = a.repeats if a.repeats is not None else (1 if a.quick else 3)
    if rounds < 1 or repeats < 1:
        p.error("--rounds and --repeats must be >= 1")
    if a.test_cap is not None and a.test_cap < 0:
        p.error("--test-cap must be >= 0")
    subsample = 0.02 if a.quick else 0.1
    sizes, reps = ((1024,), 4) if a.quick else ((1024, 2048), 8)

    test_cap = a.test_cap if a.test_cap is not None else (500 if a.quick else 1000)

    cpu_before = _cpu_seconds()
    t_start = time.perf_counter()
    first = matmul_peak(sizes, reps=reps)
    rows = [bench_workload(m, rounds, subsample, test_cap, repeats) for m in MODELS]
    # the peak is measured before and after the workloads, the best counts: a single
    # measurement is easily caught by a short disturbance and would inflate every ratio
    last = matmul_peak(sizes, reps=reps)
    peaks = {n: max(first[n], last[n]) for n in sizes}
    peak = max(peaks.values())
    for r in rows:
        r["peak_flops"] = peak
        r["ratio_to_peak"] = r["achieved_flops"] / peak
    total = time.perf_counter() - t_start
    other = _other_cpu_share(cpu_before, _cpu_seconds(), total)

    header = [
        f"# FedAvg benchmark ({'quick' if a.quick else 'default'} settings)",
        "",
        f"- machine: {platform.platform()}, {platform.processor() or platform.machine()}, "
        f"os.cpu_count()={os.cpu_count()}, torch.get_num_threads()={torch.get_num_threads()}",
        f"- torch {torch.__version__}, python {platform.python_version()}",
        f"- CPU used by other processes during the benchmark: {other:.0%} of all cores' time "
        f"(well above 0% means contention, and every number below is distorted by it)",
        f"- workload: fedavg on fmnist (pool train, iid), 20 clients, participation 1.0, 1 local epoch, "
        f"B=64, lr 0.01, momentum 0.9, subsample {subsample}; 1 warm-up round, then {repeats} timed "
        f"run(s) of {rounds} rounds with eval_every={rounds}, the fastest counts, global model evaluated on " + (f"the first {test_cap} test images" if test_cap
                                                                else "all 10000 test images"),
        f"- measured matmul peak (float32 torch.mm, best of {reps} before and {reps} after the workloads): "
        f"{peak / 1e9:.1f} GFLOP/s",
        "- s_per_round: timed run_rounds wall / rounds (includes one evaluation); train_s_per_round: the same "
        "minus that evaluation (eval_s, timed separately); spread: slowest / fastest repeat's train_s_per_round; "
        "samples/s and FLOP/s use train_s_per_round; achieved = 3 x fwd FLOPs x samples/s",
    ]
    md = markdown(rows, first, last, header)
    print(md)
    print(f"(benchmark took {total:.1f} s)")
    if other > 0.1:
        print(f"WARNING: other processes used {other:.0%} of the CPU meanwhile; rerun on an idle machine",
              file=sys.stderr)

    a.out.mkdir(parents=True, exist_ok=True)
    with open(a.out / "bench_fedavg.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(COLUMNS))
        w.writeheader()
        w.writerows(rows)
    with open(a.out / "matmul_peak.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["n", "flops", "flops_before", "flops_after", "threads"])
        w.writerows([n, peaks[n], first[n], last[n], torch.get_num_threads()] for n in sizes)
    (a.out / "bench_fedavg.md").write_text(md)
    print(f"wrote {a.out / 'bench_fedavg.csv'}, {a.out / 'matmul_peak.csv'}, {a.out / 'bench_fedavg.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
