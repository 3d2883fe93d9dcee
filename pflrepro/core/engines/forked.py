"""Clients trained side by side: a round's client-by-client training split over forked processes, one torch thread
each, on a CPU run that was given more than one thread.

Why. On these CPUs a client's SGD steps scale poorly with intra-op threads (pFedSD's FMNIST CNN at B = 64: 1.38x
from 1 to 2 threads), while two clients trained at once in two processes are independent work (docs/performance.md,
"Clients side by side"). The pFedSD authors' code trains each participating client in a process of its own.

How. `fork_map(fn, items, weights, procs)` computes `[fn(i) for i in items]`: with P = the run's torch threads (at
most the number of items), the items are dealt to P bins by weight (largest first, to the lightest bin); P - 1 bins are
computed by forked children, the bin holding the last item by this process, each at ONE torch thread, and the
children send their results back pickled through a pipe. The children are forked after the round's plans exist, so
whatever `fn` closes over (loss terms, teachers) is inherited, never pickled. A round too small to pay a fork
(`pays`, from `work_seconds`) trains its clients here, one after another, at one thread each: the same bits.

Bits. Every client's training is seeded by (seed, round, client, purpose) (`seeds.derive_seed`), so which process
trains it changes nothing, and one thread per client makes the result the same as a one-thread run trains it, for any
P: with `jobs` = 2 (the repro: one thread a run, no forking) and a single two-thread run the clients' states are the
same bits (tests/test_forked.py). This process computes the last item last, so the global torch RNG is left where the
one-process loop leaves it. A child's exception is raised here (its own type where it pickles: a `Divergence` stays
one). Off on a GPU, off without `os.fork` (not Linux), and off with PFLREPRO_CLIENT_PROCS=1 (a number caps P)."""
from __future__ import annotations

import contextlib
import os
import pickle
import signal
import sys
import traceback
import warnings

import torch

from ...params import ConfigError

ENV = "PFLREPRO_CLIENT_PROCS"


def env_cap() -> int | None:
    """$PFLREPRO_CLIENT_PROCS as a number (None when unset); anything else is refused in one line (store.run checks
    it before a run's folder is made)."""
    cap = os.environ.get(ENV, "").strip()
    if not cap:
        return None
    try:
        return max(1, int(cap))
    except ValueError:
        raise ConfigError(f"{ENV}={cap!r}: not a whole number of processes (1 turns forking off; "
                          "unset: the run's torch threads)") from None


def client_procs(device: torch.device, n_items: int) -> int:
    """How many processes train `n_items` clients: the torch threads (capped by $PFLREPRO_CLIENT_PROCS), 1 on a GPU,
    without `fork`, or for a single client."""
    cap = env_cap()
    if device.type != "cpu" or not sys.platform.startswith("linux") or n_items < 2:
        return 1
    procs = torch.get_num_threads() if cap is None else min(torch.get_num_threads(), cap)
    return max(1, min(procs, n_items))


# When a fork pays (measured on this 2-core VM, 2026-11-28; benchmarks/bench_forked.py): an empty `fork_map` of two
# processes costs about 29 ms (fork, a child's exit, a process holding torch), so a round forks only where the time
# it saves, half its one-thread work, is at least 4 times that. A round's one-thread work is estimated from its
# steps: about 1 ms a small CNN's step beside its FLOPs (LeNet at B = 32: 1.9 ms a step) and 1e11 FLOP/s inside
# big convolutions (pFedSD's FMNIST CNN at B = 64: 20 ms a step).
FORK_SECONDS = 0.03
STEP_SECONDS = 1e-3
RATE = 1e11


def work_seconds(steps: int, rows: int, forward_flops: float) -> float:
    """One thread's time for `steps` SGD steps of `rows` images each (forward + backward: 3 forwards), estimated."""
    return steps * (STEP_SECONDS + 3.0 * forward_flops * rows / RATE)


def pays(seconds: float, procs: int) -> bool:
    """Whether `seconds` of one-thread work over `procs` processes saves 4 forks' cost."""
    return seconds * (1 - 1 / procs) >= 4 * FORK_SECONDS


