"""Model spectra and the spectral divergence of spectral co-distillation (Chen et al., NeurIPS 2023).

Sec. 3.2: for a weight vector w in R^d, the spectrum vector is s(w) = (|z_1|, ..., |z_d|), z = DFT(w);
the divergence is D(p || q) = sum_i p_i log p_i - p_i log q_i with 0 log 0 := 0. Sec. 3.3: the
truncated spectrum s_hat = i_tau o s keeps the first ceil(tau * d) entries (the low frequencies).

Choices where the paper is silent (docs/fidelity.md, "Spectral co-distillation"):
- which tensors form w: `include='weights'` (default, the authors' code: the `weight` of every module
  that has one: conv, linear, batch-norm scale; biases, BN shifts and running statistics left out) or
  `'all'` (every parameter);
- spectra are L1-normalised into stochastic vectors after truncation (the code normalises the
  magnitudes; the paper's D is "identically the KL divergence" for stochastic vectors);
- `mode='dft1d'` (default, the paper: one 1-D DFT of the concatenated vector) or `'fft2d_layer'`
  (the code: a 2-D FFT per layer, conv weights reshaped to (out, in*k*k), 1-D weights a 1-D FFT,
  magnitudes concatenated in layer order).
Everything is torch, so the student side carries a gradient (the authors' code computes the FFT in
numpy on detached weights: its spectral term has none).
"""
from __future__ import annotations

import functools
import math

import torch

MODES = ("dft1d", "fft2d_layer")
INCLUDE = ("weights", "all")


def spectral_names(names, include: str = "weights") -> list[str]:
    """The parameter names that enter the spectrum, in the given (registration) order."""
    if include not in INCLUDE:
        raise ValueError(f"include={include!r}: allowed {INCLUDE}")
    names = list(names)
    return names if include == "all" else [n for n in names if n.rsplit(".", 1)[-1] == "weight"]


def spectrum(params: dict, names: list[str], mode: str = "dft1d") -> torch.Tensor:
    """s(w): DFT magnitudes of the weights `names` of `params` (not normalised, not truncated)."""
    if mode == "dft1d":
        w = torch.cat([params[n].reshape(-1) for n in names])
        return _real_dft_magnitude(w)
    if mode == "fft2d_layer":
        parts = []
        for n in names:
            t = params[n]
            z = torch.fft.fft(t.reshape(-1)) if t.dim() <= 1 else torch.fft.fft2(t.reshape(t.shape[0], -1))
            parts.append(z.abs().reshape(-1))
        return torch.cat(parts)
    raise ValueError(f"mode={mode!r}: allowed {MODES}")


def _real_dft_magnitude(w: torch.Tensor) -> torch.Tensor:
    """|DFT(w)| of a real vector. Lengths with a large prime factor p (LeNet's 44,190 = 90 x 491)
    take the four-step factorisation d = p x m (`_four_step_dft`): one call of torch's FFT on such a
    length costs about 3x the two batched short FFTs (docs/performance.md, "SCD's spectrum"); other
    lengths take the half-length rfft and its mirror, |z_k| = |z_{d-k}|. Both are the same DFT up to
    float rounding (tests/test_scd.py)."""
    d = w.shape[-1]
    p = _largest_prime_factor(d)
    if p > FOUR_STEP_MIN_PRIME and p < d:
        return _four_step_dft(w, p).abs()
    r = torch.fft.rfft(w).abs()
    return torch.cat([r, r[..., 1:d - d // 2].flip(-1)], -1)


FOUR_STEP_MIN_PRIME = 31   # below it torch's mixed-radix FFT is fast already (65,536: rfft 3.8 ms, four-step 4.1)


@functools.lru_cache(maxsize=64)
def _largest_prime_factor(d: int) -> int:
    p, f, x = 1, 2, d
    while f * f <= x:
        while x % f == 0:
            p, x = f, x // f
        f += 1
    return max(p, x)


@functools.lru_cache(maxsize=16)
def _twiddles(n1: int, n2: int, dtype, device) -> torch.Tensor:
    """exp(-2 pi i k1 n2' / (n1 n2)) for k1 < n1, n2' < n2, computed in float64 (a pure function: cached)."""
    k1 = torch.arange(n1, dtype=torch.float64)[:, None]
    j = torch.arange(n2, dtype=torch.float64)[None, :]
    ang = (-2 * math.pi / (n1 * n2)) * torch.remainder(k1 * j, n1 * n2)
    return torch.polar(torch.ones_like(ang), ang).to(dtype=dtype, device=device)


def _four_step_dft(w: torch.Tensor, n1: int) -> torch.Tensor:
    """The complex DFT of the last axis of `w` (length d = n1 n2) by Cooley-Tukey's four-step rule:
    with n = n2' + n2 n1' and k = k1 + n1 k2, z_k = sum_n2' W_d^(n2' k1) W_n2^(n2' k2)
    sum_n1' w_(n2 n1' + n2') W_n1^(n1' k1): n2 FFTs of length n1, twiddles, n1 FFTs of length n2."""
    d = w.shape[-1]
    n2 = d // n1
    cdtype = torch.complex128 if w.dtype == torch.float64 else torch.complex64
    a = torch.fft.fft(w.reshape(*w.shape[:-1], n1, n2), dim=-2) * _twiddles(n1, n2, cdtype, w.device)
    return torch.fft.fft(a, dim=-1).transpose(-1, -2).reshape(*w.shape[:-1], d)


def truncate(s: torch.Tensor, tau: float) -> torch.Tensor:
    """i_tau: the first ceil(tau * d) entries (tau in [0, 1]; tau = 0 keeps nothing)."""
    if not 0.0 <= tau <= 1.0:
        raise ValueError(f"tau={tau}: must be in [0, 1]")
    x = tau * s.shape[-1]
    keep = round(x) if abs(x - round(x)) < 1e-6 else math.ceil(x)   # 0.3 * 10 is 3, not 4
    return s[:keep]


def normalise(s: torch.Tensor) -> torch.Tensor:
    """L1 normalisation into a stochastic vector (magnitudes are non-negative)."""
    return s / s.sum().clamp_min(torch.finfo(s.dtype).tiny)


def divergence(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """D(p || q) = sum_i p_i log p_i - p_i log q_i, with 0 log 0 = 0 (and 0 log q = 0)."""
    if p.shape != q.shape:
        raise ValueError(f"divergence of spectra of different lengths {tuple(p.shape)} vs {tuple(q.shape)}: "
                         "the two models must have the same architecture")
    return (torch.xlogy(p, p) - torch.xlogy(p, q)).sum()


def spectral_target(params: dict, names: list[str], tau: float = 1.0, mode: str = "dft1d") -> torch.Tensor:
    """The teacher side of a spectral term, computed once and detached: normalise(i_tau(s(w)))."""
    with torch.no_grad():
        return normalise(truncate(spectrum(params, names, mode), tau)).detach()


def spectral_term(params: dict, names: list[str], target: torch.Tensor, tau: float = 1.0,
                  mode: str = "dft1d") -> torch.Tensor:
    """D(normalise(i_tau(s(w_student))) || target), differentiable in the student's parameters."""
    return divergence(normalise(truncate(spectrum(params, names, mode), tau)), target)
