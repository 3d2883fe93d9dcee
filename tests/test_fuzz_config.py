"""Issue 33 ("Bad input"): `python -m pflrepro run` fed generated bad and borderline configs.

Every case drives `pflrepro.cli.main(["run", "--quiet", ...])` in-process and must end in one of two ways:
- refused: exit 2, stderr exactly one line, starting "config error: " and naming the offending key, and nothing
  in the run store ($PFLREPRO_RESULTS/runs empty or absent);
- accepted: exit 0, a clean tiny run;
never a traceback, never a hang (each case within CASE_SECONDS). A case whose value the key's own `Param` refuses
must be refused; a family's baseline (its settings without the bad value) must run. The cases are generated from
the schemas (RUN_SCHEMA, every algorithm's HPARAMS, PARTITION_SCHEMAS, SPLIT_SCHEMAS, PUBLIC_SCHEMA, CLOCK_SCHEMA,
SCHEDULE_SCHEMA): wrong types, non-finite numbers, zero / negative / huge values, values just outside (and at) each
bound, misspelt keys and choices, path-traversal names; plus `--config` files and the issue's named regression
cases. Every case puts TINY (subsample=0.005 n_clients=2 rounds=1 local_epochs=1 model=mlp) before its own
settings, so a case about one of those keys overrides it, and an accepted case trains in about 0.1 s. The cases a
`Param` accepts train, so of those a few per family are drawn (ACCEPTED_PER_FAMILY, seed SEED); PFLREPRO_FUZZ_ALL=1
runs every one (3,738 cases, about a minute). Cases that still fail for a cause outside pflrepro/cli.py and
pflrepro/pipeline/ were strict xfails until their fixes (in every stored run's content address) landed with a full
repro; the last nine (head_layers = 10**12 for the four algorithms that train a body apart from the head, and a
split that leaves no client a test sample) are named regression cases now.

Borderline values that are accepted (exit 0) and what they do (fmnist, TINY; measured when this file was written):
- subsample=1e-300 (or 5e-324, the float just above 0): the stratified subsample keeps one sample per class, 10
  in all, and the 2 clients train on them. grad_clip=1e-300 clips every step to a norm of ~0 (the model hardly
  moves). participation=1e-9: one client a round (max(1, round(participation x K))).
- lr, momentum, weight_decay, server_lr and the hparams' coefficients at their open low bound (5e-324), or at 0
  where 0 is allowed: they run, and torch, computing in float32, sees 0 (1e300 and the like: refused, not
  representable in float32).
- checkpoint_every / eval_every = 10**12 or 10**30: they run; the last round is still evaluated.
- memory_budget_mb=5e-324 with engine='auto': the batched engine's memory check warns (one warning on stderr)
  and trains the clients one by one.
- batch_size=10**9, 10**12, 10**30 (engines 'auto' and 'per_client'): each client trains on all its samples in
  one batch; the cost estimate measures the rate at pflrepro.pipeline.budget.RATE_BATCH_MAX.
- head_layers=10**12 for fedavg_ft, fedprox_ft, scaffold_ft, fedper and lg_fedavg: the "head" is the whole model.
- public.dataset='' (the run's own dataset), and clock and schedule settings at their bounds.
- --config files that are empty or only comments: the defaults, with the key=value settings on top.
"""
from __future__ import annotations

import contextlib
import io
import math
import os
import random
import shutil
import signal
import sys
import time
import traceback
import warnings
from dataclasses import dataclass

import pytest
import yaml

from pflrepro import cli
from pflrepro.algorithms import ALGORITHMS
from pflrepro.core.clock import CLOCK_SCHEMA
from pflrepro.core.schedule import SCHEDULE_SCHEMA
from pflrepro.data.partition import PARTITION_SCHEMAS, SPLIT_SCHEMAS
from pflrepro.federation.config import PUBLIC_SCHEMA, RUN_SCHEMA
from pflrepro.params import MAX_EPOCHS, Param
from tests.conftest import FMNIST_AVAILABLE

pytestmark = pytest.mark.skipif(not FMNIST_AVAILABLE, reason="needs offline Fashion-MNIST")

