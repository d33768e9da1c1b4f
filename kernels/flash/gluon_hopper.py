"""Hopper (sm_90) forward of the plain flash core in Gluon: TMA loads into a shared-memory ring
guarded by mbarriers, asynchronous wgmma, and the online softmax of one key block overlapped with
the tensor-core work of its neighbours (FlashAttention-3, Shah et al. 2024,
https://arxiv.org/abs/2407.08608, sections 3.1-3.2).

Spec: `reference.flash_attention` with index positions (the T queries are the last T of the S keys;
key s is visible to query t iff s <= t + S - T when causal), GQA (head h reads kv head h // (H // G)),
q/k/v one width D in {64, 128}, bf16 or fp16. Returns (out [B, H, T, D] in q's dtype, lse [B, H, T]
fp32) in the convention of `triton_flash.flash_fwd` (log2 units of the scaled logits, +inf for a row
that sees no key, whose output is 0), so `triton_flash.flash_bwd` consumes it unchanged.

Schedule of one program (BLOCK_M query rows, 4 warps per 64 of them, key blocks j = 0..hi-1),
with S_j = Q K_j^T and PV_j = P_j V_j (FA3's intra-warpgroup overlap):

    step j:  issue S_j (async); O *= alpha_{j-1}; issue PV_{j-1} (async, P_{j-1} from registers)
             wait S_j               | refill K slot of block j with K_{j+STAGES}
             softmax of S_j (overlaps PV_{j-1} on the tensor cores)
             wait PV_{j-1}          | refill V slot of block j-1 with V_{j-1+STAGES}

Every wgmma retires within its step: one in flight across the loop's back edge makes ptxas
serialise all of them (C7514, measured with benchmarks/gluon_compile.py). K and V have separate
ring slots and barriers, a K slot freeing when its QK^T retires, a V slot when its PV does. Both
warpgroups read every slot; Triton's shared-memory barrier analysis puts a CTA barrier before each
refill, so neither overwrites what the other still reads. Causal programs visit only key blocks
that some of their queries see and mask only the diagonal ones; query blocks run longest-first.

`warp_specialize=True` runs the loads in a one-warp producer partition (gl.warp_specialize, 24
registers a thread, setmaxnreg) that refills slots as the softmax warps release them through
"empty" mbarriers; the softmax warps keep the schedule above. On the H200 it measured slower than
the single-partition kernel (TILES_WS), so it is opt-in.

The module imports without Gluon (CPU machines, other Triton versions): `supported` says why the
core cannot run, and nothing Gluon runs under TRITON_INTERPRET.
"""

from __future__ import annotations

import torch

from phaselab.kernels.common.triton_common import LOG2E
from phaselab.kernels.flash import gluon_common
from phaselab.kernels.flash.gluon_common import PRODUCER_REGS, descriptor, launch

if gluon_common.IMPORT_ERROR is None:   # Gluon's Hopper API, as gluon_common imported it
    from phaselab.kernels.flash.gluon_common import (
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

# (BLOCK_M, BLOCK_N, STAGES, warps) per head dim: one softmax warpgroup per CTA, 2-3 CTAs an SM.
# H200, triton 3.6.0, causal bf16 forward, H = 16, 64k tokens a batch, x cuDNN SDPA at N = 4k / 16k
# (benchmarks/gluon_compile.py --time 4096 16384): D = 64: 64x128x2x4 0.99 / 1.03, 64x64x2x4
# 1.07 / 1.07, 128x128x2x8 1.45 / 1.18, 128x64x2x8 1.32 / 1.16; D = 128: 64x128x1x4 1.06 / 1.06,
# 128x128x2x8 1.22 / 1.10, 128x64x2x8 1.33 / 1.16, 64x64x2x4 1.24 / 1.18. STAGES = 1 still overlaps:
# K_{j+1} loads once QK^T_j retires, V_j once PV_{j-1} does, each a step ahead of its use.
TILES = {64: (64, 128, 2, 4), 128: (64, 128, 1, 4)}
# The warp-specialised kernel measured no better at 8 warps (D = 64: 1.41 / 1.20, D = 128: 1.28 /
# 1.17) and worse with one softmax warpgroup (D = 64, 64x128x3x4: 1.74 / 1.49; ptxas drops its
# maxnreg there), so it stays opt-in with its best tile.
TILES_WS = {64: (128, 128, 2, 8), 128: (128, 128, 2, 8)}


def supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos_q=None, pos_k=None) -> str | None:
    """None when the Gluon forward can run on these inputs, else a short reason (gluon_common.supported)."""
    return gluon_common.supported(q, k, v, pos_q, pos_k, what="the Gluon forward")


