"""Run the pFedSD authors' code (CGCL-codes/pFedSD, `run_gloo.py`) on OUR partition (used by pfedsd_authors.py).

    python pfedsd_authors_driver.py <pFedSD checkout> <spec.json> <run_gloo.py arguments...>

Their `run_gloo.py` starts one master (rank 0) and n_participated workers as `spawn`ed processes talking over
torch.distributed (gloo). This driver does the same (its launcher is run_gloo.py's `__main__` block: n_participated =
int(n_clients * participation_ratio + 0.5), one `spawn` process per rank, each calling run_gloo's `main(rank, size,
conf, port)`), except that every process first applies the runtime patches below. Their files are never modified.

Patches (in memory, in every process of theirs):
  * data: `create_dataset.define_combine_dataset` / `define_local_dataset` hand each client OUR train and test index
    lists (`spec["parts"]`, indices into their pooled train+test FashionMNIST = ours) instead of their own
    Dirichlet partition and per-client random split; their dataset object, `__getitem__` (PIL) and DataLoaders are
    kept. `get_combine_dataset`'s transform is ToTensor + Normalize(`spec["mean"]`, `spec["std"]`) (ours) instead
    of their Normalize(0.5, 0.5), so both sides train on identical tensors.
  * `torch.utils.data.DataLoader` ignores `multiprocessing_context` when num_workers == 0 (their loaders pass 'fork',
    which modern PyTorch refuses without worker processes).
  * the master's model (rank 0, the template every client model and the first global model are copied from) is
    loaded with OUR initial weights (`spec["init"]`: the tensors in parameter order).
  * records (JSON lines appended to `spec["records"]`, one write per line: the master writes all but `early_stop`,
    which the workers write):
      {"type": "init", "sum", "sumsq"}                     checksum of the master's initial parameters
      {"type": "labels", "ok", "mismatch"}                  their labels at our indices vs ours (`spec["labels"]`)
      {"type": "data", "client", "train_sum", "test_sum", "n_train", "n_test"}   float64 sums of the tensors
                                                            their pipeline yields per client (with spec["check"])
      {"type": "round0", "client", "correct", "n"}          the initial model on each local test (spec["check"])
      {"type": "round", "round", "t"}                       each round's start (time.perf_counter())
      {"type": "eval", "round", "label", "client", "correct", "n", "t0", "t1", "finite"}   every local-test
                                                            evaluation; `finite`: whether every weight of the scored
                                                            model is finite (correct is null where their top-1 is not)
      {"type": "early_stop", "round", "client", "step", "loss_avg", "finite"}   a worker's divergence test ended this
                                                            client's local training (worker_base.py:194-201,
                                                            worker_pFedSD.py:152-159: the running mean of the
                                                            epoch's cross-entropy > 1e3 or NaN, tested after the
                                                            step); `step`: steps taken this round, `finite`: whether
                                                            every weight of the model it then uploads is finite
      {"type": "end", "t"}                                  after the last round
    Client ids are ours (0-based; theirs are 1-based).
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import numpy as np


# ---------------------------------------------------------------- the export format (no pcode needed)
def save_partition(path, train: list, test: list, y_train: list, y_test: list) -> None:
    """Write per-client pool indices and labels: train_<k>, test_<k>, ytrain_<k>, ytest_<k> (int64)."""
    arrays = {}
    for k, (tr, te, ytr, yte) in enumerate(zip(train, test, y_train, y_test)):
        arrays[f"train_{k}"] = np.asarray(tr, dtype=np.int64)
        arrays[f"test_{k}"] = np.asarray(te, dtype=np.int64)
        arrays[f"ytrain_{k}"] = np.asarray(ytr, dtype=np.int64)
        arrays[f"ytest_{k}"] = np.asarray(yte, dtype=np.int64)
    with open(path, "wb") as f:
        np.savez(f, n_clients=np.int64(len(train)), **arrays)


def load_partition(path) -> dict:
    """{"train": [...], "test": [...], "ytrain": [...], "ytest": [...]}: per-client int64 arrays."""
    with np.load(path) as z:
        n = int(z["n_clients"])
        return {key: [z[f"{key}_{k}"] for k in range(n)] for key in ("train", "test", "ytrain", "ytest")}


CLIENT_LABEL = re.compile(r"local_test_loader_client_(\d+)")


def client_of(label: str) -> int | None:
    """Our 0-based client id from their evaluation label ('local_test_loader_client_7-0' -> 6)."""
    m = CLIENT_LABEL.search(label or "")
    return int(m.group(1)) - 1 if m else None


class Records:
    """Append-only JSON-lines file: one os.write per record (no interleaving with their many processes' output)."""

    def __init__(self, path):
        self.path = path

    def __call__(self, **rec) -> None:
        line = (json.dumps(rec) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


# ---------------------------------------------------------------- patches (inside their processes)
def finite_model(model) -> bool:
    """Whether every floating-point tensor of the model's state is finite."""
    import torch
    return all(bool(torch.isfinite(t).all()) for t in model.state_dict().values() if t.is_floating_point())


def patch(spec: dict) -> None:
    import torch
    from pcode import create_dataset, create_model, master_utils
    from pcode.datasets.partition_data import Partition
    from pcode.masters.master_base import MasterBase
    from pcode.masters.master_fedavg import MasterFedAvg
    from pcode.masters.master_pFedSD import MasterpFedSD
    from pcode.workers.worker_base import WorkerBase
    from pcode.workers.worker_pFedSD import WorkerpFedSD
    from torchvision import transforms

    record = Records(spec["records"])
    parts = load_partition(spec["parts"])

    class Loader(torch.utils.data.DataLoader):
        def __init__(self, *args, multiprocessing_context=None, **kwargs):
            if kwargs.get("num_workers", 0) == 0:
                multiprocessing_context = None
            super().__init__(*args, multiprocessing_context=multiprocessing_context, **kwargs)

    torch.utils.data.DataLoader = Loader

    get_combine = create_dataset.get_combine_dataset

    def get_combine_dataset(conf, name, datasets_path, *args, **kwargs):
        ds = get_combine(conf, name, datasets_path, *args, **kwargs)
        ds.transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize(spec["mean"], spec["std"])])
        return ds

    class OurPartitioner:
        """Stands in for their DataPartitioner: client k's train and test are our index lists."""

        def __init__(self, conf, dataset):
            self.data = dataset
            if conf.graph.rank == 0:
                targets = np.asarray(dataset.targets)
                bad = [k for k in range(len(parts["train"]))
                       if not (np.array_equal(targets[parts["train"][k]], parts["ytrain"][k])
                               and np.array_equal(targets[parts["test"][k]], parts["ytest"][k]))]
                record(type="labels", ok=not bad, mismatch=bad, pool=len(targets))

        def local(self, k: int) -> dict:
            return {"train": Partition(self.data, [int(i) for i in parts["train"][k]]),
                    "val": Partition(self.data, []),
                    "test": Partition(self.data, [int(i) for i in parts["test"][k]])}

    def define_local_dataset(conf, client_id, datasets, display_log=True):
        return datasets.local(client_id - 1)

    create_dataset.get_combine_dataset = get_combine_dataset
    create_dataset.define_combine_dataset = OurPartitioner
    create_dataset.define_local_dataset = define_local_dataset

    define_model = create_model.define_model

    def define_model_ours(conf, show_stat=True, to_consistent_model=True, use_complex_arch=True, client_id=None,
                          arch=None):
        name, model = define_model(conf, show_stat, to_consistent_model, use_complex_arch, client_id, arch)
        if conf.graph.rank == 0 and client_id is None and arch is None:
            init = torch.load(spec["init"], weights_only=True)
            params = list(model.parameters())
            if [tuple(t.shape) for t in init] != [tuple(p.shape) for p in params]:
                raise RuntimeError(f"initial weights: shapes {[tuple(t.shape) for t in init]} vs their model's "
                                   f"{[tuple(p.shape) for p in params]}")
            with torch.no_grad():
                for p, t in zip(params, init):
                    p.copy_(t)
            ps = [p.detach().double() for p in params]
            record(type="init", sum=float(sum(p.sum() for p in ps)), sumsq=float(sum((p * p).sum() for p in ps)))
        return name, model

    create_model.define_model = define_model_ours

    validate = master_utils.validate

    def validate_recorded(conf, coordinator, model, criterion, metrics, data_loader, label="test_loader",
                          display=True):
        t0 = time.perf_counter()
        perf = validate(conf, coordinator, model, criterion, metrics, data_loader, label=label, display=display)
        n = len(data_loader.dataset)
        top1 = float(perf["top1"])
        record(type="eval", round=int(conf.graph.comm_round), label=label, client=client_of(label),
               correct=round(top1 * n / 100.0) if np.isfinite(top1) else None, n=n, t0=t0, t1=time.perf_counter(),
               finite=finite_model(model))
        return perf

    master_utils.validate = validate_recorded

    def terminating(terminate):
        """Their workers end every round's local training through `_terminate_comm_round`, after their divergence
        test (it ends training early) or after the last step; the test's condition, read here, tells which."""
        def terminate_recorded(self):
            avg = float(self.tracker.stat["loss"].avg)
            if avg > 1e3 or np.isnan(avg):
                record(type="early_stop", round=int(self.conf.graph.comm_round),
                       client=int(self.conf.graph.client_id) - 1, step=int(self.scheduler.local_index), loss_avg=avg,
                       finite=finite_model(self.model))
            return terminate(self)
        return terminate_recorded

    for cls in (WorkerBase, WorkerpFedSD):     # WorkerpFedSD has its own; WorkerFedAvg inherits WorkerBase's
        cls._terminate_comm_round = terminating(cls.__dict__["_terminate_comm_round"])

    get_n_local_epoch = master_utils.get_n_local_epoch

    def round_start(conf, n_participated):      # the master's first call in every round
        record(type="round", round=int(conf.graph.comm_round), t=time.perf_counter())
        return get_n_local_epoch(conf=conf, n_participated=n_participated)

    master_utils.get_n_local_epoch = round_start

    finishing = MasterBase._finishing

    def finishing_recorded(self, _comm_round=None):
        record(type="end", t=time.perf_counter())
        return finishing(self, _comm_round)

    MasterBase._finishing = finishing_recorded

    def checked(run):
        def run_checked(self):
            if spec.get("check"):
                initial_checks(self)
            return run(self)
        return run_checked

    def initial_checks(master):
        """Per client: sums of the tensors their pipeline yields, and the initial model on its local test."""
        net = master.master_model
        was = net.training
        net.eval()
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            for cid in master.client_ids:
                sums = {}
                for half in ("train", "test"):
                    part = master.local_datasets[cid][half]
                    sums[half] = float(sum(part[i][0].double().sum() for i in range(len(part))))
                    sums["n_" + half] = len(part)
                record(type="data", client=cid - 1, train_sum=sums["train"], test_sum=sums["test"],
                       n_train=sums["n_train"], n_test=sums["n_test"])
                correct = n = 0
                for x, y in master.local_test_loaders[cid]:
                    correct += int((net(x).argmax(1) == y).sum())
                    n += len(y)
                record(type="round0", client=cid - 1, correct=correct, n=n)
        net.train(was)

    for cls in (MasterFedAvg, MasterpFedSD):
        cls.run = checked(cls.run)


# ---------------------------------------------------------------- launcher (run_gloo.py's __main__ block)
def child(rank: int, size: int, conf, port: str, checkout: str, spec: dict) -> None:
    if checkout not in sys.path:
        sys.path.insert(0, checkout)
    patch(spec)
    import run_gloo
    run_gloo.main(rank, size, conf, port)


def main() -> int:
    checkout, spec_path, rest = os.path.abspath(sys.argv[1]), sys.argv[2], sys.argv[3:]
    spec = json.loads(Path(spec_path).read_text())
    sys.path.insert(0, checkout)
    os.chdir(checkout)
    import torch.multiprocessing as mp
    from parameters import get_args
    sys.argv = [os.path.join(checkout, "run_gloo.py"), *rest]
    conf = get_args()
    conf.n_participated = int(conf.n_clients * conf.participation_ratio + 0.5)
    size = conf.n_participated + 1
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=child, args=(rank, size, conf, conf.port, checkout, spec)) for rank in range(size)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    bad = [(i, p.exitcode) for i, p in enumerate(procs) if p.exitcode != 0]
    if bad:
        print(f"XCHECK: processes failed (rank, exit code): {bad}", flush=True)
        return 1
    print("XCHECK: all done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
