"""Runs side by side (pflrepro.pipeline.parallel): same bits as one after another, resumable, clear failures."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from pflrepro.federation.config import RunConfig
from pflrepro.params import ConfigError
from pflrepro.pipeline import experiments, parallel
from pflrepro.pipeline.store import read_metrics, run, run_dir

from .conftest import FMNIST_AVAILABLE, MANY_PROCESSES, small_cfg

needs_fmnist = pytest.mark.skipif(not FMNIST_AVAILABLE, reason="needs offline Fashion-MNIST")


def _grid() -> dict:
    """Five distinct runs plus one key naming an already-listed config (trained once, shared)."""
    out = {}
    for algo, hp in (("fedavg", {}), ("fedper", {"head_layers": 2}), ("pfedme", {"K": 2})):
        for seed in (0, 1):
            out[(algo, "s", seed)] = RunConfig.from_dict(small_cfg(algorithm=algo, hparams=hp, seed=seed,
                                                                   rounds=2, subsample=0.02))
    del out[("fedper", "s", 1)]
    out[("fedavg again", "s", 0)] = out[("fedavg", "s", 0)]
    return out


# two worker processes (12 s on a fast machine, 179 s on a slow CI-like one, 2026-11-27): `make test-full`; `make test`
# starts a worker in the error and crash tests below
@needs_fmnist
@pytest.mark.full
def test_two_jobs_give_the_same_bits_as_one_after_another_at_the_same_threads(tmp_path):
    grid = _grid()
    par = experiments.run_grid(grid, root=tmp_path / "par", progress=False, jobs=2)
    threads = parallel.threads_per_run(2)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        seq = {k: run(c, root=tmp_path / "seq", progress=False) for k, c in grid.items()}
    finally:
        torch.set_num_threads(before)
    assert torch.get_num_threads() == before          # the grid gave the caller its threads back
    assert len(list((tmp_path / "par").iterdir())) == 5  # the duplicate key trained once
    for k in grid:
        assert read_metrics(par[k].path) == read_metrics(seq[k].path), k
        assert par[k].provenance["torch_threads"] == threads
        assert par[k].provenance["cpu_capability"] == torch.backends.cpu.get_cpu_capability()   # the kernels it ran
        assert 0 < par[k].provenance["cpu_seconds"] < 4 * seq[k].provenance["wall_seconds"] + 5  # its own CPU time
    assert read_metrics(par[("fedavg", "s", 0)].path) != read_metrics(par[("fedavg", "s", 1)].path)  # seeds matter


@MANY_PROCESSES
@needs_fmnist
def test_a_worker_killed_mid_run_fails_the_grid_and_the_rerun_resumes_to_the_same_bits(tmp_path, monkeypatch):
    cfg = RunConfig.from_dict(small_cfg(rounds=3, subsample=0.02, checkpoint_every=1))
    monkeypatch.setenv("PFLREPRO_DIE_AFTER_ROUND", "2")
    w = parallel.Worker(threads=parallel.threads_per_run(2))  # the hook reaches the worker only
    monkeypatch.delenv("PFLREPRO_DIE_AFTER_ROUND")
    with pytest.raises(RuntimeError, match=r"run worker exited \(code -9\)"):
        w.train(cfg, tmp_path / "killed")
    w.close()
    path = run_dir(cfg, tmp_path / "killed")
    assert (path / "checkpoint.pt").exists() and not (path / "summary.json").exists()
    other = RunConfig.from_dict(small_cfg(rounds=3, subsample=0.02, seed=1))
    grid = {("a", "s", 0): cfg, ("b", "s", 1): other}
    resumed = experiments.run_grid(grid, root=tmp_path / "killed", progress=False, jobs=2)
    clean = experiments.run_grid(grid, root=tmp_path / "clean", progress=False, jobs=2)
    assert resumed[("a", "s", 0)].provenance["resumed_from_round"] == 2
    assert resumed[("a", "s", 0)].provenance["cpu_seconds"] > 0        # both segments' CPU, from the checkpoint on
    assert read_metrics(resumed[("a", "s", 0)].path) == read_metrics(clean[("a", "s", 0)].path)


def test_an_error_inside_a_worker_is_raised_with_its_traceback(tmp_path, monkeypatch):
    monkeypatch.setenv("PFLREPRO_DATA", str(tmp_path / "no-data"))  # CIFAR-10 is not here: loading fails
    w = parallel.Worker(threads=1)
    bad = RunConfig.from_dict(small_cfg(dataset="cifar10"))
    try:
        with pytest.raises(RuntimeError, match="failed in a run worker:\n.*Traceback") as e:
            w.train(bad, tmp_path)
        with pytest.raises(Exception) as direct:  # the same failure in this process
            run(bad, root=tmp_path / "direct", progress=False)
        assert type(direct.value).__name__ in str(e.value)
    finally:
        w.close()


@pytest.mark.parametrize("bad", [0, -2, "many", True, 1.5])
def test_bad_jobs_values_are_refused_clearly(bad):
    with pytest.raises(ConfigError, match=r"jobs=.*expected 'auto' or an integer >= 1"):
        parallel.resolve_jobs(bad, [])


def test_jobs_from_argument_environment_and_auto(monkeypatch):
    cpu = RunConfig.from_dict(small_cfg(device="cpu"))
    assert parallel.resolve_jobs(3, [cpu]) == 3          # not capped by the runs pending: see threads_per_run
    assert parallel.resolve_jobs("2", [cpu]) == 2
    monkeypatch.setenv("PFLREPRO_JOBS", "1")
    assert parallel.resolve_jobs(None, [cpu]) == 1
    monkeypatch.setenv("PFLREPRO_JOBS", "auto")
    auto = parallel.resolve_jobs(None, [cpu])
    assert 1 <= auto <= parallel.cpu_cores()
    assert parallel.threads_per_run(auto) * auto <= max(parallel.cpu_cores(), auto)
    monkeypatch.setenv("PFLREPRO_JOBS", "zero")
    with pytest.raises(ConfigError, match="jobs='zero'"):
        parallel.resolve_jobs(None, [cpu])


def test_runs_are_ordered_longest_first():
    quick = RunConfig.from_dict(small_cfg(rounds=2))
    long_rounds = quick.replace(rounds=20)
    pfedme = quick.replace(algorithm="pfedme", hparams={"K": 5})
    assert parallel.work(long_rounds) == 10 * parallel.work(quick)
    assert parallel.work(pfedme) == 5 * parallel.work(quick)
    # per round: 10 clients hold 3,000 images (5% of 60,000), train on 80% of them (split fractions 0.8/0.2) for
    # 1 epoch = 2,400 sample passes; FedDF's server adds 100 distillation steps of 128 public images per
    # architecture and the 10 teachers' forward pass over |P| = 300 (1,000)
    assert parallel.work(quick) == pytest.approx(2 * 2400)
    feddf = quick.replace(algorithm="feddf", public={"size": 300})
    assert parallel.work(feddf) == pytest.approx(2 * (2400 + 12800 + 1000))
    hetero = feddf.replace(models=("cnn_cifar10", "mlp", "cnn_ckt"))
    assert parallel.work(hetero) == pytest.approx(2 * (2400 + 3 * 12800 + 1000))
    # an asynchronous server step trains one arrival (FedAsync) or K (FedBuff) of the 10 clients
    assert parallel.work(quick.replace(schedule={"mode": "fedasync"})) == pytest.approx(2 * 240)
    assert parallel.work(quick.replace(schedule={"mode": "fedbuff", "buffer": 5})) == pytest.approx(2 * 1200)
    # the train share of a client's samples, per split rule
    assert parallel.train_fraction(quick.replace(split_params={"fractions": (0.75, 0.25)})) == 0.75
    ckt = RunConfig.from_dict(small_cfg(split="perfed_ckt", split_params={"train_choices": [0.1, 0.3, 0.35]}))
    assert parallel.train_fraction(ckt) == pytest.approx(0.25)   # (0.35 + 0.1 + 0.5 <= 1: what the split can make)
    assert parallel.train_fraction(quick.replace(split="global_test_by_proportion", split_params={})) == 1.0


def test_a_worker_that_crashes_reports_the_end_of_its_stderr(capsys):
    w = parallel.Worker(threads=1)
    w.proc.stdin.write("not a task\n")  # the worker's protocol loop dies on it
    w.proc.stdin.flush()
    with pytest.raises(RuntimeError, match=r"(?s)run worker exited \(code 1\).*end of its stderr.*JSONDecodeError"):
        w.train(RunConfig.from_dict(small_cfg()), None)
    w.close()
    assert "JSONDecodeError" in capsys.readouterr().err  # passed on to our stderr as it came


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_worker_does_not_outlive_its_parent(tmp_path):
    """A `train` process killed outright (SIGKILL: no handler runs) must not leave its run worker training on.
    A busy worker never reads its stdin, so the end of that pipe cannot stop it; here a grandchild (`sleep`)
    holds the pipe open in its place, so only the parent-death signal can end the worker."""
    code = ("import os, signal, subprocess, time\nfrom pflrepro.pipeline.parallel import Worker\nw = Worker(1)\n"
            "os.set_inheritable(w.proc.stdin.fileno(), True)\n"
            "holder = subprocess.Popen(['sleep', '60'], close_fds=False)\n"
            "print(w.proc.pid, holder.pid, flush=True)\ntime.sleep(3)\nos.kill(os.getpid(), signal.SIGKILL)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": str(Path(parallel.__file__).resolve().parents[2])})
    pid, holder = map(int, parent.stdout.readline().split())
    try:
        assert _alive(pid)
        parent.wait(timeout=60)
        deadline = time.time() + 20
        while _alive(pid) and time.time() < deadline:
            time.sleep(0.2)
        assert not _alive(pid), f"worker {pid} outlived its parent"
    finally:
        for p in (pid, holder):
            try:
                os.kill(p, 9)
            except ProcessLookupError:
                pass


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except FileNotFoundError:
        return []


@MANY_PROCESSES
@needs_fmnist
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_stops_a_grid_and_its_workers_promptly_keeping_checkpoints(tmp_path):
    """Issue 16: an interrupt (Ctrl-C in a terminal, or in a notebook's kernel) stops a side-by-side grid within
    seconds: the driver raises KeyboardInterrupt, its worker processes end, and the runs keep their last
    checkpoints to resume from."""
    root = tmp_path / "store"
    code = ("import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "from pflrepro.pipeline import experiments\nfrom pflrepro.federation.config import RunConfig\nfrom tests.conftest import small_cfg\n"
            "grid = {('fedavg', 's', s): RunConfig.from_dict(small_cfg(seed=s, rounds=500, subsample=0.02)) "
            "for s in (0, 1)}\n"
            f"experiments.run_grid(grid, root={str(root)!r}, progress=False, jobs=2)\n")
    repo = Path(parallel.__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=repo, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PFLREPRO_JOBS": "2"})
    try:
        deadline = time.time() + 600
        while len(list(root.glob("*/checkpoint.pt"))) < 2 and time.time() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert len(list(root.glob("*/checkpoint.pt"))) == 2, \
            f"both runs should be training by now: {sorted(root.rglob('*'))[:10]} {proc.poll()}"
        workers = _children(proc.pid)
        assert workers, "a side-by-side grid trains in a worker process"
        t = time.time()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert time.time() - t < 15 and proc.returncode != 0 and "KeyboardInterrupt" in err, err[-2000:]
        deadline = time.time() + 10
        while any(_alive(w) for w in workers) and time.time() < deadline:
            time.sleep(0.2)
        assert not any(_alive(w) for w in workers), "a worker outlived the interrupted grid"
        assert not list(root.glob("*/summary.json")), "500 rounds cannot have finished"
        assert len(list(root.glob("*/checkpoint.pt"))) == 2
    finally:
        if proc.poll() is None:
            proc.kill()
