import os

# One intra-op thread per test process, set before torch is imported so that every subprocess a test starts
# (CLI, papermill, dvc) inherits it: `make test` runs the suite in two pytest-xdist workers, one per core, and two
# workers of two threads each would oversubscribe the two cores (measured: a LeNet step on 2 threads ran at 0.7x the
# speed of 1 thread under contention). The bitwise tests compare runs made under the same setting.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# `make test` deals tests over two workers; tests that start or stop a Ray cluster run in one, one after another:
# two clusters at once would contend for a 2-core machine's CPUs, `ray stop --force` ends every cluster on the
# machine, and `ray:auto` finds whichever head it sees first
RAY_ALONE = pytest.mark.xdist_group("ray")
# tests that start several Python processes that train run only in `make test-full`: each such process took about
# 140 s to start on a slow CI-like machine (2026-11-27: import torch, then torch._dynamo at the first optimizer step)
MANY_PROCESSES = pytest.mark.full


@pytest.fixture(autouse=True)
def _one_core_per_xdist_worker(monkeypatch):
    """`make test` gives each of its two xdist workers one core (and one torch thread, above). A grid a test trains
    with jobs left to "auto" (a notebook, the CLI in-process, tune) then trains in the test's own process instead of
    also starting a worker process for the machine's second core: that worker took about 140 s to start on a slow
    CI-like machine (import torch, then torch._dynamo), in every such test, while the other xdist worker held that
    core. The bits stay: "auto" gave 2 jobs of cores // 2 = 1 thread, and now gives 1 job of 1 thread. Tests that
    ask for jobs=2 still start workers (tests/test_parallel.py)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        from pflrepro.pipeline import parallel
        monkeypatch.setattr(parallel, "cpu_cores", lambda: 1)


FMNIST_AVAILABLE = os.path.exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A private results store per test."""
    monkeypatch.setenv("PFLREPRO_RESULTS", str(tmp_path / "results"))
    return tmp_path / "results"


def small_cfg(**kw):
    """A seconds-scale run on real Fashion-MNIST."""
    base = dict(algorithm="fedavg", dataset="fmnist", subsample=0.05, n_clients=10, partition="iid",
                split="random", split_params={"fractions": [0.8, 0.2]}, model="cnn_cifar10",
                rounds=3, local_epochs=1, batch_size=32, lr=0.05, momentum=0.9, checkpoint_every=1)
    base.update(kw)
    return base


def load_script(path):
    """A script (scripts/, benchmarks/) imported as a module, from its file: its functions tested without running it."""
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
