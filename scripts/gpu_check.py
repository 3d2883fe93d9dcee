"""The device check (issue 32): correctness, speed and paper-scale evidence on one CUDA machine, inside a budget.

    PYTHONPATH=. python3 scripts/gpu_check.py --out DIR [--budget-s 540] [--device auto|cuda|cpu] [--tiny]

For a bare CUDA machine lent for a few minutes: it needs nothing beyond a checkout and what a PyTorch image holds
(torch >= 2.11, numpy, scipy, pandas, PyYAML; no pflrepro install, no network). Fashion-MNIST comes from the usual
places (pflrepro.data.datasets: data/fmnist.pt, the Debian IDX files, or $PFLREPRO_DATA/FashionMNIST/raw/*.gz: copy
the four IDX .gz files, 30 MB, beside the checkout). It stops itself inside `--budget-s` (each step gets a share; a
step that finds no time left is skipped with a line saying so) and writes everything into DIR, at most 8 files
(what a lent machine gives back):

  gpu_check.md          the report: environment, each step's result and time, what was skipped
  correctness.csv       1. a round of every algorithm on the device; per-client vs batched engine on the same runs;
                           the same run twice (bit-identical or not), with default and deterministic settings; seeds
                           trained stacked (executor "stacked": their clients in shared calls) against each alone
  bench_engines.csv     2. benchmarks/bench_engines.py on the device (conventional, per-client, batched engines; the
                           matmul peak measured in the same run), then benchmarks/bench_together.py (seeds stacked
                           against one after another; rows with bench = "stacked")
  evidence.csv          3. the evidence plan (EVIDENCE): each paper's headline row at that paper's own settings on
                           Fashion-MNIST (its model, clients, E, B, participation, rounds: fewer rounds only where a
                           lease cannot hold them, said per row), the most decisive first, three paired seeds, the
                           seeds of a method trained stacked in one process; each run's best and final metric
  evidence_curves.csv      the same runs, every evaluated round
  evidence_claims.csv      the paired comparisons those runs decide (pflrepro.reporting.verdicts' rule)
  runs.tar.gz              every evidence run that finished, as the verified run records of its store (the paper-scale
                           tier: unpack into a store and the report reads it, docs/evidence.md)
  log.txt               everything printed; its first line is the environment (device, versions, determinism settings)

`--tiny` shrinks every step to seconds (a few clients, one or two rounds, one benchmark workload): with `--device cpu`
it runs in CI (tests/test_gpu_check.py), so the check cannot rot before the next GPU comes.

`--store DIR` keeps the evidence runs in DIR: a second call with the same DIR resumes each run the first stopped at
its budget from its last checkpoint (bit for bit on a CPU) and reuses each finished one, so the paper-scale tier can
train on a CPU over several sittings (`--device cpu --steps 3 --store DIR`, the budget as long as a sitting).
Where the machine is wiped between sittings, `--records DIR` copies each finished record, verified, into DIR in the
tier's layout (runs.tar.gz's, unpacked) to be committed, and `--collect` trains nothing: it reads and copies what the
store has finished, for a sitting that ends before the call does."""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import pflrepro  # noqa: F401, I001  (first: its thread settings must precede torch)
import torch

from pflrepro.algorithms import ALGORITHMS
from pflrepro.pipeline.store import WALL_COLUMNS, is_finished, load_checkpoint, load_result, run, run_dir
from pflrepro.reporting.tier import PAPER_METHOD, paired_claims, paper_value, paper_values  # noqa: F401

SMOKE = {"dataset": "fmnist", "subsample": 0.02, "n_clients": 4, "partition": "iid", "split": "random",
         "split_params": {"fractions": [0.8, 0.2]}, "model": "cnn_cifar10", "rounds": 1, "local_epochs": 1,
         "batch_size": 16, "lr": 0.05, "momentum": 0.9, "checkpoint_every": 1}
ENGINE_ALGOS = ("fedavg", "pfedsd", "ditto", "fedrep", "scd")      # plan-based: both engines run them
DETERMINISM_ALGOS = ("fedavg", "pfedsd")
# The evidence plan (issue 56): each paper's headline row at that paper's own settings (its model, clients, E, B,
# participation, rounds) on Fashion-MNIST, the most decisive first: (params file, setting of its paper profile,
# methods, rounds or None for the paper's, overrides). pFedSD Table 2's FMNIST rows are the paper's own cells; the
# other papers' rows are their headline CIFAR settings with the data swapped (PerFed-CKT's public set: unused
# Fashion-MNIST training images instead of CIFAR-100). Rounds are cut only where a 10-minute lease cannot hold the
# paper's (the cut is in the row and the report): DC-PFL's cnn1 (2 M parameters, E = 10 over 6,000 images a client)
# 20 of 100, PerFed-CKT's VGG-11 50 of 500, SCD's ResNet-18 (100 clients, every one every round, E = 5) 10 of 500,
# estimated from the H200 rates of 2026-11-28 (docs/performance.md), to be replaced by the first lease's measurement.
FMNIST = {"dataset": "fmnist"}
SLICES = (("pfedsd_table2", "fmnist 100 clients", ("fedprox", "pfedme", "fedfomo"), None, {}),
          ("fedbsd_table1", "cifar10 N=100 S=2", ("fedbsd", "fedrep", "fedper"), None, FMNIST),
          ("dcpfl_table1", "cifar10 K=10 r=100%", ("dcpfl", "fedgh", "local"), 20, FMNIST),
          ("perfed_ckt_table1", "C=0.15", ("perfed_ckt_c3", "perfed_ckt_c1", "ditto"), 50,
           {**FMNIST, "public": {"dataset": "", "split": "train", "size": 2000}}),
          ("scd_table1", "alpha=0.1", ("scd", "fedrod", "fedavg"), 10, FMNIST),
          ("pfedsd_table2", "fmnist 100 clients", ("pfedsd", "fedper", "lg_fedavg", "fedavg"), None, {}),
          ("pfedsd_table2", "fmnist 20 clients", ("pfedsd", "fedper", "lg_fedavg", "fedavg"), None, {}))