TINY = ("subsample=0.005", "n_clients=2", "rounds=1", "local_epochs=1", "model=mlp")   # mlp: 4x faster than the CNN
CASE_SECONDS = 10.0              # a case slower than this fails (a hang, or a run far from tiny); 5 s failed
#                                  HypCluster with 100 clusters (7.0 s) in a CI run beside two background jobs
ALARM_SECONDS = 20               # a case still running after this is stopped (and fails)
SEED = 33                        # the one seed of every sampled choice below: the case list is deterministic
# of the cases a Param accepts (they train), this many are drawn per family: 16 for a whole schema (run settings, clock,
# schedule, public set), 2 for one of many (an algorithm's hparams, a partitioner's, a split's); all with FUZZ_ALL
ACCEPTED_PER_FAMILY = (16, 2)
ALL = os.environ.get("PFLREPRO_FUZZ_ALL") == "1"
NAME_KEYS = ("algorithm", "dataset", "partition", "split", "model", "models", "model_assign")
TRAVERSAL = ("../../etc/passwd", "../x", "/etc/passwd", "fmnist/../fmnist", "..", "~/x", "'fmnist\\..\\x'", "''")


@dataclass(frozen=True)
class Case:
    family: str
    key: str                 # what a refusal must name (a key's last dotted part, `--config`, ...; '' = anything)
    args: tuple              # `run` arguments after --quiet and TINY
    expect: str = "either"   # "refuse" (its Param refuses the value), "run" (a baseline), or "either"
    file: str | bytes | None = None   # a --config file's content (MISSING: no file; DIRECTORY: a folder)

    def __str__(self) -> str:
        config = () if self.file is None else (f"--config <{self.file!r:.60}>",)
        return f"[{self.family}] " + " ".join((*config, *self.args))


MISSING, DIRECTORY, EMPTY_PATH = "<missing>", "<directory>", "<empty path>"


# ---------------------------------------------------------------- values from a Param

WRONG_TYPE = {   # YAML texts of the wrong type for each Param type
    int: ("abc", "[1, 2]", "{a: 1}", "true", "1.5", "null", "'7'"),
    float: ("abc", "[1.0]", "{a: 1}", "true", "null", "0x"),
    str: ("1", "[a]", "{a: 1}", "true", "2.5", "null"),
    bool: ("maybe", "1", "0.0", "[true]", "{a: 1}", "null"),
    dict: ("3", "[1]", "abc", "null", "true"),
    tuple: ("3", "abc", "{a: 1}", "null", "true", "[]", "[abc]", "[[1]]", "[.nan]", "[{a: 1}]", "[-1.0, 2.0]",
            "[0.5, 0.5, 0.5, 0.5]"),
}
NON_FINITE = (".nan", ".inf", "-.inf", "nan", "-inf")   # the last two are strings, which a float Param converts
NUMBERS = {int: ("0", "-1", str(10**12), str(-10**12), str(10**30)),
           float: ("0.0", "-0.0", "-1.0", "1.0e+300", "-1.0e+300", "1e-300")}


def bound_values(key: str, p: Param) -> list[str]:
    """Just outside each bound of a numeric Param, and at (or, open, just inside) it, as YAML texts."""
    out = []
    if p.low is not None:
        if p.type is int:
            out += [str(int(p.low) - (0 if p.low_open else 1)), str(int(p.low) + (1 if p.low_open else 0))]
        else:
            out += [repr(p.low if p.low_open else math.nextafter(p.low, -math.inf)),
                    repr(math.nextafter(p.low, math.inf) if p.low_open else float(p.low))]
    if p.high is not None:
        out.append(str(int(p.high) + 1) if p.type is int else repr(math.nextafter(p.high, math.inf)))
        # at the high bound an epoch or step setting trains for minutes, and subsample=1 on the whole pool
        if p.high < MAX_EPOCHS and key != "subsample":
            out.append(str(int(p.high)) if p.type is int else repr(float(p.high)))
    return out


def values(key: str, p: Param) -> list[str]:
    """Every generated YAML text for one Param: wrong types, non-finite, numbers, bounds, misspelt choices."""
    vals = [v for v in WRONG_TYPE[p.type] if not (v == "null" and p.default is None)]   # null: the default
    if p.type in (int, float):
        vals += [*NON_FINITE, *NUMBERS[p.type], *bound_values(key, p)]
    if p.type is str and p.choices:
        c = str(p.choices[0])
        vals += [c + "x", c.upper(), c[:-1], f"' {c}'"]
    return list(dict.fromkeys(vals))


