"""PoPE attention through its Cartesian form on the flash core (flash/triton_flash.py); spec:
`reference.pope_expand` (MATH §3.3, layout "interleaved") and `reference.attention` with a pope
`ScoreMod`.

1. prologue (`pope_expand_fwd`; one Triton launch for q and k of one shape, else one each): from
   raw q [B,H,T,D], k [B,G,S,D] the 2D-wide
       q_hat = mu(q) [cos, sin](m theta - delta_h),   k_hat = mu(k) [cos, sin](n theta)
   in layout "interleaved" ([x_0, y_0, x_1, ...]: the backward splits a gradient tile into its x
   and y parts in registers) and q's dtype; mu = softplus | relu | identity; angles, cos/sin and
   the amplitude in fp32 (phase.py). Positions are taken relative to the batch row's first
   key, pos - pos_k[b, 0], in int64 before the fp32 multiply: the logit depends on m - n only, and
   the fp32 angle then carries the error of the relative position (kernels/attention/README.md,
   "Numerical notes"). So q_hat / k_hat equal `reference.pope_expand` at pos - pos_k[:, :1].
2. forward: the flash core on (q_hat, k_hat, v), DK = 2D, DV = D, scale 1/sqrt(D) by default.
3. backward: the core's kernels in PoPE mode (`triton_expand_bwd.py`). Each keeps one
   operand resident and streams the other: dK/dV holds a key block and streams q_hat, dQ holds a
   query block and streams k_hat. The resident block's expansion is built in registers from the
   raw input, once per program (D transcendentals a row, not per tile: the per-tile rebuild of
   the streamed operand was the slow `fused` design); the streamed one is written by the prologue
   just before the kernel that reads it and freed after: q_hat for dK/dV, then k_hat for dQ. The
   epilogues apply the chain rule in fp32 (x, cos, sin recomputed from x, the positions and
   inv_freq) and store D-wide dk, dq and per-(b, h, query block) d delta partials, summed in a
   fixed order by torch (deterministic; d delta = -d/d phase since the phase is m theta - delta):
       dx = mu'(x) (g_x cos + g_y sin),   d delta_hc = sum_{b,t} mu (g_x sin - g_y cos).
   No 2D-wide gradient exists, and no expansion is saved for the backward.

Memory, in bytes above the inputs, B=4, H=G=16, N=16384, D=64, bf16 (U = one [B,H,N,D] tensor =
134,217,728; R = one fp32 [B,H,N] row vector = 4,194,304):
- before (q_hat, k_hat saved; dq_hat, dk_hat, then a chain kernel): saved q_hat + k_hat 4U, out U,
  lse R; backward dq_hat + dk_hat 4U, dv U, Delta R: peak 10U + 2R = 1.258 GiB (measured 1.51 GiB,
  which includes Triton's 256 MB L2-flush buffer, 0.238 GiB, of the autotuning first call).
- saving q_hat, k_hat but fusing the chain rule: 4U + U + R, then dq, dk, dv 3U + R + partials R:
  8U + 3R = 1.012 GiB.
- shipped: forward q_hat + k_hat 4U (transient) + out U + lse R = 5U + R = 0.629 GiB, saved only
  out and lse (as plain attention); backward dK/dV: out U + 2R + q_hat 2U + dk, dv 2U = 5U + 2R;
  dQ: out U + k_hat 2U + dk, dv, dq 3U + 3R = 6U + 3R = 0.762 GiB, the fwd+bwd peak (cuDNN: 0.76
  measured; 1.00 GiB expected from the benchmark with the flush buffer). The price: two prologue
  passes in the backward (read U, write 2U each), against the two chain passes (read 3U, write U
  each) and the 2D-wide gradient stores (4U) they replace.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from phaselab.kernels.common.triton_common import _pos_stride, _strides, block_d, do_o_rows, interpreting
from phaselab.kernels.flash.triton_flash import flash_bwd_dkdv, flash_bwd_dq
from phaselab.kernels.pope.triton_expand_bwd import PopeChain, _chain_epilogue, _expand_rows
from phaselab.kernels.pope.triton_pope import AMPLITUDE_CODES


def _rows_per_block(D: int) -> int:
    # about 4096 elements per program; the interpreter walks programs one by one, so fewer rows
    return 16 if interpreting() else max(16, 4096 // block_d(D))


# The standalone chain kernel's launch (rows per program: None is `_rows_per_block`; warps; volatile
# loads of x and the positions): H200, D=64, 64k tokens, benchmarks/results/pope-backward-tuning-h200.md
# (0.53 ms for dq and dk of 16 heads at 4k against 0.78 with the flash epilogues' volatile loads).
CHAIN_LAUNCH = {"rows": None, "num_warps": 4, "volatile": False}


@triton.jit
def _expand_store(x, out, pos, pos_k, inv_freq, delta, i_b, i_h, o_l, s_xb, s_xh, s_xl, s_ob, s_oh, s_ol, s_pb,
                  s_pkb, L, D: tl.constexpr, BLOCK_D: tl.constexpr, AMP: tl.constexpr, HAS_DELTA: tl.constexpr,
                  FAST: tl.constexpr):
    x_hat = _expand_rows(x, pos, pos_k, inv_freq, delta, i_b, i_h, o_l, s_xb, s_xh, s_xl, s_pb, s_pkb, L, D,
                         BLOCK_D, AMP, HAS_DELTA, FAST)
    o_2 = tl.arange(0, 2 * BLOCK_D)
    p_o = out + i_b.to(tl.int64) * s_ob + i_h.to(tl.int64) * s_oh + o_l.to(tl.int64)[:, None] * s_ol + o_2[None, :]
    tl.store(p_o, x_hat.to(out.dtype.element_ty), mask=(o_l < L)[:, None] & (o_2 < 2 * D)[None, :])


@triton.jit
def pope_expand_kernel(x, out, pos, x2, out2, pos2, pos_k, inv_freq, delta, s_xb, s_xh, s_xl, s_ob, s_oh, s_ol,
                       s_pb, s_x2b, s_x2h, s_x2l, s_o2b, s_o2h, s_o2l, s_p2b, s_pkb, L, NH, D: tl.constexpr,
                       BLOCK_D: tl.constexpr, AMP: tl.constexpr, HAS_DELTA: tl.constexpr, FAST: tl.constexpr,
                       BLOCK_L: tl.constexpr):
    """out[..., 2c] = mu cos(phase_c), out[..., 2c + 1] = mu sin(phase_c) for x [B, NH, L, D]; the
    programs of grid axis 2 = 1 do the same for x2 into out2 (the keys: positions pos2, no delta),
    so q and k of one shape take one launch."""
    i_l, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // NH, i_bh % NH
    o_l = i_l * BLOCK_L + tl.arange(0, BLOCK_L)
    if tl.program_id(2) == 0:
        _expand_store(x, out, pos, pos_k, inv_freq, delta, i_b, i_h, o_l, s_xb, s_xh, s_xl, s_ob, s_oh, s_ol, s_pb,
                      s_pkb, L, D, BLOCK_D, AMP, HAS_DELTA, FAST)
    else:
        _expand_store(x2, out2, pos2, pos_k, inv_freq, delta, i_b, i_h, o_l, s_x2b, s_x2h, s_x2l, s_o2b, s_o2h,
                      s_o2l, s_p2b, s_pkb, L, D, BLOCK_D, AMP, False, FAST)


@triton.jit
def _chain_store(x, dxh, dx, ddelta_part, pos, pos_k, inv_freq, delta, i_b, i_h, i_part, o_l, s_xb, s_xh, s_xl,
                 s_gb, s_gh, s_gl, s_db, s_dh, s_dl, s_pb, s_pkb, L, D: tl.constexpr, BLOCK_D: tl.constexpr,
                 AMP: tl.constexpr, HAS_DELTA: tl.constexpr, FAST: tl.constexpr, VOLATILE: tl.constexpr):
    o_2 = tl.arange(0, 2 * BLOCK_D)
    p_g = dxh + i_b.to(tl.int64) * s_gb + i_h.to(tl.int64) * s_gh + o_l.to(tl.int64)[:, None] * s_gl + o_2[None, :]
    g = tl.load(p_g, mask=(o_l < L)[:, None] & (o_2 < 2 * D)[None, :], other=0.0).to(tl.float32)
    _chain_epilogue(g, x, dx, ddelta_part, pos, pos_k, inv_freq, delta, i_b, i_h, o_l, s_xb, s_xh, s_xl,
                    s_db, s_dh, s_dl, s_pb, s_pkb, L, i_part, D, BLOCK_D, AMP, HAS_DELTA, FAST, VOLATILE)


@triton.jit
def pope_chain_kernel(x, dxh, dx, ddelta_part, pos, x2, dxh2, dx2, pos2, pos_k, inv_freq, delta,
                      s_xb, s_xh, s_xl, s_gb, s_gh, s_gl, s_db, s_dh, s_dl, s_pb,
                      s_x2b, s_x2h, s_x2l, s_g2b, s_g2h, s_g2l, s_d2b, s_d2h, s_d2l, s_p2b, s_pkb, L, NH, n_blocks,
                      D: tl.constexpr, BLOCK_D: tl.constexpr, AMP: tl.constexpr, HAS_DELTA: tl.constexpr,
                      FAST: tl.constexpr, BLOCK_L: tl.constexpr, VOLATILE: tl.constexpr):
    """dx and (with delta) this tile's share of d delta from d x_hat, for `pope_expand` around
    another attention core (the flash core applies `_chain_epilogue` in its own epilogues); grid
    axis 2 = 1 does dx2 from dxh2 (the keys: positions pos2, no delta) in the same launch."""
    i_l, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // NH, i_bh % NH
    o_l = i_l * BLOCK_L + tl.arange(0, BLOCK_L)
    i_part = i_bh.to(tl.int64) * n_blocks + i_l
    if tl.program_id(2) == 0:
        _chain_store(x, dxh, dx, ddelta_part, pos, pos_k, inv_freq, delta, i_b, i_h, i_part, o_l, s_xb, s_xh, s_xl,
                     s_gb, s_gh, s_gl, s_db, s_dh, s_dl, s_pb, s_pkb, L, D, BLOCK_D, AMP, HAS_DELTA, FAST, VOLATILE)
    else:
        _chain_store(x2, dxh2, dx2, ddelta_part, pos2, pos_k, inv_freq, delta, i_b, i_h, i_part, o_l, s_x2b, s_x2h,
                     s_x2l, s_g2b, s_g2h, s_g2l, s_d2b, s_d2h, s_d2l, s_p2b, s_pkb, L, D, BLOCK_D, AMP, False, FAST,
                     VOLATILE)


def _launch_args(x, delta, amplitude, rows=None, pairs=1):
    B, NH, L, D = x.shape
    bl = rows or _rows_per_block(D)
    grid = (triton.cdiv(L, bl), B * NH, pairs)
    meta = {"D": D, "BLOCK_D": block_d(D), "AMP": AMPLITUDE_CODES[amplitude], "HAS_DELTA": delta is not None,
            "FAST": not interpreting(), "BLOCK_L": bl}
    return grid, meta


def _expand(members, pos_k, inv_freq, delta, amplitude):
    """x_hat for each (x, pos) of `members` (1 or 2 of one shape; only the first takes delta)."""
    x, pos = members[0]
    B, NH, L, D = x.shape
    outs = [torch.empty((B, NH, L, 2 * D), dtype=x.dtype, device=x.device) for _ in members]
    (x2, pos2), out2 = members[-1], outs[-1]
    grid, meta = _launch_args(x, delta, amplitude, pairs=len(members))
    pope_expand_kernel[grid](x, outs[0], pos, x2, out2, pos2, pos_k, inv_freq, delta if delta is not None else inv_freq,
                             *_strides(x, outs[0]), _pos_stride(pos), *_strides(x2, out2), _pos_stride(pos2),
                             _pos_stride(pos_k), L, NH, **meta)
    return outs


def _chain(members, pos_k, inv_freq, delta, amplitude, launch=None):
    """(dx for each (x, dx_hat, pos, out or None) of `members`, d delta or None): 1 or 2 members of
    one shape, only the first with delta."""
    launch = CHAIN_LAUNCH if launch is None else launch
    x, _, _, _ = members[0]
    B, NH, L, D = x.shape
    grid, meta = _launch_args(x, delta, amplitude, launch["rows"], pairs=len(members))
    args = []
    for xm, dxh, pos, dx in members:
        dxh = dxh if dxh.stride(-1) == 1 else dxh.contiguous()
        dx = torch.empty(xm.shape, dtype=xm.dtype, device=xm.device) if dx is None else dx
        args.append((xm, dxh, dx, pos))
    (x1, g1, d1, p1), (x2, g2, d2, p2) = args[0], args[-1]
    part = torch.empty((B, NH, grid[0] if delta is not None else 1, meta["BLOCK_D"]), dtype=torch.float32,
                       device=x.device)  # every row is written when delta is given
    pope_chain_kernel[grid](x1, g1, d1, part, p1, x2, g2, d2, p2, pos_k, inv_freq,
                            delta if delta is not None else inv_freq, *_strides(x1, g1, d1), _pos_stride(p1),
                            *_strides(x2, g2, d2), _pos_stride(p2), _pos_stride(pos_k), L, NH, grid[0],
                            VOLATILE=launch["volatile"], num_warps=launch["num_warps"], **meta)
    ddelta = None if delta is None else part.sum(dim=(0, 2))[:, :D].contiguous()
    return [a[2] for a in args], ddelta


def _expand_one(x, pos, pos_k, inv_freq, delta, amplitude):
    return _expand([(x, pos)], pos_k, inv_freq, delta, amplitude)[0]


def _one_launch(q, k) -> bool:
    """q and k take one launch when they have the same [B, heads, length] (dtype is q's for both)."""
    return q.shape == k.shape and q.dtype == k.dtype


def pope_expand_fwd(q, k, pos_q, pos_k, inv_freq, delta, amplitude: str = "softplus"):
    """(q_hat [B,H,T,2D], k_hat [B,G,S,2D]) in q's dtype, layout "interleaved". q, k last dim
    contiguous; pos int64 contiguous [B|1, T|S]; inv_freq fp32 [D]; delta fp32 [H, D] or None.
    One launch where q and k have one shape, else one each."""
    if _one_launch(q, k):
        q_hat, k_hat = _expand([(q, pos_q), (k, pos_k)], pos_k, inv_freq, delta, amplitude)
        return q_hat, k_hat
    return (_expand_one(q, pos_q, pos_k, inv_freq, delta, amplitude),
            _expand_one(k, pos_k, pos_k, inv_freq, None, amplitude))


def pope_expand_bwd(dq_hat, dk_hat, q, k, pos_q, pos_k, inv_freq, delta, amplitude: str = "softplus",
                    out: tuple | None = None, launch: dict | None = None):
    """(dq, dk, ddelta fp32 [H, D] or None) from the gradients of q_hat and k_hat; `out`, if given,
    is (dq, dk) to write into (q's and k's shapes and dtype, last dim contiguous: e.g. the slices
    of full-size gradients that a head-grouped backward fills); `launch` overrides CHAIN_LAUNCH."""
    dq_out, dk_out = (None, None) if out is None else out
    members = [(q, dq_hat, pos_q, dq_out), (k, dk_hat, pos_k, dk_out)]
    if _one_launch(q, k):
        (dq, dk), ddelta = _chain(members, pos_k, inv_freq, delta, amplitude, launch)
        return dq, dk, ddelta
    (dq,), ddelta = _chain(members[:1], pos_k, inv_freq, delta, amplitude, launch)
    (dk,), _ = _chain(members[1:], pos_k, inv_freq, None, amplitude, launch)
    return dq, dk, ddelta


class PopeExpandFunction(torch.autograd.Function):
    """(q_hat, k_hat) = the Cartesian expansion; gradients for q, k and delta."""

    @staticmethod
    def forward(ctx, q, k, delta, pos_q, pos_k, inv_freq, amplitude):
        q_hat, k_hat = pope_expand_fwd(q, k, pos_q, pos_k, inv_freq, delta, amplitude)
        ctx.save_for_backward(q, k, delta, pos_q, pos_k, inv_freq)
        ctx.amplitude = amplitude
        return q_hat, k_hat

    @staticmethod
    def backward(ctx, dq_hat, dk_hat):
        q, k, delta, pos_q, pos_k, inv_freq = ctx.saved_tensors
        if dq_hat is None:
            dq_hat = torch.zeros((*q.shape[:3], 2 * q.shape[3]), dtype=q.dtype, device=q.device)
        if dk_hat is None:
            dk_hat = torch.zeros((*k.shape[:3], 2 * k.shape[3]), dtype=k.dtype, device=k.device)
        dq, dk, ddelta = pope_expand_bwd(dq_hat, dk_hat, q, k, pos_q, pos_k, inv_freq, delta, ctx.amplitude)
        if ddelta is not None:
            ddelta = ddelta.to(delta.dtype)
        return dq, dk, ddelta, None, None, None, None


def pope_expand(q, k, pos_q, pos_k, inv_freq, delta, amplitude: str = "softplus"):
    """Differentiable (q_hat, k_hat) (validated inputs, as `function.pope_attention` passes them),
    for other attention cores around the same prologue (benchmarks/attention.py, `pope-expand-cudnn`)."""
    return PopeExpandFunction.apply(q, k, delta, pos_q, pos_k, inv_freq, amplitude)


def pope_expand_attention_bwd(do, q, k, v, delta, out, lse, flags, pos_q, pos_k, inv_freq, *, scale: float,
                              causal: bool, amplitude: str, autotune: bool = False):
    """(dq, dk, dv, ddelta or None) of PoPE attention on the flash core in PoPE mode: each kernel
    builds its resident tile's expansion in registers from the raw input and streams the other
    operand's expansion from a buffer the prologue writes just before (module docstring). The
    forward is `pope_expand_fwd` then `flash_fwd` (ops.pope_fwd), which saves only out and lse;
    autotune as `AttentionOptions`."""
    cfg = {"scale": scale, "causal": causal, "chain": PopeChain(inv_freq, delta, amplitude), "autotune": autotune}
    dlt = do_o_rows(do, out)
    q_hat = _expand_one(q, pos_q, pos_k, inv_freq, delta, amplitude)
    dk, dv = flash_bwd_dkdv(do, q_hat, k, v, lse, dlt, pos_q, pos_k, flags, **cfg)
    del q_hat  # before k_hat exists: one 2D-wide buffer at a time
    k_hat = _expand_one(k, pos_k, pos_k, inv_freq, None, amplitude)
    dq, ddelta = flash_bwd_dq(do, q, k_hat, v, lse, dlt, pos_q, pos_k, flags, **cfg)
    return dq, dk, dv, ddelta
