"""Hopper (sm_90) backward of TAPA attention in Gluon (MATH §4.4), on the skeleton of the plain Gluon
backward (kernels/flash/gluon_hopper_bwd.py: TMA rings guarded by mbarriers, asynchronous wgmma, the
softmax recomputed from the forward's log-sum-exp with exp2; FA2's split into a dK/dV and a dQ kernel,
no atomics, hence deterministic).

Spec: the gradients of `triton_tapa.tapa_bwd` with index positions (the T queries are the last T of
the S keys: query t sits at m = t + S - T, key s at n = s; key s is visible iff n <= m when causal),
GQA (head h reads kv head h // (H // G); dk, dv sum over the group), D in {64, 128} split D_A = D_P =
D / 2, bf16 or fp16, fp32 accumulation, quadratic or linear phase (MATH §4.3). lse is either
forward's (`triton_tapa.tapa_fwd`, `gluon_tapa.gluon_tapa_fwd`): log2 units of scale * score * log2 e,
+inf for a row that sees no key (its P is 0). TAPA's score depends on the positions only through
|m - n| (MATH §4.6), so the launcher takes no offset; distances are int32 index differences,
converted to fp32 once (correctly rounded at any length).

With A = S_A / sqrt(D_A), t = W S_P (turns), W = k_turn |m - n|^alpha, k_turn = phase_scale /
(2 pi sqrt(D_P)) and dS = P (dP - Delta), dP = dO V^T, Delta = rowsum(dO * O) (triton_tapa.py):
    d loss / d S_A = scale / sqrt(D_A) * dS cos(2 pi t)
    d loss / d S_P = -2 pi scale / sqrt(D_A) * dS S_A W sin(2 pi t)
The per-tile products run without the constant factors (`G_A = dS cos`, `G_P = dS S_A W sin`); the
accumulators are scaled once in the epilogue, as the plain backward scales dK.

    dK/dV, one program per key block (K_A, K_P, V resident), over the query blocks of every head of
    its GQA group; Q_A, Q_P, dO of step i + STAGES stream into the ring slot step i frees:
        issue S_P^T = K_P Q_P^T, S_A^T = K_A Q_A^T, dP^T = V dO^T (async)
        wait S_P^T; W^T, cos and sin of the phase (overlaps S_A^T and dP^T)
        wait S_A^T; P^T = exp2(qk_scale S_A^T cos - lse); wait dP^T; issue dV += P^T dO
        issue dK_A += G_A^T Q_A, dK_P += G_P^T Q_P; wait all; refill the slot
    dQ, one program per query block (Q_A, Q_P, dO resident), over its key blocks with K_A, K_P and V
    in separate rings: the same products untransposed, dQ_A += G_A K_A, dQ_P += G_P K_P.

W comes as in the forward (gluon_tapa.py): tiles whose central distance |D_c| >= r_min take the
binomial series about the centre (`gluon_tapa._w_series_e`, the radius `phase._taylor`'s), tiles near
the diagonal exp2(alpha lg2 d) (`gluon_tapa._w_exact`), masked tiles (the causal diagonal, ragged
key ends in dQ) the exact power too; the forward's "order3", "table" and "diag" variants
(`gluon_tapa_host.VARIANTS`) apply to both kernels, "coef" to dQ ("lazy", "fws" and "occupancy" are the
forward's alone). The dK/dV kernel's tiles are transposed (rows keys,
columns queries): the same helpers take negated offsets (`_weight_t`). Its "ws" variant
(`gluon_tapa_bwd_dkdv_ws_kernel`) issues the ring's loads from a one-warp producer partition, the
consumers releasing each slot through an `empty` mbarrier, as the plain backward's warp-specialised
dK/dV kernel does (kernels/flash/gluon_hopper_bwd.py). The phase is reduced in turns,
t - rint(t) exact in fp32 by the forward's shifter (MATH §7.4), then cos.approx and sin.approx.
Linear phase: the phase half of the resident operand (K_P in dK/dV, Q_P in dQ) is replaced by ones
after its row sums are taken (`gluon_tapa._linear_setup`), so the S_P wgmma gives the streamed
side's sums; its gradient is a row sum of G_P in fp32 registers, the same on every phase feature.

Reads past T or S through the flattened [rows, D / 2] views land in a neighbouring head or are
zero-filled by TMA: query rows past T get lse = +inf (P = 0), keys past S are masked in dQ and
their dK/dV rows are not stored.

The module imports without Gluon (CPU machines, other Triton versions): `supported` says why the
kernels cannot run, and nothing Gluon runs under TRITON_INTERPRET.
"""

from __future__ import annotations

import math

import torch

from phaselab.kernels.common.score_mod import ScoreMod
from phaselab.kernels.common.triton_common import do_o_rows
from phaselab.kernels.flash import gluon_common
from phaselab.kernels.flash.gluon_common import PRODUCER_REGS, descriptor, launch
from phaselab.kernels.tapa import gluon_tapa_host

