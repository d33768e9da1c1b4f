"""PoPE's per-element transcendentals for the fused kernels (triton_pope.py; MATH §3, §6, §7.3):
the softplus amplitude and the cos/sin of the position-only phases.

Why a rotation: the kernels rebuild k_hat for every key tile a query block visits (and q_hat for
every query tile in the dK/dV backward), because the 2D-wide operands may not live in HBM (issue
3). Computed directly that is four MUFU ops per raw element (softplus: ex2, lg2; cos, sin) against
one ex2 per score for the softmax, so the transcendentals, not the tensor cores, set PoPE's time
(benchmarks/NOTES-device.md). When a row's positions advance by exactly 1, a tile's phases are
    phi_j = p0 theta - bias + j theta,   j = 0 .. BLOCK-1,
so cos/sin(phi_j) is the per-tile base (cos, sin)(p0 theta - bias), [BD] values, rotated by the
per-program table (cos, sin)(j theta): four FMA-pipe ops per element instead of two MUFU ops and
the range reduction. Rows whose positions do not advance by 1 (packed documents, strided or
shuffled positions) take the direct path; a per-batch flag computed on the device picks (no sync).

Accuracy: the direct path rounds fl(p theta) once; the rotation rounds fl(p0 theta) and fl(j theta)
(each within half an ulp) and adds about 2 ulp of 1 in the two products, the same order.
PHASELAB_POPE_ROTATE=0 switches the rotation off (read at import, for A/B timing on a GPU).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from phaselab.kernels.attention.triton_common import _cos_sin, _log2

ROTATE = tl.constexpr(os.environ.get("PHASELAB_POPE_ROTATE", "1") != "0")


@triton.jit
def _amplitude(x, AMP: tl.constexpr, FAST: tl.constexpr):
    """mu = softplus (AMP 0) | relu (1) | identity (2) of fp32 x (MATH §3.1, §3.5, §7.3).

    softplus = max(x, 0) + log1p(y), y = exp(-|x|) in (0, 1], and x itself above PyTorch's
    threshold 20. log1p(y) is the cubic y (1 - y/2 + y^2/3) for y < 1e-3 (relative error < 3e-10;
    log2(1 + y) would lose y below fp32 resolution) and log2(1 + y) ln 2 above: no division, two
    MUFU ops per element (this runs for every key tile element, MATH §6).
    """
    if AMP == 0:
        y = tl.exp2(-tl.abs(x) * 1.4426950408889634)
        small = y * (1.0 - y * (0.5 - y * 0.3333333333333333))
        lp = tl.where(y < 1e-3, small, _log2(1.0 + y, FAST) * 0.6931471805599453)
        mu = tl.where(x > 20.0, x, tl.maximum(x, 0.0) + lp)
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
def _rotation_table(theta, FAST: tl.constexpr, BLOCK: tl.constexpr):
    """(cos, sin)(j theta_c) [BLOCK, BD] for j = 0 .. BLOCK-1: built once per program."""
    j = tl.arange(0, BLOCK).to(tl.float32)
    c, s = _cos_sin(j[:, None] * theta[None, :], FAST)
    return c, s


@triton.jit
def _tile_cos_sin(p_pos_tile, pos, theta, bias, rot_c, rot_s, unit,
                  FAST: tl.constexpr, ROT: tl.constexpr):
    """(cos, sin)(pos theta - bias) [R, BD] of one tile whose first position is *p_pos_tile;
    `unit` (scalar bool) says the row's positions advance by 1, so the rotation applies."""
    if ROT:
        if unit:
            base = tl.load(p_pos_tile).to(tl.float32) * theta - bias
            cb, sb = _cos_sin(base, FAST)
            c = cb[None, :] * rot_c - sb[None, :] * rot_s
            s = sb[None, :] * rot_c + cb[None, :] * rot_s
        else:
            c, s = _direct_cos_sin(pos, theta, bias, FAST)
    else:
        c, s = _direct_cos_sin(pos, theta, bias, FAST)
    return c, s


@triton.jit
def _direct_cos_sin(pos, theta, bias, FAST: tl.constexpr):
    """(cos, sin)(pos theta - bias) [R, BD], the angle formed in fp32 from integer positions."""
    c, s = _cos_sin(pos.to(tl.float32)[:, None] * theta[None, :] - bias[None, :], FAST)
    return c, s


@triton.jit
def _pope_expand(x, c, s, m_d, AMP: tl.constexpr, FAST: tl.constexpr):
    """x [R, BD] raw fp32 and the tile's (cos, sin) -> (mu cos phi, mu sin phi, mu)."""
    mu = tl.where(m_d[None, :], _amplitude(x, AMP, FAST), 0.0)
    return mu * c, mu * s, mu


def unit_step_flags(pos_BL: torch.Tensor) -> torch.Tensor:
    """int32 [B or 1]: 1 where a row's positions advance by exactly 1 (the rotation applies);
    computed on the device, no sync."""
    if pos_BL.shape[1] < 2:
        return torch.ones(pos_BL.shape[0], dtype=torch.int32, device=pos_BL.device)
    return (pos_BL[:, 1:] - pos_BL[:, :-1] == 1).all(dim=1).to(torch.int32)
