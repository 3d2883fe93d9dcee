"""SCD's gradient scale: the spectral terms' gradients next to cross-entropy's, and their effect on predictions.

    .venv/bin/python scripts/evidence/scd_gradient_scale.py [--steps 60] [--resnet-steps 5] [--client 0]

Why: issue 30, item 2. The README and docs quote "1.8e-4 of the cross-entropy gradient" for both of SCD's
spectral terms with no committed measurement; this script is that measurement. It prints three markdown tables.

1. lambda * |grad D| / |grad CE| (L2 norms over all trainable parameters) for eq. 4 (PM step: full spectrum,
   target = the global model's spectrum, detached) and eq. 5 (GM step: truncated spectrum, tau = 0.4, target =
   the PM's truncated spectrum, detached), separately, for the project's default spectrum (`dft1d`: the paper's
   1-D DFT of the concatenated weights) and the authors' code's (`fft2d_layer`: a 2-D FFT per layer, conv
   weights as (out, in*k*k)), at the paper's lambdas (lambda_p 0.01, lambda_G 0.05) and the code's (0.4, 0.3).
   A "pair" is two models a round apart: A (the global model) and B = A + local CE training on the client.
   Eq. 4's student is B (the PM) with target s(A); eq. 5's student is A (the GM) with target s_hat(B); grad CE
   is taken at the same student on one fixed random mini-batch of the client. Two architectures:
   - the `mini` profile's model (params/scd_table1.yaml: `cnn_cifar10`, LeNet-size) on Fashion-MNIST, client
     `--client` of the alpha = 0.1 setting, from the run's own initial weights (seed 0); B is A + 1 local epoch
     (the mini's E_G) or + 5 (the code's E); A is the initial model or a "warm" one (one CE epoch over the mini's
     3,000-image pool);
   - ResNet-18 (`resnet18`, the paper's CIFAR-10 model) on the `fake-cifar10` stand-in (3x32x32, 10 classes,
     500 images: one client's share of CIFAR-10 at N = 100), the paper's B = 10, lr 0.01, momentum 0.5;
     A = init + 1 step, B = A + `--resnet-steps` steps. The pair (init, init + 1 step) is shown with
     `fft2d_layer` only: at init every batch-norm scale is 1, so its per-layer spectrum has exact zeros
     (D = inf for eq. 4, NaN gradient for eq. 5: the project's `spectrum: fft2d_layer` cannot train a
     batch-norm model from its initial weights).
2. The authors' code's un-squared PM proximal term beta * ||w_p - w_G^{t-1}|| (the project's `code_prox`, as
   SCD.pm_loss computes it; student B, anchor A): the gradient of ||w - a|| is a unit vector, so the ratio is
   beta / |grad CE| whatever the distance.
3. Prediction agreement on the mini's warm pair: from the same start and with the same batches (the same seed),
   `--steps` SGD steps with CE only and with SCD's own loss (SCD.pm_loss / SCD.gm_loss: eq. 4 from B toward
   s(A), eq. 5 from A toward s_hat(B), and the code's PM gradient, CE + the proximal term); the share of test
   images both runs label alike (all 10,000 Fashion-MNIST test images, and the client's local test set), and
   the largest parameter difference. ResNet-18 is left out: one step of its 11.2M-entry DFT costs tens of
   seconds on a CPU.

The spectra are the project's (pflrepro.algorithms.spectral; its `fft2d_layer` mode is the authors' variant
re-expressed with torch.fft so that it has a gradient: the authors' code takes it in numpy, without one). The
mini's gradients are checked against the gradient of SCD's own loss functions (the "check" line). Deterministic:
fixed seeds, one CPU thread. Cost on the project's 2-core machine: 350-490 s of CPU time (the mini 160-270 s,
ResNet-18 190-220 s, most of it its 11.2M-entry DFT), 8 minutes wall with the other core free, 14 with both
busy; the timings go to stderr.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable

import numpy as np
import torch
from torch import nn

from pflrepro.algorithms.scd import SCD
from pflrepro.algorithms.spectral import divergence, normalise, spectral_names, spectrum, truncate
from pflrepro.core.seeds import derive_seed
from pflrepro.core.training import ModelView, ce_loss, local_train
from pflrepro.data.datasets import load_dataset
from pflrepro.data.fed import normalise as normalise_images
from pflrepro.data.models import build_model
from pflrepro.federation.build import build_partition
from pflrepro.federation.build import raw_dataset as cached_dataset
from pflrepro.pipeline import experiments as ex

PAPER = {"lam_p": 0.01, "lam_g": 0.05}   # App. B
CODE = {"lam_p": 0.4, "lam_g": 0.3}      # the authors' code's defaults (shared/reference/author-code.md)
TAU = 0.4
MODES = ("dft1d", "fft2d_layer")
BETAS = (1.0, 5.0)                       # the code's beta: 1 by default, 5 in its README
CPU = torch.device("cpu")
TERMS = (("eq4", "lam_p", "eq. 4 (PM)"), ("eq5", "lam_g", "eq. 5 (GM, tau 0.4)"))


@dataclass
class Setup:
    """One architecture on one client: its data, the optimiser settings and a module factory."""
    name: str
    make: Callable[[], nn.Module]
    x: torch.Tensor                      # the client's training images (normalised) and labels
    y: torch.Tensor
    batch_size: int
    lr: float
    momentum: float
    x_test: torch.Tensor | None = None   # test images and labels (agreement runs only)
    y_test: torch.Tensor | None = None
    local_test: torch.Tensor | None = None   # the client's local test set: indices into x_test

    def module(self, state: dict) -> nn.Module:
        """A fresh module holding `state`, in train mode (as during local training)."""
        net = self.make()
        net.load_state_dict(state)
        return net.train()

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The fixed mini-batch the CE gradients are taken on: a random `batch_size` of the client's images."""
        idx = torch.randperm(len(self.y), generator=torch.Generator().manual_seed(0))[:self.batch_size]
        return self.x[idx], self.y[idx]


