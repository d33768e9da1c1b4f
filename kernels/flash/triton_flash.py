"""Flash attention core in Triton with q/k width DK and v width DV (they may differ), forward and
backward; spec: `reference.attention` with `score_mod=None` (a plain dot product of q and k).

The PoPE path of the `triton` backend runs on it with DK = 2D (q_hat, k_hat from
kernels/pope/triton_expand.py) and DV = D; with DK = DV it is plain (RoPE) attention, benchmarked against
cuDNN as `flash-plain` (benchmarks/attention.py). Autograd function and validated wrapper:
function.py.

Per query head h (kv head g = h // (H // G)): logit = scale * <q_t, k_s>; softmax over keys in fp32
in the exp2 domain (scale * log2 e multiplies the fp32 score tile, so bf16 operands are not
re-rounded); P@V and every gradient accumulate in fp32. The saved log-sum-exp `lse` [B, H, T] is in
log2 units, +inf for a row that sees no key (its output is 0).

Masking. With positions (int64 [B or 1, T] / [B or 1, S]) key s is visible to query t iff
pos_k[s] <= pos_q[t] (MATH §7.6, bottom-right when T < S); without them (None) positions are the
indices, the queries being the last T of the S keys. Fully masked blocks are skipped and fully
visible ones run without a mask: the host computes per batch row, on the device and without a
sync, whether the positions are consecutive from a common origin (then the block bounds follow
from the indices), non-decreasing (bounds by bisection) or neither (every block visited, masked).

Backward (FA2 style, no atomics, hence bitwise deterministic, MATH §7.8): one kernel per key block
accumulates dK, dV over the query blocks of every query head of its GQA group; a second one per
query block accumulates dQ; Delta_t = <dO_t, O_t> comes from a small row kernel. PoPE mode (POPE,
`chain=`): the resident operand (k in dK/dV, q in dQ) is passed raw and expanded in registers, the
streamed one as its expansion, and the epilogue stores the raw operand's gradient
(kernels/pope/triton_expand_bwd.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from phaselab.kernels.common.triton_common import (
    LOG2E,
    TUNE_CACHE,
    _bisect_iters,
    _count_le,
    _dot_precision,
    _pos_stride,
    _strides,
    autotuning,
    block_d,
    default_tile,
    do_o_rows,
    interpreting,
)
from phaselab.kernels.pope.triton_expand_bwd import (
    PopeChain,
    _chain_epilogue,
    _expand_rows,
    pope_meta,
    pope_ptrs,
)

# ----------------------------------------------------------------------------- autotuning


def _configs(rows):
    if interpreting():
        return [triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}, num_warps=4, num_stages=1)]
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s) for bm, bn, w, s in rows]


# (BLOCK_M, BLOCK_N, warps, stages), in order of preference; the autotuner times the first
# _MAIN[kind] that fit (`_fits`) and falls back to the rest only when none does (256-wide q_hat,
# PoPE at D = 128). Few configs on purpose: each one is a compile (seconds) per shape key. dK/dV
# walks queries in steps of BLOCK_M over a resident BLOCK_N key tile, dQ keys in steps of BLOCK_N
# over a resident BLOCK_M query tile (the long tile is the resident one, as in Triton's
# fused-attention tutorial). ptxas for sm_90a (Triton 3.7.1, causal bf16, q/k 64 or 128 wide, v 64):
# the main configs spill nothing, except with 128-wide q/k dK/dV 32x64 and dQ 128x32 at 4 warps
# (204 / 136 bytes); dK/dV at 64x128 / 8 warps and 64x64 / 4 warps spilled 116-400 bytes at both
# widths and were left out. With 256-wide q/k the one dK/dV config that fits spills 284 bytes.
_MAIN = {"fwd": 3, "dkdv": 3, "dq": 3}


def fwd_configs() -> list[triton.Config]:
    return _configs([(128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 8, 2), (64, 64, 4, 2)])


def dkdv_configs() -> list[triton.Config]:
    return _configs([(32, 128, 8, 3), (16, 128, 8, 3), (32, 64, 4, 3), (32, 64, 8, 3)])


def dq_configs() -> list[triton.Config]:
    return _configs([(128, 32, 8, 3), (128, 64, 8, 3), (128, 32, 4, 3), (64, 64, 4, 3), (64, 32, 8, 3)])


_SMEM_BYTES = 192 * 1024  # of the H200's 227 KB per block, leaving room for layout conversions
_ACC_REGS = 160  # fp32 accumulator + score tile registers per thread, of 255


def _fits(kind: str, c: triton.Config, bd: int, bv: int) -> bool:
    """Rough shared-memory and register budget of a config: the resident tile once, the streamed
    tiles once per stage (bf16), the fp32 accumulators and the score tile spread over the threads."""
    bm, bn, threads, st = c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], 32 * c.num_warps, c.num_stages
    smem = 2 * {"fwd": bm * bd + bn * (bd + bv) * st, "dkdv": bn * (bd + bv) + bm * (bd + bv) * st,
                "dq": bm * (bd + bv) + bn * (bd + bv) * st}[kind]
    acc = {"fwd": bm * bv, "dkdv": bn * (bd + bv), "dq": bm * bd}[kind]
    return smem <= _SMEM_BYTES and (acc + bm * bn) / threads <= _ACC_REGS


def _pruner(kind: str):
    def prune(configs, named_args, **kwargs):
        """The main configs that fit (else the fallbacks that fit, else the first given): all of
        them when the launch's AUTOTUNE is set, else the measured tile (triton_common.default_tile)
        or the first (tests and first calls compile one variant)."""
        bd, bv = (kwargs.get(n, named_args.get(n)) for n in ("BLOCK_D", "BLOCK_V"))
        main, rest = configs[:_MAIN[kind]], configs[_MAIN[kind]:]
        fit = ([c for c in main if _fits(kind, c, bd, bv)] or [c for c in rest if _fits(kind, c, bd, bv)]
               or list(configs[:1]))
        if autotuning(named_args, kwargs):
            return fit
        tile = default_tile(f"flash_{kind}", fit, named_args, kwargs)
        return [tile] if tile is not None else fit[:1]
    return prune


def _tune(kind: str) -> dict:
    return {"key": ["T", "S", "BLOCK_D", "BLOCK_V", "CAUSAL", "HAS_POS", "AUTOTUNE"] + (["POPE"] if kind != "fwd" else []),
            "prune_configs_by": {"early_config_prune": _pruner(kind)}, **TUNE_CACHE}


# ----------------------------------------------------------------------------- jit helpers


@triton.jit
def _tile_ptrs(base, row0, s_r, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """[BLOCK_R, BLOCK_C] pointers of rows row0.. (int64 row base, int32 offsets inside the tile)."""
    return (base + tl.cast(row0, tl.int64) * s_r
            + (tl.arange(0, BLOCK_R)[:, None] * s_r + tl.arange(0, BLOCK_C)[None, :]))


@triton.jit
def _load_tile(base, row0, n_rows, s_r, D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
               ROW_MASK: tl.constexpr):
    """Rows row0..row0+BLOCK_R of a [n_rows, D] matrix, zero-padded; masks only what can be out of
    range (no mask at all for a full tile of a power-of-two width)."""
    ptrs = _tile_ptrs(base, row0, s_r, BLOCK_R, BLOCK_C)
    o_c = tl.arange(0, BLOCK_C)
    if ROW_MASK:
        m = (row0 + tl.arange(0, BLOCK_R) < n_rows)[:, None]
        if D != BLOCK_C:
            m = m & (o_c < D)[None, :]
        x = tl.load(ptrs, mask=m, other=0.0)
    elif D != BLOCK_C:
        x = tl.load(ptrs, mask=(o_c < D)[None, :], other=0.0)
    else:
        x = tl.load(ptrs)
    return x


@triton.jit
def _store_tile(base, row0, n_rows, s_r, x, D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    ptrs = _tile_ptrs(base, row0, s_r, BLOCK_R, BLOCK_C)
    m = (row0 + tl.arange(0, BLOCK_R) < n_rows)[:, None] & (tl.arange(0, BLOCK_C) < D)[None, :]
    tl.store(ptrs, x.to(base.dtype.element_ty), mask=m)


@triton.jit
def _key_blocks(flag, p_posq, p_posk, b_pq, m_m, m0, T, S, n_iter_s, HAS_POS: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(mid, hi): key blocks [0, mid) are visible to every query of the block at m0, [mid, hi) to some."""
    last = tl.minimum(m0 + BLOCK_M, T) - 1
    if HAS_POS:
        if (flag & 4) != 0:  # consecutive positions: query t sees keys s <= t + S - T
            n_lo = m0 + S - T + 1
            n_hi = last + S - T + 1
        elif (flag & 1) != 0:  # non-decreasing keys: count them by bisection
            first = tl.load(p_posq + m0)
            n_lo = _count_le(p_posk, S, tl.min(tl.where(m_m, b_pq, first), 0), n_iter_s)
            n_hi = _count_le(p_posk, S, tl.max(tl.where(m_m, b_pq, first), 0), n_iter_s)
        else:
            n_lo = S * 0
            n_hi = S + 0
    else:
        n_lo = m0 + S - T + 1
        n_hi = last + S - T + 1
    n_lo = tl.minimum(tl.maximum(n_lo, 0), S)
    n_hi = tl.minimum(tl.maximum(n_hi, 0), S)
    return n_lo // BLOCK_N, tl.cdiv(n_hi, BLOCK_N)