if gluon_common.IMPORT_ERROR is None:
    @gluon.constexpr_function
    def rescale_asm(n):
        """`_rescale`'s asm over all n fp32 accumulators of one thread, one branch a step (four
        packs of 16 took four branches, each drawing instruction-fetch stalls in the TAPA
        forward's Nsight Compute samples, benchmarks/results/ncu/tapa-gluon-4k-source.csv.gz):
        outputs $0.. start as the inputs $n.., $2n.. carry the warp's vote (0: every alpha of the
        warp is 1; all equal), $3n.. the rows' alphas. The braces scope the label to each copy of
        the asm."""
        return ("{ .reg .pred p; " + f"setp.eq.u32 p, ${2 * n}, 0; "
                + " ".join(f"mov.b32 ${i}, ${n + i};" for i in range(n))
                + " @p bra.uni DONE; "
                + " ".join(f"mul.f32 ${i}, ${i}, ${3 * n + i};" for i in range(n))
                + " DONE: }")

    @gluon.constexpr_function
    def rescale_constraints(n):
        return ",".join(["=r"] * n + ["r"] * (3 * n))

    @gluon.jit
    def _load(desc, row, bars, smem, i, hi, STAGES: gl.constexpr):
        """TMA block i (rows row..row+BLOCK) into ring slot i % STAGES, if i < hi."""
        _load_block(i, row, i < hi, desc, smem, bars, STAGES)

    @gluon.jit
    def _load_block(r, row, pred, desc, smem, bars, STAGES: gl.constexpr):
        """TMA rows row.. of desc into the slot of ring index r (slot r % STAGES), if pred."""
        mbarrier.expect(bars.index(r % STAGES), desc.block_type.nbytes, pred=pred)
        tma.async_copy_global_to_shared(desc, [row, 0], bars.index(r % STAGES), smem.index(r % STAGES), pred=pred)

    @gluon.jit
    def _softmax(s, m_i, l_i, n0, row_lim, S, qk_scale, MASKED: gl.constexpr, CAUSAL: gl.constexpr,
                 s_layout: gl.constexpr, LAZY: gl.constexpr = False):
        """P (fp32, unnormalised), alpha and the new row max / sum of one score tile, exp2 domain;
        MASKED: keys past S and, causally, past each row's limit get -inf (a row with no visible
        key so far keeps max -inf, its P 0). LAZY: a row keeps its reference max m_i until a
        block's max exceeds it by more than 8 (log2 units), so P <= 2**8 and alpha is exactly 1
        for most rows of most blocks (`_rescale` then skips O's rescale); the returned m_i is the
        reference max, against which l_i and O are kept, so lse = m_i + log2(l_i) as before."""
        if MASKED:
            cols = n0 + gl.arange(0, s.shape[1], layout=gl.SliceLayout(0, s_layout))
            vis = (cols < S)[None, :]
            if CAUSAL:
                vis = vis & (cols[None, :] <= row_lim[:, None])
            s = gl.where(vis, s, float("-inf"))
        m_blk = gl.max(s, 1) * qk_scale
        if LAZY:
            m_new = gl.where(m_blk > m_i + 8.0, m_blk, m_i)
        else:
            m_new = gl.maximum(m_i, m_blk)
        if MASKED:
            m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_use = m_new
        p = gl.exp2(s * qk_scale - m_use[:, None])
        alpha = gl.exp2(m_i - m_use)
        l_i = l_i * alpha + gl.sum(p, 1)
        return p, alpha, m_new, l_i

    @gluon.jit
    def _rescale(o, alpha, o_layout: gl.constexpr):
        """O * alpha[:, None], skipped by a warp whose rows all have alpha == 1 (the LAZY softmax's
        common case; x * 1 == x exactly; a NaN alpha counts as != 1): a warp vote, then one
        warp-uniform branch around all of a thread's accumulators (`rescale_asm`). A row's
        accumulators all lie in one warp in the wgmma layout, so each row is scaled whole or not
        at all."""
        a = gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))
        any_a = gl.inline_asm_elementwise(
            "{ .reg .pred p, q; setp.neu.f32 p, $2, 0f3F800000; setp.neu.f32 q, $3, 0f3F800000; or.pred p, p, q; "
            "vote.sync.any.pred p, p, -1; selp.u32 $0, 1, 0, p; selp.u32 $1, 1, 0, p; }",
            "=r,=r,r,r", [a], dtype=gl.int32, is_pure=False, pack=2)
        N: gl.constexpr = o.shape[0] * o.shape[1] // (32 * gl.num_warps())   # a thread's accumulators
        return gl.inline_asm_elementwise(rescale_asm(N), rescale_constraints(N), [o, any_a[:, None], a[:, None]],
                                         dtype=gl.float32, is_pure=True, pack=N)

    @gluon.jit
    def _pv(o, p, alpha, v_smem, v_bars, j, STAGES: gl.constexpr, o_layout: gl.constexpr,
            LAZY: gl.constexpr = False):
        """O * alpha + P V_j, issued async (P from registers as the A operand); LAZY: the rescale
        skipped where alpha is 1 (`_rescale`)."""
        if LAZY:
            o = _rescale(o, alpha, o_layout)
        else:
            o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        mbarrier.wait(v_bars.index(j % STAGES), (j // STAGES) & 1)
        return warpgroup_mma(p, v_smem.index(j % STAGES), o, is_async=True)

    @gluon.jit
    def _p_operand(p, dtype: gl.constexpr, o_layout: gl.constexpr):
        """P in the input dtype, in the register layout of wgmma's A operand."""
        return gl.convert_layout(p.to(dtype), gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))

    @gluon.jit
    def _free_k(j, hi, k_desc, k_smem, k_bars, k_empty, kv_row, STAGES: gl.constexpr, WS: gl.constexpr):
        """The K slot of block j is free (its QK^T retired): refill it with K_{j+STAGES}, or (WS)
        tell the producer, once both warpgroups are past their wait."""
        if WS:
            gl.thread_barrier()
            mbarrier.arrive(k_empty.index(j % STAGES), count=1)
        else:
            _load(k_desc, kv_row + (j + STAGES) * k_smem.shape[1], k_bars, k_smem, j + STAGES, hi, STAGES)

    @gluon.jit
    def _step(j, hi, o, p, alpha, m_i, l_i, row_lim, q_smem, k_smem, v_smem, k_bars, v_bars, k_empty, v_empty,
              k_desc, v_desc, kv_row, S, qk_scale, MASKED: gl.constexpr, CAUSAL: gl.constexpr,
              STAGES: gl.constexpr, WS: gl.constexpr, s_layout: gl.constexpr, o_layout: gl.constexpr):
        """Key block j of the software-pipelined schedule (module docstring): enters with P_{j-1}
        and its alpha in registers, leaves with P_j; O holds PV up to block j-1 on return."""
        BLOCK_M: gl.constexpr = q_smem.shape[0]
        BLOCK_N: gl.constexpr = k_smem.shape[1]
        mbarrier.wait(k_bars.index(j % STAGES), (j // STAGES) & 1)
        s_tok = warpgroup_mma(q_smem, k_smem.index(j % STAGES).permute((1, 0)),
                              gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout), use_acc=False, is_async=True)
        o_tok = _pv(o, p, alpha, v_smem, v_bars, j - 1, STAGES, o_layout)
        s = warpgroup_mma_wait(1, deps=(s_tok,))
        _free_k(j, hi, k_desc, k_smem, k_bars, k_empty, kv_row, STAGES, WS)
        p, alpha, m_i, l_i = _softmax(s, m_i, l_i, j * BLOCK_N, row_lim, S, qk_scale, MASKED, CAUSAL, s_layout)
        p = _p_operand(p, k_smem.dtype, o_layout)
        o = warpgroup_mma_wait(0, deps=(o_tok,))
        _free_k(j - 1, hi, v_desc, v_smem, v_bars, v_empty, kv_row, STAGES, WS)  # the V slot of block j-1
        return o, p, alpha, m_i, l_i

    @gluon.jit
    def _block_range(i_m, T, S, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
        """(mid, hi): key blocks [0, mid) are visible to every query of the block, [mid, hi) to some;
        hi >= 1 (a block whose queries see no key runs block 0 fully masked: out 0, lse +inf)."""
        if CAUSAL:
            n_lo = gl.minimum(gl.maximum(i_m * BLOCK_M + S - T + 1, 0), S)
            n_hi = gl.minimum(gl.maximum(gl.minimum(i_m * BLOCK_M + BLOCK_M, T) + S - T, 0), S)
            mid = n_lo // BLOCK_N
            hi = gl.maximum(gl.cdiv(n_hi, BLOCK_N), 1)
        else:
            mid = S // BLOCK_N
            hi = gl.cdiv(S, BLOCK_N)
        return gl.maximum(gl.minimum(mid, hi), 1), hi

    @gluon.jit
    def _epilogue(o, m_i, l_i, o_ptr, lse_ptr, i_bh, m0, T, s_layout: gl.constexpr, o_layout: gl.constexpr,
                  num_warps: gl.constexpr):
        """out = O / l (0 for a row that sees no key), lse = m + log2 l (+inf there); rows past T
        are not stored."""
        BLOCK_M: gl.constexpr = o.shape[0]
        HEAD_D: gl.constexpr = o.shape[1]
        empty = l_i == 0.0
        lse = gl.where(empty, float("inf"), m_i + gl.log2(gl.where(empty, 1.0, l_i)))
        rows = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
        gl.store(lse_ptr + i_bh.to(gl.int64) * T + rows, lse, mask=rows < T)
        inv = gl.convert_layout(1.0 / gl.where(empty, 1.0, l_i), gl.SliceLayout(1, o_layout))
        st_layout: gl.constexpr = rows_layout(num_warps, HEAD_D)
        out = gl.convert_layout((o * inv[:, None]).to(o_ptr.dtype.element_ty), st_layout)
        r = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, st_layout))
        c = gl.arange(0, HEAD_D, layout=gl.SliceLayout(0, st_layout))
        ptrs = o_ptr + (i_bh.to(gl.int64) * T + r)[:, None] * HEAD_D + c[None, :]
        gl.store(ptrs, out, mask=(r < T)[:, None])

    @gluon.jit
    def _consume(q_smem, k_smem, v_smem, q_bar, k_bars, v_bars, k_empty, v_empty, k_desc, v_desc, o_ptr, lse_ptr,
                 i_bh, m0, kv_row, mid, hi, T, S, qk_scale, CAUSAL: gl.constexpr, STAGES: gl.constexpr,
                 WS: gl.constexpr, num_warps: gl.constexpr):
        """The softmax warpgroups' schedule over key blocks 0..hi-1 and the epilogue."""
        BLOCK_M: gl.constexpr = q_smem.shape[0]
        HEAD_D: gl.constexpr = q_smem.shape[1]
        BLOCK_N: gl.constexpr = k_smem.shape[1]
        s_layout: gl.constexpr = mma_layout(num_warps, BLOCK_N)
        o_layout: gl.constexpr = mma_layout(num_warps, HEAD_D)
        rows = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
        row_lim = rows + (S - T)  # the last key index each row sees (causal)
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
        l_i = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, s_layout))
        o = gl.zeros([BLOCK_M, HEAD_D], gl.float32, o_layout)
        mbarrier.wait(q_bar, 0)
        mbarrier.wait(k_bars.index(0), 0)
        s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout),
                          use_acc=False)
        _free_k(0, hi, k_desc, k_smem, k_bars, k_empty, kv_row, STAGES, WS)
        # block 0 always masked (it may be the diagonal or the ragged end); then the fully
        # visible blocks [1, mid) without a mask, the rest [mid, hi) masked
        p, alpha, m_i, l_i = _softmax(s, m_i, l_i, 0, row_lim, S, qk_scale, True, CAUSAL, s_layout)
        p = _p_operand(p, k_smem.dtype, o_layout)
        for j in range(1, mid):
            o, p, alpha, m_i, l_i = _step(j, hi, o, p, alpha, m_i, l_i, row_lim, q_smem, k_smem, v_smem, k_bars,
                                          v_bars, k_empty, v_empty, k_desc, v_desc, kv_row, S, qk_scale, False,
                                          CAUSAL, STAGES, WS, s_layout, o_layout)
        for j in range(mid, hi):
            o, p, alpha, m_i, l_i = _step(j, hi, o, p, alpha, m_i, l_i, row_lim, q_smem, k_smem, v_smem, k_bars,
                                          v_bars, k_empty, v_empty, k_desc, v_desc, kv_row, S, qk_scale, True,
                                          CAUSAL, STAGES, WS, s_layout, o_layout)
        o = warpgroup_mma_wait(0, deps=(_pv(o, p, alpha, v_smem, v_bars, hi - 1, STAGES, o_layout),))
        _epilogue(o, m_i, l_i, o_ptr, lse_ptr, i_bh, m0, T, s_layout, o_layout, num_warps)

    @gluon.jit
    def _produce_block(desc, bars, smem, empty, kv_row, i, hi, STAGES: gl.constexpr):
        """A producer warp's load of block i into its ring slot, once the consumers released the
        block STAGES earlier (a fresh barrier passes the wait on parity 1)."""
        mbarrier.wait(empty.index(i % STAGES), ((i // STAGES) & 1) ^ 1)
        _load(desc, kv_row + i * smem.shape[1], bars, smem, i, hi, STAGES)

    @gluon.jit
    def _produce(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_bars, v_bars, k_empty, v_empty, q_row,
                 kv_row, hi, STAGES: gl.constexpr):
        """The producer warp: Q, then K_i and V_i in order (`_produce_block`)."""
        mbarrier.expect(q_bar, q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [q_row, 0], q_bar, q_smem)
        for i in range(hi):
            _produce_block(k_desc, k_bars, k_smem, k_empty, kv_row, i, hi, STAGES)
            _produce_block(v_desc, v_bars, v_smem, v_empty, kv_row, i, hi, STAGES)

    @gluon.jit
    def _setup(q_desc, k_desc, i_bh, T, S, H, GROUP, STAGES: gl.constexpr, CAUSAL: gl.constexpr):
        """(m0, kv_row, mid, hi, Q / K / V buffers, Q's barrier, the slots' barriers) of this program."""
        BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
        HEAD_D: gl.constexpr = q_desc.block_type.shape[1]
        BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
        i_m = gl.num_programs(0) - 1 - gl.program_id(0)  # longest (causal) rows first
        kv_row = kv_base_row(i_bh, H, GROUP, S)
        mid, hi = _block_range(i_m, T, S, BLOCK_M, BLOCK_N, CAUSAL)
        q_smem = gl.allocate_shared_memory(q_desc.dtype, [BLOCK_M, HEAD_D], q_desc.layout)
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_D], k_desc.layout)
        v_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_D], k_desc.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        # ready (TMA landed) and empty (consumers done, WS only) barriers of the K and V slots
        k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(k_bars.index(i), count=1)
            mbarrier.init(v_bars.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=1)
            mbarrier.init(v_empty.index(i), count=1)
        return i_m * BLOCK_M, kv_row, mid, hi, q_smem, k_smem, v_smem, q_bar, k_bars, v_bars, k_empty, v_empty

    @gluon.jit
    def gluon_flash_fwd_kernel(q_desc, k_desc, v_desc, o_ptr, lse_ptr, T, S, H, GROUP, qk_scale,
                               CAUSAL: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr):
        """One BLOCK_M block of query rows of one (batch, head); q/k/v descriptors over the
        contiguous [B*H*T, D] / [B*G*S, D] views (rows of a neighbouring head read past T or S are
        discarded or masked; TMA zero-fills past the tensor). Loads issued by the softmax warps."""
        BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
        i_bh = gl.program_id(1)
        m0, kv_row, mid, hi, q_smem, k_smem, v_smem, q_bar, k_bars, v_bars, k_empty, v_empty = _setup(
            q_desc, k_desc, i_bh, T, S, H, GROUP, STAGES, CAUSAL)
        mbarrier.expect(q_bar, q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [i_bh * T + m0, 0], q_bar, q_smem)
        for i in gl.static_range(STAGES):
            _load(k_desc, kv_row + i * BLOCK_N, k_bars, k_smem, i, hi, STAGES)
            _load(v_desc, kv_row + i * BLOCK_N, v_bars, v_smem, i, hi, STAGES)
        _consume(q_smem, k_smem, v_smem, q_bar, k_bars, v_bars, k_empty, v_empty, k_desc, v_desc, o_ptr, lse_ptr,
                 i_bh, m0, kv_row, mid, hi, T, S, qk_scale, CAUSAL, STAGES, False, num_warps)

    @gluon.jit
    def gluon_flash_fwd_ws_kernel(q_desc, k_desc, v_desc, o_ptr, lse_ptr, T, S, H, GROUP, qk_scale,
                                  CAUSAL: gl.constexpr, STAGES: gl.constexpr, PRODUCER_REGS: gl.constexpr,
                                  num_warps: gl.constexpr):
        """`gluon_flash_fwd_kernel` with the loads in a one-warp producer partition holding
        PRODUCER_REGS registers a thread (the softmax warps get the rest, setmaxnreg)."""
        i_bh = gl.program_id(1)
        m0, kv_row, mid, hi, q_smem, k_smem, v_smem, q_bar, k_bars, v_bars, k_empty, v_empty = _setup(
            q_desc, k_desc, i_bh, T, S, H, GROUP, STAGES, CAUSAL)
        gl.warp_specialize([
            (_consume, (q_smem, k_smem, v_smem, q_bar, k_bars, v_bars, k_empty, v_empty, k_desc, v_desc, o_ptr,
                        lse_ptr, i_bh, m0, kv_row, mid, hi, T, S, qk_scale, CAUSAL, STAGES, True, num_warps)),
            (_produce, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_bars, v_bars, k_empty, v_empty,
                        i_bh * T + m0, kv_row, hi, STAGES)),
        ], [1], [PRODUCER_REGS])


