"""The spec of `linear_cross_entropy` in plain torch (DESIGN §7 example 5: the naive twin).

Semantics (those of `masked_cross_entropy` in workloads/models/transformer.py):
    logits_NV = (h_NC @ weight_VC^T)[:, :vocab_size]     in the inputs' dtype (as autocast does)
    nll_i     = logsumexp(logits_i) - logits_i[target_i]  in fp32 (fp64 for fp64 inputs)
    w_i       = (target_i >= 0) * mask_i
    loss      = sum_i w_i nll_i / sum_i w_i               (NaN when sum_i w_i = 0, never a silent 0)
Rows of the padded weight at or beyond `vocab_size` take no part (zero probability, zero gradient).

Example (the worked case: two rows, one ignored):
    >>> h = torch.eye(2, dtype=torch.float64); W = torch.tensor([[1., 0.], [0., 1.], [9., 9.]], dtype=torch.float64)
    >>> linear_cross_entropy(h, W, torch.tensor([0, -1]), vocab_size=2)   # row 0 only: log(e + 1) - 1
    tensor(0.3133, dtype=torch.float64)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def row_weights(targets_N: Tensor, mask_N: Tensor | None, dtype: torch.dtype = torch.float32) -> Tensor:
    """w_N = (target >= 0) * mask, in `dtype` (fp32 by default: the loss is an fp32 mean)."""
    weight_N = (targets_N >= 0).to(dtype)
    return weight_N if mask_N is None else weight_N * mask_N.to(dtype)


def linear_cross_entropy(h_NC: Tensor, weight_VC: Tensor, targets_N: Tensor, mask_N: Tensor | None = None, *,
                         vocab_size: int) -> Tensor:
    """Weighted mean cross-entropy of the linear head h @ W^T over the first `vocab_size` columns.

    Args:
        h_NC: hidden states [N, C]. weight_VC: head weight [V_pad, C], h's dtype, V_pad >= vocab_size.
        targets_N: int64 [N], -1 = ignored. mask_N: float weights [N] or None (all ones).
        vocab_size: number of real columns (the rest is padding).
    Returns:
        scalar loss, fp32 (fp64 when h is fp64), differentiable in h and weight through autograd.
    """
    logits_NV = (h_NC @ weight_VC.t())[:, :vocab_size]
    acc = torch.float64 if h_NC.dtype == torch.float64 else torch.float32
    nll_N = F.cross_entropy(logits_NV.to(acc), targets_N, ignore_index=-1, reduction="none")
    weight_N = row_weights(targets_N, mask_N, acc)
    return (nll_N * weight_N).sum() / weight_N.sum()
