"""Run health: flag a run whose training went wrong without stopping it.

`runs.Divergence` stops a run whose loss is not finite. A run can also go wrong with a finite loss: at
mini's batch 16, pFedSD at the paper's lr 0.01 went from a mean training loss of 1.07 in round 1 to 15.6
in round 2, and from round 3 every client's model predicted one class (50.0 % on two-class clients), while
the table, which scores the best round, printed round 1's 84.6 % (docs/evidence.md, "pFedSD's learning
rate at B = 16"). Nothing said so until someone read the curve. These rules say so, from a run's history:

- a **loss spike**: a round's mean training loss at least SPIKE_RATIO times the lowest of the earlier
  rounds and at least SPIKE_NATS above it;
- a **collapse**: a loss spike, and the run's last evaluation COLLAPSE_POINTS or more under its best;
- a **fall**: the last evaluation FALL_POINTS or more under the best, with or without a spike (the best
  round then flatters the run: read its curve before its table cell).

A spike alone is not flagged: a method whose loss has a term that starts after round 1 (FedGen's
generator terms, weighted 10) jumps by design and then learns. Thresholds are module constants, so a
report and a notebook apply the same ones.
"""
from __future__ import annotations

import math

SPIKE_RATIO = 4.0
SPIKE_NATS = 1.0
COLLAPSE_POINTS = 10.0
FALL_POINTS = 20.0


def loss_spike(losses) -> tuple[float, int | None]:
    """(ratio, index) of the largest spike in a sequence of per-round training losses: the largest
    loss / (lowest earlier loss) among the rounds at least SPIKE_NATS above that low; (nan, None) if no
    round is. Non-finite entries are skipped (a run that had them stopped with `Divergence`)."""
    best = (math.nan, None)
    low = math.inf
    for i, v in enumerate(losses):
        v = float(v)
        if not math.isfinite(v):
            continue
        if low < math.inf and v - low >= SPIKE_NATS and low > 0:
            ratio = v / low
            if best[1] is None or ratio > best[0]:
                best = (ratio, i)
        low = min(low, v)
    return best


def warnings(spike: float, best: float, final: float) -> list[str]:
    """The flags of one run from its largest loss spike (ratio, nan for none) and its best and last
    scores in %: [] when healthy."""
    out = []
    fall = best - final if math.isfinite(best) and math.isfinite(final) else math.nan
    spiked = math.isfinite(spike) and spike >= SPIKE_RATIO
    if spiked and fall >= COLLAPSE_POINTS:
        out.append(f"collapse: training loss rose {spike:.1f}x, last evaluation {fall:.1f} points under the best")
    elif fall >= FALL_POINTS:
        out.append(f"fall: last evaluation {fall:.1f} points under the best")
    return out


def rule() -> str:
    """The rules in one sentence, for a report."""
    return (f"collapse = a round's mean training loss at least {SPIKE_RATIO:g}x the lowest earlier round's (and "
            f"{SPIKE_NATS:g} nat above it), with the last evaluation {COLLAPSE_POINTS:g}+ points under the run's "
            f"best; fall = the last evaluation {FALL_POINTS:g}+ points under the best (pflrepro/reporting/health.py)")
