"""Cross-implementation check against the pFedSD authors' code (CGCL-codes/pFedSD): our FedAvg and pFedSD vs theirs.

pFedSD: Jin et al., "Personalized Edge Intelligence via Federated Self-Knowledge Distillation", IEEE TPDS 2022.
Their code: https://github.com/CGCL-codes/pFedSD, commit 8eba09648e2ce9fd1298101bd8d21c0df248dca9 (2022-11-21,
"initial commit", the only one), a FedDF-derived code base (`pcode/`) whose `run_gloo.py` runs one master and one
worker process per participating client over torch.distributed (gloo).

What it compares. For each (algorithm, seed): OUR partition of Fashion-MNIST (pFedSD's setup, params/pfedsd_*.yaml:
train+test pooled, balanced Dirichlet alpha 0.1, each client's samples split 80/20 at random; `SETTING` subsamples
the pool) is exported as per-client index lists into the pooled 70,000 images (`<out>/work/seed<s>/partition.npz`,
`pfedsd_authors_driver.save_partition`), which is the very array their FashionMNIST loader builds (train then test),
so their code trains and tests every client on exactly our samples (checked: labels, per-client tensor sums). Both
sides use pFedSD's FMNIST CNN (their `CNNMnist`, `--arch simple_cnn`; ours `cnn_fmnist`, the same layers with
Dropout2d(0.5) after conv2) and start from OUR initial weights, loaded into their master model (checked by a
checksum and by the initial model's per-client correct counts on both sides). Same SGD (lr 0.01, momentum 0.9,
weight decay 1e-5 on every parameter, a new optimizer each round), E, B, clients, participation, rounds; pFedSD
lambda 0.5 (`--lamda`), tau 3 (`--KL_T`). Their `run_gloo.py` machinery runs unmodified from its own checkout in a
subprocess, through `pfedsd_authors_driver.py` (runtime patches only, listed there); ours runs with
`pflrepro.run(cfg, root=<out>/ours_runs)`.

Run (2 CPU cores: 48 minutes for both algorithms and 3 seeds at the defaults with --parallel, measured 2026-11-28;
--rounds 10 --last 3 should take about two thirds of that, not measured):

    .venv/bin/python scripts/crosscheck/pfedsd_authors.py --authors /tmp/pfedsd_authors --out /tmp/xcheck_pfedsd --parallel

Speed (the pFedSD paper row: Fashion-MNIST, 100 clients, 10 % participation, E = 5, B = 64, all data; FedAvg and
pFedSD, interleaved ours, theirs, ours, theirs; wall seconds per round for rounds 2-4, load average printed):

    .venv/bin/python scripts/crosscheck/pfedsd_authors.py --authors /tmp/pfedsd_authors --out /tmp/xcheck_timing \
        --timing [--ours-root /path/to/other/pflrepro/checkout] [--reps 2] [--engine batched]

Outputs in --out (never inside the repository): `per_round.csv` (algorithm, seed, round, side, pm_mean, pm_pooled,
n_fresh, own_avg, diverged, early_stops, nonfinite), `per_seed.csv` (per algorithm, seed and metric: ours, theirs,
diff, ours_diverged_round, theirs_diverged_round, theirs_early_stops, theirs_nonfinite_round), `summary.csv` (per
algorithm and metric: means over the seeds where neither side's metric is missing and the paired difference ours -
theirs with a 95 % t interval over those seeds, n_diverged_ours, n_diverged_theirs, n_nonfinite_theirs; a seed draws
one partition and one initial model, shared by both sides), their logs (`logs/`), the exports (`work/`). Metrics:
`pm_mean` = mean over clients of each client's local-test accuracy (personalized model; FedAvg: the global model),
averaged over the last --last rounds; `pm_pooled` = correct / tested over all clients, same rounds; `pm_best` = the
best round's pm_mean (the paper's metric). `own_avg` = the average their master logs itself (its
`log-*.json`, type average_test / GM_average_test), checked against our mean of their per-client results. Finished
runs are reused (their records, our ours_runs/), so a rerun with more seeds only trains what is new. --timing
writes timing.csv and timing_summary.csv instead.

Divergence is a result, not a crash (issue 53). Ours: `pflrepro.run` raises `Divergence` at the first non-finite
loss; the script records it and goes on with the next run. Our side runs with a checkpoint every round, so the
rounds finished before it are read back (`partial_history`); the round that diverged gets a per_round row with
diverged = 1 and no accuracy, and every metric of that seed's side is missing (nan: no finished run). Theirs never
stops (item 14): per round, `early_stops` counts the clients whose local training their divergence test ended and
`nonfinite` the scored models with a non-finite weight; diverged = 1 where either is non-zero, and their metrics
are what their master reports. per_seed's `*_diverged_round` is the first such round (empty: none).

Convention differences found in their code, and how this script handles them:
  1. When they evaluate: after every round's aggregation (master, `_update_client_performance` /
     `_update_GM_client_performance`), as we do; their round r (comm_round, 1-based) = our round r. Neither side
     evaluates the initial model; the driver scores it once (round 0) as a check.
  2. Which clients pFedSD's master scores: round 1 all clients, afterwards ONLY the clients that just trained; the
     others keep their last score (`curr_personal_perfs`), and the logged average is over all clients' latest
     scores. Their models do not change between participations, so the stale score equals a fresh one, except for
     a client never selected: theirs scores the initial model (its `local_models` entry), ours the global model
     (docs/evaluation.md). `n_fresh` counts their fresh scores; their pm_mean here carries the stale ones forward,
     as they do. With participation 1 (the default here) every client is scored fresh every round on both sides.
     Their FedAvg master scores the global model on every client's local test every round, as ours does.
  3. Accuracy average: their logged average is the plain mean over clients of each client's accuracy (MathDict
     average of per-client top1; per client, the sample-weighted mean over test batches = correct / n), as ours.
  4. Teacher in train mode: their pFedSD teacher (`last_local_model`, a deepcopy of the freshly built worker model)
     is never put in eval mode, so Dropout2d is active in the teacher's forward on every batch; ours the same
     (`teacher_mode: train`, default), with its own dropout draws. Their teacher forward also runs with gradients
     (not detached, but the teacher is not in the optimizer: no effect on the update).
  5. KD loss: theirs `CE + lamda * T^2 * KL(softmax(teacher/T) || softmax(student/T))`, batchmean, as ours (eq. 3).
     A client's first participation trains plain CE on both sides (`is_active_before == 0`).
  6. drop_last: both keep the last partial batch (their DataLoader drop_last=False; E * ceil(n/B) steps a round,
     their stop test `local_index / num_batches >= local_n_epochs`).
  7. Aggregation weights: their FedAvg (`_s1_federated_average`) and pFedSD (`_average_model`) both take the plain
     mean over the participating clients; our FedAvg weights by training-set size n_k (McMahan et al.), our pFedSD
     the plain mean (Algorithm 1). The balanced Dirichlet partition cuts equal slices (here 350 images a client,
     280 to train), so the two FedAvg weightings coincide exactly in this setting (printed per run: `weights:`).
  8. Data order and dropout randomness: each of their processes seeds torch, numpy and random with --manual_seed
     (`same_seed_process True`, their README), so every worker draws the same shuffle and dropout stream (a client's
     order is correlated with other clients'); a worker is re-used across rounds for the client at its rank
     (participation 1: client k always on worker k). Ours draws per (seed, round, client). Their master draws the
     participants with numpy RandomState(seed); ours from our seed. Neither can match the other's stream.
  9. Data normalisation: theirs Normalize(0.5, 0.5) for FMNIST (`_get_combine_fmnist`, ignoring --pn_normalize);
     ours (0.2860, 0.3530). The driver gives their dataset our transform (identical tensors, checked); this is a
     preprocessing choice, not a method difference.
 10. Partition: both implement FedDF's balanced Dirichlet (groups of 10 clients, per-class Dirichlet shares, the
     "balance" step, equal slices of int(N/K) samples; our `balanced_dirichlet` follows their code), then split
     each client 80/20 at random. Theirs draws everything from a numpy RandomState(7) fixed in the module (the same
     partition for every --manual_seed); ours from the run's seed. Ours is fed to theirs (identical client data).
     Their partitioner tests `idx in indices` against a numpy array for every sample (quadratic: minutes on all
     70,000 images); it runs once before round 1, is bypassed here, and is outside every timed round.
 11. Optimiser: theirs SGD(momentum 0.9, nesterov False), weight decay on every parameter whose name lacks "bn"
     (all of CNNMnist's), rebuilt every round (momentum buffer reset); lr constant (MultiStepLR's default
     milestone local_n_epochs + 1 is never reached; no warm-up). Ours the same (bias_decay True).
 12. Model: their CNNMnist = our cnn_fmnist (conv 1->64 5x5, max-pool, ReLU; conv 64->64 5x5, Dropout2d, max-pool,
     ReLU; fc 1024->128->64->10). Their init is PyTorch's default after torch.manual_seed(seed); ours is loaded
     into their master instead (identical start, checked).
 13. Participants: theirs int(K p + 0.5) clients a round (sorted, worker rank i trains the i-th), ours round(K p).
     Their CrossEntropyLoss for training is plain (no label smoothing: `--label_smoothing` is never used).
 14. Divergence: their worker ends a client's local training early when the running mean of the epoch's
     cross-entropy (the KD term is not in it) exceeds 1e3 or is NaN, tested after the step, and uploads the model as
     it is (a NaN loss's step has already made every weight NaN); their master averages it in like any other, and
     scores a NaN model as predicting one class (torch's topk on NaN logits). Ours stops the run with an error
     (`Divergence`) at the first non-finite loss (CE + KD), before its step. Both are recorded here (see above).
 15. Per-round work besides training: their master also tracks best-so-far values and rewrites its JSON log after
     every client evaluation; ours also scores the global model on the union of the local tests (`gm_acc`) every
     round. Both are inside the timed rounds of --timing (their `eval` records time the local-test scoring with its
     logging, our `eval_seconds` all of our evaluation).
"""
from __future__ import annotations