def misspell(key: str, schema: dict) -> list[str]:
    """Two misspellings of `key` that are no key of `schema`."""
    cands = [key[:-1], key + "s", key.upper(), key[1:] + key[0], key.replace("_", "-") + "_"]
    return [c for c in dict.fromkeys(cands) if c and c not in schema][:2]


def accepted_by_param(p: Param, text: str) -> bool:
    """Whether the Param's own check accepts this YAML text (then the case may train)."""
    v = yaml.safe_load(text)
    if v is None and p.default is None:
        return True
    try:
        p.check("k", v)
        return True
    except Exception:  # noqa: BLE001 - a ConfigError, or a comparison a wrong type cannot make
        return False


def schema_cases(family: str, prefix: str, schema: dict, base: tuple = (), extra=lambda k: ()) -> list[Case]:
    """Cases for every key of one schema, set as `prefix.key` after `base` and `extra(key)`: its values(...) and
    two misspellings, plus the family's baseline (must run). Of the cases the Param accepts, ACCEPTED_PER_FAMILY
    are drawn with SEED (all with PFLREPRO_FUZZ_ALL=1)."""
    dot = prefix + "." if prefix else ""
    refused, accepted, spelt = [], [], set()
    for k, p in schema.items():
        for v in values(k, p):
            ok = accepted_by_param(p, v)
            (accepted if ok else refused).append(
                Case(family, k, (*base, *extra(k), f"{dot}{k}={v}"), "either" if ok else "refuse"))
        refused += [Case(family, m, (*base, *extra(k), f"{dot}{m}=1"), "refuse") for m in misspell(k, schema)
                    if m not in spelt and not spelt.add(m)]
    if not ALL:
        n = ACCEPTED_PER_FAMILY["/" in family]
        accepted = random.Random(f"{SEED}/{family}").sample(accepted, min(n, len(accepted)))
    baseline = [Case(family, "", (*base, *extra("")), "run")] if schema else []
    return baseline + refused + accepted


# ---------------------------------------------------------------- the families

def _unless(*settings: str):
    """extra(k) for schema_cases: `settings` (KEY=VALUE) but the one that sets k itself (its KEY ends in .k)."""
    return lambda k: tuple(s for s in settings if not s.split("=")[0].endswith("." + k))


# settings that keep one family's accepted cases tiny, or make its baseline valid
ALGORITHM_BASE = {"feddf": ("public.size=50", "hparams.distill_steps=1"),          # default: 100 steps (3 s)
                  "perfed_ckt": ("public.size=50", "hparams.tau=1")}              # default: 50 steps (7 s)
PARTITION_BASE = {"n_by_s": ("n_clients=5",), "classes_uniform_shares": ("n_clients=5",),   # n_clients x classes
                  "lognormal": ("n_clients=10",)}                                 # per client: a multiple of 10
SPLIT_BASE = {"global_test_by_proportion": ("split_params.scale=0.1",)}           # default: the whole test set (5 s)
SCHEDULE_MODE = {"alpha": "fedasync", "staleness_a": "fedasync", "buffer": "fedbuff", "server_lr": "fedbuff",
                 "concurrency": "fedbuff"}   # the mode that reads each schedule setting


def run_cases() -> list[Case]:
    """Top-level run settings (RUN_SCHEMA)."""
    return schema_cases("run", "", RUN_SCHEMA)


def hparams_cases() -> list[Case]:
    """Every algorithm's HPARAMS (an algorithm with none: an unknown hparams key)."""
    out = []
    for name, cls in sorted(ALGORITHMS.items()):
        base = (f"algorithm={name}",)
        if cls.HPARAMS:
            out += schema_cases(f"hparams/{name}", "hparams", cls.HPARAMS, base, _unless(*ALGORITHM_BASE.get(name, ())))
        else:
            out.append(Case(f"hparams/{name}", "hparams.lr", (*base, "hparams.lr=0.1"), "refuse"))
    return out


