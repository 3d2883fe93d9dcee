"""Where a grid's missing runs train: this machine (`executor="local"`, or `"stacked"`: together, one program) or a
Ray cluster (`executor="ray"`).

Like `jobs`, the executor is an execution setting: it never enters a run's content address, and a run trained by
either lands in the caller's store as the same files with the same metrics (bit for bit at equal threads:
tests/test_executors.py; "stacked": bit for bit where the stacked arithmetic does not depend on how many clients share
a call, up to float rounding otherwise, as chunking by memory_budget_mb; tests/test_together.py).

    "local"                 runs side by side on this machine, `jobs` at once (pflrepro.pipeline.parallel; the default)
    "stacked[:runs=N]"      one process, runs in lockstep with their clients' local training stacked into shared
                            calls (pflrepro.core.engines.together: seeds of one setting as one program on one GPU), at most N
                            runs a batch and as many as fit in memory
    "ray"                   a Ray cluster: the one at $RAY_ADDRESS if set, else a local Ray instance for the grid
    "ray:ADDRESS"           the cluster at ADDRESS ("auto", "10.0.0.5:6379")
    "ray:ADDRESS,cpus=4,gpus=0.5,shared"   options after the address (the address may be left empty: "ray:,cpus=2")
        cpus    CPUs per run, and its torch threads (default 1)
        gpus    GPUs per run, a fraction shares one (default: 1 when the cluster has GPUs and the runs' device is
                "auto" or "cuda", else 0; by default a device="cpu" run reserves none). gpus > 0 means CUDA in the
                task: runs that say device="cpu" are refused with it (they would hold a GPU they never use), and so
                are device="cuda" runs with gpus=0. A fraction f < 1 caps the task's CUDA memory at f of its GPU
                (torch.cuda.set_per_process_memory_fraction) and sets $PFLREPRO_GPU_FRACTION=f for the run, which
                then checks before round 1 that it fits in its share (pflrepro.pipeline.gpu; a local user may set
                that variable too)
        retries how often Ray reruns a task whose node or worker died (default 3)
        ship    seconds between checkpoints shipped to the driver's store (default SHIP_EVERY)
        shared  the store is a path that every node sees: tasks write into it directly. Without it nothing is
                assumed shared: a task trains into a scratch store on its node, ships its progress heartbeat and
                (every `ship` seconds, the first after `ship` seconds) its checkpoint to the driver's store, and
                returns its run's files, which the driver writes into its store (summary.json last: a run is
                complete exactly when that file exists).

Ray retries a task whose node died (`retries`, default 3) on another node; the retry first fetches the run's last
shipped checkpoint from the driver's store, so it resumes from there (store.run resumes from a checkpoint). Every
node must be able to import pflrepro (the driver's source tree is put first on the tasks' PYTHONPATH, which serves a
node that shares it) and load the runs' datasets ($PFLREPRO_DATA); a task refuses to train when its node's
result-affecting code differs from the driver's (store.code_fingerprint), so a store never mixes code versions.

`Claims` makes a run train once even with two drivers on one store (two `dvc repro`s, a notebook beside a
pipeline): each driver holds an exclusive lock on every run it trains, and waits for runs another holds.
"""
from __future__ import annotations

import math
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from ..core.engines import config_signature, Stacker
from ..data.datasets import SPECS
from ..data.models import build_model
from ..federation.build import raw_dataset
from ..federation.config import RunConfig
from ..params import ConfigError, did_you_mean
from . import gpu, parallel, store
from .locks import lock, unlock
from .parallel import _available_gib, GridFailed
from .progress import HEARTBEAT
from .store import MANIFEST, run

SRC = str(Path(__file__).resolve().parents[2])
RESUME_FILES = ("config.json", "partition.npz", "checkpoint.pt")   # what a run needs to resume elsewhere
SHIP_EVERY = 30.0   # default seconds between checkpoints shipped to the driver's store (_Shipper)


