"""Progress a log can carry: plain, throttled lines for `dvc repro` (notebook param `progress="log"`).

tqdm bars suit a terminal or JupyterLab; inside `dvc repro` a notebook runs in a papermill kernel whose
output goes into the executed notebook, so the terminal saw "Executing notebook" and then nothing for
minutes. `GridLog` writes one line at the start, one whenever a run finishes, and one every `every`
seconds in between, to the process's own stderr (`sys.__stderr__`: in a papermill kernel, the terminal
papermill was started from; never the notebook), e.g.

    [fedbsd_fig4] 3/8 runs done (12 in the grid, 4 from the store) | training: fedrep E=5 / S=2 s0 r31/40 | 1:42 elapsed, ~2:10 left

A run in training reports its round through a heartbeat file in its run directory (`runs.HEARTBEAT`,
written at most every couple of seconds by `store.run`, removed when the run ends), so runs trained by
worker processes show their rounds too. The estimate of what is left: the work done so far (finished
runs, plus the trained fraction of the runs in flight, each weighted by `parallel.work`) at the rate
seen so far.
"""
from __future__ import annotations

import json
import sys
import threading
import time
import warnings
from pathlib import Path

HEARTBEAT = "progress.json"


def tqdm(*args, **kwargs):
    """A progress bar: tqdm's notebook widget in a notebook (ipywidgets is a dependency: without it JupyterLab shows
    the text bar as a red stderr box that grows a line per update once two bars run), its text bar elsewhere."""
    from tqdm.auto import tqdm as bar
    return bar(*args, **kwargs)


# tqdm.auto warns "IProgress not found" (a red box in every notebook) when ipywidgets is missing, then falls back
# to the text bar: import it once here, quietly, so every later `from tqdm.auto import tqdm` (engine's per-run
# bar included) gets the cached module without the warning.
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import tqdm.auto as _quiet  # noqa: E402,F401  (binds no `tqdm` here: the function above keeps its name)


def clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def read_round(path: Path) -> tuple[int, int] | None:
    """(round done, rounds) from a run directory's heartbeat; None when there is none (yet)."""
    try:
        d = json.loads((Path(path) / HEARTBEAT).read_text())
        return int(d["round"]), int(d["rounds"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


class Heartbeat:
    """Called after every round of a run (`loop.run_rounds(on_round=...)`): writes the run's round to its
    heartbeat file at most every `every` seconds (atomically); `clear()` removes it when the run ends."""

    def __init__(self, path: Path, rounds: int, every: float = 2.0, now=time.monotonic):
        self.path, self.rounds, self.every, self.now = Path(path), rounds, every, now
        self.last = -float("inf")

    def __call__(self, rnd: int) -> None:
        t = self.now()
        if t - self.last < self.every:
            return
        self.last = t
        tmp = self.path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps({"round": int(rnd), "rounds": int(self.rounds)}))
            tmp.replace(self.path)
        except OSError:   # a full disk: progress is not worth a run; the checkpoint's write says so in one line
            tmp.unlink(missing_ok=True)

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)
        self.path.with_suffix(".tmp").unlink(missing_ok=True)   # a killed writer's


class GridLog:
    """Progress lines over one grid's missing runs: `todo` maps run directory -> (label, work)."""

    def __init__(self, name: str, todo: dict, total: int, every: float = 30.0, stream=None, now=time.monotonic):
        self.name, self.todo, self.total, self.every = name, dict(todo), total, every
        self.stream = stream if stream is not None else (sys.__stderr__ or sys.stderr)
        self.now = now
        self.finished: set = set()
        self.t0 = now()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def line(self) -> str:
        with self._lock:
            finished = set(self.finished)
        work = sum(w for _, w in self.todo.values()) or 1.0
        done_work, flying = 0.0, []
        for path, (label, w) in self.todo.items():
            if path in finished:
                done_work += w
                continue
            r = read_round(path)
            if r is not None and r[0] > 0:
                done_work += w * r[0] / max(r[1], 1)
                flying.append(f"{label} r{r[0]}/{r[1]}")
        elapsed = self.now() - self.t0
        head = f"[{self.name}] {len(finished)}/{len(self.todo)} runs done ({self.total} in the grid, " \
               f"{self.total - len(self.todo)} from the store)"
        parts = [head]
        if flying:
            parts.append("training: " + ", ".join(flying[:4]) + (f" +{len(flying) - 4} more" if len(flying) > 4 else ""))
        left = elapsed * (work - done_work) / done_work if done_work > 0 else None
        parts.append(f"{clock(elapsed)} elapsed" + (f", ~{clock(left)} left" if left is not None and
                                                      len(finished) < len(self.todo) else ""))
        return " | ".join(parts)

    def emit(self) -> None:
        print(self.line(), file=self.stream, flush=True)

    def done(self, path) -> None:
        with self._lock:
            self.finished.add(Path(path))
        self.emit()

    def __enter__(self) -> "GridLog":
        self.emit()
        if self.every > 0:
            self._thread = threading.Thread(target=self._tick, daemon=True)
            self._thread.start()
        return self

    def _tick(self) -> None:
        while not self._stop.wait(self.every):
            self.emit()

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
