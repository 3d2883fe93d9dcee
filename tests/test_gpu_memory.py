"""Device resolution and a run's GPU share (issue 32): `resolve_device`, the Ray executor's GPUs per run
(executors.gpu_share, run_gpus, _train_task) and the memory-fit check before round 1 (pflrepro.pipeline.gpu, called by
store.run). No GPU here: CUDA is faked (torch.cuda.is_available, get_device_properties, memory_allocated,
set_per_process_memory_fraction), and Ray is not needed."""
from __future__ import annotations

import os
import re
from types import SimpleNamespace

import pytest
import torch

from pflrepro.federation import build
from pflrepro.federation.config import RunConfig
from pflrepro.params import ConfigError
from pflrepro.pipeline import executors, gpu
from pflrepro.pipeline import store as S

from .conftest import FMNIST_AVAILABLE, small_cfg

needs_fmnist = pytest.mark.skipif(not FMNIST_AVAILABLE, reason="needs offline Fashion-MNIST")


def _cfg(device: str = "cpu", **kw) -> RunConfig:
    return RunConfig.from_dict(small_cfg(device=device, **kw))


@pytest.fixture
def caps(monkeypatch):
    """CUDA faked available; every set_per_process_memory_fraction(f, device) call recorded, none made."""
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d=None: calls.append((f, d)))
    monkeypatch.delenv(gpu.FRACTION_ENV, raising=False)
    return calls


