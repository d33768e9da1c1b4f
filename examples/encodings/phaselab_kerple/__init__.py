"""KERPLE-log (Chi et al., "KERPLE: Kernelized Relative Positional Embedding for Length
Extrapolation", arXiv 2205.09921, Eq. 8) as a phaselab encoding: a learnable score modification,
score - r1_h · log(1 + r2_h · |n - m|), with r1_h, r2_h > 0 learned per head and per layer
(kept positive by a softplus of fp32 parameters). The score depends only on the head and the
distance, so it is declared as a table over distances (`bias_table`): on CUDA it runs in
phaselab's bias-table kernel, whose backward reduces the table's gradient to r1 and r2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from phaselab.workloads.models.positional.base import PositionalEncoding


@dataclass(frozen=True, kw_only=True)
class KerpleConfig:
    r1_init: float = 1.0
    r2_init: float = 1.0

    def __post_init__(self) -> None:
        if not (self.r1_init > 0.0 and self.r2_init > 0.0):
            raise ValueError(f"kerple needs r1_init > 0 and r2_init > 0; got {self}")


def _inv_softplus(y: float) -> float:
    return y + math.log(-math.expm1(-y))


class Kerple(PositionalEncoding):
    config_cls = KerpleConfig

    def __init__(self, pe_cfg, *, n_head: int, n_kv_head: int, head_dim: int) -> None:
        super().__init__(pe_cfg, n_head=n_head, n_kv_head=n_kv_head, head_dim=head_dim)
        raw = [_inv_softplus(self.config.r1_init), _inv_softplus(self.config.r2_init)]
        self.raw_r = nn.Parameter(torch.tensor(raw, dtype=torch.float32)[:, None].repeat(1, n_head))

    def bias_table(self, dist, dtype):
        r1, r2 = F.softplus(self.raw_r.to(dtype))[:, :, None]   # [H, 1] each
        return -r1 * torch.log1p(r2 * dist.abs().to(dtype))     # [H, len(dist)]
