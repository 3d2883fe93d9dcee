"""What a sample run cannot get below at unchanged arithmetic: the time of its matrix-multiply and convolution kernels,
and how close those kernels run to this core's matmul peak.

For each run of `--sample` (of `bench_phases`'s: one seed-0 mini run of each paper's most expensive stage), at one
torch thread (a `dvc repro` worker's), each into a fresh run store:
- `wall_s`: the whole run, unprofiled (fastest of R);
- under `torch.profiler`, the self CPU seconds of the kernels that do the arithmetic: `matmul_s` (aten::mm, addmm,
  bmm), `conv_s` (convolution forward and backward), `fft_s` (torch.fft), and `floor_s` = matmul + conv: what the run
  costs if everything else (SGD updates, pooling, activations, Python, evaluation's bookkeeping, checkpoints) took
  no time at all;
- `max_ratio` = `--baseline-wall` (the run's wall time at the baseline commit, from `bench_phases`) / `floor_s`: the
  largest speed-up over that baseline any change that keeps the arithmetic could reach.
Then the dense layers' three products (forward, input gradient, weight gradient) of the sample's fully connected
layers at their batch size, in GFLOP/s beside a 512^3 matmul (this core's practical peak): how far the largest part
of the floor is from the hardware's.

    python benchmarks/bench_floor.py --baseline-wall dcpfl=11.833,scd=17.083     # DC-PFL and SCD (the default)
    python benchmarks/bench_floor.py --quick        # dcpfl, 2 rounds (tests/test_benchmarks.py)
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import profile

from pflrepro.pipeline import store

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cli import parser, torch_threads  # noqa: E402
from _table import write_table  # noqa: E402
from bench_bounds import best_of  # noqa: E402
from bench_phases import SAMPLE as PHASES_SAMPLE  # noqa: E402
from bench_phases import sample_config  # noqa: E402

SAMPLE = {s[0]: s[1:] for s in PHASES_SAMPLE}   # label -> (params file, method, setting, seed)
KERNELS = {"matmul": ("aten::mm", "aten::addmm", "aten::bmm"),
           "conv": ("aten::mkldnn_convolution", "aten::convolution_backward", "aten::_convolution",
                    "aten::_slow_conv2d_forward", "aten::_slow_conv2d_backward"),
           "fft": ("aten::_fft_c2c", "aten::_fft_r2c", "aten::_fft_c2r")}
COLUMNS = ("run", "wall_s", "profiled_s", "matmul_s", "conv_s", "fft_s", "floor_s", "floor_share", "baseline_wall_s",
           "max_ratio")
LAYER_COLUMNS = ("layer", "batch", "forward_gflops", "input_grad_gflops", "weight_grad_gflops", "peak_gflops")


def _run(cfg, prof: bool) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory(prefix="bench-floor-") as root:
        t = time.perf_counter()
        if not prof:
            store.run(cfg, root=root, progress=False)
            return time.perf_counter() - t, {}
        with profile() as p:
            store.run(cfg, root=root, progress=False)
        wall = time.perf_counter() - t
    self_s = {e.key: e.self_cpu_time_total / 1e6 for e in p.key_averages()}
    return wall, {k: sum(self_s.get(n, 0.0) for n in names) for k, names in KERNELS.items()}


def run_row(label: str, cfg, repeats: int, baseline: float | None) -> dict:
    wall = min(_run(cfg, False)[0] for _ in range(repeats))
    profiled, k = _run(cfg, True)
    floor = k["matmul"] + k["conv"]
    return {"run": label, "wall_s": round(wall, 2), "profiled_s": round(profiled, 2),
            **{f"{n}_s": round(v, 2) for n, v in k.items()}, "floor_s": round(floor, 2),
            "floor_share": round(floor / wall, 2), "baseline_wall_s": baseline or "",
            "max_ratio": round(baseline / floor, 2) if baseline else ""}


def layer_rows(cfg, repeats: int) -> list[dict]:
    """The products of every large Linear layer of the run's model at the run's batch size, against a 512^3 matmul."""
    from pflrepro.data.models import build_model
    net = build_model(cfg.model, 1, 10, 28)
    B = cfg.batch_size
    a, c = torch.randn(512, 512), torch.randn(512, 512)
    peak = 2 * 512 ** 3 / best_of(lambda: a.mm(c), repeats, 20) / 1e9
    rows = []
    for name, m in net.named_modules():
        if not isinstance(m, torch.nn.Linear) or m.in_features * m.out_features < 10 ** 5:
            continue
        x, gy = torch.randn(B, m.in_features), torch.randn(B, m.out_features)
        W, b = m.weight.detach(), m.bias.detach()
        flop = 2 * B * m.in_features * m.out_features / 1e9
        rows.append({"layer": f"{cfg.model}.{name} ({m.in_features}->{m.out_features})", "batch": B,
                     **{col: round(flop / best_of(fn, repeats, 50), 1) for col, fn in (
                         ("forward_gflops", lambda: torch.addmm(b, x, W.t())),
                         ("input_grad_gflops", lambda: gy.mm(W)),
                         ("weight_grad_gflops", lambda: gy.t().mm(x)))},
                     "peak_gflops": round(peak, 1)})
    return rows


def main(argv: list[str] | None = None) -> tuple[list[dict], list[dict]]:
    ap = parser(__doc__, "dcpfl, 2 rounds", 2)
    ap.add_argument("--sample", default="dcpfl,scd", help=f"comma-separated, of {', '.join(SAMPLE)} (default: the two "
                    "client-by-client runs; the profiler holds every operation's event, and a batched run's many small "
                    "operations took over 10 minutes and 12 GB for pFedSD's)")
    ap.add_argument("--baseline-wall", default="", help="label=seconds,...: each run's wall time at the baseline")
    a = ap.parse_args(argv)
    labels = ["dcpfl"] if a.quick else a.sample.split(",")
    unknown = sorted(set(labels) - set(SAMPLE))
    if unknown:
        ap.error(f"unknown sample label(s) {', '.join(unknown)}; known: {', '.join(SAMPLE)}")
    try:
        base = {k: float(v) for k, v in (p.split("=") for p in a.baseline_wall.split(",") if p)}
    except ValueError:
        ap.error(f"--baseline-wall {a.baseline_wall!r}: expected label=seconds,...")
    with torch_threads(a.threads):
        cfgs = {lb: sample_config(*SAMPLE[lb], a.quick)[1] for lb in labels}
        rows = [run_row(lb, cfgs[lb], a.repeats, base.get(lb)) for lb in labels]
        layers = [r for lb in labels for r in layer_rows(cfgs[lb], 1 if a.quick else 5)]
    out = Path(a.out)
    write_table(out, "bench_floor", list(COLUMNS), rows,
                f"torch {torch.__version__}, {a.threads} thread(s); wall fastest of {a.repeats}, kernels from one "
                f"profiled run; floor = matmul + conv kernels; max_ratio = baseline wall / floor")
    write_table(out, "bench_floor_layers", list(LAYER_COLUMNS), layers,
                "GFLOP/s of one Linear layer's three products at the run's batch size (best of 5), beside a 512^3 "
                "matmul")
    return rows, layers


if __name__ == "__main__":
    main()
