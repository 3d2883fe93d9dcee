"""scripts/crosscheck/pfedsd_authors.py without the authors' checkout: the export format, what it reads from the
driver's records and their logs, how it scores (their stale scores carried forward), checks and summarises. The
comparison itself needs a CGCL-codes/pFedSD checkout (docs/evidence.md)."""
import gzip
import importlib.util
import json
import math

import numpy as np
import pytest
import torch

from pflrepro.paths import REPO_ROOT


@pytest.fixture(scope="module")
def xc():
    spec = importlib.util.spec_from_file_location("xcheck_pfedsd", REPO_ROOT / "scripts" / "crosscheck" / "pfedsd_authors.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_partition_export_round_trips_per_client_indices_and_labels(xc, tmp_path):
    train = [np.array([5, 1, 69999]), np.array([7])]
    test = [np.array([3]), np.array([60000, 2])]
    y = np.arange(70000) % 10
    xc.drv.save_partition(tmp_path / "p.npz", train, test, [y[i] for i in train], [y[i] for i in test])
    got = xc.drv.load_partition(tmp_path / "p.npz")
    assert [a.tolist() for a in got["train"]] == [[5, 1, 69999], [7]]      # order kept, not sorted
    assert [a.tolist() for a in got["test"]] == [[3], [60000, 2]]
    assert [a.tolist() for a in got["ytest"]] == [[3], [0, 2]]
    assert all(a.dtype == np.int64 for key in got for a in got[key])


def test_their_evaluation_labels_map_to_our_zero_based_clients(xc):
    assert xc.drv.client_of("local_test_loader_client_7-0") == 6
    assert xc.drv.client_of("GM_local_test_loader_client_12-0") == 11     # their FedAvg scores the GM
    assert xc.drv.client_of("fedavg_test_loader-0") is None


def _records(tmp_path, xc, recs):
    path = tmp_path / "records.jsonl"
    write = xc.drv.Records(str(path))
    for r in recs:
        write(**r)
    return xc.parse_records(path.read_text())


def test_records_are_read_and_stale_scores_carried_forward_as_their_master_does(xc, tmp_path):
    """Round 1 scores both clients, round 2 only client 1 (pFedSD's master scores the clients that just trained):
    client 0 keeps its round-1 score in round 2's average."""
    ev = lambda r, c, k, n: {"type": "eval", "round": r, "label": f"local_test_loader_client_{c + 1}-0",
                             "client": c, "correct": k, "n": n, "t0": 10.0 * r, "t1": 10.0 * r + 0.5}
    parsed = _records(tmp_path, xc, [
        {"type": "init", "sum": 1.5, "sumsq": 2.5}, {"type": "labels", "ok": True, "mismatch": [], "pool": 70000},
        {"type": "round0", "client": 0, "correct": 1, "n": 10},
        {"type": "round", "round": 1, "t": 100.0}, ev(1, 0, 5, 10), ev(1, 1, 30, 40),
        {"type": "round", "round": 2, "t": 103.0}, ev(2, 1, 40, 40),
        {"type": "end", "t": 107.5}])
    assert parsed["init"] == {"sum": 1.5, "sumsq": 2.5} and parsed["round0"] == {0: (1, 10)}
    assert parsed["evals"] == {1: {0: (5, 10), 1: (30, 40)}, 2: {1: (40, 40)}}
    assert parsed["eval_seconds"] == {1: pytest.approx(1.0), 2: pytest.approx(0.5)}
    assert xc.round_seconds(parsed) == {1: pytest.approx(3.0), 2: pytest.approx(4.5)}
    r1, r2 = xc.their_scores(parsed, 2)
    assert r1 == {"round": 1, "pm_mean": pytest.approx((0.5 + 0.75) / 2), "pm_pooled": pytest.approx(35 / 50),
                  "n_fresh": 2}
    assert r2["pm_mean"] == pytest.approx((0.5 + 1.0) / 2) and r2["n_fresh"] == 1
    with pytest.raises(ValueError, match="scores for 2 clients, expected 3"):
        xc.their_scores(parsed, 3)


def test_their_own_logged_average_is_read_from_the_masters_json_log(xc, tmp_path):
    folder = tmp_path / "checkpoint" / "fmnist" / "simple_cnn" / "xcheck" / "pfedsd_s0_abc_algo-pFedSD_lr-0.01" / "0"
    folder.mkdir(parents=True)
    (folder / "log-1.json").write_text(json.dumps([
        {"measurement": "runtime", "comm_round": 1, "top1": 55.0, "split": "test", "type": "average_test"},
        {"measurement": "runtime", "comm_round": 1, "top1": 10.0, "split": "test", "type": "local_test_loader_client_1-0"},
        {"measurement": "runtime", "comm_round": 2, "top1": 62.5, "split": "test", "type": "GM_average_test"}]))
    assert xc.their_logged_average(tmp_path / "checkpoint", "pfedsd_s0_abc") == {1: 0.55, 2: 0.625}
    assert xc.their_logged_average(tmp_path / "checkpoint", "fedavg_s0_abc") == {}


def test_summary_is_the_paired_difference_with_a_t_interval(xc):
    """Differences 0.01, 0.03, 0.02 over three seeds: mean 0.02, sem 0.01 / sqrt(3), t(0.975, 2) = 4.3027."""
    per_seed = [{"algorithm": "pfedsd", "seed": s, "metric": "pm_mean", "ours": 0.5 + d, "theirs": 0.5, "diff": d}
                for s, d in enumerate((0.01, 0.03, 0.02))]
    (row,) = xc.summary_table(per_seed)
    half = 4.302653 * 0.01 / math.sqrt(3)
    assert row["diff"] == pytest.approx(0.02) and row["n_seeds"] == 3 and row["ours"] == pytest.approx(0.52)
    assert (row["ci95_low"], row["ci95_high"]) == pytest.approx((0.02 - half, 0.02 + half), abs=1e-6)
    assert row["ci_covers_0"] is True                      # 0.02 - 0.0248 < 0
    (tight,) = xc.summary_table([{**r, "diff": d} for r, d in zip(per_seed, (0.020, 0.021, 0.022))])
    assert tight["ci_covers_0"] is False


def test_last_rounds_are_averaged_and_the_best_round_taken_per_side_and_seed(xc):
    rows = [xc.row("fedavg", 0, r, side, acc, acc - 0.01, 2)
            for r, side, acc in ((1, "ours", 0.1), (2, "ours", 0.5), (3, "ours", 0.3),
                                 (1, "theirs", 0.2), (2, "theirs", 0.2), (3, "theirs", 0.4))]
    got = {r["metric"]: r for r in xc.per_seed_table(rows, rounds=3, last=2)}
    assert got["pm_mean"]["ours"] == pytest.approx(0.4) and got["pm_mean"]["diff"] == pytest.approx(0.1)
    assert got["pm_pooled"]["theirs"] == pytest.approx(0.29)
    assert (got["pm_best"]["ours"], got["pm_best"]["theirs"]) == pytest.approx((0.5, 0.4))


class _Data:
    def __init__(self, x, y):
        self.x, self.y = x, y

    def client_train(self, k):
        return self.x[k], self.y[k]

    def client_test(self, k):
        return self.x[k][:3], self.y[k][:3]


def test_run_checks_pass_on_identical_start_and_data_and_name_each_difference(xc):
    from pflrepro.data.models import build_model
    torch.manual_seed(0)
    init = build_model("cnn_fmnist", 1, 10, 28).state_dict()
    net = build_model("cnn_fmnist", 1, 10, 28)
    net.load_state_dict(init)
    net.eval()
    xs = [torch.randn(5, 1, 28, 28), torch.randn(4, 1, 28, 28)]
    ys = [torch.tensor([0, 1, 2, 3, 4]), torch.tensor([5, 6, 7, 8])]
    data = _Data(xs, ys)
    with torch.no_grad():
        correct = [int((net(x[:3]).argmax(1) == y[:3]).sum()) for x, y in zip(xs, ys)]
    parsed = {"init": xc.checksum(init), "labels": {"ok": True},
              "data": {k: {"client": k, "train_sum": float(xs[k].double().sum()), "n_train": len(xs[k]),
                           "test_sum": float(xs[k][:3].double().sum()), "n_test": 3} for k in (0, 1)},
              "round0": {k: (correct[k], 3) for k in (0, 1)}}
    setting = {"n_clients": 2, "model": "cnn_fmnist"}
    assert xc.check_run("pfedsd", parsed, data, init, setting) == []
    bad = {**parsed, "init": {"sum": parsed["init"]["sum"] + 1e-3, "sumsq": parsed["init"]["sumsq"]},
           "labels": {"ok": False, "mismatch": [1]},
           "data": {**parsed["data"], 1: {**parsed["data"][1], "test_sum": parsed["data"][1]["test_sum"] + 1.0}},
           "round0": {0: parsed["round0"][0], 1: (correct[1] + 1, 3)}}
    problems = xc.check_run("pfedsd", bad, data, init, setting)
    assert len(problems) == 4
    assert [p.split(":")[0] for p in problems] == [
        "initial weights differ", "labels at our indices differ in their dataset", "client 1 test", "client 1"]


def test_their_arguments_carry_our_setting_and_pfedsds_lambda_and_temperature(xc, tmp_path):
    s = xc.SETTING
    args = xc.their_args("pfedsd", 3, s, tmp_path / "work" / "seed3", "tag", 12345)
    kv = dict(zip(args[::2], args[1::2]))
    assert kv["--algo"] == "pFedSD" and kv["--lamda"] == "0.5" and kv["--KL_T"] == "3.0"
    assert (kv["--lr"], kv["--momentum_factor"], kv["--weight_decay"]) == (str(s["lr"]), str(s["momentum"]),
                                                                         str(s["weight_decay"]))
    assert (kv["--local_n_epochs"], kv["--batch_size"], kv["--n_clients"], kv["--n_comm_rounds"]) == (
        str(s["local_epochs"]), str(s["batch_size"]), str(s["n_clients"]), str(s["rounds"]))
    assert kv["--manual_seed"] == "3" and kv["--on_cuda"] == "False" and kv["--num_workers"] == "0"
    assert kv["--data_dir"].rstrip("/") == str(tmp_path / "work" / "data")
    fedavg = dict(zip(*[iter(xc.their_args("fedavg", 0, s, tmp_path, "t", 1))] * 2))
    assert fedavg["--algo"] == "fedavg" and "--lamda" not in fedavg


def _idx_gz(path, arr):
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + arr.astype(np.uint8).tobytes())


