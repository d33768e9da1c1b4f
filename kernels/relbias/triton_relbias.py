"""Flash attention with a distance-indexed logit bias, in Triton: forward, dK/dV, dQ and the
table's gradient. Spec: `reference.relbias_attention` (this folder).

logit(t, s) = scale * <q_t, k_s> + bias[h, pos_q[t] - pos_k[s] - d_min], bias an fp32 table
[H, Nd]; softmax in the exp2 domain with fp32 accumulation, exactly as the plain flash core
(kernels/flash/triton_flash.py), whose tile loaders, causal block bounds (fully masked key
blocks skipped, fully visible ones run unmasked), configs and pruners are reused here. Without
positions (`HAS_POS` False) they are the indices, the queries being the last T of the S keys.

Bias tiles. With consecutive positions (`pos_flags` bit 2, always with index positions) the bias
of a tile is Toeplitz, score (i, j) at table index base + i - j + BLOCK_N - 1: one strip of
BM + BN - 1 distances is loaded per tile (coalesced, 0 past the table's ends) and spread over the
tile by a `tl.gather` whose index is a compile-time pattern (`_toeplitz`; ptxas for sm_90a: the
strip rides the K/V cp.async pipeline, the spread is ~25 shared-memory loads at constant offsets
per thread and tile; the forward takes 12 instructions per score against the plain core's 10 and
the old per-score loads' 26). Other positions gather every score from the table, the index
clamped into [0, Nd) (`_gathered`; only masked pairs, probability 0, can fall outside it). The
choice is made per batch row outside the key loops, which are compiled once for each (TOEPLITZ).

The table's gradient dbias[h, d] = sum of dS over the pairs at distance d (dS = P (dP - Delta),
the logit's gradient) is reduced in the dQ kernel (`DBIAS`), which already holds dS. Each program
(b, h, query block) owns a row of `part` [B*H, n_rows, Nd]; the host sums the rows in a fixed order.
- consecutive positions: a [2B, B] tile's 3B - 1 diagonals are three blocks of B distances,
  summed by one gather that rotates each row and masked column sums (`_diag_blocks`). Key block
  j+1's strip sits B distances below key block j's, so two blocks are carried in registers into
  the next tile and the third is complete and stored once: plain stores, no atomics, dbias bitwise
  deterministic;
- other positions: dS is added to the program's row with fp32 atomics (correct, order not fixed;
  the autotuner zeroes `part` before each timed run, since atomics accumulate across runs).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from phaselab.kernels.common import triton_common
from phaselab.kernels.common.triton_common import (
    LOG2E,
    TUNE_CACHE,
    _bisect_iters,
    _dot_precision,
    _strides,
    block_d,
)
from phaselab.kernels.flash.triton_flash import (
    _load_tile,
    _pruner,
    _query_blocks,
    _query_rows,
    _store_tile,
    dkdv_configs,
    dq_configs,
    fwd_configs,
)

# ----------------------------------------------------------------------------- configs


def dbias_configs() -> list[triton.Config]:
    """dQ + d table tiles: BLOCK_M = 2 BLOCK_N (`_diag_blocks`), the flash dQ kernel's shape; the
    interpreter runs the same shape small."""
    if triton_common.interpreting():
        return [triton.Config({"BLOCK_M": 32, "BLOCK_N": 16}, num_warps=4, num_stages=1)]
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bm // 2}, num_warps=w, num_stages=s)
            for bm, w, s in [(128, 8, 3), (64, 4, 3), (128, 8, 2), (64, 8, 3)]]


# `part` has a row per (b, h, block of the smallest BLOCK_M); rows a larger block leaves stay 0
DBIAS_ROWS = min(c.kwargs["BLOCK_M"] for c in dbias_configs())


def _dbias_prune(configs, named_args, **kwargs):
    """All configs when the launch's AUTOTUNE is set; else the first, or for 128-wide heads the
    first with 8 warps (4 warps spill a 128-wide fp32 accumulator: triton_common.untuned_pick)."""
    if triton_common.autotuning(named_args, kwargs):
        return configs
    wide = [c for c in configs if c.num_warps == 8]
    width = max(kwargs.get(n, named_args.get(n)) or 0 for n in ("BLOCK_D", "BLOCK_V"))
    return wide[:1] if width >= 128 and wide else list(configs[:1])


def _tune(prune) -> dict:
    return {"key": ["T", "S", "BLOCK_D", "BLOCK_V", "CAUSAL", "HAS_POS", "AUTOTUNE"],
            "prune_configs_by": {"early_config_prune": prune}, **TUNE_CACHE}


# ----------------------------------------------------------------------------- jit helpers


@triton.jit
def _positions(p_pos, o, n, off, HAS_POS: tl.constexpr):
    """Positions of rows o (int64, 0 past the end), or the indices shifted by `off` without them."""
    if HAS_POS:
        p = tl.load(p_pos + o, mask=o < n, other=0)
    else:
        p = (o + off).to(tl.int64)
    return p


@triton.jit
def _gathered(p_tab, b_pq, b_pk, d_min, n_dist):
    """[BM, BN] fp32 bias[h, pos_q - pos_k - d_min] for any positions: one load per score, the
    index clamped into the table (the fallback of `_tile_bias`)."""
    idx = b_pq[:, None] - b_pk[None, :] - d_min
    idx = tl.minimum(tl.maximum(idx, 0), n_dist - 1).to(tl.int32)
    return tl.load(p_tab + idx)


@triton.jit
def _toeplitz(p_tab, base, n_dist, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TRANS: tl.constexpr):
    """The [BM, BN] bias tile of consecutive positions (TRANS: its [BN, BM] transpose): score
    (i, j) reads table[base + i - j + BLOCK_N - 1], so the tile is one strip of BM + BN - 1
    distances (one coalesced load, 0 past the table's ends) spread by a gather whose index is a
    compile-time pattern (ptxas: shared-memory loads at constant offsets, no index registers)."""
    L: tl.constexpr = 2 * max(BLOCK_M, BLOCK_N)  # a power of two >= BM + BN - 1
    o = base + tl.arange(0, L)
    strip = tl.load(p_tab + o, mask=(o >= 0) & (o < n_dist), other=0.0)
    if TRANS:
        k = tl.arange(0, BLOCK_M)[None, :] - tl.arange(0, BLOCK_N)[:, None] + (BLOCK_N - 1)
        out = tl.reshape(tl.gather(strip, tl.reshape(k, [BLOCK_N * BLOCK_M]), 0), [BLOCK_N, BLOCK_M])
    else:
        k = tl.arange(0, BLOCK_M)[:, None] - tl.arange(0, BLOCK_N)[None, :] + (BLOCK_N - 1)
        out = tl.reshape(tl.gather(strip, tl.reshape(k, [BLOCK_M * BLOCK_N]), 0), [BLOCK_M, BLOCK_N])
    return out


@triton.jit
def _tile_bias(p_tab, b_pq, b_pk, base, d_min, n_dist, TOEPLITZ: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, TRANS: tl.constexpr):
    """Bias tile of queries b_pq x keys b_pk (TRANS: keys x queries): with consecutive positions
    (TOEPLITZ) from the strip at table index `base` (`_toeplitz`), else score by score (`_gathered`)."""
    if TOEPLITZ:
        b = _toeplitz(p_tab, base, n_dist, BLOCK_M, BLOCK_N, TRANS)
    elif TRANS:
        b = tl.trans(_gathered(p_tab, b_pq, b_pk, d_min, n_dist))
    else:
        b = _gathered(p_tab, b_pq, b_pk, d_min, n_dist)
    return b


@triton.jit
def _consecutive(flags, i_b, s_fb, HAS_POS: tl.constexpr):
    """Whether batch row i_b's positions are consecutive from one origin (`pos_flags` bit 2;
    always with index positions): then a tile's distances are its diagonals (`_toeplitz`)."""
    if HAS_POS:
        consec = (tl.load(flags + i_b * s_fb) & 4) != 0
    else:
        consec = True
    return consec


