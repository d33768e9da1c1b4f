"""PoPE mode of the flash core's backward (kernels/flash/triton_flash.py; the path: triton_expand.py): jit
helpers that build a resident block's expansion in registers (`_expand_rows`, also the prologue's
tile) and apply the chain rule in the epilogues (`_chain_epilogue`, also the standalone chain
kernel's body); spec: autograd through `reference.pope_expand` (layout "interleaved", positions
relative to the batch row's first key).

With x_hat = [mu cos phi_0, mu sin phi_0, mu cos phi_1, ...] (interleaved: column 2c is the x part
of element c, 2c + 1 its y part) and g = d x_hat:
    dx_c = mu'(x_c) (g_2c cos phi_c + g_2c+1 sin phi_c),
    d delta_hc = sum_rows mu(x_c) (g_2c sin phi_c - g_2c+1 cos phi_c)
(the query phase is m theta - delta, so d/d delta = -d/d phi). The interleaved layout makes the
split of a [R, 2 HALF] fp32 gradient tile into its x and y halves a register reshape
(`tl.split`), for any D <= HALF = BLOCK_D / 2 (also D = 48, whose 96-wide q_hat is padded to 128).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from phaselab.kernels.pope.phase import _amplitude, _amplitude_grad, _phase_cos_sin, _pope_expand
from phaselab.kernels.pope.triton_pope import AMPLITUDE_CODES


class PopeChain(NamedTuple):
    """PoPE's parameters for the flash core's PoPE mode: inv_freq fp32 [D], delta fp32 [H, D] or
    None, the amplitude ("softplus" | "relu" | "identity"). Positions are the core's own."""

    inv_freq: torch.Tensor
    delta: torch.Tensor | None
    amplitude: str



def pope_meta(chain: PopeChain | None) -> dict:
    """The flash kernels' PoPE constexprs (POPE False: plain attention)."""
    if chain is None:
        return {"POPE": False, "AMP": 0, "HAS_DELTA": False}
    return {"POPE": True, "AMP": AMPLITUDE_CODES[chain.amplitude], "HAS_DELTA": chain.delta is not None}


def pope_ptrs(chain: PopeChain | None, dummy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(inv_freq, delta) kernel arguments; `dummy` stands in where there are none (never read)."""
    if chain is None:
        return dummy, dummy
    return chain.inv_freq, chain.delta if chain.delta is not None else dummy


@triton.jit
def _row_tile(x, pos, pos_k, inv_freq, delta, i_b, i_h, o_l, o_d, s_xb, s_xh, s_xl, s_pb, s_pkb, L,
              D: tl.constexpr, HAS_DELTA: tl.constexpr, FAST: tl.constexpr, VOLATILE: tl.constexpr):
    """(raw x fp32, cos, sin, mask) of rows o_l, columns o_d of x [B, NH, L, D] (head i_h), the
    phases from pos - pos_k[b, 0] (int64) and, with HAS_DELTA, minus delta[i_h]. VOLATILE loads x
    and the positions so that an epilogue recomputes the tile rather than the compiler keeping
    the prologue's (x, cos, sin) live through the block loop (`phase._reload_phase`; it
    made the PoPE dQ kernel spill, kernel_sass.py)."""
    m_l, m_d = o_l < L, o_d < D
    m = m_l[:, None] & m_d[None, :]
    b_x = tl.load(x + i_b.to(tl.int64) * s_xb + i_h.to(tl.int64) * s_xh + o_l.to(tl.int64)[:, None] * s_xl
                  + o_d[None, :], mask=m, other=0.0, volatile=VOLATILE).to(tl.float32)
    p0 = tl.load(pos_k + i_b.to(tl.int64) * s_pkb)
    b_p = tl.load(pos + i_b.to(tl.int64) * s_pb + o_l, mask=m_l, other=0, volatile=VOLATILE)
    theta = tl.load(inv_freq + o_d, mask=m_d, other=0.0)
    bias = theta * 0.0
    if HAS_DELTA:
        bias = tl.load(delta + i_h * D + o_d, mask=m_d, other=0.0)
    c, s = _phase_cos_sin(b_p - p0, theta, bias, FAST)
    return b_x, c, s, m


@triton.jit
def _expand_rows(x, pos, pos_k, inv_freq, delta, i_b, i_h, o_l, s_xb, s_xh, s_xl, s_pb, s_pkb, L,
                 D: tl.constexpr, HALF: tl.constexpr, AMP: tl.constexpr, HAS_DELTA: tl.constexpr,
                 FAST: tl.constexpr):
    """x_hat [R, 2 HALF] fp32 of rows o_l ("interleaved"; columns from 2D on are 0, rows from L
    on finite and never stored): the prologue's tile, which the flash kernels also build in
    registers for their resident operand."""
    o_d = tl.arange(0, HALF)
    b_x, c, s, _ = _row_tile(x, pos, pos_k, inv_freq, delta, i_b, i_h, o_l, o_d, s_xb, s_xh, s_xl, s_pb, s_pkb,
                             L, D, HAS_DELTA, FAST, False)
    xx, yy, _ = _pope_expand(b_x, c, s, o_d < D, AMP, FAST)
    return tl.reshape(tl.join(xx, yy), [o_l.shape[0], 2 * HALF])


@triton.jit
def _chain_dx(gx, gy, b_x, c, s, AMP: tl.constexpr):
    """dx = mu'(x) (gx cos + gy sin), fp32."""
    return _amplitude_grad(b_x, AMP) * (gx * c + gy * s)