def clone(net: nn.Module) -> dict:
    return {n: t.detach().clone() for n, t in net.state_dict().items()}


def train(s: Setup, start: dict, x: torch.Tensor, y: torch.Tensor, *, epochs: int = 1, steps: int | None = None,
          loss=ce_loss, aux: dict | None = None, seed: int = 0) -> dict:
    """`start` trained by the project's local-training primitive (SGD with the setup's lr, momentum, batch)."""
    net = s.module(start)
    local_train(net, x, y, epochs=epochs, steps=steps, batch_size=s.batch_size, lr=s.lr, momentum=s.momentum,
                loss=loss, aux=aux, seed=seed)
    return clone(net)


def make_scd(s: Setup, **hparams) -> SCD:
    """The project's SCD object for the setup's architecture (its constructor reads only `ctx.model(-1)`)."""
    net = s.make()
    return SCD(SimpleNamespace(model=lambda k, state=None: net), **hparams)


def flat_grad(net: nn.Module, value: torch.Tensor) -> torch.Tensor:
    """d value / d (all trainable parameters of `net`), flattened; zeros where `value` does not depend."""
    params = [p for p in net.parameters() if p.requires_grad]
    grads = torch.autograd.grad(value, params, allow_unused=True)
    flat = torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, params)])
    return flat.double()   # float32 norms of ResNet-18's 11M entries are off by ~1e-3


def ce_grad(s: Setup, state: dict) -> torch.Tensor:
    net = s.module(state)
    return flat_grad(net, ce_loss(net, *s.batch()))


def spectral_grads(s: Setup, a: dict, b: dict, mode: str) -> dict:
    """{'eq4': (D, dD/dw_B), 'eq5': (D, dD/dw_A)}: eq. 4 is D(s(B) || s(A)) with B the student, eq. 5 is
    D(s_hat(A) || s_hat(B)) with A the student. One spectrum per model serves as the student side of one term
    and (detached) as the target of the other: `spectral_term` / `spectral_target` composed with half the FFTs
    (ResNet-18's cost); `check_against_scd` compares the result with SCD's own losses."""
    names = spectral_names(n for n, _ in s.make().named_parameters())   # include='weights', as SCD's default
    net_a, net_b = s.module(a), s.module(b)
    s_a = spectrum(dict(net_a.named_parameters()), names, mode)
    s_b = spectrum(dict(net_b.named_parameters()), names, mode)
    d4 = divergence(normalise(s_b), normalise(s_a.detach()))
    d5 = divergence(normalise(truncate(s_a, TAU)), normalise(truncate(s_b.detach(), TAU)))
    return {"eq4": (d4.item(), flat_grad(net_b, d4)), "eq5": (d5.item(), flat_grad(net_a, d5))}


