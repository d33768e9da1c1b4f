"""Hopper (sm_90) forward of TAPA attention in Gluon (MATH §4.2, §4.3), on the skeleton of the plain
Gluon forward (kernels/flash/gluon_hopper.py: TMA rings for K and V, asynchronous wgmma, one softmax
warpgroup a CTA, every wgmma retired within its step, ptxas warning C7514 otherwise).

Spec: `reference.attention` with a tapa `ScoreMod` and index positions (the T queries are the last
T of the S keys: query t sits at m = t + S - T, key s at n = s; key s is visible iff n <= m when
causal), GQA (head h reads kv head h // (H // G)), D in {64, 128} split D_A = D_P = D / 2
(theta = 0.5, the `tl` kernel's default), bf16 or fp16, scale > 0. TAPA's score depends on the
positions only through |m - n| (MATH §4.6), so the absolute offset of the positions is irrelevant
and the launcher takes none; the distance is the int32 difference of the two indices, converted to
fp32 once (correctly rounded at any length). Returns (out [B, H, T, D] in q's dtype, lse [B, H, T]
fp32) in the convention of `triton_tapa.tapa_fwd`: log2 units of scale * score * log2 e, +inf for a
row that sees no key (its output 0), so `triton_tapa.tapa_bwd` consumes it unchanged.

Per key block j (BLOCK_N keys) of a query block (BLOCK_M rows), as in triton_tapa.py:
    S_P = Q_P K_P^T  (linear phase: ones K_P^T, plus the row sums of Q_P; see `_linear_setup`)
    S_A = Q_A K_A^T
    W   = k_turn |m - n|^alpha,  k_turn = phase_scale / (2 pi sqrt(D_P))   (turns per unit of S_P)
    logit * log2 e = qk_scale * S_A * cos(2 pi (t - rint t)),  t = W S_P,  qk_scale = scale log2 e / sqrt(D_A)
Schedule of step j (FA3's intra-warpgroup overlap, https://arxiv.org/abs/2407.08608 section 3.2):

    issue S_P, S_A (async); O *= alpha_{j-1}; issue PV_{j-1} (async)
    W of the tile (FMA pipe, overlaps the three wgmmas)
    wait S_P  | refill K_P slot;  cos of the phase (overlaps S_A and PV)
    wait S_A  | refill K_A slot;  online softmax of S_A cos (exp2 domain)
    wait PV   | refill V slot of block j-1

W comes three ways. Tiles whose central distance D_c (|D_c| >= r_min) dwarfs the in-tile spread
take phase.py's binomial series about the centre: |m - n|^alpha = |D_c|^alpha (1 + u)^alpha with
u = e / D_c, e = (i - j') - (BLOCK_M - BLOCK_N) / 2 for in-tile row i, column j' (|e| <= (BLOCK_M +
BLOCK_N - 2) / 2), evaluated as a polynomial in e whose coefficients k_turn |D_c|^alpha
binom(alpha, k) / D_c^k are taken once per tile (one exact power), five FMAs per distinct e
(`_w_series_e`; the backward's kernels use it too); `phase._taylor`'s radius u_max bounds the tail
below 1.4e-7 of |D_c|^alpha and sets r_min; with the "order3" variant (on by default), tiles at
|D_c| >= r_3 (the third-order series' radius, the same bound) take three terms. Tiles near
the diagonal take exp2(alpha lg2 d) (lg2(0) = -inf gives 0^alpha = 0), or with the "table" variant
a table of k_turn d^alpha rounded once from float64; masked tiles (the diagonal, ragged ends) the
exact power.
The phase is reduced in turns, t - rint(t) exact in fp32 (MATH §7.4), rint by the 1.5 * 2**23
shifter on the FMA pipe (identical to cvt.rni for |t| < 2**22; beyond, where t's own ulp is half a
turn and the phase carries no information, it still returns t minus an integer or half-integer).

The module imports without Gluon (CPU machines, other Triton versions): `gluon_tapa_host.supported`
says why the kernel cannot run, and nothing Gluon runs under TRITON_INTERPRET.
"""

from __future__ import annotations

import math
import os
from typing import NamedTuple

import torch

from phaselab.kernels.common.score_mod import ScoreMod
from phaselab.kernels.flash import gluon_common
from phaselab.kernels.flash.gluon_common import PRODUCER_REGS, launch
from phaselab.kernels.tapa.gluon_tapa_host import (
    PINGPONG_CONSUMER_REGS,
    descriptors,
    forward_tile,
    interleave_heads,
    kernel_scalars,
    launch_regs,
    persistent_programs,
    query_blocks,
    supported,
    variant_flags,
    variant_scalars,
)

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
    from phaselab.kernels.flash.gluon_hopper import (
        _block_range,
        _epilogue,
        _free_k,
        _load_block,
        _p_operand,
        _produce_block,
        _pv,
        _softmax,
    )


def diag_poly_asm(order: int, regs: int = 32) -> str:
    """The "diag" variant's W polynomial as PTX over one thread's `regs` accumulators of a wgmma
    score tile (N = 2 regs columns, 16 rows a warp): register k = 4 i + 2 h + b holds row r0 + 8 h
    and column c0 + 8 i + b (PTX ISA, wgmma .m64nNk16 accumulator fragments), so its in-tile
    offset, a function of row - column, is that of register 4 (i - 1) + b wherever h = 1 and
    i >= 1 (64 x 64: 14 of 32). Horner runs on the others (the same FMAs as `_w_poly`, so the same
    bits) and those copy. Operands (`diag_constraints`): $0.. W, then e, then `regs` copies each of
    f, g_1 .. g_order."""
    coef = [regs * (2 + i) for i in range(order + 1)]
    lines, copies = [], []
    for k in range(regs):
        i, h, b = k // 4, (k // 2) % 2, k % 2
        if h == 1 and i >= 1:
            copies.append(f"mov.b32 ${k}, ${4 * (i - 1) + b};")
            continue
        lines.append(f"fma.rn.f32 ${k}, ${coef[order]}, ${regs + k}, ${coef[order - 1]};")
        lines += [f"fma.rn.f32 ${k}, ${k}, ${regs + k}, ${coef[c]};" for c in reversed(range(order - 1))]
    return "{ " + " ".join(lines + copies) + " }"


def diag_constraints(order: int, regs: int = 32) -> str:
    """The operand constraints of `diag_poly_asm(order, regs)`: `regs` outputs, then the inputs."""
    return ",".join(["=r"] * regs + ["r"] * (regs * (order + 2)))