@triton.jit
def _visible(b_pq, b_pk, o_n, S, CAUSAL: tl.constexpr):
    vis = (o_n < S)[None, :]
    if CAUSAL:
        vis = vis & (b_pk[None, :] <= b_pq[:, None])
    return vis


@triton.jit
def _diag_blocks(ds, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The diagonal sums of a [BM, BN] dS tile (BM = 2 BN) as three blocks of BN: block q, entry r
    sums the scores at strip index k = i - j + BN - 1 = q BN + r (`_toeplitz`). Row i is rotated
    by a gather (index a compile-time pattern) so that its index k lands in column k mod BN, which
    holds block i // BN's where r >= i mod BN and the next block's where r < i mod BN; masked
    column sums then give the three blocks."""
    tl.static_assert(BLOCK_M == 2 * BLOCK_N, "d table tiles: BLOCK_M = 2 BLOCK_N")
    i = tl.arange(0, BLOCK_M)[:, None]
    r = tl.arange(0, BLOCK_N)[None, :]
    src = (i * BLOCK_N + ((i - r - 1) & (BLOCK_N - 1))).to(tl.int32)
    g = tl.reshape(tl.gather(tl.reshape(ds, [BLOCK_M * BLOCK_N]), tl.reshape(src, [BLOCK_M * BLOCK_N]), 0),
                   [BLOCK_M, BLOCK_N])
    q = i // BLOCK_N + (r < (i & (BLOCK_N - 1))).to(tl.int32)  # the block of (i, r): 0, 1 or 2
    t0 = tl.sum(tl.where(q == 0, g, 0.0), 0)
    t1 = tl.sum(tl.where(q == 1, g, 0.0), 0)
    t2 = tl.sum(tl.where(q == 2, g, 0.0), 0)
    return t0, t1, t2


# ----------------------------------------------------------------------------- forward


@triton.jit
def _fwd_inner(acc, l_i, m_i, b_q, b_pq, p_kb, p_vb, p_posk, p_tab, TOEPLITZ: tl.constexpr, m0, s_ks, s_vs, T, S, d_min, n_dist,
               qk_scale, lo, hi, DK: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr,
               CAUSAL: tl.constexpr, HAS_POS: tl.constexpr, MASKED: tl.constexpr, DOT_PREC: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    for i_n in range(lo, hi):
        n0 = i_n * BLOCK_N
        o_n = n0 + tl.arange(0, BLOCK_N)
        b_k = _load_tile(p_kb, n0, S, s_ks, DK, BLOCK_N, BLOCK_D, MASKED)
        b_pk = _positions(p_posk, o_n, S, 0, HAS_POS)
        # [BM, BD] @ [BD, BN] -> [BM, BN], in log2 units
        b_s = tl.dot(b_q, tl.trans(b_k), input_precision=DOT_PREC) * qk_scale
        base = m0 - n0 + (S - T) - d_min - (BLOCK_N - 1)
        b_s += _tile_bias(p_tab, b_pq, b_pk, base, d_min, n_dist, TOEPLITZ, BLOCK_M, BLOCK_N, False) * 1.4426950408889634
        if MASKED:
            b_s = tl.where(_visible(b_pq, b_pk, o_n, S, CAUSAL), b_s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(b_s, 1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no visible key yet
        else:
            m_new = tl.maximum(m_i, tl.max(b_s, 1))
            m_use = m_new
        b_p = tl.exp2(b_s - m_use[:, None])
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(b_p, 1)
        b_v = _load_tile(p_vb, n0, S, s_vs, DV, BLOCK_N, BLOCK_V, MASKED)
        acc = tl.dot(b_p.to(b_v.dtype), b_v, acc * alpha[:, None], input_precision=DOT_PREC)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _fwd_blocks(acc, l_i, m_i, b_q, b_pq, p_kb, p_vb, p_posk, p_tab, m0, s_ks, s_vs, T, S, d_min, n_dist, qk_scale,
                mid, hi, DK: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr,
                CAUSAL: tl.constexpr, HAS_POS: tl.constexpr, DOT_PREC: tl.constexpr, TOEPLITZ: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Fully visible key blocks [0, mid) first (no mask), then the diagonal / tail blocks [mid, hi)."""
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, b_q, b_pq, p_kb, p_vb, p_posk, p_tab, TOEPLITZ, m0, s_ks, s_vs, T, S,
                               d_min, n_dist, qk_scale, 0, mid, DK, DV, BLOCK_D, BLOCK_V, CAUSAL, HAS_POS, False,
                               DOT_PREC, BLOCK_M, BLOCK_N)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, b_q, b_pq, p_kb, p_vb, p_posk, p_tab, TOEPLITZ, m0, s_ks, s_vs, T, S,
                               d_min, n_dist, qk_scale, mid, hi, DK, DV, BLOCK_D, BLOCK_V, CAUSAL, HAS_POS, True,
                               DOT_PREC, BLOCK_M, BLOCK_N)
    return acc, l_i, m_i