# ---------------------------------------------------------------- claims: one trainer per run, across drivers
class Claims:
    """An exclusive claim on each missing run: an `fcntl.flock` on <store>/<run>.claim, held while the run
    trains. The kernel drops a lock when its holder dies, however it dies, so a claim never goes stale. Runs
    another driver holds are `others`: wait for each with `wait(path)`, which returns once its holder let go
    (the run is then stored, or its holder died and the run is ours to train). Claim files are removed on
    release. Without fcntl (Windows) every run is ours and nothing is locked."""

    def __init__(self, paths):
        self.held: dict[Path, int] = {}
        self.mine: list[Path] = []
        self.others: list[Path] = []
        for p in paths:
            fd = lock(_claim_file(p), block=False)
            if fd is None:
                self.others.append(p)
            else:
                self.held[p] = fd
                self.mine.append(p)

    def wait(self, path: Path) -> None:
        self.held[path] = lock(_claim_file(path), block=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for path, fd in self.held.items():
            unlock(_claim_file(path), fd)
        self.held.clear()


def _claim_file(run_path: Path) -> Path:
    return Path(run_path).with_name(Path(run_path).name + ".claim")


# ---------------------------------------------------------------- executors
def check_datasets(configs: list[RunConfig]) -> None:
    """Load every dataset the runs read (their data and public sets) before the first one trains: a paper-profile
    grid whose later rows need a dataset this machine lacks stops now with the loader's message (what to install,
    where to put files), not after hours of training its first rows. The loads are the ones the runs in this
    process make anyway (federation.build.raw_dataset keeps them; a tensor cache is checked against its source as it is
    read, data.datasets). A Ray driver does not check: its nodes hold the data."""
    names = {c.dataset for c in configs} | {c.public["dataset"] for c in configs if c.public.get("dataset")}
    for name in sorted(names):
        raw_dataset(name)


class LocalExecutor:
    """This machine: `jobs` runs at once, each at threads_per_run(jobs) threads (pflrepro.pipeline.parallel)."""

    name = "local"

    def __init__(self, jobs: int):
        self.jobs = jobs

    def describe(self) -> str:
        return f"{self.jobs} at once"

    def train_all(self, configs: list[RunConfig], root, on_done=None, bars: bool = False, keep_going: bool = True) -> None:
        check_datasets(configs)
        parallel.train_all(configs, root, self.jobs, on_done=on_done, progress=bars and self.jobs == 1,
                           keep_going=keep_going)


class StackedExecutor:
    """One process trains the grid's runs in lockstep, their clients' local training stacked into shared calls
    (pflrepro.core.engines.together): seeds of one method and setting train as one program on one device. Each run keeps its
    own store record, checkpoints, RNG streams and metrics (equal to alone up to float rounding: together.py), and
    its address does not depend on its companions. Runs are batched by what they share (`together.config_signature`:
    seeds and data settings may differ), at most `runs` a batch, and as many as fit in memory (`plan_batches`)."""

    name = "stacked"

    def __init__(self, runs: int | None = None):
        self.runs = runs

    def describe(self) -> str:
        return f"stacked, up to {self.runs or 'all'} runs a batch"

    def train_all(self, configs: list[RunConfig], root, on_done=None, bars: bool = False, keep_going: bool = True) -> None:
        check_datasets(configs)
        failed: list = []
        for batch in plan_batches(configs, self.runs):
            outs = Stacker().run_all([lambda c=c: run(c, root=root, progress=False) for c in batch])
            for cfg, (_, err) in zip(batch, outs):
                if err is None:
                    if on_done:
                        on_done(cfg)
                elif not isinstance(err, Exception):
                    raise err        # KeyboardInterrupt, SystemExit: stop now
                else:
                    failed.append((cfg, err))
                    print(f"[pflrepro] run {cfg.algorithm} seed {cfg.seed} failed ({type(err).__name__}); "
                          + ("the others go on" if keep_going else "stopping the grid"), file=sys.stderr, flush=True)
            if failed and not keep_going:
                break
        if len(failed) == 1:
            raise failed[0][1]
        if failed:
            raise GridFailed(failed, len(configs), root)


def run_bytes(cfg: RunConfig) -> int:
    """A run's resident bytes, an upper bound: its dataset's images on the device, and per client three models
    (a personal model, a teacher or anchor, its upload); local training is bounded by `memory_budget_mb`, one chunk at
    a time for the whole batch of runs."""
    spec = SPECS[cfg.dataset]
    image = spec.channels * spec.size * spec.size * 4 + 8
    data = int(math.ceil((spec.n_train + spec.n_test) * image))
    names = set(cfg.models) | {cfg.model}
    model = max(sum(t.numel() * t.element_size() for t in build_model(m, spec.channels, spec.num_classes,
                                                                        spec.size).state_dict().values())
                for m in names)
    return data + 3 * cfg.n_clients * model


def memory_cap(configs: list[RunConfig]) -> float:
    """Bytes the runs of one batch may hold: the GPU's memory (times $PFLREPRO_GPU_FRACTION when set) on CUDA, the
    available RAM on a CPU, less the training chunk's budget (the largest memory_budget_mb)."""
    import torch

    chunk = max(c.memory_budget_mb for c in configs) * 2**20
    dev = gpu.device(configs[0].device)
    if gpu.is_cuda(dev):
        total = torch.cuda.get_device_properties(dev).total_memory * (gpu.fraction() or 1.0)
    else:
        total = _available_gib() * 2**30
    return total - chunk


def plan_batches(configs: list[RunConfig], runs: int | None = None, cap: float | None = None,
                 size=run_bytes) -> list[list[RunConfig]]:
    """The grid cut into batches trained together: runs that can share calls (equal config but for seeds and data:
    together.SEED_AND_DATA) side by side, in their order, each batch at most `runs` runs and `cap` bytes (by `size`);
    a run larger than the cap alone. A grid larger than memory is split, never run out of memory."""
    cap = memory_cap(configs) if cap is None and configs else cap
    sigs = [config_signature(c) for c in configs]
    first = {}
    for i, g in enumerate(sigs):
        first.setdefault(g, i)
    order = sorted(range(len(configs)), key=lambda i: (first[sigs[i]], i))    # the grid's order, by first seen
    batches, cur, used, cur_sig = [], [], 0.0, None
    for i in order:
        c = configs[i]
        b = size(c)
        if cur and (sigs[i] != cur_sig or used + b > cap or (runs and len(cur) >= runs)):
            batches.append(cur)
            cur, used = [], 0.0
        cur.append(c)
        used += b
        cur_sig = sigs[i]
    if cur:
        batches.append(cur)
    return batches


class RayExecutor:
    """A Ray cluster (module doc): one task per run, longest first, with declared CPUs and GPUs."""

    name = "ray"

    def __init__(self, address: str | None = None, cpus: float = 1, gpus: float | None = None,
                 shared: bool = False, retries: int = 3, ship: float = SHIP_EVERY):
        if cpus < 1 or cpus != int(cpus):
            raise ConfigError(f"executor ray: cpus={cpus!r}: a whole number >= 1 (the run's torch threads)")
        if gpus is not None and not 0 <= gpus <= 8:
            raise ConfigError(f"executor ray: gpus={gpus!r}: GPUs per run, 0 to 8 (a fraction shares one)")
        if ship < 0 or retries < 0:
            raise ConfigError(f"executor ray: ship={ship!r}, retries={retries!r}: both must be >= 0")
        self.address, self.cpus, self.gpus, self.shared = address, int(cpus), gpus, shared
        self.retries, self.ship = retries, ship

    def describe(self) -> str:
        return f"Ray {self.address or 'local'}, {self.cpus} CPU" + (f", {self.gpus} GPU" if self.gpus else "") + \
            " per run" + (", shared store" if self.shared else "")

    def _gpus(self, configs, ray) -> float:
        """GPUs per task of a run on CUDA (`gpu_share`, on the cluster's live nodes)."""
        return gpu_share(configs, self.gpus, self.cpus, [n["Resources"] for n in ray.nodes() if n.get("Alive")])

    def train_all(self, configs: list[RunConfig], root, on_done=None, bars: bool = False, keep_going: bool = True) -> None:
        """(`keep_going` is the local executor's: on Ray the first failed task, its retries spent, stops the grid.)"""
        ray = _ray()
        started = not ray.is_initialized()
        if started:
            ray.init(address=self.address, include_dashboard=False)
        root = Path(root if root is not None else store.results_root() / "runs").resolve()
        keeper, refs = None, {}
        env = {"env_vars": {"PYTHONPATH": os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")])),
                            **({store.KEEP_ENV: os.environ[store.KEEP_ENV]} if store.KEEP_ENV in os.environ else {})}}
        try:
            if not self.shared:
                from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
                here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
                keeper = ray.remote(Keeper).options(num_cpus=0, scheduling_strategy=here,
                                                        runtime_env=env).remote(str(root))
            share, remote = self._gpus(configs, ray), ray.remote(_train_task)
            tasks = {g: remote.options(num_cpus=self.cpus, num_gpus=g, max_retries=self.retries, runtime_env=env)
                     for g in {share, 0.0}}
            for cfg in sorted(configs, key=parallel.work, reverse=True):
                g = run_gpus(cfg, share)
                refs[tasks[g].remote(cfg.to_dict(), store.code_fingerprint(cfg.algorithm), self.cpus,
                                     str(root) if self.shared else None, keeper, self.ship, g)] = cfg
            while refs:
                ready, _ = ray.wait(list(refs), num_returns=1)
                cfg = refs.pop(ready[0])
                files = ray.get(ready[0])   # the task's error, raised here, once its retries are spent
                if files is not None:
                    write_run(store.run_dir(cfg, root), files)
                if on_done:
                    on_done(cfg)
        except BaseException:
            for ref in refs:   # e.g. KeyboardInterrupt: stop the cluster's work on this grid now
                ray.cancel(ref, force=True)
            raise
        finally:
            if keeper is not None:
                ray.kill(keeper)
            if started:
                ray.shutdown()


def gpu_share(configs: list[RunConfig], asked: float | None, cpus: int, nodes: list[dict]) -> float:
    """GPUs per task of a run on CUDA (a device='cpu' run's is 0: `run_gpus`), from the executor's `gpus=` (`asked`,
    None: its default) and the live nodes' resources (Ray's {"CPU": .., "GPU": ..}). A clear ConfigError, before any
    task starts, when no node can hold a task (Ray would queue it forever), when runs that say device='cpu' would
    reserve a GPU they never use, or device='cuda' runs none."""
    devices = {c.device for c in configs}
    has = any(r.get("GPU", 0) > 0 for r in nodes)
    if "cuda" in devices and not has:
        raise ConfigError("device='cuda' runs, but the Ray cluster has no GPU")
    gpus = asked if asked is not None else (1.0 if has and devices & {"auto", "cuda"} else 0.0)
    if not any(r.get("CPU", 0) >= cpus and r.get("GPU", 0) >= gpus for r in nodes):
        have = "; ".join(f"{r.get('CPU', 0):g} CPU, {r.get('GPU', 0):g} GPU" for r in nodes)
        raise ConfigError(f"executor ray: a run asks for {cpus} CPU and {gpus:g} GPU, and no node of the "
                          f"cluster has that ({have}): lower cpus= / gpus=, or add such a node")
    on_cpu = sum(c.device == "cpu" for c in configs)
    if asked is not None and asked > 0 and on_cpu:
        raise ConfigError(f"executor ray: gpus={asked:g} reserves a GPU per run, but {on_cpu} runs say device='cpu': "
                          f"set device=auto (or cuda), or gpus=0")
    on_cuda = sum(c.device == "cuda" for c in configs)
    if gpus == 0 and on_cuda:
        raise ConfigError(f"executor ray: gpus=0 reserves no GPU, but {on_cuda} runs say device='cuda': set gpus= "
                          f"(1, or a fraction to share one), or device=auto")
    return gpus


def run_gpus(cfg: RunConfig, share: float) -> float:
    """GPUs one run's task reserves: the grid's share (`gpu_share`), none for a device='cpu' run."""
    return 0.0 if cfg.device == "cpu" else share


def _ray():
    try:
        import ray
    except ImportError:
        raise ConfigError("executor='ray' needs Ray: pip install 'ray>=2.40' (scripts/setup.sh installs it)") from None
    return ray


class Keeper:
    """A Ray actor on the driver's node that reads and writes runs in the driver's store for tasks on other nodes."""

    def __init__(self, root: str):
        self.root = Path(root)

    def fetch(self, name: str) -> dict:
        """What a (re)started task needs to resume run `name`: {} when it has no checkpoint here."""
        d = self.root / name
        if not (d / "checkpoint.pt").exists():
            return {}
        return {f: (d / f).read_bytes() for f in RESUME_FILES if (d / f).exists()}

    def put(self, name: str, files: dict) -> None:
        d = self.root / name           # the store's one writer: a temporary file per process, then rename
        d.mkdir(parents=True, exist_ok=True)
        for f, blob in files.items():
            store._write_atomic(d / f, blob)


def write_run(path: Path, files: dict) -> None:
    """Write a run's files into a store; its manifest last (store.MANIFEST: the run is finished from then on), so a
    reader never finds a run half written."""
    path.mkdir(parents=True, exist_ok=True)
    for f in sorted(files, key=lambda f: (f == MANIFEST, f == "summary.json")):
        store._write_atomic(path / f, files[f])   # through the module: a test records the order of writes
    (path / HEARTBEAT).unlink(missing_ok=True)
    if "checkpoint.pt" not in files:   # the finished run dropped it (store.keeps_checkpoint): not one shipped mid-run
        (path / "checkpoint.pt").unlink(missing_ok=True)


class _Shipper:
    """In a task: copies a run's heartbeat to the driver's store whenever it changes (the grid's progress shows),
    and its checkpoint (with what resuming needs) when it changed and `ship` seconds have passed since the task
    started or the last one went: a retried task resumes at most `ship` seconds (plus one checkpoint interval)
    behind. A run shorter than `ship` ships none: shipping DC-PFL's 80 MB checkpoints as written cost its mini
    Fig. 3 grid 12 s of 65 (docs/performance.md, "Ray against local")."""

    def __init__(self, path: Path, keeper, ship: float, every: float = 0.5):
        self.path, self.keeper, self.ship, self.every, self.beat = path, keeper, ship, every, HEARTBEAT
        self.seen: dict[str, tuple] = {}
        self.shipped = time.monotonic()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _changed(self, name: str) -> bool:
        try:
            st = os.stat(self.path / name)
        except FileNotFoundError:
            return False
        sig = (st.st_mtime_ns, st.st_size, st.st_ino)
        if self.seen.get(name) == sig:
            return False
        self.seen[name] = sig
        return True

    def ship_once(self) -> None:
        import ray
        files = {}
        if time.monotonic() - self.shipped >= self.ship and self._changed("checkpoint.pt"):
            files = {f: (self.path / f).read_bytes() for f in RESUME_FILES}
            self.shipped = time.monotonic()
        if self._changed(self.beat):
            try:
                files[self.beat] = (self.path / self.beat).read_bytes()
            except FileNotFoundError:   # the run ended and removed it
                pass
        if files:
            ray.get(self.keeper.put.remote(self.path.name, files))

    def _loop(self) -> None:
        while not self.stop.wait(self.every):
            self.ship_once()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def _train_task(cfg_dict: dict, fingerprint: str, threads: int, shared_root: str | None, keeper, ship: float,
                gpus: float = 0.0):
    """One run, as a Ray task: trains (or resumes) it and returns its files, or None when it wrote them into a
    shared store itself. `gpus`, the GPUs the task reserved (an execution setting, never in the run's config): a
    fraction f < 1 caps this process's CUDA memory at f and has the run check that it fits (gpu.share)."""
    import torch

    cfg = RunConfig.from_dict(cfg_dict)
    if store.code_fingerprint(cfg.algorithm) != fingerprint:
        raise RuntimeError(f"this node's pflrepro ({store.__file__}) differs from the driver's in code that changes "
                           f"{cfg.algorithm}'s results: install the driver's version on every node")
    torch.set_num_threads(threads)
    with gpu.share(gpus):
        if shared_root is not None:
            store.run(cfg, root=shared_root, progress=False)
            return None
        import ray
        with tempfile.TemporaryDirectory(prefix="pflrepro-run-") as tmp:
            path = store.run_dir(cfg, tmp)
            path.mkdir(parents=True)
            for f, blob in ray.get(keeper.fetch.remote(path.name)).items():
                (path / f).write_bytes(blob)
            with _Shipper(path, keeper, ship):
                store.run(cfg, root=tmp, progress=False)
            return {f.name: f.read_bytes() for f in path.iterdir() if f.is_file() and f.name != HEARTBEAT}


# ---------------------------------------------------------------- choosing one
def parse(spec: str) -> RayExecutor:
    """'ray', 'ray:ADDRESS' or 'ray:ADDRESS,cpus=N,gpus=F,shared' -> RayExecutor (module doc)."""
    head, _, rest = spec.partition(":")
    parts = rest.split(",") if rest else [""]
    address, opts = parts[0].strip() or None, {}
    for p in parts[1:]:
        k, eq, v = p.strip().partition("=")
        if k == "shared" and not eq:
            opts["shared"] = True
        elif k in ("cpus", "gpus", "retries", "ship") and eq:
            try:
                opts[k] = int(v) if k == "retries" else float(v)
            except ValueError:
                raise ConfigError(f"executor={spec!r}: {k}={v!r} is not a number") from None
        else:
            raise ConfigError(f"executor={spec!r}: unknown option {p!r} (cpus=N, gpus=F, retries=N, ship=S, shared)")
    return RayExecutor(address, **opts)


def parse_stacked(spec: str) -> StackedExecutor:
    """'stacked' or 'stacked:runs=N' -> StackedExecutor."""
    _, _, rest = spec.partition(":")
    runs = None
    for p in filter(None, (q.strip() for q in rest.split(","))):
        k, eq, v = p.partition("=")
        if k != "runs" or not eq:
            raise ConfigError(f"executor={spec!r}: unknown option {p!r} (runs=N: at most N runs trained together)")
        if not v.strip().isdigit() or int(v) < 1:
            raise ConfigError(f"executor={spec!r}: runs={v!r} is not an integer >= 1")
        runs = int(v)
    return StackedExecutor(runs)


def resolve(executor, jobs, configs: list[RunConfig]):
    """An executor from a notebook's or the CLI's `executor` (None: $PFLREPRO_EXECUTOR, else "local")."""
    if executor is None:
        executor = os.environ.get("PFLREPRO_EXECUTOR", "local")
    if isinstance(executor, (LocalExecutor, RayExecutor, StackedExecutor)):
        return executor
    if executor == "local":
        return LocalExecutor(parallel.resolve_jobs(jobs, configs) if configs else 1)
    if isinstance(executor, str) and executor.split(":")[0].strip() == "stacked":
        return parse_stacked(executor)
    if isinstance(executor, str) and executor.split(":")[0].strip() == "ray":
        if jobs not in (None, "auto"):
            print(f"executor {executor!r}: jobs={jobs!r} is ignored (the cluster's free CPUs and GPUs set how many "
                  "runs train at once)", file=sys.stderr)
        return parse(executor)
    head = executor.split(":")[0].strip() if isinstance(executor, str) else executor
    raise ConfigError(f"executor={executor!r}{did_you_mean(head, ('local', 'stacked', 'ray'))}: expected 'local', "
                      "'stacked[:runs=N]', 'ray' or "
                      "'ray:ADDRESS[,cpus=N,gpus=F,shared]'")

