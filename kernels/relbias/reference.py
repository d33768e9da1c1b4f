"""The spec of the bias-table attention in plain PyTorch (any float dtype, float64 included),
differentiated by autograd in q, k, v and the table: what `triton_relbias.py` must match.

    logit(t, s) = scale * <q_t, k_s> + table[h, pos_q[t] - pos_k[s] - d_min]

masked by positions (key s visible iff pos_k[s] <= pos_q[t] when causal), softmax over keys,
a row that sees no key outputs 0 (kernels/attention/reference.py's conventions). Every visible
distance must lie in the table: d_min <= pos_q - pos_k < d_min + Nd, else a ValueError.
"""

from __future__ import annotations

import torch
from torch import Tensor

from phaselab.kernels.common.reference_common import _check_qk, masked_softmax, repeat_kv, visibility


def distance_range(pos_q_BT: Tensor, pos_k_BS: Tensor, *, causal: bool, trivial_pos: bool = False) -> tuple[int, int]:
    """(d_min, Nd): the table's first distance and length covering every visible pair.

    Causal: d_min = 0 (a visible key is never after its query), Nd = max(pos_q) - min(pos_k) + 1;
    with `trivial_pos` (pos_q == pos_k == 0..T-1, declared by the caller) Nd = T with no device
    sync, else one sync reads the extremes. Non-causal: every signed distance that occurs."""
    T = pos_q_BT.shape[-1]
    if trivial_pos and causal:
        return 0, max(T, 1)
    hi = int((pos_q_BT.max() - pos_k_BS.min()).item())
    lo = 0 if causal else int((pos_q_BT.min() - pos_k_BS.max()).item())
    return lo, max(hi - lo + 1, 1)


def gather_bias(table_HN: Tensor, pos_q_BT: Tensor, pos_k_BS: Tensor, d_min: int) -> Tensor:
    """table[h, pos_q - pos_k - d_min] as [B, H, T, S], the index clamped into the table (only
    pairs outside it, which the caller masks, are clamped)."""
    dist_BTS = pos_q_BT.to(torch.int64)[:, :, None] - pos_k_BS.to(torch.int64)[:, None, :] - d_min
    return table_HN[:, dist_BTS.clamp(0, table_HN.shape[1] - 1)].transpose(0, 1)


def relbias_attention(q_BHTD: Tensor, k_BGSD: Tensor, v_BGSD: Tensor, table_HN: Tensor, *, pos_q_BT: Tensor,
                      pos_k_BS: Tensor, d_min: int = 0, scale: float | None = None, causal: bool = True,
                      compute_dtype: torch.dtype = torch.float32) -> Tensor:
    """Reference bias-table attention, out [B, H, T, Dv] in q's dtype (compute in compute_dtype).

    Args:
        q_BHTD [B, H, T, D], k_BGSD / v_BGSD [B, G, S, D|Dv], G divides H.
        table_HN: the bias [H, Nd] at distances d_min .. d_min + Nd - 1 (any float dtype; cast to
            compute_dtype, so its gradient flows back in its own dtype).
        pos_q_BT, pos_k_BS: int64 positions [B or 1, T|S]. scale: default 1/sqrt(D).
    """
    _check_qk(q_BHTD, k_BGSD, pos_q_BT, pos_k_BS)
    H, n_dist = q_BHTD.shape[1], table_HN.shape[-1]
    if table_HN.ndim != 2 or table_HN.shape[0] != H or n_dist == 0:
        raise ValueError(f"table has shape {tuple(table_HN.shape)}, expected [H={H}, Nd >= 1]")
    visible = visibility(pos_q_BT, pos_k_BS) if causal else None
    dist_B1TS = (pos_q_BT[:, :, None] - pos_k_BS[:, None, :])[:, None] - d_min
    outside = (dist_B1TS < 0) | (dist_B1TS >= n_dist)
    if bool((outside if visible is None else outside & visible).any()):
        raise ValueError(f"a visible distance lies outside the table [{d_min}, {d_min + n_dist}) "
                         f"(use distance_range)")
    scale = q_BHTD.shape[-1] ** -0.5 if scale is None else scale
    dot_BHTS = q_BHTD.to(compute_dtype) @ repeat_kv(k_BGSD, H).to(compute_dtype).transpose(-1, -2)
    logits_BHTS = scale * dot_BHTS + gather_bias(table_HN.to(compute_dtype), pos_q_BT, pos_k_BS, d_min)
    probs_BHTS = masked_softmax(logits_BHTS, visible)
    return (probs_BHTS @ repeat_kv(v_BGSD, H).to(compute_dtype)).to(q_BHTD.dtype)