import argparse
import glob
import gzip
import hashlib
import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _shared import by_algorithm_and_metric, write_csv  # noqa: E402
HERE = Path(__file__).resolve().parent
DRIVER = HERE / "pfedsd_authors_driver.py"
_spec = importlib.util.spec_from_file_location("pfedsd_authors_driver", DRIVER)
drv = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(drv)

AUTHORS_REPO = "CGCL-codes/pFedSD"
AUTHORS_COMMIT = "8eba09648e2ce9fd1298101bd8d21c0df248dca9"
FMNIST_IDX = Path("/usr/share/datasets/fashion-mnist")
FMNIST_MEAN, FMNIST_STD = (0.2860,), (0.3530,)   # ours (pflrepro.data.datasets.SPECS["fmnist"])

# The shared setting (accuracy comparison), as our config fields; their arguments are built from the same values.
SETTING = {
    "dataset": "fmnist",
    "pool": "train+test", "subsample": 0.1,              # 7,000 images: 350 a client (280 train / 70 test)
    "partition": "balanced_dirichlet", "partition_params": {"alpha": 0.1},
    "split": "random", "split_params": {"fractions": [0.8, 0.2]},
    "model": "cnn_fmnist",                               # their --arch simple_cnn (CNNMnist for fmnist)
    "n_clients": 20, "participation": 1.0,
    "local_epochs": 2, "batch_size": 32,
    "lr": 0.01, "momentum": 0.9, "weight_decay": 1e-5,
    "rounds": 15,
    "eval_every": 1, "checkpoint_every": 5, "device": "cpu",
}
# The pFedSD paper's Fashion-MNIST row (Sec. 4.1, Table 2's 100-client column), for --timing.
TIMING = {**SETTING, "subsample": 1.0, "n_clients": 100, "participation": 0.1, "local_epochs": 5, "batch_size": 64,
          "rounds": 4}
