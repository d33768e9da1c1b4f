"""What every attention reference shares: input checks, GQA, visibility by positions, the masked
softmax and the exact signed distance (kernels/attention/reference.py and each operator's
reference.py build on these; MATH §0, §7.2, §7.6).
"""

from __future__ import annotations

import torch
from torch import Tensor

_COMPUTE_DTYPES = (torch.float32, torch.float64)


def _compute_dtype(compute_dtype: torch.dtype | None) -> torch.dtype:
    dtype = torch.float32 if compute_dtype is None else compute_dtype
    if dtype not in _COMPUTE_DTYPES:
        raise ValueError(f"compute_dtype={compute_dtype}: expected torch.float32 or torch.float64")
    return dtype


def _check_positions(name: str, pos: Tensor, batch: int, length: int) -> None:
    if not isinstance(pos, torch.Tensor):
        raise TypeError(f"{name} must be an integer torch.Tensor, got {type(pos).__name__}")
    if pos.dtype not in (torch.int64, torch.int32):
        # MATH §7.2: a position held in bf16/fp16 is already wrong; refuse any float position.
        raise TypeError(f"{name} must be int64 (or int32), got {pos.dtype}")
    if pos.ndim != 2 or pos.shape[0] not in (1, batch) or pos.shape[1] != length:
        raise ValueError(f"{name} has shape {tuple(pos.shape)}, expected ({batch} or 1, {length})")


def _check_qk(q_BHTD: Tensor, k_BGSD: Tensor, pos_q_BT: Tensor, pos_k_BS: Tensor) -> None:
    if q_BHTD.ndim != 4 or k_BGSD.ndim != 4:
        raise ValueError(f"q and k must be 4-D BHTD/BGSD, got shapes {tuple(q_BHTD.shape)} and "
                         f"{tuple(k_BGSD.shape)}")
    (B, H, T, D), (Bk, G, S, Dk) = q_BHTD.shape, k_BGSD.shape
    if Bk != B or Dk != D:
        raise ValueError(f"k shape {tuple(k_BGSD.shape)} does not match q shape {tuple(q_BHTD.shape)} "
                         f"(batch and width must agree)")
    if G == 0 or H % G != 0:
        raise ValueError(f"query heads H={H} must be divisible by kv heads G={G}")
    _check_positions("pos_q_BT", pos_q_BT, B, T)
    _check_positions("pos_k_BS", pos_k_BS, B, S)


def repeat_kv(x_BGSD: Tensor, n_heads: int) -> Tensor:
    """GQA: expand G kv heads to H query heads; head h reads kv head h // (H // G)."""
    groups = x_BGSD.shape[1]
    return x_BGSD if groups == n_heads else x_BGSD.repeat_interleave(n_heads // groups, dim=1)


def _signed_distance(pos_q_BT: Tensor, pos_k_BS: Tensor) -> Tensor:
    """m - n as int64 [B, T, S]: exact integer arithmetic before any float conversion."""
    return pos_q_BT.to(torch.int64)[:, :, None] - pos_k_BS.to(torch.int64)[:, None, :]



def visibility(pos_q_BT: Tensor, pos_k_BS: Tensor) -> Tensor:
    """Causal visibility by positions, bool [B, 1, T, S]: key s visible iff pos_k[s] <= pos_q[t].

    This is bottom-right alignment when T < S (KV-cache decoding; MATH §7.6).
    """
    return (pos_k_BS[:, None, :] <= pos_q_BT[:, :, None])[:, None]


def masked_softmax(logits_BHTS: Tensor, visible: Tensor | None) -> Tensor:
    """Softmax over keys; masked entries get probability 0 and a row with no visible key is all 0."""
    if visible is None or logits_BHTS.shape[-1] == 0:   # no key at all (S = 0): every row is 0
        return torch.softmax(logits_BHTS, dim=-1)
    masked = logits_BHTS.masked_fill(~visible, float("-inf"))
    row_max = masked.amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max)).detach()
    p = torch.exp(masked - row_max)
    denom = p.sum(dim=-1, keepdim=True)
    return p / torch.where(denom > 0, denom, torch.ones_like(denom))
