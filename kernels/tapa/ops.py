"""The Triton TAPA kernels (tapa/triton_tapa.py) as torch.library custom ops `phaselab::tapa_fwd/bwd`,
with autograd, fake (shape-only) implementations and a vmap rule (why custom ops:
kernels/common/ops.py). The forward op returns (out, lse) and the backward op takes them back;
inputs are the validated ones of `function.tapa_attention` (int64 positions); every output is
contiguous, as the fake implementations say. `core` names the kernels (`function.CORES`): "tl"
(triton_tapa.py, reading the positions given) or "gluon" (the Hopper kernels gluon_tapa.py and
gluon_tapa_bwd.py, index positions: the caller's `trivial_pos`). `tapa_fwd_call` is the forward's
entry: the op where the dispatcher has work (torch.compile, functorch transforms, modes), else
its body directly, inside `TapaEager` (the op's own autograd functions) where autograd records
the call; the backward takes the same turn (`_tapa_backward`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from phaselab.kernels.common.ops import (
    dispatch_adds_nothing,
    fold,
    last_dim_dense,
    needs_grad,
    per_member,
    plain_eager,
    unfold,
)
from phaselab.kernels.tapa import gluon_tapa, gluon_tapa_bwd, triton_tapa


def tapa_fwd_call(q: Tensor, k: Tensor, v: Tensor, pos_q: Tensor, pos_k: Tensor, *cfg) -> tuple[Tensor, Tensor]:
    """`tapa_fwd` where the dispatcher has work (`common.ops.plain_eager` false); else its body
    directly, inside `TapaEager` where autograd records the call. The dispatcher's hops there
    cost only host time before the kernel starts: on H100 machines a 4k Gluon forward took 470
    against 234 us without grad, and with grad 512-1187 us through the op against 289-502 in
    `TapaEager` (benchmarks/results/gluon-tapa-fwd-h100-4k.md sections 6, 7)."""
    tensors = (q, k, v, pos_q, pos_k)
    if not plain_eager(*tensors):
        return tapa_fwd(q, k, v, pos_q, pos_k, *cfg)
    if needs_grad(*tensors):
        return TapaEager.apply(q, k, v, pos_q, pos_k, *cfg)
    return tapa_fwd_body(q, k, v, pos_q, pos_k, *cfg)


def tapa_fwd_body(q: Tensor, k: Tensor, v: Tensor, pos_q: Tensor, pos_k: Tensor, d_amp: int, alpha: float,
                  phase_scale: float, linear: bool, scale: float, causal: bool, deterministic: bool, exp2: str,
                  series: bool, autotune: bool, core: str) -> tuple[Tensor, Tensor]:
    """What `tapa_fwd` runs: (out, lse), both contiguous."""
    q, k, v = last_dim_dense(q, k, v)
    if core == "gluon":  # D_A = D / 2 (gluon_tapa_host.supported), so theta is 0.5
        return gluon_tapa.gluon_tapa_fwd(q, k, v, alpha=alpha, phase_scale=phase_scale, scale=scale, causal=causal,
                                         phase="linear" if linear else "quadratic")
    return triton_tapa.tapa_fwd(q, k, v, pos_q, pos_k, d_amp=d_amp, alpha=alpha, phase_scale=phase_scale,
                                linear=linear, scale=scale, causal=causal, series=series, exp2=exp2,
                                autotune=autotune)


@torch.library.custom_op("phaselab::tapa_fwd", mutates_args=())
def tapa_fwd(q: Tensor, k: Tensor, v: Tensor, pos_q: Tensor, pos_k: Tensor, d_amp: int, alpha: float,
             phase_scale: float, linear: bool, scale: float, causal: bool,
             deterministic: bool, exp2: str, series: bool, autotune: bool, core: str) -> tuple[Tensor, Tensor]:
    return tapa_fwd_body(q, k, v, pos_q, pos_k, d_amp, alpha, phase_scale, linear, scale, causal, deterministic,
                         exp2, series, autotune, core)


@tapa_fwd.register_fake
def _tapa_fwd_fake(q, k, v, pos_q, pos_k, d_amp, alpha, phase_scale, linear, scale, causal, deterministic, exp2,
                   series, autotune, core):
    B, H, T, _ = q.shape
    return q.new_empty((B, H, T, v.shape[-1])), q.new_empty((B, H, T), dtype=torch.float32)


def tapa_bwd_body(do: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, pos_q: Tensor,
                  pos_k: Tensor, d_amp: int, alpha: float, phase_scale: float, linear: bool, scale: float,
                  causal: bool, deterministic: bool, exp2: str, series: bool, autotune: bool,
                  core: str) -> tuple[Tensor, Tensor, Tensor]:
    """What `tapa_bwd` runs: (dq, dk, dv), contiguous; `series` is the forward's only."""
    do, q, k, v, out = last_dim_dense(do, q, k, v, out)
    if core == "gluon":  # deterministic either way: no atomics
        return gluon_tapa_bwd.gluon_tapa_bwd(do, q, k, v, out, lse, alpha=alpha, phase_scale=phase_scale,
                                             linear=linear, scale=scale, causal=causal)
    dq, dk, dv = triton_tapa.tapa_bwd(do, q, k, v, out, lse, pos_q, pos_k, d_amp=d_amp, alpha=alpha,
                                      phase_scale=phase_scale, linear=linear, scale=scale, causal=causal,
                                      deterministic=deterministic, exp2=exp2, autotune=autotune)
    return dq.contiguous(), dk.contiguous(), dv.contiguous()


