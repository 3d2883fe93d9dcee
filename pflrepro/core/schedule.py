"""Who trains when, and when the server steps: synchronous rounds, FedAsync and FedBuff (SCD Table 9).

The round loop (`loop.run_rounds`) asks its schedule, once per server step t:
    dispatch(t)  -> the clients that start training now, from the current global model
    launch(...)  -> their updates (trained at once: training is a function of the model they received)
                    go in flight, each arriving at a time the simulated clock gives (pflrepro.core.clock)
    collect(t)   -> the updates the server folds in at this step, and the clock's time after it
    aggregate()  -> the new server state
`Synchronous` is FedAvg's round: the sampled clients, all collected, `Algorithm.aggregate` (so every
synchronous run is unchanged, bit for bit). The asynchronous servers keep `concurrency` clients
training at all times; a client whose update arrived is free and idle clients are sampled again:
- FedAsync (Xie, Koyejo, Gupta 2019): every arrival is a server step,
  w_t = (1 - a_t) w_{t-1} + a_t w_new, a_t = alpha * s(t - tau) with the polynomial staleness function
  s(t - tau) = (t - tau + 1)^(-a) (their "Poly"), tau the version the client trained from;
- FedBuff (Nguyen et al., AISTATS 2022): every K arrivals are one step,
  w_t = w_{t-1} + eta_g / K * sum_k s(stale_k) (w_k - w_{tau_k}), s(x) = 1 / sqrt(1 + x) (their choice).
In-flight updates are tensors and plain numbers, saved in every checkpoint (`state`/`load`).
Only the uploaded `params` entries are mixed; integer buffers take the arriving value.
"""
from __future__ import annotations


import numpy as np
import torch

from ..params import Param
from ..settings import RunSettings
from .seeds import derive_seed


SCHEDULE_SCHEMA: dict[str, Param] = {
    "mode": Param(str, "sync", "'sync' (rounds), 'fedasync' or 'fedbuff' (asynchronous server on the simulated clock)",
                  choices=("sync", "fedasync", "fedbuff")),
    "concurrency": Param(int, 0, "asynchronous: clients training at once (0 = all clients)", low=0),
    "buffer": Param(int, 10, "FedBuff: K arrivals per server step", low=1),
    "alpha": Param(float, 0.6, "FedAsync: mixing weight alpha", low=0.0, high=1.0, low_open=True),
    "staleness_a": Param(float, 0.5, "FedAsync: polynomial staleness exponent a in (1 + staleness)^-a", low=0.0),
    "server_lr": Param(float, 1.0, "FedBuff: server learning rate eta_g", low=0.0, low_open=True),
}


def trained_share(cfg) -> float:
    """The share of the clients whose training a server step takes: the sampled share of a round, or one (FedAsync)
    or K (FedBuff) arrivals of n clients (pflrepro.pipeline.parallel.work's estimate)."""
    if cfg.schedule["mode"] == "sync":    # cfg.schedule: filled and checked by RunConfig
        return cfg.participation
    return min(1.0, (1 if cfg.schedule["mode"] == "fedasync" else cfg.schedule["buffer"]) / cfg.n_clients)


class Synchronous:
    """FedAvg's rounds: the sampled clients train, the server waits for all of them."""
    asynchronous = False

    def __init__(self, cfg, n_train: np.ndarray):
        self.cfg, self.n_train = cfg, n_train
        self._round: tuple = ((), ())

    def dispatch(self, rnd: int) -> list[int]:
        return sample_clients(self.cfg, rnd, self.n_train)

    def launch(self, rnd, selected, updates, server, clock) -> None:
        self._round = (selected, updates)

    def collect(self, rnd, clock) -> tuple[list, dict]:
        selected, updates = self._round
        return updates, clock.end_round(selected, updates)

    def aggregate(self, algo, rnd, server, updates, clients) -> dict:
        return algo.aggregate(rnd, server, updates, clients)

    def state(self) -> dict:
        return {}

    def load(self, state: dict) -> None:
        pass


