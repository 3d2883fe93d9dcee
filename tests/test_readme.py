"""README.md's commands, as written (issue 16): every shell and Python block is read from the README itself and
either run (at a smaller size where the README's own takes minutes: the substitution is named and must apply) or,
for what a test cannot afford (`make repro`, `dvc exp run`, which trains the example at mini in a git checkout),
checked for the files and params keys it names. A README command with no check here fails
`test_every_readme_command_is_checked`, so a new one cannot go untested."""
import json
import os
import re
import shlex
import subprocess
import sys

import pytest
import yaml

from pflrepro.paths import REPO_ROOT
from tests.conftest import FMNIST_AVAILABLE, RAY_ALONE

README = (REPO_ROOT / "README.md").read_text()


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, re.S)


def _commands() -> list[str]:
    """Every command line of the bash blocks: continuations joined, comments and loop keywords dropped."""
    out = []
    for block in _blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#\s.*$", "", line).strip()
            if line and line not in ("done",) and not line.startswith("for "):
                out.append(re.sub(r"\s+", " ", line))
    return out


def _kind(cmd: str) -> str | None:
    for kind, pattern in [("make", r"^make (repro|test)$"), ("cluster", r"(--executor|-p executor) ray"),
                          ("stacked", r"(--executor|-p executor) stacked"),
                          ("ray_start", r"^ray start --(head|address) "), ("pip_extra", r"^pip install -e '\.\[\w+\]'$"),
                          ("cli", r"^python -m pflrepro "), ("device_check", r"^PYTHONPATH=\. .*scripts/gpu_check\.py "),
                          ("sweep", r"^(mkdir -p results/sweeps/|papermill notebooks/example\.ipynb )"),
                          ("dvc_set", r"^dvc exp run( --queue)? -S "), ("dvc", r"^dvc (queue start|exp show)")]:
        if re.search(pattern, cmd):
            return kind
    return None


def test_every_readme_command_is_checked():
    cmds = _commands()
    assert len(cmds) >= 10, cmds
    assert not [c for c in cmds if _kind(c) is None], "README commands no test covers"
    make = re.search(r"^test:.*?\n((?:\t.*\n)+)", (REPO_ROOT / "Makefile").read_text(), re.M | re.S)
    assert make and "pytest" in make.group(1)     # `make test` is the suite; .ci/run calls exactly it
    assert (REPO_ROOT / ".ci" / "run").read_text().rstrip().endswith("make test")
    # the papermill sweep's points are run by tests/test_pipeline.py::test_example_notebook_sweep_point with these
    # very arguments
    sweep = " ".join(c for c in cmds if _kind(c) == "sweep")
    for part in ("mkdir -p results/sweeps/lr$lr", "-p profile smoke", "-p out_dir results/sweeps/lr$lr",
                 '-y "{overrides: {base: {lr: $lr}}}"'):
        assert part in sweep, part


def test_readme_device_check_command_is_one_the_script_takes(tmp_path, monkeypatch):
    """The device check as written: its options are the script's (the script itself runs in CI through
    tests/test_gpu_check.py's tiny mode; here its parser is given the README's flags and must accept them)."""
    from tests.conftest import load_script
    (cmd,) = [c for c in _commands() if _kind(c) == "device_check"]
    argv = shlex.split(cmd)
    mod = load_script(REPO_ROOT / "scripts" / "gpu_check.py")
    seen = {}
    monkeypatch.setattr(mod, "steps", lambda a, *rest: seen.update(vars(a)))
    monkeypatch.setattr(mod, "fmnist_source", lambda rep: None)
    argv = argv[argv.index("scripts/gpu_check.py") + 1:]
    assert mod.main([*argv[:argv.index("--out") + 1], str(tmp_path / "o"), *argv[argv.index("--out") + 2:],
                     "--device", "cpu"]) == 0
    assert seen["budget_s"] == 540 and seen["steps"] == {1, 2, 3} and (tmp_path / "o" / "gpu_check.md").exists()