def check_against_scd(s: Setup, a: dict, b: dict, mode: str, grads: dict, g_ce: dict) -> float:
    """Largest relative error of grad CE + grad D (this script) against the gradient of SCD's own `pm_loss` /
    `gm_loss` (lambda = 1, so that neither term drowns in the other's float32 rounding)."""
    scd = make_scd(s, lam_p=1.0, lam_g=1.0, tau=TAU, spectrum=mode)
    xb, yb = s.batch()
    net_b, net_a = s.module(b), s.module(a)
    g4 = flat_grad(net_b, scd.pm_loss(ModelView(net_b), xb, yb, {"target": scd.target(a, 1.0)}))
    g5 = flat_grad(net_a, scd.gm_loss(ModelView(net_a), xb, yb, scd.aux(1, 0, None, {"params": b})))
    errs = [(g - g_ce[eq] - grads[eq][1]).norm() / (g_ce[eq] + grads[eq][1]).norm()
            for eq, g in (("eq4", g4), ("eq5", g5))]
    return max(e.item() for e in errs)


def prox_grad(s: Setup, a: dict, b: dict, g_ce_b: torch.Tensor) -> torch.Tensor:
    """Gradient at the PM B of the code's term 1 * ||w_p - w_G^{t-1}|| (anchor A) as SCD's `pm_loss` with
    `code_prox` = 1 computes it: that loss's gradient less the CE gradient on the same batch."""
    scd = make_scd(s, lam_p=0.0, code_prox=1.0)
    net = s.module(b)
    anchor = {n: t.detach() for n, t in a.items()}
    return flat_grad(net, scd.pm_loss(ModelView(net), *s.batch(), {"anchor": anchor})) - g_ce_b


def measure_pair(s: Setup, pair: str, a: dict, b: dict, check: bool) -> tuple[list, list, list]:
    """Rows of the ratio table and of the proximal table for one pair, and the check errors (if `check`)."""
    g_ce = {"eq4": ce_grad(s, b), "eq5": ce_grad(s, a)}
    rows, errs = [], []
    for mode in MODES:
        grads = spectral_grads(s, a, b, mode)
        for eq, lam, label in TERMS:
            d, g = grads[eq]
            r = g.norm().item() / g_ce[eq].norm().item()
            rows.append(f"| {s.name} | {pair} | {label} | {mode} | {d:.2e} | {g_ce[eq].norm():.3f} | {g.norm():.2e} "
                        f"| {PAPER[lam] * r:.1e} | {CODE[lam] * r:.1e} |")
        if check:
            errs.append(check_against_scd(s, a, b, mode, grads, g_ce))
    gp = prox_grad(s, a, b, g_ce["eq4"]).norm().item()
    dist = torch.cat([(b[n] - a[n]).reshape(-1) for n, _ in s.make().named_parameters()]).double().norm().item()
    prox = [f"| {s.name} | {pair} | {dist:.3f} | {gp:.4f} | {g_ce['eq4'].norm():.3f} | "
            + " | ".join(f"{beta * gp / g_ce['eq4'].norm().item():.2f}" for beta in BETAS) + " |"]
    return rows, prox, errs


def degenerate_rows(s: Setup, pair: str, a: dict, b: dict) -> list[str]:
    """`fft2d_layer` with A a batch-norm model at init (every BN scale 1: its per-layer spectrum has exact zeros):
    D and |grad D| only, which are not finite (eq. 4: a zero target entry; eq. 5: a zero student entry)."""
    grads = spectral_grads(s, a, b, "fft2d_layer")
    return [f"| {s.name} | {pair} | {label} | fft2d_layer | {grads[eq][0]:.2e} | — | {grads[eq][1].norm():.2e} "
            "| — | — |" for eq, _, label in TERMS]