class Asynchronous(Synchronous):
    """FedAsync / FedBuff: clients train concurrently from whatever version they received."""
    asynchronous = True

    def __init__(self, cfg, n_train):
        super().__init__(cfg, n_train)
        self.p = cfg.schedule
        self.width = self.p["concurrency"] or cfg.n_clients - cfg.new_clients
        self.jobs: list[dict] = []     # in flight: client, arrival time, version trained from, update

    def dispatch(self, rnd):
        busy = {j["k"] for j in self.jobs}
        idle = [k for k in range(self.cfg.n_clients - self.cfg.new_clients) if k not in busy]
        n = min(self.width - len(busy), len(idle))
        rng = np.random.default_rng(derive_seed(self.cfg.seed, rnd, 0xA5C))
        return sorted(int(k) for k in rng.choice(idle, size=n, replace=False)) if n > 0 else []

    def launch(self, rnd, selected, updates, server, clock):
        for k, up in zip(selected, updates):
            self.jobs.append({"k": int(k), "arrival": clock.job(k, up), "version": rnd - 1,
                              "weight": float(up.weight), "loss": float(up.loss),
                              "payload": up.payload, "base": {n: server["params"][n] for n in up.payload}})

    def collect(self, rnd, clock):
        self.jobs.sort(key=lambda j: (j["arrival"], j["k"]))
        n = 1 if self.p["mode"] == "fedasync" else min(self.p["buffer"], len(self.jobs))
        arrived, self.jobs = self.jobs[:n], self.jobs[n:]
        return arrived, clock.server_step(max(j["arrival"] for j in arrived), len(arrived))

    def aggregate(self, algo, rnd, server, arrived, clients):
        params = dict(server["params"])
        version = rnd - 1
        if self.p["mode"] == "fedasync":
            j = arrived[0]
            a = self.p["alpha"] * (1.0 + version - j["version"]) ** (-self.p["staleness_a"])
            for n, w_new in j["payload"].items():
                params[n] = mix(params[n], w_new, a)
        else:
            scale = self.p["server_lr"] / len(arrived)
            for n in arrived[0]["payload"]:
                if not torch.is_floating_point(params[n]):
                    params[n] = arrived[-1]["payload"][n].clone()
                    continue
                step = sum((j["payload"][n].double() - j["base"][n].double()) / (1.0 + version - j["version"]) ** 0.5
                           for j in arrived)
                params[n] = (params[n].double() + scale * step).to(params[n].dtype)
        return {**server, "params": params}

    def state(self):
        return {"jobs": self.jobs}

    def load(self, state):
        self.jobs = list(state.get("jobs", []))


def mix(w: torch.Tensor, w_new: torch.Tensor, a: float) -> torch.Tensor:
    """(1 - a) w + a w_new in float64 (integer buffers: the new value)."""
    if not torch.is_floating_point(w):
        return w_new.clone()
    return ((1.0 - a) * w.double() + a * w_new.double()).to(w.dtype)


def make_schedule(cfg, n_train: np.ndarray) -> Synchronous:
    return Asynchronous(cfg, n_train) if cfg.schedule.get("mode", "sync") != "sync" else Synchronous(cfg, n_train)


# ---- who trains: client sampling

# ---------------------------------------------------------------- the round loop
def sample_clients(cfg: RunSettings, rnd: int, n_train: np.ndarray) -> list[int]:
    """The round's clients, among the K - `new_clients` that take part in training (SCD Fig. 3 holds the last
    `new_clients` out: they join after training, pflrepro.papers.newclients)."""
    K = cfg.n_clients - cfg.new_clients
    m = max(1, int(round(cfg.participation * K)))
    rng = np.random.default_rng(derive_seed(cfg.seed, rnd, 0x5A3))
    if m >= K:
        return list(range(K))
    n_train = n_train[:K]
    p = None if cfg.sampling == "uniform" else n_train / n_train.sum()
    return sorted(int(k) for k in rng.choice(K, size=m, replace=False, p=p))
