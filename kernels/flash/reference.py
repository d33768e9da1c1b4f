"""The flash core's spec in plain torch (float64-capable, differentiated by autograd): plain
attention with q/k width DK and v width DV, causal by positions or by index, GQA, and the row
statistic its forward saves. The checks, masking, softmax and GQA are the ones every reference
shares (kernels/common/reference_common.py); the generic reference with `score_mod=None` equals it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from phaselab.kernels.common.reference_common import (
    _check_qk,
    _compute_dtype,
    masked_softmax,
    repeat_kv,
    visibility,
)


def index_positions(T: int, S: int, device: torch.device | str) -> tuple[Tensor, Tensor]:
    """The positions the core uses when given none: the T queries are the last T of the S keys."""
    ar = torch.arange(S, device=device)
    return ar[S - T:][None], ar[None]


def _positions(q: Tensor, k: Tensor, pos_q_BT: Tensor | None, pos_k_BS: Tensor | None) -> tuple[Tensor, Tensor]:
    if (pos_q_BT is None) != (pos_k_BS is None):
        raise ValueError("pass both positions or neither (index positions)")
    if pos_q_BT is None:
        return index_positions(q.shape[2], k.shape[2], q.device)
    return pos_q_BT, pos_k_BS


def _logits(q_BHTD: Tensor, k_BGSD: Tensor, pos_q: Tensor, pos_k: Tensor, scale: float,
            dtype: torch.dtype) -> Tensor:
    """Unmasked scale * q k^T [B, H, T, S] in the compute dtype, GQA expanded."""
    _check_qk(q_BHTD, k_BGSD, pos_q, pos_k)
    dtype = _compute_dtype(dtype)
    return scale * (q_BHTD.to(dtype) @ repeat_kv(k_BGSD, q_BHTD.shape[1]).to(dtype).transpose(-1, -2))


def flash_attention(q_BHTD: Tensor, k_BGSD: Tensor, v_BGSD: Tensor, *, pos_q_BT: Tensor | None = None,
                    pos_k_BS: Tensor | None = None, scale: float | None = None, causal: bool = True,
                    compute_dtype: torch.dtype = torch.float32) -> Tensor:
    """out [B, H, T, DV] = softmax(scale q k^T, masked) v in the compute dtype, cast to q's dtype;
    the spec of `function.flash_attention` (same arguments; scale defaults to 1/sqrt(DK))."""
    pos_q, pos_k = _positions(q_BHTD, k_BGSD, pos_q_BT, pos_k_BS)
    scale = 1.0 / math.sqrt(q_BHTD.shape[-1]) if scale is None else float(scale)
    if v_BGSD.ndim != 4 or v_BGSD.shape[:3] != k_BGSD.shape[:3]:
        raise ValueError(f"v shape {tuple(v_BGSD.shape)} must be [B, G, S, Dv] matching k "
                         f"{tuple(k_BGSD.shape)}")
    logits_BHTS = _logits(q_BHTD, k_BGSD, pos_q, pos_k, scale, compute_dtype)
    probs_BHTS = masked_softmax(logits_BHTS, visibility(pos_q, pos_k) if causal else None)
    out_BHTD = probs_BHTS @ repeat_kv(v_BGSD, q_BHTD.shape[1]).to(logits_BHTS.dtype)
    return out_BHTD.to(q_BHTD.dtype)


def row_lse2(q_BHTD: Tensor, k_BGSD: Tensor, *, pos_q_BT: Tensor | None = None, pos_k_BS: Tensor | None = None,
             scale: float | None = None, causal: bool = True, compute_dtype: torch.dtype = torch.float64) -> Tensor:
    """The statistic the forward saves, [B, H, T]: log2 of sum over visible keys of exp(logit),
    +inf for a row that sees no key (the kernels' convention: its output row is 0)."""
    pos_q, pos_k = _positions(q_BHTD, k_BGSD, pos_q_BT, pos_k_BS)
    scale = 1.0 / math.sqrt(q_BHTD.shape[-1]) if scale is None else float(scale)
    logits_BHTS = _logits(q_BHTD, k_BGSD, pos_q, pos_k, scale, compute_dtype)
    if causal:
        logits_BHTS = logits_BHTS.masked_fill(~visibility(pos_q, pos_k), float("-inf"))
    lse = torch.logsumexp(logits_BHTS, dim=-1) / math.log(2.0)
    return torch.where(torch.isneginf(lse), torch.full_like(lse, float("inf")), lse)
