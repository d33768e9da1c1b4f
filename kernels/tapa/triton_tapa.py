"""Fused TAPA flash attention (forward and backward) in Triton; spec: `reference.attention` with a
tapa `ScoreMod` (MATH §4).

Caveat (DESIGN §8): verified against the float64 reference under TRITON_INTERPRET=1 on tiny
shapes, and on an H200 (triton 3.6) over the sweep in tests/kernels/tapa/test_triton_tapa.py; other
GPUs and Triton versions are unverified.

Per query head h (kv head g = h // (H // G)), with q = (q_A, q_P), D_A = int(theta D):
    A   = <q_A, k_A> / sqrt(D_A)
    Phi = <q_P, k_P> / sqrt(D_P)              (quadratic)  |  (sum q_P + sum k_P) / sqrt(D_P) (linear)
    w   = phase_scale * |m - n|^alpha          fp32, exp2(alpha log2 d) with d = 0 -> 0 (MATH §7.5)
d is formed from int64 positions taken relative to each tile's first key before any conversion
(phase._tapa_turns), so it is the correctly rounded distance at any absolute position.
    logit = scale * A * cos(w Phi)                                                   (MATH §4.2)
w Phi is unbounded. The kernels carry it in turns, t = w Phi / (2 pi), reduce t - rint(t) in fp32
(exact) and take the cosine of 2 pi times that (MATH §7.4). Away from the diagonal |m - n|^alpha
comes, in the forward, from a per-row exact power times a binomial series in the in-tile offset,
on the FMA pipe instead of the special-function unit (phase.py). The softmax is online in
the exp2 domain, lse saved in log2 units (+inf for an empty row).

Backward (MATH §4.4; FA2 style): with g = d loss / d logit,
    dA = g scale cos(w Phi),  dPhi = -g scale A w sin(w Phi);
    dq_A = sum_n dA k_A / sqrt(D_A),  dq_P = sum_n dPhi k_P / sqrt(D_P) (linear: sum_n dPhi / sqrt(D_P)
    on every phase feature); dk symmetric. Deterministic (the default): one kernel per key block
    (dK, dV over the GQA group), one per query block (dQ), no atomics, as in kernels/pope/triton_pope.py.
    deterministic=False: the dK/dV kernel also adds each tile's dQ share with fp32 atomics and the
    dQ kernel is not launched (`_atomic_dq`). Shared helpers: triton_common.py.
"""

from __future__ import annotations

import math

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
from phaselab.kernels.tapa.phase import (
    _block_pos,
    _row_range,
    _tapa_grads,
    _tapa_score,
    _taylor,
)

_KEY = ["T", "S", "BLOCK_A", "BLOCK_P", "CAUSAL", "LINEAR", "AUTOTUNE"]


def _tune(kernel: str) -> dict:
    """autotune arguments of the kernel `kernel` (its untuned tile: triton_common.TUNE_DEFAULTS)."""
    return {"key": _KEY, "prune_configs_by": {"early_config_prune": pruner(kernel)}, **TUNE_CACHE}


@triton.jit
def _fp32_scalars(c_a, alpha, k_turn, u_max, c1, c2, c3, c4, c5, qk_scale):
    """The float arguments as fp32: torch.compile's launcher may pass Python floats as fp64, which
    would turn the online-softmax carries into fp64 (a Triton compile error, seen on the H200) and
    run the series in fp64."""
    return (tl.cast(c_a, tl.float32), tl.cast(alpha, tl.float32), tl.cast(k_turn, tl.float32),
            tl.cast(u_max, tl.float32), tl.cast(c1, tl.float32), tl.cast(c2, tl.float32),
            tl.cast(c3, tl.float32), tl.cast(c4, tl.float32), tl.cast(c5, tl.float32),
            tl.cast(qk_scale, tl.float32))


@triton.jit
def _load_split(p_base, o_r, m_r, s_r, o_a, o_p, DA: tl.constexpr, DP: tl.constexpr, MASK_ROWS: tl.constexpr):
    """Rows o_r of a [*, D] head, split into the amplitude [R, BA] and phase [R, BP] parts."""
    m_a = o_a[None, :] < DA
    m_p = o_p[None, :] < DP
    if MASK_ROWS:
        m_a = m_a & m_r[:, None]
        m_p = m_p & m_r[:, None]
    p_row = p_base + o_r.to(tl.int64)[:, None] * s_r
    b_a = tl.load(p_row + o_a[None, :], mask=m_a, other=0.0)
    b_p = tl.load(p_row + DA + o_p[None, :], mask=m_p, other=0.0)
    return b_a, b_p


# ----------------------------------------------------------------------------- forward


