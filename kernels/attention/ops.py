"""The Triton PoPE and TAPA kernels as torch.library custom ops: `phaselab::pope_fwd/bwd` and
`phaselab::tapa_fwd/bwd`, with autograd, fake (shape-only) implementations and vmap rules.

Why custom ops (https://pytorch.org/docs/stable/notes/custom_operators.html):
- torch.compile treats an op as one opaque node, so a compiled model keeps ONE graph through its
  attention calls; dynamo never traces the host-side launch code (it failed on it: fp64 scalar
  arguments, "ListVariable is already tracked for mutation"), and the compiled regions around
  attention are not cut at every layer;
- `register_vmap` lets `torch.func.vmap` stack K models (benchmarks/ensemble.py): the member
  dimension is folded into the heads, so K members are one launch with K*H heads (PoPE's delta,
  a per-member parameter [K, H, D], becomes [K*H, D]); an autograd.Function without a vmap rule
  cannot run under vmap at all.
The forward ops return (out, lse, aux) and the backward ops take them back: aux is the expand
implementation's position flags (triton_flash.pos_flags), empty for the others; lse is the core's own
row statistic (cuDNN's for impl "cudnn"), read only by the same core's backward. Inputs are the
validated ones of `function.pope_attention` / `tapa_attention` (int64 positions, fp32 inv_freq
and delta); the ops make q, k, v (and dO, out) dense in the last dim themselves, the one place that
sees the layouts a compiled caller picks. Every output is contiguous, as the fake implementations say.
"""

from __future__ import annotations

import torch
from torch import Tensor

from phaselab.kernels.attention import pope_cudnn, triton_flash, triton_pope, triton_pope_expand, triton_tapa

# ----------------------------------------------------------------------------- PoPE


@torch.library.custom_op("phaselab::pope_fwd", mutates_args=())
def pope_fwd(q: Tensor, k: Tensor, v: Tensor, delta: Tensor | None, pos_q: Tensor, pos_k: Tensor,
             inv_freq: Tensor, scale: float, causal: bool, amplitude: str, impl: str, exp2: str,
             autotune: bool) -> tuple[Tensor, Tensor, Tensor]:
    q, k, v = _last_dim_dense(q, k, v)
    if impl == "expand":
        flags = triton_flash.pos_flags(pos_q, pos_k)
        q_hat, k_hat = triton_pope_expand.pope_expand_fwd(q, k, pos_q, pos_k, inv_freq, delta, amplitude)
        out, lse = triton_flash.flash_fwd(q_hat, k_hat, v, pos_q, pos_k, flags, scale=scale, causal=causal,
                                          autotune=autotune)
        return out, lse, flags
    if impl == "cudnn":
        out, lse = pope_cudnn.pope_cudnn_fwd(q, k, v, pos_q, pos_k, inv_freq, delta, scale=scale, causal=causal,
                                             amplitude=amplitude)
        return out, lse, _no_aux(q)
    out, lse = triton_pope.pope_fwd(q, k, v, pos_q, pos_k, inv_freq, delta, scale=scale, causal=causal,
                                    amplitude=amplitude, exp2=exp2, autotune=autotune)
    return out, lse, _no_aux(q)


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
    do, q, k, v, out = _last_dim_dense(do, q, k, v, out)
    if impl == "expand":
        dq, dk, dv, ddelta = triton_pope_expand.pope_expand_attention_bwd(
            do, q, k, v, delta, out, lse, aux, pos_q, pos_k, inv_freq, scale=scale, causal=causal,
            amplitude=amplitude, autotune=autotune)
    elif impl == "cudnn":
        dq, dk, dv, ddelta = pope_cudnn.pope_cudnn_bwd(do, q, k, v, delta, out, lse, pos_q, pos_k, inv_freq,
                                                       scale=scale, causal=causal, amplitude=amplitude)
    else:
        dq, dk, dv, ddelta = triton_pope.pope_bwd(do, q, k, v, out, lse, pos_q, pos_k, inv_freq, delta,
                                                  scale=scale, causal=causal, amplitude=amplitude, exp2=exp2,
                                                  autotune=autotune)
    ddelta = _no_aux(q, torch.float32) if ddelta is None else ddelta
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

# ----------------------------------------------------------------------------- TAPA


@torch.library.custom_op("phaselab::tapa_fwd", mutates_args=())
def tapa_fwd(q: Tensor, k: Tensor, v: Tensor, pos_q: Tensor, pos_k: Tensor, d_amp: int, alpha: float,
             phase_scale: float, linear: bool, scale: float, causal: bool,
             deterministic: bool, exp2: str, series: bool, autotune: bool) -> tuple[Tensor, Tensor]:
    q, k, v = _last_dim_dense(q, k, v)
    return triton_tapa.tapa_fwd(q, k, v, pos_q, pos_k, d_amp=d_amp, alpha=alpha, phase_scale=phase_scale,
                                linear=linear, scale=scale, causal=causal, series=series, exp2=exp2,
                                autotune=autotune)