RUNS_TAR_MAX = 15 * 2**20
SEEDS = 3                     # paired seeds a slice trains (0, 1, 2)
# `--tiny` (the CPU rehearsal in CI) trains the deep paper models' slices on the LeNet-size CNN: their architectures
# have tests of their own (make test-full); the rehearsal proves the plan's path (configs, stacking, records), not them
TINY_MODEL = {"vgg11": "cnn_cifar10", "resnet18": "cnn_cifar10", "cnn1": "cnn_cifar10"}     # a file a lent machine gives back is at most 16 MiB
SHARES = {"correctness": 0.2, "bench": 0.2}   # of the budget; the evidence gets the rest
TINY_SHARES = {"correctness": 0.45, "bench": 0.2}


class Clock:
    def __init__(self, budget_s: float):
        self.t0, self.budget = time.monotonic(), budget_s

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.t0)


class Report:
    """The log (printed and kept) and the markdown report."""

    def __init__(self, out: Path):
        self.out, self.lines, self.md = out, [], []

    def say(self, *parts) -> None:
        line = " ".join(str(p) for p in parts)
        print(line, flush=True)
        self.lines.append(line)

    def section(self, title: str, body: str = "") -> None:
        self.md += [f"## {title}", "", body, ""] if body else [f"## {title}", ""]

    def write(self) -> None:
        (self.out / "log.txt").write_text("\n".join(self.lines) + "\n")
        (self.out / "gpu_check.md").write_text("\n".join(self.md) + "\n")


def write_csv(path: Path, rows: list[dict]) -> None:
    if not rows:
        return
    cols = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, cols)
        w.writeheader()
        w.writerows(rows)


def md_table(rows: list[dict], cols: list[str]) -> str:
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)
    return "\n".join(["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
                     + ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows])


# ---------------------------------------------------------------- environment
def environment(device: torch.device) -> dict:
    env = {"torch": torch.__version__, "python": sys.version.split()[0], "device": str(device),
           "cuda_available": torch.cuda.is_available(), "threads": torch.get_num_threads(),
           "cudnn_benchmark": torch.backends.cudnn.benchmark, "cudnn_deterministic": torch.backends.cudnn.deterministic,
           "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
           "CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
           "tf32_matmul": torch.backends.cuda.matmul.allow_tf32, "tf32_cudnn": torch.backends.cudnn.allow_tf32}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        env.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1), multiprocessors=p.multi_processor_count,
                   cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version())
    try:
        env["git"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                    timeout=10, check=False).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        env["git"] = None
    env["git"] = os.environ.get("PFLREPRO_COMMIT") or env["git"]   # a copied checkout names its commit here
    return env


# ---------------------------------------------------------------- 1. correctness
def smoke_config(algorithm: str, device: str, **kw) -> dict:
    cls = ALGORITHMS[algorithm]
    hp = {k: 1 for k in cls.HPARAMS if k.endswith("_epochs") or k == "K"}   # one epoch of each extra phase
    if "distill_steps" in cls.HPARAMS:
        hp["distill_steps"] = 3
    d = {**SMOKE, "algorithm": algorithm, "device": device, "hparams": hp, **kw}
    if getattr(cls, "needs_public", False):
        d["public"] = {"size": 40}
    return d


def _timed_run(cfg: dict, root: Path) -> tuple:
    t0 = time.perf_counter()
    res = run(cfg, root=root, progress=False)
    return res, time.perf_counter() - t0


def smoke_rounds(device: str, clock: Clock, until: float, root: Path, rep: Report) -> list[dict]:
    rows = []
    for a in sorted(ALGORITHMS):
        if clock.left() < until:
            rows.append({"check": "smoke round", "what": a, "ok": "skipped: budget"})
            continue
        try:
            res, s = _timed_run(smoke_config(a, device, rounds=2), root)   # round 2: teachers, combined heads
            h = res.history[-1]
            ok = all(math.isfinite(v) for k, v in h.items() if k in ("pm_acc_mean", "train_loss"))
            rows.append({"check": "smoke round", "what": a, "ok": ok, "seconds": round(s, 2),
                         "pm_acc_mean": h.get("pm_acc_mean"), "train_loss": h.get("train_loss")})
        except Exception as e:   # noqa: BLE001  (the check reports every failure and goes on)
            rows.append({"check": "smoke round", "what": a, "ok": False, "error": f"{type(e).__name__}: {e}"[:300]})
        rep.say(f"  smoke {a:<18} {rows[-1]['ok']} {rows[-1].get('seconds', '')}")
    return rows