if gluon_common.IMPORT_ERROR is None:
    # compile-time calls from the kernels (a plain function may not be referenced from Gluon code)
    diag_poly_asm = gluon.constexpr_function(diag_poly_asm)
    diag_constraints = gluon.constexpr_function(diag_constraints)

    @gluon.jit
    def _lg2(x):
        return gl.inline_asm_elementwise("lg2.approx.f32 $0, $1;", "=r,r", [x], dtype=gl.float32, is_pure=True,
                                         pack=1)

    @gluon.jit
    def _cos_turns(t):
        """cos(2 pi t) of fp32 turns t: t - rint(t) by the shifter (module docstring), cos.approx."""
        r = t - ((t + 12582912.0) - 12582912.0)
        return gl.inline_asm_elementwise("cos.approx.f32 $0, $1;", "=r,r", [r * 6.283185307179586],
                                         dtype=gl.float32, is_pure=True, pack=1)

    @gluon.jit
    def _w_exact(row_pos, n0, cols, alpha, k_turn):
        """W = k_turn |m - n|^alpha [BM, BN]: the integer distance, one conversion, exp2(alpha lg2 d)."""
        d = gl.abs(row_pos[:, None] - (n0 + cols)[None, :]).to(gl.float32)
        return k_turn * gl.exp2(alpha * _lg2(d))

    @gluon.jit
    def _w_series_e(x0, n0, ri, ci, alpha, k_turn, c1, c2, c3, c4, c5, ORDER: gl.constexpr = 5,
                    DIAG: gl.constexpr = False):
        """W [BM, BN] by the binomial series about the tile's central distance D_c = x0 - n0
        (|D_c| >= r_min, or r_3 for ORDER 3) in the integer in-tile offset e = ri - ci (ri = i,
        ci = j' + (BM - BN) / 2, int32 vectors): terms c_0 .. c_ORDER of u = e / D_c, as a
        polynomial in e with the coefficients f c_k / D_c^k of the tile, f = k_turn |D_c|^alpha. e
        does not depend on the tile (the compiler keeps it across the loop): D = 128, fifth order,
        845 SASS instructions an iteration against 878 for the series in u = (i * inv)[:, None] -
        (j * inv)[None, :], 241 registers against 255. A thread's 32 scores of a 64-row wgmma tile
        lie on 18 diagonals, but the compiler evaluates all 32 (the layout's row and column
        indices are ORs it does not subtract through); DIAG evaluates the 18 (`diag_poly_asm`).
        e goes to fp32 exactly by the 1.5 * 2**23 shifter (|e| < 2**22). Relative error against
        k_turn |m - n|^alpha, emulated in fp32 at alpha 0.1: 1.2e-7 at D_c = r_min."""
        dc = (x0 - n0).to(gl.float32)
        inv = 1.0 / dc
        f = k_turn * gl.exp2(alpha * gl.log2(gl.abs(dc)))
        fi = f * inv
        inv2 = inv * inv
        g4 = 0.0
        g5 = 0.0
        if ORDER == 5:
            g4 = fi * inv2 * inv * c4
            g5 = fi * inv2 * inv2 * c5
        return _w_poly(_offsets(ri, ci), (f, fi * c1, fi * inv * c2, fi * inv2 * c3, g4, g5), ORDER, DIAG)

    @gluon.jit
    def _offsets(ri, ci):
        """e = ri - ci [BM, BN] in fp32, exactly by the 1.5 * 2**23 shifter (|e| < 2**22)."""
        ebits = ri[:, None] - ci[None, :] + 0x4B400000
        return ebits.to(gl.float32, bitcast=True) - 12582912.0

    @gluon.jit
    def _w_poly(e, g, ORDER: gl.constexpr, DIAG: gl.constexpr = False):
        """f + g_1 e + ... + g_ORDER e^ORDER by Horner, g = (f, g_1 .. g_5) (ORDER 3 or 5); DIAG:
        once a diagonal (`diag_poly_asm`; e in a wgmma accumulator layout, 16 rows a warp)."""
        f, g1, g2, g3, g4, g5 = g
        if DIAG:
            REGS: gl.constexpr = e.shape[1] // 2
            gl.static_assert(e.shape[0] == 16 * gl.num_warps() and REGS % 4 == 0,
                             "the diag variant needs a wgmma accumulator tile, 16 rows a warp")
            if ORDER == 5:
                w = gl.inline_asm_elementwise(diag_poly_asm(5, REGS), diag_constraints(5, REGS),
                                              [e, f, g1, g2, g3, g4, g5], dtype=gl.float32, is_pure=True,
                                              pack=REGS)
            else:
                w = gl.inline_asm_elementwise(diag_poly_asm(3, REGS), diag_constraints(3, REGS),
                                              [e, f, g1, g2, g3], dtype=gl.float32, is_pure=True, pack=REGS)
        else:
            if ORDER == 5:
                w = ((g5 * e + g4) * e + g3) * e + g2
            else:
                w = g3 * e + g2
            w = w * e + g1
            w = w * e + f
        return w

    @gluon.jit
    def _coef_row(j, geo, ph, MODE: gl.constexpr, BLOCK_N: gl.constexpr):
        """The "coef" variant's series coefficients (f, g_1 .. g_5) of key block j, read from its row
        of `coefficient_table` (ph[8], row base ph[9]); g_4, g_5 only at the fifth order (MODE 0).
        Issued at the top of the step, so the loads are in flight during the QK^T wgmmas."""
        row = ph[8] + ((geo[0] - ph[9]) // BLOCK_N - j) * 8
        g4 = 0.0
        g5 = 0.0
        if MODE == 0:
            g4 = gl.load(row + 4)
            g5 = gl.load(row + 5)
        return gl.load(row), gl.load(row + 1), gl.load(row + 2), gl.load(row + 3), g4, g5

    @gluon.jit
    def _w_table(row_pos, n0, cols, table):
        """W [BM, BN] = table[|m - n|] (`distance_table`: k_turn d^alpha for d < r_min + BM + BN)."""
        return gl.load(table + gl.abs(row_pos[:, None] - (n0 + cols)[None, :]))

    @gluon.jit
    def _weight(j, geo, ph, MODE: gl.constexpr, BLOCK_N: gl.constexpr, TABLE: gl.constexpr = False, coef=None,
                DIAG: gl.constexpr = False, MASKED_TABLE: gl.constexpr = False):
        """W of key block j: MODE 0 the series, 3 the series to the third order (with the "coef"
        variant's coefficients where `coef` is given, `_coef_row`; DIAG: the "diag" variant's
        polynomial), 1 (near) the exact power or, TABLE, the distance table, 2 (masked) the exact
        power or, MASKED_TABLE, the table: only for the masked blocks of a causal launch past
        block 0, where |m - n| < BM + BN (`_block_range`: n0 > m0 + S - T + 1 - BN and
        n0 < m0 + BM + S - T), within every table (`variant_scalars`)."""
        x0, row_pos, ri, cols, _sq = geo
        alpha, k_turn, c1, c2, c3, c4, c5 = ph[:7]
        if (MODE == 0 or MODE == 3) and coef is not None:
            CENTRE_C: gl.constexpr = (ri.shape[0] - BLOCK_N) // 2
            w = _w_poly(_offsets(ri, cols + CENTRE_C), coef, 5 if MODE == 0 else 3, DIAG)
        elif MODE == 0 or MODE == 3:
            CENTRE: gl.constexpr = (ri.shape[0] - BLOCK_N) // 2
            w = _w_series_e(x0, j * BLOCK_N, ri, cols + CENTRE, alpha, k_turn, c1, c2, c3, c4,
                            c5, 5 if MODE == 0 else 3, DIAG)
        elif (MODE == 1 and TABLE) or (MODE == 2 and MASKED_TABLE):
            w = _w_table(row_pos, j * BLOCK_N, cols, ph[7])
        else:
            w = _w_exact(row_pos, j * BLOCK_N, cols, alpha, k_turn)
        return w

    @gluon.jit
    def _step(r, hi, o, p, alpha_r, m_i, l_i, bufs, descs, geo, ph, kv_row, S, qk_scale, ring, turn,
              MODE: gl.constexpr, CAUSAL: gl.constexpr, LINEAR: gl.constexpr, STAGES: gl.constexpr, TABLE: gl.constexpr,
              COEF: gl.constexpr, LAZY: gl.constexpr, DIAG: gl.constexpr, WS: gl.constexpr,
              PERSIST: gl.constexpr, PP: gl.constexpr, s_layout: gl.constexpr, o_layout: gl.constexpr):
        """Key block j = r - ring[0] at ring index r (module docstring's schedule; ring[0] is 0 but
        in the "persistent" kernel); MODE as `_weight`'s (2: masked). Enters with P_{j-1} and its
        alpha, leaves with P_j; O holds PV up to block j-1 on return. COEF, LAZY, DIAG, WS,
        PERSIST, PP: the "coef", "lazy", "diag", "fws", "persistent" and "pingpong" variants
        (gluon_tapa_host.VARIANTS; WS: a producer warp refills the rings, `_produce`; PERSIST:
        `_release`; PP: `_my_turn`, `_your_turn` around the three products' issue)."""
        qa_smem, qp_smem, ka_smem, kp_smem, v_smem, ka_bars, kp_bars, v_bars, ka_empty, kp_empty, v_empty = bufs
        ka_desc, kp_desc, v_desc = descs
        BLOCK_M: gl.constexpr = qa_smem.shape[0]
        BLOCK_N: gl.constexpr = ka_smem.shape[1]
        j = r - ring[0]
        slot = r % STAGES
        coef = None
        if COEF and (MODE == 0 or MODE == 3):
            coef = _coef_row(j, geo, ph, MODE, BLOCK_N)
        zeros = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        mbarrier.wait(kp_bars.index(slot), (r // STAGES) & 1)
        if PP:
            _my_turn(j, turn)
        sp_tok = warpgroup_mma(qp_smem, kp_smem.index(slot).permute((1, 0)), zeros, use_acc=False, is_async=True)
        mbarrier.wait(ka_bars.index(slot), (r // STAGES) & 1)
        sa_tok = warpgroup_mma(qa_smem, ka_smem.index(slot).permute((1, 0)), zeros, use_acc=False, is_async=True)
        o_tok = _pv(o, p, alpha_r, v_smem, v_bars, r - 1, STAGES, o_layout, LAZY)
        if PP:
            _your_turn(turn)
        sp = warpgroup_mma_wait(2, deps=(sp_tok,))
        _release(j, hi, ring[0], kp_desc, kp_smem, kp_bars, kp_empty, kv_row, STAGES, WS, PERSIST)
        if LINEAR:
            sp = sp + geo[4][:, None]
        # W after the wait: computed before it, the tile sat beside three accumulators in flight
        # (255 registers a thread, benchmarks/gluon_compile_tapa.py); S_A and PV still overlap it
        c = _cos_turns(_weight(j, geo, ph, MODE, BLOCK_N, TABLE, coef, DIAG, TABLE and CAUSAL) * sp)
        sa = warpgroup_mma_wait(1, deps=(sa_tok,))
        _release(j, hi, ring[0], ka_desc, ka_smem, ka_bars, ka_empty, kv_row, STAGES, WS, PERSIST)
        p, alpha_r, m_i, l_i = _softmax(sa * c, m_i, l_i, j * BLOCK_N, geo[1], S, qk_scale, MODE == 2, CAUSAL,
                                        s_layout, LAZY)
        p = _p_operand(p, ka_smem.dtype, o_layout)
        o = warpgroup_mma_wait(0, deps=(o_tok,))
        _release(j - 1, hi, ring[0], v_desc, v_smem, v_bars, v_empty, kv_row, STAGES, WS, PERSIST)  # V of block j-1
        return o, p, alpha_r, m_i, l_i

    @gluon.jit
    def _my_turn(j, turn):
        """The "pingpong" kernel's order (FlashAttention-3's ping-pong, https://arxiv.org/abs/2407.08608
        section 3.1): consumer warpgroup w = turn[1] issues step j's products (j >= 1) after the
        other one issued its step j - 1 + w, so that one warpgroup's products run on the tensor
        cores while the other's softmax runs. turn[0] holds one barrier a warpgroup, each completed
        once a step by the other (`_your_turn`); both run the same key blocks, so before an item
        each barrier has completed c = turn[2] times (the sum of the earlier items' steps past
        their first) and w waits for its (c + j - 1 + w)-th completion, parity (c + j + w) & 1 (a
        fresh barrier passes parity 1). Neither warpgroup can arrive twice while the other waits
        once, so a barrier is never two phases ahead of its wait."""
        mbarrier.wait(turn[0].index(turn[1]), (turn[2] + j + turn[1]) & 1)

    @gluon.jit
    def _your_turn(turn):
        """This warpgroup issued its step's products: the other's turn (`_my_turn`), once all four
        warps are past the issue."""
        gl.thread_barrier()
        mbarrier.arrive(turn[0].index(1 - turn[1]), count=1)

    @gluon.jit
    def _release(j, hi, g, desc, smem, bars, empty, kv_row, STAGES: gl.constexpr, WS: gl.constexpr,
                 PERSIST: gl.constexpr):
        """Block j's slot of one ring is free (its wgmma retired): `gluon_hopper._free_k`, or
        (PERSIST, the item's block j at ring index g + j) load block j + STAGES into it."""
        if PERSIST:
            _load_block(g + j + STAGES, kv_row + (j + STAGES) * smem.shape[1], j + STAGES < hi, desc, smem, bars,
                        STAGES)
        else:   # g = 0 but in the "pingpong" kernel, whose releases (WS) take ring slots
            _free_k(g + j, hi, desc, smem, bars, empty, kv_row, STAGES, WS)

    @gluon.jit
    def _first_block(m_i, l_i, bufs, descs, geo, ph, kv_row, hi, S, qk_scale, ring, CAUSAL: gl.constexpr,
                     LINEAR: gl.constexpr, STAGES: gl.constexpr, WS: gl.constexpr, PERSIST: gl.constexpr,
                     s_layout: gl.constexpr, o_layout: gl.constexpr):
        """Block 0, always masked (it may be the diagonal or the ragged end): (P_0, alpha, m, l)."""
        qa_smem, qp_smem, ka_smem, kp_smem, ka_bars, kp_bars = bufs[0], bufs[1], bufs[2], bufs[3], bufs[5], bufs[6]
        ka_empty, kp_empty = bufs[8], bufs[9]
        ka_desc, kp_desc = descs[0], descs[1]
        BLOCK_M: gl.constexpr = qa_smem.shape[0]
        BLOCK_N: gl.constexpr = ka_smem.shape[1]
        zeros = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        slot = ring[0] % STAGES
        phase = (ring[0] // STAGES) & 1
        mbarrier.wait(kp_bars.index(slot), phase)
        mbarrier.wait(ka_bars.index(slot), phase)
        sp = warpgroup_mma(qp_smem, kp_smem.index(slot).permute((1, 0)), zeros, use_acc=False)
        sa = warpgroup_mma(qa_smem, ka_smem.index(slot).permute((1, 0)), zeros, use_acc=False)
        _release(0, hi, ring[0], kp_desc, kp_smem, kp_bars, kp_empty, kv_row, STAGES, WS, PERSIST)
        _release(0, hi, ring[0], ka_desc, ka_smem, ka_bars, ka_empty, kv_row, STAGES, WS, PERSIST)
        if LINEAR:
            sp = sp + geo[4][:, None]
        c = _cos_turns(_weight(0, geo, ph, 2, BLOCK_N) * sp)
        p, alpha_r, m_i, l_i = _softmax(sa * c, m_i, l_i, 0, geo[1], S, qk_scale, True, CAUSAL, s_layout)
        return _p_operand(p, ka_smem.dtype, o_layout), alpha_r, m_i, l_i

    @gluon.jit
    def _linear_setup(qp_smem, s_layout: gl.constexpr, num_warps: gl.constexpr):
        """The linear phase (MATH §4.3): returns sum_j q_P[m, j] per row (fp32) and overwrites Q_P's
        buffer with ones, so that its wgmma gives sum_j k_P[n, j] for every row (fp32 accumulation)."""
        BLOCK_M: gl.constexpr = qp_smem.shape[0]
        DP: gl.constexpr = qp_smem.shape[1]
        ld: gl.constexpr = rows_layout(num_warps, DP)
        x = qp_smem.load(ld)
        sq = gl.convert_layout(gl.sum(x.to(gl.float32), 1), gl.SliceLayout(1, s_layout))
        gl.thread_barrier()  # every row read before any is overwritten
        qp_smem.store(gl.full([BLOCK_M, DP], 1.0, qp_smem.dtype, ld))
        fence_async_shared()  # generic-proxy stores made visible to wgmma (async proxy)
        gl.thread_barrier()
        return sq

    @gluon.jit
    def _near_range(x0, r_min, mid, BLOCK_N: gl.constexpr):
        """(a, b): blocks [a, b) within [1, mid) have |D_c| < r_min (exact W); [1, a) and [b, mid)
        take the series. D_c = x0 - j BLOCK_N decreases with j."""
        lo = x0 - r_min
        a = gl.where(lo >= 0, lo // BLOCK_N + 1, 0)
        b = gl.cdiv(gl.maximum(x0 + r_min, 0), BLOCK_N)
        a = gl.minimum(gl.maximum(a, 1), mid)
        return a, gl.minimum(gl.maximum(b, a), mid)

    @gluon.jit
    def _geometry(m0, T, S, LINEAR: gl.constexpr, qp_smem, BLOCK_N: gl.constexpr, s_layout: gl.constexpr,
                  num_warps: gl.constexpr):
        """(x0, row_pos, ri, cols, sq): the central distance of block 0, each row's position
        m = t + S - T (int32), the row offsets of the series (int32), the column offsets, and the
        linear phase's row sums (zeros for the quadratic phase)."""
        BLOCK_M: gl.constexpr = qp_smem.shape[0]
        CENTRE: gl.constexpr = (BLOCK_M - BLOCK_N) // 2
        r = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
        cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        if LINEAR:
            sq = _linear_setup(qp_smem, s_layout, num_warps)
        else:
            sq = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, s_layout))
        return (m0 + S - T + CENTRE, m0 + r + (S - T), r, cols, sq)

    @gluon.jit
    def _consume(bufs, descs, ph, q_bar, o_ptr, lse_ptr, i_bh, m0, kv_row, mid, hi, T, S, qk_scale, r_min, r_3,
                 CAUSAL: gl.constexpr, LINEAR: gl.constexpr, STAGES: gl.constexpr, TABLE: gl.constexpr,
                 COEF: gl.constexpr, LAZY: gl.constexpr, DIAG: gl.constexpr, WS: gl.constexpr,
                 ring, q_phase, PERSIST: gl.constexpr, num_warps: gl.constexpr, turn, PP: gl.constexpr):
        """The softmax warpgroups' schedule over key blocks 0..hi-1 and the epilogue. Unmasked blocks
        by their central distance D_c: |D_c| >= r_3 the third-order series, r_min <= |D_c| < r_3 the
        fifth-order one (without "order3" r_3 = _R_MIN_CAP, past every distance below 2**29: none of
        the first), |D_c| < r_min the exact power. PERSIST: one item of the persistent kernel (its
        Q barrier's phase q_phase; ring as `_prefetch`'s). PP: one consumer warpgroup of the
        "pingpong" kernel (turn as `_my_turn`'s)."""
        BLOCK_M: gl.constexpr = bufs[0].shape[0]
        BLOCK_N: gl.constexpr = bufs[2].shape[1]
        HEAD_D: gl.constexpr = bufs[4].shape[2]
        s_layout: gl.constexpr = mma_layout(num_warps, BLOCK_N)
        o_layout: gl.constexpr = mma_layout(num_warps, HEAD_D)
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
        l_i = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, s_layout))
        o = gl.zeros([BLOCK_M, HEAD_D], gl.float32, o_layout)
        mbarrier.wait(q_bar, q_phase)
        geo = _geometry(m0, T, S, LINEAR, bufs[1], BLOCK_N, s_layout, num_warps)
        p, alpha_r, m_i, l_i = _first_block(m_i, l_i, bufs, descs, geo, ph, kv_row, hi, S, qk_scale, ring, CAUSAL,
                                            LINEAR, STAGES, WS, PERSIST, s_layout, o_layout)
        a, b = _near_range(geo[0], r_min, mid, BLOCK_N)
        a3, b3 = _near_range(geo[0], r_3, mid, BLOCK_N)  # a3 <= a <= b <= b3 (r_3 >= r_min)
        args = (bufs, descs, geo, ph, kv_row, S, qk_scale, ring, turn)
        g = ring[0]  # the loops run over ring indices (`_step`)
        for r in range(g + 1, g + a3):  # far before the diagonal: the third-order series
            o, p, alpha_r, m_i, l_i = _step(r, hi, o, p, alpha_r, m_i, l_i, *args, 3, CAUSAL, LINEAR, STAGES, TABLE,
                                            COEF, LAZY, DIAG, WS, PERSIST, PP, s_layout, o_layout)
        for r in range(g + a3, g + a):  # before the diagonal: the fifth-order series
            o, p, alpha_r, m_i, l_i = _step(r, hi, o, p, alpha_r, m_i, l_i, *args, 0, CAUSAL, LINEAR, STAGES, TABLE,
                                            COEF, LAZY, DIAG, WS, PERSIST, PP, s_layout, o_layout)
        for r in range(g + a, g + b):  # near the diagonal, unmasked: the exact power
            o, p, alpha_r, m_i, l_i = _step(r, hi, o, p, alpha_r, m_i, l_i, *args, 1, CAUSAL, LINEAR, STAGES, TABLE,
                                            COEF, LAZY, DIAG, WS, PERSIST, PP, s_layout, o_layout)
        for r in range(g + b, g + b3):  # after the diagonal (non-causal): the fifth-order series
            o, p, alpha_r, m_i, l_i = _step(r, hi, o, p, alpha_r, m_i, l_i, *args, 0, CAUSAL, LINEAR, STAGES, TABLE,
                                            COEF, LAZY, DIAG, WS, PERSIST, PP, s_layout, o_layout)
        for r in range(g + b3, g + mid):  # far after the diagonal (non-causal): the third-order series
            o, p, alpha_r, m_i, l_i = _step(r, hi, o, p, alpha_r, m_i, l_i, *args, 3, CAUSAL, LINEAR, STAGES, TABLE,
                                            COEF, LAZY, DIAG, WS, PERSIST, PP, s_layout, o_layout)
        for r in range(g + mid, g + hi):  # masked: the exact power
            o, p, alpha_r, m_i, l_i = _step(r, hi, o, p, alpha_r, m_i, l_i, *args, 2, CAUSAL, LINEAR, STAGES, TABLE,
                                            COEF, LAZY, DIAG, WS, PERSIST, PP, s_layout, o_layout)
        r_last = g + hi - 1
        if PERSIST:
            _prefetch(ring, hi, bufs, descs, STAGES, 0, STAGES, 0, STAGES - 1)
        o = warpgroup_mma_wait(0, deps=(_pv(o, p, alpha_r, bufs[4], bufs[7], r_last, STAGES, o_layout),))
        if PERSIST:
            _prefetch(ring, hi, bufs, descs, STAGES, 0, 0, STAGES - 1, STAGES)
        if PP:   # the item's last V slot and its Q buffer are free for the producer's next items
            _free_k(r_last, hi, descs[2], bufs[4], bufs[7], bufs[10], kv_row, STAGES, True)
            mbarrier.arrive(turn[3], count=1)
        _epilogue(o, m_i, l_i, o_ptr, lse_ptr, i_bh, m0, T, s_layout, o_layout, num_warps)

    @gluon.jit
    def _prefetch(ring, hi, bufs, descs, STAGES: gl.constexpr, K_LO: gl.constexpr, K_HI: gl.constexpr,
                  V_LO: gl.constexpr, V_HI: gl.constexpr):
        """The persistent kernel's loads of the next item's K blocks [K_LO, K_HI) and V blocks
        [V_LO, V_HI) into slots whose blocks of this item retired: ring = (this item's first ring
        index g, the next item's kv_row and hi, 0 where there is none); the next item's block k
        sits at ring index g + hi + k."""
        g, kv_next, hi_next = ring
        BLOCK_N: gl.constexpr = bufs[2].shape[1]
        for k in gl.static_range(K_LO, K_HI):
            _load_block(g + hi + k, kv_next + k * BLOCK_N, k < hi_next, descs[1], bufs[3], bufs[6], STAGES)
            _load_block(g + hi + k, kv_next + k * BLOCK_N, k < hi_next, descs[0], bufs[2], bufs[5], STAGES)
        for k in gl.static_range(V_LO, V_HI):
            _load_block(g + hi + k, kv_next + k * BLOCK_N, k < hi_next, descs[2], bufs[4], bufs[7], STAGES)

    @gluon.jit
    def _ring(desc, STAGES: gl.constexpr):
        """A STAGES-slot ring of desc's blocks and its ready barriers."""
        smem = gl.allocate_shared_memory(desc.dtype, [STAGES, desc.block_type.shape[0], desc.block_type.shape[1]],
                                         desc.layout)
        return smem, _barriers(STAGES)

    @gluon.jit
    def _barriers(STAGES: gl.constexpr, COUNT: gl.constexpr = 1):
        """STAGES mbarriers of COUNT arrivals each."""
        bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(bars.index(i), count=COUNT)
        return bars

    @gluon.jit
    def _program(HEADS: gl.constexpr):
        """(i_bh, i_m) of this program (`_order` of its place in the grid, program_id(0) fastest)."""
        return _order(gl.program_id(0) + gl.program_id(1) * gl.num_programs(0), gl.num_programs(0),
                      gl.num_programs(1), HEADS)

    @gluon.jit
    def _order(w, n_m, n_bh, HEADS: gl.constexpr):
        """(i_bh, i_m) of the w-th of n_bh x n_m query blocks, longest (causal) rows first: all of one
        head's blocks before the next head's (HEADS = 1), or (HEADS > 1, the "interleave" variant)
        each query block of HEADS heads in turn before the next shorter one (the last group: the
        heads left), so that a launch ends on its shortest rows while the K and V of only about
        HEADS heads are in flight."""
        first = w // (HEADS * n_m) * HEADS
        heads = gl.minimum(n_bh - first, HEADS)
        r = w - first * n_m
        return first + r % heads, n_m - 1 - r // heads

    @gluon.jit
    def _setup(qa_desc, qp_desc, ka_desc, kp_desc, v_desc, T, S, H, GROUP, CAUSAL: gl.constexpr,
               STAGES: gl.constexpr, WS: gl.constexpr, HEADS: gl.constexpr):
        """(i_bh, m0, kv_row, mid, hi, q_bar, bufs) of this program (`_program`): Q's halves, the K_A,
        K_P and V rings with their ready barriers and (WS) the consumers' "empty" barriers (without
        WS the ready ones stand in, never waited on as empty)."""
        BLOCK_M: gl.constexpr = qa_desc.block_type.shape[0]
        BLOCK_N: gl.constexpr = ka_desc.block_type.shape[0]
        i_bh, i_m = _program(HEADS)
        kv_row = kv_base_row(i_bh, H, GROUP, S)
        mid, hi = _block_range(i_m, T, S, BLOCK_M, BLOCK_N, CAUSAL)
        qa_smem = gl.allocate_shared_memory(qa_desc.dtype, qa_desc.block_type.shape, qa_desc.layout)
        qp_smem = gl.allocate_shared_memory(qp_desc.dtype, qp_desc.block_type.shape, qp_desc.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        ka_smem, ka_bars = _ring(ka_desc, STAGES)
        kp_smem, kp_bars = _ring(kp_desc, STAGES)
        v_smem, v_bars = _ring(v_desc, STAGES)
        if WS:
            ka_empty = _barriers(STAGES)
            kp_empty = _barriers(STAGES)
            v_empty = _barriers(STAGES)
        else:
            ka_empty = ka_bars
            kp_empty = kp_bars
            v_empty = v_bars
        bufs = (qa_smem, qp_smem, ka_smem, kp_smem, v_smem, ka_bars, kp_bars, v_bars, ka_empty, kp_empty, v_empty)
        return i_bh, i_m * BLOCK_M, kv_row, mid, hi, q_bar, bufs

    @gluon.jit
    def _load_q(qa_desc, qp_desc, q_bar, bufs, q_row, pred=True):
        """TMA Q's amplitude and phase halves (one barrier), if pred."""
        mbarrier.expect(q_bar, qa_desc.block_type.nbytes + qp_desc.block_type.nbytes, pred=pred)
        tma.async_copy_global_to_shared(qa_desc, [q_row, 0], q_bar, bufs[0], pred=pred)
        tma.async_copy_global_to_shared(qp_desc, [q_row, 0], q_bar, bufs[1], pred=pred)

    @gluon.jit
    def _produce(qa_desc, qp_desc, descs, q_bar, bufs, q_row, kv_row, hi, STAGES: gl.constexpr):
        """The producer warp ("fws"): Q's halves, then K_P, K_A and V of each key block in the
        order the consumers use them (`gluon_hopper._produce_block`)."""
        _qa, _qp, ka_smem, kp_smem, v_smem, ka_bars, kp_bars, v_bars, ka_empty, kp_empty, v_empty = bufs
        ka_desc, kp_desc, v_desc = descs
        _load_q(qa_desc, qp_desc, q_bar, bufs, q_row)
        for i in range(hi):
            _produce_block(kp_desc, kp_bars, kp_smem, kp_empty, kv_row, i, hi, STAGES)
            _produce_block(ka_desc, ka_bars, ka_smem, ka_empty, kv_row, i, hi, STAGES)
            _produce_block(v_desc, v_bars, v_smem, v_empty, kv_row, i, hi, STAGES)

    @gluon.jit
    def gluon_tapa_fwd_kernel(qa_desc, qp_desc, ka_desc, kp_desc, v_desc, o_ptr, lse_ptr, T, S, H, GROUP, qk_scale,
                              alpha, k_turn, c1, c2, c3, c4, c5, r_min, r_3, w_table, w_coef, coef_base,
                              CAUSAL: gl.constexpr, LINEAR: gl.constexpr, STAGES: gl.constexpr,
                              TABLE: gl.constexpr = False, COEF: gl.constexpr = False, LAZY: gl.constexpr = False,
                              DIAG: gl.constexpr = False, HEADS: gl.constexpr = 1, num_warps: gl.constexpr = 4):
        """One BLOCK_M block of query rows of one (batch, head) (`_program`). Descriptors: q's
        amplitude / phase columns as [B*H*T, D/2] views, k's as [B*G*S, D/2], v as [B*G*S, D] (rows
        of a neighbouring head read past T or S are discarded or masked; TMA zero-fills past the tensor)."""
        i_bh, m0, kv_row, mid, hi, q_bar, bufs = _setup(qa_desc, qp_desc, ka_desc, kp_desc, v_desc, T, S, H, GROUP,
                                                        CAUSAL, STAGES, False, HEADS)
        ka_smem, kp_smem, v_smem, ka_bars, kp_bars, v_bars = bufs[2], bufs[3], bufs[4], bufs[5], bufs[6], bufs[7]
        _load_q(qa_desc, qp_desc, q_bar, bufs, i_bh * T + m0)
        for i in gl.static_range(STAGES):
            _free_k(i - STAGES, hi, kp_desc, kp_smem, kp_bars, kp_bars, kv_row, STAGES, False)
            _free_k(i - STAGES, hi, ka_desc, ka_smem, ka_bars, ka_bars, kv_row, STAGES, False)
            _free_k(i - STAGES, hi, v_desc, v_smem, v_bars, v_bars, kv_row, STAGES, False)
        _consume(bufs, (ka_desc, kp_desc, v_desc), (alpha, k_turn, c1, c2, c3, c4, c5, w_table, w_coef, coef_base),
                 q_bar, o_ptr, lse_ptr, i_bh, m0, kv_row, mid, hi, T, S, qk_scale, r_min, r_3, CAUSAL, LINEAR, STAGES,
                 TABLE, COEF, LAZY, DIAG, False, (0, 0, 0), 0, False, num_warps, (0, 0, 0), False)

    @gluon.jit
    def gluon_tapa_fwd_ws_kernel(qa_desc, qp_desc, ka_desc, kp_desc, v_desc, o_ptr, lse_ptr, T, S, H, GROUP,
                                 qk_scale, alpha, k_turn, c1, c2, c3, c4, c5, r_min, r_3, w_table, w_coef, coef_base,
                                 CAUSAL: gl.constexpr, LINEAR: gl.constexpr, STAGES: gl.constexpr,
                                 TABLE: gl.constexpr = False, COEF: gl.constexpr = False,
                                 LAZY: gl.constexpr = False, DIAG: gl.constexpr = False,
                                 HEADS: gl.constexpr = 1, PRODUCER_REGS: gl.constexpr = 24,
                                 num_warps: gl.constexpr = 4):
        """`gluon_tapa_fwd_kernel` with the loads in a one-warp producer partition holding
        PRODUCER_REGS registers a thread (the "fws" variant; the consumers release each slot
        through an "empty" mbarrier instead of issuing its refill)."""
        i_bh, m0, kv_row, mid, hi, q_bar, bufs = _setup(qa_desc, qp_desc, ka_desc, kp_desc, v_desc, T, S, H, GROUP,
                                                        CAUSAL, STAGES, True, HEADS)
        descs = (ka_desc, kp_desc, v_desc)
        gl.warp_specialize([
            (_consume, (bufs, descs, (alpha, k_turn, c1, c2, c3, c4, c5, w_table, w_coef, coef_base), q_bar, o_ptr,
                        lse_ptr, i_bh, m0, kv_row, mid, hi, T, S, qk_scale, r_min, r_3, CAUSAL, LINEAR, STAGES,
                        TABLE, COEF, LAZY, DIAG, True, (0, 0, 0), 0, False, num_warps, (0, 0, 0), False)),
            (_produce, (qa_desc, qp_desc, descs, q_bar, bufs, i_bh * T + m0, kv_row, hi, STAGES)),
        ], [1], [PRODUCER_REGS])

    @gluon.jit
    def _pair(w, n_pairs, n_bh, T, S, H, GROUP, HEADS: gl.constexpr, BLOCK_M: gl.constexpr,
              BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
        """(i_bh, m0, kv_row, mid0, mid1, hi) of item w of the "pingpong" kernel: query blocks 2 i
        and 2 i + 1 of head i_bh (rows from m0 and m0 + BLOCK_M) in `_order`'s order of n_pairs
        pairs a head, their key blocks [0, mid_k) unmasked, both run to the second's hi (BLOCK_N =
        BLOCK_M: the first's hi or one more, a block above every row of the first, fully masked)."""
        i_bh, i = _order(w, n_pairs, n_bh, HEADS)
        mid0, hi0 = _block_range(2 * i, T, S, BLOCK_M, BLOCK_N, CAUSAL)
        mid1, hi1 = _block_range(2 * i + 1, T, S, BLOCK_M, BLOCK_N, CAUSAL)
        return i_bh, 2 * i * BLOCK_M, kv_base_row(i_bh, H, GROUP, S), mid0, mid1, gl.maximum(hi0, hi1)

    @gluon.jit
    def _produce_at(desc, bars, smem, empty, row, r, STAGES: gl.constexpr):
        """The producer's load of rows row.. into the slot of ring index r, once the consumers
        released ring index r - STAGES (a fresh barrier passes the wait on parity 1)."""
        mbarrier.wait(empty.index(r % STAGES), ((r // STAGES) & 1) ^ 1)
        _load_block(r, row, True, desc, smem, bars, STAGES)

    @gluon.jit
    def _produce_pp(qa_desc, qp_desc, descs, q_smem, q_bars, q_empty, rings, n_items, n_pairs, n_bh, T, S, H,
                    GROUP, HEADS: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr):
        """The "pingpong" kernel's producer warp: for each of this program's items, both
        warpgroups' Q halves into the item's Q buffer once both released it, then K_P, K_A and V
        of each key block in the order the consumers use them, through one sequence of ring slots."""
        ka_smem, kp_smem, v_smem, ka_bars, kp_bars, v_bars, ka_empty, kp_empty, v_empty = rings
        ka_desc, kp_desc, v_desc = descs
        BLOCK_M: gl.constexpr = qa_desc.block_type.shape[0]
        BLOCK_N: gl.constexpr = ka_desc.block_type.shape[0]
        g = 0
        t = 0
        for w in range(gl.program_id(0), n_items, gl.num_programs(0)):
            i_bh, m0, kv_row, _mid0, _mid1, hi = _pair(w, n_pairs, n_bh, T, S, H, GROUP, HEADS, BLOCK_M, BLOCK_N,
                                                       CAUSAL)
            b = t % 2
            mbarrier.wait(q_empty.index(b), ((t // 2) & 1) ^ 1)
            for k in gl.static_range(2):
                _load_q(qa_desc, qp_desc, q_bars.index(2 * b + k), (q_smem.index(4 * b + 2 * k),
                        q_smem.index(4 * b + 2 * k + 1)), i_bh * T + m0 + k * BLOCK_M)
            for i in range(hi):
                _produce_at(kp_desc, kp_bars, kp_smem, kp_empty, kv_row + i * BLOCK_N, g + i, STAGES)
                _produce_at(ka_desc, ka_bars, ka_smem, ka_empty, kv_row + i * BLOCK_N, g + i, STAGES)
                _produce_at(v_desc, v_bars, v_smem, v_empty, kv_row + i * BLOCK_N, g + i, STAGES)
            g = g + hi
            t = t + 1

    @gluon.jit
    def _consume_pp(q_smem, q_bars, q_empty, rings, turn_bars, descs, ph, o_ptr, lse_ptr, n_items, n_pairs, n_bh, T,
                    S, H, GROUP, qk_scale, r_min, r_3, WG: gl.constexpr, HEADS: gl.constexpr,
                    CAUSAL: gl.constexpr, LINEAR: gl.constexpr, STAGES: gl.constexpr, TABLE: gl.constexpr,
                    COEF: gl.constexpr, LAZY: gl.constexpr, DIAG: gl.constexpr, num_warps: gl.constexpr):
        """Consumer warpgroup WG of the "pingpong" kernel: its query block of each of this
        program's items (`_consume`, at ring index g, its turns counted from c)."""
        BLOCK_M: gl.constexpr = q_smem.shape[1]
        BLOCK_N: gl.constexpr = rings[0].shape[1]
        g = 0
        t = 0
        c = 0
        for w in range(gl.program_id(0), n_items, gl.num_programs(0)):
            i_bh, m0, kv_row, mid0, mid1, hi = _pair(w, n_pairs, n_bh, T, S, H, GROUP, HEADS, BLOCK_M, BLOCK_N,
                                                     CAUSAL)
            b = t % 2
            mid = mid0
            if WG == 1:
                mid = mid1
            bufs = (q_smem.index(4 * b + 2 * WG), q_smem.index(4 * b + 2 * WG + 1)) + rings
            _consume(bufs, descs, ph, q_bars.index(2 * b + WG), o_ptr, lse_ptr, i_bh, m0 + WG * BLOCK_M, kv_row, mid,
                     hi, T, S, qk_scale, r_min, r_3, CAUSAL, LINEAR, STAGES, TABLE, COEF, LAZY, DIAG, True,
                     (g, 0, 0), (t // 2) & 1, False, num_warps, (turn_bars, WG, c, q_empty.index(b)), True)
            g = g + hi
            c = c + hi - 1
            t = t + 1

    @gluon.jit
    def gluon_tapa_fwd_pp_kernel(qa_desc, qp_desc, ka_desc, kp_desc, v_desc, o_ptr, lse_ptr, T, S, H, GROUP, n_items,
                                 n_bh, qk_scale, alpha, k_turn, c1, c2, c3, c4, c5, r_min, r_3, w_table, w_coef,
                                 coef_base, CAUSAL: gl.constexpr, LINEAR: gl.constexpr, STAGES: gl.constexpr,
                                 TABLE: gl.constexpr = False, COEF: gl.constexpr = False,
                                 LAZY: gl.constexpr = False, DIAG: gl.constexpr = False,
                                 HEADS: gl.constexpr = 1, PRODUCER_REGS: gl.constexpr = 24,
                                 CONSUMER_REGS: gl.constexpr = 240, num_warps: gl.constexpr = 4):
        """The "pingpong" variant, persistent: program p runs items p, p + P, ... of n_items (`_pair`:
        two query blocks of BLOCK_M rows of one head) on two consumer warpgroups (the default
        partition and a 4-warp worker of CONSUMER_REGS registers a thread, `_consume_pp`) that
        take turns issuing their products (`_my_turn`) and read one set of K and V rings, which a
        one-warp producer fills (`_produce_pp`; a slot is free once both released it: "empty"
        barriers of two arrivals) through one sequence of slots across items; Q in two buffers,
        so the next item's loads overlap this one's last steps and epilogue (FlashAttention-3's
        persistent kernel, https://arxiv.org/abs/2407.08608 section 3.1)."""
        BLOCK_M: gl.constexpr = qa_desc.block_type.shape[0]
        BLOCK_N: gl.constexpr = ka_desc.block_type.shape[0]
        gl.static_assert(BLOCK_M == BLOCK_N, "the pingpong kernel needs BLOCK_M = BLOCK_N")
        n_pairs = gl.cdiv(T, 2 * BLOCK_M)
        q_smem = gl.allocate_shared_memory(qa_desc.dtype, [8] + qa_desc.block_type.shape, qa_desc.layout)
        q_bars = _barriers(4)      # buffer b, warpgroup k: 2 b + k
        q_empty = _barriers(2, 2)  # buffer b, released by both warpgroups
        ka_smem, ka_bars = _ring(ka_desc, STAGES)
        kp_smem, kp_bars = _ring(kp_desc, STAGES)
        v_smem, v_bars = _ring(v_desc, STAGES)
        rings = (ka_smem, kp_smem, v_smem, ka_bars, kp_bars, v_bars, _barriers(STAGES, 2), _barriers(STAGES, 2),
                 _barriers(STAGES, 2))
        turn = _barriers(2)
        descs = (ka_desc, kp_desc, v_desc)
        ph = (alpha, k_turn, c1, c2, c3, c4, c5, w_table, w_coef, coef_base)
        gl.warp_specialize([
            (_consume_pp, (q_smem, q_bars, q_empty, rings, turn, descs, ph, o_ptr, lse_ptr, n_items, n_pairs, n_bh,
                           T, S, H, GROUP, qk_scale, r_min, r_3, 0, HEADS, CAUSAL, LINEAR, STAGES, TABLE, COEF,
                           LAZY, DIAG, num_warps)),
            (_consume_pp, (q_smem, q_bars, q_empty, rings, turn, descs, ph, o_ptr, lse_ptr, n_items, n_pairs, n_bh,
                           T, S, H, GROUP, qk_scale, r_min, r_3, 1, HEADS, CAUSAL, LINEAR, STAGES, TABLE, COEF,
                           LAZY, DIAG, num_warps)),
            (_produce_pp, (qa_desc, qp_desc, descs, q_smem, q_bars, q_empty, rings, n_items, n_pairs, n_bh, T, S, H,
                           GROUP, HEADS, STAGES, CAUSAL)),
        ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])

    @gluon.jit
    def _item(w, n_items, T, S, H, GROUP, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
        """(i_bh, m0, kv_row, mid, hi) of item w of the persistent kernel, in the order the
        one-block-a-program grid runs them (query blocks longest first within a head, heads in
        turn; neighbouring items share a head's K and V in L2); hi = 0 past the last item."""
        n_m = gl.cdiv(T, BLOCK_M)
        i_bh = w // n_m
        i_m = n_m - 1 - w % n_m
        kv_row = kv_base_row(i_bh, H, GROUP, S)
        mid, hi = _block_range(i_m, T, S, BLOCK_M, BLOCK_N, CAUSAL)
        return i_bh, i_m * BLOCK_M, kv_row, mid, gl.where(w < n_items, hi, 0)

    @gluon.jit
    def gluon_tapa_fwd_persistent_kernel(qa_desc, qp_desc, ka_desc, kp_desc, v_desc, o_ptr, lse_ptr, T, S, H, GROUP,
                                         n_items, claim_ptr, qk_scale, alpha, k_turn, c1, c2, c3, c4, c5, r_min,
                                         r_3, w_table, w_coef, coef_base, CAUSAL: gl.constexpr, LINEAR: gl.constexpr,
                                         STAGES: gl.constexpr, TABLE: gl.constexpr = False,
                                         COEF: gl.constexpr = False, LAZY: gl.constexpr = False,
                                         DIAG: gl.constexpr = False, num_warps: gl.constexpr = 4):
        """`gluon_tapa_fwd_kernel` as a persistent kernel (the "persistent" variant): program p
        runs item p, then claims the next unclaimed item (P + an atomic count at claim_ptr, which
        starts at zero; `_item`'s order, as the hardware hands out the blocks of a one-block-a-
        program grid) while the current one runs, with one sequence of key blocks through
        its rings: once an item's last K blocks retire its slots take the next item's first
        blocks (`_prefetch`, before its last PV and epilogue), and the next item's Q halves load
        into a second buffer while this one runs, so the prologue's load latency of a
        one-block-a-program launch overlaps the previous item."""
        BLOCK_M: gl.constexpr = qa_desc.block_type.shape[0]
        BLOCK_N: gl.constexpr = ka_desc.block_type.shape[0]
        pid = gl.program_id(0)
        n_prog = gl.num_programs(0)
        qa_all = gl.allocate_shared_memory(qa_desc.dtype, [2] + qa_desc.block_type.shape, qa_desc.layout)
        qp_all = gl.allocate_shared_memory(qp_desc.dtype, [2] + qp_desc.block_type.shape, qp_desc.layout)
        q_bars = _barriers(2)
        ka_smem, ka_bars = _ring(ka_desc, STAGES)
        kp_smem, kp_bars = _ring(kp_desc, STAGES)
        v_smem, v_bars = _ring(v_desc, STAGES)
        descs = (ka_desc, kp_desc, v_desc)
        ph = (alpha, k_turn, c1, c2, c3, c4, c5, w_table, w_coef, coef_base)
        i_bh, m0, kv_row, mid, hi = _item(pid, n_items, T, S, H, GROUP, BLOCK_M, BLOCK_N, CAUSAL)
        _load_q(qa_desc, qp_desc, q_bars.index(0), (qa_all.index(0), qp_all.index(0)), i_bh * T + m0)
        for k in gl.static_range(STAGES):
            _load_block(k, kv_row + k * BLOCK_N, k < hi, kp_desc, kp_smem, kp_bars, STAGES)
            _load_block(k, kv_row + k * BLOCK_N, k < hi, ka_desc, ka_smem, ka_bars, STAGES)
            _load_block(k, kv_row + k * BLOCK_N, k < hi, v_desc, v_smem, v_bars, STAGES)
        w = pid
        t = 0
        g = 0
        while w < n_items:
            b = t % 2
            w_next = n_prog + gl.atomic_add(claim_ptr, 1, sem="relaxed")
            # each item's geometry recomputed from w, not carried: Triton 3.6 dropped one of five
            # such loop-carried scalars (the loop kept the first item's mid)
            i_bh, m0, kv_row, mid, hi = _item(w, n_items, T, S, H, GROUP, BLOCK_M, BLOCK_N, CAUSAL)
            nb_bh, nb_m0, nb_kv, _nb_mid, nb_hi = _item(w_next, n_items, T, S, H, GROUP, BLOCK_M, BLOCK_N, CAUSAL)
            _load_q(qa_desc, qp_desc, q_bars.index(1 - b), (qa_all.index(1 - b), qp_all.index(1 - b)),
                    nb_bh * T + nb_m0, nb_hi > 0)
            bufs = (qa_all.index(b), qp_all.index(b), ka_smem, kp_smem, v_smem, ka_bars, kp_bars, v_bars, ka_bars,
                    kp_bars, v_bars)
            _consume(bufs, descs, ph, q_bars.index(b), o_ptr, lse_ptr, i_bh, m0, kv_row, mid, hi, T, S, qk_scale,
                     r_min, r_3, CAUSAL, LINEAR, STAGES, TABLE, COEF, LAZY, DIAG, False, (g, nb_kv, nb_hi),
                     (t // 2) & 1, True, num_warps, (0, 0, 0), False)
            g = g + hi
            t = t + 1
            w = w_next




class Plan(NamedTuple):
    """What a forward launch takes besides its tensors (`plan`): the kernel, grid and tile, the
    integer and scalar arguments, the tables, the constexprs, and whether it claims items through
    an atomic count ("persistent")."""
    kernel: object
    grid: tuple
    block_m: int
    block_n: int
    lengths: tuple
    scalars: tuple
    extra: tuple
    meta: dict
    claims: bool


# Plans of earlier launches, keyed by everything a plan is computed from (`gluon_tapa_fwd`): the
# checks, the series' scalars, the tables and the schedules' flags, all host work before the
# launch (`gluon_tapa_fwd` without its launch, the routing check stubbed: 41.0 us computing them
# each call, 23.3 from a plan, on a CPU machine; benchmarks/results/gluon-tapa-fwd-h100-4k.md
# section 7)
_PLANS: dict = {}
_PLANS_MAX = 64


def plan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: dict, scale: float, causal: bool,
         tile: tuple | None, variants, programs: int | None) -> Plan:
    """The launch plan of `gluon_tapa_fwd` for these inputs' shapes, dtypes and devices (validated:
    ValueError with `supported`'s reason); params: ScoreMod's validated TAPA params."""
    reason = supported(q, k, v, theta=params["theta"], scale=scale)
    if reason is not None:
        raise ValueError(f"gluon_tapa_fwd: {reason}")
    B, H, T, D = q.shape
    flags = variant_flags(variants, D)   # "ws" is the backward's
    G, S = k.shape[1], k.shape[2]
    tile = tuple(tile or forward_tile(D, flags))
    block_m, block_n = tile[:2]
    scalars = kernel_scalars(D, params["alpha"], float(params["phase_scale"]), float(scale), block_m, block_n)
    extra = variant_scalars(scalars, params["alpha"], T, S, block_m, block_n, flags.table, flags.order3, q.device,
                            flags.coef)
    grid, lengths = (triton.cdiv(T, block_m * query_blocks(flags)), B * H), (T, S, H, H // G)
    kernel, meta = forward_launch(D, tile, flags, bool(causal), params["phase"] == "linear")
    claims = kernel is gluon_tapa_fwd_persistent_kernel
    if claims or kernel is gluon_tapa_fwd_pp_kernel:   # persistent: items in the order of the grid above
        n_items = grid[0] * grid[1]
        lengths = lengths + ((n_items,) if claims else (n_items, B * H))
        grid = (min(n_items, programs) if programs else persistent_programs(n_items, D, flags, q.device),)
    return Plan(kernel, grid, block_m, block_n, lengths, scalars, extra, meta, claims)


def forward_launch(D: int, tile: tuple, flags, causal: bool, linear: bool) -> tuple[object, dict]:
    """(kernel, meta) of a forward launch at `tile` with the schedules `flags`
    (`gluon_tapa_host.Variants`): the kernel they pick ("pingpong": the two-warpgroup one, else
    "fws": the warp-specialised one, else "persistent": the persistent one, else the plain one),
    its constexprs and Triton's launch options (num_warps, the register cap of `launch_regs`).
    `plan` launches it; benchmarks/gluon_compile_tapa.py compiles the same."""
    meta = {"CAUSAL": causal, "LINEAR": linear, "STAGES": tile[2], "TABLE": flags.table, "COEF": flags.coef,
            "LAZY": flags.lazy, "DIAG": flags.diag, "num_warps": tile[3]}
    if flags.pingpong:
        kernel, meta["HEADS"], meta["PRODUCER_REGS"] = gluon_tapa_fwd_pp_kernel, interleave_heads(flags), PRODUCER_REGS
        meta["CONSUMER_REGS"] = PINGPONG_CONSUMER_REGS
    elif flags.fws:
        kernel, meta["HEADS"], meta["PRODUCER_REGS"] = gluon_tapa_fwd_ws_kernel, interleave_heads(flags), PRODUCER_REGS
    elif flags.persistent:   # claims its items in its own order: no HEADS
        kernel = gluon_tapa_fwd_persistent_kernel
    else:
        kernel, meta["HEADS"] = gluon_tapa_fwd_kernel, interleave_heads(flags)
    regs = launch_regs(D, tile, flags)
    if regs:
        meta["maxnreg"] = regs
    return kernel, meta


def gluon_tapa_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, alpha: float = 0.1, theta: float = 0.5,
                   phase_scale: float = 2.0 * math.pi, phase: str = "quadratic", scale: float = 1.0,
                   causal: bool = True, out: torch.Tensor | None = None, lse: torch.Tensor | None = None,
                   tile: tuple[int, int, int, int] | None = None, variants=None,
                   programs: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [B,H,T,D] in q's dtype, lse [B,H,T] fp32 in log2 units) of TAPA attention with index
    positions; q [B,H,T,D], k, v [B,G,S,D]; arguments as `function.tapa_attention` (validated the
    same way); `gluon_tapa_host.supported` must hold. out / lse: optional preallocated contiguous
    buffers (tests poison them); tile: (BLOCK_M, BLOCK_N, STAGES, warps), default
    `gluon_tapa_host.forward_tile`; variants: names from VARIANTS (default
    DEFAULT_VARIANTS[D], both gluon_tapa_host's); programs: the
    "persistent" kernel's grid (default `persistent_programs`; fewer programs run more items each).
    The launch's `plan` is computed once per shapes, dtypes, devices and arguments."""
    try:
        key = (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device, v.device, alpha, theta,
               phase_scale, phase, scale, causal, tile, variants if variants is None else frozenset(variants),
               programs, os.environ.get("TRITON_INTERPRET"))
        launch_plan = _PLANS.get(key)
    except (AttributeError, TypeError):   # not tensors, or an unhashable argument: no plan is kept, and
        key = launch_plan = None          # `plan`'s checks say what is wrong
    if launch_plan is None:
        params = ScoreMod(kind="tapa", params={"alpha": alpha, "theta": theta, "phase_scale": phase_scale,
                                               "phase": phase}).params
        launch_plan = plan(q, k, v, params, scale, causal, tile, variants, programs)
        if key is not None:
            if len(_PLANS) >= _PLANS_MAX:
                _PLANS.clear()
            _PLANS[key] = launch_plan
    q, k, v = (t.contiguous() for t in (q, k, v))
    if out is None:
        out = torch.empty_like(q)
    if lse is None:
        lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    if out.shape != q.shape or out.dtype != q.dtype or not out.is_contiguous() or lse.shape != q.shape[:3] \
            or lse.dtype != torch.float32 or not lse.is_contiguous():
        raise ValueError("gluon_tapa_fwd: out must be like q and lse fp32 [B, H, T], both contiguous")
    lengths = launch_plan.lengths
    if launch_plan.claims:   # the persistent kernel's atomic count of claimed items
        lengths = lengths + (torch.zeros(1, dtype=torch.int32, device=q.device),)
    # the plan's key fixes every argument's launch fact but out's and lse's alignment: the descriptors
    # are of contiguous tensors of its shapes (all aligned, or refused), the rest are its own
    facts = None if key is None else (key, out.data_ptr() % 16 == 0, lse.data_ptr() % 16 == 0)
    launch(launch_plan.kernel, launch_plan.grid, *descriptors(q, k, v, launch_plan.block_m, launch_plan.block_n),
           out, lse, *lengths, *launch_plan.scalars, *launch_plan.extra, key=facts, **launch_plan.meta)
    return out, lse
