"""The bias-table kernels (triton_relbias.py) as torch.library custom ops with autograd:
`phaselab::relbias_fwd` -> (out, lse, flags) and `phaselab::relbias_bwd` -> (dq, dk, dv, dtable).

Custom ops for the reasons of kernels/common/ops.py: a compiled model keeps one graph through
its attention calls, and dynamo never traces the host-side launch code. The table is an ordinary
input: its gradient (fp32 [H, Nd], computed only when the table requires grad) flows back through
the encoding's plain-PyTorch table code to its parameters.
"""

from __future__ import annotations

import torch
from torch import Tensor

from phaselab.kernels.flash.triton_flash import pos_flags
from phaselab.kernels.relbias import triton_relbias


def _dense(*xs: Tensor) -> tuple[Tensor, ...]:
    return tuple(x if x.stride(-1) == 1 else x.contiguous() for x in xs)


@torch.library.custom_op("phaselab::relbias_fwd", mutates_args=())
def relbias_fwd(q: Tensor, k: Tensor, v: Tensor, table: Tensor, pos_q: Tensor, pos_k: Tensor, d_min: int,
                scale: float, causal: bool, index_pos: bool, autotune: bool) -> tuple[Tensor, Tensor, Tensor]:
    """index_pos: positions are the indices (the caller's trivial positions); pos_q/pos_k unread."""
    q, k, v = _dense(q, k, v)
    if index_pos:
        out, lse = triton_relbias.relbias_fwd(q, k, v, table, None, None, None, d_min, scale=scale, causal=causal,
                                               autotune=autotune)
        return out, lse, q.new_empty((0,), dtype=torch.int32)
    flags = pos_flags(pos_q, pos_k)
    out, lse = triton_relbias.relbias_fwd(q, k, v, table, pos_q, pos_k, flags, d_min, scale=scale, causal=causal,
                                           autotune=autotune)
    return out, lse, flags


@relbias_fwd.register_fake
def _relbias_fwd_fake(q, k, v, table, pos_q, pos_k, d_min, scale, causal, index_pos, autotune):
    B, H, T, _ = q.shape
    n_flags = 0 if index_pos else max(pos_q.shape[0], pos_k.shape[0])
    return (q.new_empty((B, H, T, v.shape[-1])), q.new_empty((B, H, T), dtype=torch.float32),
            q.new_empty((n_flags,), dtype=torch.int32))


@torch.library.custom_op("phaselab::relbias_bwd", mutates_args=())
def relbias_bwd(do: Tensor, q: Tensor, k: Tensor, v: Tensor, table: Tensor, out: Tensor, lse: Tensor, flags: Tensor,
                pos_q: Tensor, pos_k: Tensor, d_min: int, scale: float, causal: bool, index_pos: bool,
                autotune: bool, need_dbias: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, dtable fp32 [H, Nd]; an empty dtable unless need_dbias)."""
    do, q, k, v, out = _dense(do, q, k, v, out)
    pq, pk, fl = (None, None, None) if index_pos else (pos_q, pos_k, flags)
    dq, dk, dv, dtable = triton_relbias.relbias_bwd(do, q, k, v, out, lse, table, pq, pk, fl, d_min, scale=scale,
                                                    causal=causal, need_dbias=need_dbias, autotune=autotune)
    dtable = q.new_empty((0,), dtype=torch.float32) if dtable is None else dtable
    return dq.contiguous(), dk.contiguous(), dv.contiguous(), dtable


@relbias_bwd.register_fake
def _relbias_bwd_fake(do, q, k, v, table, out, lse, flags, pos_q, pos_k, d_min, scale, causal, index_pos, autotune,
                      need_dbias):
    dtable = table.new_empty(table.shape, dtype=torch.float32) if need_dbias else q.new_empty((0,), dtype=torch.float32)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dtable


def _setup(ctx, inputs, output):
    q, k, v, table, pos_q, pos_k, *cfg = inputs
    out, lse, flags = output
    ctx.save_for_backward(q, k, v, table, out, lse, flags, pos_q, pos_k)
    ctx.cfg = cfg
    ctx.need_dbias = table.requires_grad


def _backward(ctx, do, _dlse, _dflags):
    q, k, v, table, out, lse, flags, pos_q, pos_k = ctx.saved_tensors
    need_dbias = bool(ctx.need_dbias and ctx.needs_input_grad[3])
    dq, dk, dv, dtable = relbias_bwd(do, q, k, v, table, out, lse, flags, pos_q, pos_k, *ctx.cfg, need_dbias)
    return dq, dk, dv, (dtable.to(table.dtype) if need_dbias else None), *([None] * 7)


relbias_fwd.register_autograd(_backward, setup_context=_setup)
