"""xPos (Sun et al., "A Length-Extrapolatable Transformer", arXiv 2212.10554, §3.2) as a phaselab
encoding: a q/k transform. Pair i of q at position n is rotated by n·θ_i (RoPE, half-split pairs)
and scaled by ζ_i^(n/γ); pair i of k at position m by m·θ_i and ζ_i^(-m/γ), so that the score
decays as ζ_i^((n-m)/γ). θ_i = base^(-2i/D), ζ_i = (2i/D + γ')/(1 + γ') (the paper's γ' = 0.4).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from phaselab.workloads.models.positional.base import PositionalEncoding


@dataclass(frozen=True, kw_only=True)
class XPosConfig:
    base: float = 10_000.0
    scale_base: float = 512.0   # γ
    gamma: float = 0.4          # γ'

    def __post_init__(self) -> None:
        if not (self.base > 1.0 and self.scale_base > 0.0 and self.gamma > 0.0):
            raise ValueError(f"xpos needs base > 1, scale_base > 0, gamma > 0; got {self}")


class XPos(PositionalEncoding):
    config_cls = XPosConfig

    def __init__(self, pe_cfg, *, n_head: int, n_kv_head: int, head_dim: int) -> None:
        super().__init__(pe_cfg, n_head=n_head, n_kv_head=n_kv_head, head_dim=head_dim)
        i = torch.arange(0, head_dim, 2, dtype=torch.float64)
        self.register_fp32_buffer("inv_freq", self.config.base ** (-i / head_dim))
        self.register_fp32_buffer("zeta", (i / head_dim + self.config.gamma) / (1 + self.config.gamma))

    def _apply_xpos(self, x, pos, sign: float):
        angle = pos[..., None, None].float() * self.inv_freq            # [B, T, 1, D/2]
        scale = self.zeta ** (sign * pos[..., None, None].float() / self.config.scale_base)
        x1, x2 = x.float().chunk(2, dim=-1)
        cos, sin = angle.cos() * scale, angle.sin() * scale
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)

    def prepare_qk(self, q_BTHD, k_BSGD, pos_q_BT, pos_k_BS):
        return self._apply_xpos(q_BTHD, pos_q_BT, 1.0), self._apply_xpos(k_BSGD, pos_k_BS, -1.0)
