"""SCD's spectral term: one torch FFT call of the whole weight vector against pflrepro.algorithms.spectral's path.

Spectral co-distillation (pflrepro.algorithms.scd) takes the DFT magnitude of a model's whole weight vector
(and its gradient) at every local step. LeNet's vector has 44,190 = 2 x 3^2 x 5 x 491 entries; one call of
torch's FFT on such a length costs more than the CNN's own step, while `pflrepro.algorithms.spectral` splits lengths
with a large prime factor p into p x (d / p) (the four-step DFT: batched short FFTs). This script times, for
a few weight-vector lengths, one forward + backward of the spectral term D(normalise(s(w)) || q), the
reference (`rfft`: one torch.fft.rfft call and its mirror) and pflrepro's (`pflrepro`), per client
(one vector) and for 20 clients at once under `vmap` (the batched engine), and checks that both give the
same spectrum. Ratios are reference time / pflrepro time, measured in the same run, fastest of R.

    python benchmarks/bench_spectrum.py            # LeNet (1 and 3 channels), a power of two, ResNet-18
    python benchmarks/bench_spectrum.py --quick    # LeNet's length only, ~5 s (tests/test_benchmarks.py)
"""
from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import torch
from torch.func import grad, vmap

from pflrepro.algorithms.spectral import _largest_prime_factor, divergence, normalise, spectrum

LENGTHS = {"lenet_fmnist": 44190, "lenet_cifar": 61770, "pow2": 65536, "resnet18": 11169152}


def rfft_spectrum(w: torch.Tensor) -> torch.Tensor:
    d = w.shape[-1]
    r = torch.fft.rfft(w).abs()
    return torch.cat([r, r[..., 1:d - d // 2].flip(-1)], -1)


def term(spec, q):
    """w -> D(normalise(spec(w)) || q), as pflrepro.algorithms.spectral.spectral_term computes it."""
    return lambda w: divergence(normalise(spec(w)), q)


def fastest(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def measure(name: str, d: int, repeats: int, clients: int) -> dict:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(d, generator=g)
    q = normalise(torch.rand(d, generator=g) + 0.1)
    ours = lambda v: spectrum({"w": v}, ["w"])   # noqa: E731
    err = ((ours(w) - rfft_spectrum(w)).abs().max() / rfft_spectrum(w).abs().max()).item()
    row = {"workload": name, "length": d, "largest_prime": _largest_prime_factor(d), "max_rel_diff": err}
    for label, spec in (("rfft", rfft_spectrum), ("pflrepro", ours)):
        row[f"{label}_ms"] = 1e3 * fastest(lambda: grad(term(spec, q))(w), repeats)
    if clients:
        W = torch.randn(clients, d, generator=g)
        for label, spec in (("rfft", rfft_spectrum), ("pflrepro", ours)):
            row[f"{label}_vmap{clients}_ms"] = 1e3 * fastest(lambda: vmap(grad(term(spec, q)))(W), repeats)
        row["vmap_ratio"] = row[f"rfft_vmap{clients}_ms"] / row[f"pflrepro_vmap{clients}_ms"]
    row["ratio"] = row["rfft_ms"] / row["pflrepro_ms"]
    return row


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="LeNet's length only, fewer repeats")
    ap.add_argument("--repeats", type=int, default=None, help="timed repetitions, the fastest counts (default 10)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "out"))
    a = ap.parse_args(argv)
    repeats = a.repeats or (3 if a.quick else 10)
    names = ["lenet_fmnist"] if a.quick else list(LENGTHS)
    rows = []
    before = torch.get_num_threads()
    torch.set_num_threads(1)                    # as each run trains under pflrepro.pipeline.parallel on this machine
    try:                                        # restored after: callers in the same process (tests) keep theirs
        for n in names:
            big = LENGTHS[n] > 1_000_000
            rows.append(measure(n, LENGTHS[n], 1 if big else repeats, 0 if big else 20))
    finally:
        torch.set_num_threads(before)
    for r in rows:
        n = r["workload"]
        print(f"{n:13s} d={r['length']:>9,} p={r['largest_prime']:>5}: rfft {r['rfft_ms']:9.2f} ms, pflrepro "
              f"{r['pflrepro_ms']:9.2f} ms, ratio {r['ratio']:.2f}x"
              + (f"; vmap x20 ratio {r['vmap_ratio']:.2f}x" if "vmap_ratio" in r else "")
              + f"; max rel. diff {r['max_rel_diff']:.1e}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    keys = sorted({k for r in rows for k in r}, key=lambda k: (k != "workload", k))
    with open(out / "bench_spectrum.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=keys)
        wr.writeheader()
        wr.writerows(rows)
    return rows


if __name__ == "__main__":
    main()
