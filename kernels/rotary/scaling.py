"""RoPE frequency rules: plain, PI, NTK-aware, dynamic NTK and YaRN (MATH.md §1.1, §2).

One pure function per rule, each returning fp32 frequencies theta'_i for the R/2 rotated pairs
(R = rotary_fraction * head_dim). All arithmetic is float64 on the host and rounded to fp32 once,
so rules that coincide mathematically (factor 1, YaRN's pure bands) coincide bit for bit.
`rope_frequencies(cfg, head_dim, seq_len)` dispatches on `RopeConfig.scaling` (config.py) and
also returns the YaRN attention factor `mscale`; the softmax scale is then mscale**2 / sqrt(head_dim)
(MATH §2.4). The rotation itself stays pure (DESIGN §7 example 4; torchtitan models/common/rope.py).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from phaselab.kernels.rotary.config import RAMPS, RopeConfig
from phaselab.kernels.rotary.config import check_base as _check_base
from phaselab.kernels.rotary.config import check_factor as _check_factor
from phaselab.kernels.rotary.config import check_length as _check_length


def _check_dim(dim: int) -> None:
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 2 or dim % 2:
        raise ValueError(f"rotary dim={dim!r} must be an even int >= 2")


def _default64(dim: int, base: float) -> Tensor:
    _check_dim(dim)
    _check_base(base)
    i = torch.arange(dim // 2, dtype=torch.float64)
    return float(base) ** (-2.0 * i / dim)


def check_factor(factor: float, original_max_seq_len: int, target_max_seq_len: int | None) -> float:
    """Return factor after checking it against L'/L when the target length is also given.

    s is never recomputed behind the user's back (huggingface/transformers#38224; MATH §2.4).
    """
    _check_factor(factor)
    _check_length("original_max_seq_len", original_max_seq_len)
    if target_max_seq_len is not None:
        _check_length("target_max_seq_len", target_max_seq_len)
        implied = target_max_seq_len / original_max_seq_len
        if not math.isclose(factor, implied, rel_tol=1e-12):
            raise ValueError(f"factor={factor} disagrees with target_max_seq_len/original_max_seq_len "
                             f"= {target_max_seq_len}/{original_max_seq_len} = {implied}")
    return factor


def default_inv_freq(dim: int, base: float = 10_000.0) -> Tensor:
    """Plain RoPE theta_i = base**(-2i/dim), i < dim/2, fp32 [dim/2] (MATH §1.1)."""
    return _default64(dim, base).to(torch.float32)


def pi_inv_freq(dim: int, base: float, factor: float) -> Tensor:
    """Position Interpolation: theta_i / s (MATH §2.1; Chen et al. 2306.15595)."""
    _check_factor(factor)
    return (_default64(dim, base) / factor).to(torch.float32)


def ntk_inv_freq(dim: int, base: float, factor: float) -> Tensor:
    """NTK-aware: base' = base * s**(dim/(dim-2)), theta'_i = base'**(-2i/dim) (MATH §2.2)."""
    _check_factor(factor)
    _check_dim(dim)
    if dim == 2:
        raise ValueError("NTK-aware scaling needs a rotary dim > 2 (the exponent dim/(dim-2))")
    return default_inv_freq(dim, base * factor ** (dim / (dim - 2)))


def dynamic_ntk_inv_freq(dim: int, base: float, factor: float, original_max_seq_len: int,
                         seq_len: int) -> Tensor:
    """Dynamic NTK: base for l <= L, else base * (s*l/L - (s-1))**(dim/(dim-2)) (MATH §2.3).

    seq_len l counts every position seen, cached ones included; keys must be re-rotated at each l.
    """
    _check_factor(factor)
    _check_length("original_max_seq_len", original_max_seq_len)
    _check_length("seq_len", seq_len)
    _check_dim(dim)
    if seq_len <= original_max_seq_len or factor == 1.0:
        # s = 1 must reproduce plain RoPE exactly for every rule (MATH §2 / §2.5); the formula
        # alone would still grow the base as l/L beyond L.
        return default_inv_freq(dim, base)
    if dim == 2:
        raise ValueError("dynamic NTK scaling needs a rotary dim > 2 (the exponent dim/(dim-2))")
    growth = factor * seq_len / original_max_seq_len - (factor - 1.0)
    return default_inv_freq(dim, base * growth ** (dim / (dim - 2)))