@contextlib.contextmanager
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def deal(weights: list[float], procs: int) -> list[list[int]]:
    """Item indices in `procs` bins: heaviest first, each to the lightest bin so far (ties: the lower bin); each bin
    in the items' own order. Deterministic."""
    bins: list[list[int]] = [[] for _ in range(procs)]
    load = [0.0] * procs
    for i in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
        b = min(range(procs), key=lambda j: (load[j], j))
        bins[b].append(i)
        load[b] += weights[i]
    return [sorted(b) for b in bins if b]


def _child(fn, items: list, idx: list[int], fd: int) -> None:
    """In the forked child: compute its bin at one thread, write ("ok", results) or ("err", exception, text)."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)   # the parent handles Ctrl-C: the child just dies
        torch.set_num_threads(1)
        try:
            payload = pickle.dumps(("ok", [(i, fn(items[i])) for i in idx]), protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException as e:   # noqa: BLE001 - sent to the parent, raised there
            text = traceback.format_exc()
            try:
                payload = pickle.dumps(("err", e, text))
            except Exception:   # noqa: BLE001 - an exception that does not pickle: its text
                payload = pickle.dumps(("err", None, text))
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
    finally:
        os._exit(0)


def _read(fd: int) -> bytes:
    with os.fdopen(fd, "rb") as f:
        return f.read()


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(pid, 0)


def _fork(fn, items: list, idx: list[int]) -> tuple[int, int]:
    r, w = os.pipe()
    with warnings.catch_warnings():     # Python 3.12+: fork in a multi-threaded process (torch's idle pool)
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        os.close(r)
        _child(fn, items, idx, w)
    os.close(w)
    return pid, r


def train_each(fn, items: list, work, procs: int, done, keep=None) -> None:
    """`done(i, fn(i))` for each item, in order: a round's clients trained one by one. With `procs` = 1, here at the
    caller's threads (a one-thread run: exactly the plain loop); else where the round's estimated one-thread work
    (`work(i)`, seconds) does not pay a fork (`pays`), here at one thread, `done` right after each `fn`; else over
    `procs` processes (`fork_map`), `done` once all are back. `keep(result)` must make a result outlive the next
    `fn` call (a clone of a reused module's state) where results are held: over processes, in every process (a child
    pickles its bin's results after computing them all)."""
    if procs > 1:
        weights = [work(i) for i in items]
        if pays(sum(weights), procs):
            for i, r in zip(items, fork_map(fn, items, weights, procs, keep)):
                done(i, r)
            return
    with one_thread() if procs > 1 else contextlib.nullcontext():
        for i in items:
            done(i, fn(i))


def fork_map(fn, items: list, weights: list[float], procs: int, keep=None) -> list:
    """`[keep(fn(i)) for i in items]` (`keep` default: the result as `fn` returned it), over `procs` processes (module
    doc). The results must pickle."""
    keep = keep or (lambda r: r)
    if procs <= 1 or len(items) < 2:
        return [keep(fn(i)) for i in items]
    bins = deal(weights, procs)
    last = len(items) - 1
    mine = next(b for b in bins if last in b)
    children: list[tuple[int, int]] = []
    out: list = [None] * len(items)
    before = torch.get_num_threads()
    try:
        for b in bins:
            if b is not mine:
                children.append(_fork(lambda i: keep(fn(i)), items, b))
        torch.set_num_threads(1)
        for i in mine:
            out[i] = keep(fn(items[i]))
        while children:
            pid, r = children.pop(0)
            try:
                data = _read(r)     # (closes r)
            except BaseException:
                _kill(pid)
                raise
            os.waitpid(pid, 0)
            if not data:
                raise RuntimeError(f"a client-training process (pid {pid}) died without a result")
            msg = pickle.loads(data)
            if msg[0] == "err":
                if msg[1] is not None:
                    raise msg[1]
                raise RuntimeError(f"client training failed in a forked process:\n{msg[2]}")
            for i, res in msg[1]:
                out[i] = res
    finally:
        torch.set_num_threads(before)
        for pid, r in children:     # an error here or in a child: stop the rest
            os.close(r)
            _kill(pid)
    return out