def partition_cases() -> list[Case]:
    """Every partitioner's settings (PARTITION_SCHEMAS)."""
    out = []
    for name, schema in sorted(PARTITION_SCHEMAS.items()):
        base = (f"partition={name}", *PARTITION_BASE.get(name, ()))
        out += schema_cases(f"partition/{name}", "partition_params", schema, base)
        if not schema:
            out.append(Case(f"partition/{name}", "alpha", (*base, "partition_params.alpha=0.1"), "refuse"))
    return out


def split_cases() -> list[Case]:
    """Every split's settings (SPLIT_SCHEMAS)."""
    out = []
    for name, schema in sorted(SPLIT_SCHEMAS.items()):
        out += schema_cases(f"split/{name}", "split_params", schema, (f"split={name}",),
                            _unless(*SPLIT_BASE.get(name, ())))
        if not schema:
            out.append(Case(f"split/{name}", "scale", (f"split={name}", "split_params.scale=1.0"), "refuse"))
    return out


def clock_schedule_public_cases() -> list[Case]:
    """The simulated clock (CLOCK_SCHEMA), the server schedule (SCHEDULE_SCHEMA, each setting under the mode that
    reads it) and the public set (PUBLIC_SCHEMA, under FedDF, which distils on it)."""
    def mode(k):
        return (f"schedule.mode={SCHEDULE_MODE[k]}",) if k in SCHEDULE_MODE else ()
    return (schema_cases("clock", "clock", CLOCK_SCHEMA)
            + schema_cases("schedule", "schedule", SCHEDULE_SCHEMA, extra=mode)
            + schema_cases("public", "public", PUBLIC_SCHEMA, ("algorithm=feddf",),
                           _unless(*ALGORITHM_BASE["feddf"])))


def name_cases() -> list[Case]:
    """Registry names (dataset, model, ...; the public set's dataset, FML's shared model): path traversal and
    misspelt names."""
    out = []
    for key in NAME_KEYS:
        default = RUN_SCHEMA[key].default
        names = [*TRAVERSAL, *((default[:-1], default + "x", default.upper()) if default else ("cnn_fmnistx",))]
        out += [Case("names", key, (f"{key}={f'[{v}]' if key == 'models' else v}",), "refuse") for v in names]
    for v in TRAVERSAL[:-1]:
        out.append(Case("names", "dataset", (*ALGORITHM_BASE["feddf"], "algorithm=feddf", f"public.dataset={v}"),
                        "refuse"))
        out.append(Case("names", "shared_model", ("algorithm=fml", f"hparams.shared_model={v}"), "refuse"))
    return out


