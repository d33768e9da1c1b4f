"""PoPE attention's validated public wrapper (MATH §3): checks, picks the implementation, records
what ran, and calls the `phaselab::pope_fwd` custom op (ops.py), differentiable in q, k, v and delta.

Three implementations, chosen by `impl=` or `AttentionOptions.pope_impl` (default "auto"): "fused"
(pope/triton_pope.py: q/k expanded in registers inside one flash kernel), "expand" (triton_expand.py:
2D-wide q_hat/k_hat in device memory, the flash core of kernels/flash, the chain rule in its
backward's epilogues) and "cudnn" (cudnn.py: the same prologue and chain rule around cuDNN's core).
The registry's `triton` backend (kernels/attention/function.py) calls `pope_attention`.

Example:
    >>> out = pope_attention(q, k, v, pos_q_BT=pos, pos_k_BS=pos, inv_freq_D=pope_inv_freq(64).cuda())
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from phaselab.kernels.common.checks import check_device, check_pos, check_qkv, check_scale
from phaselab.kernels.common.options import DEFAULT_OPTIONS, AttentionOptions, record_options
from phaselab.kernels.common.score_mod import POPE_AMPLITUDES
from phaselab.kernels.pope import cudnn, ops
from phaselab.kernels.registry import record_impl

# PoPE implementations: "fused" expands q/k in registers inside one flash kernel (pope/triton_pope.py);
# "expand" writes the 2D-wide q_hat/k_hat and runs our flash core on them, whose backward applies
# the chain rule in its epilogues (triton_expand.py); "cudnn" runs the same prologue and chain
# rule around cuDNN's attention core (cudnn.py: Hopper, bf16/fp16, D <= 64, no GQA, a mask
# cuDNN can express, not deterministic). "auto" (the default) takes "cudnn" where it runs and
# "expand" elsewhere (kernels/attention/README.md has the measurements). `impl=` or
# `options.pope_impl` chooses; an explicit "cudnn" that cannot run raises.
POPE_IMPLS = ("fused", "expand", "cudnn")



def pope_attention(q_BHTD: Tensor, k_BGSD: Tensor, v_BGSD: Tensor, *, pos_q_BT: Tensor, pos_k_BS: Tensor,
                   inv_freq_D: Tensor, delta_HD: Tensor | None = None, scale: float | None = None,
                   causal: bool = True, amplitude: str = "softplus", impl: str | None = None,
                   trivial_pos: bool = False, deterministic: bool = True,
                   options: AttentionOptions = DEFAULT_OPTIONS) -> Tensor:
    """PoPE attention (MATH §3), differentiable in q, k, v and delta.

    Args:
        q_BHTD: raw queries [B, H, T, D] (pre-softplus), fp16 / bf16 / fp32, D <= 128.
        k_BGSD, v_BGSD: raw keys and values [B, G, S, D], G divides H, q's dtype.
        pos_q_BT, pos_k_BS: int64 absolute positions [B or 1, T] / [B or 1, S], q's device.
        inv_freq_D: fp32 [D], theta_c = base**(-c/D) (`score_mod.pope_inv_freq`).
        delta_HD: fp32 [H, D] phase bias on the key side, or None (the "without delta" ablation).
        scale: softmax scale, default 1/sqrt(D) (MATH §3.4).
        causal: mask by positions (default True). amplitude: "softplus" (default), "relu", "identity".
        impl: "fused", "expand", "cudnn" (`POPE_IMPLS`) or "auto"; None takes `options.pope_impl`
            ("auto" by default: "cudnn" where `cudnn.unsupported_reason` allows it, else
            "expand"). "fused" and "expand" are deterministic.
        trivial_pos: the caller guarantees pos_q == pos_k == 0..T-1 (T == S), so a causal call can
            use cuDNN's index-causal mask (the positions are not read to check it: no device sync).
        deterministic: refuse the non-deterministic "cudnn" core (default True; the model passes
            its `attention.deterministic`).
        options: `AttentionOptions` (pope_impl, exp2, autotune; the model's `attention` section).
    Returns:
        out_BHTD [B, H, T, D] in q's dtype; a row that sees no key is 0.
    """
    if not isinstance(options, AttentionOptions):
        raise TypeError(f"options must be an AttentionOptions, got {type(options).__name__}")
    requested = options.pope_impl if impl is None else impl
    if requested not in (*POPE_IMPLS, "auto"):
        raise ValueError(f"pope impl={requested!r}: expected auto or one of {POPE_IMPLS}")
    q, k, v = check_qkv(q_BHTD, k_BGSD, v_BGSD)
    B, H, T, D = q.shape
    pos_q = check_pos("pos_q_BT", pos_q_BT, B, T, q.device)
    pos_k = check_pos("pos_k_BS", pos_k_BS, B, k.shape[2], q.device)
    if trivial_pos and T != k.shape[2]:
        raise ValueError(f"trivial_pos=True needs T == S, got T={T}, S={k.shape[2]}")
    if not isinstance(inv_freq_D, Tensor) or inv_freq_D.shape != (D,) or inv_freq_D.dtype != torch.float32:
        raise ValueError(f"inv_freq_D must be an fp32 tensor of shape ({D},), got "
                         f"{getattr(inv_freq_D, 'dtype', type(inv_freq_D).__name__)} "
                         f"{tuple(getattr(inv_freq_D, 'shape', ()))}")
    check_device("inv_freq_D", inv_freq_D, q.device)
    if delta_HD is not None:
        if not isinstance(delta_HD, Tensor) or delta_HD.shape != (H, D) or delta_HD.dtype != torch.float32:
            raise ValueError(f"delta_HD must be None or an fp32 tensor of shape ({H}, {D}), got "
                             f"{getattr(delta_HD, 'dtype', type(delta_HD).__name__)} "
                             f"{tuple(getattr(delta_HD, 'shape', ()))}")
        check_device("delta_HD", delta_HD, q.device)
        delta_HD = delta_HD.contiguous()
    if amplitude not in POPE_AMPLITUDES:
        raise ValueError(f"amplitude={amplitude!r}: expected one of {POPE_AMPLITUDES}")
    scale = 1.0 / math.sqrt(D) if scale is None else check_scale(scale)
    impl = _pope_impl(requested, q, k, causal=causal, trivial_pos=trivial_pos, deterministic=deterministic)
    record_impl("pope", impl, deterministic=impl != "cudnn")
    # the options that apply to the implementation taken (cuDNN's core is neither autotuned nor
    # has our exp2 tiles; the expand path's flash core has no exp2 choice)
    applied = {"fused": {"exp2": options.exp2, "autotune": options.autotune},
               "expand": {"autotune": options.autotune}, "cudnn": {}}[impl]
    record_options("pope", pope_impl=requested, **applied)
    out, _lse, _aux = ops.pope_fwd(q, k, v, delta_HD, pos_q, pos_k, inv_freq_D.contiguous(), scale, bool(causal),
                                   amplitude, impl, options.exp2, options.autotune)
    return out


def _pope_impl(requested: str, q: Tensor, k: Tensor, *, causal: bool, trivial_pos: bool,
               deterministic: bool) -> str:
    """The implementation a PoPE call runs: `requested`, or for "auto" "cudnn" where it runs,
    else "expand"; an explicit "cudnn" that cannot run this call raises."""
    if requested not in ("auto", "cudnn"):
        return requested
    reason = cudnn.unsupported_reason(q, k, causal=causal, trivial_pos=trivial_pos,
                                      deterministic=deterministic)
    if requested == "cudnn" and reason is not None:
        raise ValueError(f"pope impl='cudnn' cannot run this call: {reason}")
    return "cudnn" if reason is None else "expand"
