"""Run PFLlib's unmodified `system/main.py` with every client's test result printed (used by pfllib.py).

    python pfllib_driver.py <PFLlib>/system <seed> <main.py arguments...>

PFLlib prints only the sample-pooled accuracy over all clients (sum of correct / sum of test samples) and the
std across clients. To score the same definition as pflrepro (the plain mean over clients), this driver wraps
every `test_metrics*` method of PFLlib's client classes (in memory, PFLlib's files are untouched) so that each
call prints one line
    XCHECK_CLIENT {"fn": <method name>, "id": <client id>, "correct": <int>, "n": <int>, "alias": <bool|null>}
under PFLlib's own "Round number: i" header. `alias` is, for clients keeping `personalized_params` (pFedMe),
whether that list is the very parameter list of `client.model` (then the "personalized" score is the model the
server just sent). It also prints `XCHECK_INIT {"sum": ..., "sumsq": ...}` of the initial model's parameters
when the server is built, so the caller can check both sides start from the same weights. `random` and
`numpy.random` (client sampling, upload order) are seeded with <seed>; PFLlib seeds torch itself (0).
"""
import functools
import importlib
import inspect
import json
import os
import pkgutil
import random
import runpy
import sys
import threading

import numpy as np

_depth = threading.local()


def _record(name, fn):
    """`fn` wrapped to print its client's result; nested calls (a subclass calling super()) print once."""
    @functools.wraps(fn)
    def wrapped(self, *args, **kwargs):
        _depth.n = getattr(_depth, "n", 0) + 1
        try:
            out = fn(self, *args, **kwargs)
        finally:
            _depth.n -= 1
        if _depth.n == 0:
            alias = None
            if hasattr(self, "personalized_params"):
                alias = all(a is b for a, b in zip(self.personalized_params, self.model.parameters()))
            rec = {"fn": name, "id": int(self.id), "correct": int(out[0]), "n": int(out[1]), "alias": alias}
            print("XCHECK_CLIENT " + json.dumps(rec), flush=True)
        return out
    return wrapped


def patch_clients(system: str) -> None:
    """Wrap the `test_metrics*` methods each PFLlib client class defines itself."""
    from flcore.clients.clientbase import Client
    for info in pkgutil.iter_modules([os.path.join(system, "flcore", "clients")]):
        mod = importlib.import_module(f"flcore.clients.{info.name}")
        for _, cls in inspect.getmembers(mod, inspect.isclass):
            if not issubclass(cls, Client) or getattr(cls, "_xcheck", False) is cls:
                continue
            for name, fn in list(vars(cls).items()):
                if name.startswith("test_metrics") and callable(fn):
                    setattr(cls, name, _record(name, fn))
            cls._xcheck = cls


def patch_server() -> None:
    """Print a checksum of the initial model when a server is created."""
    from flcore.servers.serverbase import Server
    init = Server.__init__

    def wrapped(self, args, times):
        params = [p.detach().double() for p in args.model.parameters()]
        rec = {"sum": float(sum(p.sum() for p in params)), "sumsq": float(sum((p * p).sum() for p in params))}
        print("XCHECK_INIT " + json.dumps(rec), flush=True)
        init(self, args, times)
    Server.__init__ = wrapped


def main() -> None:
    system, seed, rest = os.path.abspath(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    sys.path.insert(0, system)
    random.seed(seed)
    np.random.seed(seed)
    patch_clients(system)
    patch_server()
    sys.argv = [os.path.join(system, "main.py"), *rest]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