# the named regression cases: name -> (what the refusal names, arguments, expect)
NAMED = {
    "lognormal classes_per_client=10**6": ("classes_per_client", ("partition=lognormal", "n_clients=10",
                                                                  "partition_params.classes_per_client=1000000"),
                                           "refuse"),
    "ditto pm_epochs=1e9": ("pm_epochs", ("algorithm=ditto", "hparams.pm_epochs=1e9"), "refuse"),
    "ditto pm_epochs=10**9": ("pm_epochs", ("algorithm=ditto", "hparams.pm_epochs=1000000000"), "refuse"),
    "fedavg_ft ft_epochs=10**9": ("ft_epochs", ("algorithm=fedavg_ft", "hparams.ft_epochs=1000000000"), "refuse"),
    "fedrep head_epochs=10**9": ("head_epochs", ("algorithm=fedrep", "hparams.head_epochs=1000000000"), "refuse"),
    "pfedme K=10**9": ("K", ("algorithm=pfedme", "hparams.K=1000000000"), "refuse"),
    "scd pm_epochs=10**9": ("pm_epochs", ("algorithm=scd", "hparams.pm_epochs=1000000000"), "refuse"),
    "dirichlet class_prob=1e-9": ("class_prob", ("partition=dirichlet", "partition_params.class_prob=1e-9"),
                                  "refuse"),
    "n_clients=10**9": ("n_clients", ("n_clients=1000000000",), "refuse"),
    "subsample=1e-300": ("", ("subsample=1e-300",), "either"),
    "participation=1e-9": ("", ("participation=1e-9",), "either"),
    "batch_size=1e9": ("batch_size", ("batch_size=1e9",), "refuse"),     # YAML 1.1: '1e9' is a string
    "batch_size=10**9": ("", ("batch_size=1000000000",), "either"),
    "grad_clip=1e-300": ("", ("grad_clip=1e-300",), "either"),
    "rounds=1e9": ("rounds", ("rounds=1e9",), "refuse"),
    "rounds=10**9 without --yes": ("rounds", ("rounds=1000000000",), "refuse"),
    "local_epochs x rounds absurd": ("", ("rounds=100000", "local_epochs=1000", "subsample=1"), "refuse"),
    "feddf distill_batch=10**12": ("distill_batch", (*ALGORITHM_BASE["feddf"], "algorithm=feddf",
                                                     "hparams.distill_batch=1000000000000"), "refuse"),
    "dataset not on this machine": ("dataset", ("dataset=mnist",), "refuse"),
    "public.dataset not on this machine": ("public.dataset", (*ALGORITHM_BASE["feddf"], "algorithm=feddf",
                                                              "public.dataset=mnist"), "refuse"),
    "engine=batched, an algorithm that is not": ("engine", ("engine=batched", "algorithm=hypcluster"), "refuse"),
    "engine=batched, memory_budget_mb too small": ("memory_budget_mb", ("engine=batched", "memory_budget_mb=0.001"),
                                                   "refuse"),
    "engine=batched batch_size=10**12": ("batch_size", ("engine=batched", "batch_size=1000000000000"), "refuse"),
    "a key set to a value and to settings": ("lr", ("lr=0.1", "lr.x=1"), "refuse"),
    "not key=value": ("lr", ("lr",), "refuse"),
    "empty key": ("=1", ("=1",), "refuse"),
    "a value that is not YAML": ("lr", ("lr=[0.1",), "refuse"),
    **{f"{a} head_layers=10**12 (no body left)": ("head_layers", (f"algorithm={a}",
                                                                 "hparams.head_layers=1000000000000"), "refuse")
       for a in ("fedbabu", "fedbsd", "fedpac", "fedrep")},
    **{f"{a} head_layers=4 on the MLP's 4 layers": ("head_layers", (f"algorithm={a}", "hparams.head_layers=4"),
                                                    "refuse") for a in ("fedbabu", "fedbsd", "fedpac", "fedrep")},
    "fedrep head_layers=3 on the MLP's 4 layers": ("", ("algorithm=fedrep", "hparams.head_layers=3"), "run"),
    "fedper head_layers=10**12 (the head is the whole model)": ("", ("algorithm=fedper",
                                                                   "hparams.head_layers=1000000000000"), "run"),
    "global_test_by_proportion scale=0.001: no client has a test sample": (
        "split_params.scale", ("split=global_test_by_proportion", "split_params.scale=0.001"), "refuse"),
    "billion laughs on the command line": ("lr", ("lr=[&a [1,1,1,1,1,1,1,1,1,1,1], [" + ",".join(["*a"] * 1000) +
                                                  "]]",), "refuse"),
    # issue 52: tracebacks where one line was due
    "a list nested 10,000 deep on the command line": ("lr", ("lr=" + "[" * 10_000 + "]" * 10_000,), "refuse"),
    "a list nested 3,000 deep on the command line": ("lr", ("lr=" + "[" * 3_000 + "]" * 3_000,), "refuse"),
    "a key 100 levels deep": ("a.a.a", (".".join(["a"] * 100) + "=1",), "refuse"),
    "a fraction that is not a number": ("split_params.fractions", ("split_params.fractions=[a,0.2]",), "refuse"),
    "a public set larger than the data": ("public.size", ("algorithm=feddf", "public.size=1000000000"), "refuse"),
}


def named_cases() -> list[Case]:
    """The issue's regression cases (NAMED) and a few command-line shapes, each under its own name."""
    return [Case(f"named/{n}", key, args, expect) for n, (key, args, expect) in NAMED.items()]


def _laughs(levels: int = 9) -> str:
    """A YAML 'billion laughs' list under `lr`: 10**levels values once its aliases are expanded."""
    lines, prev = ["lr:", "  - &a0 [1,1,1,1,1,1,1,1,1,1]"], "a0"
    for i in range(1, levels):
        lines.append(f"  - &a{i} [{', '.join([f'*{prev}'] * 10)}]")
        prev = f"a{i}"
    return "\n".join(lines) + "\n"


