"""Hopper (sm_90) backward of the plain flash core in Gluon: TMA loads into shared memory guarded by
mbarriers, asynchronous wgmma, and the softmax recomputed from the forward's log-sum-exp with exp2
(FlashAttention-3, Shah et al. 2024, https://arxiv.org/abs/2407.08608, section 3 and appendix B).

Spec: the gradients of `reference.flash_attention` with index positions (the T queries are the last
T of the S keys; key s is visible to query t iff s <= t + S - T when causal), GQA (head h reads kv
head h // (H // G); dk, dv sum over the group), q/k/v one width D in {64, 128}, bf16 or fp16, fp32
accumulation. Inputs as `triton_flash.flash_bwd` takes them: lse [B, H, T] fp32 in log2 units of the
scaled logits (P = exp2(scale log2(e) q.k - lse)), +inf for a row that sees no key (its P is 0).

Two kernels, as the `tl` core's (FA2's split, no atomics, hence deterministic):

    dK/dV, one program per key block (K, V resident, loaded once by TMA), over the query blocks
    of every head of its GQA group; Q and dO of block i+STAGES stream into the ring slot that
    block i frees, while block i computes:
        issue S^T = K Q^T and dP^T = V dO^T (async); wait S^T; P^T = exp2(S^T - lse)
        wait dP^T; issue dV += P^T dO (P^T from registers); dS^T = P^T (dP^T - Delta)
        issue dK += dS^T Q; wait both; refill the slot
    dQ, one program per query block (Q, dO resident), over its key blocks with K and V streamed
    through separate rings: S = Q K^T, dP = dO V^T, dQ += dS K.

`deterministic=False` drops the dQ kernel (FA3's schedule, S and dP computed once): the dK/dV kernel
also stores dS^T to shared memory and adds dQ_i += dS_i K, read as wgmma's transposed A operand, to
an fp32 buffer by atomics, whose order varies run to run.

`warp_specialize=True` runs the dK/dV kernel's loads in a one-warp producer partition
(gl.warp_specialize, PRODUCER_REGS registers) that refills ring slots as the wgmma warps release
them through "empty" mbarriers; the wgmma warps get 240 registers a thread (setmaxnreg), and ptxas
reports no spill at D = 128, where the single-partition kernel spills 12 bytes
(benchmarks/gluon_compile_bwd.py).

Rows are keys in dK/dV and queries in dQ, so every product has its long side as the wgmma M (64
rows a warpgroup). Delta = rowsum(dO * O) comes from the `tl` row kernel (triton_common.do_o_rows).
Causal programs visit only blocks with a visible pair and mask only the diagonal ones; reads past T
or S through the flattened [rows, D] descriptors land in a neighbouring head (masked: lse = +inf for
query rows, a column mask for keys in dQ, unstored key rows in dK/dV) or are zero-filled by TMA.

The module imports without Gluon (CPU machines, other Triton versions): `supported` says why the
kernels cannot run, and nothing Gluon runs under TRITON_INTERPRET.
"""

from __future__ import annotations

import torch

from phaselab.kernels.common.triton_common import LOG2E, do_o_rows
from phaselab.kernels.flash import gluon_common
from phaselab.kernels.flash.gluon_common import PRODUCER_REGS, descriptor, launch

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

# (BLOCK_M queries, BLOCK_N keys, STAGES, warps) per head dim; the resident tile is the long one
# (keys in dK/dV, queries in dQ) and takes the warps along its rows. ptxas for sm_90a
# (benchmarks/gluon_compile_bwd.py) prints registers and spills of each.
# The backward that follows the Gluon forward in `GluonFlashFunction`, by head dim, from one run on
# the H200 (benchmarks/results/gluon-bwd-h200.md, forward+backward x cuDNN at N 4k / 16k): at D=64
# the `tl` backward (1.16 / 1.16, against 1.21 / 1.23 with this one), at D=128 this one with its
# warp-specialised dK/dV (1.22 / 1.25, against 1.34 / 1.37 with `tl`).
BACKWARD_BY_D = {64: "tl", 128: "gluon-ws"}
DKDV_TILES = {64: (64, 128, 2, 8), 128: (64, 128, 2, 8)}
DQ_TILES = {64: (128, 64, 2, 8), 128: (128, 64, 2, 8)}


def supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos_q=None, pos_k=None) -> str | None:
    """None when the Gluon backward can run on these inputs, else a short reason (gluon_common.supported)."""
    return gluon_common.supported(q, k, v, pos_q, pos_k, what="the Gluon backward")


if gluon_common.IMPORT_ERROR is None:

    @gluon.constexpr_function
    def _dq_part_layout(num_warps, block_m, d):
        """Accumulator of a [block_m, d] dQ chunk: warpgroups along M up to block_m // 64, the rest
        of the warps split d (wgmma takes 64 rows a warpgroup)."""
        wm = min(num_warps, block_m // 16)
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[wm, num_warps // wm],
                                         instr_shape=[16, d // (num_warps // wm), 16])

    @gluon.jit
    def _a_operand(x, dtype: gl.constexpr, acc_layout: gl.constexpr):
        """A fp32 tile in the input dtype, in the register layout of wgmma's A operand."""
        return gl.convert_layout(x.to(dtype), gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2))

    @gluon.jit
    def _store_rows(ptr, x, row_base, r0, n_rows, num_warps: gl.constexpr):
        """Rows r0.. of x (fp32, scaled already) into rows row_base + r0.. of a [*, D] matrix, in
        ptr's dtype; rows at or past n_rows are not stored."""
        R: gl.constexpr = x.shape[0]
        D: gl.constexpr = x.shape[1]
        layout: gl.constexpr = rows_layout(num_warps, D)
        y = gl.convert_layout(x.to(ptr.dtype.element_ty), layout)
        r = r0 + gl.arange(0, R, layout=gl.SliceLayout(1, layout))
        c = gl.arange(0, D, layout=gl.SliceLayout(0, layout))
        gl.store(ptr + (row_base + r.to(gl.int64))[:, None] * D + c[None, :], y, mask=(r < n_rows)[:, None])

    # ------------------------------------------------------------------------- dK / dV

    @gluon.jit
    def _q_row(it, nblk, lo, bh0, T, BLOCK_M: gl.constexpr):
        """Flat row of the query block visited at step `it` (head bh0 + it // nblk, block lo + it % nblk)."""
        return (bh0 + it // nblk) * T + (lo + it % nblk) * BLOCK_M

    @gluon.jit
    def _load_qdo(q_desc, do_desc, bars, q_smem, do_smem, it, nblk, lo, bh0, T, total, STAGES: gl.constexpr):
        """TMA Q and dO of step it into ring slot it % STAGES, if it < total."""
        slot = it % STAGES
        row = _q_row(it, nblk, lo, bh0, T, q_smem.shape[1])
        mbarrier.expect(bars.index(slot), q_desc.block_type.nbytes + do_desc.block_type.nbytes, pred=it < total)
        tma.async_copy_global_to_shared(q_desc, [row, 0], bars.index(slot), q_smem.index(slot), pred=it < total)
        tma.async_copy_global_to_shared(do_desc, [row, 0], bars.index(slot), do_smem.index(slot), pred=it < total)

    @gluon.jit
    def _dkdv_step(it, nblk, lo, bh0, T, S, total, dk, dv, k_smem, v_smem, q_smem, do_smem, ds_smem, bars, empty,
                   q_desc, do_desc, lse_ptr, dlt_ptr, dq_ptr, n0, qk_scale, sm_scale, MASKED: gl.constexpr,
                   ATOMIC_DQ: gl.constexpr, STAGES: gl.constexpr, WS: gl.constexpr, st_layout: gl.constexpr,
                   kv_layout: gl.constexpr, dq_layout: gl.constexpr):
        """One query block of the dK/dV schedule (module docstring); MASKED: the causal diagonal;
        ATOMIC_DQ: dS^T also goes through shared memory to add this block's dQ share (`_dq_share`)."""
        BLOCK_M: gl.constexpr = q_smem.shape[1]
        BLOCK_N: gl.constexpr = k_smem.shape[0]
        HEAD_D: gl.constexpr = k_smem.shape[1]
        DQ_CHUNK: gl.constexpr = dq_layout.instr_shape[1] * dq_layout.warps_per_cta[1]
        slot = it % STAGES
        m0 = (lo + it % nblk) * BLOCK_M
        bh = bh0 + it // nblk
        rows = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, st_layout))
        lse = gl.load(lse_ptr + bh.to(gl.int64) * T + rows, mask=rows < T, other=float("inf"))  # past T: P = 0
        mbarrier.wait(bars.index(slot), (it // STAGES) & 1)
        zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, st_layout)
        st_tok = warpgroup_mma(k_smem, q_smem.index(slot).permute((1, 0)), zero, use_acc=False, is_async=True)
        dpt_tok = warpgroup_mma(v_smem, do_smem.index(slot).permute((1, 0)), zero, use_acc=False, is_async=True)
        st = warpgroup_mma_wait(1, deps=(st_tok,))
        pt = gl.exp2(st * qk_scale - lse[None, :])
        if MASKED:
            keys = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, st_layout))
            pt = gl.where(keys[:, None] <= (rows + (S - T))[None, :], pt, 0.0)
        # loaded once lse is dead (fewer live registers), its latency under dP^T's wgmma
        dlt = gl.load(dlt_ptr + bh.to(gl.int64) * T + rows, mask=rows < T, other=0.0)
        dpt = warpgroup_mma_wait(0, deps=(dpt_tok,))
        dv_tok = warpgroup_mma(_a_operand(pt, k_smem.dtype, kv_layout), do_smem.index(slot), dv, is_async=True)
        dst = pt * (dpt - dlt[None, :])
        if ATOMIC_DQ:  # keys past S (the next head's rows, or TMA's zeros) must not reach dQ
            key_rows = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, st_layout))
            ds_smem.store(gl.where((key_rows < S)[:, None], dst, 0.0).to(k_smem.dtype))
            fence_async_shared()
            dk_tok = warpgroup_mma(ds_smem, q_smem.index(slot), dk, is_async=True)
            # dQ in column chunks of DQ_CHUNK: the share and its atomics' addresses stay small
            # beside the dK, dV accumulators (D = 128 spilled 320 B in one piece)
            zero_dq = gl.zeros([BLOCK_M, DQ_CHUNK], gl.float32, dq_layout)
            dq_tok = warpgroup_mma(ds_smem.permute((1, 0)), k_smem.slice(0, DQ_CHUNK, dim=1), zero_dq,
                                   use_acc=False, is_async=True)
            dv, dk, dq = warpgroup_mma_wait(0, deps=(dv_tok, dk_tok, dq_tok))
            _release_qdo(q_desc, do_desc, bars, empty, q_smem, do_smem, it, nblk, lo, bh0, T, total, STAGES, WS)
            _dq_share(dq_ptr, dq * sm_scale, bh, m0, 0, T, HEAD_D, dq_layout)
            for c in gl.static_range(1, HEAD_D // DQ_CHUNK):
                dq = warpgroup_mma(ds_smem.permute((1, 0)), k_smem.slice(c * DQ_CHUNK, DQ_CHUNK, dim=1), zero_dq,
                                   use_acc=False)
                _dq_share(dq_ptr, dq * sm_scale, bh, m0, c * DQ_CHUNK, T, HEAD_D, dq_layout)
        else:
            dk_tok = warpgroup_mma(_a_operand(dst, k_smem.dtype, kv_layout), q_smem.index(slot), dk, is_async=True)
            dv, dk = warpgroup_mma_wait(0, deps=(dv_tok, dk_tok))
            _release_qdo(q_desc, do_desc, bars, empty, q_smem, do_smem, it, nblk, lo, bh0, T, total, STAGES, WS)
        return dk, dv

    @gluon.jit
    def _release_qdo(q_desc, do_desc, bars, empty, q_smem, do_smem, it, nblk, lo, bh0, T, total,
                     STAGES: gl.constexpr, WS: gl.constexpr):
        """Slot it % STAGES is read: refill it with step it + STAGES, or (WS) tell the producer,
        once every consumer warp is past its wgmma."""
        if WS:
            gl.thread_barrier()
            mbarrier.arrive(empty.index(it % STAGES))
        else:
            _load_qdo(q_desc, do_desc, bars, q_smem, do_smem, it + STAGES, nblk, lo, bh0, T, total, STAGES)

    @gluon.jit
    def _dq_share(dq_ptr, dq, bh, m0, c0, T, HEAD_D: gl.constexpr, layout: gl.constexpr):
        """Rows m0.., columns c0.. of head bh of the fp32 dQ buffer [*, HEAD_D] += dq (relaxed
        atomics; rows past T belong to the next head and are left out)."""
        r = m0 + gl.arange(0, dq.shape[0], layout=gl.SliceLayout(1, layout))
        c = c0 + gl.arange(0, dq.shape[1], layout=gl.SliceLayout(0, layout))
        ptrs = dq_ptr + (bh.to(gl.int64) * T + r)[:, None] * HEAD_D + c[None, :]
        gl.atomic_add(ptrs, dq, mask=(r < T)[:, None], sem="relaxed")

    @gluon.jit
    def _query_range(n0, T, S, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
        """(lo, mid, n_qb) for the key block at n0: query blocks [lo, mid) see some of its keys
        (masked), [mid, n_qb) all of them; lo < n_qb (query T - 1 sees every key)."""
        n_qb = gl.cdiv(T, BLOCK_M)
        if CAUSAL:
            lo = gl.minimum(gl.maximum(n0 - (S - T), 0), T) // BLOCK_M
            full = gl.minimum(gl.maximum(gl.minimum(n0 + BLOCK_N, S) - 1 - (S - T), 0), T)
            mid = gl.minimum(gl.cdiv(full, BLOCK_M), n_qb)
        else:
            lo = 0
            mid = 0
        return lo, gl.maximum(mid, lo), n_qb

    @gluon.jit
    def _dkdv_setup(q_desc, k_desc, H, GROUP, T, S, CAUSAL: gl.constexpr, ATOMIC_DQ: gl.constexpr,
                    STAGES: gl.constexpr):
        """Block bounds, shared memory and barriers of one dK/dV program (K/V resident, Q/dO ring,
        dS^T for ATOMIC_DQ; `empty` barriers tell a producer partition which slots are read)."""
        BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
        HEAD_D: gl.constexpr = q_desc.block_type.shape[1]
        BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
        n0 = gl.program_id(0) * BLOCK_N  # block 0 sees the most queries: it starts first
        i_bg = gl.program_id(1)
        bh0 = i_bg // (H // GROUP) * H + i_bg % (H // GROUP) * GROUP  # first query head of the group
        lo, mid, n_qb = _query_range(n0, T, S, BLOCK_M, BLOCK_N, CAUSAL)
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [BLOCK_N, HEAD_D], k_desc.layout)
        v_smem = gl.allocate_shared_memory(k_desc.dtype, [BLOCK_N, HEAD_D], k_desc.layout)
        q_smem = gl.allocate_shared_memory(q_desc.dtype, [STAGES, BLOCK_M, HEAD_D], q_desc.layout)
        do_smem = gl.allocate_shared_memory(q_desc.dtype, [STAGES, BLOCK_M, HEAD_D], q_desc.layout)
        ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], k_desc.dtype)
        ds_smem = gl.allocate_shared_memory(k_desc.dtype, [BLOCK_N if ATOMIC_DQ else 16, BLOCK_M], ds_layout)
        kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(kv_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(bars.index(i), count=1)
            mbarrier.init(empty.index(i), count=1)
        fence_async_shared()
        return n0, i_bg, bh0, lo, mid, n_qb - lo, k_smem, v_smem, q_smem, do_smem, ds_smem, kv_bar, bars, empty

    @gluon.jit
    def _load_kv_once(k_desc, v_desc, kv_bar, k_smem, v_smem, row):
        mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [row, 0], kv_bar, k_smem)
        tma.async_copy_global_to_shared(v_desc, [row, 0], kv_bar, v_smem)

    @gluon.jit
    def _dkdv_produce(q_desc, do_desc, k_desc, v_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, bars, empty, kv_row,
                      nblk, lo, bh0, T, total, STAGES: gl.constexpr):
        """Producer partition (one warp): K, V once, then Q, dO of every step into the ring, each
        slot once the consumers have released its previous contents."""
        _load_kv_once(k_desc, v_desc, kv_bar, k_smem, v_smem, kv_row)
        for it in range(total):
            mbarrier.wait(empty.index(it % STAGES), ((it // STAGES) & 1) ^ 1, pred=it >= STAGES)
            _load_qdo(q_desc, do_desc, bars, q_smem, do_smem, it, nblk, lo, bh0, T, total, STAGES)

    @gluon.jit
    def _dkdv_consume(q_desc, do_desc, k_smem, v_smem, q_smem, do_smem, ds_smem, kv_bar, bars, empty, lse_ptr, dlt_ptr,
                      dk_ptr, dv_ptr, dq_ptr, n0, i_bg, bh0, lo, mid, nblk, T, S, GROUP, qk_scale, sm_scale,
                      CAUSAL: gl.constexpr, ATOMIC_DQ: gl.constexpr, STAGES: gl.constexpr, WS: gl.constexpr,
                      num_warps: gl.constexpr):
        """The wgmma warps: every query block of every head of the group, then the epilogue."""
        BLOCK_M: gl.constexpr = q_smem.shape[1]
        BLOCK_N: gl.constexpr = k_smem.shape[0]
        HEAD_D: gl.constexpr = k_smem.shape[1]
        st_layout: gl.constexpr = mma_layout(num_warps, BLOCK_M)
        kv_layout: gl.constexpr = mma_layout(num_warps, HEAD_D)
        dq_layout: gl.constexpr = _dq_part_layout(num_warps, BLOCK_M, min(HEAD_D, 64))
        total = GROUP * nblk
        dk = gl.zeros([BLOCK_N, HEAD_D], gl.float32, kv_layout)
        dv = gl.zeros([BLOCK_N, HEAD_D], gl.float32, kv_layout)
        mbarrier.wait(kv_bar, 0)
        for hg in range(GROUP):  # every query head reading this kv head: no atomics on dK, dV
            base = hg * nblk
            for it in range(base, base + mid - lo):  # diagonal blocks
                dk, dv = _dkdv_step(it, nblk, lo, bh0, T, S, total, dk, dv, k_smem, v_smem, q_smem, do_smem, ds_smem,
                                    bars, empty, q_desc, do_desc, lse_ptr, dlt_ptr, dq_ptr, n0, qk_scale, sm_scale,
                                    CAUSAL, ATOMIC_DQ, STAGES, WS, st_layout, kv_layout, dq_layout)
            for it in range(base + mid - lo, base + nblk):  # fully visible blocks
                dk, dv = _dkdv_step(it, nblk, lo, bh0, T, S, total, dk, dv, k_smem, v_smem, q_smem, do_smem, ds_smem,
                                    bars, empty, q_desc, do_desc, lse_ptr, dlt_ptr, dq_ptr, n0, qk_scale, sm_scale,
                                    False, ATOMIC_DQ, STAGES, WS, st_layout, kv_layout, dq_layout)
        _store_rows(dk_ptr, dk * sm_scale, i_bg.to(gl.int64) * S, n0, S, num_warps)
        _store_rows(dv_ptr, dv, i_bg.to(gl.int64) * S, n0, S, num_warps)

    @gluon.jit
    def gluon_flash_bwd_dkdv_kernel(q_desc, do_desc, k_desc, v_desc, lse_ptr, dlt_ptr, dk_ptr, dv_ptr, dq_ptr,
                                    T, S, H, GROUP, qk_scale, sm_scale,
                                    CAUSAL: gl.constexpr, ATOMIC_DQ: gl.constexpr, STAGES: gl.constexpr,
                                    num_warps: gl.constexpr):
        """dK, dV of one BLOCK_N block of keys of one (batch, kv head) over the query blocks of
        every query head of its group; descriptors over the contiguous [B*H*T, D] / [B*G*S, D] views.
        ATOMIC_DQ: also adds every block's dQ share to dq_ptr (fp32 [B*H*T, D], zeroed)."""
        n0, i_bg, bh0, lo, mid, nblk, k_smem, v_smem, q_smem, do_smem, ds_smem, kv_bar, bars, empty = _dkdv_setup(
            q_desc, k_desc, H, GROUP, T, S, CAUSAL, ATOMIC_DQ, STAGES)
        _load_kv_once(k_desc, v_desc, kv_bar, k_smem, v_smem, i_bg * S + n0)
        for i in gl.static_range(STAGES):
            _load_qdo(q_desc, do_desc, bars, q_smem, do_smem, i, nblk, lo, bh0, T, GROUP * nblk, STAGES)
        _dkdv_consume(q_desc, do_desc, k_smem, v_smem, q_smem, do_smem, ds_smem, kv_bar, bars, empty, lse_ptr, dlt_ptr,
                      dk_ptr, dv_ptr, dq_ptr, n0, i_bg, bh0, lo, mid, nblk, T, S, GROUP, qk_scale, sm_scale,
                      CAUSAL, ATOMIC_DQ, STAGES, False, num_warps)

    @gluon.jit
    def gluon_flash_bwd_dkdv_ws_kernel(q_desc, do_desc, k_desc, v_desc, lse_ptr, dlt_ptr, dk_ptr, dv_ptr, dq_ptr,
                                       T, S, H, GROUP, qk_scale, sm_scale,
                                       CAUSAL: gl.constexpr, ATOMIC_DQ: gl.constexpr, STAGES: gl.constexpr,
                                       PRODUCER_REGS: gl.constexpr, num_warps: gl.constexpr):
        """`gluon_flash_bwd_dkdv_kernel` with the loads in a one-warp producer partition holding
        PRODUCER_REGS registers a thread (FA3's producer / consumer split)."""
        n0, i_bg, bh0, lo, mid, nblk, k_smem, v_smem, q_smem, do_smem, ds_smem, kv_bar, bars, empty = _dkdv_setup(
            q_desc, k_desc, H, GROUP, T, S, CAUSAL, ATOMIC_DQ, STAGES)
        gl.warp_specialize([
            (_dkdv_consume, (q_desc, do_desc, k_smem, v_smem, q_smem, do_smem, ds_smem, kv_bar, bars, empty, lse_ptr,
                             dlt_ptr, dk_ptr, dv_ptr, dq_ptr, n0, i_bg, bh0, lo, mid, nblk, T, S, GROUP, qk_scale,
                             sm_scale, CAUSAL, ATOMIC_DQ, STAGES, True, num_warps)),
            (_dkdv_produce, (q_desc, do_desc, k_desc, v_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, bars, empty,
                             i_bg * S + n0, nblk, lo, bh0, T, GROUP * nblk, STAGES)),
        ], [1], [PRODUCER_REGS])

    # ------------------------------------------------------------------------- dQ

    @gluon.jit
    def _load_kv(desc, row, bars, smem, j, hi, STAGES: gl.constexpr):
        """TMA key block j (rows row..row+BLOCK_N) into ring slot j % STAGES, if j < hi."""
        slot = j % STAGES
        mbarrier.expect(bars.index(slot), desc.block_type.nbytes, pred=j < hi)
        tma.async_copy_global_to_shared(desc, [row, 0], bars.index(slot), smem.index(slot), pred=j < hi)

    @gluon.jit
    def _dq_step(j, hi, dq, rows, lse, dlt, q_smem, do_smem, k_smem, v_smem, k_bars, v_bars, k_desc, v_desc, kv_row,
                 T, S, qk_scale, MASKED: gl.constexpr, CAUSAL: gl.constexpr, STAGES: gl.constexpr,
                 s_layout: gl.constexpr, dq_layout: gl.constexpr):
        """Key block j of the dQ schedule; MASKED: keys past S and, causally, past each row's limit."""
        BLOCK_M: gl.constexpr = q_smem.shape[0]
        BLOCK_N: gl.constexpr = k_smem.shape[1]
        slot = j % STAGES
        zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        mbarrier.wait(k_bars.index(slot), (j // STAGES) & 1)
        s_tok = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), zero, use_acc=False, is_async=True)
        mbarrier.wait(v_bars.index(slot), (j // STAGES) & 1)
        dp_tok = warpgroup_mma(do_smem, v_smem.index(slot).permute((1, 0)), zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(1, deps=(s_tok,))
        p = gl.exp2(s * qk_scale - lse[:, None])
        if MASKED:
            cols = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
            vis = (cols < S)[None, :]
            if CAUSAL:
                vis = vis & (cols[None, :] <= (rows + (S - T))[:, None])
            p = gl.where(vis, p, 0.0)
        dp = warpgroup_mma_wait(0, deps=(dp_tok,))
        _load_kv(v_desc, kv_row + (j + STAGES) * BLOCK_N, v_bars, v_smem, j + STAGES, hi, STAGES)
        ds = p * (dp - dlt[:, None])
        dq_tok = warpgroup_mma(_a_operand(ds, k_smem.dtype, dq_layout), k_smem.index(slot), dq, is_async=True)
        dq = warpgroup_mma_wait(0, deps=(dq_tok,))
        _load_kv(k_desc, kv_row + (j + STAGES) * BLOCK_N, k_bars, k_smem, j + STAGES, hi, STAGES)
        return dq

    @gluon.jit
    def _key_range(m0, T, S, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
        """(mid, hi): key blocks [0, mid) are visible to every query of the block at m0 (no mask),
        [mid, hi) to some; hi = 0 for a block whose queries see no key (its dQ is 0)."""
        if CAUSAL:
            n_lo = gl.minimum(gl.maximum(m0 + S - T + 1, 0), S)
            n_hi = gl.minimum(gl.maximum(gl.minimum(m0 + BLOCK_M, T) + S - T, 0), S)
            mid = n_lo // BLOCK_N
            hi = gl.cdiv(n_hi, BLOCK_N)
        else:
            mid = S // BLOCK_N
            hi = gl.cdiv(S, BLOCK_N)
        return mid, hi

    @gluon.jit
    def gluon_flash_bwd_dq_kernel(q_desc, do_desc, k_desc, v_desc, lse_ptr, dlt_ptr, dq_ptr,
                                  T, S, H, GROUP, qk_scale, sm_scale,
                                  CAUSAL: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr):
        """dQ of one BLOCK_M block of query rows of one (batch, head) over its key blocks."""
        BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
        HEAD_D: gl.constexpr = q_desc.block_type.shape[1]
        BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
        s_layout: gl.constexpr = mma_layout(num_warps, BLOCK_N)
        dq_layout: gl.constexpr = mma_layout(num_warps, HEAD_D)
        m0 = (gl.num_programs(0) - 1 - gl.program_id(0)) * BLOCK_M  # longest (causal) rows first
        i_bh = gl.program_id(1)
        kv_row = kv_base_row(i_bh, H, GROUP, S)
        mid, hi = _key_range(m0, T, S, BLOCK_M, BLOCK_N, CAUSAL)

        q_smem = gl.allocate_shared_memory(q_desc.dtype, [BLOCK_M, HEAD_D], q_desc.layout)
        do_smem = gl.allocate_shared_memory(do_desc.dtype, [BLOCK_M, HEAD_D], do_desc.layout)
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_D], k_desc.layout)
        v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_D], v_desc.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_bars.index(i), count=1)
            mbarrier.init(v_bars.index(i), count=1)
        fence_async_shared()

        mbarrier.expect(q_bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [i_bh * T + m0, 0], q_bar, q_smem)
        tma.async_copy_global_to_shared(do_desc, [i_bh * T + m0, 0], q_bar, do_smem)
        for i in gl.static_range(STAGES):
            _load_kv(k_desc, kv_row + i * BLOCK_N, k_bars, k_smem, i, hi, STAGES)
            _load_kv(v_desc, kv_row + i * BLOCK_N, v_bars, v_smem, i, hi, STAGES)

        rows = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
        lse = gl.load(lse_ptr + i_bh.to(gl.int64) * T + rows, mask=rows < T, other=float("inf"))
        dlt = gl.load(dlt_ptr + i_bh.to(gl.int64) * T + rows, mask=rows < T, other=0.0)
        dq = gl.zeros([BLOCK_M, HEAD_D], gl.float32, dq_layout)
        mbarrier.wait(q_bar, 0)
        for j in range(mid):
            dq = _dq_step(j, hi, dq, rows, lse, dlt, q_smem, do_smem, k_smem, v_smem, k_bars, v_bars, k_desc, v_desc,
                          kv_row, T, S, qk_scale, False, CAUSAL, STAGES, s_layout, dq_layout)
        for j in range(mid, hi):
            dq = _dq_step(j, hi, dq, rows, lse, dlt, q_smem, do_smem, k_smem, v_smem, k_bars, v_bars, k_desc, v_desc,
                          kv_row, T, S, qk_scale, True, CAUSAL, STAGES, s_layout, dq_layout)

        mbarrier.invalidate(q_bar)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(k_bars.index(i))
            mbarrier.invalidate(v_bars.index(i))
        _store_rows(dq_ptr, dq * sm_scale, i_bh.to(gl.int64) * T, m0, T, num_warps)


# ----------------------------------------------------------------------------- host


def _check_tile(tile: tuple[int, int, int, int], rows: int) -> None:
    """tile[rows] is the block the kernel's accumulators run along (BLOCK_N for dK/dV, BLOCK_M for
    dQ): the warps stack along it, 16 rows each (gluon_common.mma_layout)."""
    block_m, block_n, stages, warps = tile
    if warps not in (4, 8) or tile[rows] < 16 * warps or min(block_m, block_n) < 16 or stages < 1:
        raise ValueError(f"tile {tile}: warps 4 or 8, the accumulators' block at least 16 rows a warp "
                         f"and both blocks at least 16")


def gluon_flash_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                    lse: torch.Tensor, *, scale: float, causal: bool, dkdv_tile: tuple | None = None,
                    dq_tile: tuple | None = None, grads: tuple | None = None,
                    deterministic: bool = True, warp_specialize: bool = False) -> tuple[torch.Tensor, ...]:
    """(dq, dk, dv) in the inputs' dtype of out = softmax(scale q k^T, index-causal) v, given dO,
    the forward's out and lse (log2 units, `triton_flash.flash_fwd`'s). q [B,H,T,D], k, v [B,G,S,D];
    `supported` must hold. dkdv_tile / dq_tile: (BLOCK_M, BLOCK_N, STAGES, warps), default
    DKDV_TILES[D] / DQ_TILES[D]; grads: optional preallocated contiguous (dq, dk, dv) (tests poison
    them). deterministic=False: no dQ kernel; the dK/dV kernel adds each block's dQ share to an fp32
    buffer by atomics (FA3's schedule: S and dP computed once; the sum's order varies run to run).
    warp_specialize: the dK/dV kernel's loads run in a one-warp producer partition."""
    reason = supported(q, k, v)
    if reason is not None:
        raise ValueError(f"gluon_flash_bwd: {reason}")
    q, k, v, do, out = (t.contiguous() for t in (q, k, v, do, out))
    B, H, T, D = q.shape
    G, S = k.shape[1], k.shape[2]
    if do.shape != q.shape or out.shape != q.shape or lse.shape != (B, H, T) or lse.dtype != torch.float32:
        raise ValueError("gluon_flash_bwd: do and out must be like q, lse fp32 [B, H, T]")
    dkdv_tile, dq_tile = dkdv_tile or DKDV_TILES[D], dq_tile or DQ_TILES[D]
    _check_tile(dkdv_tile, 1)
    _check_tile(dq_tile, 0)
    if not deterministic and dkdv_tile[0] < 64:
        raise ValueError(f"gluon_flash_bwd: atomic dQ needs BLOCK_M >= 64 (a warpgroup's wgmma rows), tile {dkdv_tile}")
    dq, dk, dv = grads if grads is not None else (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    if any(g.shape != t.shape or g.dtype != t.dtype or not g.is_contiguous() for g, t in zip((dq, dk, dv), (q, k, v))):
        raise ValueError("gluon_flash_bwd: grads must be contiguous and like q, k, v")
    lse = lse.contiguous()
    dlt = do_o_rows(do, out)
    cfg = {"qk_scale": scale * LOG2E, "sm_scale": scale}
    dq_acc = dlt if deterministic else torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    bm, bn, stages, warps = dkdv_tile
    kernel, extra = gluon_flash_bwd_dkdv_kernel, {}
    if warp_specialize:
        kernel, extra = gluon_flash_bwd_dkdv_ws_kernel, {"PRODUCER_REGS": PRODUCER_REGS}
    launch(
        kernel, (triton.cdiv(S, bn), B * G),
        descriptor(q, bm), descriptor(do, bm), descriptor(k, bn), descriptor(v, bn), lse, dlt, dk, dv, dq_acc,
        T, S, H, H // G, *cfg.values(), CAUSAL=bool(causal), ATOMIC_DQ=not deterministic, STAGES=stages,
        num_warps=warps, **extra)
    if not deterministic:
        dq.copy_(dq_acc)
        return dq, dk, dv
    bm, bn, stages, warps = dq_tile
    launch(
        gluon_flash_bwd_dq_kernel, (triton.cdiv(T, bm), B * H),
        descriptor(q, bm), descriptor(do, bm), descriptor(k, bn), descriptor(v, bn), lse, dlt, dq,
        T, S, H, H // G, *cfg.values(), CAUSAL=bool(causal), STAGES=stages, num_warps=warps)
    return dq, dk, dv
