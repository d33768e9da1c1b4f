"""Fused PoPE flash attention (forward and backward) in Triton; spec: `reference.attention` with a
pope `ScoreMod` (MATH §3).

Caveat (DESIGN §8): verified against the float64 reference under TRITON_INTERPRET=1 on tiny
shapes, and on an H200 (triton 3.6) over the sweep in tests/kernels/pope/test_triton_pope.py; other
GPUs and Triton versions are unverified.

What the kernels compute, per query head h (kv head g = h // (H // G)):
    mu = amplitude(x) (softplus | relu | identity), in fp32 from the RAW D-wide q and k;
    q_hat = mu_q (cos, sin)(m theta_c - delta_hc),  k_hat = mu_k (cos, sin)(n theta_c)
    logit = scale * (<q_hat_x, k_hat_x> + <q_hat_y, k_hat_y>)                 (MATH §3.1, §3.3)
delta sits on the query phase with a minus sign (MATH §3.1: equivalent to +delta on the key
phase), so GQA keys stay shared. Angles pos * theta are formed in fp32 from integer positions and
range-reduced to [-pi, pi] before cos/sin (MATH §7.1, §7.4); the 2D-wide q_hat / k_hat exist only
in registers, never in HBM (MATH §6 "fused"); amplitude and phase helpers are in phase.py.
Softmax runs in the exp2 domain: the saved log-sum-exp `lse` is in log2 units (MATH §7.9), +inf
for a row that sees no key (its output is 0).

Masking is by positions (key s visible to query t iff pos_k[s] <= pos_q[t]; MATH §7.6). Block
skipping needs non-decreasing positions: the host passes a per-batch "sorted" flag (computed on
the device, no sync) and the kernels bound their loops by bisection over the positions; unsorted
positions fall back to masking every block, which is still exact.

Backward (FA2 style, no atomics, hence deterministic, MATH §7.8): one kernel per key block
accumulates dK, dV over all query blocks of every query head of its GQA group, and per head the
key side's partial sums of d(delta) (d/d delta = d/d key phase), reduced on the host in a fixed
order; a second kernel per query block accumulates dQ (fp32, MATH §7.7) over the key blocks.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from phaselab.kernels.common.triton_common import (
    EXP2_MODES,
    LOG2E,
    TUNE_CACHE,
    _bisect_iters,
    _bwd_configs,
    _causal_key_range,
    _causal_query_range,
    _dot_precision,
    _exp2_tile,
    _fwd_configs,
    _pos_stride,
    _sorted_flags,
    block_d,
    do_o_rows,
    interpreting,
    pruner,
)
from phaselab.kernels.pope.phase import (
    _amplitude,
    _amplitude_grad,
    _phase_cos_sin,
    _pope_expand,
    _reload_phase,
)

AMPLITUDE_CODES = {"softplus": 0, "relu": 1, "identity": 2}
# d(delta) partial rows are sized for the narrowest key block any backward config may use
_PART_BLOCK_N = min(c.kwargs["BLOCK_N"] for c in _bwd_configs())


# ----------------------------------------------------------------------------- autotuning


_KEY = ["T", "S", "BLOCK_D", "CAUSAL", "AMP", "HAS_DELTA", "AUTOTUNE"]


def _tune(kernel: str) -> dict:
    """autotune arguments of the kernel `kernel` (its untuned tile: triton_common.TUNE_DEFAULTS)."""
    return {"key": _KEY, "prune_configs_by": {"early_config_prune": pruner(kernel)}, **TUNE_CACHE}


# ----------------------------------------------------------------------------- forward


@triton.jit
def _pope_fwd_inner(acc, l_i, m_i, b_qx, b_qy, p_q, p_kbase, p_vbase, p_posk, p0, theta,
                    o_d, m_d, s_ks, s_vs, S, lo, hi,
                    AMP: tl.constexpr, CAUSAL: tl.constexpr, MASKED: tl.constexpr, FAST: tl.constexpr,
                    DOT_PREC: tl.constexpr, BLOCK_N: tl.constexpr, EXP2: tl.constexpr):
    for i_n in range(lo, hi):
        o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
        m_n = o_n < S
        m_kd = m_d[None, :]
        if MASKED:
            m_kd = m_n[:, None] & m_d[None, :]
        b_k = tl.load(p_kbase + o_n.to(tl.int64)[:, None] * s_ks + o_d[None, :], mask=m_kd, other=0.0)
        b_v = tl.load(p_vbase + o_n.to(tl.int64)[:, None] * s_vs + o_d[None, :], mask=m_kd, other=0.0)
        b_pk = tl.load(p_posk + o_n, mask=m_n, other=0)
        c, s = _phase_cos_sin(b_pk - p0, theta, theta * 0.0, FAST)
        kx, ky, _ = _pope_expand(b_k.to(tl.float32), c, s, m_d, AMP, FAST)
        # [BM, BD] @ [BD, BN] -> [BM, BN], twice: the 2D-wide dot of MATH §3.3 (log2 units)
        b_s = tl.dot(b_qx, tl.trans(kx.to(b_qx.dtype)), input_precision=DOT_PREC)
        b_s = tl.dot(b_qy, tl.trans(ky.to(b_qy.dtype)), b_s, input_precision=DOT_PREC)
        if MASKED:
            vis = m_n[None, :]
            if CAUSAL:
                vis = vis & (b_pk[None, :] <= p_q[:, None])
            b_s = tl.where(vis, b_s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(b_s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no visible key yet
        b_p = _exp2_tile(b_s - m_use[:, None], EXP2)
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(b_p, 1)
        # [BM, BN] @ [BN, BD] -> [BM, BD]
        acc = tl.dot(b_p.to(b_v.dtype), b_v, acc * alpha[:, None], input_precision=DOT_PREC)
        m_i = m_new
    return acc, l_i, m_i


@triton.autotune(configs=_fwd_configs(), **_tune("pope_fwd"))
@triton.jit(do_not_specialize=["T", "S", "n_iter_s"])
def pope_fwd_kernel(q, k, v, o, lse, pos_q, pos_k, k_sorted, inv_freq, delta,
                    s_qb, s_qh, s_qt, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs, s_ob, s_oh, s_ot,
                    s_pqb, s_pkb, s_srt,
                    T, S, H, GROUP, qk_scale, n_iter_s,
                    D: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, AMP: tl.constexpr,
                    HAS_DELTA: tl.constexpr, FAST: tl.constexpr, DOT_PREC: tl.constexpr,
                    EXP2: tl.constexpr, AUTOTUNE: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    i_m, i_bh = tl.program_id(0), tl.program_id(1)
    qk_scale = tl.cast(qk_scale, tl.float32)  # may arrive fp64 (kernels/tapa/triton_tapa.py `_fp32_scalars`)
    i_b, i_h = i_bh // H, i_bh % H
    i_g = i_h // GROUP
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_d = tl.arange(0, BLOCK_D)
    m_m, m_d = o_m < T, o_d < D
    p_q = q + i_b.to(tl.int64) * s_qb + i_h.to(tl.int64) * s_qh
    p_kbase = k + i_b.to(tl.int64) * s_kb + i_g.to(tl.int64) * s_kh
    p_vbase = v + i_b.to(tl.int64) * s_vb + i_g.to(tl.int64) * s_vh
    p_posq = pos_q + i_b.to(tl.int64) * s_pqb
    p_posk = pos_k + i_b.to(tl.int64) * s_pkb
    p0 = tl.load(p_posk)  # phase origin of this batch row (phase._phase_cos_sin)

    theta = tl.load(inv_freq + o_d, mask=m_d, other=0.0)
    bias = theta * 0.0
    if HAS_DELTA:
        bias = tl.load(delta + i_h * D + o_d, mask=m_d, other=0.0)
    b_pq = tl.load(p_posq + o_m, mask=m_m, other=0)
    b_q = tl.load(p_q + o_m.to(tl.int64)[:, None] * s_qt + o_d[None, :], mask=m_m[:, None] & m_d[None, :], other=0.0)
    c, s = _phase_cos_sin(b_pq - p0, theta, bias, FAST)
    qx, qy, _ = _pope_expand(b_q.to(tl.float32), c, s, m_d, AMP, FAST)
    b_qx = (qx * qk_scale).to(q.dtype.element_ty)  # scale * log2(e) folded into q (MATH §7.9)
    b_qy = (qy * qk_scale).to(q.dtype.element_ty)

    n_blocks = tl.cdiv(S, BLOCK_N)
    if CAUSAL:
        mid, hi = _causal_key_range(p_posq, p_posk, b_pq, m_m, k_sorted, i_b, s_srt, i_m, S, n_iter_s,
                                    BLOCK_M, BLOCK_N)
    else:
        mid = S // BLOCK_N
        hi = n_blocks

    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + float("-inf")
    # fully visible key blocks first (no mask), then the diagonal / tail blocks (DESIGN §7 ex. 6)
    acc, l_i, m_i = _pope_fwd_inner(acc, l_i, m_i, b_qx, b_qy, b_pq, p_kbase, p_vbase, p_posk, p0, theta,
                                    o_d, m_d, s_ks, s_vs, S, 0, mid, AMP, CAUSAL, False, FAST, DOT_PREC,
                                    BLOCK_N, EXP2)
    acc, l_i, m_i = _pope_fwd_inner(acc, l_i, m_i, b_qx, b_qy, b_pq, p_kbase, p_vbase, p_posk, p0, theta,
                                    o_d, m_d, s_ks, s_vs, S, mid, hi, AMP, CAUSAL, True, FAST, DOT_PREC,
                                    BLOCK_N, EXP2)
    empty = l_i == 0.0
    b_o = acc / tl.where(empty, 1.0, l_i)[:, None]
    b_lse = tl.where(empty, float("inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
    p_o = o + i_b.to(tl.int64) * s_ob + i_h.to(tl.int64) * s_oh
    tl.store(p_o + o_m.to(tl.int64)[:, None] * s_ot + o_d[None, :], b_o.to(o.dtype.element_ty),
             mask=m_m[:, None] & m_d[None, :])
    tl.store(lse + i_bh.to(tl.int64) * T + o_m, b_lse, mask=m_m)


# ----------------------------------------------------------------------------- backward: dK, dV


@triton.jit
def _pope_bwd_inner_dkdv(dkx, dky, dv, b_kx, b_ky, b_v, b_pk, m_n, p_qbase, p_dobase, p_lse, p_dlt,
                         p_posq, p0, theta, bias, o_d, m_d, s_qt, s_dot, T, lo, hi, qk_scale,
                         AMP: tl.constexpr, CAUSAL: tl.constexpr, MASKED: tl.constexpr,
                         FAST: tl.constexpr, DOT_PREC: tl.constexpr, BLOCK_M: tl.constexpr, EXP2: tl.constexpr):
    for i_m in range(lo, hi):
        o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
        m_m = o_m < T
        m_qd = m_d[None, :]
        if MASKED:
            m_qd = m_m[:, None] & m_d[None, :]
        b_q = tl.load(p_qbase + o_m.to(tl.int64)[:, None] * s_qt + o_d[None, :], mask=m_qd, other=0.0)
        b_do = tl.load(p_dobase + o_m.to(tl.int64)[:, None] * s_dot + o_d[None, :], mask=m_qd, other=0.0)
        b_pq = tl.load(p_posq + o_m, mask=m_m, other=0)
        b_lse = tl.load(p_lse + o_m, mask=m_m, other=float("inf"))
        b_dlt = tl.load(p_dlt + o_m, mask=m_m, other=0.0)
        c, s = _phase_cos_sin(b_pq - p0, theta, bias, FAST)
        qx, qy, _ = _pope_expand(b_q.to(tl.float32), c, s, m_d, AMP, FAST)
        b_qx = (qx * qk_scale).to(b_kx.dtype)
        b_qy = (qy * qk_scale).to(b_kx.dtype)
        # [BN, BD] @ [BD, BM] -> [BN, BM]
        b_st = tl.dot(b_kx, tl.trans(b_qx), input_precision=DOT_PREC)
        b_st = tl.dot(b_ky, tl.trans(b_qy), b_st, input_precision=DOT_PREC)
        b_pt = _exp2_tile(b_st - b_lse[None, :], EXP2)
        if MASKED:
            vis = m_n[:, None] & m_m[None, :]
            if CAUSAL:
                vis = vis & (b_pk[:, None] <= b_pq[None, :])
            b_pt = tl.where(vis, b_pt, 0.0)
        # [BN, BM] @ [BM, BD] -> [BN, BD]
        dv = tl.dot(b_pt.to(b_do.dtype), b_do, dv, input_precision=DOT_PREC)
        # [BN, BD] @ [BD, BM] -> [BN, BM]
        b_dpt = tl.dot(b_v, tl.trans(b_do), input_precision=DOT_PREC)
        b_dst = (b_pt * (b_dpt - b_dlt[None, :])).to(b_kx.dtype)
        # [BN, BM] @ [BM, BD] -> [BN, BD]
        dkx = tl.dot(b_dst, b_qx, dkx, input_precision=DOT_PREC)
        dky = tl.dot(b_dst, b_qy, dky, input_precision=DOT_PREC)
    return dkx, dky, dv


# The autotuner times every config on the real arguments: a config with larger key blocks would
# leave the d(delta) rows of a smaller one behind, so the buffer is zeroed before each run.
@triton.autotune(configs=_bwd_configs(), **_tune("pope_dkdv"), reset_to_zero=["ddelta_part"])
@triton.jit(do_not_specialize=["T", "S", "n_iter_t", "n_part_rows"])
def pope_bwd_kernel_dkdv(q, k, v, do, lse, dlt, dk, dv, ddelta_part, pos_q, pos_k, q_sorted, inv_freq,
                         delta, s_qb, s_qh, s_qt, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs, s_dob, s_doh, s_dot,
                         s_dkb, s_dkh, s_dks, s_pqb, s_pkb, s_srt,
                         T, S, H, GROUP, qk_scale, n_iter_t, n_part_rows,
                         D: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, AMP: tl.constexpr,
                         HAS_DELTA: tl.constexpr, FAST: tl.constexpr, DOT_PREC: tl.constexpr,
                         EXP2: tl.constexpr, AUTOTUNE: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    i_n, i_bg = tl.program_id(0), tl.program_id(1)
    qk_scale = tl.cast(qk_scale, tl.float32)  # may arrive fp64 (kernels/tapa/triton_tapa.py `_fp32_scalars`)
    G = H // GROUP
    i_b, i_g = i_bg // G, i_bg % G
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    o_d = tl.arange(0, BLOCK_D)
    m_n, m_d = o_n < S, o_d < D
    m_kd = m_n[:, None] & m_d[None, :]
    p_posq = pos_q + i_b.to(tl.int64) * s_pqb
    p_k = k + i_b.to(tl.int64) * s_kb + i_g.to(tl.int64) * s_kh + o_n.to(tl.int64)[:, None] * s_ks + o_d[None, :]
    p_v = v + i_b.to(tl.int64) * s_vb + i_g.to(tl.int64) * s_vh + o_n.to(tl.int64)[:, None] * s_vs + o_d[None, :]
    theta = tl.load(inv_freq + o_d, mask=m_d, other=0.0)
    p_posk_n = pos_k + i_b.to(tl.int64) * s_pkb + o_n
    p0 = tl.load(pos_k + i_b.to(tl.int64) * s_pkb)  # phase origin of this batch row (phase._phase_cos_sin)
    b_pk = tl.load(p_posk_n, mask=m_n, other=0)
    b_k = tl.load(p_k, mask=m_kd, other=0.0).to(tl.float32)
    b_v = tl.load(p_v, mask=m_kd, other=0.0)
    c_k, s_k = _phase_cos_sin(b_pk - p0, theta, theta * 0.0, FAST)
    kx, ky, _ = _pope_expand(b_k, c_k, s_k, m_d, AMP, FAST)
    b_kx, b_ky = kx.to(k.dtype.element_ty), ky.to(k.dtype.element_ty)

    n_qb = tl.cdiv(T, BLOCK_M)
    n_full = T // BLOCK_M
    if CAUSAL:
        lo, mid = _causal_query_range(p_posq, pos_k + i_b.to(tl.int64) * s_pkb + i_n * BLOCK_N, b_pk, m_n,
                                      q_sorted, i_b, s_srt, T, n_iter_t, BLOCK_M)
    else:
        lo = 0
        mid = 0
    dkx = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dky = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dvacc = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dd_prev = tl.zeros([BLOCK_D], dtype=tl.float32)
    for i_hg in range(GROUP):  # every query head reading this kv head: no atomics (MATH §7.8)
        i_h = i_g * GROUP + i_hg
        bias = theta * 0.0
        if HAS_DELTA:
            bias = tl.load(delta + i_h * D + o_d, mask=m_d, other=0.0)
        p_qbase = q + i_b.to(tl.int64) * s_qb + i_h.to(tl.int64) * s_qh
        p_dobase = do + i_b.to(tl.int64) * s_dob + i_h.to(tl.int64) * s_doh
        p_lse = lse + (i_b * H + i_h).to(tl.int64) * T
        p_dlt = dlt + (i_b * H + i_h).to(tl.int64) * T
        # diagonal blocks (masked), fully visible blocks, then the ragged tail block (masked)
        dkx, dky, dvacc = _pope_bwd_inner_dkdv(
            dkx, dky, dvacc, b_kx, b_ky, b_v, b_pk, m_n, p_qbase, p_dobase, p_lse, p_dlt,
            p_posq, p0, theta, bias, o_d, m_d, s_qt, s_dot, T, lo, mid, qk_scale, AMP, CAUSAL, True,
            FAST, DOT_PREC, BLOCK_M, EXP2)
        dkx, dky, dvacc = _pope_bwd_inner_dkdv(
            dkx, dky, dvacc, b_kx, b_ky, b_v, b_pk, m_n, p_qbase, p_dobase, p_lse, p_dlt,
            p_posq, p0, theta, bias, o_d, m_d, s_qt, s_dot, T, mid, n_full, qk_scale, AMP, CAUSAL, False,
            FAST, DOT_PREC, BLOCK_M, EXP2)
        dkx, dky, dvacc = _pope_bwd_inner_dkdv(
            dkx, dky, dvacc, b_kx, b_ky, b_v, b_pk, m_n, p_qbase, p_dobase, p_lse, p_dlt,
            p_posq, p0, theta, bias, o_d, m_d, s_qt, s_dot, T, tl.maximum(mid, n_full), n_qb, qk_scale, AMP, CAUSAL, True,
            FAST, DOT_PREC, BLOCK_M, EXP2)
        if HAS_DELTA:
            # d(delta) from the key side: the logit depends on m theta - delta - n theta, so
            # d/d delta = d/d(key phase) = sum_n mu_k (dk_hat_y cos - dk_hat_x sin); this head's
            # share is the change of that sum over its loops (the accumulators span the group).
            # Rows past S: unmasked tiles leave garbage there (never stored), hence the where.
            x_k, c_k, s_k = _reload_phase(p_k, m_kd, p_posk_n, m_n, p0, theta, theta * 0.0, FAST)
            mu_k = _amplitude(x_k, AMP, FAST)
            dd = tl.sum(tl.where(m_kd, mu_k * (dky * c_k - dkx * s_k), 0.0), 0)
            tl.store(ddelta_part + ((i_b * H + i_h).to(tl.int64) * n_part_rows + i_n) * BLOCK_D + o_d,
                     (dd - dd_prev) * 0.6931471805599453)
            dd_prev = dd
    # d logit / d k_hat = scale * q_hat = q_hat_scaled * ln 2 (q_hat carried scale * log2 e)
    dkx = dkx * 0.6931471805599453
    dky = dky * 0.6931471805599453
    x_k, c_k, s_k = _reload_phase(p_k, m_kd, p_posk_n, m_n, p0, theta, theta * 0.0, FAST)
    b_dk = _amplitude_grad(x_k, AMP) * (dkx * c_k + dky * s_k)
    o_dk = i_b.to(tl.int64) * s_dkb + i_g.to(tl.int64) * s_dkh + o_n.to(tl.int64)[:, None] * s_dks + o_d[None, :]
    tl.store(dk + o_dk, b_dk.to(dk.dtype.element_ty), mask=m_kd)
    tl.store(dv + o_dk, dvacc.to(dv.dtype.element_ty), mask=m_kd)


# ----------------------------------------------------------------------------- backward: dQ


@triton.jit
def _pope_bwd_inner_dq(dqx, dqy, b_qx, b_qy, b_do, b_lse, b_dlt, b_pq, p_kbase, p_vbase, p_posk, p0, theta,
                       o_d, m_d, s_ks, s_vs, S, lo, hi,
                       AMP: tl.constexpr, CAUSAL: tl.constexpr, MASKED: tl.constexpr, FAST: tl.constexpr,
                       DOT_PREC: tl.constexpr, BLOCK_N: tl.constexpr, EXP2: tl.constexpr):
    for i_n in range(lo, hi):
        o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
        m_n = o_n < S
        m_kd = m_d[None, :]
        if MASKED:
            m_kd = m_n[:, None] & m_d[None, :]
        b_k = tl.load(p_kbase + o_n.to(tl.int64)[:, None] * s_ks + o_d[None, :], mask=m_kd, other=0.0)
        b_v = tl.load(p_vbase + o_n.to(tl.int64)[:, None] * s_vs + o_d[None, :], mask=m_kd, other=0.0)
        b_pk = tl.load(p_posk + o_n, mask=m_n, other=0)
        c, s = _phase_cos_sin(b_pk - p0, theta, theta * 0.0, FAST)
        kx, ky, _ = _pope_expand(b_k.to(tl.float32), c, s, m_d, AMP, FAST)
        b_kx, b_ky = kx.to(b_qx.dtype), ky.to(b_qx.dtype)
        # [BM, BD] @ [BD, BN] -> [BM, BN]
        b_s = tl.dot(b_qx, tl.trans(b_kx), input_precision=DOT_PREC)
        b_s = tl.dot(b_qy, tl.trans(b_ky), b_s, input_precision=DOT_PREC)
        b_p = _exp2_tile(b_s - b_lse[:, None], EXP2)
        if MASKED:
            vis = m_n[None, :]
            if CAUSAL:
                vis = vis & (b_pk[None, :] <= b_pq[:, None])
            b_p = tl.where(vis, b_p, 0.0)
        # [BM, BD] @ [BD, BN] -> [BM, BN]
        b_dp = tl.dot(b_do, tl.trans(b_v), input_precision=DOT_PREC)
        b_ds = (b_p * (b_dp - b_dlt[:, None])).to(b_qx.dtype)
        # [BM, BN] @ [BN, BD] -> [BM, BD]
        dqx = tl.dot(b_ds, b_kx, dqx, input_precision=DOT_PREC)
        dqy = tl.dot(b_ds, b_ky, dqy, input_precision=DOT_PREC)
    return dqx, dqy


@triton.autotune(configs=_bwd_configs(), **_tune("pope_dq"))
@triton.jit(do_not_specialize=["T", "S", "n_iter_s"])
def pope_bwd_kernel_dq(q, k, v, do, lse, dlt, dq, pos_q, pos_k, k_sorted, inv_freq, delta,
                       s_qb, s_qh, s_qt, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs, s_dob, s_doh, s_dot,
                       s_dqb, s_dqh, s_dqt, s_pqb, s_pkb, s_srt,
                       T, S, H, GROUP, qk_scale, sm_scale, n_iter_s,
                       D: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, AMP: tl.constexpr,
                       HAS_DELTA: tl.constexpr, FAST: tl.constexpr, DOT_PREC: tl.constexpr,
                       EXP2: tl.constexpr, AUTOTUNE: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    i_m, i_bh = tl.program_id(0), tl.program_id(1)
    qk_scale = tl.cast(qk_scale, tl.float32)  # may arrive fp64 (kernels/tapa/triton_tapa.py `_fp32_scalars`)
    i_b, i_h = i_bh // H, i_bh % H
    i_g = i_h // GROUP
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_d = tl.arange(0, BLOCK_D)
    m_m, m_d = o_m < T, o_d < D
    m_qd = m_m[:, None] & m_d[None, :]
    p_posq = pos_q + i_b.to(tl.int64) * s_pqb
    p_posk = pos_k + i_b.to(tl.int64) * s_pkb
    p0 = tl.load(p_posk)  # phase origin of this batch row (phase._phase_cos_sin)
    p_kbase = k + i_b.to(tl.int64) * s_kb + i_g.to(tl.int64) * s_kh
    p_vbase = v + i_b.to(tl.int64) * s_vb + i_g.to(tl.int64) * s_vh
    theta = tl.load(inv_freq + o_d, mask=m_d, other=0.0)
    bias = theta * 0.0
    if HAS_DELTA:
        bias = tl.load(delta + i_h * D + o_d, mask=m_d, other=0.0)
    b_pq = tl.load(p_posq + o_m, mask=m_m, other=0)
    p_qrows = q + i_b.to(tl.int64) * s_qb + i_h.to(tl.int64) * s_qh + o_m.to(tl.int64)[:, None] * s_qt + o_d[None, :]
    b_q = tl.load(p_qrows, mask=m_qd, other=0.0).to(tl.float32)
    b_do = tl.load(do + i_b.to(tl.int64) * s_dob + i_h.to(tl.int64) * s_doh + o_m.to(tl.int64)[:, None] * s_dot
                   + o_d[None, :], mask=m_qd, other=0.0)
    b_lse = tl.load(lse + i_bh.to(tl.int64) * T + o_m, mask=m_m, other=float("inf"))
    b_dlt = tl.load(dlt + i_bh.to(tl.int64) * T + o_m, mask=m_m, other=0.0)
    c_q, s_q = _phase_cos_sin(b_pq - p0, theta, bias, FAST)
    qx, qy, _ = _pope_expand(b_q, c_q, s_q, m_d, AMP, FAST)
    b_qx = (qx * qk_scale).to(q.dtype.element_ty)
    b_qy = (qy * qk_scale).to(q.dtype.element_ty)

    n_blocks = tl.cdiv(S, BLOCK_N)
    if CAUSAL:
        mid, hi = _causal_key_range(p_posq, p_posk, b_pq, m_m, k_sorted, i_b, s_srt, i_m, S, n_iter_s,
                                    BLOCK_M, BLOCK_N)
    else:
        mid = S // BLOCK_N
        hi = n_blocks
    dqx = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    dqy = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    dqx, dqy = _pope_bwd_inner_dq(dqx, dqy, b_qx, b_qy, b_do, b_lse, b_dlt, b_pq, p_kbase, p_vbase, p_posk, p0, theta,
                                  o_d, m_d, s_ks, s_vs, S, 0, mid, AMP, CAUSAL, False, FAST, DOT_PREC, BLOCK_N, EXP2)
    dqx, dqy = _pope_bwd_inner_dq(dqx, dqy, b_qx, b_qy, b_do, b_lse, b_dlt, b_pq, p_kbase, p_vbase, p_posk, p0, theta,
                                  o_d, m_d, s_ks, s_vs, S, mid, hi, AMP, CAUSAL, True, FAST, DOT_PREC, BLOCK_N, EXP2)
    dqx = dqx * sm_scale  # d logit / d q_hat = scale * k_hat
    dqy = dqy * sm_scale
    x_q, c_q, s_q = _reload_phase(p_qrows, m_qd, p_posq + o_m, m_m, p0, theta, bias, FAST)
    b_dq = _amplitude_grad(x_q, AMP) * (dqx * c_q + dqy * s_q)
    tl.store(dq + i_b.to(tl.int64) * s_dqb + i_h.to(tl.int64) * s_dqh + o_m.to(tl.int64)[:, None] * s_dqt
             + o_d[None, :], b_dq.to(dq.dtype.element_ty), mask=m_qd)


# ----------------------------------------------------------------------------- host functions


def pope_fwd(q, k, v, pos_q, pos_k, inv_freq, delta, *, scale: float, causal: bool, amplitude: str,
             exp2: str = "mufu", autotune: bool = False):
    """Forward launch. q [B,H,T,D], k/v [B,G,S,D] (last dim contiguous); pos int64 [B|1, T|S];
    inv_freq fp32 [D] contiguous; delta fp32 [H, D] contiguous or None; exp2 and autotune as
    `AttentionOptions`.
    Returns out [B,H,T,D] (q's dtype) and lse [B,H,T] fp32 in log2 units."""
    B, H, T, D = q.shape
    G, S = k.shape[1], k.shape[2]
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((B, H, T), dtype=torch.float32, device=q.device)
    k_sorted = _sorted_flags(pos_k)

    def grid(meta):
        return (triton.cdiv(T, meta["BLOCK_M"]), B * H)

    pope_fwd_kernel[grid](
        q, k, v, out, lse, pos_q, pos_k, k_sorted, inv_freq, delta if delta is not None else inv_freq,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
        _pos_stride(pos_q), _pos_stride(pos_k), 0 if k_sorted.shape[0] == 1 else 1,
        T, S, H, H // G, scale * LOG2E, _bisect_iters(S),
        D=D, BLOCK_D=block_d(D), CAUSAL=causal, AMP=AMPLITUDE_CODES[amplitude], HAS_DELTA=delta is not None,
        FAST=not interpreting(), DOT_PREC=_dot_precision(q.dtype), EXP2=EXP2_MODES[exp2], AUTOTUNE=bool(autotune))
    return out, lse


def pope_bwd(do, q, k, v, out, lse, pos_q, pos_k, inv_freq, delta, *, scale: float, causal: bool,
             amplitude: str, exp2: str = "mufu", autotune: bool = False):
    """Backward launches; returns dq, dk, dv (input dtypes) and ddelta fp32 [H, D] (or None).
    An fp32-atomic dQ inside the dK/dV kernel was measured 3-6 % slower on the H200 (its registers
    spill; kernels/attention/README.md, "Measured and not shipped"), so PoPE has only this deterministic path."""
    B, H, T, D = q.shape
    G, S = k.shape[1], k.shape[2]
    do = do.contiguous()
    dlt = do_o_rows(do, out)  # Delta_t = <dO_t, O_t>, fp32 [B, H, T], one read of each
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    # d(delta) partials: one row per (batch*head, key block), zero where a block does not exist
    # (the block count depends on the tuned BLOCK_N); summed on the host in a fixed order.
    n_rows = triton.cdiv(S, _PART_BLOCK_N)
    part = torch.zeros((B, H, n_rows if delta is not None else 1, block_d(D)), dtype=torch.float32,
                       device=q.device)
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    k_sorted, q_sorted = _sorted_flags(pos_k), _sorted_flags(pos_q)
    common = {"D": D, "BLOCK_D": block_d(D), "CAUSAL": causal, "AMP": AMPLITUDE_CODES[amplitude],
              "HAS_DELTA": delta is not None, "FAST": not interpreting(), "DOT_PREC": _dot_precision(q.dtype),
              "EXP2": EXP2_MODES[exp2], "AUTOTUNE": bool(autotune)}
    delta_arg = delta if delta is not None else inv_freq
    strides = (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
               v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2))
    pope_bwd_kernel_dkdv[lambda meta: (triton.cdiv(S, meta["BLOCK_N"]), B * G)](
        q, k, v, do, lse, dlt, dk, dv, part, pos_q, pos_k, q_sorted, inv_freq, delta_arg, *strides,
        dk.stride(0), dk.stride(1), dk.stride(2), _pos_stride(pos_q), _pos_stride(pos_k),
        0 if q_sorted.shape[0] == 1 else 1, T, S, H, H // G, scale * LOG2E, _bisect_iters(T), n_rows, **common)
    ddelta = None if delta is None else part.sum(dim=(0, 2))[:, :D].contiguous()
    pope_bwd_kernel_dq[lambda meta: (triton.cdiv(T, meta["BLOCK_M"]), B * H)](
        q, k, v, do, lse, dlt, dq, pos_q, pos_k, k_sorted, inv_freq, delta_arg, *strides,
        dq.stride(0), dq.stride(1), dq.stride(2), _pos_stride(pos_q), _pos_stride(pos_k),
        0 if k_sorted.shape[0] == 1 else 1, T, S, H, H // G, scale * LOG2E, scale, _bisect_iters(S), **common)
    return dq, dk, dv, ddelta
