"""Reference attention: the executable form of MATH.md. Every fused kernel must match it.

Layout BHTD (kernels' layout; MATH §0): q_BHTD, k_BGSD, v_BGSD with G dividing H; query head h
reads kv head h // (H // G). Positions are absolute int64 tensors pos_q_BT, pos_k_BS (a leading 1
broadcasts over the batch). They become floating point only when multiplied by a frequency, in the
compute dtype (fp32 by default, float64 for gradcheck), never in q's dtype (MATH §7.1, §7.2).

Scores (unscaled, unmasked; `scores`):
    none   <q_m, k_n>                         (plain, or RoPE when q and k come pre-rotated)
    pope   sum_c mu_q,mc mu_k,nc cos((n-m) theta_c + delta_hc),  mu = amplitude(x)   (MATH §3.1)
    tapa   A * cos(phase_scale |m-n|^alpha Phi),  A = <q_A,k_A>/sqrt(D_A)            (MATH §4.2)
    alibi  <q_m, k_n>; the bias -slope_h (m-n) is added *after* scaling (`logits`, MATH §5)
    relbias <q_m, k_n>; the encoding's table bias[h, m-n] is added after scaling (`logits`)
Logits: scale * score (+ ALiBi bias); masked by positions (key s visible to query t iff
pos_k[s] <= pos_q[t]); softmax in the compute dtype; a row that sees no key outputs 0.

PoPE's and TAPA's scores are their operators' references (kernels/pope/reference.py,
kernels/tapa/reference.py); the checks, GQA, visibility and masked softmax every reference shares
are in reference_common.py.
"""

from __future__ import annotations

import itertools
from typing import Any, ClassVar

import torch
from torch import Tensor

from phaselab.kernels.common.options import AttentionOptions
from phaselab.kernels.common.reference_common import (
    _check_qk,
    _compute_dtype,
    _signed_distance,
    masked_softmax,
    repeat_kv,
    visibility,
)
from phaselab.kernels.common.score_mod import ScoreMod, alibi_table, apply_score_fn, distance_bias
from phaselab.kernels.pope.reference import pope_scores
from phaselab.kernels.registry import record_impl
from phaselab.kernels.tapa.reference import tapa_scores

__all__ = ["ReferenceBackend", "alibi_bias", "attention", "logits", "masked_softmax", "repeat_kv", "scores",
           "visibility"]


def alibi_bias(pos_q_BT: Tensor, pos_k_BS: Tensor, slopes_H: Tensor, *,
               compute_dtype: torch.dtype = torch.float32) -> Tensor:
    """ALiBi additive logit bias_BHTS = -slope_h * (m - n) (MATH §5), in the compute dtype."""
    return alibi_table(slopes_H, _signed_distance(pos_q_BT, pos_k_BS), compute_dtype).transpose(0, 1)


# ----------------------------------------------------------------------------- scores and logits


def scores(q_BHTD: Tensor, k_BGSD: Tensor, *, pos_q_BT: Tensor, pos_k_BS: Tensor,
           score_mod: ScoreMod | None, compute_dtype: torch.dtype | None = torch.float32) -> Tensor:
    """Unscaled, unmasked scores logits_BHTS in the compute dtype (see the module docstring).

    Args:
        q_BHTD: queries [B, H, T, D]; raw projections for pope/tapa, pre-rotated for RoPE.
        k_BGSD: keys [B, G, S, D], G divides H.
        pos_q_BT, pos_k_BS: int64 absolute positions [B or 1, T] and [B or 1, S].
        score_mod: None (plain dot), or a pope/tapa/alibi ScoreMod.
        compute_dtype: torch.float32 (default) or torch.float64.
    """
    _check_qk(q_BHTD, k_BGSD, pos_q_BT, pos_k_BS)
    dtype = _compute_dtype(compute_dtype)
    if score_mod is not None and not isinstance(score_mod, ScoreMod):
        raise TypeError(f"score_mod must be a ScoreMod or None, got {type(score_mod).__name__}")
    k_BHSD = repeat_kv(k_BGSD, q_BHTD.shape[1])
    if score_mod is None or score_mod.kind in ("alibi", "relbias", "custom"):
        return q_BHTD.to(dtype) @ k_BHSD.to(dtype).transpose(-1, -2)
    if score_mod.kind == "pope":
        return pope_scores(q_BHTD, k_BHSD, pos_q_BT, pos_k_BS, score_mod.params, dtype)
    return tapa_scores(q_BHTD, k_BHSD, pos_q_BT, pos_k_BS, score_mod.params, dtype)


