"""Runs trained together (executor "stacked", pflrepro.core.engines.together) against the same runs one after another.

    python benchmarks/bench_together.py [--quick] [--seeds 6] [--device cpu|cuda] [--threads 1] [--out DIR]

Per workload, `--seeds` runs that differ only in their seed (one method, one setting, engine="batched" on both
sides, so the comparison is stacking alone) are trained twice in this process, each time into an empty store:
`alone`, one run after another (`store.run`), and `stacked`, all of them in lockstep with their clients' local
training in shared calls (`Stacker.run_all`). Reported: seconds of each, `speedup` = alone / stacked (above 1: stacking
pays), the clients a stacked call held, and how far the metrics moved (`max_pm_diff`: the largest difference of a
round's mean personalized accuracy between the two; 0 = bit for bit). Workloads (Fashion-MNIST):
- `mlp_fedavg`: FedAvg, FedRep's MLP (mlp, 0.54 M parameters), 10 clients, B = 10, E = 1;
- `lenet_pfedsd`: pFedSD on the LeNet-size CNN (cnn_cifar10's layers at 28 x 28), 10 clients, B = 16, E = 1;
- `cnn_fmnist_pfedsd`: pFedSD on its paper's FMNIST CNN (cnn_fmnist, 0.24 M), 10 clients, B = 64, E = 1.
On these CPUs stacking may not pay: the engine rule (`batched.slower_batched`) already trains large models client by
client here; the number that matters is a GPU's (scripts/gpu_check.py runs this with --device cuda). Written to
<out>/bench_together.csv and .md.
"""
from __future__ import annotations

import csv
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for p in (str(REPO), str(Path(__file__).resolve().parent)):
    if p not in sys.path:
        sys.path.insert(0, p)
from _cli import parser, torch_threads  # noqa: E402

COLUMNS = ["workload", "device", "seeds", "rounds", "alone_s", "stacked_s", "speedup", "clients_per_call",
           "max_pm_diff"]
BASE = dict(dataset="fmnist", subsample=0.05, n_clients=10, partition="balanced_dirichlet",
            partition_params={"alpha": 0.1}, pool="train+test", split="random", split_params={"fractions": [0.8, 0.2]},
            local_epochs=1, lr=0.01, momentum=0.9, weight_decay=1e-5, engine="batched", checkpoint_every=1000)
WORKLOADS = {
    "mlp_fedavg": dict(algorithm="fedavg", model="mlp", batch_size=10),
    "lenet_pfedsd": dict(algorithm="pfedsd", model="cnn_cifar10", batch_size=16),
    "cnn_fmnist_pfedsd": dict(algorithm="pfedsd", model="cnn_fmnist", batch_size=64),
}


def configs(name: str, seeds: int, rounds: int, device: str) -> list:
    from pflrepro.federation.config import RunConfig
    return [RunConfig.from_dict({**BASE, **WORKLOADS[name], "rounds": rounds, "seed": 900 + s, "device": device})
            for s in range(seeds)]


def measure(cfgs: list) -> dict:
    from pflrepro.core.engines import Stacker
    from pflrepro.pipeline.store import run
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        run(cfgs[0].replace(rounds=1, seed=899), root=a, progress=False)   # warm-up: data loaded, kernels chosen
        t = time.perf_counter()
        alone = [run(c, root=a, progress=False) for c in cfgs]
        t_alone = time.perf_counter() - t
        st = Stacker()
        t = time.perf_counter()
        outs = st.run_all([lambda c=c: run(c, root=b, progress=False) for c in cfgs])
        t_stacked = time.perf_counter() - t
    for _, err in outs:
        if err is not None:
            raise err
    diff = max(abs(g["pm_acc_mean"] - w["pm_acc_mean"]) for (res, _), al in zip(outs, alone)
               for g, w in zip(res.history, al.history))
    per_call = max((n for _, n in st.calls), default=0)
    return {"alone_s": round(t_alone, 2), "stacked_s": round(t_stacked, 2),
            "speedup": round(t_alone / t_stacked, 3), "clients_per_call": per_call, "max_pm_diff": diff}


def main(argv=None) -> list[dict]:
    ap = parser(__doc__, "2 seeds, 2 rounds, the MLP and LeNet workloads only", repeats=1)
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    a = ap.parse_args(argv)
    names = a.workloads.split(",")
    if a.quick:
        a.seeds, a.rounds, names = 2, 2, ["mlp_fedavg", "lenet_pfedsd"]
    rows = []
    with torch_threads(a.threads):
        for name in names:
            cfgs = configs(name, a.seeds, a.rounds, a.device)
            best = None
            for _ in range(a.repeats):
                m = measure(cfgs)
                best = m if best is None or m["stacked_s"] + m["alone_s"] < best["stacked_s"] + best["alone_s"] else best
            rows.append({"workload": name, "device": a.device, "seeds": a.seeds, "rounds": a.rounds, **best})
            print(rows[-1], flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "bench_together.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(r[c]) for c in COLUMNS) + " |" for r in rows]
    (out / "bench_together.md").write_text("\n".join(lines) + "\n")
    return rows


if __name__ == "__main__":
    main()