def mini_setup(client: int) -> tuple[Setup, dict, tuple[torch.Tensor, torch.Tensor]]:
    """SCD Table 1's mini (alpha = 0.1): client `client`'s data and local test set, the run's initial weights
    and the run's 3,000-image training pool (for the warm-up)."""
    cfg = ex.grid(ex.load_profile("scd_table1", "mini"))[("scd", "alpha=0.1", 0)]
    raw, part = cached_dataset(cfg.dataset), build_partition(cfg)
    spec = raw.spec
    ids = lambda a: torch.as_tensor(np.asarray(a), dtype=torch.long)  # noqa: E731
    own, pool = ids(part["train"][client]), ids(np.concatenate(part["train"]))
    s = Setup(f"{cfg.model} (mini)", lambda: build_model(cfg.model, spec.channels, spec.num_classes, spec.size),
              normalise_images(raw.x_train[own], spec, CPU), raw.y_train[own], cfg.batch_size, cfg.lr, cfg.momentum,
              normalise_images(raw.x_test, spec, CPU), raw.y_test, ids(part["test"][client]))  # into the test half
    torch.manual_seed(derive_seed(cfg.seed, 0x1A17))   # the run's initial weights (build.build_context)
    init = clone(s.make())
    return s, init, (normalise_images(raw.x_train[pool], spec, CPU), raw.y_train[pool])


def mini_pairs(s: Setup, init: dict, pool: tuple[torch.Tensor, torch.Tensor]) -> dict[str, tuple[dict, dict]]:
    """{pair: (A, B)}: A = the global model, B = A + local CE epochs on the client; the warm A is init + one CE
    epoch over the mini's whole pool (94 steps: a global model some rounds in)."""
    warm = train(s, init, *pool, epochs=1, seed=1)
    return {"A init, B +1 ep": (init, train(s, init, s.x, s.y, epochs=1, seed=2)),
            "A warm, B +1 ep": (warm, train(s, warm, s.x, s.y, epochs=1, seed=2)),
            "A warm, B +5 ep": (warm, train(s, warm, s.x, s.y, epochs=5, seed=2))}


def resnet_pairs(steps: int) -> tuple[Setup, tuple[str, dict, dict], tuple[str, dict, dict]]:
    """ResNet-18 on 500 `fake-cifar10` images, B = 10, lr 0.01, momentum 0.5: the pair (init, init + 1 step),
    degenerate under `fft2d_layer`, and the measured pair (init + 1 step, + `steps` more)."""
    raw = load_dataset("fake-cifar10", fake_scale=0.01)
    spec = raw.spec
    s = Setup("resnet18 (fake-cifar10)", lambda: build_model("resnet18", spec.channels, spec.num_classes, spec.size),
              normalise_images(raw.x_train, spec, CPU), raw.y_train, 10, 0.01, 0.5)
    torch.manual_seed(0)
    init = clone(s.make())
    a = train(s, init, s.x, s.y, steps=1, seed=1)
    b = train(s, a, s.x, s.y, steps=steps, seed=2)
    return s, ("A init, B +1 step", init, a), (f"A +1 step, B +{steps} steps", a, b)


def predict(s: Setup, state: dict) -> torch.Tensor:
    net = s.module(state).eval()
    with torch.no_grad():
        return torch.cat([net(x).argmax(1) for x in s.x_test.split(2000)])


def agreement_rows(s: Setup, a: dict, b: dict, steps: int) -> list[str]:
    """CE-only against SCD's loss from the same start with the same batches (seed 3), `steps` steps."""
    pm_full = lambda: {"target": make_scd(s).target(a, 1.0)}   # noqa: E731  s(A): eq. 4's target
    gm_trunc = lambda: make_scd(s).aux(1, 0, None, {"params": b})  # noqa: E731  s_hat(B): eq. 5's (tau 0.4)
    runs = [("eq. 4, paper: lambda_p 0.01", b, "pm", {"lam_p": 0.01}, pm_full()),
            ("eq. 4, lambda_p 10", b, "pm", {"lam_p": 10.0}, pm_full()),
            ("the code's PM gradient: CE + 1 * \\|w_p - w_G\\|", b, "pm", {"lam_p": 0.0, "code_prox": 1.0},
             {"anchor": {n: t.detach() for n, t in a.items()}}),
            ("eq. 5, paper: lambda_G 0.05, tau 0.4", a, "gm", {"lam_g": 0.05}, gm_trunc()),
            ("eq. 5, lambda_G 10, tau 0.4", a, "gm", {"lam_g": 10.0}, gm_trunc())]
    ce = {"B (PM)": train(s, b, s.x, s.y, steps=steps, seed=3), "A (GM)": train(s, a, s.x, s.y, steps=steps, seed=3)}
    pred = {k: predict(s, st) for k, st in ce.items()}
    acc = lambda p: 100 * (p == s.y_test).float().mean().item()  # noqa: E731
    rows = []
    for label, start, step, hp, aux in runs:
        scd = make_scd(s, tau=TAU, **hp)
        reg = train(s, start, s.x, s.y, steps=steps, loss=scd.pm_loss if step == "pm" else scd.gm_loss, aux=aux,
                    seed=3)
        key = "B (PM)" if start is b else "A (GM)"
        p_ce, p_reg = pred[key], predict(s, reg)
        same, loc = p_ce == p_reg, s.local_test
        diff = max((reg[n] - ce[key][n]).abs().max().item() for n in reg)
        rows.append(f"| {label} | {key} | {100 * same.float().mean():.2f} | {int((~same).sum())} | "
                    f"{100 * same[loc].float().mean():.2f} | {diff:.1e} | {acc(p_ce):.2f} | {acc(p_reg):.2f} |")
    return rows


