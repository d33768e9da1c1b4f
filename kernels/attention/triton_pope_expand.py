"""PoPE attention through its Cartesian form on the flash core (triton_flash.py); spec:
`reference.pope_expand` (MATH §3.3) and `reference.attention` with a pope `ScoreMod`.

Three steps, each a Triton kernel:
1. prologue (`pope_expand_fwd`): from raw q [B,H,T,D], k [B,G,S,D] the 2D-wide
       q_hat = mu(q) [cos, sin](m theta - delta_h),   k_hat = mu(k) [cos, sin](n theta)
   in layout "concat" and q's dtype; mu = softplus | relu | identity, and the angles, cos/sin and
   the amplitude in fp32 (pope_phase.py, the fused kernels' helpers). Positions are taken relative
   to the batch row's first key, pos - pos_k[b, 0], in int64 before the fp32 multiply: the logit
   depends on m - n only, and the fp32 angle then carries the error of the relative position
   (kernels/attention/README.md, "Numerical notes"). So q_hat / k_hat equal
   `reference.pope_expand` at positions pos - pos_k[:, :1].
2. the flash core with DK = 2D, DV = D (v is not padded), scale 1/sqrt(D) by default (MATH §3.4).
3. the chain rule back through the expansion (`pope_expand_bwd`):
       dx = mu'(x) (dx_hat cos + dy_hat sin),   d delta_hc = sum_{b,t} mu (dx_hat sin - dy_hat cos)
   (phase = m theta - delta, so d/d delta = -d/d phase); d delta is summed per (batch, head,
   row block) in the kernel and the partial rows in a fixed order by torch: deterministic.

q_hat and k_hat are written to device memory (O(N D), 2x q and k) and saved for the backward;
fwd+bwd memory stays linear in N.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from phaselab.kernels.attention.flash_function import FlashAttentionFunction
from phaselab.kernels.attention.pope_phase import _amplitude, _amplitude_grad, _phase_cos_sin, _pope_expand
from phaselab.kernels.attention.triton_common import _pos_stride, block_d, interpreting
from phaselab.kernels.attention.triton_pope import AMPLITUDE_CODES


def _rows_per_block(D: int) -> int:
    # about 4096 elements per program; the interpreter walks programs one by one, so fewer rows
    return 16 if interpreting() else max(16, 4096 // block_d(D))


@triton.jit
def _row_tile(x, pos, pos_k, inv_freq, delta, i_b, i_h, o_l, o_d, s_xb, s_xh, s_xl, s_pb, s_pkb, L,
              D: tl.constexpr, HAS_DELTA: tl.constexpr, FAST: tl.constexpr):
    """(raw x fp32, cos, sin, mask) of one [BLOCK_L, BLOCK_D] tile, phases from pos - pos_k[b, 0]."""
    m_l, m_d = o_l < L, o_d < D
    m = m_l[:, None] & m_d[None, :]
    b_x = tl.load(x + i_b.to(tl.int64) * s_xb + i_h.to(tl.int64) * s_xh + o_l.to(tl.int64)[:, None] * s_xl
                  + o_d[None, :], mask=m, other=0.0).to(tl.float32)
    p0 = tl.load(pos_k + i_b.to(tl.int64) * s_pkb)
    b_p = tl.load(pos + i_b.to(tl.int64) * s_pb + o_l, mask=m_l, other=0)
    theta = tl.load(inv_freq + o_d, mask=m_d, other=0.0)
    bias = theta * 0.0
    if HAS_DELTA:
        bias = tl.load(delta + i_h * D + o_d, mask=m_d, other=0.0)
    c, s = _phase_cos_sin(b_p - p0, theta, bias, FAST)
    return b_x, c, s, m


@triton.jit
def pope_expand_kernel(x, out, pos, pos_k, inv_freq, delta, s_xb, s_xh, s_xl, s_ob, s_oh, s_ol, s_pb, s_pkb,
                       L, NH, D: tl.constexpr, BLOCK_D: tl.constexpr, AMP: tl.constexpr, HAS_DELTA: tl.constexpr,
                       FAST: tl.constexpr, BLOCK_L: tl.constexpr):
    """out[..., :D] = mu cos(phase), out[..., D:] = mu sin(phase) for x [B, NH, L, D]."""
    i_l, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // NH, i_bh % NH
    o_l = i_l * BLOCK_L + tl.arange(0, BLOCK_L)
    o_d = tl.arange(0, BLOCK_D)
    b_x, c, s, m = _row_tile(x, pos, pos_k, inv_freq, delta, i_b, i_h, o_l, o_d, s_xb, s_xh, s_xl, s_pb, s_pkb,
                             L, D, HAS_DELTA, FAST)
    xx, yy, _ = _pope_expand(b_x, c, s, o_d < D, AMP, FAST)
    p_o = out + i_b.to(tl.int64) * s_ob + i_h.to(tl.int64) * s_oh + o_l.to(tl.int64)[:, None] * s_ol + o_d[None, :]
    tl.store(p_o, xx.to(out.dtype.element_ty), mask=m)
    tl.store(p_o + D, yy.to(out.dtype.element_ty), mask=m)


@triton.jit
def pope_chain_kernel(x, dxh, dx, ddelta_part, pos, pos_k, inv_freq, delta, s_xb, s_xh, s_xl, s_gb, s_gh, s_gl,
                      s_pb, s_pkb, L, NH, n_blocks, D: tl.constexpr, BLOCK_D: tl.constexpr, AMP: tl.constexpr,
                      HAS_DELTA: tl.constexpr, FAST: tl.constexpr, BLOCK_L: tl.constexpr):
    """dx = mu'(x) (dxh[..., :D] cos + dxh[..., D:] sin); with delta, this tile's share of d delta."""
    i_l, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // NH, i_bh % NH
    o_l = i_l * BLOCK_L + tl.arange(0, BLOCK_L)
    o_d = tl.arange(0, BLOCK_D)
    b_x, c, s, m = _row_tile(x, pos, pos_k, inv_freq, delta, i_b, i_h, o_l, o_d, s_xb, s_xh, s_xl, s_pb, s_pkb,
                             L, D, HAS_DELTA, FAST)
    p_g = dxh + i_b.to(tl.int64) * s_gb + i_h.to(tl.int64) * s_gh + o_l.to(tl.int64)[:, None] * s_gl + o_d[None, :]
    gx = tl.load(p_g, mask=m, other=0.0).to(tl.float32)
    gy = tl.load(p_g + D, mask=m, other=0.0).to(tl.float32)
    b_dx = _amplitude_grad(b_x, AMP) * (gx * c + gy * s)
    tl.store(dx + i_b.to(tl.int64) * s_xb + i_h.to(tl.int64) * s_xh + o_l.to(tl.int64)[:, None] * s_xl + o_d[None, :],
             b_dx.to(dx.dtype.element_ty), mask=m)
    if HAS_DELTA:
        mu = _amplitude(b_x, AMP, FAST)
        dd = tl.sum(tl.where(m, mu * (gx * s - gy * c), 0.0), 0)
        tl.store(ddelta_part + (i_bh.to(tl.int64) * n_blocks + i_l) * BLOCK_D + o_d, dd)


def _launch_args(x, pos, pos_k, inv_freq, delta, amplitude):
    B, NH, L, D = x.shape
    bl = _rows_per_block(D)
    grid = (triton.cdiv(L, bl), B * NH)
    meta = {"D": D, "BLOCK_D": block_d(D), "AMP": AMPLITUDE_CODES[amplitude], "HAS_DELTA": delta is not None,
            "FAST": not interpreting(), "BLOCK_L": bl}
    return grid, meta, (pos, pos_k, inv_freq, delta if delta is not None else inv_freq)


def _expand_one(x, pos, pos_k, inv_freq, delta, amplitude):
    B, NH, L, D = x.shape
    out = torch.empty((B, NH, L, 2 * D), dtype=x.dtype, device=x.device)
    grid, meta, tensors = _launch_args(x, pos, pos_k, inv_freq, delta, amplitude)
    pope_expand_kernel[grid](x, out, *tensors, x.stride(0), x.stride(1), x.stride(2), out.stride(0), out.stride(1),
                             out.stride(2), _pos_stride(pos), _pos_stride(pos_k), L, NH, **meta)
    return out


def _chain_one(x, dxh, pos, pos_k, inv_freq, delta, amplitude):
    B, NH, L, D = x.shape
    dxh = dxh if dxh.stride(-1) == 1 else dxh.contiguous()
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    grid, meta, tensors = _launch_args(x, pos, pos_k, inv_freq, delta, amplitude)
    part = torch.empty((B, NH, grid[0] if delta is not None else 1, meta["BLOCK_D"]), dtype=torch.float32,
                       device=x.device)  # every row is written when delta is given
    pope_chain_kernel[grid](x, dxh, dx, part, *tensors, x.stride(0), x.stride(1), x.stride(2), dxh.stride(0),
                            dxh.stride(1), dxh.stride(2), _pos_stride(pos), _pos_stride(pos_k), L, NH, grid[0],
                            **meta)
    ddelta = None if delta is None else part.sum(dim=(0, 2))[:, :D].contiguous()
    return dx, ddelta


def pope_expand_fwd(q, k, pos_q, pos_k, inv_freq, delta, amplitude: str = "softplus"):
    """(q_hat [B,H,T,2D], k_hat [B,G,S,2D]) in q's dtype. q, k last dim contiguous; pos int64
    contiguous [B|1, T|S]; inv_freq fp32 [D]; delta fp32 [H, D] or None."""
    return (_expand_one(q, pos_q, pos_k, inv_freq, delta, amplitude),
            _expand_one(k, pos_k, pos_k, inv_freq, None, amplitude))


def pope_expand_bwd(dq_hat, dk_hat, q, k, pos_q, pos_k, inv_freq, delta, amplitude: str = "softplus"):
    """(dq, dk, ddelta fp32 [H, D] or None) from the gradients of q_hat and k_hat."""
    dq, ddelta = _chain_one(q, dq_hat, pos_q, pos_k, inv_freq, delta, amplitude)
    dk, _ = _chain_one(k, dk_hat, pos_k, pos_k, inv_freq, None, amplitude)
    return dq, dk, ddelta


class PopeExpandFunction(torch.autograd.Function):
    """(q_hat, k_hat) = the Cartesian expansion; gradients for q, k and delta."""

    @staticmethod
    def forward(ctx, q, k, delta, pos_q, pos_k, inv_freq, amplitude):
        q_hat, k_hat = pope_expand_fwd(q, k, pos_q, pos_k, inv_freq, delta, amplitude)
        ctx.save_for_backward(q, k, delta, pos_q, pos_k, inv_freq)
        ctx.amplitude = amplitude
        return q_hat, k_hat

    @staticmethod
    def backward(ctx, dq_hat, dk_hat):
        q, k, delta, pos_q, pos_k, inv_freq = ctx.saved_tensors
        if dq_hat is None:
            dq_hat = torch.zeros((*q.shape[:3], 2 * q.shape[3]), dtype=q.dtype, device=q.device)
        if dk_hat is None:
            dk_hat = torch.zeros((*k.shape[:3], 2 * k.shape[3]), dtype=k.dtype, device=k.device)
        dq, dk, ddelta = pope_expand_bwd(dq_hat, dk_hat, q, k, pos_q, pos_k, inv_freq, delta, ctx.amplitude)
        if ddelta is not None:
            ddelta = ddelta.to(delta.dtype)
        return dq, dk, ddelta, None, None, None, None


def pope_expand(q, k, pos_q, pos_k, inv_freq, delta, amplitude: str = "softplus"):
    """Differentiable (q_hat, k_hat) (validated inputs, as `function.pope_attention` passes them)."""
    return PopeExpandFunction.apply(q, k, delta, pos_q, pos_k, inv_freq, amplitude)


def pope_expand_attention(q, k, v, delta, pos_q, pos_k, inv_freq, scale: float, causal: bool, amplitude: str):
    """PoPE attention = prologue + flash core (DK = 2D, DV = D) + chain rule (validated inputs,
    as `function.pope_attention` passes them); differentiable in q, k, v and delta."""
    q_hat, k_hat = pope_expand(q, k, pos_q, pos_k, inv_freq, delta, amplitude)
    return FlashAttentionFunction.apply(q_hat, k_hat, v, pos_q, pos_k, scale, causal)