@triton.jit
def _query_rows(pos_q, pos_k, flags, i_b, s_pqb, s_pkb, s_fb, o_m, m_m, m0, T, S, n_iter_s,
                CAUSAL: tl.constexpr, HAS_POS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(query positions, the row's key positions, mid, hi) of a query block: what the forward and
    dQ kernels share before their key loops (`_key_blocks` for mid and hi)."""
    p_posq = pos_q + i_b.to(tl.int64) * s_pqb
    p_posk = pos_k + i_b.to(tl.int64) * s_pkb
    if HAS_POS:
        b_pq = tl.load(p_posq + o_m, mask=m_m, other=0)
        flag = tl.load(flags + i_b * s_fb)
    else:
        b_pq = o_m + (S - T)
        flag = 0
    if CAUSAL:
        mid, hi = _key_blocks(flag, p_posq, p_posk, b_pq, m_m, m0, T, S, n_iter_s, HAS_POS, BLOCK_M, BLOCK_N)
    else:
        mid = S // BLOCK_N
        hi = tl.cdiv(S, BLOCK_N)
    return b_pq, p_posk, mid, hi


@triton.jit
def _query_blocks(flag, p_posq, p_posk, b_pk, m_n, n0, T, S, n_iter_t, HAS_POS: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(lo, mid) for the key block at n0: query blocks [0, lo) see none of its keys, [lo, mid) some,
    and from mid on all of them."""
    last = tl.minimum(n0 + BLOCK_N, S) - 1
    if HAS_POS:
        if (flag & 4) != 0:  # consecutive: key s is seen by queries t >= s - (S - T)
            r_lo = n0 - (S - T)
            r_full = last - (S - T)
        elif (flag & 2) != 0:  # non-decreasing queries: count those before the keys by bisection
            first = tl.load(p_posk + n0)
            r_lo = _count_le(p_posq, T, tl.min(tl.where(m_n, b_pk, first), 0) - 1, n_iter_t)
            r_full = _count_le(p_posq, T, tl.max(tl.where(m_n, b_pk, first), 0) - 1, n_iter_t)
        else:
            r_lo = T * 0
            r_full = T + 0
    else:
        r_lo = n0 - (S - T)
        r_full = last - (S - T)
    r_lo = tl.minimum(tl.maximum(r_lo, 0), T)
    r_full = tl.minimum(tl.maximum(r_full, 0), T)
    return r_lo // BLOCK_M, tl.cdiv(r_full, BLOCK_M)


# ----------------------------------------------------------------------------- forward


@triton.jit
def _keys_visible(b_pq, p_posk, n0, S, CAUSAL: tl.constexpr, HAS_POS: tl.constexpr, BLOCK_N: tl.constexpr):
    """[BM, BN] mask of the key block at n0 that the block's queries (positions b_pq) may see:
    in range and, causally, pos_k <= pos_q (key index as position without positions)."""
    o_n = n0 + tl.arange(0, BLOCK_N)
    vis = (o_n < S)[None, :]
    if CAUSAL:
        if HAS_POS:
            b_pk = tl.load(p_posk + o_n, mask=o_n < S, other=0)
        else:
            b_pk = o_n
        vis = vis & (b_pk[None, :] <= b_pq[:, None])
    return vis


@triton.jit
def _fwd_inner(acc, l_i, m_i, b_q, b_pq, p_kb, p_vb, p_posk, s_ks, s_vs, S, qk_scale, lo, hi,
               DK: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr,
               CAUSAL: tl.constexpr, HAS_POS: tl.constexpr, MASKED: tl.constexpr, DOT_PREC: tl.constexpr,
               BLOCK_N: tl.constexpr):
    for i_n in range(lo, hi):
        n0 = i_n * BLOCK_N
        b_k = _load_tile(p_kb, n0, S, s_ks, DK, BLOCK_N, BLOCK_D, MASKED)
        # [BM, BD] @ [BD, BN] -> [BM, BN], in log2 units
        b_s = tl.dot(b_q, tl.trans(b_k), input_precision=DOT_PREC) * qk_scale
        if MASKED:
            vis = _keys_visible(b_pq, p_posk, n0, S, CAUSAL, HAS_POS, BLOCK_N)
            b_s = tl.where(vis, b_s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(b_s, 1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no visible key yet
        else:
            m_new = tl.maximum(m_i, tl.max(b_s, 1))
            m_use = m_new
        b_p = tl.exp2(b_s - m_use[:, None])
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(b_p, 1)
        b_v = _load_tile(p_vb, n0, S, s_vs, DV, BLOCK_N, BLOCK_V, MASKED)
        # [BM, BN] @ [BN, BV] -> [BM, BV]
        acc = tl.dot(b_p.to(b_v.dtype), b_v, acc * alpha[:, None], input_precision=DOT_PREC)
        m_i = m_new
    return acc, l_i, m_i


@triton.autotune(configs=fwd_configs(), **_tune("fwd"))
@triton.jit(do_not_specialize=["T", "S", "n_iter_s"])
def flash_fwd_kernel(q, k, v, o, lse, pos_q, pos_k, flags,
                     s_qb, s_qh, s_qt, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs, s_ob, s_oh, s_ot, s_pqb, s_pkb, s_fb,
                     T, S, H, GROUP, qk_scale, n_iter_s,
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
    b_q = _load_tile(q + i_b.to(tl.int64) * s_qb + i_h.to(tl.int64) * s_qh, m0, T, s_qt, DK, BLOCK_M, BLOCK_D, True)
    b_pq, p_posk, mid, hi = _query_rows(pos_q, pos_k, flags, i_b, s_pqb, s_pkb, s_fb, o_m, m_m, m0, T, S, n_iter_s,
                                        CAUSAL, HAS_POS, BLOCK_M, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_V], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + float("-inf")
    # fully visible key blocks first (no mask), then the diagonal / tail blocks
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, b_q, b_pq, p_kb, p_vb, p_posk, s_ks, s_vs, S, qk_scale, 0, mid,
                               DK, DV, BLOCK_D, BLOCK_V, CAUSAL, HAS_POS, False, DOT_PREC, BLOCK_N)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, b_q, b_pq, p_kb, p_vb, p_posk, s_ks, s_vs, S, qk_scale, mid, hi,
                               DK, DV, BLOCK_D, BLOCK_V, CAUSAL, HAS_POS, True, DOT_PREC, BLOCK_N)
    empty = l_i == 0.0
    b_o = acc / tl.where(empty, 1.0, l_i)[:, None]
    b_lse = tl.where(empty, float("inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
    _store_tile(o + i_b.to(tl.int64) * s_ob + i_h.to(tl.int64) * s_oh, m0, T, s_ot, b_o, DV, BLOCK_M, BLOCK_V)
    tl.store(lse + i_bh.to(tl.int64) * T + o_m, b_lse, mask=m_m)


# ----------------------------------------------------------------------------- backward


@triton.jit
def _dkdv_inner(dk, dv, b_k, b_v, b_pk, p_q, p_do, p_lse, p_dlt, p_posq, s_qt, s_dot, T, S, qk_scale, lo, hi,
                DK: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr,
                CAUSAL: tl.constexpr, HAS_POS: tl.constexpr, MASKED: tl.constexpr, DOT_PREC: tl.constexpr,
                BLOCK_M: tl.constexpr):
    for i_m in range(lo, hi):
        m0 = i_m * BLOCK_M
        o_m = m0 + tl.arange(0, BLOCK_M)
        b_q = _load_tile(p_q, m0, T, s_qt, DK, BLOCK_M, BLOCK_D, MASKED)
        b_do = _load_tile(p_do, m0, T, s_dot, DV, BLOCK_M, BLOCK_V, MASKED)
        if MASKED:
            b_lse = tl.load(p_lse + o_m, mask=o_m < T, other=float("inf"))  # padded rows: P = 0
            b_dlt = tl.load(p_dlt + o_m, mask=o_m < T, other=0.0)
        else:
            b_lse = tl.load(p_lse + o_m)
            b_dlt = tl.load(p_dlt + o_m)
        # [BN, BD] @ [BD, BM] -> [BN, BM]: P transposed, rows are keys
        b_st = tl.dot(b_k, tl.trans(b_q), input_precision=DOT_PREC) * qk_scale
        b_pt = tl.exp2(b_st - b_lse[None, :])
        if MASKED and CAUSAL:  # padded query rows already have P = 0 (lse = +inf)
            if HAS_POS:
                b_pq = tl.load(p_posq + o_m, mask=o_m < T, other=0)
            else:
                b_pq = o_m + (S - T)
            b_pt = tl.where(b_pk[:, None] <= b_pq[None, :], b_pt, 0.0)
        # [BN, BM] @ [BM, BV] -> [BN, BV]
        dv = tl.dot(b_pt.to(b_do.dtype), b_do, dv, input_precision=DOT_PREC)
        # [BN, BV] @ [BV, BM] -> [BN, BM]
        b_dpt = tl.dot(b_v, tl.trans(b_do), input_precision=DOT_PREC)
        b_dst = b_pt * (b_dpt - b_dlt[None, :])
        # [BN, BM] @ [BM, BD] -> [BN, BD]
        dk = tl.dot(b_dst.to(b_q.dtype), b_q, dk, input_precision=DOT_PREC)
    return dk, dv


@triton.autotune(configs=dkdv_configs(), **_tune("dkdv"))
@triton.jit(do_not_specialize=["T", "S", "n_iter_t"])
def flash_bwd_kernel_dkdv(q, k, v, do, lse, dlt, dk, dv, pos_q, pos_k, flags, inv_freq,
                          s_qb, s_qh, s_qt, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs, s_dob, s_doh, s_dot,
                          s_dkb, s_dkh, s_dks, s_dvb, s_dvh, s_dvs, s_pqb, s_pkb, s_fb,
                          T, S, H, GROUP, qk_scale, sm_scale, n_iter_t,
                          DK: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr,
                          CAUSAL: tl.constexpr, HAS_POS: tl.constexpr, DOT_PREC: tl.constexpr,
                          POPE: tl.constexpr, AMP: tl.constexpr, FAST: tl.constexpr,
                          AUTOTUNE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """dK, dV of one key block; POPE: k holds the raw keys (DK // 2 wide), expanded in registers,
    q holds q_hat, and dk is the raw keys' gradient (`_chain_epilogue`)."""
    i_n, i_bg = tl.program_id(0), tl.program_id(1)
    qk_scale = tl.cast(qk_scale, tl.float32)
    G = H // GROUP
    i_b, i_g = i_bg // G, i_bg % G
    n0 = i_n * BLOCK_N
    o_n = n0 + tl.arange(0, BLOCK_N)
    m_n = o_n < S
    if POPE:
        b_k = _expand_rows(k, pos_k, pos_k, inv_freq, inv_freq, i_b, i_g, o_n, s_kb, s_kh, s_ks, s_pkb, s_pkb, S,
                           DK // 2, BLOCK_D // 2, AMP, False, FAST).to(q.dtype.element_ty)
    else:
        b_k = _load_tile(k + i_b.to(tl.int64) * s_kb + i_g.to(tl.int64) * s_kh, n0, S, s_ks, DK, BLOCK_N, BLOCK_D,
                         True)
    b_v = _load_tile(v + i_b.to(tl.int64) * s_vb + i_g.to(tl.int64) * s_vh, n0, S, s_vs, DV, BLOCK_N, BLOCK_V, True)
    p_posq = pos_q + i_b.to(tl.int64) * s_pqb
    p_posk = pos_k + i_b.to(tl.int64) * s_pkb
    if HAS_POS:
        b_pk = tl.load(p_posk + o_n, mask=m_n, other=0)
        flag = tl.load(flags + i_b * s_fb)
    else:
        b_pk = o_n
        flag = 0
    if CAUSAL:
        lo, mid = _query_blocks(flag, p_posq, p_posk, b_pk, m_n, n0, T, S, n_iter_t, HAS_POS, BLOCK_M, BLOCK_N)
    else:
        lo = 0
        mid = 0
    n_full = T // BLOCK_M
    n_qb = tl.cdiv(T, BLOCK_M)
    dk_acc = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv_acc = tl.zeros([BLOCK_N, BLOCK_V], dtype=tl.float32)
    for i_hg in range(GROUP):  # every query head reading this kv head: no atomics (MATH §7.8)
        i_h = i_g * GROUP + i_hg
        p_q = q + i_b.to(tl.int64) * s_qb + i_h.to(tl.int64) * s_qh
        p_do = do + i_b.to(tl.int64) * s_dob + i_h.to(tl.int64) * s_doh
        p_lse = lse + (i_b * H + i_h).to(tl.int64) * T
        p_dlt = dlt + (i_b * H + i_h).to(tl.int64) * T
        # diagonal blocks (masked), fully visible blocks, then the ragged tail block (masked)
        dk_acc, dv_acc = _dkdv_inner(dk_acc, dv_acc, b_k, b_v, b_pk, p_q, p_do, p_lse, p_dlt, p_posq, s_qt, s_dot,
                                     T, S, qk_scale, lo, mid, DK, DV, BLOCK_D, BLOCK_V, CAUSAL, HAS_POS, True,
                                     DOT_PREC, BLOCK_M)
        dk_acc, dv_acc = _dkdv_inner(dk_acc, dv_acc, b_k, b_v, b_pk, p_q, p_do, p_lse, p_dlt, p_posq, s_qt, s_dot,
                                     T, S, qk_scale, mid, n_full, DK, DV, BLOCK_D, BLOCK_V, CAUSAL, HAS_POS, False,
                                     DOT_PREC, BLOCK_M)
        dk_acc, dv_acc = _dkdv_inner(dk_acc, dv_acc, b_k, b_v, b_pk, p_q, p_do, p_lse, p_dlt, p_posq, s_qt, s_dot,
                                     T, S, qk_scale, tl.maximum(mid, n_full), n_qb, DK, DV, BLOCK_D, BLOCK_V,
                                     CAUSAL, HAS_POS, True, DOT_PREC, BLOCK_M)
    _store_tile(dv + i_b.to(tl.int64) * s_dvb + i_g.to(tl.int64) * s_dvh, n0, S, s_dvs, dv_acc, DV, BLOCK_N,
                BLOCK_V)
    if POPE:
        _chain_epilogue(dk_acc * sm_scale, k, dk, inv_freq, pos_k, pos_k, inv_freq, inv_freq, i_b, i_g, o_n,
                        s_kb, s_kh, s_ks, s_dkb, s_dkh, s_dks, s_pkb, s_pkb, S, i_n, DK // 2, BLOCK_D // 2, AMP,
                        False, FAST, True)
    else:
        _store_tile(dk + i_b.to(tl.int64) * s_dkb + i_g.to(tl.int64) * s_dkh, n0, S, s_dks, dk_acc * sm_scale,
                    DK, BLOCK_N, BLOCK_D)


@triton.jit
def _dq_inner(dq, b_q, b_do, b_lse, b_dlt, b_pq, p_kb, p_vb, p_posk, s_ks, s_vs, S, qk_scale, lo, hi,
              DK: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr,
              CAUSAL: tl.constexpr, HAS_POS: tl.constexpr, MASKED: tl.constexpr, DOT_PREC: tl.constexpr,
              BLOCK_N: tl.constexpr):
    for i_n in range(lo, hi):
        n0 = i_n * BLOCK_N
        b_k = _load_tile(p_kb, n0, S, s_ks, DK, BLOCK_N, BLOCK_D, MASKED)
        b_v = _load_tile(p_vb, n0, S, s_vs, DV, BLOCK_N, BLOCK_V, MASKED)
        # [BM, BD] @ [BD, BN] -> [BM, BN]
        b_s = tl.dot(b_q, tl.trans(b_k), input_precision=DOT_PREC) * qk_scale
        b_p = tl.exp2(b_s - b_lse[:, None])
        if MASKED:
            vis = _keys_visible(b_pq, p_posk, n0, S, CAUSAL, HAS_POS, BLOCK_N)
            b_p = tl.where(vis, b_p, 0.0)
        # [BM, BV] @ [BV, BN] -> [BM, BN]
        b_dp = tl.dot(b_do, tl.trans(b_v), input_precision=DOT_PREC)
        b_ds = b_p * (b_dp - b_dlt[:, None])
        # [BM, BN] @ [BN, BD] -> [BM, BD]
        dq = tl.dot(b_ds.to(b_k.dtype), b_k, dq, input_precision=DOT_PREC)
    return dq


@triton.autotune(configs=dq_configs(), **_tune("dq"))
@triton.jit(do_not_specialize=["T", "S", "n_iter_s"])
def flash_bwd_kernel_dq(q, k, v, do, lse, dlt, dq, pos_q, pos_k, flags, inv_freq, delta, ddelta_part,
                        s_qb, s_qh, s_qt, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs, s_dob, s_doh, s_dot,
                        s_dqb, s_dqh, s_dqt, s_pqb, s_pkb, s_fb,
                        T, S, H, GROUP, qk_scale, sm_scale, n_iter_s, n_part,
                        DK: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr,
                        CAUSAL: tl.constexpr, HAS_POS: tl.constexpr, DOT_PREC: tl.constexpr,
                        POPE: tl.constexpr, AMP: tl.constexpr, HAS_DELTA: tl.constexpr, FAST: tl.constexpr,
                        AUTOTUNE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """dQ of one query block; POPE: q holds the raw queries, expanded in registers, k holds k_hat,
    dq is the raw queries' gradient and, with HAS_DELTA, the block's share of d delta goes to row
    (b, h, i_m) of ddelta_part [B, H, n_part, BLOCK_D // 2] (`_chain_epilogue`)."""
    i_m, i_bh = tl.program_id(0), tl.program_id(1)
    qk_scale = tl.cast(qk_scale, tl.float32)
    i_b, i_h = i_bh // H, i_bh % H
    i_g = i_h // GROUP
    m0 = i_m * BLOCK_M
    o_m = m0 + tl.arange(0, BLOCK_M)
    m_m = o_m < T
    p_kb = k + i_b.to(tl.int64) * s_kb + i_g.to(tl.int64) * s_kh
    p_vb = v + i_b.to(tl.int64) * s_vb + i_g.to(tl.int64) * s_vh
    if POPE:
        b_q = _expand_rows(q, pos_q, pos_k, inv_freq, delta, i_b, i_h, o_m, s_qb, s_qh, s_qt, s_pqb, s_pkb, T,
                           DK // 2, BLOCK_D // 2, AMP, HAS_DELTA, FAST).to(k.dtype.element_ty)
    else:
        b_q = _load_tile(q + i_b.to(tl.int64) * s_qb + i_h.to(tl.int64) * s_qh, m0, T, s_qt, DK, BLOCK_M, BLOCK_D,
                         True)
    b_do = _load_tile(do + i_b.to(tl.int64) * s_dob + i_h.to(tl.int64) * s_doh, m0, T, s_dot, DV, BLOCK_M,
                      BLOCK_V, True)
    b_lse = tl.load(lse + i_bh.to(tl.int64) * T + o_m, mask=m_m, other=float("inf"))
    b_dlt = tl.load(dlt + i_bh.to(tl.int64) * T + o_m, mask=m_m, other=0.0)
    b_pq, p_posk, mid, hi = _query_rows(pos_q, pos_k, flags, i_b, s_pqb, s_pkb, s_fb, o_m, m_m, m0, T, S, n_iter_s,
                                        CAUSAL, HAS_POS, BLOCK_M, BLOCK_N)
    dq_acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    dq_acc = _dq_inner(dq_acc, b_q, b_do, b_lse, b_dlt, b_pq, p_kb, p_vb, p_posk, s_ks, s_vs, S, qk_scale, 0, mid,
                       DK, DV, BLOCK_D, BLOCK_V, CAUSAL, HAS_POS, False, DOT_PREC, BLOCK_N)
    dq_acc = _dq_inner(dq_acc, b_q, b_do, b_lse, b_dlt, b_pq, p_kb, p_vb, p_posk, s_ks, s_vs, S, qk_scale, mid, hi,
                       DK, DV, BLOCK_D, BLOCK_V, CAUSAL, HAS_POS, True, DOT_PREC, BLOCK_N)
    if POPE:
        _chain_epilogue(dq_acc * sm_scale, q, dq, ddelta_part, pos_q, pos_k, inv_freq, delta, i_b, i_h, o_m,
                        s_qb, s_qh, s_qt, s_dqb, s_dqh, s_dqt, s_pqb, s_pkb, T, i_bh.to(tl.int64) * n_part + i_m,
                        DK // 2, BLOCK_D // 2, AMP, HAS_DELTA, FAST, True)
    else:
        _store_tile(dq + i_b.to(tl.int64) * s_dqb + i_h.to(tl.int64) * s_dqh, m0, T, s_dqt, dq_acc * sm_scale,
                    DK, BLOCK_M, BLOCK_D)


# ----------------------------------------------------------------------------- host functions


def pos_flags(pos_q: torch.Tensor, pos_k: torch.Tensor) -> torch.Tensor:
    """int32 [B or 1], computed on the device (no sync): bit 0 keys non-decreasing, bit 1 queries
    non-decreasing, bit 2 consecutive from one origin (pos_k = p0 + s, pos_q = p0 + S - T + t)."""
    T, S = pos_q.shape[1], pos_k.shape[1]

    def nondecreasing(p):
        return (p[:, 1:] >= p[:, :-1]).all(dim=1) if p.shape[1] > 1 else torch.ones_like(p[:, 0], dtype=torch.bool)

    p0 = pos_k[:, :1]
    ar = torch.arange(max(S, T), device=pos_k.device, dtype=pos_k.dtype)
    consecutive = ((pos_k - p0) == ar[:S]).all(dim=1)
    if T <= S:
        consecutive = consecutive & ((pos_q - p0) == ar[S - T:S]).all(dim=1)
    else:  # more queries than keys: leave it to bisection
        consecutive = consecutive & False
    return (nondecreasing(pos_k).int() + 2 * nondecreasing(pos_q).int() + 4 * consecutive.int()).to(torch.int32)


def _pos_args(pos_q, pos_k, flags, dummy):
    """Kernel arguments for the positions; without them any tensor stands in (never read)."""
    if pos_q is None:
        return dummy, dummy, dummy, 0, 0, 0
    return pos_q, pos_k, flags, _pos_stride(pos_q), _pos_stride(pos_k), 0 if flags.shape[0] == 1 else 1


def _common(dk_width, v, causal, pos_q, autotune):
    return {"DK": dk_width, "DV": v.shape[-1], "BLOCK_D": block_d(dk_width), "BLOCK_V": block_d(v.shape[-1]),
            "CAUSAL": causal, "HAS_POS": pos_q is not None, "DOT_PREC": _dot_precision(v.dtype),
            "AUTOTUNE": bool(autotune)}


def flash_fwd(q, k, v, pos_q, pos_k, flags, *, scale: float, causal: bool, autotune: bool = False):
    """q [B,H,T,DK], k [B,G,S,DK], v [B,G,S,DV] (last dim contiguous); pos int64 [B|1, T|S] and
    flags (`pos_flags`), or all three None (index positions); autotune as `AttentionOptions`.
    Returns out [B,H,T,DV] (q's dtype) and lse [B,H,T] fp32 in log2 units."""
    B, H, T, _ = q.shape
    G, S = k.shape[1], k.shape[2]
    out = torch.empty((B, H, T, v.shape[-1]), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, T), dtype=torch.float32, device=q.device)
    pq, pk, fl, s_pq, s_pk, s_f = _pos_args(pos_q, pos_k, flags, lse)
    flash_fwd_kernel[lambda meta: (triton.cdiv(T, meta["BLOCK_M"]), B * H)](
        q, k, v, out, lse, pq, pk, fl, *_strides(q, k, v, out), s_pq, s_pk, s_f,
        T, S, H, H // G, scale * LOG2E, _bisect_iters(S), **_common(q.shape[-1], v, causal, pos_q, autotune))
    return out, lse


def flash_bwd_dkdv(do, q, k, v, lse, dlt, pos_q, pos_k, flags, *, scale: float, causal: bool,
                   chain: PopeChain | None = None, autotune: bool = False):
    """(dk, dv) in k's and v's dtype; chain (PoPE mode): q is q_hat [B,H,T,2D], k the raw keys."""
    B, H, T, _ = q.shape
    G, S = k.shape[1], k.shape[2]
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    pq, pk, fl, s_pq, s_pk, s_f = _pos_args(pos_q, pos_k, flags, dlt)
    common = {**_common(q.shape[-1], v, causal, pos_q, autotune), **pope_meta(chain), "FAST": not interpreting()}
    common.pop("HAS_DELTA")
    flash_bwd_kernel_dkdv[lambda meta: (triton.cdiv(S, meta["BLOCK_N"]), B * G)](
        q, k, v, do, lse, dlt, dk, dv, pq, pk, fl, pope_ptrs(chain, dlt)[0], *_strides(q, k, v, do, dk, dv),
        s_pq, s_pk, s_f, T, S, H, H // G, scale * LOG2E, scale, _bisect_iters(T), **common)
    return dk, dv


def flash_bwd_dq(do, q, k, v, lse, dlt, pos_q, pos_k, flags, *, scale: float, causal: bool,
                 chain: PopeChain | None = None, autotune: bool = False):
    """(dq in q's dtype, d delta fp32 [H, D] or None); chain (PoPE mode): q is the raw queries, k is
    k_hat [B,G,S,2D]; d delta from per-(b, h, query block) partial rows summed in a fixed order."""
    B, H, T, D = q.shape
    G, S = k.shape[1], k.shape[2]
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    pq, pk, fl, s_pq, s_pk, s_f = _pos_args(pos_q, pos_k, flags, dlt)
    common = {**_common(k.shape[-1], v, causal, pos_q, autotune), **pope_meta(chain), "FAST": not interpreting()}
    # one partial row per (b, h, block of the smallest BLOCK_M); rows a larger block leaves stay 0
    n_part = triton.cdiv(T, min(c.kwargs["BLOCK_M"] for c in dq_configs()))
    part = torch.zeros((B, H, n_part, common["BLOCK_D"] // 2), dtype=torch.float32, device=q.device) \
        if common["HAS_DELTA"] else dlt
    flash_bwd_kernel_dq[lambda meta: (triton.cdiv(T, meta["BLOCK_M"]), B * H)](
        q, k, v, do, lse, dlt, dq, pq, pk, fl, *pope_ptrs(chain, dlt), part, *_strides(q, k, v, do, dq),
        s_pq, s_pk, s_f, T, S, H, H // G, scale * LOG2E, scale, _bisect_iters(S), n_part, **common)
    return dq, (part.sum(dim=(0, 2))[:, :D].contiguous() if common["HAS_DELTA"] else None)


def flash_bwd(do, q, k, v, out, lse, pos_q, pos_k, flags, *, scale: float, causal: bool, autotune: bool = False):
    """Backward launches; returns dq, dk, dv in the input dtypes (no atomics: deterministic)."""
    do = do if do.stride(-1) == 1 else do.contiguous()
    dlt = do_o_rows(do, out)
    cfg = {"scale": scale, "causal": causal, "autotune": autotune}
    dk, dv = flash_bwd_dkdv(do, q, k, v, lse, dlt, pos_q, pos_k, flags, **cfg)
    dq, _ = flash_bwd_dq(do, q, k, v, lse, dlt, pos_q, pos_k, flags, **cfg)
    return dq, dk, dv
