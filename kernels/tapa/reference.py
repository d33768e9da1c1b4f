"""TAPA's reference in plain torch (MATH §4.2, §4.3): the scores the generic reference
(kernels/attention/reference.py) dispatches a "tapa" ScoreMod to; |m - n|^alpha in the compute
dtype, never in q's dtype (MATH §7.5).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from phaselab.kernels.common.reference_common import _signed_distance
from phaselab.kernels.common.score_mod import tapa_split


def tapa_scores(q_BHTD: Tensor, k_BHSD: Tensor, pos_q_BT: Tensor, pos_k_BS: Tensor,
                params: Any, dtype: torch.dtype) -> Tensor:
    """Unscaled TAPA scores [B, H, T, S] (keys already expanded to H heads), in `dtype`."""
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