ALGOS = {   # ours -> (their --algo, our hparams)
    "fedavg": ("fedavg", {}),
    "pfedsd": ("pFedSD", {"lam": 0.5, "tau": 3.0}),
}
METRICS = ("pm_mean", "pm_pooled", "pm_best")


# ---------------------------------------------------------------- their data and stubs
def prepare_their_data(data_dir: Path) -> Path:
    """Decode the Debian Fashion-MNIST IDX files into `<data_dir>/fmnist/FashionMNIST/processed/{training,test}.pt`
    ((uint8 images N x 28 x 28, int64 labels), what their FashionMNIST loader torch.loads)."""
    import torch
    out = data_dir / "fmnist" / "FashionMNIST" / "processed"
    if (out / "training.pt").exists() and (out / "test.pt").exists():
        return data_dir
    out.mkdir(parents=True, exist_ok=True)

    def idx(name):
        with gzip.open(FMNIST_IDX / name, "rb") as f:
            buf = f.read()
        ndim = buf[3]
        dims = [int.from_bytes(buf[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
        return np.frombuffer(buf, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims).copy()

    for half, prefix in (("training", "train"), ("test", "t10k")):
        x = torch.from_numpy(idx(f"{prefix}-images-idx3-ubyte.gz"))
        y = torch.from_numpy(idx(f"{prefix}-labels-idx1-ubyte.gz").astype(np.int64))
        torch.save((x, y), out / f"{half}.pt")
    return data_dir


STUBS = {   # modules their code imports at start-up but never uses here (not in our venv)
    "lmdb.py": '"""Stub: LMDB datasets (ImageNet) only."""\n',
    "cv2.py": '"""Stub: ImageNet LMDB decoding only."""\n',
    "ot.py": '"""Stub: optimal-transport aggregation only."""\n',
    "pyarrow.py": '"""Stub: tensorpack serialisation only."""\n',
    "torchcontrib/__init__.py": '"""Stub: SWA aggregation only."""\n',
    "torchcontrib/optim.py": 'SWA = None\n',
    "tensorpack/__init__.py": '"""Stub: ImageNet down-sampling tool only."""\n',
    "tensorpack/dataflow.py": 'PrefetchDataZMQ = LMDBSerializer = None\n',
    "bson/__init__.py": '"""Stub: result database tool only."""\n',
    "bson/objectid.py": 'ObjectId = None\n',
}


def write_stubs(folder: Path) -> Path:
    for name, text in STUBS.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


# ---------------------------------------------------------------- configs and export
def our_config(algo: str, seed: int, setting: dict) -> dict:
    return {**setting, "algorithm": algo, "hparams": dict(ALGOS[algo][1]), "seed": seed}


def export(cfg: dict, folder: Path):
    """Our partition (pool indices and labels per client) and initial weights, for their code; our FedData."""
    import torch

    from pflrepro.federation.build import build_context, build_partition
    from pflrepro.federation.config import RunConfig
    rc = RunConfig.from_dict(cfg)
    split = build_partition(rc)
    ctx = build_context(rc, torch.device("cpu"), split)
    folder.mkdir(parents=True, exist_ok=True)
    # labels client by client (FedData's index lists are into the run's own images, in the split's order)
    drv.save_partition(folder / "partition.npz", split["train"], split["test"],
                       [ctx.data.client_train(k)[1].numpy() for k in range(len(split["train"]))],
                       [ctx.data.client_test(k)[1].numpy() for k in range(len(split["test"]))])
    torch.save([t.clone() for t in ctx.init_state.values()], folder / "init.pt")
    return ctx.data, ctx.init_state


def checksum(state: dict) -> dict:
    ps = [t.detach().double() for t in state.values()]
    return {"sum": float(sum(p.sum() for p in ps)), "sumsq": float(sum((p * p).sum() for p in ps))}


def their_args(algo: str, seed: int, setting: dict, work: Path, tag: str, port: int) -> list[str]:
    """run_gloo.py's arguments: their README's pFedSD command, with our setting, on the CPU."""
    s = setting
    args = ["--arch", "simple_cnn", "--complex_arch", "master=simple_cnn,worker=simple_cnn", "--experiment", "xcheck",
            "--data", "fmnist", "--data_dir", str(work.parent / "data") + "/", "--pin_memory", "False",
            "--batch_size", str(s["batch_size"]), "--num_workers", "0", "--prepare_data", "combine",
            "--partition_data", "non_iid_dirichlet", "--non_iid_alpha", str(s["partition_params"]["alpha"]),
            "--train_data_ratio", "0.8", "--val_data_ratio", "0.0", "--test_data_ratio", "0.2",
            "--n_clients", str(s["n_clients"]), "--participation_ratio", str(s["participation"]),
            "--n_comm_rounds", str(s["rounds"]), "--local_n_epochs", str(s["local_epochs"]),
            "--world_conf", "0,0,1,1,100", "--on_cuda", "False",
            "--fl_aggregate", "scheme=federated_average",
            "--optimizer", "sgd", "--lr", str(s["lr"]), "--local_prox_term", "0", "--lr_warmup", "False",
            "--lr_warmup_epochs", "5", "--lr_warmup_epochs_upper_bound", "150",
            "--lr_scheduler", "MultiStepLR", "--lr_decay", "0.1",
            "--weight_decay", str(s["weight_decay"]), "--use_nesterov", "False", "--momentum_factor", str(s["momentum"]),
            "--track_time", "True", "--display_tracked_time", "True",
            "--manual_seed", str(seed), "--pn_normalize", "True", "--same_seed_process", "True",
            "--algo", ALGOS[algo][0], "--personal_test", "True",
            "--port", str(port), "--timestamp", tag,
            "--checkpoint", str(work / "checkpoint"), "--job_id", str(work / "jobrun_logs")]
    if algo == "pfedsd":
        hp = ALGOS[algo][1]
        args += ["--lamda", str(hp["lam"]), "--KL_T", str(hp["tau"])]
    return args


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- their side
def start_theirs(algo: str, seed: int, setting: dict, opts, work: Path, check: bool = True, reuse: bool = True) -> dict:
    """Start their code (through the driver) on the export in `work`; a finished run of the same setting is reused."""
    key = hashlib.sha256(json.dumps([algo, seed, setting], sort_keys=True).encode()).hexdigest()[:10]
    tag = f"{algo}_s{seed}_{key}"
    job = {"log": opts.out / "logs" / f"theirs_{tag}.log", "records": work / f"records_{tag}.jsonl",
           "proc": None, "t0": time.time(), "what": f"{algo} s{seed}", "work": work, "tag": tag}
    if reuse and job["records"].exists() and job["log"].exists() and "XCHECK: all done" in job["log"].read_text():
        return job
    job["records"].unlink(missing_ok=True)
    spec = {"parts": str(work / "partition.npz"), "init": str(work / "init.pt"), "records": str(job["records"]),
            "mean": list(FMNIST_MEAN), "std": list(FMNIST_STD), "check": check}
    (work / f"spec_{tag}.json").write_text(json.dumps(spec, indent=1))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": str(opts.stubs), "MPLBACKEND": "Agg", "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, str(DRIVER), str(opts.authors), str(work / f"spec_{tag}.json"),
           *their_args(algo, seed, setting, work, tag, free_port())]
    job["file"] = open(job["log"], "w")  # noqa: SIM115 (closed in finish_theirs)
    job["file"].write("# " + " ".join(cmd) + "\n")
    job["file"].flush()
    job["proc"] = subprocess.Popen(cmd, cwd=opts.authors, env=env, stdout=job["file"], stderr=subprocess.STDOUT)
    job["waiter"] = threading.Thread(target=lambda: (job["proc"].wait(), job.__setitem__("t1", time.time())),
                                     daemon=True)
    job["waiter"].start()    # their wall time even while ours trains (--parallel)
    return job


def finish_theirs(job: dict) -> dict:
    if job["proc"] is not None:
        job["waiter"].join()
        job["file"].close()
        if job["proc"].returncode != 0:
            raise RuntimeError(f"their {job['what']} failed (exit {job['proc'].returncode}); log: {job['log']}")
    job["seconds"] = job.get("t1", time.time()) - job["t0"]
    return parse_records(job["records"].read_text())


def parse_records(text: str) -> dict:
    """The driver's JSON lines -> {"init", "labels", "data": {client: rec}, "round0": {client: (correct, n)},
    "evals": {round: {client: (correct, n)}}, "eval_seconds": {round: s}, "starts": {round: t}, "end": t,
    "early_stops": {round: [record, ...]}, "nonfinite": {round: {client, ...}}} (correct is None where their top-1
    was not finite; "nonfinite": the clients whose scored model had a non-finite weight)."""
    out = {"init": None, "labels": None, "data": {}, "round0": {}, "evals": {}, "eval_seconds": {}, "starts": {},
           "end": None, "early_stops": {}, "nonfinite": {}}
    for line in text.splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        kind = r["type"]
        if kind == "init":
            out["init"] = {"sum": r["sum"], "sumsq": r["sumsq"]}
        elif kind == "labels":
            out["labels"] = r
        elif kind == "data":
            out["data"][r["client"]] = r
        elif kind == "round0":
            out["round0"][r["client"]] = (r["correct"], r["n"])
        elif kind == "eval" and r["client"] is not None:
            out["evals"].setdefault(r["round"], {})[r["client"]] = (r["correct"], r["n"])
            out["eval_seconds"][r["round"]] = out["eval_seconds"].get(r["round"], 0.0) + r["t1"] - r["t0"]
            if not r.get("finite", True):
                out["nonfinite"].setdefault(r["round"], set()).add(r["client"])
        elif kind == "early_stop":
            out["early_stops"].setdefault(r["round"], []).append(r)
        elif kind == "round":
            out["starts"][r["round"]] = r["t"]
        elif kind == "end":
            out["end"] = r["t"]
    return out


def round_seconds(parsed: dict) -> dict:
    """Wall seconds of each of their rounds: from its start to the next round's start (the last: to the end)."""
    rounds = sorted(parsed["starts"])
    ends = [parsed["starts"][r] for r in rounds[1:]] + [parsed["end"]]
    return {r: (e - parsed["starts"][r]) if e is not None else float("nan") for r, e in zip(rounds, ends)}


def their_scores(parsed: dict, n_clients: int) -> list[dict]:
    """Per round: their metric (each client's latest score carried forward, as their master's average does),
    pooled accuracy over the same scores, and how many clients were scored fresh that round."""
    latest, rows = {}, []
    for rnd in sorted(parsed["evals"]):
        fresh = parsed["evals"][rnd]
        latest.update(fresh)
        if len(latest) < n_clients:
            raise ValueError(f"round {rnd}: scores for {len(latest)} clients, expected {n_clients}")
        c = np.array([np.nan if latest[k][0] is None else latest[k][0] for k in range(n_clients)], dtype=float)
        n = np.array([latest[k][1] for k in range(n_clients)], dtype=float)
        rows.append({"round": rnd, "pm_mean": float(np.mean(c / n)), "pm_pooled": float(c.sum() / n.sum()),
                     "n_fresh": len(fresh)})
    return rows


def their_logged_average(checkpoint: Path, tag: str) -> dict:
    """{round: accuracy} their master logged itself (log-*.json of rank 0: type average_test / GM_average_test)."""
    out = {}
    for path in glob.glob(str(checkpoint / "**" / f"{tag}*" / "0" / "log-*.json"), recursive=True):
        for rec in json.loads(Path(path).read_text() or "[]"):
            if rec.get("type") in ("average_test", "GM_average_test") and "top1" in rec:
                out[int(rec["comm_round"])] = float(rec["top1"]) / 100.0
    return out


# ---------------------------------------------------------------- checks
def check_run(algo: str, parsed: dict, data, init: dict, setting: dict) -> list[str]:
    """Identical start and data on both sides; returns the problems found (printed by the caller)."""
    import torch
    problems = []
    ours = checksum(init)
    if parsed["init"] is None or any(abs(parsed["init"][k] - ours[k]) > 1e-6 * max(1.0, abs(ours[k])) for k in ours):
        problems.append(f"initial weights differ: theirs {parsed['init']}, ours {ours}")
    if not (parsed["labels"] or {}).get("ok"):
        problems.append(f"labels at our indices differ in their dataset: {parsed['labels']}")
    net = None
    for k in range(setting["n_clients"]):
        d = parsed["data"].get(k)
        if d is not None:
            for half, get in (("train", data.client_train), ("test", data.client_test)):
                x, _ = get(k)
                s = float(x.double().sum())
                if d[f"n_{half}"] != len(x) or abs(d[f"{half}_sum"] - s) > 1e-6 * max(1.0, abs(s)):
                    problems.append(f"client {k} {half}: their tensors (n {d[f'n_{half}']}, sum {d[f'{half}_sum']}) "
                                    f"!= ours (n {len(x)}, sum {s})")
        if k in parsed["round0"]:
            if net is None:
                from pflrepro.data.models import build_model
                net = build_model(setting["model"], 1, 10, 28)
                net.load_state_dict(init)
                net.eval()
            x, y = data.client_test(k)
            with torch.no_grad():
                c = int((net(x).argmax(1) == y).sum())
            if parsed["round0"][k] != (c, len(y)):
                problems.append(f"client {k}: initial model correct/n theirs {parsed['round0'][k]}, ours {(c, len(y))}")
    if len(parsed["round0"]) not in (0, setting["n_clients"]):
        problems.append(f"round-0 scores for {len(parsed['round0'])} clients")
    return problems


# ---------------------------------------------------------------- rows and summary
def row(algo, seed, rnd, side, pm_mean, pm_pooled, n_fresh, own_avg=float("nan"), diverged=0, early_stops=0,
        nonfinite=0) -> dict:
    """One side's round. diverged: 1 where that side's divergence signal fired in this round (ours: `Divergence`,
    the row then has no accuracy; theirs: early_stops or nonfinite > 0). early_stops: clients whose local training
    their divergence test ended; nonfinite: scored models with a non-finite weight (theirs only)."""
    return {"algorithm": algo, "seed": seed, "round": rnd, "side": side, "pm_mean": pm_mean, "pm_pooled": pm_pooled,
            "n_fresh": n_fresh, "own_avg": own_avg, "diverged": int(diverged), "early_stops": int(early_stops),
            "nonfinite": int(nonfinite)}


def our_rows(algo: str, seed: int, res, n_test: list) -> list[dict]:
    n = np.asarray(n_test, dtype=float)
    rows = []
    for h, accs in zip(res.history, res.per_client):
        a = np.asarray(accs, dtype=float)
        rows.append(row(algo, seed, int(h["round"]), "ours", float(h["pm_acc_mean"]),
                        float((a * n).sum() / n.sum()), len(a)))
    return rows


def first_diverged(sel: list) -> int | str:
    """The first round whose row says diverged ('' if none)."""
    return min((r["round"] for r in sel if r.get("diverged")), default="")


def per_seed_table(rows: list, rounds: int, last: int) -> list[dict]:
    """Per (algorithm, seed, metric): each side's value and ours - theirs (pm_mean / pm_pooled: the mean of the
    last `last` rounds; pm_best: the best round's pm_mean), nan where a side has none (our run diverged: no
    finished run, every metric nan), and each side's first diverged round ('' if none), their early stops in all and
    the first round they scored a model with a non-finite weight."""
    out = []
    nan = float("nan")
    for algo in dict.fromkeys(r["algorithm"] for r in rows):
        for seed in dict.fromkeys(r["seed"] for r in rows if r["algorithm"] == algo):
            v, div = {}, {}
            for side in ("ours", "theirs"):
                sel = [r for r in rows if (r["algorithm"], r["seed"], r["side"]) == (algo, seed, side)]
                div[side] = first_diverged(sel)
                if side == "ours" and div[side] != "":
                    v[side] = dict.fromkeys(METRICS, nan)
                    continue
                tail = [r for r in sel if rounds - last < r["round"] <= rounds]
                v[side] = {"pm_mean": float(np.mean([r["pm_mean"] for r in tail])) if tail else nan,
                           "pm_pooled": float(np.mean([r["pm_pooled"] for r in tail])) if tail else nan,
                           "pm_best": float(np.nanmax([r["pm_mean"] for r in sel]))
                           if any(np.isfinite(r["pm_mean"]) for r in sel) else nan}
            theirs = [r for r in rows if (r["algorithm"], r["seed"], r["side"]) == (algo, seed, "theirs")]
            extra = {"ours_diverged_round": div["ours"], "theirs_diverged_round": div["theirs"],
                     "theirs_early_stops": sum(r.get("early_stops", 0) for r in theirs),
                     "theirs_nonfinite_round": min((r["round"] for r in theirs if r.get("nonfinite")), default="")}
            for metric in METRICS:
                o, t = v["ours"][metric], v["theirs"][metric]
                out.append({"algorithm": algo, "seed": seed, "metric": metric, "ours": o, "theirs": t,
                            "diff": o - t, **extra})
    return out


def summary_table(per_seed: list) -> list[dict]:
    """Per (algorithm, metric): means over the seeds where both sides have the metric (n_seeds), the paired
    difference ours - theirs and its 95 % t interval; and over all seeds, how many diverged on each side (ours: the
    run stopped; theirs: their divergence test fired or a model with a non-finite weight was scored) and how many
    of theirs scored such a model."""
    nan = float("nan")
    stats = {key: (sel, mean, lo, hi) for key, sel, mean, lo, hi in
             by_algorithm_and_metric([r for r in per_seed if np.isfinite(r["diff"])])}
    out = []
    for key in dict.fromkeys((r["algorithm"], r["metric"]) for r in per_seed):
        every = [r for r in per_seed if (r["algorithm"], r["metric"]) == key]
        sel, mean, lo, hi = stats.get(key, ([], nan, nan, nan))
        out.append({"algorithm": key[0], "metric": key[1], "n_seeds": len(sel),
                    "ours": float(np.mean([r["ours"] for r in sel])) if sel else nan,
                    "theirs": float(np.mean([r["theirs"] for r in sel])) if sel else nan,
                    "diff": mean, "ci95_low": lo, "ci95_high": hi,
                    "ci_covers_0": bool(lo <= 0 <= hi) if np.isfinite(lo) else "",
                    "n_diverged_ours": sum(1 for r in every if r.get("ours_diverged_round", "") != ""),
                    "n_diverged_theirs": sum(1 for r in every if r.get("theirs_diverged_round", "") != ""),
                    "n_nonfinite_theirs": sum(1 for r in every if r.get("theirs_nonfinite_round", "") != "")})
    return out


# ---------------------------------------------------------------- our side
def is_divergence(exc: BaseException) -> bool:
    """Our run stopped because a loss became NaN/inf (`pflrepro.core.training.Divergence`, also when a run worker
    re-raised it under another type, as pflrepro.pipeline.tune reads it)."""
    from pflrepro.core.training import Divergence
    return isinstance(exc, Divergence) or "pflrepro.core.training.Divergence" in str(exc)


def partial_history(cfg: dict, root: Path) -> tuple[int, list, list]:
    """(last finished round, history, per_client) of a run that stopped, from its last checkpoint ((0, [], [])
    without one, or where it cannot be read: a warning says why)."""
    from pflrepro.federation.config import RunConfig
    from pflrepro.pipeline.store import load_checkpoint, run_dir
    rc = RunConfig.from_dict(cfg)
    path = run_dir(rc, root) / "checkpoint.pt"
    if not path.exists():
        return 0, [], []
    try:
        state = load_checkpoint(path, rc)
    except Exception as e:  # noqa: BLE001 (the store's own errors: the rounds are then unknown, the rest stands)
        print(f"  warning: cannot read {path}: {e}", flush=True)
        return 0, [], []
    return int(state["round"]), list(state["history"]), [[float(a) for a in accs] for accs in state["per_client"]]


def run_ours(algo: str, seed: int, setting: dict, opts, n_test: list) -> tuple[list[dict], dict | None, float]:
    """Our run: (per_round rows, None or {"round", "error"} where it diverged, wall seconds). It checkpoints every
    round, so a run that diverges keeps the rounds it finished (`partial_history`); those rows, then one row for the
    round that diverged (diverged = 1, no accuracy)."""
    import pflrepro
    cfg = {**our_config(algo, seed, setting), "checkpoint_every": 1}
    t1 = time.time()
    try:
        res = pflrepro.run(cfg, root=opts.out / "ours_runs", progress=False)
        return our_rows(algo, seed, res, n_test), None, time.time() - t1
    except Exception as e:  # noqa: BLE001 (anything but a Divergence is raised again)
        if not is_divergence(e):
            raise
        seconds, error = time.time() - t1, str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
    done, history, per_client = partial_history(cfg, opts.out / "ours_runs")
    rows = our_rows(algo, seed, types.SimpleNamespace(history=history, per_client=per_client), n_test)
    nan = float("nan")
    rows.append(row(algo, seed, done + 1, "ours", nan, nan, 0, diverged=1))
    return rows, {"round": done + 1, "error": error}, seconds


# ---------------------------------------------------------------- the comparison
def compare_one(algo: str, seed: int, opts, work: Path, data, init: dict) -> list[dict]:
    setting = opts.setting
    job = start_theirs(algo, seed, setting, opts, work)
    if not opts.parallel:
        parsed = finish_theirs(job)
    ours, diverged, t_ours = run_ours(algo, seed, setting, opts, [len(t) for t in data.test])
    if diverged:
        print(f"  ours {algo} s{seed}: DIVERGED in round {diverged['round']} ({diverged['error']}); recorded, going on",
              flush=True)
    if opts.parallel:
        parsed = finish_theirs(job)
    for p in check_run(algo, parsed, data, init, setting):
        print(f"  CHECK FAILED ({algo} s{seed}): {p}", flush=True)
    if parsed["round0"]:
        same = sum(1 for k in range(setting["n_clients"]) if k in parsed["round0"])
        print(f"  checks: initial weights, labels, per-client tensors and the initial model's per-client correct "
              f"counts compared on {same} clients", flush=True)
    own = their_logged_average(work / "checkpoint", job["tag"])
    rows = []
    for r in their_scores(parsed, setting["n_clients"]):
        o = own.get(r["round"], float("nan"))
        if np.isfinite(o) and abs(o - r["pm_mean"]) > 1e-4:
            print(f"  warning: round {r['round']}: their logged average {o:.4f} != mean of their per-client "
                  f"scores {r['pm_mean']:.4f}", flush=True)
        stops, bad = parsed["early_stops"].get(r["round"], []), parsed["nonfinite"].get(r["round"], set())
        rows.append(row(algo, seed, r["round"], "theirs", r["pm_mean"], r["pm_pooled"], r["n_fresh"], o,
                        diverged=bool(stops or bad), early_stops=len(stops), nonfinite=len(bad)))
    for rnd in sorted(parsed["early_stops"]):
        for e in parsed["early_stops"][rnd]:
            print(f"  theirs {algo} s{seed}: round {rnd}, client {e['client']}: their divergence test ended its local "
                  f"training after {e['step']} steps (running mean CE {e['loss_avg']:.4g}); uploaded weights "
                  f"{'finite' if e['finite'] else 'NOT finite'}", flush=True)
    for rnd in sorted(parsed["nonfinite"]):
        print(f"  theirs {algo} s{seed}: round {rnd}: {len(parsed['nonfinite'][rnd])} scored model(s) with non-finite "
              f"weights", flush=True)
    rows += ours
    if algo == "fedavg":
        n = np.array([len(t) for t in data.train], dtype=float)
        print(f"  weights: our FedAvg weights n_k/sum n in [{n.min() / n.sum():.4f}, {n.max() / n.sum():.4f}], "
              f"theirs 1/K = {1 / len(n):.4f}", flush=True)
    last = {s: next((r["pm_mean"] for r in rows if r["side"] == s and r["round"] == setting["rounds"]), float("nan"))
            for s in ("theirs", "ours")}
    print(f"{algo} seed {seed}: round {setting['rounds']} pm_mean ours {last['ours']:.4f}"
          f"{' (diverged in round %d)' % diverged['round'] if diverged else ''} theirs {last['theirs']:.4f} "
          f"(theirs {job.get('seconds', 0):.0f} s, ours {t_ours:.0f} s)", flush=True)
    return rows


def run_comparison(opts) -> int:
    import torch
    torch.set_num_threads(opts.threads)
    rows, t0 = [], time.time()
    for seed in opts.seeds:
        work = opts.out / "work" / f"seed{seed}"
        data, init = export(our_config(opts.algorithms[0], seed, opts.setting), work)
        for algo in opts.algorithms:
            rows += compare_one(algo, seed, opts, work, data, init)
            write_csv(opts.out / "per_round.csv", rows)
    last = min(opts.last, opts.setting["rounds"])
    per_seed = per_seed_table(rows, opts.setting["rounds"], last)
    summary = summary_table(per_seed)
    write_csv(opts.out / "per_seed.csv", per_seed)
    write_csv(opts.out / "summary.csv", summary)
    print(f"\npm_mean / pm_pooled: mean of the last {last} rounds; pm_best: best round; {len(opts.seeds)} seed(s); "
          f"diff = ours - theirs")
    print(f"{'algorithm':<8} {'metric':<10} {'ours':>7} {'theirs':>7} {'diff':>8}  95% CI{'':<12} seeds  diverged "
          f"ours/theirs")
    for s in summary:
        print(f"{s['algorithm']:<8} {s['metric']:<10} {s['ours']:7.4f} {s['theirs']:7.4f} {s['diff']:+8.4f}  "
              f"[{s['ci95_low']:+.4f}, {s['ci95_high']:+.4f}] {s['n_seeds']:5d}  {s['n_diverged_ours']}/"
              f"{s['n_diverged_theirs']}")
    print(f"\nwritten: {opts.out}/per_round.csv, per_seed.csv, summary.csv ({time.time() - t0:.0f} s)")
    return 0


# ---------------------------------------------------------------- --timing
OURS_TIMED = r"""
import json, sys
import pflrepro  # before torch, as our CLI and run workers do (OMP_WAIT_POLICY)
import torch
torch.set_num_threads(int(sys.argv[3]))
res = pflrepro.run(json.loads(sys.argv[1]), root=sys.argv[2], progress=False, force=True)
print("XCHECK_OURS " + json.dumps([{"round": int(h["round"]), "seconds": h["seconds"],
                                    "eval_seconds": h["eval_seconds"]} for h in res.history]))
"""


def time_ours(cfg: dict, opts, root: Path) -> tuple[dict, dict, str]:
    """Our run in a fresh process on --ours-root's code: {round: seconds}, {round: eval seconds}, pflrepro path."""
    env = {**os.environ, "OMP_NUM_THREADS": str(opts.threads), "MKL_NUM_THREADS": str(opts.threads),
           "PYTHONPATH": str(opts.ours_root), "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-c", OURS_TIMED, json.dumps(cfg), str(root), str(opts.threads)],
                         cwd=opts.ours_root, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"our timed run failed:\n{out.stderr[-3000:]}")
    line = next(x for x in reversed(out.stdout.splitlines()) if x.startswith("XCHECK_OURS "))
    hist = json.loads(line[len("XCHECK_OURS "):])
    return {h["round"]: h["seconds"] for h in hist}, {h["round"]: h["eval_seconds"] for h in hist}, str(opts.ours_root)


def run_timing(opts) -> int:
    setting = opts.setting
    rows = []
    print(f"timing: {setting['n_clients']} clients, participation {setting['participation']}, E = "
          f"{setting['local_epochs']}, B = {setting['batch_size']}, subsample {setting['subsample']}, "
          f"{setting['rounds']} rounds; ours: {opts.threads} thread(s) from {opts.ours_root}; theirs: "
          f"{int(setting['n_clients'] * setting['participation'] + 0.5) + 1} processes, 1 thread each; "
          f"{os.cpu_count()} CPUs", flush=True)
    seed = opts.seeds[0]
    work = opts.out / "work" / f"seed{seed}"
    export(our_config(opts.algorithms[0], seed, setting), work)
    for algo in opts.algorithms:
        for rep in range(opts.reps):
            for side in ("ours", "theirs"):
                load = os.getloadavg()[0]
                if side == "ours":
                    secs, ev, _ = time_ours(our_config(algo, seed, setting), opts,
                                            opts.out / "timing_runs" / f"{algo}_{rep}")
                else:
                    job = start_theirs(algo, seed, setting, opts, work, check=False, reuse=False)
                    parsed = finish_theirs(job)
                    secs, ev = round_seconds(parsed), parsed["eval_seconds"]
                for rnd in sorted(secs):
                    rows.append({"algorithm": algo, "rep": rep, "side": side, "round": rnd, "seconds": secs[rnd],
                                 "eval_seconds": ev.get(rnd, float("nan")), "load1_before": load})
                timed = [secs[r] for r in sorted(secs) if r >= 2]
                print(f"  {algo} rep {rep} {side:<6}: rounds 2-{max(secs)} {np.mean(timed):.2f} s/round "
                      f"(eval {np.mean([ev.get(r, np.nan) for r in sorted(secs) if r >= 2]):.2f} s), "
                      f"load average before {load:.2f}, after {os.getloadavg()[0]:.2f}", flush=True)
                write_csv(opts.out / "timing.csv", rows)
    summary = []
    for algo in opts.algorithms:
        v = {side: [r["seconds"] for r in rows if r["algorithm"] == algo and r["side"] == side and r["round"] >= 2]
             for side in ("ours", "theirs")}
        e = {side: [r["eval_seconds"] for r in rows if r["algorithm"] == algo and r["side"] == side and r["round"] >= 2]
             for side in ("ours", "theirs")}
        summary.append({"algorithm": algo, "rounds_timed": f"2-{setting['rounds']}", "reps": opts.reps,
                        "ours_s_per_round": float(np.mean(v["ours"])), "theirs_s_per_round": float(np.mean(v["theirs"])),
                        "ours_eval_s": float(np.nanmean(e["ours"])), "theirs_eval_s": float(np.nanmean(e["theirs"])),
                        "speedup_theirs_over_ours": float(np.mean(v["theirs"]) / np.mean(v["ours"])),
                        "ours_root": str(opts.ours_root), "threads_ours": opts.threads})
        s = summary[-1]
        print(f"{algo}: ours {s['ours_s_per_round']:.2f} s/round, theirs {s['theirs_s_per_round']:.2f} s/round "
              f"(theirs / ours = {s['speedup_theirs_over_ours']:.2f})", flush=True)
    write_csv(opts.out / "timing_summary.csv", summary)
    print(f"written: {opts.out}/timing.csv, timing_summary.csv")
    return 0


# ---------------------------------------------------------------- main
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--authors", required=True, help="path of a CGCL-codes/pFedSD checkout (its run_gloo.py is run)")
    ap.add_argument("--out", default="/tmp/xcheck_pfedsd", help="output folder (outside the repository)")
    ap.add_argument("--algorithms", default="fedavg,pfedsd", help=f"comma-separated, of: {', '.join(ALGOS)}")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--last", type=int, default=5, help="rounds averaged for pm_mean / pm_pooled")
    ap.add_argument("--timing", action="store_true", help="time the paper's FMNIST row instead (see the docstring)")
    ap.add_argument("--reps", type=int, default=2, help="--timing: repetitions of (ours, theirs) per algorithm")
    ap.add_argument("--ours-root", default=str(ROOT), help="--timing: the pflrepro checkout to time (PYTHONPATH)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads of our side (default: 1; --timing: every CPU); theirs: 1 per process")
    ap.add_argument("--parallel", action="store_true", help="train ours while theirs runs (default: one at a time)")
    for name, kind in (("rounds", int), ("n-clients", int), ("participation", float), ("local-epochs", int),
                       ("batch-size", int), ("subsample", float), ("lr", float)):
        ap.add_argument(f"--{name}", type=kind, default=None, help="override the setting's value")
    ap.add_argument("--engine", choices=("auto", "batched", "per_client"), default=None,
                    help="our training engine (default: the config's, `auto`)")
    opts = ap.parse_args(argv)
    opts.algorithms = [a for a in opts.algorithms.split(",") if a]
    opts.seeds = [int(s) for s in opts.seeds.split(",") if s]
    opts.out = Path(opts.out).resolve()
    opts.authors = Path(opts.authors).resolve()
    opts.ours_root = Path(opts.ours_root).resolve()
    bad = [a for a in opts.algorithms if a not in ALGOS]
    if bad:
        ap.error(f"unknown algorithms {bad}; mapped: {', '.join(ALGOS)}")
    if opts.out == ROOT or ROOT in opts.out.parents:
        ap.error(f"--out {opts.out} is inside the repository; use a folder outside it (e.g. /tmp/...)")
    if not (opts.authors / "run_gloo.py").exists() or not (opts.authors / "pcode").is_dir():
        ap.error(f"--authors {opts.authors}: no run_gloo.py / pcode/ there")
    opts.setting = dict(TIMING if opts.timing else SETTING)
    for name in ("rounds", "n_clients", "participation", "local_epochs", "batch_size", "subsample", "lr", "engine"):
        if getattr(opts, name) is not None:
            opts.setting[name] = getattr(opts, name)
    if opts.threads is None:
        opts.threads = (os.cpu_count() or 1) if opts.timing else 1
    return opts


def main(argv=None) -> int:
    import pflrepro  # noqa: F401  (before torch: pflrepro sets OMP_WAIT_POLICY=PASSIVE where torch is not yet loaded)
    opts = parse_args(argv)
    (opts.out / "logs").mkdir(parents=True, exist_ok=True)
    opts.stubs = write_stubs(opts.out / "stubs")
    prepare_their_data(opts.out / "work" / "data")
    print(f"their code: {opts.authors} (expected {AUTHORS_REPO} @ {AUTHORS_COMMIT[:10]}); setting: "
          f"{json.dumps(opts.setting)}", flush=True)
    return run_timing(opts) if opts.timing else run_comparison(opts)


if __name__ == "__main__":
    sys.exit(main())
