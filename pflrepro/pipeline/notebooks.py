"""Render notebooks with papermill, several at a time: each paper's `render_<paper>` DVC stage
(`python -m pflrepro render NAME...`).

Each notebook runs as `papermill notebooks/NAME.ipynb results/NAME/NAME.ipynb -p progress log` runs it (the command
each notebook's own stage ran before 2026-11-28), in its own kernel, `jobs` notebooks at once (default: the cores this
process may use). A notebook's render is one core's work: a kernel starts, imports, reads the stored runs and draws.
DVC runs stages one after another, so one stage per notebook left the second core idle for the whole render, about 7
of a default repro's 47 minutes (docs/performance.md, "Notebooks two at a time").

Order: a notebook whose params file names a `source` rendered in the same call (Table 4 renders Table 2's runs, Table
10 reads Table 11's measured costs) starts after its source; one whose params file says `alone: true` (Table 11
measures wall-clock time) renders with nothing beside it. A notebook that fails is named with its error in one line
(its partial output notebook stays, for the traceback); the others still render, those that need it do not.

A kernel may print "[IPKernelApp] ERROR | KeyboardInterrupt caught in kernel" as it ends: jupyter_client interrupts
every kernel before it shuts it down (`KernelManager._async_shutdown_kernel`), and whether the kernel logs it is a
race. It is not a failure; failures are the `FAILED` lines and the exit status.
"""
from __future__ import annotations

import os
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from multiprocessing import get_context
from pathlib import Path

import yaml

from ..params import ConfigError, did_you_mean
from ..paths import REPO_ROOT

PARAMETERS = {"progress": "log"}   # what the stages pass (`-p progress log`): one log line per run, no widgets


def _keys(name: str, root: Path) -> dict:
    return yaml.safe_load((root / "params" / f"{name}.yaml").read_text()) or {}


def plan(names: list[str], root: Path = REPO_ROOT) -> tuple[dict[str, set[str]], set[str]]:
    """(name -> the names of this call it renders after, the names that render alone). Refuses, before any work, a
    name without its notebook and params file, or named twice."""
    seen = set()
    for n in names:
        missing = [p for p in (f"notebooks/{n}.ipynb", f"params/{n}.yaml") if not (root / p).exists()]
        if missing:
            raise ConfigError(f"render {n!r}: {' and '.join(missing)} do{'es' if len(missing) == 1 else ''} not exist")
        if n in seen:
            raise ConfigError(f"render {n!r}: named twice")
        seen.add(n)
    keys = {n: _keys(n, root) for n in names}
    after = {n: {keys[n]["source"]} & seen if keys[n].get("source") else set() for n in names}
    ordered: set[str] = set()
    while len(ordered) < len(names):   # a source cycle would leave notebooks waiting for each other forever
        ready = {n for n in names if n not in ordered and after[n] <= ordered}
        if not ready:
            raise ConfigError(f"render: {', '.join(sorted(set(names) - ordered))} name each other as `source`")
        ordered |= ready
    return after, {n for n in names if keys[n].get("alone")}


def params_chain(name: str, root: Path = REPO_ROOT) -> list[str]:
    """The params files whose profiles `name` resolves, its own first, then what it inherits (`inherit:`, or `source:`
    in a file without profiles of its own), read as YAML only (a render must not import torch); a cycle or a missing
    file ends the chain (`experiments.read_params` refuses both)."""
    out: list[str] = []
    while name and name not in out and (root / "params" / f"{name}.yaml").exists():
        out.append(name)
        doc = _keys(name, root)
        name = doc.get("inherit") or (doc.get("source") if "profiles" not in doc else None)
    return out


def profiles(name: str, root: Path = REPO_ROOT) -> set[str]:
    """The profiles params/<name>.yaml defines, its own and those it inherits."""
    return set().union(*(set(_keys(n, root).get("profiles") or {}) for n in params_chain(name, root)))


def check_profile(names: list[str], profile: str | None, root: Path = REPO_ROOT) -> None:
    """Refuse, before any work, a profile one of the notebooks does not define."""
    for n in names if profile else ():
        have = profiles(n, root)
        if profile not in have:
            raise ConfigError(f"render --profile {profile}{did_you_mean(profile, have)}: params/{n}.yaml defines "
                              f"{', '.join(sorted(have))}")