@triton.autotune(configs=fwd_configs(), **_tune(_pruner("fwd")))
@triton.jit(do_not_specialize=["T", "S", "n_iter_s", "d_min", "n_dist"])
def relbias_fwd_kernel(q, k, v, o, lse, tab, pos_q, pos_k, flags,
                       s_qb, s_qh, s_qt, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs, s_ob, s_oh, s_ot, s_pqb, s_pkb, s_fb,
                       T, S, H, GROUP, qk_scale, n_iter_s, d_min, n_dist,
                       DK: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr,
                       CAUSAL: tl.constexpr, HAS_POS: tl.constexpr, DOT_PREC: tl.constexpr,
                       AUTOTUNE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    i_m, i_bh = tl.program_id(0), tl.program_id(1)
    qk_scale = tl.cast(qk_scale, tl.float32)
    i_b, i_h = i_bh // H, i_bh % H
    i_g = i_h // GROUP
    m0 = i_m * BLOCK_M
    o_m = m0 + tl.arange(0, BLOCK_M)
    m_m = o_m < T
    p_kb = k + i_b.to(tl.int64) * s_kb + i_g.to(tl.int64) * s_kh
    p_vb = v + i_b.to(tl.int64) * s_vb + i_g.to(tl.int64) * s_vh
    p_tab = tab + i_h.to(tl.int64) * n_dist
    b_q = _load_tile(q + i_b.to(tl.int64) * s_qb + i_h.to(tl.int64) * s_qh, m0, T, s_qt, DK, BLOCK_M, BLOCK_D, True)
    b_pq, p_posk, mid, hi = _query_rows(pos_q, pos_k, flags, i_b, s_pqb, s_pkb, s_fb, o_m, m_m, m0, T, S, n_iter_s,
                                        CAUSAL, HAS_POS, BLOCK_M, BLOCK_N)
    b_pq = b_pq.to(tl.int64)
    consec = _consecutive(flags, i_b, s_fb, HAS_POS)
    acc = tl.zeros([BLOCK_M, BLOCK_V], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + float("-inf")
    if consec:  # the loops compiled twice: the runtime choice stays out of them
        acc, l_i, m_i = _fwd_blocks(acc, l_i, m_i, b_q, b_pq, p_kb, p_vb, p_posk, p_tab, m0, s_ks, s_vs, T, S, d_min,
                                    n_dist, qk_scale, mid, hi, DK, DV, BLOCK_D, BLOCK_V, CAUSAL, HAS_POS, DOT_PREC,
                                    True, BLOCK_M, BLOCK_N)
    else:
        acc, l_i, m_i = _fwd_blocks(acc, l_i, m_i, b_q, b_pq, p_kb, p_vb, p_posk, p_tab, m0, s_ks, s_vs, T, S, d_min,
                                    n_dist, qk_scale, mid, hi, DK, DV, BLOCK_D, BLOCK_V, CAUSAL, HAS_POS, DOT_PREC,
                                    False, BLOCK_M, BLOCK_N)
    empty = l_i == 0.0
    b_o = acc / tl.where(empty, 1.0, l_i)[:, None]
    b_lse = tl.where(empty, float("inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
    _store_tile(o + i_b.to(tl.int64) * s_ob + i_h.to(tl.int64) * s_oh, m0, T, s_ot, b_o, DV, BLOCK_M, BLOCK_V)
    tl.store(lse + i_bh.to(tl.int64) * T + o_m, b_lse, mask=m_m)


# ----------------------------------------------------------------------------- dK, dV


@triton.jit
def _dkdv_inner(dk, dv, b_k, b_v, b_pk, p_q, p_do, p_lse, p_dlt, p_posq, p_tab, TOEPLITZ: tl.constexpr, n0, s_qt, s_dot, T, S,
                d_min, n_dist, qk_scale, lo, hi, DK: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr,
                BLOCK_V: tl.constexpr, CAUSAL: tl.constexpr, HAS_POS: tl.constexpr, MASKED: tl.constexpr,
                DOT_PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    for i_m in range(lo, hi):
        m0 = i_m * BLOCK_M
        o_m = m0 + tl.arange(0, BLOCK_M)
        b_q = _load_tile(p_q, m0, T, s_qt, DK, BLOCK_M, BLOCK_D, MASKED)
        b_do = _load_tile(p_do, m0, T, s_dot, DV, BLOCK_M, BLOCK_V, MASKED)
        b_pq = _positions(p_posq, o_m, T, S - T, HAS_POS)
        if MASKED:
            b_lse = tl.load(p_lse + o_m, mask=o_m < T, other=float("inf"))  # padded rows: P = 0
            b_dlt = tl.load(p_dlt + o_m, mask=o_m < T, other=0.0)
        else:
            b_lse = tl.load(p_lse + o_m)
            b_dlt = tl.load(p_dlt + o_m)
        # [BN, BD] @ [BD, BM] -> [BN, BM]: P transposed, rows are keys
        b_st = tl.dot(b_k, tl.trans(b_q), input_precision=DOT_PREC) * qk_scale
        base = m0 - n0 + (S - T) - d_min - (BLOCK_N - 1)
        b_st += _tile_bias(p_tab, b_pq, b_pk, base, d_min, n_dist, TOEPLITZ, BLOCK_M, BLOCK_N, True) * 1.4426950408889634
        b_pt = tl.exp2(b_st - b_lse[None, :])
        if MASKED and CAUSAL:
            b_pt = tl.where(b_pk[:, None] <= b_pq[None, :], b_pt, 0.0)
        dv = tl.dot(b_pt.to(b_do.dtype), b_do, dv, input_precision=DOT_PREC)
        b_dpt = tl.dot(b_v, tl.trans(b_do), input_precision=DOT_PREC)
        b_dst = b_pt * (b_dpt - b_dlt[None, :])
        dk = tl.dot(b_dst.to(b_q.dtype), b_q, dk, input_precision=DOT_PREC)
    return dk, dv


@triton.jit
def _dkdv_blocks(dk, dv, b_k, b_v, b_pk, p_q, p_do, p_lse, p_dlt, p_posq, p_tab, n0, s_qt, s_dot, T, S, d_min,
                 n_dist, qk_scale, lo, mid, DK: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr,
                 BLOCK_V: tl.constexpr, CAUSAL: tl.constexpr, HAS_POS: tl.constexpr, DOT_PREC: tl.constexpr,
                 TOEPLITZ: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The diagonal query blocks [lo, mid) (masked), the fully visible ones, then the ragged tail
    block (masked)."""
    n_full = T // BLOCK_M
    dk, dv = _dkdv_inner(dk, dv, b_k, b_v, b_pk, p_q, p_do, p_lse, p_dlt, p_posq, p_tab, TOEPLITZ, n0, s_qt, s_dot, T,
                         S, d_min, n_dist, qk_scale, lo, mid, DK, DV, BLOCK_D, BLOCK_V, CAUSAL, HAS_POS, True,
                         DOT_PREC, BLOCK_M, BLOCK_N)
    dk, dv = _dkdv_inner(dk, dv, b_k, b_v, b_pk, p_q, p_do, p_lse, p_dlt, p_posq, p_tab, TOEPLITZ, n0, s_qt, s_dot, T,
                         S, d_min, n_dist, qk_scale, mid, n_full, DK, DV, BLOCK_D, BLOCK_V, CAUSAL, HAS_POS, False,
                         DOT_PREC, BLOCK_M, BLOCK_N)
    dk, dv = _dkdv_inner(dk, dv, b_k, b_v, b_pk, p_q, p_do, p_lse, p_dlt, p_posq, p_tab, TOEPLITZ, n0, s_qt, s_dot, T,
                         S, d_min, n_dist, qk_scale, tl.maximum(mid, n_full), tl.cdiv(T, BLOCK_M), DK, DV, BLOCK_D,
                         BLOCK_V, CAUSAL, HAS_POS, True, DOT_PREC, BLOCK_M, BLOCK_N)
    return dk, dv


@triton.autotune(configs=dkdv_configs(), **_tune(_pruner("dkdv")))
@triton.jit(do_not_specialize=["T", "S", "n_iter_t", "d_min", "n_dist"])
def relbias_dkdv_kernel(q, k, v, do, lse, dlt, dk, dv, tab, pos_q, pos_k, flags,
                        s_qb, s_qh, s_qt, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs, s_dob, s_doh, s_dot,
                        s_dkb, s_dkh, s_dks, s_dvb, s_dvh, s_dvs, s_pqb, s_pkb, s_fb,
                        T, S, H, GROUP, qk_scale, sm_scale, n_iter_t, d_min, n_dist,
                        DK: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr,
                        CAUSAL: tl.constexpr, HAS_POS: tl.constexpr, DOT_PREC: tl.constexpr,
                        AUTOTUNE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """dK, dV of one key block over every query head of its GQA group (no atomics)."""
    i_n, i_bg = tl.program_id(0), tl.program_id(1)
    qk_scale = tl.cast(qk_scale, tl.float32)
    G = H // GROUP
    i_b, i_g = i_bg // G, i_bg % G
    n0 = i_n * BLOCK_N
    o_n = n0 + tl.arange(0, BLOCK_N)
    m_n = o_n < S
    b_k = _load_tile(k + i_b.to(tl.int64) * s_kb + i_g.to(tl.int64) * s_kh, n0, S, s_ks, DK, BLOCK_N, BLOCK_D, True)
    b_v = _load_tile(v + i_b.to(tl.int64) * s_vb + i_g.to(tl.int64) * s_vh, n0, S, s_vs, DV, BLOCK_N, BLOCK_V, True)
    p_posq = pos_q + i_b.to(tl.int64) * s_pqb
    p_posk = pos_k + i_b.to(tl.int64) * s_pkb
    b_pk = _positions(p_posk, o_n, S, 0, HAS_POS)
    if HAS_POS:
        flag = tl.load(flags + i_b * s_fb)
    else:
        flag = 0
    consec = _consecutive(flags, i_b, s_fb, HAS_POS)
    if CAUSAL:
        lo, mid = _query_blocks(flag, p_posq, p_posk, b_pk, m_n, n0, T, S, n_iter_t, HAS_POS, BLOCK_M, BLOCK_N)
    else:
        lo = 0
        mid = 0
    dk_acc = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv_acc = tl.zeros([BLOCK_N, BLOCK_V], dtype=tl.float32)
    for i_hg in range(GROUP):
        i_h = i_g * GROUP + i_hg
        p_q = q + i_b.to(tl.int64) * s_qb + i_h.to(tl.int64) * s_qh
        p_do = do + i_b.to(tl.int64) * s_dob + i_h.to(tl.int64) * s_doh
        p_lse = lse + (i_b * H + i_h).to(tl.int64) * T
        p_dlt = dlt + (i_b * H + i_h).to(tl.int64) * T
        p_tab = tab + i_h.to(tl.int64) * n_dist
        if consec:  # the loops compiled twice: the runtime choice stays out of them
            dk_acc, dv_acc = _dkdv_blocks(dk_acc, dv_acc, b_k, b_v, b_pk, p_q, p_do, p_lse, p_dlt, p_posq, p_tab, n0,
                                          s_qt, s_dot, T, S, d_min, n_dist, qk_scale, lo, mid, DK, DV, BLOCK_D,
                                          BLOCK_V, CAUSAL, HAS_POS, DOT_PREC, True, BLOCK_M, BLOCK_N)
        else:
            dk_acc, dv_acc = _dkdv_blocks(dk_acc, dv_acc, b_k, b_v, b_pk, p_q, p_do, p_lse, p_dlt, p_posq, p_tab, n0,
                                          s_qt, s_dot, T, S, d_min, n_dist, qk_scale, lo, mid, DK, DV, BLOCK_D,
                                          BLOCK_V, CAUSAL, HAS_POS, DOT_PREC, False, BLOCK_M, BLOCK_N)
    _store_tile(dv + i_b.to(tl.int64) * s_dvb + i_g.to(tl.int64) * s_dvh, n0, S, s_dvs, dv_acc, DV, BLOCK_N, BLOCK_V)
    _store_tile(dk + i_b.to(tl.int64) * s_dkb + i_g.to(tl.int64) * s_dkh, n0, S, s_dks, dk_acc * sm_scale, DK,
                BLOCK_N, BLOCK_D)


# ----------------------------------------------------------------------------- dQ (+ dbias)


@triton.jit
def _dq_inner(dq, c0, c1, b_q, b_do, b_lse, b_dlt, b_pq, p_kb, p_vb, p_posk, p_tab, p_part, TOEPLITZ: tl.constexpr,
              m0, s_ks, s_vs,
              T, S, d_min, n_dist, qk_scale, lo, hi, DK: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr,
              BLOCK_V: tl.constexpr, CAUSAL: tl.constexpr, HAS_POS: tl.constexpr, MASKED: tl.constexpr,
              DOT_PREC: tl.constexpr, DBIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    for i_n in range(lo, hi):
        n0 = i_n * BLOCK_N
        o_n = n0 + tl.arange(0, BLOCK_N)
        b_k = _load_tile(p_kb, n0, S, s_ks, DK, BLOCK_N, BLOCK_D, MASKED)
        b_v = _load_tile(p_vb, n0, S, s_vs, DV, BLOCK_N, BLOCK_V, MASKED)
        b_pk = _positions(p_posk, o_n, S, 0, HAS_POS)
        base = m0 - n0 + (S - T) - d_min - (BLOCK_N - 1)
        b_s = tl.dot(b_q, tl.trans(b_k), input_precision=DOT_PREC) * qk_scale
        b_s += _tile_bias(p_tab, b_pq, b_pk, base, d_min, n_dist, TOEPLITZ, BLOCK_M, BLOCK_N, False) * 1.4426950408889634
        b_p = tl.exp2(b_s - b_lse[:, None])
        if MASKED:
            b_p = tl.where(_visible(b_pq, b_pk, o_n, S, CAUSAL), b_p, 0.0)
        b_dp = tl.dot(b_do, tl.trans(b_v), input_precision=DOT_PREC)
        b_ds = b_p * (b_dp - b_dlt[:, None])
        dq = tl.dot(b_ds.to(b_k.dtype), b_k, dq, input_precision=DOT_PREC)
        if DBIAS:
            if TOEPLITZ:
                # blocks q = 0, 1, 2 of this tile's strip start at base + q BLOCK_N; the next
                # tile's strip starts BLOCK_N lower, so block 2 is complete now (stored) and
                # blocks 0, 1 carry into the next tile's blocks 1, 2
                t0, t1, t2 = _diag_blocks(b_ds, BLOCK_M, BLOCK_N)
                o_d = base + 2 * BLOCK_N + tl.arange(0, BLOCK_N)
                tl.store(p_part + o_d, t2 + c1, mask=(o_d >= 0) & (o_d < n_dist))
                c1 = t1 + c0
                c0 = t0
            else:
                idx = b_pq[:, None] - b_pk[None, :] - d_min
                ok = (idx >= 0) & (idx < n_dist) & (b_ds != 0.0)
                tl.atomic_add(p_part + tl.minimum(tl.maximum(idx, 0), n_dist - 1), b_ds, mask=ok)
    return dq, c0, c1


@triton.jit
def _dq_blocks(dq, b_q, b_do, b_lse, b_dlt, b_pq, p_kb, p_vb, p_posk, p_tab, p_part, m0, s_ks, s_vs, T, S, d_min,
               n_dist, qk_scale, mid, hi, DK: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr,
               BLOCK_V: tl.constexpr, CAUSAL: tl.constexpr, HAS_POS: tl.constexpr, DOT_PREC: tl.constexpr,
               DBIAS: tl.constexpr, TOEPLITZ: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Key blocks [0, mid) unmasked, then [mid, hi) masked; with DBIAS and TOEPLITZ the two
    blocks of distances still carried after the last tile are stored at the end."""
    c0 = tl.zeros([BLOCK_N], dtype=tl.float32)
    c1 = tl.zeros([BLOCK_N], dtype=tl.float32)
    dq, c0, c1 = _dq_inner(dq, c0, c1, b_q, b_do, b_lse, b_dlt, b_pq, p_kb, p_vb, p_posk, p_tab, p_part, TOEPLITZ, m0,
                           s_ks, s_vs, T, S, d_min, n_dist, qk_scale, 0, mid, DK, DV, BLOCK_D, BLOCK_V, CAUSAL,
                           HAS_POS, False, DOT_PREC, DBIAS, BLOCK_M, BLOCK_N)
    dq, c0, c1 = _dq_inner(dq, c0, c1, b_q, b_do, b_lse, b_dlt, b_pq, p_kb, p_vb, p_posk, p_tab, p_part, TOEPLITZ, m0,
                           s_ks, s_vs, T, S, d_min, n_dist, qk_scale, mid, hi, DK, DV, BLOCK_D, BLOCK_V, CAUSAL,
                           HAS_POS, True, DOT_PREC, DBIAS, BLOCK_M, BLOCK_N)
    if DBIAS and TOEPLITZ:
        o_d = m0 - (hi - 1) * BLOCK_N + (S - T) - d_min - (BLOCK_N - 1) + tl.arange(0, BLOCK_N)
        tl.store(p_part + o_d, c0, mask=(o_d >= 0) & (o_d < n_dist) & (hi > 0))
        o_d += BLOCK_N
        tl.store(p_part + o_d, c1, mask=(o_d >= 0) & (o_d < n_dist) & (hi > 0))
    return dq


@triton.jit(do_not_specialize=["T", "S", "n_iter_s", "d_min", "n_dist", "n_part"])
def _dq_body(q, k, v, do, lse, dlt, dq, tab, part, pos_q, pos_k, flags,
             s_qb, s_qh, s_qt, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs, s_dob, s_doh, s_dot,
             s_dqb, s_dqh, s_dqt, s_pqb, s_pkb, s_fb,
             T, S, H, GROUP, qk_scale, sm_scale, n_iter_s, d_min, n_dist, n_part,
             DK: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr,
             CAUSAL: tl.constexpr, HAS_POS: tl.constexpr, DOT_PREC: tl.constexpr, DBIAS: tl.constexpr,
             AUTOTUNE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """dQ of one query block; DBIAS: the block's d table partial goes to row (b, h, i_m) of part."""
    i_m, i_bh = tl.program_id(0), tl.program_id(1)
    qk_scale = tl.cast(qk_scale, tl.float32)
    i_b, i_h = i_bh // H, i_bh % H
    i_g = i_h // GROUP
    m0 = i_m * BLOCK_M
    o_m = m0 + tl.arange(0, BLOCK_M)
    m_m = o_m < T
    p_kb = k + i_b.to(tl.int64) * s_kb + i_g.to(tl.int64) * s_kh
    p_vb = v + i_b.to(tl.int64) * s_vb + i_g.to(tl.int64) * s_vh
    p_tab = tab + i_h.to(tl.int64) * n_dist
    p_part = part + (i_bh.to(tl.int64) * n_part + i_m) * n_dist
    b_q = _load_tile(q + i_b.to(tl.int64) * s_qb + i_h.to(tl.int64) * s_qh, m0, T, s_qt, DK, BLOCK_M, BLOCK_D, True)
    b_do = _load_tile(do + i_b.to(tl.int64) * s_dob + i_h.to(tl.int64) * s_doh, m0, T, s_dot, DV, BLOCK_M,
                      BLOCK_V, True)
    b_lse = tl.load(lse + i_bh.to(tl.int64) * T + o_m, mask=m_m, other=float("inf"))
    b_dlt = tl.load(dlt + i_bh.to(tl.int64) * T + o_m, mask=m_m, other=0.0)
    b_pq, p_posk, mid, hi = _query_rows(pos_q, pos_k, flags, i_b, s_pqb, s_pkb, s_fb, o_m, m_m, m0, T, S, n_iter_s,
                                        CAUSAL, HAS_POS, BLOCK_M, BLOCK_N)
    b_pq = b_pq.to(tl.int64)
    consec = _consecutive(flags, i_b, s_fb, HAS_POS)
    dq_acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if consec:  # the loops compiled twice: the runtime choice stays out of them
        dq_acc = _dq_blocks(dq_acc, b_q, b_do, b_lse, b_dlt, b_pq, p_kb, p_vb, p_posk, p_tab, p_part, m0, s_ks, s_vs, T,
                            S, d_min, n_dist, qk_scale, mid, hi, DK, DV, BLOCK_D, BLOCK_V, CAUSAL, HAS_POS, DOT_PREC,
                            DBIAS, True, BLOCK_M, BLOCK_N)
    else:
        dq_acc = _dq_blocks(dq_acc, b_q, b_do, b_lse, b_dlt, b_pq, p_kb, p_vb, p_posk, p_tab, p_part, m0, s_ks, s_vs, T,
                            S, d_min, n_dist, qk_scale, mid, hi, DK, DV, BLOCK_D, BLOCK_V, CAUSAL, HAS_POS, DOT_PREC,
                            DBIAS, False, BLOCK_M, BLOCK_N)
    _store_tile(dq + i_b.to(tl.int64) * s_dqb + i_h.to(tl.int64) * s_dqh, m0, T, s_dqt, dq_acc * sm_scale, DK,
                BLOCK_M, BLOCK_D)


relbias_dq_kernel = triton.autotune(configs=dq_configs(), **_tune(_pruner("dq")))(_dq_body)
# atomics (non-consecutive positions) add into `part`: zero it before every timed run
relbias_dq_dbias_kernel = triton.autotune(configs=dbias_configs(), reset_to_zero=["part"],
                                          **_tune(_dbias_prune))(_dq_body)


# ----------------------------------------------------------------------------- host functions


def _pos_args(pos_q, pos_k, flags, dummy):
    """Position arguments; with index positions (`pos_q` None) any tensor stands in (never read)."""
    if pos_q is None:
        return dummy, dummy, dummy, 0, 0, 0
    s = (0 if p.shape[0] == 1 else p.stride(0) for p in (pos_q, pos_k, flags))
    return pos_q, pos_k, flags, *s


def _meta(q, v, causal, pos_q, autotune):
    return {"AUTOTUNE": bool(autotune), "DK": q.shape[-1], "DV": v.shape[-1], "BLOCK_D": block_d(q.shape[-1]), "BLOCK_V": block_d(v.shape[-1]),
            "CAUSAL": causal, "HAS_POS": pos_q is not None, "DOT_PREC": _dot_precision(v.dtype)}


def relbias_fwd(q, k, v, table, pos_q, pos_k, flags, d_min: int, *, scale: float, causal: bool,
                autotune: bool = False):
    """q [B,H,T,D], k and v [B,G,S,D] (last dim contiguous), table fp32 [H, Nd] contiguous,
    positions int64 [B|1, T|S] with their `triton_flash.pos_flags`, or all three None (index
    positions). autotune: time every config (`AttentionOptions.autotune`). Returns out [B,H,T,D]
    in q's dtype and lse [B,H,T] fp32 in log2 units."""
    B, H, T, _ = q.shape
    G, S = k.shape[1], k.shape[2]
    out = torch.empty((B, H, T, v.shape[-1]), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, T), dtype=torch.float32, device=q.device)
    pq, pk, fl, s_pq, s_pk, s_f = _pos_args(pos_q, pos_k, flags, lse)
    relbias_fwd_kernel[lambda meta: (triton.cdiv(T, meta["BLOCK_M"]), B * H)](
        q, k, v, out, lse, table, pq, pk, fl, *_strides(q, k, v, out), s_pq, s_pk, s_f,
        T, S, H, H // G, scale * LOG2E, _bisect_iters(S), int(d_min), table.shape[1], **_meta(q, v, causal, pos_q, autotune))
    return out, lse


def relbias_bwd(do, q, k, v, out, lse, table, pos_q, pos_k, flags, d_min: int, *, scale: float, causal: bool,
                need_dbias: bool, autotune: bool = False):
    """(dq, dk, dv) in the inputs' dtypes and dbias fp32 [H, Nd] (None unless need_dbias)."""
    B, H, T, _ = q.shape
    G, S = k.shape[1], k.shape[2]
    n_dist = table.shape[1]
    do = do if do.stride(-1) == 1 else do.contiguous()
    dlt = triton_common.do_o_rows(do, out)
    dk, dv = torch.empty(k.shape, dtype=k.dtype, device=k.device), torch.empty(v.shape, dtype=v.dtype, device=v.device)
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    pq, pk, fl, s_pq, s_pk, s_f = _pos_args(pos_q, pos_k, flags, dlt)
    meta = _meta(q, v, causal, pos_q, autotune)
    relbias_dkdv_kernel[lambda m: (triton.cdiv(S, m["BLOCK_N"]), B * G)](
        q, k, v, do, lse, dlt, dk, dv, table, pq, pk, fl, *_strides(q, k, v, do, dk, dv), s_pq, s_pk, s_f,
        T, S, H, H // G, scale * LOG2E, scale, _bisect_iters(T), int(d_min), n_dist, **meta)
    n_part = triton.cdiv(T, DBIAS_ROWS) if need_dbias else 0
    part = torch.zeros((B * H, n_part, n_dist), dtype=torch.float32, device=q.device) if need_dbias else dlt
    kernel = relbias_dq_dbias_kernel if need_dbias else relbias_dq_kernel
    kernel[lambda m: (triton.cdiv(T, m["BLOCK_M"]), B * H)](
        q, k, v, do, lse, dlt, dq, table, part, pq, pk, fl, *_strides(q, k, v, do, dq), s_pq, s_pk, s_f,
        T, S, H, H // G, scale * LOG2E, scale, _bisect_iters(S), int(d_min), n_dist, n_part, DBIAS=need_dbias,
        **meta)
    dbias = part.view(B, H, n_part, n_dist).sum(dim=(0, 2)) if need_dbias else None
    return dq, dk, dv, dbias