@triton.jit
def _tapa_fwd_inner(acc, l_i, m_i, b_qa, b_qp, sq, b_pq, q_lo, q_hi, p_kbase, p_vbase, p_posk, o_a, o_p, o_v,
                    s_ks, s_vs, S, lo, hi, c_a, alpha, k_turn, u_max, c1, c2, c3, c4, c5, qk_scale,
                    D: tl.constexpr, DA: tl.constexpr, DP: tl.constexpr, CAUSAL: tl.constexpr,
                    MASKED: tl.constexpr, LINEAR: tl.constexpr, FAST: tl.constexpr,
                    DOT_PREC: tl.constexpr, BLOCK_N: tl.constexpr, SERIES: tl.constexpr, EXP2: tl.constexpr):
    for i_n in range(lo, hi):
        o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
        m_n = o_n < S
        b_ka, b_kp = _load_split(p_kbase, o_n, m_n, s_ks, o_a, o_p, DA, DP, MASKED)
        m_v = o_v[None, :] < D
        if MASKED:
            m_v = m_v & m_n[:, None]
        b_v = tl.load(p_vbase + o_n.to(tl.int64)[:, None] * s_vs + o_v[None, :], mask=m_v, other=0.0)
        b_pk, k_lo, k_hi = _block_pos(p_posk, i_n * BLOCK_N, BLOCK_N, S, MASKED)
        sk = tl.sum(b_kp.to(tl.float32), 1)
        b_a, _w, c, _s = _tapa_score(b_qa, b_qp, sq, b_ka, b_kp, sk, b_pq, b_pk, q_lo, q_hi, k_lo, k_hi,
                                     alpha, k_turn, u_max,
                                     c1, c2, c3, c4, c5, LINEAR, MASKED, SERIES, FAST, DOT_PREC)
        b_s = b_a * c  # q_A carries c_a * scale * log2 e (tapa_fwd_kernel)
        if MASKED:
            vis = m_n[None, :]
            if CAUSAL:
                vis = vis & (b_pk[None, :] <= b_pq[:, None])
            b_s = tl.where(vis, b_s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(b_s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        b_p = _exp2_tile(b_s - m_use[:, None], EXP2)
        alpha_r = tl.exp2(m_i - m_use)
        l_i = l_i * alpha_r + tl.sum(b_p, 1)
        # [BM, BN] @ [BN, BV] -> [BM, BV]
        acc = tl.dot(b_p.to(b_v.dtype), b_v, acc * alpha_r[:, None], input_precision=DOT_PREC)
        m_i = m_new
    return acc, l_i, m_i


@triton.autotune(configs=_fwd_configs(), **_tune("tapa_fwd"))
@triton.jit(do_not_specialize=["T", "S", "n_iter_s"])
def tapa_fwd_kernel(q, k, v, o, lse, pos_q, pos_k, k_sorted,
                    s_qb, s_qh, s_qt, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs, s_ob, s_oh, s_ot,
                    s_pqb, s_pkb, s_srt, T, S, H, GROUP, c_a, alpha, k_turn, u_max, c1, c2, c3, c4, c5,
                    qk_scale, n_iter_s,
                    D: tl.constexpr, DA: tl.constexpr, DP: tl.constexpr, BLOCK_A: tl.constexpr,
                    BLOCK_P: tl.constexpr, BLOCK_V: tl.constexpr, CAUSAL: tl.constexpr, LINEAR: tl.constexpr,
                    FAST: tl.constexpr, DOT_PREC: tl.constexpr, SERIES: tl.constexpr, EXP2: tl.constexpr,
                    AUTOTUNE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    i_m, i_bh = tl.program_id(0), tl.program_id(1)
    c_a, alpha, k_turn, u_max, c1, c2, c3, c4, c5, qk_scale = _fp32_scalars(
        c_a, alpha, k_turn, u_max, c1, c2, c3, c4, c5, qk_scale)
    i_b, i_h = i_bh // H, i_bh % H
    i_g = i_h // GROUP
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_a, o_p, o_v = tl.arange(0, BLOCK_A), tl.arange(0, BLOCK_P), tl.arange(0, BLOCK_V)
    m_m = o_m < T
    p_posq = pos_q + i_b.to(tl.int64) * s_pqb
    p_posk = pos_k + i_b.to(tl.int64) * s_pkb
    p_kbase = k + i_b.to(tl.int64) * s_kb + i_g.to(tl.int64) * s_kh
    p_vbase = v + i_b.to(tl.int64) * s_vb + i_g.to(tl.int64) * s_vh
    b_qa, b_qp = _load_split(q + i_b.to(tl.int64) * s_qb + i_h.to(tl.int64) * s_qh, o_m, m_m, s_qt, o_a, o_p,
                             DA, DP, True)
    # 1/sqrt(D_A) * scale * log2 e folded into q_A once, not multiplied into every score (MATH §7.9)
    b_qa = (b_qa.to(tl.float32) * (c_a * qk_scale)).to(b_qa.dtype)
    sq = tl.sum(b_qp.to(tl.float32), 1)
    b_pq = tl.load(p_posq + o_m, mask=m_m, other=0)
    q_lo, q_hi, u_max, b_pq = _row_range(b_pq, m_m, tl.load(k_sorted + i_b * s_srt) != 0, u_max)
    if CAUSAL:
        mid, hi = _causal_key_range(p_posq, p_posk, b_pq, m_m, k_sorted, i_b, s_srt, i_m, S, n_iter_s,
                                    BLOCK_M, BLOCK_N)
    else:
        mid = S // BLOCK_N
        hi = tl.cdiv(S, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_V], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + float("-inf")
    acc, l_i, m_i = _tapa_fwd_inner(acc, l_i, m_i, b_qa, b_qp, sq, b_pq, q_lo, q_hi, p_kbase, p_vbase,
                                    p_posk, o_a, o_p,
                                    o_v,
                                    s_ks, s_vs, S, 0, mid, c_a, alpha, k_turn, u_max, c1, c2, c3, c4, c5,
                                    qk_scale, D, DA, DP,
                                    CAUSAL, False, LINEAR, FAST, DOT_PREC, BLOCK_N, SERIES, EXP2)
    acc, l_i, m_i = _tapa_fwd_inner(acc, l_i, m_i, b_qa, b_qp, sq, b_pq, q_lo, q_hi, p_kbase, p_vbase,
                                    p_posk, o_a, o_p,
                                    o_v,
                                    s_ks, s_vs, S, mid, hi, c_a, alpha, k_turn, u_max, c1, c2, c3, c4, c5,
                                    qk_scale, D, DA, DP,
                                    CAUSAL, True, LINEAR, FAST, DOT_PREC, BLOCK_N, SERIES, EXP2)
    empty = l_i == 0.0
    b_o = acc / tl.where(empty, 1.0, l_i)[:, None]
    b_lse = tl.where(empty, float("inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
    p_o = o + i_b.to(tl.int64) * s_ob + i_h.to(tl.int64) * s_oh
    tl.store(p_o + o_m.to(tl.int64)[:, None] * s_ot + o_v[None, :], b_o.to(o.dtype.element_ty),
             mask=m_m[:, None] & (o_v[None, :] < D))
    tl.store(lse + i_bh.to(tl.int64) * T + o_m, b_lse, mask=m_m)


# ----------------------------------------------------------------------------- backward


@triton.jit
def _tapa_bwd_inner_dkdv(dka, dkp, dks, dv, b_ka, b_kp, sk, b_v, b_pk, k_lo, k_hi, m_n, p_qbase, p_dobase,
                         p_lse, p_dlt, p_dqbase, s_dqt,
                         p_posq, o_a, o_p, o_v, s_qt, s_dot, T, lo, hi, c_a, alpha, k_turn, u_max, c1, c2,
                         c3, c4, c5, sm_scale,
                         qk_scale, D: tl.constexpr, DA: tl.constexpr, DP: tl.constexpr, CAUSAL: tl.constexpr,
                         MASKED: tl.constexpr, LINEAR: tl.constexpr, FAST: tl.constexpr,
                         DOT_PREC: tl.constexpr, BLOCK_M: tl.constexpr, ATOMIC_DQ: tl.constexpr, EXP2: tl.constexpr):
    for i_m in range(lo, hi):
        o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
        m_m = o_m < T
        b_qa, b_qp = _load_split(p_qbase, o_m, m_m, s_qt, o_a, o_p, DA, DP, MASKED)
        m_do = o_v[None, :] < D
        if MASKED:
            m_do = m_do & m_m[:, None]
        b_do = tl.load(p_dobase + o_m.to(tl.int64)[:, None] * s_dot + o_v[None, :], mask=m_do, other=0.0)
        b_pq, q_lo, q_hi = _block_pos(p_posq, i_m * BLOCK_M, BLOCK_M, T, MASKED)
        b_lse = tl.load(p_lse + o_m, mask=m_m, other=float("inf"))
        b_dlt = tl.load(p_dlt + o_m, mask=m_m, other=0.0)
        vis = m_m[:, None] & m_n[None, :]
        if CAUSAL:
            vis = vis & (b_pk[None, :] <= b_pq[:, None])
        sq = tl.sum(b_qp.to(tl.float32), 1)
        b_p, g_a, g_p = _tapa_grads(b_qa, b_qp, sq, b_ka, b_kp, sk, b_v, b_do, b_lse, b_dlt, b_pq, b_pk,
                                    q_lo, q_hi, k_lo, k_hi, vis,
                                    c_a, alpha, k_turn, u_max, c1, c2, c3, c4, c5, sm_scale, qk_scale,
                                    LINEAR, MASKED, FAST,
                                    DOT_PREC, EXP2)
        # [BN, BM] @ [BM, BV] -> [BN, BV]
        dv = tl.dot(tl.trans(b_p).to(b_do.dtype), b_do, dv, input_precision=DOT_PREC)
        # [BN, BM] @ [BM, BA] -> [BN, BA]
        dka = tl.dot(tl.trans(g_a).to(b_qa.dtype), b_qa, dka, input_precision=DOT_PREC)
        if LINEAR:
            dks += tl.sum(g_p, 0)
        else:
            # [BN, BM] @ [BM, BP] -> [BN, BP]
            dkp = tl.dot(tl.trans(g_p).to(b_qp.dtype), b_qp, dkp, input_precision=DOT_PREC)
        if ATOMIC_DQ:
            _atomic_dq(p_dqbase, s_dqt, o_m, m_m, o_a, o_p, g_a, g_p, b_ka, b_kp, DA, DP, LINEAR, DOT_PREC)
    return dka, dkp, dks, dv


@triton.jit
def _atomic_dq(p_dqbase, s_dqt, o_m, m_m, o_a, o_p, g_a, g_p, b_ka, b_kp, DA: tl.constexpr, DP: tl.constexpr,
               LINEAR: tl.constexpr, DOT_PREC: tl.constexpr):
    """This key block's share of dQ, added in fp32 with atomics (the non-deterministic mode: one
    backward kernel instead of two, S and P recomputed once; MATH §7.7, §7.8; FA2's dQ)."""
    p_row = p_dqbase + o_m.to(tl.int64)[:, None] * s_dqt
    # [BM, BN] @ [BN, BA] -> [BM, BA]
    dqa = tl.dot(g_a.to(b_ka.dtype), b_ka, input_precision=DOT_PREC)
    tl.atomic_add(p_row + o_a[None, :], dqa, mask=m_m[:, None] & (o_a[None, :] < DA), sem="relaxed")
    if LINEAR:
        # [BM] -> [BM, BP]: the linear phase's gradient reaches every phase feature alike
        dqp = tl.sum(g_p, 1)[:, None] + tl.zeros([g_p.shape[0], b_kp.shape[1]], dtype=tl.float32)
    else:
        # [BM, BN] @ [BN, BP] -> [BM, BP]
        dqp = tl.dot(g_p.to(b_kp.dtype), b_kp, input_precision=DOT_PREC)
    tl.atomic_add(p_row + DA + o_p[None, :], dqp, mask=m_m[:, None] & (o_p[None, :] < DP), sem="relaxed")


# The autotuner times every config on the real arguments: in the atomic mode each timing run would
# add its dQ share again, so dq32 is zeroed before each; ATOMIC_DQ is in the key (two kernels).
# Untuned, 32x64 first: the autotuner's pick at the 124M model's shape (B 32, H 12, N 1024, D 64),
# 11.82 against 16.49 ms a training step at 64x64 (benchmarks/results/train-h200-autotune.md,
# train-h200-tapa-profile.md), for widths without a TUNE_DEFAULTS tile (triton_common.untuned_pick).
@triton.autotune(configs=_bwd_configs(first=(32, 64, 4, 2)), **(_tune("tapa_dkdv") | {"key": [*_KEY, "ATOMIC_DQ"]}),
                 reset_to_zero=["dq32"])
@triton.jit(do_not_specialize=["T", "S", "n_iter_t"])
def tapa_bwd_kernel_dkdv(q, k, v, do, lse, dlt, dk, dv, dq32, pos_q, pos_k, q_sorted,
                         s_qb, s_qh, s_qt, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs, s_dob, s_doh, s_dot,
                         s_dkb, s_dkh, s_dks, s_dqb, s_dqh, s_dqt, s_pqb, s_pkb, s_srt,
                         T, S, H, GROUP, c_a, alpha, k_turn, u_max, c1, c2, c3, c4, c5, sm_scale, qk_scale,
                         n_iter_t,
                         D: tl.constexpr, DA: tl.constexpr, DP: tl.constexpr, BLOCK_A: tl.constexpr,
                         BLOCK_P: tl.constexpr, BLOCK_V: tl.constexpr, CAUSAL: tl.constexpr,
                         LINEAR: tl.constexpr, FAST: tl.constexpr, DOT_PREC: tl.constexpr,
                         ATOMIC_DQ: tl.constexpr, EXP2: tl.constexpr, AUTOTUNE: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    i_n, i_bg = tl.program_id(0), tl.program_id(1)
    c_a, alpha, k_turn, u_max, c1, c2, c3, c4, c5, qk_scale = _fp32_scalars(
        c_a, alpha, k_turn, u_max, c1, c2, c3, c4, c5, qk_scale)
    sm_scale = tl.cast(sm_scale, tl.float32)
    G = H // GROUP
    i_b, i_g = i_bg // G, i_bg % G
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    o_a, o_p, o_v = tl.arange(0, BLOCK_A), tl.arange(0, BLOCK_P), tl.arange(0, BLOCK_V)
    m_n = o_n < S
    p_posq = pos_q + i_b.to(tl.int64) * s_pqb
    p_kbase = k + i_b.to(tl.int64) * s_kb + i_g.to(tl.int64) * s_kh
    b_ka, b_kp = _load_split(p_kbase, o_n, m_n, s_ks, o_a, o_p, DA, DP, True)
    sk = tl.sum(b_kp.to(tl.float32), 1)
    m_v = m_n[:, None] & (o_v[None, :] < D)
    b_v = tl.load(v + i_b.to(tl.int64) * s_vb + i_g.to(tl.int64) * s_vh + o_n.to(tl.int64)[:, None] * s_vs
                  + o_v[None, :], mask=m_v, other=0.0)
    b_pk = tl.load(pos_k + i_b.to(tl.int64) * s_pkb + o_n, mask=m_n, other=0)
    k_lo, k_hi, u_max, b_pk = _row_range(b_pk, m_n, tl.load(q_sorted + i_b * s_srt) != 0, u_max)
    n_qb = tl.cdiv(T, BLOCK_M)
    n_full = T // BLOCK_M
    if CAUSAL:
        lo, mid = _causal_query_range(p_posq, pos_k + i_b.to(tl.int64) * s_pkb + i_n * BLOCK_N, b_pk, m_n,
                                      q_sorted, i_b, s_srt, T, n_iter_t, BLOCK_M)
    else:
        lo = 0
        mid = 0
    dka = tl.zeros([BLOCK_N, BLOCK_A], dtype=tl.float32)
    dkp = tl.zeros([BLOCK_N, BLOCK_P], dtype=tl.float32)
    dks = tl.zeros([BLOCK_N], dtype=tl.float32)
    dvacc = tl.zeros([BLOCK_N, BLOCK_V], dtype=tl.float32)
    for i_hg in range(GROUP):  # every query head of the GQA group: dK, dV without atomics (MATH §7.8)
        i_h = i_g * GROUP + i_hg
        p_dqbase = dq32 + i_b.to(tl.int64) * s_dqb + i_h.to(tl.int64) * s_dqh
        p_qbase = q + i_b.to(tl.int64) * s_qb + i_h.to(tl.int64) * s_qh
        p_dobase = do + i_b.to(tl.int64) * s_dob + i_h.to(tl.int64) * s_doh
        p_lse = lse + (i_b * H + i_h).to(tl.int64) * T
        p_dlt = dlt + (i_b * H + i_h).to(tl.int64) * T
        dka, dkp, dks, dvacc = _tapa_bwd_inner_dkdv(
            dka, dkp, dks, dvacc, b_ka, b_kp, sk, b_v, b_pk, k_lo, k_hi, m_n, p_qbase, p_dobase, p_lse,
            p_dlt, p_dqbase, s_dqt, p_posq,
            o_a, o_p, o_v, s_qt, s_dot, T, lo, mid, c_a, alpha, k_turn, u_max, c1, c2, c3, c4, c5, sm_scale,
            qk_scale,
            D, DA, DP, CAUSAL, True, LINEAR, FAST, DOT_PREC, BLOCK_M, ATOMIC_DQ, EXP2)
        dka, dkp, dks, dvacc = _tapa_bwd_inner_dkdv(
            dka, dkp, dks, dvacc, b_ka, b_kp, sk, b_v, b_pk, k_lo, k_hi, m_n, p_qbase, p_dobase, p_lse,
            p_dlt, p_dqbase, s_dqt, p_posq,
            o_a, o_p, o_v, s_qt, s_dot, T, mid, n_full, c_a, alpha, k_turn, u_max, c1, c2, c3, c4, c5,
            sm_scale, qk_scale,
            D, DA, DP, CAUSAL, False, LINEAR, FAST, DOT_PREC, BLOCK_M, ATOMIC_DQ, EXP2)
        dka, dkp, dks, dvacc = _tapa_bwd_inner_dkdv(
            dka, dkp, dks, dvacc, b_ka, b_kp, sk, b_v, b_pk, k_lo, k_hi, m_n, p_qbase, p_dobase, p_lse,
            p_dlt, p_dqbase, s_dqt, p_posq,
            o_a, o_p, o_v, s_qt, s_dot, T, tl.maximum(mid, n_full), n_qb, c_a, alpha, k_turn, u_max, c1, c2,
            c3, c4, c5,
            sm_scale, qk_scale, D, DA, DP, CAUSAL, True, LINEAR, FAST, DOT_PREC, BLOCK_M, ATOMIC_DQ, EXP2)
    if LINEAR:
        dkp = dkp + dks[:, None]
    p_dk = dk + i_b.to(tl.int64) * s_dkb + i_g.to(tl.int64) * s_dkh + o_n.to(tl.int64)[:, None] * s_dks
    tl.store(p_dk + o_a[None, :], dka.to(dk.dtype.element_ty), mask=m_n[:, None] & (o_a[None, :] < DA))
    tl.store(p_dk + DA + o_p[None, :], dkp.to(dk.dtype.element_ty), mask=m_n[:, None] & (o_p[None, :] < DP))
    p_dv = dv + i_b.to(tl.int64) * s_dkb + i_g.to(tl.int64) * s_dkh + o_n.to(tl.int64)[:, None] * s_dks
    tl.store(p_dv + o_v[None, :], dvacc.to(dv.dtype.element_ty), mask=m_v)


@triton.jit
def _tapa_bwd_inner_dq(dqa, dqp, dqs, b_qa, b_qp, sq, b_do, b_lse, b_dlt, b_pq, q_lo, q_hi, m_m, p_kbase,
                       p_vbase, p_posk,
                       o_a, o_p, o_v, s_ks, s_vs, S, lo, hi, c_a, alpha, k_turn, u_max, c1, c2, c3, c4, c5,
                       sm_scale, qk_scale,
                       D: tl.constexpr, DA: tl.constexpr, DP: tl.constexpr, CAUSAL: tl.constexpr,
                       MASKED: tl.constexpr, LINEAR: tl.constexpr, FAST: tl.constexpr,
                       DOT_PREC: tl.constexpr, BLOCK_N: tl.constexpr, EXP2: tl.constexpr):
    for i_n in range(lo, hi):
        o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
        m_n = o_n < S
        b_ka, b_kp = _load_split(p_kbase, o_n, m_n, s_ks, o_a, o_p, DA, DP, MASKED)
        m_v = o_v[None, :] < D
        if MASKED:
            m_v = m_v & m_n[:, None]
        b_v = tl.load(p_vbase + o_n.to(tl.int64)[:, None] * s_vs + o_v[None, :], mask=m_v, other=0.0)
        b_pk, k_lo, k_hi = _block_pos(p_posk, i_n * BLOCK_N, BLOCK_N, S, MASKED)
        vis = m_m[:, None] & m_n[None, :]
        if CAUSAL:
            vis = vis & (b_pk[None, :] <= b_pq[:, None])
        sk = tl.sum(b_kp.to(tl.float32), 1)
        _b_p, g_a, g_p = _tapa_grads(b_qa, b_qp, sq, b_ka, b_kp, sk, b_v, b_do, b_lse, b_dlt, b_pq, b_pk,
                                     q_lo, q_hi, k_lo, k_hi, vis,
                                    c_a, alpha, k_turn, u_max, c1, c2, c3, c4, c5, sm_scale, qk_scale,
                                    LINEAR, MASKED, FAST,
                                    DOT_PREC, EXP2)
        # [BM, BN] @ [BN, BA] -> [BM, BA]
        dqa = tl.dot(g_a.to(b_ka.dtype), b_ka, dqa, input_precision=DOT_PREC)
        if LINEAR:
            dqs += tl.sum(g_p, 1)
        else:
            # [BM, BN] @ [BN, BP] -> [BM, BP]
            dqp = tl.dot(g_p.to(b_kp.dtype), b_kp, dqp, input_precision=DOT_PREC)
    return dqa, dqp, dqs


@triton.autotune(configs=_bwd_configs(), **_tune("tapa_dq"))
@triton.jit(do_not_specialize=["T", "S", "n_iter_s"])
def tapa_bwd_kernel_dq(q, k, v, do, lse, dlt, dq, pos_q, pos_k, k_sorted,
                       s_qb, s_qh, s_qt, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs, s_dob, s_doh, s_dot,
                       s_dqb, s_dqh, s_dqt, s_pqb, s_pkb, s_srt,
                       T, S, H, GROUP, c_a, alpha, k_turn, u_max, c1, c2, c3, c4, c5, sm_scale, qk_scale,
                       n_iter_s,
                       D: tl.constexpr, DA: tl.constexpr, DP: tl.constexpr, BLOCK_A: tl.constexpr,
                       BLOCK_P: tl.constexpr, BLOCK_V: tl.constexpr, CAUSAL: tl.constexpr,
                       LINEAR: tl.constexpr, FAST: tl.constexpr, DOT_PREC: tl.constexpr,
                       EXP2: tl.constexpr, AUTOTUNE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    i_m, i_bh = tl.program_id(0), tl.program_id(1)
    c_a, alpha, k_turn, u_max, c1, c2, c3, c4, c5, qk_scale = _fp32_scalars(
        c_a, alpha, k_turn, u_max, c1, c2, c3, c4, c5, qk_scale)
    sm_scale = tl.cast(sm_scale, tl.float32)
    i_b, i_h = i_bh // H, i_bh % H
    i_g = i_h // GROUP
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_a, o_p, o_v = tl.arange(0, BLOCK_A), tl.arange(0, BLOCK_P), tl.arange(0, BLOCK_V)
    m_m = o_m < T
    p_posq = pos_q + i_b.to(tl.int64) * s_pqb
    p_posk = pos_k + i_b.to(tl.int64) * s_pkb
    p_kbase = k + i_b.to(tl.int64) * s_kb + i_g.to(tl.int64) * s_kh
    p_vbase = v + i_b.to(tl.int64) * s_vb + i_g.to(tl.int64) * s_vh
    b_qa, b_qp = _load_split(q + i_b.to(tl.int64) * s_qb + i_h.to(tl.int64) * s_qh, o_m, m_m, s_qt, o_a, o_p,
                             DA, DP, True)
    sq = tl.sum(b_qp.to(tl.float32), 1)
    b_do = tl.load(do + i_b.to(tl.int64) * s_dob + i_h.to(tl.int64) * s_doh + o_m.to(tl.int64)[:,
                                                                                               None] * s_dot
                   + o_v[None, :], mask=m_m[:, None] & (o_v[None, :] < D), other=0.0)
    b_lse = tl.load(lse + i_bh.to(tl.int64) * T + o_m, mask=m_m, other=float("inf"))
    b_dlt = tl.load(dlt + i_bh.to(tl.int64) * T + o_m, mask=m_m, other=0.0)
    b_pq = tl.load(p_posq + o_m, mask=m_m, other=0)
    q_lo, q_hi, u_max, b_pq = _row_range(b_pq, m_m, tl.load(k_sorted + i_b * s_srt) != 0, u_max)
    if CAUSAL:
        mid, hi = _causal_key_range(p_posq, p_posk, b_pq, m_m, k_sorted, i_b, s_srt, i_m, S, n_iter_s,
                                    BLOCK_M, BLOCK_N)
    else:
        mid = S // BLOCK_N
        hi = tl.cdiv(S, BLOCK_N)
    dqa = tl.zeros([BLOCK_M, BLOCK_A], dtype=tl.float32)
    dqp = tl.zeros([BLOCK_M, BLOCK_P], dtype=tl.float32)
    dqs = tl.zeros([BLOCK_M], dtype=tl.float32)
    dqa, dqp, dqs = _tapa_bwd_inner_dq(dqa, dqp, dqs, b_qa, b_qp, sq, b_do, b_lse, b_dlt, b_pq, q_lo, q_hi,
                                       m_m, p_kbase,
                                       p_vbase, p_posk, o_a, o_p, o_v, s_ks, s_vs, S, 0, mid, c_a, alpha,
                                       k_turn,
                                       u_max, c1, c2, c3, c4, c5, sm_scale, qk_scale, D, DA, DP, CAUSAL,
                                       False, LINEAR, FAST,
                                       DOT_PREC, BLOCK_N, EXP2)
    dqa, dqp, dqs = _tapa_bwd_inner_dq(dqa, dqp, dqs, b_qa, b_qp, sq, b_do, b_lse, b_dlt, b_pq, q_lo, q_hi,
                                       m_m, p_kbase,
                                       p_vbase, p_posk, o_a, o_p, o_v, s_ks, s_vs, S, mid, hi, c_a, alpha,
                                       k_turn,
                                       u_max, c1, c2, c3, c4, c5, sm_scale, qk_scale, D, DA, DP, CAUSAL,
                                       True, LINEAR, FAST,
                                       DOT_PREC, BLOCK_N, EXP2)
    if LINEAR:
        dqp = dqp + dqs[:, None]
    p_dq = dq + i_b.to(tl.int64) * s_dqb + i_h.to(tl.int64) * s_dqh + o_m.to(tl.int64)[:, None] * s_dqt
    tl.store(p_dq + o_a[None, :], dqa.to(dq.dtype.element_ty), mask=m_m[:, None] & (o_a[None, :] < DA))
    tl.store(p_dq + DA + o_p[None, :], dqp.to(dq.dtype.element_ty), mask=m_m[:, None] & (o_p[None, :] < DP))


# ----------------------------------------------------------------------------- host functions


def _consts(D: int, d_amp: int, scale: float, alpha: float, phase_scale: float, linear: bool, dtype, *,
            exp2: str, autotune: bool) -> tuple:
    """Kernel scalars (c_a, alpha, k_turn, u_max, c_1..c_5) and constexprs. k_turn = phase_scale /
    (2 pi sqrt(D_P)) turns the phase into cycles (`_tapa_score`); exp2 and autotune as
    `AttentionOptions`."""
    d_phase = D - d_amp
    k_turn = phase_scale / (2.0 * math.pi * math.sqrt(d_phase))
    args = (1.0 / math.sqrt(d_amp), float(alpha), k_turn, *_taylor(float(alpha)))
    meta = {"D": D, "DA": d_amp, "DP": d_phase, "BLOCK_A": block_d(d_amp), "BLOCK_P": block_d(d_phase),
            "BLOCK_V": block_d(D), "LINEAR": linear, "FAST": not interpreting(),
            "DOT_PREC": _dot_precision(dtype), "EXP2": EXP2_MODES[exp2], "AUTOTUNE": bool(autotune)}
    return args, meta


def tapa_fwd(q, k, v, pos_q, pos_k, *, d_amp: int, alpha: float, phase_scale: float, linear: bool,
             scale: float, causal: bool, series: bool = True, exp2: str = "mufu", autotune: bool = False):
    """Forward launch. q [B,H,T,D], k/v [B,G,S,D] (last dim contiguous); pos int64 [B|1, T|S];
    series, exp2, autotune as `AttentionOptions` (tapa_series, exp2, autotune).
    Returns out [B,H,T,D] (q's dtype) and lse [B,H,T] fp32 in log2 units."""
    B, H, T, D = q.shape
    G, S = k.shape[1], k.shape[2]
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((B, H, T), dtype=torch.float32, device=q.device)
    k_sorted = _sorted_flags(pos_k)
    args, meta = _consts(D, d_amp, scale, alpha, phase_scale, linear, q.dtype, exp2=exp2, autotune=autotune)
    tapa_fwd_kernel[lambda m: (triton.cdiv(T, m["BLOCK_M"]), B * H)](
        q, k, v, out, lse, pos_q, pos_k, k_sorted,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
        _pos_stride(pos_q), _pos_stride(pos_k), 0 if k_sorted.shape[0] == 1 else 1,
        T, S, H, H // G, *args, scale * LOG2E, _bisect_iters(S), CAUSAL=causal, SERIES=bool(series), **meta)
    return out, lse


def tapa_bwd(do, q, k, v, out, lse, pos_q, pos_k, *, d_amp: int, alpha: float, phase_scale: float,
             linear: bool, scale: float, causal: bool, deterministic: bool = True, exp2: str = "mufu",
             autotune: bool = False):
    """Backward launches; returns dq, dk, dv in the input dtypes. deterministic=False adds dQ with
    fp32 atomics inside the dK/dV kernel (one kernel, S and P recomputed once, run-to-run
    differences in the last bits of dQ) instead of a second, deterministic dQ kernel. exp2 and
    autotune as `AttentionOptions` (the backward never takes the series)."""
    B, H, T, D = q.shape
    G, S = k.shape[1], k.shape[2]
    do = do.contiguous()
    dlt = do_o_rows(do, out)  # Delta_t = <dO_t, O_t>, fp32 [B, H, T], one read of each
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    # fp32 dQ accumulator of the atomic mode (never low-precision atomics: bf16/fp16 adds would lose dQ's low bits)
    dq32 = torch.zeros(q.shape if not deterministic else (1, 1, 1, 1), dtype=torch.float32, device=q.device)
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    k_sorted, q_sorted = _sorted_flags(pos_k), _sorted_flags(pos_q)
    args, meta = _consts(D, d_amp, scale, alpha, phase_scale, linear, q.dtype, exp2=exp2, autotune=autotune)
    strides = (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
               v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2))
    assert dk.stride() == dv.stride()  # dk and dv share the stride arguments below
    tapa_bwd_kernel_dkdv[lambda m: (triton.cdiv(S, m["BLOCK_N"]), B * G)](
        q, k, v, do, lse, dlt, dk, dv, dq32, pos_q, pos_k, q_sorted, *strides,
        dk.stride(0), dk.stride(1), dk.stride(2), dq32.stride(0), dq32.stride(1), dq32.stride(2),
        _pos_stride(pos_q), _pos_stride(pos_k),
        0 if q_sorted.shape[0] == 1 else 1, T, S, H, H // G, *args, scale, scale * LOG2E, _bisect_iters(T),
        CAUSAL=causal, ATOMIC_DQ=not deterministic, **meta)
    if not deterministic:
        return dq32.to(q.dtype), dk, dv
    tapa_bwd_kernel_dq[lambda m: (triton.cdiv(T, m["BLOCK_M"]), B * H)](
        q, k, v, do, lse, dlt, dq, pos_q, pos_k, k_sorted, *strides,
        dq.stride(0), dq.stride(1), dq.stride(2), _pos_stride(pos_q), _pos_stride(pos_k),
        0 if k_sorted.shape[0] == 1 else 1, T, S, H, H // G, *args, scale, scale * LOG2E, _bisect_iters(S),
        CAUSAL=causal, **meta)
    return dq, dk, dv
