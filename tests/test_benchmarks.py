"""benchmarks/bench_fedavg.py --quick runs end to end and writes a sane CSV."""
import csv
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "bench_fedavg.py"
COLUMNS = ["workload", "model", "rounds", "repeats", "clients", "samples_per_round", "s_per_round", "eval_s",
           "train_s_per_round", "spread", "samples_per_s", "fwd_flops_per_sample", "achieved_flops",
           "peak_flops", "ratio_to_peak", "threads"]
TEXT = {"workload", "model"}


@pytest.mark.slow
@pytest.mark.full   # a Python process of its own: 75 s on a slow CI-like machine (2026-11-27); `make bench` runs it too
def test_bench_fedavg_quick(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0 and "DatasetUnavailable" in proc.stderr:
        pytest.skip("Fashion-MNIST is not available offline (see scripts/setup.sh)")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| model |" in proc.stdout  # the markdown table is printed

    path = tmp_path / "bench_fedavg.csv"
    assert path.exists()
    assert (tmp_path / "bench_fedavg.md").exists()
    with open(path) as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == COLUMNS
        rows = list(reader)
    assert [r["model"] for r in rows] == ["cnn_cifar10", "cnn_fmnist"]
    for r in rows:
        for col in COLUMNS:
            if col in TEXT:
                continue
            v = float(r[col])
            assert math.isfinite(v) and v > 0, f"{r['model']}.{col}={r[col]}"
        assert 0 < float(r["ratio_to_peak"]) < 1.5, r
        assert float(r["spread"]) >= 1.0
        assert float(r["train_s_per_round"]) <= float(r["s_per_round"])
        # internal consistency: achieved = 3 x fwd FLOPs x samples/s, ratio = achieved / peak
        assert float(r["achieved_flops"]) == pytest.approx(
            3 * float(r["fwd_flops_per_sample"]) * float(r["samples_per_s"]), rel=1e-6)
        assert float(r["ratio_to_peak"]) == pytest.approx(float(r["achieved_flops"]) / float(r["peak_flops"]),
                                                          rel=1e-6)
    # the bigger CNN costs more FLOPs per sample than the LeNet
    assert float(rows[1]["fwd_flops_per_sample"]) > float(rows[0]["fwd_flops_per_sample"])


ENGINES_SCRIPT = REPO / "benchmarks" / "bench_engines.py"
ENGINES_COLUMNS = ["workload", "engine", "device", "dataset", "model", "clients", "clients_per_round", "batch_size",
                   "local_epochs", "rounds", "samples_per_round", "s_per_round", "spread", "client_updates_per_s",
                   "samples_per_s", "fwd_flops_per_sample", "achieved_flops", "peak_flops", "ratio_to_peak",
                   "peak_mem_mb", "peak_rss_mb", "train_loss", "loss_vs_per_client", "speedup_vs_conventional",
                   "speedup_vs_per_client", "other_cpu", "threads"]
ENGINES_TEXT = {"workload", "engine", "device", "dataset", "model"}
ENGINES_MAY_BE_ZERO = {"peak_mem_mb", "other_cpu"}  # an engine can stay within the RSS of setup; an idle machine


@pytest.mark.slow
@pytest.mark.full   # 925 s on a slow CI-like machine (2026-11-27); batched = per_client is tests/test_batched.py's
def test_bench_engines_quick(tmp_path):
    proc = subprocess.run([sys.executable, str(ENGINES_SCRIPT), "--quick", "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0 and "DatasetUnavailable" in proc.stderr + proc.stdout:
        pytest.skip("Fashion-MNIST is not available offline (see scripts/setup.sh)")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "| workload | engine |" in proc.stdout  # the markdown table is printed
    assert "Loss check" in proc.stdout
    for name in ("bench_engines.csv", "bench_engines.md", "bench_engines.png"):
        assert (tmp_path / name).stat().st_size > 0, name

    with open(tmp_path / "bench_engines.csv") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == ENGINES_COLUMNS
        rows = list(reader)
    by = {}
    for r in rows:
        by.setdefault(r["workload"], []).append(r["engine"])
    assert by == {w: ["conventional", "per_client", "batched"]
                  for w in ("a_mini", "b_paper_b10", "b_paper_b64", "c_mlp_b10")}
    for r in rows:
        what = f"{r['workload']}/{r['engine']}"
        for col in ENGINES_COLUMNS:
            if col in ENGINES_TEXT:
                continue
            v = float(r[col])
            assert math.isfinite(v) and (v >= 0 if col in ENGINES_MAY_BE_ZERO else v > 0), f"{what}.{col}={r[col]}"
        assert 0 < float(r["ratio_to_peak"]) < 1.5, r
        assert float(r["spread"]) >= 1.0
        # internal consistency of the derived columns
        s = float(r["s_per_round"])
        assert float(r["client_updates_per_s"]) == pytest.approx(float(r["clients_per_round"]) / s, rel=1e-6)
        assert float(r["achieved_flops"]) == pytest.approx(
            3 * float(r["fwd_flops_per_sample"]) * float(r["samples_per_round"]) / s, rel=1e-6)
        assert float(r["ratio_to_peak"]) == pytest.approx(float(r["achieved_flops"]) / float(r["peak_flops"]),
                                                          rel=1e-6)
    for w in by:
        ws = {r["engine"]: r for r in rows if r["workload"] == w}
        conv, pc, bt = ws["conventional"], ws["per_client"], ws["batched"]
        # the same workload: the same clients and samples per round, the same model
        for col in ("clients_per_round", "samples_per_round", "fwd_flops_per_sample", "peak_flops"):
            assert conv[col] == pc[col] == bt[col], (w, col)
        # speedups are ratios of the same run's seconds per round
        assert float(conv["speedup_vs_conventional"]) == pytest.approx(1.0)
        assert float(pc["speedup_vs_per_client"]) == pytest.approx(1.0)
        assert float(bt["speedup_vs_conventional"]) == pytest.approx(
            float(conv["s_per_round"]) / float(bt["s_per_round"]), rel=1e-6)
        # an honest comparison: the two pflrepro engines train identical batches (equal up to float
        # rounding); the conventional loop's DataLoader draws another seeded order, so only close
        assert float(bt["loss_vs_per_client"]) == pytest.approx(1.0, abs=1e-3), w
        assert float(conv["loss_vs_per_client"]) == pytest.approx(1.0, abs=0.1), w


JOBS_SCRIPT = REPO / "benchmarks" / "bench_jobs.py"
JOBS_COLUMNS = ["notebook", "profile", "mode", "jobs", "threads_per_run", "runs", "seconds", "runs_per_min",
                "speedup", "same_metrics"]


@pytest.mark.slow
@pytest.mark.full   # 478 s there; side-by-side runs giving the same bits is tests/test_parallel.py's
def test_bench_jobs_quick(tmp_path):
    from pflrepro.pipeline import parallel
    if parallel.resolve_jobs("auto", []) < 2:
        pytest.skip("one core: no side-by-side runs to compare")
    proc = subprocess.run([sys.executable, str(JOBS_SCRIPT), "--quick", "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0 and "DatasetUnavailable" in proc.stderr + proc.stdout:
        pytest.skip("Fashion-MNIST is not available offline (see scripts/setup.sh)")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]  # rc 1: side_by_side changed a metric
    assert "metrics equal the same-threads reference: True" in proc.stdout
    with open(tmp_path / "bench_jobs.csv") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == JOBS_COLUMNS
        rows = list(reader)
    assert [r["mode"] for r in rows] == ["one_after_another", "one_after_another_same_threads", "side_by_side"]
    assert rows[2]["same_metrics"] == "True" and int(rows[2]["jobs"]) >= 2
    for r in rows:
        assert int(r["runs"]) == 3 and float(r["seconds"]) > 0 and float(r["speedup"]) > 0, r
    assert float(rows[0]["speedup"]) == 1.0


def test_bench_spectrum_quick(tmp_path):
    """The spectral-term benchmark runs in-process on LeNet's length: both paths give the same spectrum and
    every timing and ratio is a positive finite number (the speed itself is the benchmark's to report)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import bench_spectrum
    finally:
        sys.path.pop(0)
    import torch
    threads = torch.get_num_threads()
    (row,) = bench_spectrum.main(["--quick", "--repeats", "1", "--out", str(tmp_path)])
    assert torch.get_num_threads() == threads     # in-process: the thread count it set is given back
    assert row["length"] == 44190 and row["largest_prime"] == 491
    assert row["max_rel_diff"] < 1e-5
    for k in ("rfft_ms", "pflrepro_ms", "ratio", "rfft_vmap20_ms", "pflrepro_vmap20_ms", "vmap_ratio"):
        assert math.isfinite(row[k]) and row[k] > 0, k
    assert (tmp_path / "bench_spectrum.csv").read_text().startswith("workload,")


def _bench(name: str):
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        return __import__(name)
    finally:
        sys.path.pop(0)


def test_bench_layout_quick(tmp_path):
    """The layout benchmark runs in-process: a step and a scoring row for LeNet, positive finite timings and
    ratios, and the two layouts' predictions compared (the speed itself is the benchmark's to report)."""
    import torch
    threads = torch.get_num_threads()
    rows = _bench("bench_layout").main(["--quick", "--repeats", "1", "--out", str(tmp_path)])
    assert torch.get_num_threads() == threads
    assert [(r["kind"], r["batch"]) for r in rows] == [("step", 16), ("score", 200)]
    for r in rows:
        for k in ("nchw_ms", "cl_ms", "ratio"):
            assert math.isfinite(r[k]) and r[k] > 0, (r, k)
    assert isinstance(rows[1]["same_predictions"], bool)
    assert (tmp_path / "bench_layout.csv").read_text().startswith("model,")


def test_bench_head_quick(tmp_path):
    """The head-only benchmark runs in-process: per-client and batched rows for LeNet, positive finite timings,
    and the two paths' heads within float rounding of each other (the speed is the benchmark's to report)."""
    import torch
    threads = torch.get_num_threads()
    rows = _bench("bench_head").main(["--quick", "--repeats", "1", "--out", str(tmp_path)])
    assert torch.get_num_threads() == threads
    assert [(r["path"], r["clients"]) for r in rows] == [("per_client", 1), ("batched", 4)]
    for r in rows:
        assert r["steps"] == 20
        for k in ("full_ms", "features_ms", "ratio"):
            assert math.isfinite(r[k]) and r[k] > 0, (r, k)
        assert float(r["max_abs_diff"]) < 1e-5, r
    assert (tmp_path / "bench_head.csv").read_text().startswith("model,")


def test_bench_engine_choice_quick(tmp_path):
    """The engine benchmark trains one 2-round mini run with each engine and says what `auto` picks for it."""
    rows = _bench("bench_engine_choice").main(["--quick", "--out", str(tmp_path)])
    assert len(rows) == 1
    r = rows[0]
    assert (r["batch"], r["auto_picks"]) == (10, "batched")
    for k in ("batched_s", "per_client_s", "per_client_speedup"):
        assert math.isfinite(r[k]) and r[k] > 0, (r, k)
    assert 0 <= r["batched_pm"] <= 100 and 0 <= r["per_client_pm"] <= 100
    assert (tmp_path / "bench_engine_choice.csv").read_text().startswith("run,")


def test_bench_grouped_quick(tmp_path):
    """The grouped-kernel benchmark runs in-process: a row per size, positive finite timings, `pays` as the rule
    says, and the grouped gradients within float32 rounding of float64 ones (the speed is the benchmark's to report)."""
    from pflrepro.core.engines import grouped
    rows = _bench("bench_grouped").main(["--quick", "--repeats", "1", "--out", str(tmp_path)])
    assert [(r["clients"], r["batch"]) for r in rows] == [(4, 10), (20, 16)]
    for r in rows:
        for k in ("vmap_ms", "grouped_ms", "ratio"):
            assert math.isfinite(r[k]) and r[k] > 0, (r, k)
        assert r["pays"] == (r["rows"] >= grouped.GROUPED_MIN_ROWS and r["clients"] >= grouped.GROUPED_MIN_CLIENTS)
        assert float(r["grouped_err"]) < 1e-5 and float(r["vmap_err"]) >= 0, r
    assert (tmp_path / "bench_grouped.csv").read_text().startswith("model,")


def test_bench_render_quick(tmp_path):
    """The render benchmark renders two notebooks that train nothing both ways (one stage each, then `pflrepro
    render` two at a time) in a worktree of HEAD, leaves no worktree behind, and writes both sides' wall times and
    their ratio (the speed itself is the benchmark's to report)."""
    before = subprocess.run(["git", "worktree", "list"], cwd=REPO, capture_output=True, text=True).stdout
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_render.py"), "--quick", "--out",
                           str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = list(csv.DictReader(open(tmp_path / "bench_render.csv")))
    assert [r["side"] for r in rows] == ["per_notebook", "render"] and all(r["notebooks"] == "2" for r in rows)
    assert all(float(r["wall_s"]) > 0 for r in rows) and float(rows[1]["ratio_per_notebook_over_render"]) > 0
    assert subprocess.run(["git", "worktree", "list"], cwd=REPO, capture_output=True, text=True).stdout == before


def test_bench_forked_quick(tmp_path):
    """The clients-side-by-side benchmark runs in-process at two threads: a train row (two forked clients, the same
    bits as a one-thread loop) and a score row (the same logits at 2,048 and EVAL_ROWS rows), positive finite
    timings; the caller's thread count given back."""
    import torch
    threads = torch.get_num_threads()
    rows = _bench("bench_forked").main(["--quick", "--repeats", "1", "--threads", "2", "--out", str(tmp_path)])
    assert torch.get_num_threads() == threads
    assert [r["kind"] for r in rows] == ["train", "score"]
    assert rows[0]["forks"] is True                     # two FMNIST-CNN clients of 5 steps: ~0.3 s, a fork pays
    for r in rows:
        assert r["same_bits"] is True, r
        for k in ("before_s", "after_s", "ratio"):
            assert math.isfinite(r[k]) and r[k] > 0, (r, k)
    assert (tmp_path / "bench_forked.csv").read_text().startswith("kind,")


def test_bench_floor_quick(tmp_path):
    """The floor benchmark runs in-process: one 2-round DC-PFL run, its matmul and convolution kernels a positive part
    of it (they cannot exceed the profiled run), `max_ratio` from the given baseline wall, and the dense layers'
    products beside the matmul peak; a malformed --baseline-wall is refused."""
    import pytest
    bench = _bench("bench_floor")
    rows, layers = bench.main(["--quick", "--repeats", "1", "--baseline-wall", "dcpfl=10", "--out", str(tmp_path)])
    (r,) = rows
    assert 0 < r["matmul_s"] and 0 < r["conv_s"] and r["floor_s"] <= r["profiled_s"], r
    assert abs(r["max_ratio"] - 10 / r["floor_s"]) < 0.02 * r["max_ratio"]      # both rounded to 2 digits
    assert [x["layer"].split(" ")[0] for x in layers] == ["cnn1.body.fc1", "cnn1.body.fc2"]
    assert all(x["batch"] == 16 and 0 < x["forward_gflops"] and 0 < x["peak_gflops"] for x in layers)
    assert (tmp_path / "bench_floor.csv").read_text().startswith("run,")
    with pytest.raises(SystemExit):
        bench.main(["--quick", "--baseline-wall", "dcpfl", "--out", str(tmp_path)])


@pytest.mark.full   # the rates themselves are tests/test_calibration.py's, in every `make test`; this is the script's CLI
def test_bench_calibration_quick(tmp_path):
    """The calibration benchmark's quick mode: four shapes through claims.judge, every checked rate within its bound
    (exit 0), the CSV and the summary the docs take written."""
    assert _bench("bench_calibration").main(["--quick", "--out", str(tmp_path)]) == 0
    rows = (tmp_path / "calibration.csv").read_text().splitlines()
    assert rows[0].startswith("form,quantifier,seeds,cells,rivals,noise,variant") and len(rows) > 10
    assert "outside ALPHA + 3 Monte Carlo SE" in (tmp_path / "calibration_summary.md").read_text()