def test_their_data_files_are_the_decoded_idx_arrays(xc, tmp_path, monkeypatch):
    src = tmp_path / "idx"
    src.mkdir()
    rng = np.random.default_rng(0)
    arrays = {"train": (rng.integers(0, 256, (3, 28, 28)), np.array([9, 0, 4])),
              "t10k": (rng.integers(0, 256, (2, 28, 28)), np.array([1, 7]))}
    for prefix, (x, y) in arrays.items():
        _idx_gz(src / f"{prefix}-images-idx3-ubyte.gz", x)
        _idx_gz(src / f"{prefix}-labels-idx1-ubyte.gz", y)
    monkeypatch.setattr(xc, "FMNIST_IDX", src)
    xc.prepare_their_data(tmp_path / "data")
    for half, prefix in (("training", "train"), ("test", "t10k")):
        x, y = torch.load(tmp_path / "data" / "fmnist" / "FashionMNIST" / "processed" / f"{half}.pt",
                          weights_only=True)
        assert x.dtype == torch.uint8 and y.dtype == torch.int64 and x.shape == (len(y), 28, 28)
        assert np.array_equal(x.numpy(), arrays[prefix][0]) and y.tolist() == arrays[prefix][1].tolist()


def _their_records(n_clients, rounds, early_stop=None, nan_model=None):
    """Driver records of a run of theirs: every client scored every round (half right), `early_stop` = (round,
    client, finite) a worker's divergence test, `nan_model` = (round, client) a scored model with NaN weights."""
    recs = [{"type": "init", "sum": 0.0, "sumsq": 0.0}, {"type": "labels", "ok": True, "mismatch": [], "pool": 70000}]
    for r in range(1, rounds + 1):
        recs.append({"type": "round", "round": r, "t": float(r)})
        if early_stop and early_stop[0] == r:
            recs.append({"type": "early_stop", "round": r, "client": early_stop[1], "step": 7,
                         "loss_avg": float("nan") if not early_stop[2] else 4.2e3, "finite": early_stop[2]})
        for k in range(n_clients):
            bad = nan_model == (r, k)
            recs.append({"type": "eval", "round": r, "label": f"local_test_loader_client_{k + 1}-0", "client": k,
                         "correct": 5, "n": 10, "t0": float(r), "t1": float(r) + 0.1, "finite": not bad})
    recs.append({"type": "end", "t": float(rounds + 1)})
    return recs


