"""TAPA (MATH §4): the score A·cos(phase_scale·|m-n|^α·Φ) computed inside the kernel.

TAPA adds no parameters and applies no rotation: q and k reach the backend raw, the softmax
scale is 1.0 (the amplitude term carries its own 1/sqrt(θD), MATH §4.2). The amplitude/phase
split D_A = int(θD) is validated when the layer is built (`tapa_split` raises; no clamping).
"""

from __future__ import annotations

from typing import ClassVar

from phaselab.kernels.common.score_mod import ScoreMod, tapa_split
from phaselab.workloads.models.config import PEConfig
from phaselab.workloads.models.positional.base import PositionalEncoding


class TAPA(PositionalEncoding):
    name: ClassVar[str] = "tapa"

    def __init__(self, pe_cfg: PEConfig, *, n_head: int, n_kv_head: int, head_dim: int) -> None:
        super().__init__(pe_cfg, n_head=n_head, n_kv_head=n_kv_head, head_dim=head_dim)
        self.cfg = pe_cfg.tapa
        self.d_amp, self.d_phase = tapa_split(head_dim, self.cfg.theta)
        self._score_mod = ScoreMod(kind="tapa", params={
            "alpha": self.cfg.alpha, "theta": self.cfg.theta,
            "phase_scale": self.cfg.phase_scale, "phase": self.cfg.phase})

    def score_mod(self) -> ScoreMod:
        return self._score_mod

    def softmax_scale(self, head_dim: int) -> float:
        """1.0: no separate 1/sqrt(D) (MATH §4.2)."""
        return 1.0

    def extra_repr(self) -> str:
        c = self.cfg
        return (f"{super().extra_repr()}, alpha={c.alpha}, D_A={self.d_amp}, D_P={self.d_phase}, "
                f"phase_scale={c.phase_scale:.6g}, phase={c.phase!r}")
