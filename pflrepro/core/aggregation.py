"""State-dict arithmetic: the weighted and plain averages servers aggregate with, key selection,
copies and upload sizes."""
from __future__ import annotations

from typing import Callable

import torch


# ---------------------------------------------------------------- aggregation
def weighted_average(states: list[dict], weights, keys=None) -> dict:
    """sum_k w_k * state_k / sum_k w_k over `keys` (default: all). Integer entries
    (BN's num_batches_tracked) are not averaged: the first client's value is kept."""
    w = torch.as_tensor(weights, dtype=torch.float64)
    if len(states) != len(w) or len(states) == 0:
        raise ValueError(f"weighted_average: {len(states)} states, {len(w)} weights")
    if float(w.sum()) <= 0:
        raise ValueError("weighted_average: weights sum to zero")
    w = w / w.sum()
    keys = list(states[0]) if keys is None else list(keys)
    out = {}
    for k in keys:
        t0 = states[0][k]
        if not torch.is_floating_point(t0):
            out[k] = t0.clone()
            continue
        acc = torch.zeros_like(t0, dtype=torch.float64)
        for wi, s in zip(w, states):
            acc += wi.item() * s[k].double()
        out[k] = acc.to(t0.dtype)
    return out


def plain_average(states: list[dict], keys=None) -> dict:
    return weighted_average(states, [1.0] * len(states), keys)


def select_keys(state: dict, *, include: Callable[[str], bool] | None = None,
                exclude: Callable[[str], bool] | None = None) -> list[str]:
    """Names of a state dict kept by include/exclude predicates (e.g. backbone only, BN excluded)."""
    return [k for k in state if (include is None or include(k)) and (exclude is None or not exclude(k))]


def state_bytes(state: dict, keys=None) -> int:
    keys = state.keys() if keys is None else keys
    return int(sum(state[k].numel() * state[k].element_size() for k in keys))


def clone_state(state: dict) -> dict:
    return {k: v.detach().clone() for k, v in state.items()}