def test_their_early_stops_and_non_finite_models_are_read_per_round(xc, tmp_path):
    parsed = _records(tmp_path, xc, _their_records(2, 3, early_stop=(2, 1, False), nan_model=(3, 1)))
    assert [(r, [e["client"] for e in es]) for r, es in parsed["early_stops"].items()] == [(2, [1])]
    assert parsed["early_stops"][2][0]["finite"] is False and math.isnan(parsed["early_stops"][2][0]["loss_avg"])
    assert parsed["nonfinite"] == {3: {1}}
    # a top-1 that is not finite comes as correct = None: that client's score is nan, not a crash
    parsed["evals"][3][1] = (None, 10)
    r3 = xc.their_scores(parsed, 2)[2]
    assert math.isnan(r3["pm_mean"]) and math.isnan(r3["pm_pooled"])


def test_partial_history_of_a_run_without_checkpoint_is_empty(xc, tmp_path):
    assert xc.partial_history(xc.our_config("pfedsd", 0, xc.SETTING), tmp_path) == (0, [], [])


def test_a_divergence_of_ours_is_recorded_and_the_script_goes_on(xc, tmp_path, monkeypatch):
    """Two seeds, FedAvg and pFedSD, 3 rounds, 2 clients, their side and our runs faked. Our pFedSD run of seed 0
    raises Divergence in round 3 (after checkpointing rounds 1-2); their pFedSD of seed 1 early-stops a client in
    round 2. Every run is still compared and written: the divergence is a row (diverged = 1, no accuracy), the
    seed's metrics of our side are nan and left out of the paired difference, and the summary counts it."""
    import csv
    import types

    import pflrepro
    from pflrepro.core.training import Divergence
    n_clients, rounds = 2, 3
    setting = {**xc.SETTING, "n_clients": n_clients, "rounds": rounds}
    data = types.SimpleNamespace(train=[np.zeros(8), np.zeros(8)], test=[np.zeros(10), np.zeros(10)])
    monkeypatch.setattr(xc, "export", lambda cfg, folder: (data, {}))
    monkeypatch.setattr(xc, "check_run", lambda *a: [])
    jobs = {}

    def start_theirs(algo, seed, setting_, opts, work, **kw):
        jobs[(algo, seed)] = {"tag": f"{algo}_s{seed}", "seconds": 1.0}
        return jobs[(algo, seed)]

    def finish_theirs(job):
        early = (2, 1, True) if job["tag"] == "pfedsd_s1" else None
        return xc.parse_records("\n".join(json.dumps(r) for r in _their_records(n_clients, rounds, early_stop=early)))

    monkeypatch.setattr(xc, "start_theirs", start_theirs)
    monkeypatch.setattr(xc, "finish_theirs", finish_theirs)
    hist = lambda r: {"round": r, "pm_acc_mean": 0.6 + 0.1 * r}
    calls = []

    def fake_run(cfg, root=None, progress=True, force=False):
        calls.append((cfg["algorithm"], cfg["seed"], cfg["checkpoint_every"]))
        if (cfg["algorithm"], cfg["seed"]) == ("pfedsd", 0):
            raise Divergence("loss became nan at local step 46 of the client at position 0 of this batch of "
                             "clients: the run diverged (lower the learning rate, or check the loss term)")
        return types.SimpleNamespace(history=[hist(r) for r in range(1, rounds + 1)],
                                     per_client=[[0.6 + 0.1 * r] * n_clients for r in range(1, rounds + 1)])

    monkeypatch.setattr(pflrepro, "run", fake_run)
    monkeypatch.setattr(xc, "partial_history", lambda cfg, root: (2, [hist(1), hist(2)], [[0.7, 0.7], [0.8, 0.8]]))
    opts = types.SimpleNamespace(setting=setting, seeds=[0, 1], algorithms=["fedavg", "pfedsd"], out=tmp_path,
                                 parallel=False, threads=torch.get_num_threads(), last=2)
    assert xc.run_comparison(opts) == 0
    assert calls == [("fedavg", 0, 1), ("pfedsd", 0, 1), ("fedavg", 1, 1), ("pfedsd", 1, 1)]   # went on

    def read(name):
        with open(tmp_path / name) as f:
            return list(csv.DictReader(f))

    per_round = read("per_round.csv")
    ours0 = [r for r in per_round if (r["algorithm"], r["seed"], r["side"]) == ("pfedsd", "0", "ours")]
    assert [(r["round"], r["diverged"]) for r in ours0] == [("1", "0"), ("2", "0"), ("3", "1")]
    assert float(ours0[1]["pm_mean"]) == pytest.approx(0.8) and math.isnan(float(ours0[2]["pm_mean"]))
    theirs1 = [r for r in per_round if (r["algorithm"], r["seed"], r["side"]) == ("pfedsd", "1", "theirs")]
    assert [(r["round"], r["diverged"], r["early_stops"]) for r in theirs1] == [("1", "0", "0"), ("2", "1", "1"),
                                                                                 ("3", "0", "0")]
    assert len(per_round) == 2 * 2 * 2 * rounds                       # every run of both sides, both seeds
    per_seed = {(r["algorithm"], r["seed"], r["metric"]): r for r in read("per_seed.csv")}
    s0 = per_seed[("pfedsd", "0", "pm_mean")]
    assert math.isnan(float(s0["ours"])) and float(s0["theirs"]) == pytest.approx(0.5)
    assert (s0["ours_diverged_round"], s0["theirs_diverged_round"]) == ("3", "")
    s1 = per_seed[("pfedsd", "1", "pm_mean")]
    assert (s1["ours_diverged_round"], s1["theirs_diverged_round"], s1["theirs_early_stops"]) == ("", "2", "1")
    assert float(s1["diff"]) == pytest.approx(0.35)                   # ours: mean of rounds 2-3 (0.8, 0.9) - 0.5
    summary = {(r["algorithm"], r["metric"]): r for r in read("summary.csv")}
    pm = summary[("pfedsd", "pm_mean")]
    assert (pm["n_seeds"], pm["n_diverged_ours"], pm["n_diverged_theirs"]) == ("1", "1", "1")
    assert float(pm["diff"]) == pytest.approx(0.35)
    fa = summary[("fedavg", "pm_mean")]
    assert (fa["n_seeds"], fa["n_diverged_ours"], fa["n_diverged_theirs"]) == ("2", "0", "0")


