"""PoPE's per-element transcendentals for the fused kernels (pope/triton_pope.py; MATH §3, §6, §7.3):
the softplus amplitude and the cos/sin of the position-only phases.

The amplitude runs for every element of every key tile a query block visits (and of every query
tile in the dK/dV backward): the 2D-wide operands may not live in HBM (that is the unfused path,
5x the memory: benchmarks/results/attention-h200.md).

Measured on the H200 and dropped (kernels/attention/README.md, "Measured and not shipped"):
rotating a per-tile base phase by a per-program table of (cos, sin)(j theta) when positions advance
by 1, instead of a MUFU cos and sin per element, changed the forward by -3 % / +1.5 % (4k / 16k) and made forward+backward 15-17 %
slower (taken to be the two [BLOCK, BD] fp32 tables live in registers through the loops).
"""

from __future__ import annotations

import triton
import triton.language as tl

from phaselab.kernels.common.triton_common import _cos_sin, _log2


@triton.jit
def _amplitude(x, AMP: tl.constexpr, FAST: tl.constexpr):
    """mu = softplus (AMP 0) | relu (1) | identity (2) of fp32 x (MATH §3.1, §3.5, §7.3).

    softplus = max(x, 0) + ln 2 * log2(1 + y), y = 2**(-|x| log2 e) in (0, 1]: two special-function
    ops and four others per element, because this runs for every element of every key tile a
    query block visits (MATH §6), and every instruction lengthens the dependent chains of these
    latency-bound kernels (Nsight Compute, benchmarks/results/ncu/pope-16k.csv). Accuracy: 1 + y
    rounds in fp32, so mu carries an absolute error below 1.2e-7 (and is 0 instead of exp(x) below
    x = -17); no threshold is needed above 20, where y < 3e-9 vanishes against x.
    """
    if AMP == 0:
        y = tl.exp2(tl.abs(x) * -1.4426950408889634)
        mu = tl.maximum(x, 0.0) + _log2(1.0 + y, FAST) * 0.6931471805599453
    elif AMP == 1:
        mu = tl.maximum(x, 0.0)
    else:
        mu = x
    return mu


@triton.jit
def _amplitude_grad(x, AMP: tl.constexpr):
    """d mu / dx: sigmoid(x) (1 above the threshold 20), step(x), or 1 (MATH §7.3)."""
    if AMP == 0:
        g = tl.where(x > 20.0, 1.0, 1.0 / (1.0 + tl.exp2(-x * 1.4426950408889634)))
    elif AMP == 1:
        g = tl.where(x > 0.0, 1.0, 0.0)
    else:
        g = x * 0.0 + 1.0
    return g


@triton.jit
def _phase_cos_sin(pos, theta, bias, FAST: tl.constexpr):
    """(cos, sin)(pos theta - bias) [R, BD], the angle formed in fp32 from integer positions.

    The kernels pass positions relative to the batch row's first key position p0, subtracted in
    int64: the logit depends on positions only through (m - n) theta_c (MATH §3.1), so one origin
    for the queries and keys of a row leaves it unchanged, and the fp32 angle then carries the
    error of the relative position (README, "Numerical notes"), not of the absolute one: beyond
    2**24 fp32 no longer holds every integer (MATH §7.2, §7.4).
    """
    c, s = _cos_sin(pos.to(tl.float32)[:, None] * theta[None, :] - bias[None, :], FAST)
    return c, s


@triton.jit
def _reload_phase(p_x, m_x, p_pos, m_pos, p0, theta, bias, FAST: tl.constexpr):
    """(raw x fp32, cos, sin) [R, BD] read again for a backward kernel's epilogue. The loads are
    volatile so that the compiler cannot reuse the tiles computed before the block loop: kept live
    through it, three fp32 [R, BD] tiles made the dK/dV and dQ kernels spill (kernel_sass.py).
    p0: the batch row's phase origin (`_phase_cos_sin`)."""
    x = tl.load(p_x, mask=m_x, other=0.0, volatile=True).to(tl.float32)
    pos = tl.load(p_pos, mask=m_pos, other=0, volatile=True)
    c, s = _phase_cos_sin(pos - p0, theta, bias, FAST)
    return x, c, s


@triton.jit
def _pope_expand(x, c, s, m_d, AMP: tl.constexpr, FAST: tl.constexpr):
    """x [R, BD] raw fp32 and the tile's (cos, sin) -> (mu cos phi, mu sin phi, mu)."""
    mu = tl.where(m_d[None, :], _amplitude(x, AMP, FAST), 0.0)
    return mu * c, mu * s, mu
