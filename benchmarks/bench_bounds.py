"""What bounds batched local training on this machine: three micro-measurements, one run.

1. matmul throughput at the shapes small-batch FL training produces: one client's layer
   (B x 784 @ 784 x 512, B = 10 or 64), the same for C clients as one `bmm`, and a large square
   matmul (the machine's practical peak, as bench_fedavg measures it);
2. memory bandwidth: an in-place SGD-with-momentum step over the stacked weights of C clients
   (fits in cache for one client, not for 100), as GB/s of tensor traffic;
3. the fixed cost of one tiny op (Python + dispatcher), which per-client loops pay per layer per step.

    python benchmarks/bench_bounds.py [--out DIR] [--quick]

Prints a markdown table and writes bench_bounds.md to --out (default benchmarks/out/)."""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch


def best_of(fn, repeats: int, inner: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - t0) / inner)
    return best


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).parent / "out"))
    ap.add_argument("--quick", action="store_true", help="fewer repeats and 20 clients instead of 100")
    a = ap.parse_args(argv)
    rep, C = (2, 20) if a.quick else (5, 100)
    g = torch.Generator().manual_seed(0)
    rows = []

    def mm_row(what, fn, flops):
        s = best_of(fn, rep, 3)
        rows.append((what, f"{s * 1e3:.3f} ms", f"{flops / s / 1e9:.1f} GFLOP/s"))
        return flops / s

    n = 2048 if not a.quick else 1024
    A, Bm = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    peak = mm_row(f"matmul {n}x{n}x{n} (peak)", lambda: A @ Bm, 2 * n ** 3)
    W = torch.randn(784, 512, generator=g)
    for b in (10, 64):
        X = torch.randn(b, 784, generator=g)
        mm_row(f"one client: {b}x784 @ 784x512", lambda: X @ W, 2 * b * 784 * 512)
        Xs, Ws = torch.randn(C, b, 784, generator=g), torch.randn(C, 784, 512, generator=g)
        mm_row(f"{C} clients: bmm {C}x({b}x784 @ 784x512)", lambda: torch.bmm(Xs, Ws), 2 * C * b * 784 * 512)

    mlp = 784 * 512 + 512 + 512 * 256 + 256 + 256 * 64 + 64 + 64 * 10 + 10      # FedRep's MLP
    for clients in (1, C):
        p, gr, buf = (torch.randn(clients, mlp, generator=g) for _ in range(3))
        # fused SGD with momentum + weight decay: reads p, g, buf and writes p, buf = 5 passes
        step = lambda: torch._fused_sgd_([p], [gr], [buf], weight_decay=1e-5, momentum=0.9, lr=1e-3,  # noqa: E731
                                         dampening=0.0, nesterov=False, maximize=False, is_first_step=False)
        s = best_of(step, rep, 5 if clients > 1 else 200)
        traffic = 5 * 4 * clients * mlp
        rows.append((f"SGD step, MLP weights of {clients} client(s) ({4 * clients * mlp / 2**20:.1f} MB)",
                     f"{s * 1e3:.3f} ms", f"{traffic / s / 1e9:.1f} GB/s"))
    t = torch.zeros(1)
    s = best_of(lambda: t.add_(1.0), rep, 2000)
    rows.append(("one tiny op (t.add_(1.0))", f"{s * 1e6:.2f} us", "fixed cost"))

    lines = [f"torch {torch.__version__}, {torch.get_num_threads()} threads; practical peak {peak / 1e9:.1f} GFLOP/s",
             "", "| measurement | time | rate |", "|---|---:|---:|"]
    lines += [f"| {w} | {t_} | {r} |" for w, t_, r in rows]
    text = "\n".join(lines)
    print(text)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_bounds.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