CONFIG_FILES = {   # name -> (file content, what a refusal names, expect)
    "missing": (MISSING, "--config", "refuse"),
    "a directory": (DIRECTORY, "--config", "refuse"),
    "invalid YAML": ("lr: [0.1\n", "--config", "refuse"),
    "invalid YAML (tab indent)": ("hparams:\n\tmu: 1\n", "--config", "refuse"),
    "a YAML list": ("- lr\n- 0.1\n", "--config", "refuse"),
    "a YAML scalar": ("3\n", "--config", "refuse"),
    "a YAML string": ("hello\n", "--config", "refuse"),
    "empty": ("", "", "run"),
    "only comments": ("# nothing here\n", "", "run"),
    "not UTF-8": (b"\xff\xfe\x00\x01", "--config", "refuse"),
    "billion laughs": (_laughs(), "--config", "refuse"),
    "a self-referencing list": ("lr: &a [*a]\n", "--config", "refuse"),
    "an unhashable key": ("? [a]\n: 1\n", "--config", "refuse"),
    "a number as key": ("1: 2\n", "1", "refuse"),
    "a number and a name as unknown keys": ("1: 2\nfoo: 3\n", "", "refuse"),
    "a null key": ("null: 1\n", "None", "refuse"),
    # issue 52
    "nested 10,000 deep": ("lr: " + "[" * 10_000 + "]" * 10_000 + "\n", "--config", "refuse"),
    "a mapping nested 3,000 deep": ("".join(f"{'  ' * i}a:\n" for i in range(3_000)) + "  " * 3_000 + "1\n",
                                    "--config", "refuse"),
    "a duplicate key": ("lr: 0.05\nlr: 0.5\n", "--config", "refuse"),
    "a duplicate nested key": ("hparams:\n  mu: 0.1\n  mu: 0.2\n", "--config", "refuse"),
    "an empty path": (EMPTY_PATH, "--config", "refuse"),
}


def config_file_cases() -> list[Case]:
    """`--config FILE` variants, and a sample of the run settings' refused cases written as a file instead of
    key=value (the file's YAML goes through the same checks)."""
    out = [Case(f"config/{name}", key, (), expect, content) for name, (content, key, expect) in CONFIG_FILES.items()]
    tiny = {t.split("=")[0] for t in TINY}   # TINY's key=value would override the file's
    refused = [c for c in run_cases() if c.expect == "refuse" and c.args[-1].split("=")[0] not in tiny]
    for c in random.Random(f"{SEED}/config").sample(refused, 60):
        key, _, text = c.args[-1].partition("=")
        out.append(Case("config/run settings", c.key, (), "refuse", f"{key}: {text}\n"))
    return out


# ---------------------------------------------------------------- running one case

class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang("still running at the alarm")


def _on_stderr(message, category, filename, lineno, file=None, line=None):
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def run_case(case: Case, store, alarm: int = ALARM_SECONDS) -> str | None:
    """Run one case in-process; None if it ended as it must, else what went wrong (with its stderr)."""
    opts = ()
    if case.file is not None:
        path = store.parent / ("missing.yaml" if case.file == MISSING else "config.yaml")
        if case.file in (DIRECTORY, EMPTY_PATH):
            path = store.parent if case.file == DIRECTORY else ""
        elif isinstance(case.file, bytes):
            path.write_bytes(case.file)
        elif case.file not in (MISSING, EMPTY_PATH):
            path.write_text(case.file)
        opts = ("--config", str(path))
    argv = ["run", "--quiet", *opts, *TINY, *case.args]
    err, out = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(alarm)
    t = time.perf_counter()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out), warnings.catch_warnings():
            warnings.simplefilter("always")   # as `python -m pflrepro` shows them: on stderr (pytest records them)
            warnings.showwarning = _on_stderr
            rc = cli.main(argv)
    except BaseException as e:   # noqa: BLE001 - SystemExit and a hang are failures too
        rc, raised = None, traceback.format_exception_only(type(e), e)[-1].strip()[:300]
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    secs = time.perf_counter() - t
    runs = store / "runs"
    left = sorted(p.name for p in runs.iterdir()) if runs.is_dir() else []
    shutil.rmtree(runs, ignore_errors=True)     # an accepted case's run goes, so the next case starts empty
    lines = err.getvalue().splitlines()
    if rc is None:
        what = f"raised {raised}"
    elif secs > CASE_SECONDS:
        what = f"took {secs:.1f} s (> {CASE_SECONDS} s)"
    elif rc == 2:
        one = len(lines) == 1 and lines[0].startswith("config error: ")
        what = (f"refused with {len(lines)} stderr lines" if not one
                else f"refusal does not name {case.key!r}" if case.key not in lines[0]
                else f"refused but left {left} in the store" if left
                else "refused a baseline" if case.expect == "run" else None)
    elif rc == 0:
        what = "accepted a value its Param refuses" if case.expect == "refuse" else None
    else:
        what = f"exit {rc}"
    return None if what is None else f"{case} -> {what}; stderr: {err.getvalue().strip()[:400]!r}"


