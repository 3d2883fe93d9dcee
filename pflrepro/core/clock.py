"""A simulated clock that every run carries: the time a federation would take on given devices and links.

Spectral co-distillation's Tables 4 and 9 compare protocols by "the total runtime ... for PM to reach
the target test accuracy"; the paper gives no device or network model (its code times the wall clock
of one GPU, where communication costs nothing). So time is simulated from what a run already counts:
- compute: samples trained x 3 x the model's forward FLOPs per sample (forward + backward), at client
  k's rate `gflops_k` (GFLOP/s);
- communication: the bytes each Update says were sent, over client k's uplink / downlink (Mbit/s);
- the server: `server_s` seconds per update it folds in.
Per-client rates are drawn once per run, log-normal around the stated means with spread `sigma`
(mean-preserving: rate * exp(sigma z - sigma^2 / 2), z ~ N(0, 1)), from the run's seed.

A synchronous round (the server waits for every selected client) under the two protocols of Sec. 3.4:
    start_k  = max(T0 + down_k, ready_k)               (ready_k: client k's processor is free)
    gm_k     = start_k + compute(GM-phase samples)
    compute-and-wait: arrive_k = gm_k + compute(PM-phase samples) + up_k;  ready_k = arrive_k
    wait-free:        arrive_k = gm_k + up_k;  PM trains from gm_k on: ready_k = gm_k + compute(PM samples)
    T1 = max_k arrive_k + m * server_s          (m updates aggregated)
An Update's `overlap_samples` are its PM-phase samples (trained after the GM in both protocols; only
wait-free overlaps them with the uplink, the aggregation and the downlink). Wait-free with
`pm_budget: window` stops PM training when the next global model arrives ("continue until the global
generic model w_G^t is received", Sec. 3.5), capped at the configured PM epochs (appendix F's step
cap); the window is predicted from the same model before the round trains (`pm_steps`).

Both protocols' timelines are advanced over the same training, so every run reports `sim_time` (its
configured protocol) and `sim_time_cw` / `sim_time_wf` beside it: with `pm_budget: epochs` the training
is the same under both, and one run answers Table 4's question. State (times, `ready`) is tensors, saved in every checkpoint, so a resumed run's clock continues exactly.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import torch

from ..data.models import build_model
from ..params import Param
from .seeds import derive_seed

PROTOCOLS = ("compute_and_wait", "wait_free")

CLOCK_SCHEMA: dict[str, Param] = {
    "protocol": Param(str, "compute_and_wait", "'compute_and_wait' (PM trained before the upload) or 'wait_free' "
                      "(SCD Sec. 3.4: PM trained while the GM is uploaded, aggregated and broadcast)",
                      choices=("compute_and_wait", "wait_free")),
    "pm_budget": Param(str, "epochs", "wait-free PM training: 'epochs' (the algorithm's PM epochs, finishing late if "
                       "they outlast the wait) or 'window' (stops when the next global model arrives, at most the PM "
                       "epochs)", choices=("epochs", "window")),
    "gflops": Param(float, 5.0, "mean client compute rate for training, GFLOP/s", low=0.0, low_open=True),
    "uplink_mbps": Param(float, 5.0, "mean client uplink bandwidth, Mbit/s", low=0.0, low_open=True),
    "downlink_mbps": Param(float, 25.0, "mean client downlink bandwidth, Mbit/s", low=0.0, low_open=True),
    "sigma": Param(float, 0.5, "log-normal spread of each client's rate and bandwidths (0: identical clients; at most 5: "
                   "a 150x spread at one standard deviation)", low=0.0, high=5.0),
    "server_s": Param(float, 0.05, "server time per update folded in, seconds (a synchronous round of m clients: "
                      "m x server_s)", low=0.0),
}


def forward_flops(net: torch.nn.Module, x: torch.Tensor) -> int:
    """FLOPs of one sample's forward pass (torch's FLOP counter; eval mode, no grad)."""
    from torch.utils.flop_counter import FlopCounterMode
    was = net.training
    net.eval()
    try:
        with FlopCounterMode(display=False) as fc, torch.no_grad():
            net(x[:1])
        return int(fc.get_total_flops())
    finally:
        net.train(was)


@functools.lru_cache(maxsize=64)
def model_forward_flops(model: str, channels: int, num_classes: int, size: int) -> int:
    """`forward_flops` of a registry model on one input of its dataset's shape (cached: a pure function of
    these four values; built outside every RNG stream of a run)."""
    with torch.random.fork_rng(devices=[]):
        net = build_model(model, channels, num_classes, size)
    return forward_flops(net, torch.zeros(1, channels, size, size))


def _lognormal(rng: np.random.Generator, mean: float, sigma: float, n: int) -> np.ndarray:
    return mean * np.exp(sigma * rng.standard_normal(n) - sigma * sigma / 2)


class Clock:
    def __init__(self, params: dict, n_clients: int, seed: int, flops_per_sample: float, model_bytes: int):
        self.p = params
        rng = np.random.default_rng(derive_seed(seed, 0xC10C))
        s = params["sigma"]
        self.rate = _lognormal(rng, params["gflops"] * 1e9, s, n_clients)            # FLOP/s
        self.up = _lognormal(rng, params["uplink_mbps"] * 1e6 / 8, s, n_clients)      # bytes/s
        self.down = _lognormal(rng, params["downlink_mbps"] * 1e6 / 8, s, n_clients)  # bytes/s
        self.train_flops = 3.0 * float(flops_per_sample)   # per sample: forward + backward
        self.model_bytes = int(model_bytes)
        self.wait_free = params["protocol"] == "wait_free"
        # both protocols' timelines over the same training: `now`/`ready` are the configured one's, the
        # other is kept beside it, so one run gives compute-and-wait and wait-free times (Table 4, `epochs`)
        self.t = {p: 0.0 for p in PROTOCOLS}
        self.ready = {p: np.zeros(n_clients) for p in PROTOCOLS}
        self._window: dict[int, float] = {}

    @property
    def now(self) -> float:
        return self.t[self.p["protocol"]]

    # ---- state (checkpointed)
    def state(self) -> dict:
        return {f"{key}_{p}": (torch.tensor(self.t[p], dtype=torch.float64) if key == "now" else
                               torch.from_numpy(self.ready[p].copy()))
                for p in PROTOCOLS for key in ("now", "ready")}

    def load(self, state: dict) -> None:
        for p in PROTOCOLS:
            self.t[p] = float(state[f"now_{p}"])
            self.ready[p] = state[f"ready_{p}"].double().cpu().numpy().copy()

    # ---- times
    def compute_s(self, k: int, samples: int) -> float:
        return samples * self.train_flops / self.rate[k]

    def begin_round(self, selected: list[int], gm_samples: dict[int, int]) -> None:
        """Predict each selected client's wait-free PM window (only `pm_budget: window` uses it)."""
        self._window = {}
        if not (self.wait_free and self.p["pm_budget"] == "window"):
            return
        gm_done, arrive, ready = {}, [], self.ready["wait_free"]
        for k in selected:
            start = max(self.now + self.model_bytes / self.down[k], ready[k])
            gm_done[k] = start + self.compute_s(k, gm_samples[k])
            arrive.append(gm_done[k] + self.model_bytes / self.up[k])
        t1 = max(arrive) + self.p["server_s"] * len(arrive)
        self._window = {k: t1 + self.model_bytes / self.down[k] - gm_done[k] for k in selected}

    def pm_steps(self, k: int, batch_size: int, cap_steps: int) -> int:
        """PM steps client k trains this round: `cap_steps`, or under wait-free `window` as many as fit
        before the next global model arrives (at least one)."""
        if k not in self._window:
            return cap_steps
        fit = math.floor(self._window[k] / self.compute_s(k, batch_size) + 1e-9)   # 12 s / 10 ms is 1200
        return max(1, min(cap_steps, fit))

    def _client(self, protocol: str, t0: float, k: int, up) -> float:
        """Client k, sent the model at t0: when its upload arrives (and when its processor is free)."""
        ready, wf = self.ready[protocol], protocol == "wait_free"
        pm = int(getattr(up, "overlap_samples", 0))
        start = max(t0 + up.bytes_down / self.down[k], ready[k])
        gm_done = start + self.compute_s(k, up.samples - pm)
        pm_done = gm_done + self.compute_s(k, pm)
        arrive = (gm_done if wf else pm_done) + up.bytes_up / self.up[k]
        ready[k] = pm_done if wf else arrive
        return float(arrive)

    def times(self) -> dict:
        return {"sim_time": self.now, "sim_time_cw": self.t["compute_and_wait"], "sim_time_wf": self.t["wait_free"]}

    def end_round(self, selected: list[int], updates: list) -> dict:
        """Advance both timelines over one synchronous round from what the updates report; returns
        {"sim_time": configured protocol, "sim_time_cw": ..., "sim_time_wf": ...}."""
        for p in PROTOCOLS:
            arrive = [self._client(p, self.t[p], k, up) for k, up in zip(selected, updates)]
            self.t[p] = float(max(arrive) if arrive else self.t[p]) + self.p["server_s"] * len(arrive)
        return self.times()

    # ---- asynchronous servers (pflrepro.core.schedule): the configured protocol's timeline only
    def job(self, k: int, up) -> float:
        """Client k starts from the model the server holds now; returns its upload's arrival time."""
        return self._client(self.p["protocol"], self.now, k, up)

    def server_step(self, arrival: float, n_updates: int) -> dict:
        """The server folds in `n_updates` updates, the last of which arrived at `arrival`. An asynchronous
        run has one timeline: the other protocol's is not defined (NaN)."""
        p = self.p["protocol"]
        self.t[p] = max(self.now, float(arrival)) + self.p["server_s"] * n_updates
        for q in PROTOCOLS:
            if q != p:
                self.t[q] = float("nan")
        return self.times()


def steps_per_epochs(n: int, batch_size: int, epochs: int) -> int:
    """Mini-batch steps of `epochs` epochs over n samples (the last partial batch kept)."""
    return epochs * math.ceil(n / batch_size)


def time_to(history: list[dict], metric: str, target: float, time_key: str = "sim_time") -> float:
    """The first evaluated time at which `metric` reaches `target` (NaN if never): Tables 4 and 9."""
    for row in history:
        v = row.get(metric, float("nan"))
        if v == v and v >= target:
            return float(row[time_key])
    return float("nan")