def descriptors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_m: int, block_n: int) -> tuple:
    """TMA descriptors of q [B,H,T,D], k, v [B,G,S,D] (contiguous) as [rows, D] matrices."""
    return descriptor(q, block_m), descriptor(k, block_n), descriptor(v, block_n)


def gluon_flash_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float, causal: bool,
                    out: torch.Tensor | None = None, lse: torch.Tensor | None = None,
                    tile: tuple[int, int, int, int] | None = None,
                    warp_specialize: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [B,H,T,D] in q's dtype, lse [B,H,T] fp32 in log2 units) of q [B,H,T,D], k, v [B,G,S,D]
    (`supported` must hold; scale > 0). out / lse: optional preallocated contiguous buffers (tests
    poison them); tile: (BLOCK_M, BLOCK_N, STAGES, warps), default TILES[D] (TILES_WS[D] with
    warp_specialize, which loads K and V from a producer warp)."""
    reason = supported(q, k, v)
    if reason is not None:
        raise ValueError(f"gluon_flash_fwd: {reason}")
    if not scale > 0:
        raise ValueError(f"gluon_flash_fwd: scale must be > 0 (the row max is taken before scaling), got {scale}")
    q, k, v = (t.contiguous() for t in (q, k, v))
    B, H, T, D = q.shape
    G, S = k.shape[1], k.shape[2]
    block_m, block_n, stages, warps = tile or (TILES_WS if warp_specialize else TILES)[D]
    if out is None:
        out = torch.empty_like(q)
    if lse is None:
        lse = torch.empty((B, H, T), dtype=torch.float32, device=q.device)
    if out.shape != q.shape or out.dtype != q.dtype or not out.is_contiguous() or lse.shape != (B, H, T) \
            or lse.dtype != torch.float32 or not lse.is_contiguous():
        raise ValueError("gluon_flash_fwd: out must be like q and lse fp32 [B, H, T], both contiguous")
    q_desc, k_desc, v_desc = descriptors(q, k, v, block_m, block_n)
    grid = (triton.cdiv(T, block_m), B * H)
    args = (q_desc, k_desc, v_desc, out, lse, T, S, H, H // G, scale * LOG2E)
    if warp_specialize:
        launch(gluon_flash_fwd_ws_kernel, grid, *args, CAUSAL=bool(causal), STAGES=stages,
               PRODUCER_REGS=PRODUCER_REGS, num_warps=warps)
    else:
        launch(gluon_flash_fwd_kernel, grid, *args, CAUSAL=bool(causal), STAGES=stages, num_warps=warps)
    return out, lse


class GluonFlashFunction(torch.autograd.Function):
    """out = softmax(scale q k^T, index-causal) v with the Gluon forward and, by head dim
    (`gluon_hopper_bwd.BACKWARD_BY_D`), the Gluon backward or the Triton `tl` one
    (`triton_flash.flash_bwd`); both read the forward's lse as it is."""

    @staticmethod
    def forward(ctx, q, k, v, scale, causal, autotune):
        q, k, v = (t.contiguous() for t in (q, k, v))
        out, lse = gluon_flash_fwd(q, k, v, scale=scale, causal=causal)
        ctx.cfg = {"scale": scale, "causal": causal, "autotune": autotune}
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, do):
        from phaselab.kernels.flash import gluon_hopper_bwd
        from phaselab.kernels.flash.triton_flash import flash_bwd

        q, k, v, out, lse = ctx.saved_tensors
        if gluon_hopper_bwd.BACKWARD_BY_D.get(q.shape[-1]) == "gluon-ws":
            dq, dk, dv = gluon_hopper_bwd.gluon_flash_bwd(do, q, k, v, out, lse, scale=ctx.cfg["scale"],
                                                          causal=ctx.cfg["causal"], warp_specialize=True)
        else:
            dq, dk, dv = flash_bwd(do, q, k, v, out, lse, None, None, None, **ctx.cfg)
        return dq, dk, dv, None, None, None


@torch.compiler.disable  # user-defined Triton kernels run outside the compiled graph (kernels/common/ops.py)
def gluon_flash_attention(q_BHTD: torch.Tensor, k_BGSD: torch.Tensor, v_BGSD: torch.Tensor, *,
                          scale: float | None = None, causal: bool = True, autotune: bool = False) -> torch.Tensor:
    """Differentiable index-causal flash attention, Gluon forward (`supported` must hold) and the
    backward `GluonFlashFunction` picks; q [B,H,T,D], k, v [B,G,S,D]; scale defaults to 1/sqrt(D);
    autotune applies to the `tl` backward's kernels."""
    scale = q_BHTD.shape[-1] ** -0.5 if scale is None else float(scale)
    return GluonFlashFunction.apply(q_BHTD, k_BGSD, v_BGSD, scale, bool(causal), bool(autotune))
