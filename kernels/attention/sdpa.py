"""The `sdpa` backend: torch.nn.functional.scaled_dot_product_attention with explicit masks.

Supported: plain / RoPE (score_mod None; q, k pre-rotated), PoPE through its Cartesian 2D-wide
form (`reference.pope_expand`, MATH §3.3; v stays D wide, which SDPA accepts), ALiBi in fp32/fp64
as an additive float mask, and packed documents (cu_seqlens) as a block-diagonal mask.
An encoding's own `score` ("custom" ScoreMod) runs on CUDA through FlexAttention (compiled,
block-sparse causal mask; `flex_score_attention`); a distance-only one ("relbias": ALiBi, KERPLE)
through the bias-table kernel (`phaselab.kernels.relbias`) on CUDA, and on the CPU in fp32/fp64
as an additive float mask, like the "alibi" kind.
Refused with a reason: TAPA (its cosine is not a dot product), ALiBi in bf16/fp16 (the bias would
be rounded to q's dtype), a custom score on the CPU or with cu_seqlens, and deterministic
backward on CUDA.

Masking follows MATH §7.6: `is_causal=True` only when T == S and both position tensors are the
trivial arange(T); otherwise an explicit boolean mask pos_k[s] <= pos_q[t] (SDPA's is_causal
aligns top-left when T != S, so a single decode query would see only key 0). Rows that see no
key output 0, as in the reference.
"""

from __future__ import annotations

import contextlib
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from phaselab.kernels import relbias
from phaselab.kernels.attention.reference import alibi_bias
from phaselab.kernels.common.checks import capability
from phaselab.kernels.common.options import AttentionOptions
from phaselab.kernels.common.reference_common import _check_qk, repeat_kv, visibility
from phaselab.kernels.common.score_mod import ScoreMod, distance_bias
from phaselab.kernels.pope.reference import pope_expand
from phaselab.kernels.registry import AttnCall, BackendUnsupported, record_impl


def _kernel_choice(q_BHTD: Tensor, attn_mask: Any, is_causal: bool) -> contextlib.AbstractContextManager:
    """cuDNN alone for the training case it handles (Hopper or newer, where it was measured and its
    GPU tests ran; bf16/fp16, head dim <= 128, plain causal without a mask): 1.5-1.8x faster than
    FlashAttention-2 there on the H200 in isolation (benchmarks/results/attention-h200.md; in the
    124M training benchmark the MFU moved within run-to-run noise); torch's own
    order tries flash first. Everything else is left to torch and the user's global settings. (A
    priority list, `set_priority=True`, is not traceable by torch.compile: pytorch/pytorch#155898.)"""
    D = q_BHTD.shape[-1]
    if (is_causal and attn_mask is None and q_BHTD.is_cuda and q_BHTD.dtype in (torch.bfloat16, torch.float16)
            and D <= 128 and D % 8 == 0 and capability(q_BHTD.device.index) >= (9, 0)):
        return sdpa_kernel([SDPBackend.CUDNN_ATTENTION])
    return contextlib.nullcontext()


def _is_arange(pos_BL: Tensor) -> bool:
    ref = torch.arange(pos_BL.shape[-1], device=pos_BL.device, dtype=pos_BL.dtype)
    return bool((pos_BL == ref).all())


def _document_mask(cu_seqlens: Tensor, length: int, device: torch.device) -> Tensor:
    """bool [1, 1, L, L]: token t sees token s only inside its own document."""
    bounds = cu_seqlens.to(device=device, dtype=torch.int64)
    if bounds.ndim != 1 or int(bounds[0]) != 0 or int(bounds[-1]) != length or bool((bounds.diff() < 0).any()):
        raise ValueError(f"cu_seqlens={bounds.tolist()} must be non-decreasing from 0 to the packed "
                         f"length {length}")
    doc_L = torch.searchsorted(bounds[1:], torch.arange(length, device=device), right=True)
    return (doc_L[:, None] == doc_L[None, :])[None, None]