def test_readme_dvc_experiments_set_real_params_to_new_values():
    """`dvc exp run -S file:key=value` names a key the file has, and a value other than the default it already
    has (the README's mu sweep once repeated the default 0.001 as a 'point')."""
    sets = [c for c in _commands() if _kind(c) == "dvc_set"]
    assert sets
    for cmd in sets:
        spec = shlex.split(cmd)[shlex.split(cmd).index("-S") + 1]
        path, assignment = spec.split(":", 1)
        key, value = assignment.split("=", 1)
        value = value.replace("$mu", "0.01")   # the loop's first value
        node = yaml.safe_load((REPO_ROOT / path).read_text())
        for part in key.split("."):
            assert isinstance(node, dict) and part in node, f"{cmd}: {path} has no {key}"
            node = node[part]
        assert str(node) != value, f"{cmd}: sets {key} to the value it has"
    loop = re.search(r"for mu in ([\d. ]+); do", README)
    assert loop and "0.001" not in loop.group(1).split()


@pytest.mark.skipif(not FMNIST_AVAILABLE, reason="needs offline Fashion-MNIST")
def test_readme_cli_commands_run(tmp_path, monkeypatch, capsys):
    """Each `python -m pflrepro ...` line, run as written from a scratch folder; the training example at 1 round
    instead of the README's 10 (~1.5 min). `list` runs as a subprocess, through `python -m`; the others call the
    same `main` in this process (each subprocess took about 80 s to start on a slow CI-like machine, 2026-11-27:
    22 minutes for this test)."""
    from pflrepro.__main__ import main
    monkeypatch.setenv("PFLREPRO_RESULTS", str(tmp_path / "results"))
    monkeypatch.chdir(tmp_path)
    cmds = [c for c in _commands() if _kind(c) == "cli"]
    assert "python -m pflrepro list" in cmds
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    for cmd in cmds:
        small = cmd.replace("rounds=10", "rounds=1")
        assert small != cmd or " run " not in cmd, "the README's training example no longer says rounds=10"
        argv = shlex.split(small)[3:]
        if argv == ["list"]:
            r = subprocess.run([sys.executable, "-m", "pflrepro", *argv], cwd=tmp_path, env=env, capture_output=True,
                               text=True, timeout=1800)
            code, out, err = r.returncode, r.stdout, r.stderr
        else:
            code = main(argv)
            out, err = capsys.readouterr()
        assert code == 0, f"{cmd}\n{err[-2000:]}"
        assert out.strip() or any(tmp_path.iterdir()), cmd
    assert (tmp_path / "part.png").stat().st_size > 0        # the partition command's --out


@pytest.mark.skipif(not FMNIST_AVAILABLE, reason="needs offline Fashion-MNIST")
def test_readme_python_block_runs(store):
    """The package example, at 2 rounds instead of 20; its last line reads the summary it prints."""
    (code,) = [b for b in _blocks("python") if "pflrepro.run(" in b]
    small = code.replace('"rounds": 20', '"rounds": 2')
    assert small != code, "the README's Python example no longer says rounds 20"
    scope: dict = {}
    exec(compile(small, "README.md", "exec"), scope)
    s = scope["res"].summary["pm_acc_mean"]
    assert set(s) >= {"best", "best_round", "last_mean", "final"}      # what the README's comment names
    assert 0.1 < s["best"] <= 1.0 and 0.0 < s["final"] <= s["best"]