def logits(q_BHTD: Tensor, k_BGSD: Tensor, *, pos_q_BT: Tensor, pos_k_BS: Tensor, scale: float,
           score_mod: ScoreMod | None, compute_dtype: torch.dtype | None = torch.float32) -> Tensor:
    """Unmasked logits_BHTS = scale * scores(...) (+ the ALiBi bias for kind "alibi").

    The spec a fused kernel's logit tile must match. TAPA callers pass scale=1.0 (MATH §4.2); for
    alibi the bias -slope_h*(m-n) is added after scaling (MATH §5).
    """
    dtype = _compute_dtype(compute_dtype)
    out = scale * scores(q_BHTD, k_BGSD, pos_q_BT=pos_q_BT, pos_k_BS=pos_k_BS, score_mod=score_mod,
                         compute_dtype=dtype)
    if score_mod is not None and score_mod.kind == "alibi":
        slopes_H = score_mod.params["slopes"]
        if slopes_H.shape != (q_BHTD.shape[1],):
            raise ValueError(f"alibi slopes have shape {tuple(slopes_H.shape)}, expected "
                             f"({q_BHTD.shape[1]},) = query heads")
        out = out + alibi_bias(pos_q_BT, pos_k_BS, slopes_H, compute_dtype=dtype)
    if score_mod is not None and score_mod.kind == "relbias":  # a distance-only encoding's table
        out = out + distance_bias(score_mod, pos_q_BT, pos_k_BS, q_BHTD.shape[1], dtype)
    if score_mod is not None and score_mod.kind == "custom":   # an encoding's `score` (EXTENDING.md)
        out = apply_score_fn(score_mod, out, pos_q_BT, pos_k_BS)
    return out


def attention(q_BHTD: Tensor, k_BGSD: Tensor, v_BGSD: Tensor, *, pos_q_BT: Tensor, pos_k_BS: Tensor,
              scale: float, causal: bool = True, score_mod: ScoreMod | None = None,
              compute_dtype: torch.dtype = torch.float32) -> Tensor:
    """Reference attention out_BHTD (q's dtype); v may be narrower than q/k (pre-expanded PoPE).

    Args:
        q_BHTD, k_BGSD: see `scores`; v_BGSD: values [B, G, S, Dv].
        pos_q_BT, pos_k_BS: int64 positions; causal visibility is pos_k[s] <= pos_q[t].
        scale: multiplies the score (1/sqrt(D) usually; YaRN mscale**2/sqrt(D); TAPA 1.0).
        causal: mask by positions (default True). Non-causal attends to every key.
        score_mod: None or a ScoreMod. compute_dtype: torch.float32 (default) or torch.float64.

    Example (decode one token at position 9 against 10 cached keys):
        >>> out = attention(q, k, v, pos_q_BT=torch.tensor([[9]]), pos_k_BS=torch.arange(10)[None],
        ...                 scale=q.shape[-1] ** -0.5)
    """
    dtype = _compute_dtype(compute_dtype)
    if v_BGSD.ndim != 4 or v_BGSD.shape[:3] != k_BGSD.shape[:3]:
        raise ValueError(f"v shape {tuple(v_BGSD.shape)} must be [B, G, S, Dv] matching k "
                         f"{tuple(k_BGSD.shape)}")
    logits_BHTS = logits(q_BHTD, k_BGSD, pos_q_BT=pos_q_BT, pos_k_BS=pos_k_BS, scale=scale,
                         score_mod=score_mod, compute_dtype=dtype)
    visible = visibility(pos_q_BT, pos_k_BS) if causal else None
    probs_BHTS = masked_softmax(logits_BHTS, visible)
    out_BHTD = probs_BHTS @ repeat_kv(v_BGSD, q_BHTD.shape[1]).to(dtype)
    return out_BHTD.to(q_BHTD.dtype)


def _segments(cu_seqlens: Tensor, total: int) -> list[tuple[int, int]]:
    bounds = [int(x) for x in cu_seqlens.tolist()]
    if not bounds or bounds[0] != 0 or bounds[-1] != total or any(b > a for a, b in zip(bounds[1:], bounds)):
        raise ValueError(f"cu_seqlens={bounds} must be non-decreasing from 0 to the packed length {total}")
    return list(itertools.pairwise(bounds))


class ReferenceBackend:
    """The registry's `reference` backend: always supported, deterministic, fp32 compute.

    With `cu_seqlens` (packed documents; B = 1, T = S) it is defined as a per-document loop of
    `attention` (DESIGN §7 example 7), so documents never see each other.
    """

    name: ClassVar[str] = "reference"

    def unsupported_reason(self, call: Any) -> str | None:
        return None

    def __call__(self, q_BHTD: Tensor, k_BGSD: Tensor, v_BGSD: Tensor, *, pos_q: Tensor, pos_k: Tensor,
                 scale: float, causal: bool, score_mod: ScoreMod | None,
                 cu_seqlens: Tensor | None = None, trivial_pos: bool = False,
                 deterministic: bool = False, options: AttentionOptions | None = None) -> Tensor:
        kwargs = {"scale": scale, "causal": causal, "score_mod": score_mod}
        record_impl("reference", "torch", deterministic=True)
        if cu_seqlens is None:
            return attention(q_BHTD, k_BGSD, v_BGSD, pos_q_BT=pos_q, pos_k_BS=pos_k, **kwargs)
        if q_BHTD.shape[0] != 1 or q_BHTD.shape[2] != k_BGSD.shape[2]:
            raise ValueError(f"cu_seqlens needs packed inputs with B = 1 and T = S, got q "
                             f"{tuple(q_BHTD.shape)} and k {tuple(k_BGSD.shape)}")
        outs = [attention(q_BHTD[:, :, a:b], k_BGSD[:, :, a:b], v_BGSD[:, :, a:b],
                          pos_q_BT=pos_q[:, a:b], pos_k_BS=pos_k[:, a:b], **kwargs)
                for a, b in _segments(cu_seqlens, q_BHTD.shape[2])]
        return torch.cat(outs, dim=2)