def test_the_grid_runs_corners_first_and_tabulates_a_point_with_a_divergence(tmp_path):
    """scripts/crosscheck/pfedsd_grid.py: every (lr, B, E) once, the corners of B and E first; a point's table row
    counts each side's divergences, pairs the seeds both finished, and names the round where the curves part."""
    import csv
    from tests.conftest import load_script
    g = load_script(REPO_ROOT / "scripts" / "crosscheck" / "pfedsd_grid.py")
    pts = g.points([0.01, 0.02], [16, 32, 64], [1, 3, 5])
    assert len(pts) == len(set(pts)) == 18
    assert {(b, e) for _, b, e in pts[:8]} == {(16, 1), (64, 1), (16, 5), (64, 5)}
    folder = tmp_path / g.tag((0.02, 16, 3))
    folder.mkdir()
    seeds = [{"algorithm": "pfedsd", "seed": s, "metric": m, "ours": o, "theirs": t, "diff": o - t,
              "ours_diverged_round": d, "theirs_diverged_round": "", "theirs_early_stops": 0,
              "theirs_nonfinite_round": ""}
             for s, (o, t, d) in enumerate([(0.90, 0.88, ""), (0.91, 0.90, ""), (0.92, 0.89, ""),
                                            (float("nan"), 0.9, 2)])
             for m in ("pm_mean", "pm_best")]
    rounds = [{"algorithm": "pfedsd", "seed": s, "round": r, "side": side, "pm_mean": v, "diverged": int(s == 3 and r == 2
                                                                                                      and side == "ours")}
              for s in range(4) for r in (1, 2) for side, v in (("ours", 0.8), ("theirs", 0.8 if r == 1 else 0.7))]
    for name, rows in (("per_seed.csv", seeds), ("per_round.csv", rounds)):
        with open(folder / name, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    (row,) = g.point_rows((0.02, 16, 3), folder)
    assert (row["seeds"], row["both"], row["diverged_ours"], row["diverged_theirs"]) == (4, 3, 1, 0)
    assert row["diff_final"] == pytest.approx(2.0)                 # (2 + 1 + 3) / 3 points, the diverged seed unpaired
    assert row["final_lo"] < 2.0 < row["final_hi"]
    assert row["part_round"] == 2                                  # a side diverged there (and 10 points apart)


def test_divergence_rates_are_compared_by_an_exact_test_stratified_by_point():
    """pfedsd_grid.stratified_exact: conditional on each point's total divergences, ours' count is hypergeometric under
    equal rates, and the points' counts add. By hand: 3 of 3 against 0 of 3 is C(3,3) C(3,0) / C(6,3) = 1/20 one-sided
    (Fisher's exact test), two such points 1/400; a point where all or none diverged changes nothing."""
    from scipy.stats import fisher_exact
    from tests.conftest import load_script
    g = load_script(REPO_ROOT / "scripts" / "crosscheck" / "pfedsd_grid.py")
    assert g.stratified_exact([(3, 3, 0, 3)]) == pytest.approx((0.05, 0.10))
    assert g.stratified_exact([(3, 3, 0, 3), (3, 3, 0, 3)]) == pytest.approx((0.0025, 0.005))
    assert g.stratified_exact([(3, 3, 0, 3), (3, 3, 3, 3), (0, 3, 0, 3)]) == pytest.approx((0.05, 0.10))
    one, two = g.stratified_exact([(5, 10, 2, 10)])
    assert one == pytest.approx(fisher_exact([[5, 5], [2, 8]], alternative="greater")[1])
    assert two == pytest.approx(fisher_exact([[5, 5], [2, 8]])[1])


def test_the_divergence_tests_power_is_its_rejection_rate_by_simulation():
    """pfedsd_grid.power: rates 1 against 0 at 3 points of 7 seeds always reject (two-sided p = 2 / 3432^3, about
    5e-11); at equal rates the exact test rejects at most about alpha (it is conservative); the estimate repeats for
    one seed and grows with the seeds a point."""
    from tests.conftest import load_script
    g = load_script(REPO_ROOT / "scripts" / "crosscheck" / "pfedsd_grid.py")
    assert g.power([(1.0, 0.0)] * 3, 7, draws=50) == 1.0
    null = g.power([(0.45, 0.45)] * 3, 7, draws=400)
    assert null <= 0.05 + 2 * (0.05 * 0.95 / 400) ** 0.5
    assert g.power([(0.6, 0.3)] * 3, 7, draws=200) == g.power([(0.6, 0.3)] * 3, 7, draws=200)
    assert g.power([(0.8, 0.2)] * 3, 10, draws=200) > g.power([(0.8, 0.2)] * 3, 3, draws=200)


def test_the_confirmatory_test_counts_only_the_named_seeds():
    """pfedsd_grid._strata: per algorithm and point, (ours diverged, runs, theirs diverged, runs) over the seeds named
    ("3-9" a range, "3,5" a list); seeds outside it, and seeds a point has not finished, are left out."""
    from tests.conftest import load_script
    g = load_script(REPO_ROOT / "scripts" / "crosscheck" / "pfedsd_grid.py")
    rows = [{"algorithm": "pfedsd", "diverged_by_seed": {0: (True, True), 1: (True, False), 3: (True, False),
                                                          4: (False, True), 9: (False, False)}},
            {"algorithm": "pfedsd", "diverged_by_seed": {2: (True, True), 5: (False, True)}},
            {"algorithm": "fedavg", "diverged_by_seed": {3: (False, False)}}]
    assert g._strata(rows, "3-9") == [("pfedsd", [(1, 3, 1, 3), (0, 1, 1, 1)]), ("fedavg", [(0, 1, 0, 1)])]
    assert g._strata(rows, "0,2") == [("pfedsd", [(1, 1, 1, 1), (1, 1, 1, 1)]), ("fedavg", [(0, 0, 0, 0)])]
    for bad in ("9-3", "a", "3-"):      # refused in one line before anything is read
        with pytest.raises(SystemExit):
            g.main(["--summarize", "--out", "/nonexistent", "--test-seeds", bad])
