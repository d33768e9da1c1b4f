"""Autograd function and validated wrapper of the flash attention core (flash/triton_flash.py): q/k
width DK, v width DV, causal by positions or by index, GQA; verified by
tests/kernels/flash/test_triton_flash.py."""

from __future__ import annotations

import math

import torch

from phaselab.kernels.common.options import DEFAULT_OPTIONS, AttentionOptions, record_options
from phaselab.kernels.flash import gluon_common, gluon_hopper_bwd
from phaselab.kernels.flash.gluon_hopper import GluonFlashFunction
from phaselab.kernels.flash.triton_flash import flash_bwd, flash_fwd, pos_flags

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_QK_DIM = 256  # PoPE's 2D-wide q_hat at D = 128
MAX_V_DIM = 128


class FlashAttentionFunction(torch.autograd.Function):
    """out = softmax(scale q k^T, causal by positions) v; gradients for q, k, v."""

    @staticmethod
    def forward(ctx, q, k, v, pos_q, pos_k, scale, causal, autotune):
        flags = None if pos_q is None else pos_flags(pos_q, pos_k)
        ctx.cfg = {"scale": scale, "causal": causal, "autotune": autotune}
        out, lse = flash_fwd(q, k, v, pos_q, pos_k, flags, **ctx.cfg)
        ctx.save_for_backward(q, k, v, out, lse, pos_q, pos_k, flags)
        return out

    @staticmethod
    def backward(ctx, do):
        q, k, v, out, lse, pos_q, pos_k, flags = ctx.saved_tensors
        dq, dk, dv = flash_bwd(do, q, k, v, out, lse, pos_q, pos_k, flags, **ctx.cfg)
        return dq, dk, dv, None, None, None, None, None


def _check(q, k, v, pos_q, pos_k):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.ndim != 4 or t.dtype not in _DTYPES or t.device != q.device:
            raise ValueError(f"{name} must be a 4-D {_DTYPES} tensor on q's device, got "
                             f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}")
    B, H, T, DK = q.shape
    G, S, DV = k.shape[1], k.shape[2], v.shape[3]
    if k.shape != (B, G, S, DK) or v.shape[:3] != (B, G, S) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} must be [B,H,T,DK], "
                         f"[B,G,S,DK], [B,G,S,DV] of one dtype")
    if G == 0 or H % G or T == 0 or S == 0 or not 1 <= DK <= MAX_QK_DIM or not 1 <= DV <= MAX_V_DIM:
        raise ValueError(f"need G | H, T, S > 0, DK <= {MAX_QK_DIM}, DV <= {MAX_V_DIM}: q {tuple(q.shape)}, "
                         f"v {tuple(v.shape)}")
    if (pos_q is None) != (pos_k is None):
        raise ValueError("pass both positions or neither (index positions)")
    if pos_q is not None:
        for name, p, n in (("pos_q_BT", pos_q, T), ("pos_k_BS", pos_k, S)):
            if p.dtype not in (torch.int64, torch.int32) or p.ndim != 2 or p.shape[0] not in (1, B) or p.shape[1] != n:
                raise ValueError(f"{name} must be int64 [{B} or 1, {n}], got {p.dtype} {tuple(p.shape)}")
        pos_q, pos_k = pos_q.to(torch.int64).contiguous(), pos_k.to(torch.int64).contiguous()
    return [t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v)], pos_q, pos_k


@torch.compiler.disable  # user-defined Triton kernels run outside the compiled graph (kernels/common/ops.py)
def flash_attention(q_BHTD: torch.Tensor, k_BGSD: torch.Tensor, v_BGSD: torch.Tensor, *,
                    pos_q_BT: torch.Tensor | None = None, pos_k_BS: torch.Tensor | None = None,
                    scale: float | None = None, causal: bool = True,
                    options: AttentionOptions = DEFAULT_OPTIONS) -> torch.Tensor:
    """Flash attention, differentiable in q, k, v; q/k width DK may differ from v's DV.

    Args:
        q_BHTD [B, H, T, DK], k_BGSD [B, G, S, DK], v_BGSD [B, G, S, DV]: fp16 / bf16 / fp32, G | H.
        pos_q_BT, pos_k_BS: int64 positions [B or 1, T] / [B or 1, S], or None for index positions
            (the queries are the last T of the S keys). scale: default 1/sqrt(DK).
        causal: key s visible to query t iff pos_k[s] <= pos_q[t] (default True).
        options: `AttentionOptions`; the flash core reads `autotune` and `flash_impl` (the Gluon
            forward on sm_90 for plain bf16/fp16 attention at D 64/128 by index, with the backward
            `gluon_hopper_bwd.BACKWARD_BY_D` names, else the `tl` forward and backward).
    Returns out [B, H, T, DV] in q's dtype; a row that sees no key is 0.
    """
    (q, k, v), pos_q, pos_k = _check(q_BHTD, k_BGSD, v_BGSD, pos_q_BT, pos_k_BS)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    impl = forward_impl(q, k, v, pos_q, pos_k, options)
    backward = gluon_hopper_bwd.BACKWARD_BY_D.get(q.shape[-1], "tl") if impl == "gluon" else "tl"
    record_options("flash", autotune=options.autotune, forward=impl, backward=backward)
    if impl == "gluon":
        return GluonFlashFunction.apply(q, k, v, scale, bool(causal), options.autotune)
    return FlashAttentionFunction.apply(q, k, v, pos_q, pos_k, scale, bool(causal), options.autotune)


def forward_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos_q: torch.Tensor | None,
                 pos_k: torch.Tensor | None, options: AttentionOptions) -> str:
    """"gluon" or "tl": which forward `flash_attention` runs (`AttentionOptions.flash_impl`);
    ValueError when "gluon" is asked for where it cannot run, with the reason."""
    if options.flash_impl == "tl":
        return "tl"
    reason = gluon_common.supported(q, k, v, pos_q, pos_k, what="the Gluon forward")
    if reason is None:
        return "gluon"
    if options.flash_impl == "gluon":
        raise ValueError(f"flash_impl='gluon': {reason}")
    return "tl"
