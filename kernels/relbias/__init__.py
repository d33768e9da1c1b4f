"""phaselab.kernels.relbias: attention with a distance-indexed logit bias, learnable or fixed.

For a score modification that depends only on (head, pos_q - pos_k) and its parameters (ALiBi,
KERPLE, T5- or FIRE-like relative biases), the encoding computes a table bias[H, Nd] in plain
PyTorch and one Triton flash kernel adds bias[h, pos_q - pos_k - d_min] to every logit; its
backward returns dq, dk, dv and d bias, and autograd carries d bias to the encoding's parameters
through the table's own code (README.md in this folder).

- `reference`: the spec in plain torch (float64-capable), differentiated by autograd;
- `triton_relbias`: forward, dK/dV and dQ + d bias kernels on the flash core's skeleton;
- `function`: the custom ops with autograd; `relbias_attention` (here): the validated public op;
- `score_mod_attention`: a "relbias" ScoreMod (kernels/common/score_mod.py) through the kernel.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from phaselab.kernels.relbias.reference import distance_range

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 128

__all__ = ["MAX_HEAD_DIM", "distance_range", "relbias_attention", "score_mod_attention", "unsupported_reason"]


def unsupported_reason(dtype: torch.dtype, head_dim: int, qk_width: int, varlen: bool) -> str | None:
    """Why the kernel cannot run a call of this kind, or None."""
    if dtype not in _DTYPES:
        return f"dtype {dtype}: the bias-table kernel takes {_DTYPES}"
    if qk_width != head_dim or not 1 <= head_dim <= MAX_HEAD_DIM:
        return f"q/k width {qk_width}, v width {head_dim}: the bias-table kernel needs equal widths <= {MAX_HEAD_DIM}"
    if varlen:
        return "packed documents (cu_seqlens) are not implemented in the bias-table kernel; use 'reference'"
    return None


def _check(q: Tensor, k: Tensor, v: Tensor, table: Tensor, pos_q: Tensor, pos_k: Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or t.ndim != 4 or t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f"{name} must be a 4-D tensor of q's dtype and device, got "
                             f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}")
    B, H, T, D = q.shape
    G, S = k.shape[1], k.shape[2]
    reason = unsupported_reason(q.dtype, v.shape[-1], D, varlen=False)
    if reason or k.shape != (B, G, S, D) or v.shape != k.shape or G == 0 or H % G or T == 0 or S == 0:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: need [B,H,T,D], "
                         f"[B,G,S,D] twice, G | H, T, S > 0" + (f"; {reason}" if reason else ""))
    if table.ndim != 2 or table.shape[0] != H or table.shape[1] == 0 or table.dtype != torch.float32 \
            or table.device != q.device:
        raise ValueError(f"table must be fp32 [H={H}, Nd >= 1] on q's device, got {table.dtype} "
                         f"{tuple(table.shape)} on {table.device}")
    for name, p, n in (("pos_q_BT", pos_q, T), ("pos_k_BS", pos_k, S)):
        if p.dtype not in (torch.int64, torch.int32) or p.ndim != 2 or p.shape[0] not in (1, B) or p.shape[1] != n \
                or p.device != q.device:
            raise ValueError(f"{name} must be int64 [{B} or 1, {n}] on q's device, got {p.dtype} {tuple(p.shape)}")


def relbias_attention(q_BHTD: Tensor, k_BGSD: Tensor, v_BGSD: Tensor, table_HN: Tensor, *, pos_q_BT: Tensor,
                      pos_k_BS: Tensor, d_min: int = 0, scale: float | None = None, causal: bool = True,
                      trivial_pos: bool = False, autotune: bool = False) -> Tensor:
    """Bias-table attention, differentiable in q, k, v and the table (spec: `reference.relbias_attention`).

    Args:
        q_BHTD [B, H, T, D], k_BGSD / v_BGSD [B, G, S, D]: fp16 / bf16 / fp32, G | H, D <= 128.
        table_HN: fp32 [H, Nd], the bias at distances d_min .. d_min + Nd - 1; every visible
            distance must lie in it (`distance_range` gives the covering range). Its gradient is
            computed only when it requires grad.
        pos_q_BT, pos_k_BS: int64 positions [B or 1, T|S]; causal visibility pos_k <= pos_q.
        scale: default 1/sqrt(D). trivial_pos: the caller guarantees pos_q == pos_k == 0..T-1
            (T == S), so the kernels use indices and read no positions.
        autotune: time every Triton config at each new shape (`AttentionOptions.autotune`).
    Returns out [B, H, T, D] in q's dtype; a row that sees no key is 0.
    """
    _check(q_BHTD, k_BGSD, v_BGSD, table_HN, pos_q_BT, pos_k_BS)
    if trivial_pos and q_BHTD.shape[2] != k_BGSD.shape[2]:
        raise ValueError(f"trivial_pos=True needs T == S, got T={q_BHTD.shape[2]}, S={k_BGSD.shape[2]}")
    from phaselab.kernels.relbias.function import relbias_fwd

    scale = 1.0 / math.sqrt(q_BHTD.shape[-1]) if scale is None else float(scale)
    pos_q, pos_k = pos_q_BT.to(torch.int64).contiguous(), pos_k_BS.to(torch.int64).contiguous()
    out, _lse, _flags = relbias_fwd(q_BHTD, k_BGSD, v_BGSD, table_HN.contiguous(), pos_q, pos_k, int(d_min), scale,
                                    bool(causal), bool(trivial_pos), bool(autotune))
    return out


def score_mod_attention(q_BHTD: Tensor, k_BGSD: Tensor, v_BGSD: Tensor, score_mod, *, pos_q: Tensor, pos_k: Tensor,
                        scale: float, causal: bool, trivial_pos: bool = False, autotune: bool = False) -> Tensor:
    """A "relbias" ScoreMod (an encoding's `bias_table`, docs/EXTENDING.md) through the kernel: its
    table is built in fp32 over `distance_range` (plain PyTorch, so autograd reaches the
    encoding's parameters) and handed to `relbias_attention`."""
    from phaselab.kernels.common.score_mod import bias_table

    d_min, n_dist = distance_range(pos_q, pos_k, causal=causal, trivial_pos=trivial_pos)
    dist_N = torch.arange(d_min, d_min + n_dist, device=q_BHTD.device)
    table_HN = bias_table(score_mod, dist_N, q_BHTD.shape[1], torch.float32)
    return relbias_attention(q_BHTD, k_BGSD, v_BGSD, table_HN, pos_q_BT=pos_q, pos_k_BS=pos_k, d_min=d_min,
                             scale=scale, causal=causal, trivial_pos=trivial_pos, autotune=autotune)