@pytest.mark.skipif(not FMNIST_AVAILABLE, reason="needs offline Fashion-MNIST")
def test_readme_stacked_commands_run(tmp_path, monkeypatch, capsys):
    """The stacked-grid lines as written, on the smoke profile (the paper profile needs CIFAR and a GPU): the train
    command trains through executor "stacked"; the notebook takes `executor` as a parameter and resolves it."""
    from pflrepro.__main__ import main
    from pflrepro.pipeline import executors
    monkeypatch.setenv("PFLREPRO_RESULTS", str(tmp_path / "results"))
    monkeypatch.chdir(tmp_path)
    cmds = [c for c in _commands() if _kind(c) == "stacked"]
    train = [c for c in cmds if c.startswith("python -m pflrepro train ")]
    paper = [c for c in cmds if c.startswith("papermill ")]
    assert len(train) == 1 and len(paper) == 1, cmds
    assert main(shlex.split(train[0].replace("--profile paper", "--profile smoke"))[3:]) == 0
    runs = list((tmp_path / "results" / "runs").iterdir())
    assert runs and all((r / "manifest.json").exists() for r in runs)
    nb = json.loads((REPO_ROOT / shlex.split(paper[0])[1]).read_text())
    params = next(c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", []))
    assert "executor" in "".join(params["source"])
    assert isinstance(executors.resolve(shlex.split(paper[0])[-1], None, []), executors.StackedExecutor)


def test_readme_install_extras_exist():
    import tomllib
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    named = [re.search(r"\[(\w+)\]", c).group(1) for c in _commands() if _kind(c) == "pip_extra"]
    assert named and all(e in extras for e in named), named
    assert "cluster" in (REPO_ROOT / "scripts" / "setup.sh").read_text()   # setup installs what the README names


@pytest.mark.skipif(not FMNIST_AVAILABLE, reason="needs offline Fashion-MNIST")
@RAY_ALONE
@pytest.mark.full   # a Ray head on this machine: `make test-full` only, as the cluster tests of test_executors.py
def test_readme_cluster_commands_run(tmp_path):
    """The cluster section as written, on this machine: `ray start --head` (a free port, no dashboard), the train
    command through it at the smoke profile instead of paper, `ray stop`. The worker-node line is checked against
    `ray start`'s options (two nodes on one host: tests/test_executors.py); the papermill line names a notebook
    and parameters it has (notebooks render with `executor` in tests/test_notebooks.py)."""
    pytest.importorskip("ray")
    import socket
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    cmds = [c for c in _commands() if _kind(c) in ("cluster", "ray_start")]
    head = [c for c in cmds if c.startswith("ray start --head")]
    node = [c for c in cmds if c.startswith("ray start --address")]
    train = [c for c in cmds if c.startswith("python -m pflrepro train")]
    book = [c for c in cmds if c.startswith("papermill ")]
    assert len(head) == len(node) == len(train) == len(book) == 1, cmds
    nb_args = shlex.split(book[0])
    cell = "".join(next(c for c in json.loads((REPO_ROOT / nb_args[1]).read_text())["cells"]
                        if c["cell_type"] == "code")["source"])
    names = [nb_args[i + 1] for i, a in enumerate(nb_args) if a == "-p"]
    assert names and all(re.search(rf"^{n} = ", cell, re.M) for n in names), names
    help_text = subprocess.run([ray_cli, "start", "--help"], capture_output=True, text=True).stdout
    assert all(opt in help_text for opt in re.findall(r"--[\w-]+", node[0] + " " + head[0]))
    with socket.socket() as s_:
        s_.bind(("127.0.0.1", 0))
        port = s_.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}   # `ray:auto` finds the head started here
    env.update(PFLREPRO_RESULTS=str(tmp_path / "results"), PYTHONPATH=str(REPO_ROOT))
    argv = shlex.split(head[0].replace("6379", str(port))) + ["--num-cpus=2", "--include-dashboard=false",
                                                              "--disable-usage-stats"]
    subprocess.run([ray_cli, *argv[1:]], check=True, env=env, capture_output=True)
    try:
        # smoke instead of paper; this machine has no GPU to share, so no gpus= (asking for one fails up front:
        # tests/test_executors.py)
        small = re.sub(r",gpus=[\d.]+", "", train[0].replace("--profile paper", "--profile smoke"))
        assert "--profile smoke" in small and "gpus=" not in small and "--executor ray:auto" in small
        small = small.replace("results/train/", str(tmp_path / "train") + "/")
        r = subprocess.run([sys.executable, *shlex.split(small)[1:]], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=1800)
        assert r.returncode == 0, r.stderr[-3000:]
        assert "Connected to Ray cluster" in r.stderr      # Ray's own line: the runs went through the cluster
        assert "cost of" not in r.stderr                   # the cost is announced for paper profiles only
        manifest = json.loads(next((tmp_path / "train").glob("*.json")).read_text())
        runs = {d for ds in manifest["notebooks"].values() for d in ds}
        store = tmp_path / "results" / "runs"
        assert runs and all((store / d / "summary.json").exists() for d in runs)
    finally:
        subprocess.run([ray_cli, "stop", "--force"], env=env, capture_output=True)


def test_every_environment_variable_the_code_reads_is_documented():
    """docs/environment.md lists every `PFLREPRO_*` variable that the package, the scripts or the benchmarks name, and
    no variable the code no longer reads."""
    import re
    named = set()
    for folder in ("pflrepro", "scripts", "benchmarks"):
        for f in (REPO_ROOT / folder).rglob("*.py"):
            named |= set(re.findall(r"PFLREPRO_[A-Z_]+[A-Z]", f.read_text()))
    doc = set(re.findall(r"`(PFLREPRO_[A-Z_]+[A-Z])`", (REPO_ROOT / "docs" / "environment.md").read_text()))
    assert named - doc == set(), f"undocumented: {sorted(named - doc)}"
    assert doc - named == set(), f"documented but never read: {sorted(doc - named)}"
