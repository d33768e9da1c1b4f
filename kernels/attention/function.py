"""Validated public wrappers and the registry's `triton` backend for the fused PoPE and TAPA
kernels (triton_pope.py, triton_tapa.py; as custom ops with autograd and vmap rules in ops.py, so
torch.compile keeps one graph through them). PoPE has two more implementations,
`impl="expand"` (triton_pope_expand.py: 2D-wide q_hat/k_hat in device memory, the flash core of
triton_flash.py, the chain rule in its backward's epilogues) and `impl="cudnn"` (pope_cudnn.py:
the same prologue and chain rule around cuDNN's attention core), chosen by `impl=` or by
`AttentionOptions.pope_impl` (options.py; default "auto"). The options also say how the score
tiles' exponentials run (`exp2`), whether TAPA's forward takes its series (`tapa_series`) and
whether the kernels autotune (`autotune`); each call records the values it ran with
(`options.record_options`, read by the run's provenance).

Both kernels take BHTD inputs (last dim contiguous) with RAW D-wide q and k (MATH §3.1, §4.2),
integer positions, and mask causally by positions (key s visible iff pos_k[s] <= pos_q[t];
bottom-right when T < S, MATH §7.6). By default their backward uses no atomics, so it is
deterministic (MATH §7.8); for TAPA, `deterministic=False` opts into one backward kernel that adds
dQ with fp32 atomics. Positions stay int64 inside the kernels until a relative position is
formed (MATH §7.2): PoPE's angles use pos - pos_k[b, 0] (the logit depends on m - n only), TAPA's
|m - n| is subtracted in integers, so absolute positions beyond 2**24 lose nothing (|pos| < 2**62,
where every difference fits int64, as in the reference). Loop bounds
skip fully masked blocks when positions are non-decreasing (checked on the device, no sync);
other position orders stay exact but visit every block.

Example:
    >>> inv_freq = pope_inv_freq(64)
    >>> out = pope_attention(q, k, v, pos_q_BT=pos, pos_k_BS=pos, inv_freq_D=inv_freq.cuda())
    >>> out = tapa_attention(q, k, v, pos_q_BT=pos, pos_k_BS=pos, alpha=0.1, theta=0.5)
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import Tensor

from phaselab.kernels import relbias
from phaselab.kernels.attention import ops, pope_cudnn, triton_common
from phaselab.kernels.attention.options import DEFAULT_OPTIONS, AttentionOptions, record_options
from phaselab.kernels.attention.score_mod import POPE_AMPLITUDES, TAPA_PHASES, ScoreMod, tapa_split
from phaselab.kernels.registry import record_impl

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 128
# PoPE implementations: "fused" expands q/k in registers inside one flash kernel (triton_pope.py);
# "expand" writes the 2D-wide q_hat/k_hat and runs our flash core on them, whose backward applies
# the chain rule in its epilogues (triton_pope_expand.py); "cudnn" runs the same prologue and chain
# rule around cuDNN's attention core (pope_cudnn.py: Hopper, bf16/fp16, D <= 64, no GQA, a mask
# cuDNN can express, not deterministic). "auto" (the default) takes "cudnn" where it runs and
# "expand" elsewhere (kernels/attention/README.md has the measurements). `impl=` or
# `options.pope_impl` chooses; an explicit "cudnn" that cannot run raises.
POPE_IMPLS = ("fused", "expand", "cudnn")


# ----------------------------------------------------------------------------- validation


def _check_device(name: str, t: Tensor, device: torch.device) -> None:
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, q is on {device}")


def _check_qkv(q_BHTD: Tensor, k_BGSD: Tensor, v_BGSD: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    for name, t in (("q_BHTD", q_BHTD), ("k_BGSD", k_BGSD), ("v_BGSD", v_BGSD)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.ndim != 4:
            raise ValueError(f"{name} must be 4-D (BHTD layout), got shape {tuple(t.shape)}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; the Triton kernels take {_DTYPES}")
        _check_device(name, t, q_BHTD.device)
    B, H, T, D = q_BHTD.shape
    if k_BGSD.shape[0] != B or k_BGSD.shape[3] != D or v_BGSD.shape != k_BGSD.shape:
        raise ValueError(f"k {tuple(k_BGSD.shape)} and v {tuple(v_BGSD.shape)} must be [B={B}, G, S, D={D}] "
                         f"(raw D-wide q/k/v; q is {tuple(q_BHTD.shape)})")
    if k_BGSD.dtype != q_BHTD.dtype or v_BGSD.dtype != q_BHTD.dtype:
        raise TypeError(f"q, k, v dtypes differ: {q_BHTD.dtype}, {k_BGSD.dtype}, {v_BGSD.dtype}")
    G = k_BGSD.shape[1]
    if G == 0 or H % G:
        raise ValueError(f"query heads H={H} must be divisible by kv heads G={G}")
    if not 1 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"head dim D={D} must be in [1, {MAX_HEAD_DIM}] (register-resident heads)")
    if T == 0 or k_BGSD.shape[2] == 0:
        raise ValueError(f"empty sequence: T={T}, S={k_BGSD.shape[2]}")
    # the kernels need a contiguous last dim: the ops (ops.py) make it so, where they also see
    # the layouts a compiled caller picks; any other strides are passed through
    return q_BHTD, k_BGSD, v_BGSD


def _check_pos(name: str, pos: Tensor, batch: int, length: int, device: torch.device) -> Tensor:
    if not isinstance(pos, Tensor):
        raise TypeError(f"{name} must be an integer torch.Tensor, got {type(pos).__name__}")
    if pos.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name} must be int64 (or int32), got {pos.dtype} (MATH §7.2: never float)")
    if pos.ndim != 2 or pos.shape[0] not in (1, batch) or pos.shape[1] != length:
        raise ValueError(f"{name} has shape {tuple(pos.shape)}, expected ({batch} or 1, {length})")
    _check_device(name, pos, device)
    return pos.to(torch.int64).contiguous()


def _check_scale(scale: float) -> float:
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"scale={scale!r} must be a finite number")
    return float(scale)


# ----------------------------------------------------------------------------- public wrappers


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
            ("auto" by default: "cudnn" where `pope_cudnn.unsupported_reason` allows it, else
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
    q, k, v = _check_qkv(q_BHTD, k_BGSD, v_BGSD)
    B, H, T, D = q.shape
    pos_q = _check_pos("pos_q_BT", pos_q_BT, B, T, q.device)
    pos_k = _check_pos("pos_k_BS", pos_k_BS, B, k.shape[2], q.device)
    if trivial_pos and T != k.shape[2]:
        raise ValueError(f"trivial_pos=True needs T == S, got T={T}, S={k.shape[2]}")
    if not isinstance(inv_freq_D, Tensor) or inv_freq_D.shape != (D,) or inv_freq_D.dtype != torch.float32:
        raise ValueError(f"inv_freq_D must be an fp32 tensor of shape ({D},), got "
                         f"{getattr(inv_freq_D, 'dtype', type(inv_freq_D).__name__)} "
                         f"{tuple(getattr(inv_freq_D, 'shape', ()))}")
    _check_device("inv_freq_D", inv_freq_D, q.device)
    if delta_HD is not None:
        if not isinstance(delta_HD, Tensor) or delta_HD.shape != (H, D) or delta_HD.dtype != torch.float32:
            raise ValueError(f"delta_HD must be None or an fp32 tensor of shape ({H}, {D}), got "
                             f"{getattr(delta_HD, 'dtype', type(delta_HD).__name__)} "
                             f"{tuple(getattr(delta_HD, 'shape', ()))}")
        _check_device("delta_HD", delta_HD, q.device)
        delta_HD = delta_HD.contiguous()
    if amplitude not in POPE_AMPLITUDES:
        raise ValueError(f"amplitude={amplitude!r}: expected one of {POPE_AMPLITUDES}")
    scale = 1.0 / math.sqrt(D) if scale is None else _check_scale(scale)
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
    reason = pope_cudnn.unsupported_reason(q, k, causal=causal, trivial_pos=trivial_pos,
                                           deterministic=deterministic)
    if requested == "cudnn" and reason is not None:
        raise ValueError(f"pope impl='cudnn' cannot run this call: {reason}")
    return "cudnn" if reason is None else "expand"


def tapa_attention(q_BHTD: Tensor, k_BGSD: Tensor, v_BGSD: Tensor, *, pos_q_BT: Tensor, pos_k_BS: Tensor,
                   alpha: float = 0.1, theta: float = 0.5, phase_scale: float = 2.0 * math.pi,
                   phase: str = "quadratic", scale: float = 1.0, causal: bool = True,
                   deterministic: bool = True, options: AttentionOptions = DEFAULT_OPTIONS) -> Tensor:
    """Fused TAPA attention (MATH §4.2), differentiable in q, k, v.

    Args:
        q_BHTD: raw queries [B, H, T, D], amplitude part first (D_A = int(theta*D)), D <= 128.
        k_BGSD, v_BGSD: [B, G, S, D], G divides H, q's dtype. pos_*: int64 [B or 1, T | S].
        alpha: exponent on |m - n| (> 0, default 0.1). theta: amplitude fraction (default 0.5;
            1 <= int(theta*D) <= D-1). phase_scale: default 2 pi (the paper; 1.0 = released code).
        phase: "quadratic" (Eq. 12, default) or "linear" (Eq. 16).
        scale: multiplies the score; TAPA's logit is the score itself, so the default is 1.0.
        causal: mask by positions (default True).
        deterministic: True (default) computes dQ in its own kernel, bitwise reproducible; False adds
            it with fp32 atomics inside the dK/dV kernel (one backward kernel; on the GPU the order
            of the additions varies from run to run).
        options: `AttentionOptions` (tapa_series, exp2, autotune; the model's `attention` section).
    Returns:
        out_BHTD [B, H, T, D] in q's dtype; a row that sees no key is 0.
    """
    if not isinstance(options, AttentionOptions):
        raise TypeError(f"options must be an AttentionOptions, got {type(options).__name__}")
    q, k, v = _check_qkv(q_BHTD, k_BGSD, v_BGSD)
    B, _H, T, D = q.shape
    pos_q = _check_pos("pos_q_BT", pos_q_BT, B, T, q.device)
    pos_k = _check_pos("pos_k_BS", pos_k_BS, B, k.shape[2], q.device)
    params = ScoreMod(kind="tapa", params={"alpha": alpha, "theta": theta, "phase_scale": phase_scale,
                                           "phase": phase}).params  # validated (MATH §4.2)
    d_amp, _ = tapa_split(D, params["theta"])
    record_impl("tapa", "fused", deterministic=bool(deterministic))
    record_options("tapa", tapa_series=options.tapa_series, exp2=options.exp2, autotune=options.autotune)
    out, _lse = ops.tapa_fwd(q, k, v, pos_q, pos_k, d_amp, float(params["alpha"]), float(params["phase_scale"]),
                             params["phase"] == "linear", _check_scale(scale), bool(causal), bool(deterministic),
                             options.exp2, options.tapa_series, options.autotune)
    return out


# ----------------------------------------------------------------------------- registry backend


class TritonBackend:
    """Registry backend "triton": the fused PoPE and TAPA kernels (and nothing else)."""

    name: ClassVar[str] = "triton"

    def unsupported_reason(self, call: Any) -> str | None:
        if call.score_mod not in ("pope", "tapa", "relbias"):
            return (f"score_mod={call.score_mod!r}: the triton backend has fused kernels for pope, tapa "
                    f"and distance-bias tables (relbias: ALiBi, KERPLE) only; use sdpa for plain/RoPE attention")
        if call.device_type != "cuda" and not triton_common.interpreting():
            return f"device {call.device_type!r}: Triton kernels need CUDA (or TRITON_INTERPRET=1 on CPU)"
        if call.varlen:
            return "packed documents (cu_seqlens) are not implemented in the fused kernels"
        if call.dtype not in _DTYPES:
            return f"dtype {call.dtype} not supported (fp16, bf16, fp32)"
        if call.qk_width != call.head_dim:
            return (f"q/k width {call.qk_width} != v width {call.head_dim}: the kernels take RAW D-wide "
                    f"q/k (PoPE expands in registers), not a pre-expanded 2D-wide q/k")
        if call.head_dim > MAX_HEAD_DIM:
            return f"head_dim {call.head_dim} > {MAX_HEAD_DIM}"
        return None  # causal / non-causal, T < S, GQA, deterministic (the default: no atomics) all supported

    def __call__(self, q_BHTD: Tensor, k_BGSD: Tensor, v_BGSD: Tensor, *, pos_q: Tensor, pos_k: Tensor,
                 scale: float, causal: bool, score_mod: ScoreMod | None,
                 cu_seqlens: Tensor | None = None, trivial_pos: bool = False,
                 deterministic: bool = False, options: AttentionOptions | None = None) -> Tensor:
        options = DEFAULT_OPTIONS if options is None else options
        if cu_seqlens is not None:
            raise ValueError("the triton backend does not take cu_seqlens (see unsupported_reason)")
        if not isinstance(score_mod, ScoreMod) or score_mod.kind not in ("pope", "tapa", "relbias"):
            raise ValueError(f"the triton backend needs a pope, tapa or relbias ScoreMod, got {score_mod!r}")
        if score_mod.kind == "relbias":  # the bias-table kernel (phaselab.kernels.relbias)
            record_impl("relbias", "triton", deterministic=True)
            return relbias.score_mod_attention(q_BHTD, k_BGSD, v_BGSD, score_mod, pos_q=pos_q, pos_k=pos_k,
                                               scale=scale, causal=causal, trivial_pos=trivial_pos,
                                               autotune=options.autotune)
        p = score_mod.params
        if score_mod.kind == "pope":
            device = q_BHTD.device
            delta = p["delta"]
            return pope_attention(q_BHTD, k_BGSD, v_BGSD, pos_q_BT=pos_q, pos_k_BS=pos_k,
                                  inv_freq_D=p["inv_freq"].to(device=device, dtype=torch.float32),
                                  delta_HD=None if delta is None else delta.to(device=device),
                                  scale=scale, causal=causal, amplitude=p["amplitude"], trivial_pos=trivial_pos,
                                  deterministic=deterministic, options=options)
        if p["phase"] not in TAPA_PHASES:
            raise ValueError(f"tapa phase={p['phase']!r}")
        return tapa_attention(q_BHTD, k_BGSD, v_BGSD, pos_q_BT=pos_q, pos_k_BS=pos_k, alpha=p["alpha"],
                              theta=p["theta"], phase_scale=p["phase_scale"], phase=p["phase"], scale=scale,
                              causal=causal, options=options)