if gluon_common.IMPORT_ERROR is None:   # Gluon's Hopper API, as gluon_common imported it
    from phaselab.kernels.flash.gluon_common import (
        fence_async_shared,
        gl,
        gluon,
        kv_base_row,
        mbarrier,
        mma_layout,
        rows_layout,
        tma,
        triton,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from phaselab.kernels.flash.gluon_hopper import _free_k
    from phaselab.kernels.flash.gluon_hopper_bwd import (
        _a_operand,
        _key_range,
        _q_row,
        _query_range,
        _store_rows,
    )
    from phaselab.kernels.tapa.gluon_tapa import (
        _coef_row,
        _geometry,
        _linear_setup,
        _near_range,
        _ring,
        _w_exact,
        _w_series_e,
        _w_table,
        _weight,
    )

# (BLOCK_M queries, BLOCK_N keys, STAGES, warps) per head dim; the resident side (keys in dK/dV,
# queries in dQ) takes the warps along its rows. Score tiles (S_A, S_P, dP) are in flight beside the
# accumulators, so the streamed side is narrow where the accumulators are wide (dK_A, dK_P, dV: 2 D
# columns). For sm_90a with triton 3.6.0 (benchmarks/gluon_compile_tapa_bwd.py) the tiles below
# compile without spills (dK/dV at 16x128x2x8: D = 128 240 registers, D = 64 211; dQ: 234, 255),
# dQ at 128x64x2x8 and D = 128 spills 76 / 124 B. The D = 128 dK/dV tile takes 32 query rows a
# step: with the producer partition ("ws", the default) it spills 28 / 44 B in the loop preheaders
# only and is 8-10 % faster on the H200 than 16 rows (benchmarks/results/gluon-tapa-bwd-h200.md).
DKDV_TILES = {64: (32, 128, 2, 8), 128: (32, 128, 2, 8)}
DQ_TILES = {64: (128, 64, 2, 8), 128: (128, 32, 2, 8)}
_TWO_PI = 2.0 * math.pi


def supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos_q=None, pos_k=None, *,
              theta: float = 0.5, scale: float = 1.0) -> str | None:
    """None when the Gluon TAPA backward can run on these inputs, else a short reason: the
    forward's restrictions (`gluon_tapa_host.supported`: the D/2 split, scale > 0, index positions,
    dtypes, widths, lengths, machine), which the backward's kernels share."""
    return gluon_tapa_host.supported(q, k, v, pos_q, pos_k, theta=theta, scale=scale, what="the Gluon TAPA backward")