def engines_agree(device: str, clock: Clock, until: float, root: Path, rep: Report) -> list[dict]:
    rows = []
    for a in ENGINE_ALGOS:
        if clock.left() < until:
            rows.append({"check": "engines agree", "what": a, "ok": "skipped: budget"})
            continue
        hist = {}
        for engine in ("per_client", "batched"):
            res, _ = _timed_run(smoke_config(a, device, rounds=2, engine=engine), root)
            hist[engine] = res.history
        keys = [k for k in ("gm_acc", "pm_acc_mean", "train_loss") if k in hist["batched"][0]]
        diff = {k: max(abs(p[k] - b[k]) for p, b in zip(hist["per_client"], hist["batched"])) for k in keys}
        first = abs(hist["per_client"][0]["train_loss"] - hist["batched"][0]["train_loss"])
        # round 1's mean training loss must agree to float rounding (relative 1e-4); later rounds may drift further
        # (different kernels: grouped convolutions under vmap; CUDA's atomics), reported, not judged
        ok = first <= 1e-4 * abs(hist["per_client"][0]["train_loss"])
        rows.append({"check": "engines agree", "what": a, "ok": ok, "round1_diff_train_loss": first,
                     **{f"max_diff_{k}": v for k, v in diff.items()}})
        rep.say(f"  engines {a:<10} {ok} {diff}")
    return rows


def _numbers(res) -> list:
    """Every metric of every evaluated round and every client's accuracy (wall-clock columns left out)."""
    return [[v for k, v in sorted(h.items()) if k not in WALL_COLUMNS] for h in res.history] + res.per_client


def deterministic() -> None:
    """PyTorch's reproducibility settings (cuBLAS reads CUBLAS_WORKSPACE_CONFIG when its handle is made: so this
    mode runs in a process of its own, `--twice-child`)."""
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def twice(device: str, mode: str, root: Path) -> list[dict]:
    rows = []
    for a in DETERMINISM_ALGOS:
        cfg = smoke_config(a, device, rounds=2, seed=1)
        first = _numbers(run(cfg, root=root / f"{mode}-1", progress=False))
        second = _numbers(run(cfg, root=root / f"{mode}-2", progress=False))
        diff = max(abs(x - y) for r1, r2 in zip(first, second) for x, y in zip(r1, r2))
        rows.append({"check": f"same run twice ({mode})", "what": a, "ok": first == second, "max_diff": diff})
    return rows


def same_twice(device: str, clock: Clock, until: float, root: Path, rep: Report) -> list[dict]:
    """The same config twice into two stores, with PyTorch's defaults here, then (a child process) with its
    deterministic settings and CUBLAS_WORKSPACE_CONFIG=:4096:8."""
    if clock.left() < until:
        return [{"check": "same run twice", "what": ", ".join(DETERMINISM_ALGOS), "ok": "skipped: budget"}]
    rows = twice(device, "default", root)
    env = {**os.environ, "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    proc = subprocess.run([sys.executable, __file__, "--twice-child", device, str(root)], env=env, cwd=REPO,
                          capture_output=True, text=True, check=False, timeout=max(clock.left() - until, 10))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("ROWS ")]
    rows += json.loads(lines[-1][5:]) if lines else [{"check": "same run twice (deterministic)", "what": "child",
                                                       "ok": False, "error": proc.stderr[-300:]}]
    for r in rows:
        rep.say(f"  twice {r['check']:<32} {r['what']:<8} bit-identical={r['ok']} max diff {r.get('max_diff')}")
    return rows


STACK_ALGOS = ("fedavg", "pfedsd")


def stacked_agree(device: str, clock: Clock, until: float, root: Path, rep: Report) -> list[dict]:
    """Three seeds trained stacked (their clients in shared calls: core/engines/together.py) against each trained alone, on
    the device: round 1's mean training loss must agree to float rounding (relative 1e-4), every client of the three
    runs must have shared each call; how far the metrics moved, and whether bit for bit, are reported."""
    from pflrepro.core.engines import Stacker
    rows = []
    for a in STACK_ALGOS:
        if clock.left() < until:
            rows.append({"check": "stacked = alone", "what": a, "ok": "skipped: budget"})
            continue
        cfgs = [smoke_config(a, device, rounds=2, seed=s, engine="batched") for s in (0, 1, 2)]
        alone = [run(c, root=root / "alone", progress=False) for c in cfgs]
        st = Stacker()
        outs = st.run_all([lambda c=c: run(c, root=root / "stacked", progress=False) for c in cfgs])
        errors = [f"{type(e).__name__}: {e}"[:300] for _, e in outs if e is not None]
        if errors:
            rows.append({"check": "stacked = alone", "what": a, "ok": False, "error": errors[0]})
            continue
        first = max(abs(g.history[0]["train_loss"] - w.history[0]["train_loss"]) / abs(w.history[0]["train_loss"])
                    for (g, _), w in zip(outs, alone))
        pm = max(abs(x["pm_acc_mean"] - y["pm_acc_mean"]) for (g, _), w in zip(outs, alone)
                 for x, y in zip(g.history, w.history))
        shared = max((n for _, n in st.calls), default=0)
        ok = first <= 1e-4 and shared == 3 * SMOKE["n_clients"]
        rows.append({"check": "stacked = alone", "what": a, "ok": ok, "round1_diff_train_loss": first,
                     "max_diff_pm_acc_mean": pm, "max_diff": pm,
                     "bit_identical": all(_numbers(g) == _numbers(w) for (g, _), w in zip(outs, alone)),
                     "clients_per_call": shared})
        rep.say(f"  stacked {a:<10} {ok} round-1 loss rel diff {first:.2g}, pm diff {pm:.2g}, {shared} clients a call")
    return rows


