"""The training engines, behind one entry: `local_round` (the round loop's call; which engine trains a run is chosen by
`engine_of`, once per run: `cfg.engine` and whether the algorithm's client step is a `Plan`).

- per client, the reference: `Algorithm.client_update`, client by client (`context.train_chain` for a Plan);
- `batched`: the selected clients' Plans grouped and trained together in chunks (`many.local_train_many`, one
  `vmap` call a step, `grouped` convolutions on a CPU; `memory` sizes the chunks), the rest one by one, side by side
  in forked processes where that pays (`forked`);
- `together`: the batched calls of several runs merged (executor "stacked").

Every engine resolves a plan's settings with `Plan.settings` and trains with the same seeds, so they agree up to float
rounding (tests/test_batched.py). The rest of the package imports only the names below, never an engine's module
(tests/test_architecture.py)."""
from __future__ import annotations

from .batched import batched_round, check_memory, slower_batched, uses_plans
from .forked import client_procs, env_cap
from .many import NotBatchable, local_train_many
from .memory import MemoryBudgetError, client_bytes
from .together import Stacker, config_signature, current

__all__ = ["local_round", "engine_of", "check_memory", "uses_plans", "slower_batched", "client_bytes",
           "NotBatchable", "MemoryBudgetError", "local_train_many", "batched_round", "client_procs", "env_cap",
           "Stacker", "config_signature", "current"]


def engine_of(ctx, algo) -> str:
    """'batched' when the run's clients train through the batched engine (`cfg.engine` is 'auto' or 'batched' and the
    algorithm's client step is a Plan: within a round, clients the engine cannot batch still train one by one),
    else 'per_client'."""
    return "batched" if ctx.cfg.engine != "per_client" and uses_plans(algo) else "per_client"


def local_round(ctx, algo, rnd: int, selected: list[int], server: dict, clients: dict) -> list:
    """The selected clients' local updates of one round, in `selected` order; new client states are stored in
    `clients`, in `selected` order, by whichever engine trains the run (`engine_of`)."""
    if engine_of(ctx, algo) == "batched":
        return batched_round(ctx, algo, rnd, selected, server, clients)
    updates = []
    for k in selected:
        up, new_state = algo.client_update(rnd, k, server, clients.get(k))
        if new_state is not None:
            clients[k] = new_state
        updates.append(up)
    return updates