def print_tables(ratio: list[str], prox: list[str], agree: list[str], errs: list[float], args: argparse.Namespace,
                 s: Setup) -> None:
    print(f"## SCD's gradient scale (mini: client {args.client} of SCD Table 1's mini, alpha 0.1, {len(s.y)} "
          f"training images; ResNet-18: fake-cifar10, 500 images)\n")
    print("lambda * |grad D| / |grad CE|: L2 norms over all trainable parameters, CE on one client mini-batch at "
          "the student (eq. 4: B, eq. 5: A).\n")
    print("| model | pair | term | spectrum | D | \\|grad CE\\| | \\|grad D\\| | ratio, paper lambda (0.01 / 0.05) "
          "| ratio, code lambda (0.4 / 0.3) |\n|---|---|---|---|---:|---:|---:|---:|---:|")
    print("\n".join(ratio))
    print(f"\ncheck (mini): CE + D gradients above vs the gradient of SCD.pm_loss / SCD.gm_loss, largest relative "
          f"error {max(errs):.1e}\n")
    print("The code's PM term beta * \\|w_p - w_G^{t-1}\\| (`code_prox`; student B, anchor A): |grad| / beta and "
          "beta * |grad| / |grad CE|.\n")
    print("| model | pair | \\|B - A\\| | \\|grad\\| / beta | \\|grad CE\\| | ratio, beta 1 | ratio, beta 5 |\n"
          "|---|---|---:|---:|---:|---:|---:|")
    print("\n".join(prox))
    print(f"\nPrediction agreement with CE-only training: mini, pair 'A warm, B +1 ep', {args.steps} steps from the "
          f"same start with the same batches; 10,000 Fashion-MNIST test images ({len(s.local_test)} of them the "
          "client's local test set).\n")
    print("| loss | start | agree (%) | differing | agree, local test (%) | max \\|param diff\\| | CE-only acc (%) "
          "| this loss acc (%) |\n|---|---|---:|---:|---:|---:|---:|---:|")
    print("\n".join(agree))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60, help="SGD steps of the agreement runs (mini)")
    ap.add_argument("--resnet-steps", type=int, default=5, help="CE steps between ResNet-18's A and B")
    ap.add_argument("--client", type=int, default=0, help="the mini's client (alpha = 0.1 partition)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.time()
    s, init, pool = mini_setup(args.client)
    pairs = mini_pairs(s, init, pool)
    ratio, prox, errs = [], [], []
    for pair, (a, b) in pairs.items():
        r, p, e = measure_pair(s, pair, a, b, check=True)
        ratio, prox, errs = ratio + r, prox + p, errs + e
    agree = agreement_rows(s, *pairs["A warm, B +1 ep"], args.steps)
    print(f"mini: {time.time() - t0:.0f} s wall, {time.process_time():.0f} s CPU", file=sys.stderr)
    rs, degenerate, measured = resnet_pairs(args.resnet_steps)
    r, p, _ = measure_pair(rs, *measured, check=False)
    ratio, prox = ratio + degenerate_rows(rs, *degenerate) + r, prox + p
    print(f"total: {time.time() - t0:.0f} s wall, {time.process_time():.0f} s CPU", file=sys.stderr)
    print_tables(ratio, prox, agree, errs, args, s)


if __name__ == "__main__":
    main()