@triton.jit
def _chain_ddelta(gx, gy, b_x, c, s, m, AMP: tl.constexpr, FAST: tl.constexpr):
    """This tile's share of d delta [BD]: sum over its rows of mu (gx sin - gy cos)."""
    mu = _amplitude(b_x, AMP, FAST)
    return tl.sum(tl.where(m, mu * (gx * s - gy * c), 0.0), 0)


@triton.jit
def _chain_epilogue(acc, x, dx, part, pos, pos_k, inv_freq, delta, i_b, i_h, o_l, s_xb, s_xh, s_xl,
                    s_db, s_dh, s_dl, s_pb, s_pkb, L, i_part, D: tl.constexpr, HALF: tl.constexpr,
                    AMP: tl.constexpr, HAS_DELTA: tl.constexpr, FAST: tl.constexpr, VOLATILE: tl.constexpr):
    """A flash backward epilogue: acc [R, 2 HALF] fp32 (scale applied) is d x_hat of rows o_l of
    head i_h; stores dx [R, D] of the raw x in dx's dtype and, with HAS_DELTA, the rows' share of
    d delta at part[i_part, :HALF] (fp32). The phases are recomputed here in fp32 from x and the
    positions (as the prologue formed them), not read back. VOLATILE (`_row_tile`): True after a
    block loop; the standalone chain kernel, which has none, passes False."""
    gx, gy = tl.split(tl.reshape(acc, [acc.shape[0], HALF, 2]))
    o_d = tl.arange(0, HALF)
    b_x, c, s, m = _row_tile(x, pos, pos_k, inv_freq, delta, i_b, i_h, o_l, o_d, s_xb, s_xh, s_xl, s_pb, s_pkb,
                             L, D, HAS_DELTA, FAST, VOLATILE)
    p_d = dx + i_b.to(tl.int64) * s_db + i_h.to(tl.int64) * s_dh + o_l.to(tl.int64)[:, None] * s_dl + o_d[None, :]
    tl.store(p_d, _chain_dx(gx, gy, b_x, c, s, AMP).to(dx.dtype.element_ty), mask=m)
    if HAS_DELTA:
        tl.store(part + i_part.to(tl.int64) * HALF + o_d, _chain_ddelta(gx, gy, b_x, c, s, m, AMP, FAST))