@tapa_fwd.register_fake
def _tapa_fwd_fake(q, k, v, pos_q, pos_k, d_amp, alpha, phase_scale, linear, scale, causal, deterministic, exp2,
                   series, autotune):
    B, H, T, _ = q.shape
    return q.new_empty((B, H, T, v.shape[-1])), q.new_empty((B, H, T), dtype=torch.float32)


@torch.library.custom_op("phaselab::tapa_bwd", mutates_args=())
def tapa_bwd(do: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, pos_q: Tensor, pos_k: Tensor,
             d_amp: int, alpha: float, phase_scale: float, linear: bool, scale: float, causal: bool,
             deterministic: bool, exp2: str, series: bool, autotune: bool) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv); `series` is the forward's only (the backward never takes it)."""
    do, q, k, v, out = _last_dim_dense(do, q, k, v, out)
    dq, dk, dv = triton_tapa.tapa_bwd(do, q, k, v, out, lse, pos_q, pos_k, d_amp=d_amp, alpha=alpha,
                                      phase_scale=phase_scale, linear=linear, scale=scale, causal=causal,
                                      deterministic=deterministic, exp2=exp2, autotune=autotune)
    return dq.contiguous(), dk.contiguous(), dv.contiguous()


@tapa_bwd.register_fake
def _tapa_bwd_fake(do, q, k, v, out, lse, pos_q, pos_k, *cfg):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)  # contiguous, as returned


def _tapa_setup(ctx, inputs, output):
    q, k, v, pos_q, pos_k, *cfg = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1], pos_q, pos_k)
    ctx.cfg = cfg


def _tapa_backward(ctx, do, _dlse):
    q, k, v, out, lse, pos_q, pos_k = ctx.saved_tensors
    dq, dk, dv = tapa_bwd(do, q, k, v, out, lse, pos_q, pos_k, *ctx.cfg)
    return dq, dk, dv, *([None] * 12)


tapa_fwd.register_autograd(_tapa_backward, setup_context=_tapa_setup)

# ----------------------------------------------------------------------------- vmap: members as heads


def _last_dim_dense(*xs: Tensor) -> tuple[Tensor, ...]:
    """The kernels index the last dim with stride 1; a compiled caller may hand over any layout."""
    return tuple(x if x.stride(-1) == 1 else x.contiguous() for x in xs)


def _no_aux(q: Tensor, dtype: torch.dtype = torch.int32) -> Tensor:
    return q.new_empty((0,), dtype=dtype)


def _members_first(x: Tensor, bdim: int | None, K: int) -> Tensor:
    return x.movedim(bdim, 0) if bdim is not None else x.unsqueeze(0).expand(K, *x.shape)


def _fold(x: Tensor, bdim: int | None, K: int) -> Tensor:
    """[K, B, H, L, D] (member dim at bdim, or none) -> [B, K*H, L, D], member-major heads."""
    x_KBHLD = _members_first(x, bdim, K)
    _, B, H, L, D = x_KBHLD.shape
    return x_KBHLD.transpose(0, 1).reshape(B, K * H, L, D)


def _unfold(y: Tensor, K: int) -> Tensor:
    """[B, K*H, ...] -> [K, B, H, ...]."""
    B, KH = y.shape[:2]
    return y.reshape(B, K, KH // K, *y.shape[2:]).transpose(0, 1)


def _per_member(op, info, in_dims, args):
    """The general rule: one call per member (positions or frequencies that differ by member)."""
    outs = []
    for i in range(info.batch_size):
        outs.append(op(*(a.select(d, i) if d is not None else a for a, d in zip(args, in_dims))))
    return tuple(torch.stack(o) for o in zip(*outs)), (0,) * len(outs[0])


@torch.library.register_vmap("phaselab::pope_fwd")
def _pope_fwd_vmap(info, in_dims, q, k, v, delta, pos_q, pos_k, inv_freq, *cfg):
    K, (dq, dk, dv, dd, dpq, dpk, dfreq) = info.batch_size, in_dims[:7]
    if dpq is not None or dpk is not None or dfreq is not None:
        return _per_member(pope_fwd, info, in_dims, (q, k, v, delta, pos_q, pos_k, inv_freq, *cfg))
    if delta is not None:
        delta_KHD = _members_first(delta, dd, K)
        delta = delta_KHD.reshape(-1, delta_KHD.shape[-1])
    out, lse, aux = pope_fwd(_fold(q, dq, K), _fold(k, dk, K), _fold(v, dv, K), delta, pos_q, pos_k, inv_freq, *cfg)
    return (_unfold(out, K), _unfold(lse, K), aux), (0, 0, None)


@torch.library.register_vmap("phaselab::tapa_fwd")
def _tapa_fwd_vmap(info, in_dims, q, k, v, pos_q, pos_k, *cfg):
    K, (dq, dk, dv, dpq, dpk) = info.batch_size, in_dims[:5]
    if dpq is not None or dpk is not None:
        return _per_member(tapa_fwd, info, in_dims, (q, k, v, pos_q, pos_k, *cfg))
    out, lse = tapa_fwd(_fold(q, dq, K), _fold(k, dk, K), _fold(v, dv, K), pos_q, pos_k, *cfg)
    return (_unfold(out, K), _unfold(lse, K)), (0, 0)
