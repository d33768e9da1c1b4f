"""ALiBi (Press et al., arXiv 2108.12409; MATH §5): logit += -slope_h·(m - n) inside the kernel,
declared as a distance table (`bias_table`), so it runs in the bias-table kernel on CUDA.

"ALiBi half-heads" (the PoPE paper's ablation, EXPERIMENTS §2.1) applies it to the first
round(heads_fraction·H) heads and NoPE to the rest (EXPERIMENTS §6 #14). The geometric slopes
2^(-8j/H_a) come from `kernels.common.score_mod.alibi_slopes` (one home per formula).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from phaselab.kernels.common.score_mod import alibi_slopes, alibi_table
from phaselab.workloads.models.config import PEConfig
from phaselab.workloads.models.positional.base import PositionalEncoding


class ALiBi(PositionalEncoding):
    name: ClassVar[str] = "alibi"

    def __init__(self, pe_cfg: PEConfig, *, n_head: int, n_kv_head: int, head_dim: int) -> None:
        super().__init__(pe_cfg, n_head=n_head, n_kv_head=n_kv_head, head_dim=head_dim)
        cfg = pe_cfg.alibi
        n_alibi = max(1, round(cfg.heads_fraction * n_head))
        if cfg.slopes == "geometric":
            slopes = alibi_slopes(n_head, n_alibi)
        else:
            if len(cfg.slopes) != n_alibi:
                raise ValueError(f"alibi.slopes has {len(cfg.slopes)} values, expected one per ALiBi "
                                 f"head ({n_alibi} = round({cfg.heads_fraction} * {n_head}))")
            slopes = torch.zeros(n_head, dtype=torch.float32)
            slopes[:n_alibi] = torch.tensor(cfg.slopes, dtype=torch.float32)
        self.n_alibi = n_alibi
        self.register_fp32_buffer("slopes", slopes)

    def bias_table(self, dist: Tensor, dtype: torch.dtype) -> Tensor:
        """-slope_h·(m - n) at the signed distances `dist` (MATH §5): a fixed table, so ALiBi runs
        in the bias-table kernel on CUDA (kernels/relbias) with no gradient to reduce."""
        return alibi_table(self.slopes, dist, dtype)

    def score(self, score: Tensor, q_pos: Tensor, k_pos: Tensor, head: Tensor) -> Tensor:
        """score - slope_h·(m - n), the same bias per element in the interface's general form (the
        backends run `bias_table`, which `score_mod` declares)."""
        return score - self.slopes.to(score.dtype)[head] * (q_pos - k_pos).to(score.dtype)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, alibi_heads={self.n_alibi}"
