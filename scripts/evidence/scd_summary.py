"""Summarise issue 11's evidence runs (scripts/evidence/scd_fmnist.yaml): GM and PM accuracy side by side, and
the simulated time to PM accuracy targets under compute-and-wait and wait-free.

    python scripts/evidence/scd_summary.py [RESULTS_STORE]   (default: $PFLREPRO_RESULTS/runs or results/runs)
"""
from __future__ import annotations

import sys
from pathlib import Path

from pflrepro.core.clock import time_to
from pflrepro.paths import results_root
from pflrepro.pipeline.store import is_finished, load_result


def main() -> None:
    store = Path(sys.argv[1]) if len(sys.argv) > 1 else results_root() / "runs"
    runs = [load_result(p) for p in sorted(store.iterdir()) if is_finished(p)]
    print("| run | GM best | PM best | PM last-10 | rounds |\n|---|---|---|---|---|")
    for r in runs:
        s = r.summary
        label = f"{r.config.algorithm} {r.config.clock.get('protocol', '')} {r.config.clock.get('pm_budget', '')}"
        print(f"| {label} | {100 * s['gm_acc']['best']:.2f} | {100 * s['pm_acc_weighted']['best']:.2f} | "
              f"{100 * s['pm_acc_weighted']['last_mean']:.2f} | {r.config.rounds} |")
    print("\n| run | target | time CW (s) | time WF, same training (s) | speedup | time of this run's protocol (s) |")
    print("|---|---|---|---|---|---|")
    for r in runs:
        for target in (0.6, 0.8, 0.85):
            cw, wf = (time_to(r.history, "pm_acc_weighted", target, k) for k in ("sim_time_cw", "sim_time_wf"))
            own = time_to(r.history, "pm_acc_weighted", target)
            print(f"| {r.config.algorithm} {r.config.clock.get('protocol', '')} | {target:.0%} | {cw:.1f} | {wf:.1f} | "
                  f"{cw / wf:.2f} | {own:.1f} |")


if __name__ == "__main__":
    main()
