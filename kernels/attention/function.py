"""The registry's `triton` backend: dispatch by score mod to the fused PoPE and TAPA kernels
(kernels/pope/function.py `pope_attention`, kernels/tapa/function.py `tapa_attention`; custom ops
with autograd and vmap rules in each folder's ops.py, so torch.compile keeps one graph through
them) and to the bias-table kernel (kernels/relbias). PoPE has two more implementations,
`impl="expand"` (kernels/pope/triton_expand.py: 2D-wide q_hat/k_hat in device memory, the flash
core of kernels/flash, the chain rule in its backward's epilogues) and `impl="cudnn"`
(kernels/pope/cudnn.py: the same prologue and chain rule around cuDNN's attention core), chosen by
`impl=` or by `AttentionOptions.pope_impl` (options.py; default "auto"). The options also say how the score
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

Example (kernels/pope, kernels/tapa):
    >>> inv_freq = pope_inv_freq(64)
    >>> out = pope_attention(q, k, v, pos_q_BT=pos, pos_k_BS=pos, inv_freq_D=inv_freq.cuda())
    >>> out = tapa_attention(q, k, v, pos_q_BT=pos, pos_k_BS=pos, alpha=0.1, theta=0.5)
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from phaselab.kernels import relbias
from phaselab.kernels.common import triton_common
from phaselab.kernels.common.checks import DTYPES, MAX_HEAD_DIM
from phaselab.kernels.common.options import DEFAULT_OPTIONS, AttentionOptions
from phaselab.kernels.common.score_mod import TAPA_PHASES, ScoreMod
from phaselab.kernels.pope.function import pope_attention
from phaselab.kernels.registry import record_impl
from phaselab.kernels.tapa.function import tapa_attention

__all__ = ["TritonBackend"]


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
        if call.dtype not in DTYPES:
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
                              causal=causal, trivial_pos=trivial_pos, options=options)
