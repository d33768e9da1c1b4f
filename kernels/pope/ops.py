"""The Triton PoPE kernels as torch.library custom ops `phaselab::pope_fwd/bwd`, with autograd,
fake (shape-only) implementations and a vmap rule (why custom ops: kernels/common/ops.py).
The forward op dispatches to the implementation named by `impl` (function.py picks it).

The forward op returns (out, lse, aux) and the backward op takes them back: aux is the expand
implementation's position flags (kernels/flash/triton_flash.py `pos_flags`), empty for the others; lse is the core's own
row statistic (cuDNN's for impl "cudnn"), read only by the same core's backward. Inputs are the
validated ones of `function.pope_attention` (int64 positions, fp32 inv_freq
and delta); the ops make q, k, v (and dO, out) dense in the last dim themselves, the one place that
sees the layouts a compiled caller picks. Every output is contiguous, as the fake implementations say.
"""

from __future__ import annotations

import torch
from torch import Tensor

from phaselab.kernels.common.ops import fold, last_dim_dense, members_first, no_aux, per_member, unfold
from phaselab.kernels.flash import triton_flash
from phaselab.kernels.pope import cudnn, triton_expand, triton_pope


@torch.library.custom_op("phaselab::pope_fwd", mutates_args=())
def pope_fwd(q: Tensor, k: Tensor, v: Tensor, delta: Tensor | None, pos_q: Tensor, pos_k: Tensor,
             inv_freq: Tensor, scale: float, causal: bool, amplitude: str, impl: str, exp2: str,
             autotune: bool) -> tuple[Tensor, Tensor, Tensor]:
    q, k, v = last_dim_dense(q, k, v)
    if impl == "expand":
        flags = triton_flash.pos_flags(pos_q, pos_k)
        q_hat, k_hat = triton_expand.pope_expand_fwd(q, k, pos_q, pos_k, inv_freq, delta, amplitude)
        out, lse = triton_flash.flash_fwd(q_hat, k_hat, v, pos_q, pos_k, flags, scale=scale, causal=causal,
                                          autotune=autotune)
        return out, lse, flags
    if impl == "cudnn":
        out, lse = cudnn.pope_cudnn_fwd(q, k, v, pos_q, pos_k, inv_freq, delta, scale=scale, causal=causal,
                                             amplitude=amplitude)
        return out, lse, no_aux(q)
    out, lse = triton_pope.pope_fwd(q, k, v, pos_q, pos_k, inv_freq, delta, scale=scale, causal=causal,
                                    amplitude=amplitude, exp2=exp2, autotune=autotune)
    return out, lse, no_aux(q)


@pope_fwd.register_fake
def _pope_fwd_fake(q, k, v, delta, pos_q, pos_k, inv_freq, scale, causal, amplitude, impl, exp2, autotune):
    B, H, T, _ = q.shape
    n_flags = max(pos_q.shape[0], pos_k.shape[0]) if impl == "expand" else 0
    return (q.new_empty((B, H, T, v.shape[-1])), q.new_empty((B, H, T), dtype=torch.float32),
            q.new_empty((n_flags,), dtype=torch.int32))


@torch.library.custom_op("phaselab::pope_bwd", mutates_args=())
def pope_bwd(do: Tensor, q: Tensor, k: Tensor, v: Tensor, delta: Tensor | None, out: Tensor, lse: Tensor,
             aux: Tensor, pos_q: Tensor, pos_k: Tensor, inv_freq: Tensor, scale: float, causal: bool,
             amplitude: str, impl: str, exp2: str, autotune: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, ddelta fp32 [H, D]; an empty ddelta when delta is None)."""
    do, q, k, v, out = last_dim_dense(do, q, k, v, out)
    if impl == "expand":
        dq, dk, dv, ddelta = triton_expand.pope_expand_attention_bwd(
            do, q, k, v, delta, out, lse, aux, pos_q, pos_k, inv_freq, scale=scale, causal=causal,
            amplitude=amplitude, autotune=autotune)
    elif impl == "cudnn":
        dq, dk, dv, ddelta = cudnn.pope_cudnn_bwd(do, q, k, v, delta, out, lse, pos_q, pos_k, inv_freq,
                                                       scale=scale, causal=causal, amplitude=amplitude)
    else:
        dq, dk, dv, ddelta = triton_pope.pope_bwd(do, q, k, v, out, lse, pos_q, pos_k, inv_freq, delta,
                                                  scale=scale, causal=causal, amplitude=amplitude, exp2=exp2,
                                                  autotune=autotune)
    ddelta = no_aux(q, torch.float32) if ddelta is None else ddelta
    return dq.contiguous(), dk.contiguous(), dv.contiguous(), ddelta


@pope_bwd.register_fake
def _pope_bwd_fake(do, q, k, v, delta, out, lse, aux, pos_q, pos_k, inv_freq, scale, causal, amplitude, impl, exp2,
                   autotune):
    ddelta = delta.new_empty(delta.shape) if delta is not None else q.new_empty((0,), dtype=torch.float32)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), ddelta  # contiguous, as returned


def _pope_setup(ctx, inputs, output):
    q, k, v, delta, pos_q, pos_k, inv_freq, *cfg = inputs
    out, lse, aux = output
    ctx.save_for_backward(q, k, v, delta, out, lse, aux, pos_q, pos_k, inv_freq)
    ctx.cfg = cfg


def _pope_backward(ctx, do, _dlse, _daux):
    q, k, v, delta, out, lse, aux, pos_q, pos_k, inv_freq = ctx.saved_tensors
    dq, dk, dv, ddelta = pope_bwd(do, q, k, v, delta, out, lse, aux, pos_q, pos_k, inv_freq, *ctx.cfg)
    return dq, dk, dv, (ddelta if delta is not None else None), *([None] * 9)


pope_fwd.register_autograd(_pope_backward, setup_context=_pope_setup)


@torch.library.register_vmap("phaselab::pope_fwd")
def _pope_fwd_vmap(info, in_dims, q, k, v, delta, pos_q, pos_k, inv_freq, *cfg):
    K, (dq, dk, dv, dd, dpq, dpk, dfreq) = info.batch_size, in_dims[:7]
    if dpq is not None or dpk is not None or dfreq is not None:
        return per_member(pope_fwd, info, in_dims, (q, k, v, delta, pos_q, pos_k, inv_freq, *cfg))
    if delta is not None:
        delta_KHD = members_first(delta, dd, K)
        delta = delta_KHD.reshape(-1, delta_KHD.shape[-1])
    out, lse, aux = pope_fwd(fold(q, dq, K), fold(k, dk, K), fold(v, dv, K), delta, pos_q, pos_k, inv_freq, *cfg)
    return (unfold(out, K), unfold(lse, K), aux), (0, 0, None)
