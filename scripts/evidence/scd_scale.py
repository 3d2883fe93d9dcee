"""SCD Table 1's mini at the code's five local epochs, and with the authors' code's PM proximal term.

    python scripts/evidence/scd_scale.py [--root STORE] [--jobs N]

Issue 14 asks, before blaming scale, at which scale a paper's claims appear. SCD's mini (params/scd_table1.yaml:
Fashion-MNIST, 20 clients of 150 images, LeNet, B = 32, lr 0.05, 15 rounds, seed 0) trains one epoch a round;
the SCD code trains E_G = E_p = 5. This runs the mini grid's deciding methods at E = 1 (the mini itself: the same
run addresses, so a `dvc repro` store is reused) and at E = 5, plus SCD with the code's un-squared PM term toward
the global model (`code_prox` = the code's `beta`: 1 by default, 5 in its README), and prints the best-round GM / PM
(%) per setting. docs/evidence.md, "SCD at five local epochs", has the table it printed.
"""
from __future__ import annotations

import argparse

from pflrepro.pipeline import experiments as ex

SCD = {"lam_g": 0.05, "lam_p": 0.01, "tau": 0.4}
METHODS = {"fedavg": {}, "feddyn": {}, "ditto": {}, "fedrep": None, "scd": {"hparams": SCD},
           "scd_no_pm": {"algorithm": "scd", "hparams": {**SCD, "lam_p": 0.0}},
           "scd_prox1": {"algorithm": "scd", "hparams": {**SCD, "code_prox": 1.0}},
           "scd_prox5": {"algorithm": "scd", "hparams": {**SCD, "code_prox": 5.0}}}
VARIANTS = {"E=1 (mini)": ({}, list(METHODS)), "E=5": ({"local_epochs": 5}, [m for m in METHODS if m != "scd_prox5"])}


def grids() -> dict:
    """{variant: {(method, setting, seed): RunConfig}}: SCD Table 1's mini profile with the variant's base
    override and this study's methods (None = the profile's own entry)."""
    out = {}
    for variant, (over, names) in VARIANTS.items():
        p = ex.load_profile("scd_table1", "mini", {"base": over})
        p["methods"] = {m: (METHODS[m] if METHODS[m] is not None else p["methods"][m]) for m in names}
        p["seeds"] = [0]    # the study ran seed 0 (the mini itself runs three since 2026-11-28)
        out[variant] = ex.grid(p)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=None, help="run store (default: results/runs, shared with dvc repro)")
    ap.add_argument("--jobs", default="auto")
    a = ap.parse_args()
    cells: dict = {}
    for variant, configs in grids().items():
        for (m, setting, _), r in ex.run_grid(configs, root=a.root, progress=False, jobs=a.jobs).items():
            s = r.summary
            cells.setdefault(m, {})[f"{variant} {setting}"] = f"{100 * s['gm_acc']['best']:.1f} / {100 * s['pm_acc_weighted']['best']:.1f}"
    cols = [f"{v} {s}" for v in VARIANTS for s in ("alpha=1", "alpha=0.1")]
    print("| method | " + " | ".join(cols) + " |\n|---|" + "---:|" * len(cols))
    for m in METHODS:
        print(f"| {m} | " + " | ".join(cells.get(m, {}).get(c, "—") for c in cols) + " |")


if __name__ == "__main__":
    main()
