"""New clients joining after training (SCD Fig. 3, appendix B): "we first partitioned the dataset into 100 local
training sets via the Dirichlet distribution. We then performed training for the pre-determined 80 clients ...,
after which we conducted local fine-tuning on the new clients independently with a certain number of local epochs
based on the well-trained global generic model. ... The reported performance is the weighted average of the local
test accuracies over the 20 new clients, in which the weights are the ratios of the dataset sizes relative to
these 20 clients."

A run with `new_clients: N` never samples its last N clients (pflrepro.core.schedule.sample_clients); this module takes
its final checkpoint, fine-tunes the global model on each new client's training data for `epochs` epochs (the
run's optimiser settings; data order from the seed stream (seed, round 0, client, purpose 7)) and scores it on
that client's local test set. A method without a global model is fine-tuned from its averaged personal models
(Remark 4.1's GM).
"""
from __future__ import annotations

import numpy as np

from ..algorithms import ALGORITHMS
from ..core.aggregation import clone_state
from ..core.training import accuracy
from ..federation.build import build_context, resolve_device
from ..pipeline.store import load_checkpoint, _load_partition


def new_client_accuracy(result, epochs: int) -> dict:
    """{"acc": weighted mean over the new clients (n_k / sum n), "per_client": [...], "clients": [...]} for a
    stored run (`RunResult`) with `new_clients` > 0, after `epochs` epochs of fine-tuning from its final GM."""
    cfg = result.config
    if cfg.new_clients <= 0:
        raise ValueError(f"{result.path.name}: new_clients=0, no client joined after training")
    device = resolve_device(cfg.device)
    ckpt = load_checkpoint(result.path / "checkpoint.pt", cfg, device)   # bound to this run, or Damaged
    if int(ckpt["round"]) != cfg.rounds:
        raise ValueError(f"{result.path.name}: the checkpoint is at round {ckpt['round']}, not the last ({cfg.rounds})")
    ctx = build_context(cfg, device, _load_partition(result.path))
    algo = ALGORITHMS[cfg.algorithm](ctx, **cfg.hparams)
    gm = algo.global_model(ckpt["server"])
    if gm is None:
        gm = algo.averaged_personal_model(ckpt["server"], ckpt["clients"])
    if gm is None:
        raise ValueError(f"{cfg.algorithm}: no global model to fine-tune (heterogeneous personal models)")
    start = clone_state(gm.state_dict())
    ks = list(range(cfg.n_clients - cfg.new_clients, cfg.n_clients))
    accs, sizes = [], []
    for k in ks:
        net = ctx.model(k, start)
        if epochs > 0:
            ctx.train(net, k, 0, epochs=epochs, purpose=7)
        accs.append(accuracy(net, *ctx.data.client_test(k)))
        sizes.append(len(ctx.data.train[k]))
    a, w = np.array(accs), np.array(sizes, dtype=np.float64)
    ok = ~np.isnan(a)
    return {"acc": float((a[ok] * w[ok]).sum() / w[ok].sum()) if ok.any() else float("nan"),
            "per_client": accs, "clients": ks}