def correctness(device: str, clock: Clock, stop_at: float, root: Path, rep: Report) -> list[dict]:
    rows = engines_agree(device, clock, stop_at, root / "engines", rep)
    rows += stacked_agree(device, clock, stop_at, root / "stacked", rep)
    rows += same_twice(device, clock, stop_at, root / "twice", rep)
    return rows + smoke_rounds(device, clock, stop_at, root / "smoke", rep)


# ---------------------------------------------------------------- 2. engine benchmark
BENCH_WORKLOADS = ("a_mini", "c_mlp_b10", "b_paper_b64", "b_paper_b10")   # bench_engines.WORKLOADS, cheapest first


def bench(device: str, seconds: float, tiny: bool, rep: Report, which=None) -> tuple[list[dict], str]:
    """benchmarks/bench_engines.py, one workload per invocation (each measures the matmul peak beside its engines),
    until the share of the budget is spent: a workload that would not finish is skipped, the others stay."""
    rows, mds, t0 = [], [], time.monotonic()
    for w in which or (BENCH_WORKLOADS[1:2] if tiny else BENCH_WORKLOADS):
        left = seconds - (time.monotonic() - t0)
        if left < 15:
            mds.append(f"- `{w}`: skipped, {max(left, 0):.0f} s of the step's share left")
            continue
        tmp = Path(tempfile.mkdtemp(prefix="gpu-check-bench-"))
        cmd = [sys.executable, str(REPO / "benchmarks" / "bench_engines.py"), "--device", device, "--out", str(tmp),
               "--workloads", w] + (["--quick"] if tiny else ["--rounds", "2"])
        t = time.monotonic()
        try:
            proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=left, check=False)
        except subprocess.TimeoutExpired:
            mds.append(f"- `{w}`: stopped at the step's share of the budget ({seconds:.0f} s)")
            continue
        rep.say(proc.stderr[-2000:] + f"\n  {w}: {time.monotonic() - t:.0f} s in all (process start, matmul peak, "
                "setup, engines)")
        if proc.returncode != 0 or not (tmp / "bench_engines.csv").exists():
            mds.append(f"- `{w}`: failed (exit {proc.returncode}): {proc.stderr[-400:]}")
            continue
        with open(tmp / "bench_engines.csv") as f:
            rows += list(csv.DictReader(f))
        md = (tmp / "bench_engines.md").read_text()
        mds.append(md[md.index("| workload |"):] if "| workload |" in md else md)
    srows, smd = bench_stacked(device, seconds - (time.monotonic() - t0), tiny, rep)
    return rows + srows, "\n\n".join(mds + [smd])


def bench_stacked(device: str, left: float, tiny: bool, rep: Report) -> tuple[list[dict], str]:
    """benchmarks/bench_together.py on the device: seeds stacked against one after another (rows: bench = stacked)."""
    if left < 15:
        return [], f"- stacked seeds: skipped, {max(left, 0):.0f} s of the step's share left"
    tmp = Path(tempfile.mkdtemp(prefix="gpu-check-stacked-"))
    cmd = [sys.executable, str(REPO / "benchmarks" / "bench_together.py"), "--device", device, "--out", str(tmp)] + \
        (["--quick"] if tiny else ["--seeds", "6", "--rounds", "3"])
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=left, check=False)
    except subprocess.TimeoutExpired:
        return [], f"- stacked seeds: stopped at the step's share of the budget ({left:.0f} s)"
    rep.say(proc.stdout[-2000:] + proc.stderr[-1000:])
    if proc.returncode != 0 or not (tmp / "bench_together.csv").exists():
        return [], f"- stacked seeds: failed (exit {proc.returncode}): {proc.stderr[-400:]}"
    with open(tmp / "bench_together.csv") as f:
        rows = [{"bench": "stacked", **r} for r in csv.DictReader(f)]
    return rows, "Seeds stacked (`benchmarks/bench_together.py`):\n\n" + (tmp / "bench_together.md").read_text()


# ---------------------------------------------------------------- 3. paper-scale evidence
def slice_configs(name: str, setting: str, methods, rounds, tiny: bool, device: str, over: dict | None = None) -> dict:
    """{(method, seed): config}: the paper profile's configs of `setting`, with `over` (the data swapped), the device
    and the checkpoint interval; `rounds` caps the paper's rounds. `tiny`: two methods, two seeds, seconds' scale."""
    from pflrepro.federation.config import RunConfig
    from pflrepro.pipeline.experiments import grid, load_profile
    p = load_profile(name, "paper")
    over = {**(over or {}), "device": device, "checkpoint_every": 5}
    if tiny:
        over.update(subsample=0.05, n_clients=10, participation=0.5, rounds=2, local_epochs=1)
        if over.get("public"):
            over["public"] = {**over["public"], "size": 40}
    g = grid(p)
    methods = methods[:2] if tiny else methods
    out = {}
    for (m, st, _), cfg in g.items():
        if m not in methods or st != setting or any(k[0] == m for k in out):
            continue
        for seed in range(2 if tiny else SEEDS):    # three paired seeds, whatever the profile runs (DC-PFL's: one)
            d = {**cfg.to_dict(), **over, "seed": seed}
            if rounds and not tiny:
                d["rounds"] = min(rounds, cfg.rounds)
            if tiny and d["model"] in TINY_MODEL and not d["models"]:
                d["model"] = TINY_MODEL[d["model"]]
            if tiny:     # one epoch of each extra phase, two local iterations (PerFed-CKT's tau), small batches
                d["hparams"] = {k: (1 if k.endswith("_epochs") else 2 if k == "tau" and isinstance(v, int) else
                                    16 if k == "public_batch" else v) for k, v in d["hparams"].items()}
            out[(m, seed)] = RunConfig.from_dict(d)
    return out