if gluon_common.IMPORT_ERROR is None:

    @gluon.jit
    def _sincos_turns(t):
        """(cos, sin) of 2 pi t for fp32 turns t: t - rint(t) by the forward's shifter
        (gluon_tapa._cos_turns), then cos.approx and sin.approx on [-pi, pi]."""
        r = (t - ((t + 12582912.0) - 12582912.0)) * 6.283185307179586
        c = gl.inline_asm_elementwise("cos.approx.f32 $0, $1;", "=r,r", [r], dtype=gl.float32, is_pure=True, pack=1)
        s = gl.inline_asm_elementwise("sin.approx.f32 $0, $1;", "=r,r", [r], dtype=gl.float32, is_pure=True, pack=1)
        return c, s

    @gluon.jit
    def _phase(w, sp):
        c, s = _sincos_turns(w * sp)  # t = W S_P
        return c, w * s

    @gluon.jit
    def _grads(c, ws, sa, dp, lse, dlt, qk_scale, vis, MASKED: gl.constexpr, ROWS_ARE_QUERIES: gl.constexpr):
        """(P, G_A, G_P) of one tile (module docstring) from the phase's (cos, W sin), S_A and dP;
        lse and Delta are per query (rows or columns); MASKED: P = 0 where `vis` is false."""
        if ROWS_ARE_QUERIES:
            lse, dlt = lse[:, None], dlt[:, None]
        else:
            lse, dlt = lse[None, :], dlt[None, :]
        p = gl.exp2(sa * c * qk_scale - lse)
        if MASKED:
            p = gl.where(vis, p, 0.0)
        ds = p * (dp - dlt)
        return p, ds * c, ds * sa * ws

    # ------------------------------------------------------------------------- dK / dV

    @gluon.jit
    def _weight_t(i, geo, ph, MODE: gl.constexpr, BLOCK_M: gl.constexpr, TABLE: gl.constexpr,
                  DIAG: gl.constexpr = False):
        """W^T [BN keys, BM queries] of query block i: MODE 0 (3) the series to the fifth (third)
        order about D_c = i BM + xq - n0 (e = (c - r) - CENTRE, the forward's helper with
        negated offsets; DIAG: once a diagonal, `gluon_tapa.diag_poly_asm`, which holds for e a
        function of c - r too), 1 (near) the exact power or, TABLE, the distance table, 2 the exact
        power."""
        xq, n0, key_pos, ri_t, cols, ci_t, _sk = geo
        alpha, k_turn, c1, c2, c3, c4, c5, table = ph
        CENTRE: gl.constexpr = (BLOCK_M - ri_t.shape[0]) // 2
        if MODE == 0 or MODE == 3:
            w = _w_series_e(i * BLOCK_M + xq, n0, ri_t, ci_t, alpha, k_turn, c1, c2, c3, c4, c5,
                            5 if MODE == 0 else 3, DIAG)
        elif MODE == 1 and TABLE:
            w = _w_table(key_pos, i * BLOCK_M + xq - CENTRE, cols, table)
        else:
            w = _w_exact(key_pos, i * BLOCK_M + xq - CENTRE, cols, alpha, k_turn)
        return w

    @gluon.jit
    def _geometry_t(n0, T, S, LINEAR: gl.constexpr, kp_smem, BLOCK_M: gl.constexpr, st_layout: gl.constexpr,
                    num_warps: gl.constexpr):
        """(xq, n0, key_pos, ri_t, cols, ci_t, sk) of a dK/dV program: xq = S - T + CENTRE (D_c of
        query block i is i BM + xq - n0), key indices n0 + r, -(r + CENTRE) and -c (int32), the
        query columns c, and the linear phase's key row sums (zeros for the quadratic phase)."""
        BLOCK_N: gl.constexpr = kp_smem.shape[0]
        CENTRE: gl.constexpr = (BLOCK_M - BLOCK_N) // 2
        r = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, st_layout))
        cols = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, st_layout))
        if LINEAR:
            sk = _linear_setup(kp_smem, st_layout, num_warps)
        else:
            sk = gl.zeros([BLOCK_N], gl.float32, gl.SliceLayout(1, st_layout))
        return (S - T + CENTRE, n0, n0 + r, -(r + CENTRE), cols, -cols, sk)

    @gluon.jit
    def _load_q(descs, bufs, it, nblk, lo, bh0, T, total, STAGES: gl.constexpr):
        """TMA Q_A, Q_P, dO of step it into ring slot it % STAGES, if it < total."""
        qa_desc, qp_desc, do_desc = descs
        qa_smem, qp_smem, do_smem, bars = bufs[3], bufs[4], bufs[5], bufs[6]
        slot = it % STAGES
        row = _q_row(it, nblk, lo, bh0, T, qa_smem.shape[1])
        NBYTES: gl.constexpr = qa_desc.block_type.nbytes + qp_desc.block_type.nbytes + do_desc.block_type.nbytes
        mbarrier.expect(bars.index(slot), NBYTES, pred=it < total)
        tma.async_copy_global_to_shared(qa_desc, [row, 0], bars.index(slot), qa_smem.index(slot), pred=it < total)
        tma.async_copy_global_to_shared(qp_desc, [row, 0], bars.index(slot), qp_smem.index(slot), pred=it < total)
        tma.async_copy_global_to_shared(do_desc, [row, 0], bars.index(slot), do_smem.index(slot), pred=it < total)

    @gluon.jit
    def _dkdv_step(it, dka, dkp, dks, dv, bufs, descs, geo, ph, sched, lse_ptr, dlt_ptr, T, S, qk_scale,
                   MODE: gl.constexpr, CAUSAL: gl.constexpr, LINEAR: gl.constexpr, STAGES: gl.constexpr,
                   TABLE: gl.constexpr, WS: gl.constexpr, st_layout: gl.constexpr, DIAG: gl.constexpr = False):
        """One query block of the dK/dV schedule (module docstring); MODE as `_weight_t`'s (2: masked,
        the causal diagonal); WS: a producer partition refills the ring (`_dkdv_release`)."""
        ka_smem, kp_smem, v_smem, qa_smem, qp_smem, do_smem, bars, _empty = bufs
        nblk, lo, bh0, _total = sched
        BLOCK_M: gl.constexpr = qa_smem.shape[1]
        BLOCK_N: gl.constexpr = ka_smem.shape[0]
        slot = it % STAGES
        i = lo + it % nblk
        bh = bh0 + it // nblk
        q_idx = i * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, st_layout))
        mbarrier.wait(bars.index(slot), (it // STAGES) & 1)
        zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, st_layout)
        sp_tok = warpgroup_mma(kp_smem, qp_smem.index(slot).permute((1, 0)), zero, use_acc=False, is_async=True)
        sa_tok = warpgroup_mma(ka_smem, qa_smem.index(slot).permute((1, 0)), zero, use_acc=False, is_async=True)
        sp = warpgroup_mma_wait(1, deps=(sp_tok,))
        if LINEAR:
            sp = sp + geo[6][:, None]
        c, ws = _phase(_weight_t(i, geo, ph, MODE, BLOCK_M, TABLE, DIAG), sp)
        # dP^T issued once S_P^T and W are dead: three [BN, BM] tiles fewer in flight beside the
        # 2 D accumulator columns (D = 128 spilled otherwise, benchmarks/gluon_compile_tapa_bwd.py)
        dp_tok = warpgroup_mma(v_smem, do_smem.index(slot).permute((1, 0)), zero, use_acc=False, is_async=True)
        vis = (geo[2] < S)[:, None]
        if CAUSAL:
            vis = vis & (geo[2][:, None] <= (q_idx + (S - T))[None, :])
        # loaded once W is dead (fewer live registers), its latency under S_A^T's and dP^T's wgmmas
        lse = gl.load(lse_ptr + bh.to(gl.int64) * T + q_idx, mask=q_idx < T, other=float("inf"))  # past T: P = 0
        sa = warpgroup_mma_wait(1, deps=(sa_tok,))
        dlt = gl.load(dlt_ptr + bh.to(gl.int64) * T + q_idx, mask=q_idx < T, other=0.0)
        dp = warpgroup_mma_wait(0, deps=(dp_tok,))
        p, g_a, g_p = _grads(c, ws, sa, dp, lse, dlt, qk_scale, vis, MODE == 2, False)
        dtype: gl.constexpr = ka_smem.dtype
        dv_layout: gl.constexpr = dv.type.layout
        h_layout: gl.constexpr = dka.type.layout
        dv_tok = warpgroup_mma(_a_operand(p, dtype, dv_layout), do_smem.index(slot), dv, is_async=True)
        dka_tok = warpgroup_mma(_a_operand(g_a, dtype, h_layout), qa_smem.index(slot), dka, is_async=True)
        if LINEAR:
            dks = dks + gl.sum(g_p, 1)
            dv, dka = warpgroup_mma_wait(0, deps=(dv_tok, dka_tok))
        else:
            dkp_tok = warpgroup_mma(_a_operand(g_p, dtype, h_layout), qp_smem.index(slot), dkp, is_async=True)
            dv, dka, dkp = warpgroup_mma_wait(0, deps=(dv_tok, dka_tok, dkp_tok))
        _dkdv_release(descs, bufs, it, sched, T, STAGES, WS)
        return dka, dkp, dks, dv

    @gluon.jit
    def _dkdv_release(descs, bufs, it, sched, T, STAGES: gl.constexpr, WS: gl.constexpr):
        """Slot it % STAGES is read: refill it with step it + STAGES, or (WS) tell the producer,
        once every consumer warp is past its wgmmas (one CTA barrier instead of the four that the
        in-line refill's expect and three copies take)."""
        if WS:
            gl.thread_barrier()
            mbarrier.arrive(bufs[7].index(it % STAGES))
        else:
            nblk, lo, bh0, total = sched
            _load_q(descs, bufs, it + STAGES, nblk, lo, bh0, T, total, STAGES)

    @gluon.jit
    def _query_split(n0, T, S, mid, n_qb, r_min, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
        """(a, b): unmasked query blocks [a, b) within [mid, n_qb) have |D_c| < r_min (exact W);
        [mid, a) and [b, n_qb) take the series. D_c = i BM + S - T + CENTRE - n0 grows with i."""
        x0 = S - T + (BLOCK_M - BLOCK_N) // 2 - n0
        lo = -r_min - x0   # a: the first i with i BM > lo
        hi = r_min - x0    # b: the first i with i BM >= hi
        a = gl.where(lo >= 0, gl.maximum(lo, 0) // BLOCK_M + 1, 0)
        b = gl.where(hi > 0, gl.cdiv(gl.maximum(hi, 0), BLOCK_M), 0)
        a = gl.minimum(gl.maximum(a, mid), n_qb)
        return a, gl.minimum(gl.maximum(b, a), n_qb)

    @gluon.jit
    def _dkdv_epilogue(dka, dkp, dks, dv, dk_ptr, dv_ptr, i_bg, n0, S, ds_scale, LINEAR: gl.constexpr,
                       num_warps: gl.constexpr):
        """dK = (scale / sqrt(D_A)) (dK_A, -2 pi dK_P), dV; rows past S are not stored."""
        DA: gl.constexpr = dka.shape[1]
        row_base = i_bg.to(gl.int64) * S
        _store_half(dk_ptr, dka * ds_scale, row_base, n0, S, 0, num_warps)
        if LINEAR:
            h_layout: gl.constexpr = dka.type.layout
            dkp = dkp + gl.convert_layout(dks, gl.SliceLayout(1, h_layout))[:, None]
        _store_half(dk_ptr, dkp * (-6.283185307179586 * ds_scale), row_base, n0, S, DA, num_warps)
        _store_rows(dv_ptr, dv, row_base, n0, S, num_warps)

    @gluon.jit
    def _store_half(ptr, x, row_base, r0, n_rows, col0, num_warps: gl.constexpr):
        """Rows r0.. of x [R, D/2] (fp32) into columns col0.. of rows row_base + r0.. of a [*, D]
        matrix (row stride D = 2 x.shape[1]), in ptr's dtype; rows at or past n_rows are not stored."""
        R: gl.constexpr = x.shape[0]
        DH: gl.constexpr = x.shape[1]
        layout: gl.constexpr = rows_layout(num_warps, DH)
        y = gl.convert_layout(x.to(ptr.dtype.element_ty), layout)
        r = r0 + gl.arange(0, R, layout=gl.SliceLayout(1, layout))
        c = col0 + gl.arange(0, DH, layout=gl.SliceLayout(0, layout))
        gl.store(ptr + (row_base + r.to(gl.int64))[:, None] * (2 * DH) + c[None, :], y, mask=(r < n_rows)[:, None])

    @gluon.jit
    def _dkdv_setup(qa_desc, qp_desc, do_desc, ka_desc, kp_desc, v_desc, T, S, H, GROUP, CAUSAL: gl.constexpr,
                    STAGES: gl.constexpr):
        """(bounds, bufs, kv_bar) of one dK/dV program: its key block n0, kv head i_bg, first query
        head bh0, query blocks [lo, mid) masked and [mid, n_qb) not; K_A, K_P, V resident, the Q_A,
        Q_P, dO ring, its ready barriers and the `empty` ones a producer partition waits on."""
        BLOCK_M: gl.constexpr = qa_desc.block_type.shape[0]
        BLOCK_N: gl.constexpr = ka_desc.block_type.shape[0]
        DA: gl.constexpr = ka_desc.block_type.shape[1]
        HEAD_D: gl.constexpr = v_desc.block_type.shape[1]
        n0 = gl.program_id(0) * BLOCK_N  # block 0 sees the most queries: it starts first
        i_bg = gl.program_id(1)
        bh0 = i_bg // (H // GROUP) * H + i_bg % (H // GROUP) * GROUP  # first query head of the group
        lo, mid, n_qb = _query_range(n0, T, S, BLOCK_M, BLOCK_N, CAUSAL)
        ka_smem = gl.allocate_shared_memory(ka_desc.dtype, ka_desc.block_type.shape, ka_desc.layout)
        kp_smem = gl.allocate_shared_memory(kp_desc.dtype, kp_desc.block_type.shape, kp_desc.layout)
        v_smem = gl.allocate_shared_memory(v_desc.dtype, v_desc.block_type.shape, v_desc.layout)
        qa_smem = gl.allocate_shared_memory(qa_desc.dtype, [STAGES, BLOCK_M, DA], qa_desc.layout)
        qp_smem = gl.allocate_shared_memory(qp_desc.dtype, [STAGES, BLOCK_M, DA], qp_desc.layout)
        do_smem = gl.allocate_shared_memory(do_desc.dtype, [STAGES, BLOCK_M, HEAD_D], do_desc.layout)
        kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(kv_bar, count=1)
        for s in gl.static_range(STAGES):
            mbarrier.init(bars.index(s), count=1)
            mbarrier.init(empty.index(s), count=1)
        fence_async_shared()  # barrier initialisation visible to the TMA unit (async proxy)
        bufs = (ka_smem, kp_smem, v_smem, qa_smem, qp_smem, do_smem, bars, empty)
        return (n0, i_bg, bh0, lo, mid, n_qb), bufs, kv_bar

    @gluon.jit
    def _load_kv(kdescs, bufs, kv_bar, row):
        """TMA the resident K_A, K_P, V of the program (rows row..row + BLOCK_N)."""
        ka_desc, kp_desc, v_desc = kdescs
        mbarrier.expect(kv_bar, ka_desc.block_type.nbytes + kp_desc.block_type.nbytes + v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(ka_desc, [row, 0], kv_bar, bufs[0])
        tma.async_copy_global_to_shared(kp_desc, [row, 0], kv_bar, bufs[1])
        tma.async_copy_global_to_shared(v_desc, [row, 0], kv_bar, bufs[2])

    @gluon.jit
    def _dkdv_produce(descs, kdescs, bufs, kv_bar, bounds, T, S, GROUP, STAGES: gl.constexpr):
        """Producer partition (one warp): K_A, K_P, V once, then Q_A, Q_P, dO of every step into the
        ring, each slot once the consumers have released its previous contents."""
        n0, i_bg, bh0, lo, _mid, n_qb = bounds
        _load_kv(kdescs, bufs, kv_bar, i_bg * S + n0)
        nblk = n_qb - lo
        total = GROUP * nblk
        for it in range(total):
            mbarrier.wait(bufs[7].index(it % STAGES), ((it // STAGES) & 1) ^ 1, pred=it >= STAGES)
            _load_q(descs, bufs, it, nblk, lo, bh0, T, total, STAGES)

    @gluon.jit
    def _dkdv_consume(descs, bufs, kv_bar, bounds, ph, lse_ptr, dlt_ptr, dk_ptr, dv_ptr, T, S, GROUP, qk_scale,
                      r_min, r_3, ds_scale, CAUSAL: gl.constexpr, LINEAR: gl.constexpr, STAGES: gl.constexpr,
                      TABLE: gl.constexpr, WS: gl.constexpr, DIAG: gl.constexpr, num_warps: gl.constexpr):
        """The wgmma warps: every query block of every head of the group by kind (masked, series of
        either order, near), then the epilogue."""
        n0, i_bg, bh0, lo, mid, n_qb = bounds
        ka_smem, kp_smem, v_smem, qa_smem = bufs[0], bufs[1], bufs[2], bufs[3]
        BLOCK_M: gl.constexpr = qa_smem.shape[1]
        BLOCK_N: gl.constexpr = ka_smem.shape[0]
        DA: gl.constexpr = ka_smem.shape[1]
        HEAD_D: gl.constexpr = v_smem.shape[1]
        st_layout: gl.constexpr = mma_layout(num_warps, BLOCK_M)
        h_layout: gl.constexpr = mma_layout(num_warps, DA)
        a, b = _query_split(n0, T, S, mid, n_qb, r_min, BLOCK_M, BLOCK_N)
        a3, b3 = _query_split(n0, T, S, mid, n_qb, r_3, BLOCK_M, BLOCK_N)  # a3 <= a <= b <= b3
        nblk = n_qb - lo
        sched = (nblk, lo, bh0, GROUP * nblk)
        dka = gl.zeros([BLOCK_N, DA], gl.float32, h_layout)
        dkp = gl.zeros([BLOCK_N, DA], gl.float32, h_layout)
        dks = gl.zeros([BLOCK_N], gl.float32, gl.SliceLayout(1, st_layout))
        dv = gl.zeros([BLOCK_N, HEAD_D], gl.float32, mma_layout(num_warps, HEAD_D))
        mbarrier.wait(kv_bar, 0)
        geo = _geometry_t(n0, T, S, LINEAR, kp_smem, BLOCK_M, st_layout, num_warps)
        args = (bufs, descs, geo, ph, sched, lse_ptr, dlt_ptr, T, S, qk_scale)
        for hg in range(GROUP):  # every query head reading this kv head: no atomics on dK, dV
            base = hg * nblk - lo
            for it in range(base + lo, base + mid):  # the causal diagonal: masked, exact
                dka, dkp, dks, dv = _dkdv_step(it, dka, dkp, dks, dv, *args, 2, CAUSAL, LINEAR, STAGES, TABLE, WS,
                                               st_layout, DIAG)
            for it in range(base + mid, base + a3):  # far before the diagonal (non-causal): third order
                dka, dkp, dks, dv = _dkdv_step(it, dka, dkp, dks, dv, *args, 3, CAUSAL, LINEAR, STAGES, TABLE, WS,
                                               st_layout, DIAG)
            for it in range(base + a3, base + a):  # before the diagonal (non-causal): the series
                dka, dkp, dks, dv = _dkdv_step(it, dka, dkp, dks, dv, *args, 0, CAUSAL, LINEAR, STAGES, TABLE, WS,
                                               st_layout, DIAG)
            for it in range(base + a, base + b):  # near the diagonal, unmasked: the exact power
                dka, dkp, dks, dv = _dkdv_step(it, dka, dkp, dks, dv, *args, 1, CAUSAL, LINEAR, STAGES, TABLE, WS,
                                               st_layout, DIAG)
            for it in range(base + b, base + b3):  # after the diagonal: the series
                dka, dkp, dks, dv = _dkdv_step(it, dka, dkp, dks, dv, *args, 0, CAUSAL, LINEAR, STAGES, TABLE, WS,
                                               st_layout, DIAG)
            for it in range(base + b3, base + n_qb):  # far after the diagonal: third order
                dka, dkp, dks, dv = _dkdv_step(it, dka, dkp, dks, dv, *args, 3, CAUSAL, LINEAR, STAGES, TABLE, WS,
                                               st_layout, DIAG)
        _dkdv_epilogue(dka, dkp, dks, dv, dk_ptr, dv_ptr, i_bg, n0, S, ds_scale, LINEAR, num_warps)

    @gluon.jit
    def gluon_tapa_bwd_dkdv_kernel(qa_desc, qp_desc, do_desc, ka_desc, kp_desc, v_desc, lse_ptr, dlt_ptr, dk_ptr,
                                   dv_ptr, T, S, H, GROUP, qk_scale, alpha, k_turn, c1, c2, c3, c4, c5, r_min,
                                   r_3, w_table, w_coef, coef_base, ds_scale, CAUSAL: gl.constexpr,
                                   LINEAR: gl.constexpr, STAGES: gl.constexpr, TABLE: gl.constexpr = False,
                                   DIAG: gl.constexpr = False, num_warps: gl.constexpr = 8):
        """dK, dV of one BLOCK_N block of keys of one (batch, kv head) over the query blocks of every
        query head of its group. Descriptors: q's and k's amplitude / phase halves as [rows, D/2]
        views, dO and v whole ([B*H*T, D], [B*G*S, D])."""
        descs = (qa_desc, qp_desc, do_desc)
        bounds, bufs, kv_bar = _dkdv_setup(qa_desc, qp_desc, do_desc, ka_desc, kp_desc, v_desc, T, S, H, GROUP, CAUSAL,
                                           STAGES)
        n0, i_bg, bh0, lo, _mid, n_qb = bounds
        _load_kv((ka_desc, kp_desc, v_desc), bufs, kv_bar, i_bg * S + n0)
        for s in gl.static_range(STAGES):
            _load_q(descs, bufs, s, n_qb - lo, lo, bh0, T, GROUP * (n_qb - lo), STAGES)
        _dkdv_consume(descs, bufs, kv_bar, bounds, (alpha, k_turn, c1, c2, c3, c4, c5, w_table), lse_ptr, dlt_ptr,
                      dk_ptr, dv_ptr, T, S, GROUP, qk_scale, r_min, r_3, ds_scale, CAUSAL, LINEAR, STAGES, TABLE,
                      False, DIAG, num_warps)

    @gluon.jit
    def gluon_tapa_bwd_dkdv_ws_kernel(qa_desc, qp_desc, do_desc, ka_desc, kp_desc, v_desc, lse_ptr, dlt_ptr, dk_ptr,
                                      dv_ptr, T, S, H, GROUP, qk_scale, alpha, k_turn, c1, c2, c3, c4, c5, r_min,
                                      r_3, w_table, w_coef, coef_base, ds_scale, CAUSAL: gl.constexpr,
                                      LINEAR: gl.constexpr, STAGES: gl.constexpr, TABLE: gl.constexpr = False,
                                      DIAG: gl.constexpr = False, PRODUCER_REGS: gl.constexpr = 24,
                                      num_warps: gl.constexpr = 8):
        """`gluon_tapa_bwd_dkdv_kernel` with the loads in a one-warp producer partition holding
        PRODUCER_REGS registers a thread (the "ws" variant; FA3's producer / consumer split)."""
        descs = (qa_desc, qp_desc, do_desc)
        bounds, bufs, kv_bar = _dkdv_setup(qa_desc, qp_desc, do_desc, ka_desc, kp_desc, v_desc, T, S, H, GROUP, CAUSAL,
                                           STAGES)
        gl.warp_specialize([
            (_dkdv_consume, (descs, bufs, kv_bar, bounds, (alpha, k_turn, c1, c2, c3, c4, c5, w_table), lse_ptr,
                             dlt_ptr, dk_ptr, dv_ptr, T, S, GROUP, qk_scale, r_min, r_3, ds_scale, CAUSAL, LINEAR,
                             STAGES, TABLE, True, DIAG, num_warps)),
            (_dkdv_produce, (descs, (ka_desc, kp_desc, v_desc), bufs, kv_bar, bounds, T, S, GROUP, STAGES)),
        ], [1], [PRODUCER_REGS])

    # ------------------------------------------------------------------------- dQ

    @gluon.jit
    def _dq_step(j, hi, dqa, dqp, dqs, bufs, descs, geo, ph, lse, dlt, kv_row, S, qk_scale, MODE: gl.constexpr,
                 CAUSAL: gl.constexpr, LINEAR: gl.constexpr, STAGES: gl.constexpr, TABLE: gl.constexpr,
                 s_layout: gl.constexpr, DIAG: gl.constexpr = False, COEF: gl.constexpr = False):
        """Key block j of the dQ schedule; MODE as `gluon_tapa._weight`'s (2: masked, keys past S
        and, causally, past each row's limit); COEF: the series' coefficients from the "coef"
        table (`gluon_tapa._coef_row`), loaded before the wgmmas are issued."""
        qa_smem, qp_smem, do_smem, ka_smem, kp_smem, v_smem, ka_bars, kp_bars, v_bars = bufs
        ka_desc, kp_desc, v_desc = descs
        BLOCK_M: gl.constexpr = qa_smem.shape[0]
        BLOCK_N: gl.constexpr = ka_smem.shape[1]
        slot = j % STAGES
        coef = None
        if COEF and (MODE == 0 or MODE == 3):
            coef = _coef_row(j, geo, ph, MODE, BLOCK_N)
        zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        mbarrier.wait(kp_bars.index(slot), (j // STAGES) & 1)
        sp_tok = warpgroup_mma(qp_smem, kp_smem.index(slot).permute((1, 0)), zero, use_acc=False, is_async=True)
        mbarrier.wait(ka_bars.index(slot), (j // STAGES) & 1)
        sa_tok = warpgroup_mma(qa_smem, ka_smem.index(slot).permute((1, 0)), zero, use_acc=False, is_async=True)
        mbarrier.wait(v_bars.index(slot), (j // STAGES) & 1)
        dp_tok = warpgroup_mma(do_smem, v_smem.index(slot).permute((1, 0)), zero, use_acc=False, is_async=True)
        sp = warpgroup_mma_wait(2, deps=(sp_tok,))
        if LINEAR:
            sp = sp + geo[4][:, None]
        c, ws = _phase(_weight(j, geo, ph, MODE, BLOCK_N, TABLE, coef, DIAG), sp)
        keys = j * BLOCK_N + geo[3]
        vis = (keys < S)[None, :]
        if CAUSAL:
            vis = vis & (keys[None, :] <= geo[1][:, None])
        sa = warpgroup_mma_wait(1, deps=(sa_tok,))
        dp = warpgroup_mma_wait(0, deps=(dp_tok,))
        _free_k(j, hi, v_desc, v_smem, v_bars, v_bars, kv_row, STAGES, False)
        _p, g_a, g_p = _grads(c, ws, sa, dp, lse, dlt, qk_scale, vis, MODE == 2, True)
        dtype: gl.constexpr = ka_smem.dtype
        h_layout: gl.constexpr = dqa.type.layout
        dqa_tok = warpgroup_mma(_a_operand(g_a, dtype, h_layout), ka_smem.index(slot), dqa, is_async=True)
        if LINEAR:
            dqs = dqs + gl.sum(g_p, 1)
            dqa = warpgroup_mma_wait(0, deps=(dqa_tok,))
        else:
            dqp_tok = warpgroup_mma(_a_operand(g_p, dtype, h_layout), kp_smem.index(slot), dqp, is_async=True)
            dqa, dqp = warpgroup_mma_wait(0, deps=(dqa_tok, dqp_tok))
        _free_k(j, hi, ka_desc, ka_smem, ka_bars, ka_bars, kv_row, STAGES, False)
        _free_k(j, hi, kp_desc, kp_smem, kp_bars, kp_bars, kv_row, STAGES, False)
        return dqa, dqp, dqs

    @gluon.jit
    def gluon_tapa_bwd_dq_kernel(qa_desc, qp_desc, do_desc, ka_desc, kp_desc, v_desc, lse_ptr, dlt_ptr, dq_ptr,
                                 T, S, H, GROUP, qk_scale, alpha, k_turn, c1, c2, c3, c4, c5, r_min, r_3, w_table,
                                 w_coef, coef_base, ds_scale, CAUSAL: gl.constexpr, LINEAR: gl.constexpr,
                                 STAGES: gl.constexpr, TABLE: gl.constexpr = False, DIAG: gl.constexpr = False,
                                 COEF: gl.constexpr = False, num_warps: gl.constexpr = 8):
        """dQ of one BLOCK_M block of query rows of one (batch, head) over its key blocks: block 0
        masked (the diagonal or the ragged end, as in the forward), then series / exact / series by
        distance, then the masked blocks."""
        BLOCK_M: gl.constexpr = qa_desc.block_type.shape[0]
        BLOCK_N: gl.constexpr = ka_desc.block_type.shape[0]
        DA: gl.constexpr = qa_desc.block_type.shape[1]
        s_layout: gl.constexpr = mma_layout(num_warps, BLOCK_N)
        h_layout: gl.constexpr = mma_layout(num_warps, DA)
        m0 = (gl.num_programs(0) - 1 - gl.program_id(0)) * BLOCK_M  # longest (causal) rows first
        i_bh = gl.program_id(1)
        kv_row = kv_base_row(i_bh, H, GROUP, S)
        mid, hi = _key_range(m0, T, S, BLOCK_M, BLOCK_N, CAUSAL)  # hi = 0: no key visible, dQ = 0
        qa_smem = gl.allocate_shared_memory(qa_desc.dtype, qa_desc.block_type.shape, qa_desc.layout)
        qp_smem = gl.allocate_shared_memory(qp_desc.dtype, qp_desc.block_type.shape, qp_desc.layout)
        do_smem = gl.allocate_shared_memory(do_desc.dtype, do_desc.block_type.shape, do_desc.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        ka_smem, ka_bars = _ring(ka_desc, STAGES)
        kp_smem, kp_bars = _ring(kp_desc, STAGES)
        v_smem, v_bars = _ring(v_desc, STAGES)
        fence_async_shared()  # barrier initialisation visible to the TMA unit (async proxy)
        mbarrier.expect(q_bar, qa_desc.block_type.nbytes + qp_desc.block_type.nbytes + do_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(qa_desc, [i_bh * T + m0, 0], q_bar, qa_smem)
        tma.async_copy_global_to_shared(qp_desc, [i_bh * T + m0, 0], q_bar, qp_smem)
        tma.async_copy_global_to_shared(do_desc, [i_bh * T + m0, 0], q_bar, do_smem)
        for s in gl.static_range(STAGES):
            _free_k(s - STAGES, hi, kp_desc, kp_smem, kp_bars, kp_bars, kv_row, STAGES, False)
            _free_k(s - STAGES, hi, ka_desc, ka_smem, ka_bars, ka_bars, kv_row, STAGES, False)
            _free_k(s - STAGES, hi, v_desc, v_smem, v_bars, v_bars, kv_row, STAGES, False)
        bufs = (qa_smem, qp_smem, do_smem, ka_smem, kp_smem, v_smem, ka_bars, kp_bars, v_bars)
        descs = (ka_desc, kp_desc, v_desc)
        ph = (alpha, k_turn, c1, c2, c3, c4, c5, w_table, w_coef, coef_base)
        rows = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
        lse = gl.load(lse_ptr + i_bh.to(gl.int64) * T + rows, mask=rows < T, other=float("inf"))
        dlt = gl.load(dlt_ptr + i_bh.to(gl.int64) * T + rows, mask=rows < T, other=0.0)
        dqa = gl.zeros([BLOCK_M, DA], gl.float32, h_layout)
        dqp = gl.zeros([BLOCK_M, DA], gl.float32, h_layout)
        dqs = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, s_layout))
        mbarrier.wait(q_bar, 0)
        geo = _geometry(m0, T, S, LINEAR, qp_smem, BLOCK_N, s_layout, num_warps)
        a, b = _near_range(geo[0], r_min, mid, BLOCK_N)
        a3, b3 = _near_range(geo[0], r_3, mid, BLOCK_N)  # a3 <= a <= b <= b3
        args = (bufs, descs, geo, ph, lse, dlt, kv_row, S, qk_scale)
        for j in range(gl.minimum(hi, 1)):  # block 0: masked, exact
            dqa, dqp, dqs = _dq_step(j, hi, dqa, dqp, dqs, *args, 2, CAUSAL, LINEAR, STAGES, TABLE, s_layout,
                                     DIAG, COEF)
        for j in range(1, a3):  # far before the diagonal: the third-order series
            dqa, dqp, dqs = _dq_step(j, hi, dqa, dqp, dqs, *args, 3, CAUSAL, LINEAR, STAGES, TABLE, s_layout,
                                     DIAG, COEF)
        for j in range(a3, a):  # before the diagonal: the series
            dqa, dqp, dqs = _dq_step(j, hi, dqa, dqp, dqs, *args, 0, CAUSAL, LINEAR, STAGES, TABLE, s_layout,
                                     DIAG, COEF)
        for j in range(a, b):  # near the diagonal, unmasked: the exact power
            dqa, dqp, dqs = _dq_step(j, hi, dqa, dqp, dqs, *args, 1, CAUSAL, LINEAR, STAGES, TABLE, s_layout,
                                     DIAG, COEF)
        for j in range(b, b3):  # after the diagonal (non-causal): the series
            dqa, dqp, dqs = _dq_step(j, hi, dqa, dqp, dqs, *args, 0, CAUSAL, LINEAR, STAGES, TABLE, s_layout,
                                     DIAG, COEF)
        for j in range(b3, mid):  # far after the diagonal (non-causal): the third-order series
            dqa, dqp, dqs = _dq_step(j, hi, dqa, dqp, dqs, *args, 3, CAUSAL, LINEAR, STAGES, TABLE, s_layout,
                                     DIAG, COEF)
        for j in range(gl.maximum(mid, 1), hi):  # masked: the exact power
            dqa, dqp, dqs = _dq_step(j, hi, dqa, dqp, dqs, *args, 2, CAUSAL, LINEAR, STAGES, TABLE, s_layout,
                                     DIAG, COEF)
        row_base = i_bh.to(gl.int64) * T
        _store_half(dq_ptr, dqa * ds_scale, row_base, m0, T, 0, num_warps)
        if LINEAR:
            dqp = dqp + gl.convert_layout(dqs, gl.SliceLayout(1, h_layout))[:, None]
        _store_half(dq_ptr, dqp * (-6.283185307179586 * ds_scale), row_base, m0, T, DA, num_warps)


# ----------------------------------------------------------------------------- host


def check_tile(tile: tuple[int, int, int, int], resident: int) -> None:
    """A tile's resident side (index `resident`: 1 for dK/dV's keys, 0 for dQ's queries) takes the
    warps along its rows, 16 a warp (64 a warpgroup: wgmma's M); the streamed side is wgmma's N of
    the score tiles and K of the gradient products: a multiple of 16."""
    _, _, stages, warps = tile
    rows, cols = tile[resident], tile[1 - resident]
    if warps not in (4, 8) or rows % (16 * warps) or cols % 16 or not 16 <= cols <= 256 or stages < 1:
        raise ValueError(f"tile {tile}: warps 4 or 8, the resident block a multiple of 16 rows a warp, "
                         "the streamed block a multiple of 16 up to 256, stages >= 1")


def _validated(do, q, k, v, out, lse, grads, params: dict, scale: float) -> tuple:
    """The inputs made contiguous and the gradient buffers, after `supported` and the shape checks."""
    reason = supported(q, k, v, theta=params["theta"], scale=scale)
    if reason is not None:
        raise ValueError(f"gluon_tapa_bwd: {reason}")
    q, k, v, do, out = (t.contiguous() for t in (q, k, v, do, out))
    B, H, T, _ = q.shape
    if do.shape != q.shape or out.shape != q.shape or lse.shape != (B, H, T) or lse.dtype != torch.float32:
        raise ValueError("gluon_tapa_bwd: do and out must be like q, lse fp32 [B, H, T]")
    dq, dk, dv = grads if grads is not None else (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    if any(g.shape != t.shape or g.dtype != t.dtype or not g.is_contiguous() for g, t in zip((dq, dk, dv), (q, k, v))):
        raise ValueError("gluon_tapa_bwd: grads must be contiguous and like q, k, v")
    return do, q, k, v, out, lse.contiguous(), (dq, dk, dv)


def kernel_scalars(D: int, alpha: float, phase_scale: float, scale: float, block_m: int, block_n: int) -> tuple:
    """The forward's scalars (`gluon_tapa_host.kernel_scalars`: qk_scale, alpha, k_turn, c_1 .. c_5,
    r_min for this tile) and ds_scale = scale / sqrt(D_A), the epilogue's factor (module docstring)."""
    return (*gluon_tapa_host.kernel_scalars(D, alpha, phase_scale, scale, block_m, block_n), scale / math.sqrt(D // 2))


def gluon_tapa_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                   lse: torch.Tensor, *, alpha: float = 0.1, theta: float = 0.5, phase_scale: float = _TWO_PI,
                   linear: bool = False, scale: float = 1.0, causal: bool = True, grads: tuple | None = None,
                   dkdv_tile: tuple | None = None, dq_tile: tuple | None = None,
                   variants=None) -> tuple[torch.Tensor, ...]:
    """(dq, dk, dv) in the inputs' dtype of TAPA attention with index positions, given dO, the
    forward's out and lse (either forward's: log2 units, +inf for a row that sees no key); q
    [B,H,T,D], k, v [B,G,S,D]; arguments as `function.tapa_attention` (linear: the linear phase),
    validated the same way; `supported` must hold. grads: optional preallocated contiguous (dq, dk,
    dv) (tests poison them); dkdv_tile / dq_tile: (BLOCK_M, BLOCK_N, STAGES, warps), default
    DKDV_TILES[D] / DQ_TILES[D]; variants: names from `gluon_tapa_host.VARIANTS` (default
    `gluon_tapa_host.DEFAULT_VARIANTS[D]`), the same schedules in both kernels. Deterministic: no atomics."""
    params = ScoreMod(kind="tapa", params={"alpha": alpha, "theta": theta, "phase_scale": phase_scale,
                                           "phase": "linear" if linear else "quadratic"}).params
    do, q, k, v, out, lse, (dq, dk, dv) = _validated(do, q, k, v, out, lse, grads, params, scale)
    B, H, T, D = q.shape
    flags = gluon_tapa_host.variant_flags(variants, D)   # "lazy", "fws" and "occupancy" are the forward's
    table, order3, ws, diag = flags.table, flags.order3, flags.ws, flags.diag
    G, S = k.shape[1], k.shape[2]
    dkdv_tile, dq_tile = tuple(dkdv_tile or DKDV_TILES[D]), tuple(dq_tile or DQ_TILES[D])
    check_tile(dkdv_tile, 1)
    check_tile(dq_tile, 0)
    dlt = do_o_rows(do, out)  # Delta_t = <dO_t, O_t>, fp32 [B, H, T]
    meta = {"CAUSAL": bool(causal), "LINEAR": bool(linear)}
    dkdv_kernel, dkdv_meta = ((gluon_tapa_bwd_dkdv_ws_kernel, {"PRODUCER_REGS": PRODUCER_REGS}) if ws
                              else (gluon_tapa_bwd_dkdv_kernel, {}))
    for kernel, (bm, bn, stages, warps), grid, outs, extra_meta in (
            (dkdv_kernel, dkdv_tile, (triton.cdiv(S, dkdv_tile[1]), B * G), (dk, dv), dkdv_meta),
            (gluon_tapa_bwd_dq_kernel, dq_tile, (triton.cdiv(T, dq_tile[0]), B * H), (dq,), {"COEF": flags.coef})):
        *scalars, ds_scale = kernel_scalars(D, params["alpha"], float(params["phase_scale"]), float(scale), bm, bn)
        # dQ's tiles read the forward's coefficient table; dK/dV's transposed ones compute theirs
        extra = gluon_tapa_host.variant_scalars(scalars, params["alpha"], T, S, bm, bn, table, order3, q.device,
                                                extra_meta.get("COEF", False))
        qa, qp, ka, kp, vd = gluon_tapa_host.descriptors(q, k, v, bm, bn)
        launch(kernel, grid, qa, qp, descriptor(do, bm), ka, kp, vd, lse, dlt, *outs, T, S, H, H // G, *scalars,
               *extra, ds_scale, STAGES=stages, TABLE=table, DIAG=diag, num_warps=warps, **meta, **extra_meta)
    return dq, dk, dv