def build_mask(pos_q_BT: Tensor, pos_k_BS: Tensor, *, causal: bool, cu_seqlens: Tensor | None = None,
               trivial_pos: bool = False) -> tuple[Tensor | None, bool]:
    """(bool mask [B|1, 1, T, S] or None, use is_causal). is_causal only for trivial positions:
    declared by the caller (`trivial_pos`, no device sync; a graph break per layer under
    torch.compile otherwise, which cost the compiled 124M model 6 MFU points on the H200) or found by comparing with arange (one sync per call)."""
    T, S = pos_q_BT.shape[-1], pos_k_BS.shape[-1]
    if trivial_pos and T != S:
        raise ValueError(f"trivial_pos=True needs T == S, got T={T}, S={S}")
    if cu_seqlens is None and causal and (trivial_pos or (T == S and _is_arange(pos_q_BT)
                                                          and _is_arange(pos_k_BS))):
        return None, True
    mask = visibility(pos_q_BT, pos_k_BS) if causal else None
    if cu_seqlens is not None:
        if T != S:
            raise ValueError(f"cu_seqlens needs T == S (packed self-attention), got T={T}, S={S}")
        docs = _document_mask(cu_seqlens, T, pos_q_BT.device)
        mask = docs if mask is None else mask & docs
    return mask, False


def _flex_reason(call: AttnCall) -> str | None:
    """Why an encoding's own `score` cannot run on FlexAttention here, or None."""
    if call.device_type != "cuda":
        return "an encoding's own score() runs on CUDA through FlexAttention; on the CPU use 'reference'"
    if call.varlen:
        return "an encoding's own score() with packed documents (cu_seqlens): use 'reference'"
    if call.deterministic and call.needs_grad:
        return "deterministic=True: FlexAttention's backward is not guaranteed deterministic"
    if min(call.head_dim, call.qk_width) < FLEX_MIN_HEAD_DIM:
        return (f"head dim {min(call.head_dim, call.qk_width)} < {FLEX_MIN_HEAD_DIM}: compiled FlexAttention "
                "has no kernel for it (torch: 'NYI: embedding dimension ... must be at least 16'); use 'reference'")
    return None


FLEX_MIN_HEAD_DIM = 16   # torch 2.11's compiled flex_attention lowering refuses smaller q/k/v widths
_COMPILED_FLEX: list[Any] = []