def launch(cfgs: list, root: Path, log: Path, threads: int) -> subprocess.Popen:
    """One process training `cfgs` (the seeds of one method) stacked (executor "stacked", core/engines/together.py)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    code = ("import json,sys,pflrepro; from pflrepro.federation.config import RunConfig; "
            "from pflrepro.pipeline.executors import StackedExecutor; "
            "StackedExecutor().train_all([RunConfig.from_dict(d) for d in json.loads(sys.argv[1])], sys.argv[2])")
    return subprocess.Popen([sys.executable, "-c", code, json.dumps([c.to_dict() for c in cfgs]), str(root)], env=env,
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)


def history_of(cfg, root: Path) -> tuple[list, bool]:
    """(evaluated rounds, finished): a finished run's metrics, else its last checkpoint's."""
    path = run_dir(cfg, root)
    if is_finished(path):
        return load_result(path).history, True
    if (path / "checkpoint.pt").exists():
        return load_checkpoint(path / "checkpoint.pt", cfg)["history"], False
    return [], False


def run_slice(configs: dict, parallel: int, seconds: float, root: Path, rep: Report) -> dict:
    """The seeds of each method as one stacked process, `parallel` processes at once, until done or `seconds` pass
    (the rest are stopped; a stopped run keeps its last checkpoint): {key: ((history, finished), seconds or None)}."""
    root.mkdir(parents=True, exist_ok=True)
    threads = max(1, (os.cpu_count() or 1) // parallel)
    by_method: dict = {}
    for key, cfg in configs.items():
        by_method.setdefault(key[0], []).append((key, cfg))
    todo, running, began, took, t0 = list(by_method.items()), {}, {}, {}, time.monotonic()
    while (todo or running) and time.monotonic() - t0 < seconds:
        while todo and len(running) < parallel:
            method, items = todo.pop(0)
            running[method] = (launch([c for _, c in items], root, root / f"log-{method}.txt", threads), items)
            began[method] = time.monotonic()
        for method, (proc, items) in list(running.items()):
            if proc.poll() is not None:
                running.pop(method)
                for key, _ in items:
                    took[key] = time.monotonic() - began[method]
                rep.say(f"    {method} seeds {[k[1] for k, _ in items]} stacked: exit {proc.returncode} after "
                        f"{time.monotonic() - began[method]:.0f} s")
        time.sleep(0.5)
    for method, (proc, items) in running.items():
        proc.kill()
        proc.wait()
        for key, _ in items:
            took[key] = time.monotonic() - began[method]
        rep.say(f"    {method} stacked: stopped at the budget after {time.monotonic() - began[method]:.0f} s")
    return {key: (history_of(cfg, root), took.get(key)) for key, cfg in configs.items()}


def evidence_rows(name: str, setting: str, configs: dict, done: dict, metric: str,
                  paper_rounds: dict | None = None, paper_dataset: str | None = None) -> tuple[list, list]:
    """Per run its best and final metric beside the paper's printed cell (of the paper's own dataset: a row trained on
    Fashion-MNIST at CIFAR's settings is shown beside the CIFAR cell, and its effect is compared with the CIFAR
    effect)."""
    paper, paper_rounds = paper_values(name), paper_rounds or {}
    rows, curves = [], []
    for (method, seed), cfg in configs.items():
        (hist, finished), seconds = done[(method, seed)]
        vals = [100 * h[metric] for h in hist]
        best = max(vals) if vals else float("nan")
        rows.append({"table": name, "setting": setting, "method": method, "seed": seed, "dataset": cfg.dataset,
                     "model": cfg.model,
                     "rounds_done": hist[-1]["round"] if hist else 0, "rounds": cfg.rounds,
                     "paper_rounds": paper_rounds.get((method, seed), cfg.rounds), "finished": finished,
                     f"best_{metric}": best, "best_round": hist[vals.index(best)]["round"] if vals else None,
                     f"final_{metric}": vals[-1] if vals else float("nan"),
                     "paper_dataset": paper_dataset or cfg.dataset,
                     "paper": paper_value(paper, paper_dataset or cfg.dataset, setting, method),
                     "seconds": round(seconds, 1) if seconds else None, "device": cfg.device})
        curves += [{"table": name, "setting": setting, "method": method, "seed": seed, "round": h["round"],
                    metric: 100 * h[metric]} for h in hist]
    return rows, curves


def slice_claims(rows: list[dict], curves: list[dict], metric: str) -> list[dict]:
    """The slice's paired comparisons (pflrepro.reporting.tier.paired_claims, the report's paper-scale tier rule)."""
    return paired_claims(rows, curves, metric)


def plan(which, tiny: bool) -> list:
    """The slices to run, in order; `tiny`: the first of each paper table (every paper's row, at seconds' scale)."""
    chosen = [SLICES[i] for i in which]
    if tiny:
        seen = set()
        chosen = [sl for sl in chosen if sl[0] not in seen and not seen.add(sl[0])]
    return chosen


def evidence(device: str, clock: Clock, tiny: bool, parallel: int, root: Path, rep: Report, which,
             only_methods=(), only_seeds=(), collect: bool = False) -> tuple:
    """Step 3: each chosen slice's runs trained into the store `root` (resumed or reused where it holds them), then
    read back; `collect`: nothing trains, only what the store has finished is read."""
    from pflrepro.pipeline.experiments import load_profile
    rows, curves, claims, skipped, finished = [], [], [], [], []
    for name, setting, methods, rounds, over in plan(which, tiny):
        left = clock.left() - 15     # keep time to write the report
        if left < 30:
            skipped.append(f"{name} / {setting} / {', '.join(methods)}: skipped, {clock.left():.0f} s left")
            rep.say("  " + skipped[-1])
            continue
        configs = {k: c for k, c in slice_configs(name, setting, methods, rounds, tiny, device, over).items()
                   if (not only_methods or k[0] in only_methods) and (not only_seeds or k[1] in only_seeds)}
        full = slice_configs(name, setting, methods, None, tiny, device, over)
        paper_dataset = next(iter(slice_configs(name, setting, methods[:1], None, False, device).values())).dataset
        metric = load_profile(name, "paper").get("metric", "pm_acc_mean")
        cut = "" if not rounds or tiny else f", rounds cut to {rounds} (the paper's: {next(iter(full.values())).rounds})"
        rep.say(f"  {name} / {setting} on {next(iter(configs.values())).dataset}: {len(configs)} runs, seeds of a "
                f"method stacked, {parallel} processes at once, {left:.0f} s{cut}")
        where = root / f"{name}-{setting.replace(' ', '_').replace('=', '').replace('%', '')}"
        if collect:
            configs = {k: c for k, c in configs.items() if is_finished(run_dir(c, where))}
            if not configs:
                continue
        done = {k: (history_of(c, where), None) for k, c in configs.items()} if collect else \
            run_slice(configs, parallel, left, where, rep)
        r, c = evidence_rows(name, setting, configs, done, metric, {k: full[k].rounds for k in configs}, paper_dataset)
        for row, cfg in zip(r, configs.values()):    # `seconds` is this call's; a run's own CPU time is its record's
            prov = run_dir(cfg, where) / "provenance.json"
            row["run_cpu_seconds"] = json.loads(prov.read_text()).get("cpu_seconds") if row["finished"] else None
        rows, curves, claims = rows + r, curves + c, claims + slice_claims(r, c, metric)
        meta = {"table": name, "setting": setting, "paper_dataset": paper_dataset, "metric": metric}
        finished += [(meta, k[0], run_dir(cfg, where)) for k, cfg in configs.items() if is_finished(run_dir(cfg, where))]
    return rows, curves, claims, skipped, finished


def slug(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in text)


def record_folder(meta: dict, method: str, path: Path) -> str:
    """Where a finished run's record lies in a tier folder: runs/<table>/<setting>/<method>/<run>
    (pflrepro.reporting.tier reads that layout, with the setting's tier.json beside its methods)."""
    return f"runs/{meta['table']}/{slug(meta['setting'])}/{method}/{path.name}"


def keep_records(finished: list, dest: Path, rep: Report) -> list[str]:
    """The finished runs' records copied, verified, into `dest` in the tier layout (runs.tar.gz's, unpacked), so that
    a machine that is wiped between sittings loses none of them (commit `dest`). A record already there is left as
    it is when its manifest is the same; one whose manifest differs is refused, named, and left untouched. Returns
    the folders written."""
    import shutil
    from pflrepro.federation.config import RunConfig
    from pflrepro.pipeline.store import verify
    written = []
    for meta, method, path in finished:
        target = dest / record_folder(meta, method, path)
        index = target.parents[1] / "tier.json"
        if target.exists():
            if (target / "manifest.json").read_bytes() != (path / "manifest.json").read_bytes():
                rep.say(f"  kept as it was: {target} (a different record of the same run is there)")
            continue
        index.parent.mkdir(parents=True, exist_ok=True)
        if not index.exists():
            index.write_text(json.dumps(meta, indent=1))
        tmp = target.with_name(target.name + ".tmp")
        shutil.copytree(path, tmp, dirs_exist_ok=True, ignore=shutil.ignore_patterns("checkpoint.pt"))
        verify(tmp, RunConfig.from_dict(json.loads((tmp / "config.json").read_text())))
        tmp.rename(target)
        written.append(str(target))
    rep.say(f"  records: {len(written)} copied into {dest}, {len(finished) - len(written)} there already")
    return written


def pack_runs(finished: list, out: Path, rep: Report) -> list[str]:
    """The finished evidence runs' store folders (verified records) into out/runs.tar.gz as
    runs/<table>/<setting>/<method>/<run>/, each setting's folder with its tier.json (pflrepro.reporting.tier reads
    them), while the file stays under RUNS_TAR_MAX; the names of any left out."""
    import io
    import tarfile
    left_out, indexed = [], set()
    if not finished:
        return left_out
    with tarfile.open(out / "runs.tar.gz", "w:gz") as tar:
        for meta, method, path in finished:
            where = record_folder(meta, method, path).rsplit("/", 2)[0]
            if (out / "runs.tar.gz").stat().st_size + sum(f.stat().st_size for f in path.iterdir()) > RUNS_TAR_MAX:
                left_out.append(f"{where}/{method}/{path.name}")
                continue
            if where not in indexed:
                blob = json.dumps(meta, indent=1).encode()
                info = tarfile.TarInfo(f"{where}/tier.json")
                info.size, info.mtime = len(blob), int(time.time())
                tar.addfile(info, io.BytesIO(blob))
                indexed.add(where)
            tar.add(path, arcname=f"{where}/{method}/{path.name}")
    rep.say(f"  runs.tar.gz: {len(finished) - len(left_out)} finished runs"
            + (f"; left out (size): {', '.join(left_out)}" if left_out else ""))
    return left_out


# ---------------------------------------------------------------- merging several checks' evidence
def _read(path: Path) -> list[dict]:
    num = lambda v: int(v) if v.lstrip("-").isdigit() else float(v) if _floaty(v) else v == "True" if v in (
        "True", "False") else v
    with open(path) as f:
        return [{k: num(v) for k, v in r.items()} for r in csv.DictReader(f)]


def _floaty(v: str) -> bool:
    try:
        float(v)
        return True
    except ValueError:
        return False


def merge(dirs: list[Path], out: Path) -> int:
    """`--merge DIR ... --out DIR`: the evidence of several checks (a second call finishing runs the first stopped at
    its budget) as one: per run (table, setting, method, seed) the one that got furthest (a later DIR on a tie), its
    curve, and the claims recomputed over them."""
    runs, curves = {}, {}
    for d in dirs:
        for r in _read(d / "evidence.csv"):
            key = (r["table"], r["setting"], r["method"], r["seed"])
            if key not in runs or (r["finished"], r["rounds_done"]) >= (runs[key]["finished"], runs[key]["rounds_done"]):
                runs[key] = {**r, "from": d.name}
                curves[key] = [c for c in _read(d / "evidence_curves.csv")
                               if (c["table"], c["setting"], c["method"], c["seed"]) == key]
    out.mkdir(parents=True, exist_ok=True)
    rows, claims = list(runs.values()), []
    for table, setting in dict.fromkeys((r["table"], r["setting"]) for r in rows):
        part = [r for r in rows if (r["table"], r["setting"]) == (table, setting)]
        metric = next(k[5:] for k in part[0] if k.startswith("best_") and k != "best_round")
        claims += slice_claims(part, [c for k, cs in curves.items() if k[:2] == (table, setting) for c in cs], metric)
    write_csv(out / "evidence.csv", rows)
    write_csv(out / "evidence_curves.csv", [c for cs in curves.values() for c in cs])
    write_csv(out / "evidence_claims.csv", claims)
    print(md_table(rows, [k for k in rows[0] if k not in ("table", "device")]))
    print()
    print(md_table(claims, ["claim", "verdict", "seeds", "at", "effect", "paper_effect", "per_seed"]))
    return 0


# ---------------------------------------------------------------- main
def fmnist_source(rep: Report) -> None:
    """Decode Fashion-MNIST once (checked) and hand it to every run process as a tensor cache."""
    from pflrepro.data.datasets import load_dataset, save_tensor_cache, tensor_cache_dir
    ds = load_dataset("fmnist")
    rep.say(f"fmnist: {ds.source}; train {tuple(ds.x_train.shape)}, test {tuple(ds.x_test.shape)}")
    if not (tensor_cache_dir() / "fmnist.pt").exists():
        cache = Path(tempfile.mkdtemp(prefix="gpu-check-data-"))
        save_tensor_cache(ds, cache / "fmnist.pt")
        os.environ["PFLREPRO_TENSOR_CACHE"] = str(cache)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--merge"]:
        *dirs, flag, out = argv[1:]
        if flag != "--out" or not dirs:
            sys.exit("usage: gpu_check.py --merge DIR [DIR ...] --out DIR")
        return merge([Path(d) for d in dirs], Path(out))
    if argv[:1] == ["--twice-child"]:     # same_twice's deterministic half
        deterministic()
        print("ROWS " + json.dumps(twice(argv[1], "deterministic", Path(argv[2]))), flush=True)
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget-s", type=float, default=540.0, help="stop inside this many seconds (default 540)")
    ap.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    ap.add_argument("--tiny", action="store_true", help="every step at seconds' scale (CI, with --device cpu)")
    ap.add_argument("--parallel", type=int, default=None, help="evidence processes at once, each the seeds of one "
                    "method stacked (default: 8 on CUDA, 2 on CPU)")
    ap.add_argument("--steps", default="1,2,3", help="which steps, e.g. 3 (default 1,2,3)")
    ap.add_argument("--slices", default=",".join(map(str, range(len(SLICES)))),
                    help=f"which evidence slices (0-{len(SLICES) - 1}, see SLICES; default all, in order)")
    ap.add_argument("--methods", default="", help="evidence: only these methods (comma-separated; default all)")
    ap.add_argument("--seeds", default="", help="evidence: only these seeds (comma-separated; default all)")
    ap.add_argument("--workloads", default="", help="benchmark: only these workloads (default " +
                    ",".join(BENCH_WORKLOADS) + ")")
    ap.add_argument("--store", type=Path, default=None, help="keep the evidence runs in this store (default: a temporary one); "
                    "a second call with the same --store resumes every run the first stopped at its budget, from its "
                    "last checkpoint, and reuses every finished one (the paper-scale tier on a CPU, over sessions)")
    ap.add_argument("--records", type=Path, default=None, help="also copy every finished evidence run, verified, into "
                    "this folder as runs/<table>/<setting>/<method>/<run>/ (runs.tar.gz's layout, unpacked; records "
                    "already there are kept): the folder to commit when the machine does not keep --store")
    ap.add_argument("--collect", action="store_true", help="train nothing: read the runs --store has finished (with "
                    "--records, copy them); the chosen slices, methods and seeds as usual")
    ap.add_argument("--shares", default=None, help="correctness,benchmark shares of the budget (default 0.2,0.2; "
                    "tiny 0.45,0.2); the evidence gets the rest")
    a = ap.parse_args(argv)
    try:
        a.methods = tuple(filter(None, a.methods.split(",")))
        a.workloads = tuple(filter(None, a.workloads.split(",")))
        a.seeds = tuple(int(x) for x in filter(None, a.seeds.split(",")))
        a.shares = dict(zip(("correctness", "bench"), map(float, a.shares.split(",")))) if a.shares else None
        assert set(a.workloads) <= set(BENCH_WORKLOADS)
        a.steps = {int(x) for x in a.steps.split(",")}
        a.slices = [int(x) for x in a.slices.split(",")]
        assert a.steps <= {1, 2, 3} and all(0 <= i < len(SLICES) for i in a.slices)
    except (ValueError, AssertionError):
        ap.error("--steps: numbers from 1,2,3; --slices: numbers from 0 to " + str(len(SLICES) - 1) + "; --seeds: "
                 "integers; --shares: two numbers; --workloads: from " + ", ".join(BENCH_WORKLOADS))
    if a.budget_s < 30:
        ap.error("--budget-s: at least 30 seconds")
    if a.collect and not (a.store and a.store.is_dir() and 3 in a.steps):
        ap.error("--collect reads an existing --store DIR in step 3: give --store and --steps 3")
    from pflrepro.federation.build import resolve_device
    dev = resolve_device(a.device)
    clock, out = Clock(a.budget_s), a.out
    out.mkdir(parents=True, exist_ok=True)
    rep = Report(out)
    root = Path(tempfile.mkdtemp(prefix="gpu-check-runs-"))
    os.environ.setdefault("PFLREPRO_RESULTS", str(root / "results"))
    env = environment(dev)
    rep.say(json.dumps(env))
    rep.md += [f"# Device check: {env.get('gpu', dev.type)}, torch {env['torch']}", "",
               f"Budget {a.budget_s:.0f} s{' (tiny)' if a.tiny else ''}; commit {env['git']}.", "",
               "Environment: `" + json.dumps(env) + "`", ""]
    try:
        fmnist_source(rep)
        steps(a, dev.type, clock, root, rep)
    finally:
        rep.md.append(f"Total {a.budget_s - clock.left():.0f} s of {a.budget_s:.0f}.")
        rep.write()
    return 0


def steps(a, device: str, clock: Clock, root: Path, rep: Report) -> None:
    out = a.out
    t = time.monotonic()
    rep.say("1. correctness")
    shares = a.shares or (TINY_SHARES if a.tiny else SHARES)
    rows = correctness(device, clock, a.budget_s * (1 - shares["correctness"]), root / "correctness", rep) \
        if 1 in a.steps else []
    write_csv(out / "correctness.csv", rows)
    bad = [f"{r['check']}: {r['what']}" for r in rows if r["ok"] is False]
    rep.section(f"1. Correctness ({time.monotonic() - t:.0f} s)",
                f"{sum(r['ok'] is True for r in rows)} of {len(rows)} checks passed; failed: {', '.join(bad) or 'none'}; "
                f"skipped: {sum(isinstance(r['ok'], str) for r in rows)}.\n\n"
                + md_table([r for r in rows if r["check"] != "smoke round" or r["ok"] is not True],
                           ["check", "what", "ok", "round1_diff_train_loss", "max_diff_train_loss", "max_diff_pm_acc_mean", "max_diff",
                            "bit_identical", "clients_per_call", "error"]))
    t = time.monotonic()
    rep.say("2. engine benchmark")
    share = min(a.budget_s * shares["bench"], clock.left() - 60)
    brows, md = bench(device, share, a.tiny, rep, a.workloads) if 2 in a.steps else ([], "not asked for (--steps)")
    write_csv(out / "bench_engines.csv", brows)
    rep.section(f"2. Engine benchmark ({time.monotonic() - t:.0f} s)", md)
    t = time.monotonic()
    rep.say("3. paper-scale evidence")
    parallel = a.parallel or (8 if device == "cuda" else 2)
    store = a.store.resolve() if a.store else root / "evidence"     # only the evidence resumes: 1 and 2 start fresh
    erows, curves, claims, skipped, finished = evidence(device, clock, a.tiny, parallel, store, rep,
                                                        a.slices, a.methods, a.seeds, a.collect) \
        if 3 in a.steps else ([], [], [], ["not asked for (--steps)"], [])
    if a.records:
        keep_records(finished, a.records, rep)
    skipped += [f"{r}: finished, not in runs.tar.gz (its size)" for r in pack_runs(finished, out, rep)]
    write_csv(out / "evidence.csv", erows)
    write_csv(out / "evidence_curves.csv", curves)
    write_csv(out / "evidence_claims.csv", claims)
    cols = ["table", "setting", "dataset", "method", "seed", "rounds_done", "rounds", "paper_rounds", "finished"] + \
        [k for k in (erows[0] if erows else {}) if k.startswith(("best_", "final_")) and k != "best_round"] + \
        ["best_round", "paper", "seconds", "run_cpu_seconds"]
    rep.section(f"3. Paper-scale evidence ({time.monotonic() - t:.0f} s)",
                md_table(erows, cols) + "\n\n" + md_table(claims, ["claim", "verdict", "seeds", "at", "effect",
                                                                    "paper_effect", "per_seed"])
                + ("\n\n" + "\n".join(f"- {s}" for s in skipped) if skipped else ""))


if __name__ == "__main__":
    sys.exit(main())
