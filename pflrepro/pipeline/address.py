"""A run's content address: its validated config and the source files that can change its numbers (`result_code`:
the layers that decide results whole, of algorithms/ the files the run's algorithm executes)."""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

from ..algorithms import ALGORITHMS
from ..federation.config import RunConfig
from ..paths import results_root


PACKAGE = Path(__file__).resolve().parents[1]
# What can change a run's numbers, by layer (docs/architecture.md): the settings vocabulary, the registries
# (datasets, partitions, models), the engine and the federation builder, whole; of algorithms/, the files the
# run's algorithm executes. pipeline/ (this store, executors, progress), reporting/, papers/ and the CLI are not
# in a run's address: they run configs and read results, and never change them.
RESULT_CODE = ("params.py", "settings.py", "data", "core", "federation")


def _algorithm_files(algorithm: str | None) -> list[Path]:
    """The algorithm package files a run of `algorithm` executes: the modules defining its class
    and its bases, plus the package modules those import (e.g. shared statistics helpers).
    Adding or editing another algorithm does not invalidate this one's stored results."""
    folder = PACKAGE / "algorithms"
    if algorithm is None or algorithm not in ALGORITHMS:
        return sorted(folder.glob("*.py"))
    todo = [Path(c.__module__.replace(".", "/") + ".py").name for c in ALGORITHMS[algorithm].__mro__
            if c.__module__.startswith("pflrepro.algorithms.")]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or not (folder / name).exists():
            continue
        seen.add(name)
        todo += [m + ".py" for m in re.findall(r"^from \.(\w+) import", (folder / name).read_text(), re.M)]
    return sorted(folder / n for n in seen)


def result_code(algorithm: str | None = None) -> list[Path]:
    """The source files in a run's content address (see RESULT_CODE), in hashing order."""
    files = []
    for part in RESULT_CODE:
        p = PACKAGE / part
        files += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    return files + _algorithm_files(algorithm)


def code_fingerprint(algorithm: str | None = None) -> str:
    """sha256 of the source files that can change a run's numbers (`result_code`). Part of the content
    address, so a stored result is never reused across a change of the code it ran."""
    h = hashlib.sha256()
    for f in result_code(algorithm):
        h.update(f.relative_to(PACKAGE).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def result_key(cfg: RunConfig) -> str:
    return hashlib.sha256((cfg.key() + code_fingerprint(cfg.algorithm)).encode()).hexdigest()


def run_dir(cfg: RunConfig, root: Path | str | None = None) -> Path:
    """Where a config's result lives: <root>/<algorithm>-<dataset>-<sha12>, the hash covering
    the full validated config and the result-affecting code (root defaults to
    $PFLREPRO_RESULTS/runs, i.e. results/runs)."""
    base = Path(root) if root is not None else results_root() / "runs"
    return base / f"{cfg.algorithm}-{cfg.dataset}-{result_key(cfg)[:12]}"