# ---------------------------------------------------------------- resolve_device
@pytest.mark.parametrize("available", [True, False])
def test_auto_is_cuda_where_available_else_cpu(monkeypatch, available):
    """device='auto' resolves to CUDA exactly when CUDA is available; 'cpu' is the CPU either way."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    assert build.resolve_device("auto") == torch.device("cuda" if available else "cpu")
    assert build.resolve_device("cpu") == torch.device("cpu")


def test_cuda_without_cuda_is_a_config_error_one_liner(monkeypatch):
    """device='cuda' without CUDA is a ConfigError of one line naming the way out (was a RuntimeError); with CUDA it
    resolves to CUDA."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"device='cuda', but no CUDA device is available here: use device='auto'") \
            as e:
        gpu.device("cuda")
    assert "\n" not in str(e.value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert gpu.device("cuda") == torch.device("cuda")


# ---------------------------------------------------------------- the Ray executor's GPUs per run
GPU_NODE, CPU_NODE = {"CPU": 8.0, "GPU": 1.0}, {"CPU": 8.0}


def test_gpus_with_cpu_runs_are_refused_up_front():
    """gpus > 0 means CUDA in the task: runs that say device='cpu' would hold a GPU they never use, refused with a
    one-line ConfigError counting them."""
    grid = [_cfg("cpu"), _cfg("cpu", seed=1), _cfg("auto")]
    with pytest.raises(ConfigError) as e:
        executors.gpu_share(grid, 0.25, 1, [GPU_NODE])
    assert str(e.value) == ("executor ray: gpus=0.25 reserves a GPU per run, but 2 runs say device='cpu': set "
                            "device=auto (or cuda), or gpus=0")
    assert executors.gpu_share([_cfg("auto"), _cfg("cuda")], 0.25, 1, [GPU_NODE]) == 0.25
    assert executors.gpu_share(grid, 0, 1, [GPU_NODE]) == 0     # gpus=0: CPU runs are fine


def test_default_gpus_leave_cpu_runs_off_the_gpu():
    """gpus left to its default: 1 per CUDA-capable run on a cluster with GPUs, none for a device='cpu' run (a mixed
    grid is not refused), none at all on a cluster without GPUs."""
    cpu, auto = _cfg("cpu"), _cfg("auto")
    share = executors.gpu_share([cpu, auto], None, 1, [GPU_NODE])
    assert share == 1.0 and executors.run_gpus(cpu, share) == 0.0 and executors.run_gpus(auto, share) == 1.0
    assert executors.gpu_share([cpu, auto], None, 1, [CPU_NODE]) == 0.0


def test_gpu_share_keeps_its_other_refusals_in_order():
    """No node able to hold a task is reported before the device='cpu' refusal (tests/test_executors.py pins that
    message for `ray:,gpus=0.5` on a GPU-less cluster); device='cuda' needs a GPU in the cluster and gpus > 0."""
    with pytest.raises(ConfigError, match=r"asks for 1 CPU and 0.5 GPU, and no node of the cluster has that"):
        executors.gpu_share([_cfg("cpu")], 0.5, 1, [CPU_NODE])
    with pytest.raises(ConfigError, match="device='cuda' runs, but the Ray cluster has no GPU"):
        executors.gpu_share([_cfg("cuda")], None, 1, [CPU_NODE])
    with pytest.raises(ConfigError, match=r"gpus=0 reserves no GPU, but 1 runs say device='cuda'"):
        executors.gpu_share([_cfg("cuda")], 0, 1, [GPU_NODE])


# ---------------------------------------------------------------- the fraction: parsed, applied, exported
@pytest.mark.parametrize("f, applied", [(None, False), (0, False), (0.25, True), (0.999, True), (1.0, False)])
def test_fraction_is_applied_only_strictly_between_0_and_1(caps, f, applied):
    """set_per_process_memory_fraction is called with f exactly when 0 < f < 1 (a whole GPU needs no cap)."""
    assert gpu.apply_fraction(f) is applied
    assert caps == ([(f, None)] if applied else [])


def test_fraction_is_not_applied_without_cuda(caps, monkeypatch):
    """Without CUDA nothing is capped (a local user's $PFLREPRO_GPU_FRACTION on a CPU machine is harmless)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu.apply_fraction(0.5) is False and caps == []


def test_apply_fraction_passes_the_device_index(caps):
    """A device with an index is capped on that device; 'cuda' without one on the current device (None)."""
    gpu.apply_fraction(0.5, torch.device("cuda", 1))
    gpu.apply_fraction(0.5, torch.device("cuda"))
    assert caps == [(0.5, 1), (0.5, None)]


@pytest.mark.parametrize("raw, want", [("", None), ("0.5", 0.5), ("1", 1.0), ("0", "err"), ("1.5", "err"),
                                       ("half", "err"), ("nan", "err")])
def test_the_fraction_variable_is_checked(monkeypatch, raw, want):
    """$PFLREPRO_GPU_FRACTION: unset or empty is None (the whole GPU), 0 < f <= 1 is taken, anything else is a
    ConfigError naming the variable."""
    monkeypatch.setenv(gpu.FRACTION_ENV, raw)
    if want == "err":
        with pytest.raises(ConfigError, match=f"{gpu.FRACTION_ENV}="):
            gpu.fraction()
    else:
        assert gpu.fraction() == want


def test_share_exports_the_fraction_and_restores_it(caps, monkeypatch):
    """In a task with a fraction of a GPU the run sees $PFLREPRO_GPU_FRACTION and the allocator is capped; the
    variable is restored afterwards (Ray reuses workers); a whole GPU or none sets nothing."""
    with gpu.share(0.25):
        assert os.environ[gpu.FRACTION_ENV] == "0.25"
    assert gpu.FRACTION_ENV not in os.environ and caps == [(0.25, None)]
    monkeypatch.setenv(gpu.FRACTION_ENV, "0.9")
    with gpu.share(0.5):
        assert os.environ[gpu.FRACTION_ENV] == "0.5"
    assert os.environ[gpu.FRACTION_ENV] == "0.9"
    for f in (0.0, 1.0, 2.0):
        with gpu.share(f):
            assert os.environ[gpu.FRACTION_ENV] == "0.9"
    assert caps == [(0.25, None), (0.5, None)]


def test_train_task_caps_before_training_and_keeps_the_config(caps, monkeypatch, tmp_path):
    """_train_task caps CUDA memory at its GPU share before store.run trains, exports the share to the run, and
    hands store.run the run's config unchanged (the share is an execution setting, not in the run's address)."""
    cfg = _cfg("auto")
    seen = []

    def fake_run(c, root=None, progress=True):
        seen.append((c, root, os.environ.get(gpu.FRACTION_ENV), list(caps)))
    monkeypatch.setattr(S, "run", fake_run)
    out = executors._train_task(cfg.to_dict(), S.code_fingerprint(cfg.algorithm), 1, str(tmp_path), None, 0.0, 0.25)
    assert out is None
    (c, root, env, capped), = seen
    assert c == cfg and S.run_dir(c, root) == S.run_dir(cfg, tmp_path)
    assert env == "0.25" and capped == [(0.25, None)]
    assert gpu.FRACTION_ENV not in os.environ


# ---------------------------------------------------------------- the fit check in store.run
def _fake_gpu(monkeypatch, total: int, allocated: int) -> None:
    """store.run on the CPU, but believing its device is a GPU of `total` bytes with `allocated` bytes in use."""
    monkeypatch.setattr(gpu, "device", lambda name: torch.device("cpu"))
    monkeypatch.setattr(gpu, "is_cuda", lambda device: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: SimpleNamespace(total_memory=total))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d=None: allocated)


def _mib(text: str) -> list[float]:
    return [float(v) * (1024 if unit == "GiB" else 1) for v, unit in re.findall(r"([\d.]+) (MiB|GiB)", text)]


@needs_fmnist
def test_a_run_that_does_not_fit_its_share_is_refused_and_leaves_nothing(store, caps, monkeypatch):
    """With a GPU share set and a GPU too small, store.run refuses the run before round 1 with a one-line ConfigError
    giving the share, the GPU's size, the need and its parts (which add up), after capping at the share; the store
    holds no folder for it."""
    monkeypatch.setenv(gpu.FRACTION_ENV, "0.25")
    _fake_gpu(monkeypatch, total=4 * 2**20, allocated=5 * 2**20)
    cfg = small_cfg(rounds=2)
    with pytest.raises(ConfigError) as e:
        S.run(cfg, progress=False)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("GPU share 0.25 of 4.0 MiB = 1.0 MiB, but this run needs about "), msg
    assert "(data and models 5.0 MiB on the GPU, one client's training " in msg
    assert "at batch_size=32, 10 clients' states at most " in msg
    assert msg.endswith("raise gpus= (or $PFLREPRO_GPU_FRACTION), lower batch_size, or use fewer runs per GPU")
    _, _, need, data, training, states = _mib(msg)
    assert need == pytest.approx(data + training + states, abs=0.15) and training > 0 and states > 0
    assert caps == [(0.25, None)]
    assert not S.run_dir(RunConfig.from_dict(cfg)).exists()
    assert not (store / "runs").exists() or not any((store / "runs").iterdir())


@needs_fmnist
def test_a_run_that_fits_its_share_trains_to_the_same_bits(store, caps, monkeypatch, tmp_path):
    """A run that fits its share trains after the cap (called once, with the share), and its metrics equal those of
    the same run without a share: measuring the need (a forward pass, the algorithm's plan) changes no result (the
    per-client engine, whose first module is built in round 1, is the one where a cached module would show)."""
    cfg = small_cfg(rounds=2, engine="per_client")
    plain = S.run(cfg, root=tmp_path / "plain", progress=False)
    monkeypatch.setenv(gpu.FRACTION_ENV, "0.25")
    _fake_gpu(monkeypatch, total=2**40, allocated=2**20)
    shared = S.run(cfg, root=tmp_path / "shared", progress=False)
    assert caps == [(0.25, None)]
    assert (shared.path / "summary.json").exists()
    assert S.read_metrics(shared.path) == S.read_metrics(plain.path)


def test_fit_does_nothing_off_cuda_or_without_a_share(caps, monkeypatch):
    """The check runs only with a CUDA device and a share: a CPU run with $PFLREPRO_GPU_FRACTION set, or a GPU run
    without it, is neither capped nor measured."""
    ctx = SimpleNamespace(device=torch.device("cpu"))
    monkeypatch.setenv(gpu.FRACTION_ENV, "0.5")
    gpu.fit(ctx, None)
    monkeypatch.delenv(gpu.FRACTION_ENV)
    monkeypatch.setattr(gpu, "is_cuda", lambda device: True)
    gpu.fit(ctx, None)
    assert caps == []
