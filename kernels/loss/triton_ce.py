"""Cross-entropy rows in Triton: the logits buffer becomes its own gradient in one launch.

Caveat (DESIGN §8): verified against the float64 reference under TRITON_INTERPRET=1 on tiny shapes
(tests/kernels/loss/test_linear_ce.py); the bf16 GPU test and its speed on the H200 are run separately.

One program per row i of the logits buffer x [N, V_pad] (input dtype, written by the matmul):
    pass 1  online max and sum of exp over the first V columns in fp32, per lane, merged once:
            lse_i = log sum_v exp(x_iv); loss_i = w_i (lse_i - x_i,target) (0 when w_i = 0)
    pass 2  x_iv <- (softmax_iv - [v = target_i]) * w_i / sum_w     for v < V
            x_iv <- 0                                                for V <= v < V_pad
Columns >= V are never read (padding behaves as -inf: zero probability, zero gradient). sum_w is
read through a pointer, so the host never waits for the device. The exponentials run in the exp2
domain (x log2 e), the usual MUFU form; the result is the same fp32 softmax.

No autotuning: the kernel overwrites its input, and the autotuner's repeated timing launches would
turn gradients into gradients of gradients (restoring the buffer costs a copy as large as the logits).
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

LOG2E = 1.0 / math.log(2.0)
LN2 = math.log(2.0)


@triton.jit
def ce_fwd_kernel_rows(x, targets, weights, w_sum, loss, s_xn, V, V_PAD,
                       LOG2E_C: tl.constexpr, LN2_C: tl.constexpr, BLOCK_V: tl.constexpr):
    i_n = tl.program_id(0).to(tl.int64)
    p_row = x + i_n * s_xn  # int64: N * V_pad passes 2**31 at 32k rows of a 50k+ vocabulary
    o_v = tl.arange(0, BLOCK_V)
    # pass 1: per-lane running max m_v and sum s_v (log2 units), merged after the loop
    m_v = tl.full([BLOCK_V], float("-inf"), tl.float32)
    s_v = tl.zeros([BLOCK_V], tl.float32)
    for i_v in range(0, V, BLOCK_V):
        m_x = i_v + o_v < V
        b_x = tl.load(p_row + i_v + o_v, mask=m_x, other=float("-inf")).to(tl.float32) * LOG2E_C
        m_new = tl.maximum(m_v, b_x)
        # a lane that has seen only masked columns stays at -inf: shift by 0 there, not -inf - -inf
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        s_v = s_v * tl.exp2(m_v - m_safe) + tl.exp2(b_x - m_safe)
        m_v = m_new
    b_m = tl.max(m_v, axis=0)
    lse2 = b_m + tl.log2(tl.sum(s_v * tl.exp2(m_v - b_m), axis=0))  # log2 sum_v 2**(x_v log2 e)
    b_t = tl.load(targets + i_n)
    b_w = tl.load(weights + i_n)
    scored = (b_t >= 0) & (b_w != 0)
    x_t = tl.load(p_row + b_t, mask=scored, other=0.0).to(tl.float32)
    # loss_i is 0 (not 0 * nll) for unscored rows: an ignored row never turns the sum into NaN
    tl.store(loss + i_n, tl.where(scored, (lse2 * LN2_C - x_t) * b_w, 0.0))
    # pass 2: the gradient of sum_i w_i nll_i / sum_w w.r.t. the logits, in place, padding -> 0
    b_scale = b_w / tl.load(w_sum)
    for i_v in range(0, V_PAD, BLOCK_V):
        o_x = i_v + o_v
        m_x = o_x < V
        b_x = tl.load(p_row + o_x, mask=m_x, other=0.0).to(tl.float32)
        b_p = tl.where(m_x, tl.exp2(b_x * LOG2E_C - lse2), 0.0)
        b_g = (b_p - tl.where(o_x == b_t, 1.0, 0.0)) * b_scale
        tl.store(p_row + o_x, b_g.to(x.dtype.element_ty), mask=o_x < V_PAD)


def _block_v(v_pad: int) -> tuple[int, int]:
    """(BLOCK_V, num_warps): 4096-column tiles at 8 warps stream a 50k row in ~13 steps per pass,
    16 fp32 lanes a thread; the interpreter gets 32 columns so tiny tests cover several tiles."""
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        return 32, 4
    return min(4096, max(128, triton.next_power_of_2(v_pad))), 8


def ce_rows_(x_NV: torch.Tensor, targets_N: torch.Tensor, weight_N: torch.Tensor, w_sum: torch.Tensor,
             loss_N: torch.Tensor, vocab_size: int) -> None:
    """In place: x_NV [N, V_pad] (rows contiguous) logits -> d(sum_i w_i nll_i / w_sum)/d logits, in
    x's dtype; loss_N [N] fp32 <- w_i nll_i. targets_N int64 [N], weight_N fp32 [N], w_sum fp32 []."""
    N, v_pad = x_NV.shape
    assert x_NV.stride(1) == 1 and loss_N.is_contiguous() and targets_N.is_contiguous()
    if N == 0:
        return
    block_v, warps = _block_v(v_pad)
    ce_fwd_kernel_rows[(N,)](x_NV, targets_N, weight_N, w_sum, loss_N, x_NV.stride(0), vocab_size, v_pad,
                             LOG2E_C=LOG2E, LN2_C=LN2, BLOCK_V=block_v, num_warps=warps)