@torch.library.custom_op("phaselab::tapa_bwd", mutates_args=())
def tapa_bwd(do: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, pos_q: Tensor, pos_k: Tensor,
             d_amp: int, alpha: float, phase_scale: float, linear: bool, scale: float, causal: bool,
             deterministic: bool, exp2: str, series: bool, autotune: bool, core: str) -> tuple[Tensor, Tensor, Tensor]:
    return tapa_bwd_body(do, q, k, v, out, lse, pos_q, pos_k, d_amp, alpha, phase_scale, linear, scale, causal,
                         deterministic, exp2, series, autotune, core)


@tapa_bwd.register_fake
def _tapa_bwd_fake(do, q, k, v, out, lse, pos_q, pos_k, *cfg):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)  # contiguous, as returned


def _tapa_setup(ctx, inputs, output):
    q, k, v, pos_q, pos_k, *cfg = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1], pos_q, pos_k)
    ctx.cfg = cfg


def _tapa_backward(ctx, do, _dlse):
    """The op's (and `TapaEager`'s) backward: `tapa_bwd`, or its body where the dispatcher adds
    nothing (an eager backward)."""
    q, k, v, out, lse, pos_q, pos_k = ctx.saved_tensors
    direct = dispatch_adds_nothing(do, q, k, v, out, lse, pos_q, pos_k)
    dq, dk, dv = (tapa_bwd_body if direct else tapa_bwd)(do, q, k, v, out, lse, pos_q, pos_k, *ctx.cfg)
    return dq, dk, dv, *([None] * 13)


tapa_fwd.register_autograd(_tapa_backward, setup_context=_tapa_setup)


class TapaEager(torch.autograd.Function):
    """`tapa_fwd`'s body under its own autograd functions (`_tapa_setup`, `_tapa_backward`): what the
    op does for a plain eager call that autograd records, without its dispatch (`tapa_fwd_call`)."""

    @staticmethod
    def forward(q, k, v, pos_q, pos_k, *cfg):
        return tapa_fwd_body(q, k, v, pos_q, pos_k, *cfg)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _tapa_setup(ctx, inputs, output)

    @staticmethod
    def backward(ctx, do, dlse):
        return _tapa_backward(ctx, do, dlse)


@torch.library.register_vmap("phaselab::tapa_fwd")
def _tapa_fwd_vmap(info, in_dims, q, k, v, pos_q, pos_k, *cfg):
    K, (dq, dk, dv, dpq, dpk) = info.batch_size, in_dims[:5]
    if dpq is not None or dpk is not None:
        return per_member(tapa_fwd, info, in_dims, (q, k, v, pos_q, pos_k, *cfg))
    out, lse = tapa_fwd(fold(q, dq, K), fold(k, dk, K), fold(v, dv, K), pos_q, pos_k, *cfg)
    return (unfold(out, K), unfold(lse, K)), (0, 0)
