"""pflrepro: a faithful, fast reproduction of five personalized federated learning papers.

Entry points: `pflrepro.run(config)` (one run, content-addressed and resumable),
`python -m pflrepro` (CLI), and the notebooks under notebooks/.
"""
import os as _os
import sys as _sys

from .version import __version__  # noqa: F401  (pflrepro.__version__)

# OpenMP's idle threads sleep instead of spinning at the end of every parallel region. Alone it costs nothing
# (1.01x); beside one other busy process on 2 cores it cuts a 2-thread run's slowdown from 2.53x to 1.68x, with
# the same metrics (benchmarks/bench_contention.py, docs/performance.md). libgomp reads it once, when torch loads
# it: this takes effect where pflrepro is imported before torch (the CLI, the notebooks, the run workers). A value
# the user set is kept.
# torch imported first, without the setting: too late for it (measured: a round 165 s instead of 46 s beside another
# busy process); `pipeline.store.run` says so once, when a run would use more than one thread.
TORCH_FIRST = "torch" in _sys.modules and "OMP_WAIT_POLICY" not in _os.environ
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def run(cfg, **kw):
    """Run one config (dict or RunConfig); see pflrepro.pipeline.store.run."""
    from .pipeline.store import run as _run   # lazy: `import pflrepro` sets OMP_WAIT_POLICY before torch loads
    return _run(cfg, **kw)
