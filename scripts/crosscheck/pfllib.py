"""Cross-implementation check against PFLlib (TsingZ0/PFLlib): one identical setting, trained by both codebases.

What it compares. For each (algorithm, seed): OUR partition of Fashion-MNIST (`SETTING`: 20 clients, two shards
each, 240 train / 60 test images a client) is exported, normalised exactly as we feed it, into PFLlib's dataset
format (`<work>/dataset/FMNIST_xcheck/{train,test}/<client>.npz`, `{"data": {"x", "y"}}`), so PFLlib trains on the
very same client tensors. Both sides use PFLlib's `FedAvgCNN` for 1x28x28 inputs (conv 5x5 1->32, ReLU, max-pool 2;
conv 5x5 32->64, ReLU, max-pool 2; fc 1024->512, ReLU; fc 512->10), registered here at runtime as
`pfllib_fedavgcnn` (body = everything up to the 512-d feature, head = the last Linear, PFLlib's `fc`, which is
also the head PFLlib's BaseHeadSplit splits off). Our builder draws its weights right after
`torch.manual_seed(0)`, exactly as PFLlib's main.py does, so both sides start from identical weights (checked
each run: PFLlib's driver prints a checksum of its initial model). Same lr, batch size, local epochs, clients,
participation, rounds, plain SGD (PFLlib's SGD has no momentum or weight decay). PFLlib's own `system/main.py`
runs unmodified in a subprocess, from its own checkout, through `pfllib_driver.py`, which also prints every
client's test result; ours runs with `pflrepro.run(cfg, root=<out>/ours_runs)`.

Run (the lead runs the full comparison; about 10 algorithms x 3 seeds x 50 rounds):

    .venv/bin/python scripts/crosscheck/pfllib.py --pfllib /tmp/pfllib --out /tmp/pfllib_crosscheck \
        --algorithms fedavg,fedprox,ditto,fedrep,fedper,lg_fedavg,fedrod,scaffold,perfedavg,pfedme \
        --seeds 0,1,2 --rounds 50

Outputs in --out (never inside the repository): `per_round.csv` (algorithm, seed, round, side, pm_mean, pm_pooled,
gm_local_mean, gm_local_pooled, gm_global), `per_seed.csv`, `summary.csv` (per algorithm and metric: the mean over
seeds of the last `--last` rounds' accuracy on each side, and the paired difference ours - PFLlib with a 95 %
t interval over seeds; a seed draws one partition, shared by both sides), PFLlib's logs (`logs/`), the exported
datasets (`pfllib_work/seed<s>/dataset/`). Each invocation's CSVs cover its own --algorithms and --seeds; a finished
PFLlib run (its log in logs/) and a finished run of ours (ours_runs/) are reused, so running again with the full
lists rebuilds the combined tables at once. `--parallel` runs PFLlib's process while ours trains (2 cores busy).

Metrics, on both sides computed from per-client results: `pm_mean` = mean over clients of each client's
personalized-model accuracy on its local test split (our `pm_acc_mean`); `pm_pooled` = correct / test samples
over all clients (PFLlib's printed "Averaged Test Accuracy"); `gm_local_*` = the global model on the clients'
local test splits (PFLlib has no global test set; ours: `eval_gm_local`, per-client only for generic methods,
where PM = GM); `gm_global` = our GM on the global test set (ours only).

PFLlib checkout used to write this: commit d832e76f6a (2025-11-29); its work tree needs only `system/` (the
repository's dataset blobs may be missing: `git clone <repo> /tmp/pfllib`, then, if the checkout fails on them,
`git -C /tmp/pfllib restore --source=HEAD -- system`). Its imports h5py, cvxpy and calmsize (not in our venv, not
used here) are stubbed in `<out>/stubs` on PYTHONPATH. Checks printed for every run: identical initial weights
(checksum), and PFLlib's round-0 per-client correct counts = ours for the initial model on our export (data,
model and scoring identical), and that our pooling of PFLlib's per-client results equals the accuracy it prints.

Convention differences found in PFLlib's code, and how this script handles them:
  1. Evaluation timing: PFLlib evaluates at the START of round i (after sending the global model to every
     client, before local training), for i = 0..global_rounds, and never evaluates the last round's aggregate.
     Its round i therefore scores the state after i aggregations / i local trainings, = our round i (we evaluate
     after round i's aggregation). Round 0 (the initial model) exists only on PFLlib's side (ours: blank).
  2. Accuracy averaging: PFLlib pools (sum correct / sum n); we take the plain mean over clients. Both are
     computed here for both sides from per-client results (equal 60-image test splits make them equal up to
     rounding, but the code keeps them separate).
  3. Drop-last: PFLlib's train loader uses drop_last=True (floor(n/B) steps an epoch), ours keeps the last
     partial batch (ceil(n/B)). 240 train images a client and B = 10 (Per-FedAvg: 2B = 20) make both equal here;
     other settings would differ (the script warns).
  4. Aggregation weights: PFLlib weights by training-set size (SCAFFOLD: plain mean of the deltas); our pFedMe
     takes the plain mean (Algorithm 1), our SCAFFOLD too. Equal client sizes make them equal here.
  5. Learning-rate decay: PFLlib's `-ld` defaults to off (and is `type=bool`, so any value turns it on: never
     passed); ours has none.
  6. Local epochs: same meaning (passes over the client's training data) except Per-FedAvg: PFLlib calls
     `client.train()` twice per round, each pass taking steps of 2B samples, so our `local_epochs` = 2 x E.
     FedRep: PFLlib `-pls` head epochs then `-ls` body epochs = our head_epochs / body_epochs.
  7. Momentum / weight decay: PFLlib's optimisers have neither; ours set to 0.
  8. Data normalisation: none differs: PFLlib reads our normalised float tensors as they are.
  9. Test split: identical (our per-client 80/20 stratified split, exported).
 10. Data order / randomness: PFLlib seeds torch with 0 (main.py and every client's __init__) whatever the seed,
     so its data order is the same for every seed; ours follows the seed. Client sampling: PFLlib's unseeded
     numpy (seeded by the driver) vs ours; with participation 1 (the default) every client trains each round on
     both sides. With --participation < 1: PFLlib takes int(N p) clients, we round(N p); a client never selected
     keeps its initial personal model in PFLlib (Ditto's v, FedRep's head, ...), while our Ditto/pFedMe score
     the GM for it (docs/evaluation.md).
 11. Ditto: PFLlib trains the PM before the GM in a round, we after; both anchor the PM at the received w^t, so
     only the data order differs. PFLlib prints both GM and PM (both on local tests).
 12. pFedMe: PFLlib's `personalized_params` is the list returned by pFedMeOptimizer.step, i.e. the client
     model's own parameters; after training they are overwritten with the local w, and `send_models` then sets
     them to the global model. PFLlib's "personalized" accuracy is therefore the GLOBAL model on local tests
     (the driver reports `alias` = True when this holds). It is compared with our `gm_local` (the same model);
     our pm (theta_hat) is listed beside it. PFLlib's inner step also adds mu = 0.001 * theta (hard-coded
     pFedMeOptimizer default): our `mu: 0.001`. PFLlib's `-bt` defaults to 0 (global model never moves): 1 given.
 13. Per-FedAvg: PFLlib's beta is hard-wired to the client lr (our `beta` = lr); its personalized model is one
     SGD step on the first batch of a freshly shuffled loader (ours: one step on a fixed seeded batch).
 14. FedRoD: PFLlib's balanced-softmax prior counts the labels its drop_last loader yields (here all of them);
     log(counts) vs our log(frequencies) differ by a constant, which softmax ignores.
Not mapped (mapping not clean): FedBABU (PFLlib fine-tunes only once, after the last round, for 10 epochs from
the client's locally trained body, and scores the global model with its initial head at every round; ours
fine-tunes at every evaluation from the aggregate), APFL (PFLlib trains v on its own loss, not on the mixed
model's, overwrites v with the mix each round, mixes with the LOCAL w, adds 0.02 * alpha to alpha's gradient),
FedFomo (PFLlib has no epsilon-greedy exploration, takes its validation set as the last 20 % of the file order,
trains without shuffling, accumulates raw unnormalised weights in P).
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")   # before torch is imported

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _shared import by_algorithm_and_metric, write_csv  # noqa: E402
import pflrepro  # noqa: E402
from pflrepro.data.models import MODELS, SplitModel, register_model  # noqa: E402
from pflrepro.federation.build import build_data, build_partition  # noqa: E402
from pflrepro.federation.config import RunConfig  # noqa: E402

DRIVER = Path(__file__).resolve().parent / "pfllib_driver.py"
MODEL = "pfllib_fedavgcnn"
PFLLIB_DATASET = "FMNIST_xcheck"     # must contain "MNIST": PFLlib's main.py then builds FedAvgCNN(1, 10, dim=1024)

# The shared setting, as our config fields; each PFLlib argument it maps to is in the comment.
SETTING = {
    "dataset": "fmnist",                 # exported to PFLlib (-data FMNIST_xcheck, -ncl 10)
    "pool": "train", "subsample": 0.1,   # 6,000 training images, stratified
    "partition": "shards", "partition_params": {"s": 2},   # pathological non-IID, 2 shards of 150 a client
    "split": "random", "split_params": {"fractions": [0.8, 0.2], "stratify": True},  # 240 train / 60 test
    "n_clients": 20,                     # -nc 20
    "participation": 1.0,                # -jr 1.0
    "model": MODEL,                      # -m CNN (FedAvgCNN for "MNIST" datasets)
    "local_epochs": 1,                   # -ls 1
    "batch_size": 10,                    # -lbs 10
    "lr": 0.01,                          # -lr 0.01
    "momentum": 0.0, "weight_decay": 0.0,   # PFLlib's SGD: neither
    "eval_every": 1,                     # -eg 1
    "eval_gm_local": True,               # our GM on local tests (what PFLlib's "Evaluate global model" scores)
    "device": "cpu",                     # -dev cpu
}

# Per algorithm: PFLlib's -algo name and extra arguments <-> our algorithm, hparams and config overrides;
# `pm` / `gm`: which PFLlib client method scores the personalized / global model (on local tests); PFLlib's
# round-0 PM is the initial model (checked client by client against ours) unless `round0_is_init` is False.
MAPPING = {
    "fedavg": {"pfllib": "FedAvg", "args": [], "hparams": {},
               "pm": "test_metrics", "gm": "test_metrics"},
    "fedprox": {"pfllib": "FedProx", "args": ["-mu", "0.01"], "hparams": {"mu": 0.01},   # -mu <-> mu
                "pm": "test_metrics", "gm": "test_metrics"},
    "ditto": {"pfllib": "Ditto", "args": ["-mu", "1.0", "-pls", "1"],     # -mu <-> lam, -pls <-> pm_epochs
              "hparams": {"lam": 1.0, "pm_epochs": 1},
              "pm": "test_metrics_personalized", "gm": "test_metrics"},
    "fedrep": {"pfllib": "FedRep", "args": ["-pls", "1"],                  # -pls <-> head_epochs, -ls <-> body_epochs
               "hparams": {"head_layers": 1, "head_epochs": 1, "body_epochs": 1},
               "pm": "test_metrics", "gm": None},
    "fedper": {"pfllib": "FedPer", "args": [], "hparams": {"head_layers": 1},   # PFLlib's head: the last fc
               "pm": "test_metrics", "gm": None},
    "lg_fedavg": {"pfllib": "LG-FedAvg", "args": [], "hparams": {"head_layers": 1},   # shared head: the last fc
                  "pm": "test_metrics", "gm": None},
    "fedrod": {"pfllib": "FedROD", "args": [], "hparams": {"pm_epochs": 0, "joint": True, "phead_init": "init"},
               "pm": "test_metrics", "gm": None},
    "scaffold": {"pfllib": "SCAFFOLD", "args": ["-slr", "1.0"], "hparams": {"server_lr": 1.0, "cv_lr": "lr"},
                 "pm": "test_metrics", "gm": "test_metrics"},
    "perfedavg": {"pfllib": "PerAvg", "args": [],   # PFLlib: alpha = beta = lr (hard-wired), first order
                  "hparams": {"alpha": None, "beta": SETTING["lr"], "variant": "fo", "steps": 0, "ft_steps": 1,
                              "ft_data": "batch", "weighted": True},   # our local_epochs = 2 x -ls (convention 6)
                  "pm": "test_metrics", "gm": None,
                  "round0_is_init": False},   # its round-0 PM is the initial model after one SGD step
    "pfedme": {"pfllib": "pFedMe", "args": ["-lam", "15", "-K", "5", "-lrp", "0.01", "-bt", "1.0"],
               "hparams": {"lam": 15.0, "K": 5, "personal_lr": 0.01, "beta": 1.0, "mu": 0.001, "R": 0,
                           "inner_init": "warm"},
               "pm": "test_metrics_personalized", "gm": None,
               "pm_is_gm": True},   # convention 12: PFLlib's "personalized" model is the global model
}


# ---------------------------------------------------------------- the shared model
def fedavg_cnn(in_channels: int, num_classes: int, image_size: int) -> SplitModel:
    """PFLlib's FedAvgCNN, with PFLlib's initial weights (built right after torch.manual_seed(0), in PFLlib's
    construction order conv1, conv2, fc1, fc; the global RNG is left untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        conv1, conv2 = nn.Conv2d(in_channels, 32, 5), nn.Conv2d(32, 64, 5)
        side = ((image_size - 4) // 2 - 4) // 2
        fc1 = nn.Linear(64 * side * side, 512)
        head = nn.Linear(512, num_classes)
    body = nn.Sequential(conv1, nn.ReLU(), nn.MaxPool2d(2), conv2, nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(1), fc1, nn.ReLU())
    return SplitModel(body, head, feature_dim=512)


def init_checksum() -> dict:
    """Sum and sum of squares of our initial parameters (compared with PFLlib's XCHECK_INIT)."""
    params = [p.detach().double() for p in fedavg_cnn(1, 10, 28).parameters()]
    return {"sum": float(sum(p.sum() for p in params)), "sumsq": float(sum((p * p).sum() for p in params))}


# ---------------------------------------------------------------- configs and export
def our_config(algo: str, seed: int, rounds: int, opts) -> dict:
    m = MAPPING[algo]
    cfg = {**SETTING, "lr": opts.lr, "batch_size": opts.batch_size, "local_epochs": opts.local_epochs,
           "participation": opts.participation, "algorithm": algo, "hparams": dict(m["hparams"]),
           "rounds": rounds, "seed": seed}
    if algo == "perfedavg":
        cfg["local_epochs"] = 2 * opts.local_epochs
        cfg["hparams"]["beta"] = opts.lr
    if algo == "fedrep":
        cfg["hparams"]["body_epochs"] = opts.local_epochs
    return cfg


def pfllib_args(algo: str, rounds: int, opts) -> list[str]:
    """main.py's arguments. Never `-ld` (type=bool: any value, even False, turns lr decay on)."""
    return ["-data", PFLLIB_DATASET, "-ncl", "10", "-m", "CNN", "-algo", MAPPING[algo]["pfllib"],
            "-gr", str(rounds), "-ls", str(opts.local_epochs), "-lbs", str(opts.batch_size), "-lr", str(opts.lr),
            "-nc", str(SETTING["n_clients"]), "-jr", str(opts.participation), "-eg", "1", "-t", "1",
            "-dev", "cpu", "-go", "xcheck", *MAPPING[algo]["args"]]


def export_partition(cfg: dict, folder: Path):
    """Write our clients' (normalised) train/test tensors in PFLlib's format; return our FedData."""
    rc = RunConfig.from_dict(cfg)
    split = build_partition(rc)
    data = build_data(rc, torch.device("cpu"), split)
    sizes = {"train": [], "test": []}
    for half in ("train", "test"):
        (folder / half).mkdir(parents=True, exist_ok=True)
        for k in range(data.n_clients):
            x, y = data.client_train(k) if half == "train" else data.client_test(k)
            with open(folder / half / f"{k}.npz", "wb") as f:
                np.savez_compressed(f, data={"x": x.numpy().astype(np.float32), "y": y.numpy().astype(np.int64)})
            sizes[half].append(len(y))
    (folder / "sizes.json").write_text(json.dumps(sizes))
    bs = [cfg["batch_size"], 2 * cfg["batch_size"]]
    if any(n % b for n in sizes["train"] for b in bs):
        print(f"  warning: some train sizes are not multiples of {bs}: PFLlib's drop_last loader takes fewer steps")
    return data


STUBS = {   # modules PFLlib imports but this comparison never uses (not installed in our venv)
    "h5py.py": '''"""Stub: results kept with pickle (only PFLlib's save_results / average_data use h5py)."""
import pickle
class File(dict):
    def __init__(self, path, mode="r"):
        super().__init__()
        self.path, self.mode = path, mode
        if mode == "r":
            with open(path, "rb") as f:
                self.update(pickle.load(f))
    def create_dataset(self, name, data=None):
        self[name] = data
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        if self.mode != "r":
            with open(self.path, "wb") as f:
                pickle.dump(dict(self), f)
''',
    "cvxpy.py": '"""Stub: only PFLlib\'s FedPAC uses cvxpy."""\n',
    "calmsize.py": '"""Stub for PFLlib\'s memory reporter."""\ndef size(n):\n    return float(n)\n',
}


def write_stubs(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in STUBS.items():
        (folder / name).write_text(text)
    return folder


# ---------------------------------------------------------------- PFLlib's side
def start_pfllib(algo: str, seed: int, opts, work: Path) -> dict:
    """Start PFLlib's main.py (through the driver) from `work/<algo>`, so that its '../dataset' is our export.
    A finished log of the same arguments is reused (no process started)."""
    args = pfllib_args(algo, opts.rounds, opts)
    tag = f"{algo}_s{seed}_r{opts.rounds}_{hashlib.sha256(repr(args).encode()).hexdigest()[:8]}"
    job = {"log": opts.out / "logs" / f"pfllib_{tag}.log", "proc": None, "t0": time.time(), "what": f"{algo} s{seed}"}
    if job["log"].exists() and "All done!" in job["log"].read_text():
        return job
    cwd = work / algo
    cwd.mkdir(parents=True, exist_ok=True)
    threads = str(opts.threads)
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "CUDA_VISIBLE_DEVICES": "",
           "MPLBACKEND": "Agg", "PYTHONPATH": str(opts.stubs)}
    cmd = [sys.executable, str(DRIVER), str(Path(opts.pfllib) / "system"), str(seed), *args]
    job["file"] = open(job["log"], "w")
    job["file"].write("# " + " ".join(cmd) + "\n")
    job["file"].flush()
    job["proc"] = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=job["file"], stderr=subprocess.STDOUT)
    return job


def finish_pfllib(job: dict) -> str:
    """Wait for a started PFLlib run; its log text."""
    if job["proc"] is not None:
        rc = job["proc"].wait()
        job["file"].close()
        if rc != 0:
            raise RuntimeError(f"PFLlib {job['what']} failed (exit {rc}); log: {job['log']}")
    job["seconds"] = time.time() - job["t0"]
    return job["log"].read_text()


def parse_pfllib(text: str) -> tuple[dict, dict | None, dict]:
    """From a driver log: {(round, method): {client: (correct, n, alias)}}, the initial-model checksum, and
    {round: [PFLlib's printed "Average(d) Test Accuracy" values]} (pFedMe prints "Average ...")."""
    recs, init, printed, rnd = {}, None, {}, None
    for line in text.splitlines():
        if line.startswith("-------------Round number:"):
            rnd = int(line.split(":")[1].strip(" -"))
        elif line.startswith("XCHECK_CLIENT ") and rnd is not None:
            r = json.loads(line[len("XCHECK_CLIENT "):])
            recs.setdefault((rnd, r["fn"]), {})[r["id"]] = (r["correct"], r["n"], r["alias"])
        elif line.startswith("XCHECK_INIT "):
            init = json.loads(line[len("XCHECK_INIT "):])
        elif line.startswith(("Averaged Test Accuracy:", "Average Test Accuracy:")) and rnd is not None:
            printed.setdefault(rnd, []).append(float(line.split(":")[1]))
    return recs, init, printed


def scores(rec: dict | None, n_clients: int) -> tuple[float, float]:
    """(mean over clients of correct/n, pooled correct / n) from one evaluation's per-client records."""
    if not rec:
        return float("nan"), float("nan")
    if len(rec) != n_clients:
        raise ValueError(f"{len(rec)} client results, expected {n_clients}")
    c = np.array([v[0] for v in rec.values()], dtype=float)
    n = np.array([v[1] for v in rec.values()], dtype=float)
    return float(np.mean(c / n)), float(c.sum() / n.sum())


def pfllib_rows(algo: str, seed: int, parsed: tuple) -> list[dict]:
    recs, _, printed = parsed
    m, K = MAPPING[algo], SETTING["n_clients"]
    rows = []
    for rnd in sorted({r for r, _ in recs}):
        pm = scores(recs.get((rnd, m["pm"])), K)
        gm = scores(recs.get((rnd, m["gm"])), K) if m["gm"] else (pm if m.get("pm_is_gm") else (np.nan, np.nan))
        if not any(abs(pm[1] - p) < 1e-4 for p in printed.get(rnd, [])):   # our pooling = PFLlib's print
            print(f"  warning: {algo} s{seed} round {rnd}: pooled {pm[1]:.4f} not in PFLlib's {printed.get(rnd)}")
        rows.append(row(algo, seed, rnd, "pfllib", pm, gm, np.nan))
    return rows


def row(algo, seed, rnd, side, pm, gm, gm_global) -> dict:
    return {"algorithm": algo, "seed": seed, "round": rnd, "side": side, "pm_mean": pm[0], "pm_pooled": pm[1],
            "gm_local_mean": gm[0], "gm_local_pooled": gm[1], "gm_global": gm_global}


# ---------------------------------------------------------------- our side
def our_rows(algo: str, seed: int, res, n_test: list) -> list[dict]:
    from pflrepro.algorithms import ALGORITHMS
    generic = ALGORITHMS[algo].generic     # PM = GM on local tests: per-client GM results exist
    n = np.asarray(n_test, dtype=float)
    rows = []
    for h, accs in zip(res.history, res.per_client):
        a = np.asarray(accs, dtype=float)
        pm = (h["pm_acc_mean"], float((a * n).sum() / n.sum()))
        gm = (h.get("gm_local_acc_mean", np.nan), pm[1] if generic else np.nan)
        rows.append(row(algo, seed, int(h["round"]), "ours", pm, gm, h["gm_acc"]))
    return rows


def check_round0(algo: str, parsed: tuple, data) -> None:
    """PFLlib's round 0 scores the initial model: its per-client correct counts must equal ours on our export."""
    m = MAPPING[algo]
    rec = parsed[0].get((0, m["pm"])) if m.get("round0_is_init", True) else None
    if not rec:
        return
    net = fedavg_cnn(1, 10, 28).eval()
    with torch.no_grad():
        ours = [int((net(data.client_test(k)[0]).argmax(1) == data.client_test(k)[1]).sum()) for k in range(len(rec))]
    bad = [k for k in range(len(rec)) if (rec[k][0], rec[k][1]) != (ours[k], len(data.client_test(k)[1]))]
    print(f"  round 0 (initial model): per-client correct counts identical on {len(rec) - len(bad)}/{len(rec)} "
          f"clients" + (f"; differ on {bad}" if bad else ""))


def compare_one(algo: str, seed: int, opts, work: Path, data) -> list[dict]:
    """Both sides for one (algorithm, seed), overlapped with --parallel: their per-round rows."""
    job = start_pfllib(algo, seed, opts, work)
    if not opts.parallel:
        finish_pfllib(job)
    t1 = time.time()
    res = pflrepro.run(our_config(algo, seed, opts.rounds, opts), root=opts.out / "ours_runs", progress=False)
    t_ours = time.time() - t1
    parsed = parse_pfllib(finish_pfllib(job))
    ours = init_checksum()
    if parsed[1] is None or any(abs(parsed[1][k] - ours[k]) > 1e-6 * max(1.0, abs(ours[k])) for k in ours):
        print(f"  warning: initial weights differ: PFLlib {parsed[1]}, ours {ours}")
    check_round0(algo, parsed, data)
    aliases = {v[2] for rec in parsed[0].values() for v in rec.values()} - {None}
    if aliases:
        print(f"  {algo}: PFLlib's personalized_params is the client model's own parameter list: {sorted(aliases)}")
    rows = pfllib_rows(algo, seed, parsed) + our_rows(algo, seed, res, [len(t) for t in data.test])
    last = {s: [r for r in rows if r["side"] == s and r["round"] == opts.rounds][0] for s in ("pfllib", "ours")}
    print(f"{algo} seed {seed}: round {opts.rounds} pm_mean ours {last['ours']['pm_mean']:.4f} "
          f"PFLlib {last['pfllib']['pm_mean']:.4f} (PFLlib {job['seconds']:.0f} s, ours {t_ours:.0f} s)", flush=True)
    return rows


# ---------------------------------------------------------------- summary
METRICS = ("pm_mean", "pm_pooled", "gm_local_mean", "gm_local_pooled")


def finite_mean(values: list) -> float:
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    return float(v.mean()) if len(v) else float("nan")


def per_seed_table(rows: list, rounds: int, last: int) -> list[dict]:
    """Per (algorithm, seed, metric): each side's mean over the last `last` rounds, and ours - PFLlib."""
    out = []
    for algo in dict.fromkeys(r["algorithm"] for r in rows):
        for seed in dict.fromkeys(r["seed"] for r in rows if r["algorithm"] == algo):
            for metric in METRICS:
                v = {side: finite_mean([r[metric] for r in rows if (r["algorithm"], r["seed"], r["side"]) ==
                                        (algo, seed, side) and rounds - last < r["round"] <= rounds])
                     for side in ("ours", "pfllib")}
                if not np.isnan(v["ours"] - v["pfllib"]):
                    out.append({"algorithm": algo, "seed": seed, "metric": metric, "ours": v["ours"],
                                "pfllib": v["pfllib"], "diff": v["ours"] - v["pfllib"]})
    return out


def summary_table(per_seed: list) -> list[dict]:
    """Per (algorithm, metric): means over seeds, the paired difference and its 95 % t interval."""
    out = []
    for key, sel, mean, lo, hi in by_algorithm_and_metric(per_seed):
        note = ""
        if MAPPING[key[0]].get("pm_is_gm") and key[1].startswith("pm"):
            note = "PFLlib's PM is its global model (docstring, convention 12): compare gm_local"
        side = {k: float(np.mean([r[k] for r in sel])) for k in ("ours", "pfllib")}
        out.append({"algorithm": key[0], "metric": key[1], "n_seeds": len(sel), **side,
                    "diff": mean, "ci95_low": lo, "ci95_high": hi, "note": note})
    return out


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pfllib", required=True, help="path of a PFLlib checkout (its system/main.py is run)")
    ap.add_argument("--algorithms", default=",".join(MAPPING), help=f"comma-separated, of: {', '.join(MAPPING)}")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--out", default="/tmp/pfllib_crosscheck", help="output folder (outside the repository)")
    ap.add_argument("--last", type=int, default=10, help="rounds averaged for the final accuracy")
    ap.add_argument("--lr", type=float, default=SETTING["lr"])
    ap.add_argument("--batch-size", type=int, default=SETTING["batch_size"])
    ap.add_argument("--local-epochs", type=int, default=SETTING["local_epochs"])
    ap.add_argument("--participation", type=float, default=SETTING["participation"])
    ap.add_argument("--threads", type=int, default=1, help="torch / OpenMP threads on each side")
    ap.add_argument("--parallel", action="store_true",
                    help="run PFLlib's process while ours trains (two busy processes; default: one after the other)")
    opts = ap.parse_args(argv)
    opts.algorithms = [a for a in opts.algorithms.split(",") if a]
    opts.seeds = [int(s) for s in opts.seeds.split(",") if s]
    opts.out = Path(opts.out).resolve()
    bad = [a for a in opts.algorithms if a not in MAPPING]
    if bad:
        ap.error(f"unknown algorithms {bad}; mapped: {', '.join(MAPPING)}")
    if opts.out == ROOT or ROOT in opts.out.parents:
        ap.error(f"--out {opts.out} is inside the repository; use a folder outside it (e.g. /tmp/...)")
    if not (Path(opts.pfllib) / "system" / "main.py").exists():
        ap.error(f"--pfllib {opts.pfllib}: no system/main.py there")
    return opts


def main(argv=None) -> int:
    opts = parse_args(argv)
    torch.set_num_threads(opts.threads)
    if MODEL not in MODELS:
        register_model(MODEL, fedavg_cnn)
    (opts.out / "logs").mkdir(parents=True, exist_ok=True)
    opts.stubs = write_stubs(opts.out / "stubs")
    rows = []
    for seed in opts.seeds:
        work = opts.out / "pfllib_work" / f"seed{seed}"
        data = export_partition(our_config(opts.algorithms[0], seed, opts.rounds, opts),
                                work / "dataset" / PFLLIB_DATASET)
        for algo in opts.algorithms:
            rows += compare_one(algo, seed, opts, work, data)
            write_csv(opts.out / "per_round.csv", rows)
    per_seed = per_seed_table(rows, opts.rounds, min(opts.last, opts.rounds))
    summary = summary_table(per_seed)
    write_csv(opts.out / "per_seed.csv", per_seed)
    write_csv(opts.out / "summary.csv", summary)
    print(f"\nlast {min(opts.last, opts.rounds)} rounds, mean over {len(opts.seeds)} seed(s); diff = ours - PFLlib")
    print(f"{'algorithm':<10} {'metric':<16} {'ours':>7} {'PFLlib':>7} {'diff':>7}  95% CI")
    for s in summary:
        print(f"{s['algorithm']:<10} {s['metric']:<16} {s['ours']:7.4f} {s['pfllib']:7.4f} {s['diff']:+7.4f}  "
              f"[{s['ci95_low']:+.4f}, {s['ci95_high']:+.4f}] {s['note']}")
    print(f"\nwritten: {opts.out}/per_round.csv, per_seed.csv, summary.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
