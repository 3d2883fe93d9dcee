"""Run the missing runs of a grid side by side, one process each, on a CPU.

A small CNN step does not fill two cores (LeNet, B=16: 2 threads are 1.3x faster than 1), so two
runs at one thread each finish a grid sooner than the same runs one after another at two threads
(measured: docs/performance.md, "Runs side by side").

`jobs` is an execution setting, not part of a run's identity: it never enters the run store's key.
    None     -> $PFLREPRO_JOBS if set, else "auto"
    "auto"   -> 1 on a GPU; else min(CPU cores, GiB available // 2)
    int >= 1 -> that many runs at once

Determinism. Every run is seeded by its own config, so neither the order runs finish in nor which
process trains them changes a metric. The thread count can: CPU kernels split their sums by thread
(measured: LeNet's conv1 and head gradients differ in the last bits between 1 and 2 threads). So
every run of a grid gets cores // jobs threads, whatever else is pending: a grid, or a run
resumed after an interruption, gives the same bits again at the same `jobs` on the same machine
(tests/test_parallel.py), and each run's provenance.json records its `torch_threads`.

The calling process trains too (it has torch loaded already); each further job is one worker
process (`Worker`), started once per grid and fed by a thread.
"""
from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import threading
import traceback
from pathlib import Path

from ..algorithms import ALGORITHMS
from ..core.schedule import trained_share
from ..data.datasets import SPECS
from ..federation.config import RunConfig
from ..params import ConfigError
from . import gpu, store   # called through the modules: tests replace store.run and gpu.device (test_executors, test_gpu_memory)

GIB_PER_JOB = 2  # a paper-profile CIFAR run holds its dataset (~0.7 GiB as float) and models


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def _available_gib() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("inf")


