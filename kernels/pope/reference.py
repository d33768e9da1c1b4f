"""PoPE's reference in plain torch (MATH §3): the amplitude, the Cartesian expansion to 2D-wide
q_hat / k_hat, and the scores the generic reference (kernels/attention/reference.py) dispatches a
"pope" ScoreMod to. Angles, cos/sin and the amplitude in fp32 (float64 for gradcheck).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from phaselab.kernels.common.reference_common import _check_qk

SOFTPLUS_THRESHOLD = 20.0  # PyTorch's softplus threshold (beta = 1); MATH §7.3


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


def pope_scores(q_BHTD: Tensor, k_BHSD: Tensor, pos_q_BT: Tensor, pos_k_BS: Tensor,
                params: Any, dtype: torch.dtype) -> Tensor:
    """Unscaled PoPE scores [B, H, T, S] (keys already expanded to H heads), in `dtype`."""
    # The spec form: delta on the key phase, per query head (keys expanded to H heads first).
    _check_pope_params(q_BHTD, params["inv_freq"], params["delta"])
    xq, yq = _pope_cartesian(q_BHTD, pos_q_BT, params["inv_freq"], None, params["amplitude"], dtype)
    xk, yk = _pope_cartesian(k_BHSD, pos_k_BS, params["inv_freq"], params["delta"], params["amplitude"], dtype)
    return xq @ xk.transpose(-1, -2) + yq @ yk.transpose(-1, -2)