def yarn_correction_range(dim: int, base: float, original_max_seq_len: int, beta_fast: float = 32.0,
                          beta_slow: float = 1.0, truncate: bool = True) -> tuple[float, float]:
    """(low, high) pair indices of YaRN's ramp, as jquesnelle/yarn and HF compute them (MATH §2.4).

    d(r) = dim * ln(L / (2 pi r)) / (2 ln base); low = max(floor d(beta_fast), 0),
    high = min(ceil d(beta_slow), dim - 1) (floor/ceil only if truncate); high += 0.001 if equal.
    """
    _check_dim(dim)
    _check_base(base)
    _check_length("original_max_seq_len", original_max_seq_len)

    def d(rotations: float) -> float:
        return dim * math.log(original_max_seq_len / (2 * math.pi * rotations)) / (2 * math.log(base))

    low, high = d(beta_fast), d(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(float(low), 0.0), min(float(high), float(dim - 1))
    if low == high:
        high += 0.001  # avoid a zero-width ramp (reference code)
    if high < low:
        # Only when L < 2 pi beta_slow: the reference code would ramp over a negative range.
        raise ValueError(f"YaRN correction range low={low} > high={high} for original_max_seq_len="
                         f"{original_max_seq_len}, beta_fast={beta_fast}, beta_slow={beta_slow}")
    return low, high


def yarn_inv_freq(dim: int, base: float, factor: float, original_max_seq_len: int,
                  beta_fast: float = 32.0, beta_slow: float = 1.0, ramp: str = "index",
                  truncate: bool = True) -> Tensor:
    """YaRN "NTK-by-parts": theta'_i = (theta_i/s)(1 - gamma_i) + theta_i gamma_i (MATH §2.4).

    ramp "index" (default; reference code and HF): gamma_i = 1 - clamp((i-low)/(high-low), 0, 1).
    ramp "rotations" (the paper): gamma_i = clamp((r_i - beta_slow)/(beta_fast - beta_slow), 0, 1)
    with r_i = L / lambda_i = L theta_i / (2 pi) rotations within the pretraining context.
    """
    _check_factor(factor)
    if ramp not in RAMPS:
        raise ValueError(f"ramp={ramp!r}: expected one of {RAMPS}")
    theta = _default64(dim, base)
    if ramp == "index":
        low, high = yarn_correction_range(dim, base, original_max_seq_len, beta_fast, beta_slow, truncate)
        i = torch.arange(dim // 2, dtype=torch.float64)
        gamma = 1.0 - ((i - low) / (high - low)).clamp(0.0, 1.0)
    else:
        _check_length("original_max_seq_len", original_max_seq_len)
        rotations = original_max_seq_len * theta / (2 * math.pi)
        gamma = ((rotations - beta_slow) / (beta_fast - beta_slow)).clamp(0.0, 1.0)
    return ((theta / factor) * (1.0 - gamma) + theta * gamma).to(torch.float32)


def yarn_mscale(factor: float, attention_factor: float | None = None) -> float:
    """sqrt(1/t) = 0.1 ln s + 1 (1 for s <= 1); an explicit attention_factor wins (MATH §2.4)."""
    if attention_factor is not None:
        return float(attention_factor)
    return 1.0 if factor <= 1.0 else 0.1 * math.log(factor) + 1.0


def rope_frequencies(cfg: RopeConfig, head_dim: int, seq_len: int | None = None) -> tuple[Tensor, float]:
    """(inv_freq fp32 [R/2], mscale) for cfg on heads of head_dim features; seq_len (the current
    length l) is needed by dynamic_ntk.

    The softmax scale is mscale**2 / sqrt(head_dim) (YaRN; mscale = 1 for the other rules).
    """
    dim, base, s, L = cfg.rotary_dim(head_dim), cfg.base, cfg.factor, cfg.original_max_seq_len
    if cfg.scaling == "none":
        return default_inv_freq(dim, base), 1.0
    assert L is not None  # RopeConfig validated it
    if cfg.scaling == "pi":
        return pi_inv_freq(dim, base, s), 1.0
    if cfg.scaling == "ntk":
        return ntk_inv_freq(dim, base, s), 1.0
    if cfg.scaling == "dynamic_ntk":
        if seq_len is None:
            raise ValueError("scaling='dynamic_ntk' needs seq_len (the current number of positions)")
        return dynamic_ntk_inv_freq(dim, base, s, L, seq_len), 1.0
    inv_freq = yarn_inv_freq(dim, base, s, L, cfg.beta_fast, cfg.beta_slow, cfg.ramp, cfg.truncate)
    return inv_freq, yarn_mscale(s, cfg.attention_factor)