def resolve_jobs(jobs, configs: list[RunConfig]) -> int:
    """How many runs to train at once (see module doc); a clear error for a bad value."""
    if jobs is None:
        jobs = os.environ.get("PFLREPRO_JOBS", "auto")
    if isinstance(jobs, str) and jobs.strip().isdigit():
        jobs = int(jobs)
    if jobs == "auto":
        if any(gpu.device(c.device).type != "cpu" for c in configs):
            return 1  # one accelerator: runs would only queue for it
        jobs = min(cpu_cores(), max(1, int(_available_gib() // GIB_PER_JOB)))
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        raise ConfigError(f"jobs={jobs!r}: expected 'auto' or an integer >= 1 (runs trained at once)")
    return jobs


def threads_per_run(jobs: int) -> int:
    return max(1, cpu_cores() // jobs)


def work(cfg: RunConfig) -> float:
    """Rough cost of a run in sample passes, to start the longest first (the last to finish sets the wall time)
    and to estimate what is left: per round, the participating share of the pool times local epochs (scaled by
    the algorithm's relative_cost), plus its server_work (FedDF's distillation: ordered by client work alone, its
    heterogeneous run started last and trained alone for 5 of PerFed-CKT's 14.6 minutes)."""
    algo, spec = ALGORITHMS[cfg.algorithm], SPECS[cfg.dataset]
    pool = spec.n_train + (spec.n_test if "test" in cfg.pool else 0)
    local = trained_share(cfg) * cfg.subsample * pool * train_fraction(cfg) * cfg.local_epochs * \
        algo.relative_cost(cfg.hparams)
    return cfg.rounds * (local + algo.server_work(cfg))


def train_fraction(cfg: RunConfig) -> float:
    """The share of a client's samples it trains on: the split's train fraction (its mean, for a per-client draw),
    1 for splits that keep every sample a client holds for training."""
    sp = cfg.split_params
    if "fractions" in sp:
        return float(sp["fractions"][0])
    if "train_choices" in sp:
        return sum(sp["train_choices"]) / len(sp["train_choices"])
    return 1.0


class Worker:
    """A `python -m pflrepro.pipeline.parallel` process that trains the configs it is sent, one at a time.
    A plain subprocess, not multiprocessing: no re-import of the caller's __main__ (a script
    without a main guard, a notebook kernel, pytest all work), and a dead worker is an EOF,
    reported with its exit code and the last lines it wrote to stderr, never a hang. Its stderr
    (warnings, errors) is passed on to ours, so a notebook shows it in the cell."""

    def __init__(self, threads: int):
        src = str(Path(__file__).resolve().parents[2])  # importable even without `pip install -e .`
        env = {**os.environ, "PFLREPRO_WORKER_THREADS": str(threads),
               "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}
        self.proc = subprocess.Popen([sys.executable, "-m", "pflrepro.pipeline.parallel"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
        self.stderr_tail: collections.deque = collections.deque(maxlen=20)
        self._relay = threading.Thread(target=self._pass_on_stderr, daemon=True)
        self._relay.start()

    def _pass_on_stderr(self) -> None:
        for line in self.proc.stderr:
            self.stderr_tail.append(line)
            sys.stderr.write(line)

    def train(self, cfg: RunConfig, root) -> None:
        try:
            self.proc.stdin.write(json.dumps({"config": cfg.to_dict(), "root": root and str(root)}) + "\n")
            self.proc.stdin.flush()
            reply = self.proc.stdout.readline()
        except BrokenPipeError:  # it was dead before this run
            reply = ""
        if not reply:
            code = self.proc.wait()
            self._relay.join(timeout=5)
            raise RuntimeError(f"run worker exited (code {code}) while training {cfg.algorithm} seed {cfg.seed}; "
                               "the end of its stderr:\n" + "".join(self.stderr_tail))
        reply = json.loads(reply)
        if "error" in reply:
            raise RuntimeError(f"{cfg.algorithm} seed {cfg.seed} failed in a run worker:\n{reply['error']}")

    def close(self, kill: bool = False) -> None:
        if kill:
            self.proc.kill()
        try:
            self.proc.stdin.close()  # the worker's loop ends; it exits
        except BrokenPipeError:
            pass
        self.proc.wait()
        self._relay.join(timeout=5)


def _die_with_parent() -> None:
    """Linux: the kernel sends this worker SIGTERM when the process that started it dies, however it dies
    (`kill` of a `python -m pflrepro train`, a DVC stage stopped, a notebook kernel killed), so no worker
    trains on as an orphan. Its run resumes from the last checkpoint next time. Elsewhere: a no-op."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)   # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:   # the parent died before the call: nobody would tell us
        sys.exit(0)


def _serve() -> None:
    """Worker side: one JSON task per stdin line, one JSON reply per stdout line."""
    _die_with_parent()
    import torch

    torch.set_num_threads(int(os.environ.get("PFLREPRO_WORKER_THREADS", "1")))
    replies, sys.stdout = sys.stdout, sys.stderr  # anything a run prints goes to stderr
    for line in sys.stdin:
        task = json.loads(line)
        try:
            store.run(task["config"], root=task["root"], progress=False)
            replies.write(json.dumps({"ok": True}) + "\n")
        except Exception:  # noqa: BLE001 - reported to the caller, which raises it
            replies.write(json.dumps({"error": traceback.format_exc()}) + "\n")
        replies.flush()


class GridFailed(RuntimeError):
    """Runs of a grid that failed, each named (its store folder) with its error; the others finished (or, with
    keep_going=False, were not started)."""

    def __init__(self, failed: list, total: int, root):
        self.errors = [e for _, e in failed]
        names = "; ".join(f"{store.run_dir(c, root).name}: {type(e).__module__}.{type(e).__qualname__}: "
                          f"{str(e).strip().splitlines()[-1] if str(e).strip() else ''}" for c, e in failed)
        super().__init__(f"{len(failed)} of {total} runs failed: {names}")


def train_all(configs: list[RunConfig], root: Path | str | None, jobs: int, on_done=None,
              progress: bool = False, keep_going: bool = True) -> None:
    """Train `configs` (distinct runs, none stored yet) up to `jobs` at once, each at
    threads_per_run(jobs) threads; results land in `root`. A run that fails is named and the others go on
    (`keep_going=False`: the first error stops handing out runs); the failures are raised together at the end
    (GridFailed; one failure alone is raised as itself). `progress`: a bar per run trained in this process."""
    import torch

    queue = sorted(configs, key=work, reverse=True)
    lock = threading.Lock()
    failed: list = []

    def take():
        with lock:
            return queue.pop(0) if queue and (keep_going or not failed) else None

    def loop(train_one):
        while (cfg := take()) is not None:
            try:
                train_one(cfg)
            except Exception as e:  # noqa: BLE001 - raised below once the other jobs stop
                with lock:
                    failed.append((cfg, e))
                print(f"[pflrepro] run {cfg.algorithm} seed {cfg.seed} failed ({type(e).__name__}); "
                      + ("the others go on" if keep_going else "stopping the grid"), file=sys.stderr, flush=True)
                if not keep_going:
                    return
                continue
            if on_done:
                on_done(cfg)

    threads = threads_per_run(jobs)
    workers = [Worker(threads) for _ in range(min(jobs, len(configs)) - 1)]
    feeders = [threading.Thread(target=loop, args=(lambda c, w=w: w.train(c, root),), daemon=True)
               for w in workers]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for t in feeders:
            t.start()
        loop(lambda c: store.run(c, root=root, progress=progress))
        for t in feeders:
            t.join()
    except BaseException:  # e.g. KeyboardInterrupt in a notebook: stop the other runs now
        with lock:
            queue.clear()
        for w in workers:
            w.close(kill=True)
        raise
    finally:
        torch.set_num_threads(before)
    for w in workers:
        w.close()
    if len(failed) == 1:
        raise failed[0][1]
    if failed:
        raise GridFailed(failed, len(configs), root)


if __name__ == "__main__":
    _serve()
