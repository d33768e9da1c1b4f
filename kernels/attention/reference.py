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
"""

from __future__ import annotations

import itertools
import math
from typing import Any, ClassVar

import torch
from torch import Tensor

from phaselab.kernels.attention.options import AttentionOptions
from phaselab.kernels.attention.score_mod import (
    ScoreMod,
    alibi_table,
    apply_score_fn,
    distance_bias,
    tapa_split,
)
from phaselab.kernels.registry import record_impl

SOFTPLUS_THRESHOLD = 20.0  # PyTorch's softplus threshold (beta = 1); MATH §7.3
_COMPUTE_DTYPES = (torch.float32, torch.float64)


# ----------------------------------------------------------------------------- validation


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


# ----------------------------------------------------------------------------- PoPE


def softplus_fp32(x: Tensor) -> Tensor:
    """softplus(x) = log1p(exp(x)) for x <= 20, x above (PyTorch's threshold; MATH §7.3).

    The exp argument is clamped so that the untaken branch never produces inf (whose gradient
    would be NaN); the derivative is sigmoid(x), and exactly 1 above the threshold.
    """
    return torch.where(x > SOFTPLUS_THRESHOLD, x, torch.log1p(torch.exp(x.clamp(max=SOFTPLUS_THRESHOLD))))


def pope_amplitude(x: Tensor, amplitude: str) -> Tensor:
    """mu = softplus | relu | identity of x, elementwise in x's (compute) dtype (MATH §3.1, §3.5)."""
    if amplitude == "softplus":
        return softplus_fp32(x)
    if amplitude == "relu":
        return torch.relu(x)
    if amplitude == "identity":
        return x
    raise ValueError(f"pope amplitude={amplitude!r}: expected softplus, relu or identity")


def _pope_cartesian(x_BHLD: Tensor, pos_BL: Tensor, inv_freq_D: Tensor, phase_bias_HD: Tensor | None,
                    amplitude: str, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """(mu cos phi, mu sin phi) with phi = pos * theta_c (+ phase_bias_hc), all in `dtype`."""
    mu_BHLD = pope_amplitude(x_BHLD.to(dtype), amplitude)
    phase_B1LD = pos_BL.to(dtype)[:, None, :, None] * inv_freq_D.to(dtype)
    if phase_bias_HD is not None:
        phase_B1LD = phase_B1LD + phase_bias_HD.to(dtype)[None, :, None, :]
    return mu_BHLD * torch.cos(phase_B1LD), mu_BHLD * torch.sin(phase_B1LD)


def _check_pope_params(q_BHTD: Tensor, inv_freq_D: Tensor, delta_HD: Tensor | None) -> None:
    H, D = q_BHTD.shape[1], q_BHTD.shape[3]
    if inv_freq_D.shape != (D,):
        raise ValueError(f"pope inv_freq has shape {tuple(inv_freq_D.shape)}, expected ({D},) = head_dim")
    if delta_HD is not None and delta_HD.shape != (H, D):
        raise ValueError(f"pope delta has shape {tuple(delta_HD.shape)}, expected (H, D) = ({H}, {D})")


def pope_expand(q_BHTD: Tensor, k_BGSD: Tensor, *, pos_q_BT: Tensor, pos_k_BS: Tensor,
                inv_freq_D: Tensor, delta_HD: Tensor | None, amplitude: str = "softplus",
                layout: str = "concat") -> tuple[Tensor, Tensor]:
    """Cartesian 2D-wide q_hat_BHT(2D), k_hat_BGS(2D) with <q_hat, k_hat> = PoPE score (MATH §3.3).

    delta is folded into the *query* phase with a minus sign (MATH §3.1: cos(n theta + delta -
    m theta) = cos(n theta - (m theta - delta))), so keys stay shared across GQA groups and
    un-biased in a KV cache. layout "concat" = [x_0..x_{D-1}, y_0..y_{D-1}], "interleaved" =
    [x_0, y_0, x_1, y_1, ...]. Angles, cos/sin and the amplitude are computed in fp32 (float64
    if q is float64); the result has q's dtype. Scale the dot by 1/sqrt(D) (MATH §3.4) yourself.
    """
    _check_qk(q_BHTD, k_BGSD, pos_q_BT, pos_k_BS)
    _check_pope_params(q_BHTD, inv_freq_D, delta_HD)
    if layout not in ("concat", "interleaved"):
        raise ValueError(f"pope layout={layout!r}: expected 'concat' or 'interleaved'")
    dtype = torch.float64 if q_BHTD.dtype == torch.float64 else torch.float32
    neg_delta_HD = None if delta_HD is None else -delta_HD
    xq, yq = _pope_cartesian(q_BHTD, pos_q_BT, inv_freq_D, neg_delta_HD, amplitude, dtype)
    xk, yk = _pope_cartesian(k_BGSD, pos_k_BS, inv_freq_D, None, amplitude, dtype)
    if layout == "concat":
        q_hat, k_hat = torch.cat([xq, yq], dim=-1), torch.cat([xk, yk], dim=-1)
    else:
        q_hat, k_hat = torch.stack([xq, yq], dim=-1).flatten(-2), torch.stack([xk, yk], dim=-1).flatten(-2)
    return q_hat.to(q_BHTD.dtype), k_hat.to(k_BGSD.dtype)


def _pope_scores(q_BHTD: Tensor, k_BHSD: Tensor, pos_q_BT: Tensor, pos_k_BS: Tensor,
                 params: Any, dtype: torch.dtype) -> Tensor:
    # The spec form: delta on the key phase, per query head (keys expanded to H heads first).
    _check_pope_params(q_BHTD, params["inv_freq"], params["delta"])
    xq, yq = _pope_cartesian(q_BHTD, pos_q_BT, params["inv_freq"], None, params["amplitude"], dtype)
    xk, yk = _pope_cartesian(k_BHSD, pos_k_BS, params["inv_freq"], params["delta"], params["amplitude"], dtype)
    return xq @ xk.transpose(-1, -2) + yq @ yk.transpose(-1, -2)


# ----------------------------------------------------------------------------- TAPA and ALiBi


def _signed_distance(pos_q_BT: Tensor, pos_k_BS: Tensor) -> Tensor:
    """m - n as int64 [B, T, S]: exact integer arithmetic before any float conversion."""
    return pos_q_BT.to(torch.int64)[:, :, None] - pos_k_BS.to(torch.int64)[:, None, :]


def _tapa_scores(q_BHTD: Tensor, k_BHSD: Tensor, pos_q_BT: Tensor, pos_k_BS: Tensor,
                 params: Any, dtype: torch.dtype) -> Tensor:
    d_amp, d_phase = tapa_split(q_BHTD.shape[-1], params["theta"])
    q, k = q_BHTD.to(dtype), k_BHSD.to(dtype)
    q_A, q_P = q[..., :d_amp], q[..., d_amp:]  # amplitude first (MATH §4.2)
    k_A, k_P = k[..., :d_amp], k[..., d_amp:]
    amp_BHTS = (q_A @ k_A.transpose(-1, -2)) / math.sqrt(d_amp)
    if params["phase"] == "quadratic":
        phi_BHTS = (q_P @ k_P.transpose(-1, -2)) / math.sqrt(d_phase)
    else:  # linear-phase ablation, Eq. 16 (MATH §4.3): (sum q_P + sum k_P) / sqrt(D_P)
        phi_BHTS = (q_P.sum(-1)[..., :, None] + k_P.sum(-1)[..., None, :]) / math.sqrt(d_phase)
    # |m-n|^alpha in the compute dtype, never in q's dtype (MATH §7.5); 0^alpha = 0 for alpha > 0.
    dist_B1TS = _signed_distance(pos_q_BT, pos_k_BS).abs().to(dtype)[:, None]
    w_B1TS = params["phase_scale"] * dist_B1TS.pow(params["alpha"])
    return amp_BHTS * torch.cos(w_B1TS * phi_BHTS)


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
        return _pope_scores(q_BHTD, k_BHSD, pos_q_BT, pos_k_BS, score_mod.params, dtype)
    return _tapa_scores(q_BHTD, k_BHSD, pos_q_BT, pos_k_BS, score_mod.params, dtype)


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