def flex_score_attention(q_BHTD: Tensor, k_BGSD: Tensor, v_BGSD: Tensor, *, pos_q: Tensor, pos_k: Tensor,
                         scale: float, causal: bool, score_mod: ScoreMod, compiled: bool) -> Tensor:
    """A "custom" ScoreMod (an encoding's `score`, docs/EXTENDING.md) through FlexAttention: the
    score function is called per element with 0-d (score, q_pos, k_pos, head) tensors, and the
    causal mask by positions is a block-sparse BlockMask. ``compiled`` uses the fused kernel
    (CUDA); uncompiled, torch's eager FlexAttention is a slow reference of the same path."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    B, H, T, _ = q_BHTD.shape
    S = k_BGSD.shape[2]
    fn = score_mod.params["fn"]
    pq, pk = pos_q.expand(B, T), pos_k.expand(B, S)

    def flex_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return fn(score, pq[b, q_idx], pk[b, kv_idx], h)

    def visible(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return pk[b, kv_idx] <= pq[b, q_idx]

    block_mask = create_block_mask(visible, B, None, T, S, device=q_BHTD.device) if causal else None
    if compiled and not _COMPILED_FLEX:
        _COMPILED_FLEX.append(torch.compile(flex_attention, dynamic=False))
    run = _COMPILED_FLEX[0] if compiled else flex_attention
    return run(q_BHTD, k_BGSD, v_BGSD, score_mod=flex_mod, block_mask=block_mask, scale=scale,
               enable_gqa=k_BGSD.shape[1] != H)


class SdpaBackend:
    """Registry backend "sdpa" (see the module docstring for what it supports)."""

    name: ClassVar[str] = "sdpa"

    def unsupported_reason(self, call: AttnCall) -> str | None:
        if call.score_mod == "tapa":
            return ("TAPA's score A*cos(w*Phi) is not a dot product, so SDPA cannot compute it; use "
                    "'reference' or 'triton'")
        if call.score_mod == "custom":
            return _flex_reason(call)
        if call.score_mod == "relbias" and call.device_type == "cuda":  # the bias-table kernel
            return relbias.unsupported_reason(call.dtype, call.head_dim, call.qk_width, call.varlen)
        if call.score_mod not in (None, "pope", "alibi", "relbias"):
            return f"unknown score_mod {call.score_mod!r}"
        if call.score_mod == "relbias" and call.dtype not in (torch.float32, torch.float64):
            return (f"a distance-bias table (ALiBi, KERPLE, ...) on the CPU is an additive float mask in q's "
                    f"dtype {call.dtype}, which would round it; use fp32, 'reference' or 'triton'")
        if call.score_mod == "alibi" and call.dtype not in (torch.float32, torch.float64):
            return (f"ALiBi needs an additive float mask in q's dtype {call.dtype}; the bias "
                    f"-slope*(m-n) would be rounded (bf16 spacing is 2 at 500); use fp32, "
                    f"'reference' or 'triton'")
        if call.deterministic and call.needs_grad and call.device_type == "cuda":
            return ("deterministic=True: torch SDPA's CUDA backward kernels (flash / memory-"
                    "efficient) accumulate with atomics and are not guaranteed deterministic")
        return None

    def __call__(self, q_BHTD: Tensor, k_BGSD: Tensor, v_BGSD: Tensor, *, pos_q: Tensor, pos_k: Tensor,
                 scale: float, causal: bool, score_mod: ScoreMod | None,
                 cu_seqlens: Tensor | None = None, trivial_pos: bool = False,
                 deterministic: bool = False, options: AttentionOptions | None = None) -> Tensor:
        call = AttnCall.describe(q_BHTD, k_BGSD, v_BGSD, causal=causal, score_mod=score_mod,
                                 cu_seqlens=cu_seqlens)
        reason = self.unsupported_reason(call)
        if reason is not None:
            raise BackendUnsupported(self.name, reason)
        _check_qk(q_BHTD, k_BGSD, pos_q, pos_k)
        H = q_BHTD.shape[1]
        if score_mod is not None and score_mod.kind == "custom":
            record_impl("sdpa", "flex", deterministic=not call.needs_grad)
            return flex_score_attention(q_BHTD, k_BGSD, v_BGSD, pos_q=pos_q, pos_k=pos_k, scale=scale,
                                        causal=causal, score_mod=score_mod, compiled=True)
        if score_mod is not None and score_mod.kind == "relbias" and call.device_type == "cuda":
            record_impl("sdpa", "relbias-triton", deterministic=True)
            return relbias.score_mod_attention(q_BHTD, k_BGSD, v_BGSD, score_mod, pos_q=pos_q, pos_k=pos_k,
                                               scale=scale, causal=causal, trivial_pos=trivial_pos)
        if score_mod is not None and score_mod.kind == "pope":
            p = score_mod.params
            q_BHTD, k_BGSD = pope_expand(q_BHTD, k_BGSD, pos_q_BT=pos_q, pos_k_BS=pos_k,
                                         inv_freq_D=p["inv_freq"], delta_HD=p["delta"],
                                         amplitude=p["amplitude"])
        mask, is_causal = build_mask(pos_q, pos_k, causal=causal, cu_seqlens=cu_seqlens,
                                     trivial_pos=trivial_pos)
        empty_B1T1 = None
        if mask is not None:
            empty_B1T1 = ~mask.any(dim=-1, keepdim=True)
            mask = mask | empty_B1T1  # let empty rows attend somewhere (no NaN); zeroed below
        attn_mask: Any = mask
        if score_mod is not None and score_mod.kind in ("alibi", "relbias"):
            bias = (alibi_bias(pos_q, pos_k, score_mod.params["slopes"], compute_dtype=q_BHTD.dtype)
                    if score_mod.kind == "alibi" else distance_bias(score_mod, pos_q, pos_k, H, q_BHTD.dtype))
            attn_mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
            if is_causal:  # an additive mask cannot be combined with is_causal
                attn_mask = attn_mask.masked_fill(~visibility(pos_q, pos_k), float("-inf"))
                is_causal = False
        choice = _kernel_choice(q_BHTD, attn_mask, is_causal)
        # torch's CUDA backward kernels accumulate with atomics (see unsupported_reason)
        record_impl("sdpa", "torch" if isinstance(choice, contextlib.nullcontext) else "cudnn",
                    deterministic=not (call.device_type == "cuda" and call.needs_grad))
        with choice:
            out_BHTD = F.scaled_dot_product_attention(
                q_BHTD, repeat_kv(k_BGSD, H), repeat_kv(v_BGSD, H), attn_mask=attn_mask,
                is_causal=is_causal, scale=scale)
        if empty_B1T1 is not None:
            out_BHTD = out_BHTD.masked_fill(empty_B1T1, 0.0)
        return out_BHTD
