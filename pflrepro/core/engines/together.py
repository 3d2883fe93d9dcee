"""Runs trained together: the clients of several runs' rounds stacked into one batched call (issue 56).

The batched engine (`batched`) stacks the clients of one round of one run. A grid holds many runs that differ only in
their seed (or their data): their rounds train the same model with the same code, so their clients can share one
stacked step, which gives a GPU hundreds of clients a step instead of ten. `Stacker.run_all(jobs)` runs each job
(one run's whole `store.run`: its own store record, checkpoints, RNG streams, server state, clock and metrics) in its
own thread, one thread at a time, in a fixed order: a run works until its round's clients are ready to train
(`batched.train_plans` hands the group to `Stacker.train` instead of training it), then the next run takes its turn.
When every live run waits, the coordinator trains all their groups, merged where they can be (`Request.key`) and chunked
by the memory budget, and resumes the runs in the same order. So the interleaving is fixed (the runs' results do not
depend on thread timing), and only local training is shared: every other step of a run is its own code on its own
state, exactly as alone.

What merges (`batched.stack_key`): groups whose runs' configs are equal except in the seed and data settings
(`SEED_AND_DATA`), whose
plans have the same loss code, trainable set, epochs and learning rate, and whose tensors have the same shapes. The
loss term of the first run is called for every client: a batchable term (`training.batchable`) reads only its
arguments and the algorithm's hyperparameters, which merging requires equal. Runs that differ in anything else train
in lockstep with the others but in separate calls.

What a run gets: each client's result is `local_train_many`'s for that client with its own seed, starting state, rows
and aux. The stacked kernels' float rounding can depend on how many clients share a call (as chunking by
`memory_budget_mb` already does): a run trained together equals the same run alone bit for bit where the arithmetic
does not depend on the stack (measured: the MLP), and up to float rounding otherwise (convolutions: a vmapped
convolution of C clients is one kernel whose blocking changes with C). A run's address never depends on its
companions; its provenance records how many runs it was trained with. A merged call that fails (a run diverged, or
an error) is retried run by run, so the failure is the failing run's own and the others go on.
"""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Callable

__all__ = ["Request", "Stacker", "current", "config_signature", "SEED_AND_DATA"]

# config fields that may differ between runs whose clients share one stacked call: they choose data, not arithmetic
SEED_AND_DATA = ("seed", "seeds", "subsample", "partition_params", "split_params", "n_clients", "participation", "rounds",
                 "eval_every", "checkpoint_every", "engine", "memory_budget_mb", "eval_gm_local")

_local = threading.local()


def current():
    """The Stacker this thread's run trains with (None: the run trains alone)."""
    return getattr(_local, "stacker", None)


@dataclass
class Request:
    """One run's group of clients that train together (`batched.train_plans`), handed to the coordinator with what
    the engine provides: `key` (`batched.stack_key`: equal keys merge), `train` (items -> per item (state, stats):
    `batched.train_items`) and `chunk` ((bytes a client, budget MB, clients) -> clients a call: `batched.chunk_size`).
    This module imports nothing of the engine's: it only orders the runs and calls what a request carries."""
    ctx: object
    rnd: int
    ks: list
    plans: list
    size: int                      # the run's own chunk size (memory budget): how it trains alone
    need: int                      # one client's bytes in a chunk (batched.client_bytes)
    key: tuple
    train: Callable
    chunk: Callable
    result: list | None = None     # per client of `ks`: (state, TrainStats)
    error: BaseException | None = None


def config_signature(cfg) -> str:
    """A run's config without its seed and data settings (SEED_AND_DATA): runs with equal signatures may merge."""
    return json.dumps({n: v for n, v in cfg.to_dict().items() if n not in SEED_AND_DATA}, sort_keys=True, default=list)


class Stacker:
    """Runs in lockstep threads whose local training is stacked (module doc). `calls` records each merged call's
    (runs, clients), for tests and benchmarks."""

    def __init__(self):
        self._cv = threading.Condition()
        self._turn: int | None = None
        self._pending: dict[int, Request] = {}
        self._done: set[int] = set()
        self.runs = 0
        self.calls: list[tuple[int, int]] = []

    # ---- the coordinator (the caller's thread)
    def run_all(self, jobs: list) -> list[tuple]:
        """Run every job (a callable: one run) in lockstep; per job (result, None) or (None, exception)."""
        self.runs = len(jobs)
        out: list = [(None, None)] * len(jobs)
        threads = [threading.Thread(target=self._member, args=(i, job, out), daemon=True,
                                    name=f"pflrepro-stacked-{i}") for i, job in enumerate(jobs)]
        for t in threads:
            t.start()
        live = list(range(len(jobs)))
        while live:
            for i in list(live):
                self._resume(i)
                if i in self._done:
                    live.remove(i)
            if self._pending:
                reqs = [self._pending.pop(i) for i in sorted(self._pending)]
                self._flush(reqs)
        for t in threads:
            t.join()
        return out

    def _resume(self, i: int) -> None:
        with self._cv:
            self._turn = i
            self._cv.notify_all()
            self._cv.wait_for(lambda: self._turn is None)

    def _member(self, i: int, job, out: list) -> None:
        with self._cv:
            self._cv.wait_for(lambda: self._turn == i)
        _local.stacker, _local.index = self, i
        try:
            out[i] = (job(), None)
        except BaseException as e:   # noqa: BLE001 - handed to the caller with the run it belongs to
            out[i] = (None, e)
        finally:
            _local.stacker = None
            with self._cv:
                self._done.add(i)
                self._turn = None
                self._cv.notify_all()

    # ---- a run's thread
    def train(self, req: Request) -> list:
        """Hand `req` to the coordinator and wait for its turn to come back with the clients trained."""
        i = _local.index
        with self._cv:
            self._pending[i] = req
            self._turn = None
            self._cv.notify_all()
            self._cv.wait_for(lambda: self._turn == i)
        if req.error is not None:
            raise req.error
        return req.result

    # ---- training
    def _flush(self, reqs: list[Request]) -> None:
        groups: dict = {}
        for r in reqs:
            groups.setdefault(r.key, []).append(r)
        for rs in groups.values():
            if len(rs) > 1:
                try:
                    self._merged(rs)
                    continue
                except Exception:   # noqa: BLE001 - retried run by run: the failure is one run's own
                    pass
            for r in rs:
                try:
                    r.result = alone(r)
                except Exception as e:   # noqa: BLE001 - raised in the run's own thread
                    r.error = e

    def _merged(self, rs: list[Request]) -> None:
        items = [(r.ctx, r.rnd, k, p) for r in rs for k, p in zip(r.ks, r.plans)]
        # each run's own memory rule, the strictest of them
        size = rs[0].chunk(max(r.need for r in rs), min(r.ctx.cfg.memory_budget_mb for r in rs), len(items))
        outs = []
        for i in range(0, len(items), size):
            chunk = items[i:i + size]
            outs += rs[0].train(chunk)
            self.calls.append((len({id(c[0]) for c in chunk}), len(chunk)))
        at = 0
        for r in rs:
            r.result, at = outs[at:at + len(r.ks)], at + len(r.ks)


def alone(r: Request) -> list:
    """A request trained as its run alone trains it: its own chunks."""
    out = []
    for i in range(0, len(r.ks), r.size):
        out += r.train([(r.ctx, r.rnd, k, p) for k, p in zip(r.ks[i:i + r.size], r.plans[i:i + r.size])])
    return out