def default_jobs() -> int:
    """The cores this process may use: `parallel.cpu_cores`'s rule, repeated here because a render stage must not
    import torch, which `parallel` does (tests/test_render.py, `test_a_verb_builds_only_its_own_parser`)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def execute(name: str, parameters: dict, root: str) -> tuple[float, str]:
    """One notebook through papermill (in a worker process): (seconds, '' or its error in one line)."""
    import papermill
    from papermill.exceptions import PapermillExecutionError
    t = time.perf_counter()
    out = Path(root) / "results" / name / f"{name}.ipynb"
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        papermill.execute_notebook(str(Path(root) / "notebooks" / f"{name}.ipynb"), str(out), parameters=parameters,
                                   progress_bar=False)
    except PapermillExecutionError as e:   # the cell's exception, one line; the notebook written so far has the rest
        return time.perf_counter() - t, f"{e.ename}: {' '.join(str(e.evalue).split())} (cell {e.exec_count}; the " \
                                        f"traceback is in {out.relative_to(root)})"
    except Exception as e:   # the kernel died, a file could not be written, ...
        return time.perf_counter() - t, f"{type(e).__name__}: {' '.join(str(e).split())}"
    return time.perf_counter() - t, ""


def _startable(pending: list[str], running: set[str], after: dict, alone: set[str], done: set[str]) -> str | None:
    """The first pending notebook that may start now (its sources rendered; `alone` ones with nothing beside them),
    or None. An `alone` notebook next in line holds back the ones behind it until the running ones end."""
    if running & alone:
        return None
    for n in pending:
        if not after[n] <= done:
            continue
        if n in alone:
            return None if running else n
        return n
    return None


def render(names: list[str], jobs: int | None = None, parameters: dict | None = None, root: Path = REPO_ROOT,
           say=print, run=execute, pool=None) -> dict[str, str]:
    """Render `names` (notebooks/NAME.ipynb -> results/NAME/NAME.ipynb), `jobs` at once; return name -> error of those
    that failed or were skipped (empty: all rendered). `run(name, parameters, root)` renders one, in `pool` (default:
    `jobs` spawned processes, each importing papermill once)."""
    after, alone = plan(names, root)
    jobs = max(1, min(jobs or default_jobs(), len(names)))
    parameters = {**PARAMETERS, **(parameters or {})}
    pending = sorted(names, key=lambda n: n not in alone)   # alone first: nothing to wait for at the start
    running, done, failed = {}, set(), {}
    t0, k = time.perf_counter(), 0
    with pool or ProcessPoolExecutor(jobs, mp_context=get_context("spawn")) as pool:
        while pending or running:
            for n in [n for n in pending if after[n] & set(failed)]:   # what needs a failed notebook does not run
                pending.remove(n)
                failed[n] = f"not rendered: it renders after {', '.join(sorted(after[n] & set(failed)))}, which failed"
                say(f"render: {n} {failed[n]}", flush=True)
            while len(running) < jobs and (n := _startable(pending, set(running.values()), after, alone, done)):
                pending.remove(n)
                running[pool.submit(run, n, parameters, str(root))] = n
            if not running:   # every notebook ended (or needed one that failed)
                continue
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for f in finished:
                n, k = running.pop(f), k + 1
                seconds, error = f.result()
                if error:
                    failed[n] = error
                else:
                    done.add(n)
                say(f"render: [{k}/{len(names)}] {n} {'FAILED ' + error if error else 'rendered'} in {seconds:.1f} s",
                    flush=True)
    say(f"render: {len(done)} of {len(names)} notebooks in {time.perf_counter() - t0:.1f} s, {jobs} at a time"
        + (f"; failed: {', '.join(failed)}" if failed else ""), flush=True)
    return failed


def add_arguments(p) -> None:
    p.add_argument("names", nargs="+", help="notebook names (notebooks/<name>.ipynb, params/<name>.yaml)")
    p.add_argument("--jobs", type=int, help="notebooks at once (default: the CPU cores this process may use)")
    p.add_argument("--profile", help="render on this profile (smoke, mini, paper) instead of each params file's own; "
                   "its metrics then go beside its results, and the committed metrics/<name>.json stay as they are")


def main(a) -> int:
    if a.jobs is not None and a.jobs < 1:
        raise ConfigError(f"--jobs {a.jobs}: must be >= 1")
    plan(a.names)
    check_profile(a.names, a.profile)
    return 1 if render(a.names, a.jobs, {"profile": a.profile} if a.profile else None,
                       say=lambda *x, **k: print(*x, file=sys.stderr, **k)) else 0