# ---------------------------------------------------------------- the tests

FAMILIES = {"run settings": run_cases, "algorithm hparams": hparams_cases, "partitions and splits":
            lambda: partition_cases() + split_cases(), "clock, schedule, public set": clock_schedule_public_cases,
            "registry names": name_cases, "named regressions": named_cases, "config files": config_file_cases}


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """One tiny run first, untimed: the process's first training step imports torch._dynamo (seconds)."""
    with pytest.MonkeyPatch.context() as m:
        m.setenv("PFLREPRO_RESULTS", str(tmp_path_factory.mktemp("warm")))
        assert cli.main(["run", "--quiet", *TINY]) == 0


@pytest.fixture
def store(tmp_path, monkeypatch, warm):
    """A private, empty run store for the cases of one test."""
    monkeypatch.setenv("PFLREPRO_RESULTS", str(tmp_path / "results"))
    return tmp_path / "results"


def check(cases: list[Case], store) -> None:
    """Every case ends as it must; one assertion lists every one that did not."""
    fails = [r for c in cases if (r := run_case(c, store))]
    assert not fails, f"{len(fails)} of {len(cases)} cases failed:\n" + "\n".join(fails)


def test_the_cases_are_many_and_deterministic():
    """At least 500 generated cases, the same list every time (one seed for every sample), no duplicates."""
    first = [str(c) for make in FAMILIES.values() for c in make()]
    assert first == [str(c) for make in FAMILIES.values() for c in make()]
    assert len(first) >= 500 and len(set(first)) == len(first), len(first)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_bad_and_borderline_configs_are_refused_in_one_line_or_run_cleanly(family, store):
    """Each family's cases: refused in one 'config error:' line naming the key (exit 2, nothing in the store), or a
    clean tiny run (exit 0); never a traceback or a hang; a value its Param refuses is refused, a baseline runs."""
    check(FAMILIES[family](), store)


@pytest.mark.parametrize("how", ("enospc", "erofs"))
def test_a_full_or_read_only_disk_at_every_operation_is_one_line(how, store):
    """Issue 52: a tiny run through a fault-injecting file layer (tests/faultfs.py) failing, in turn, each write,
    rename, mkdir, unlink and lock creation in the store with ENOSPC (half the bytes written) or EROFS: exit 0 (a
    heartbeat is not worth a run) or exit 1 with one 'storage error:' line, never a traceback, and no temporary file
    left behind."""
    from tests.faultfs import Layer, installed
    store.mkdir(parents=True)
    with installed(Layer(store)) as layer:
        assert cli.main(["run", "--quiet", *TINY]) == 0
    shutil.rmtree(store / "runs")
    fails = []
    for at in range(len(layer.ops)):
        err = io.StringIO()
        with installed(Layer(store, at, how)), contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                rc = cli.main(["run", "--quiet", *TINY])
            except BaseException as e:   # noqa: BLE001 - a traceback is the failure this test looks for
                rc = f"raised {type(e).__name__}: {e}"
        lines = err.getvalue().splitlines()
        tmp = [p.name for p in store.rglob("*") if p.name.endswith(".tmp")]
        if not (rc == 0 or rc == 1 and len(lines) == 1 and lines[0].startswith("storage error: ")) or tmp:
            fails.append((at, layer.ops[at], rc, lines[-3:], tmp))
        shutil.rmtree(store / "runs", ignore_errors=True)
    assert not fails, fails
