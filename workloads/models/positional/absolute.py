"""Absolute positional encodings added to the token embeddings (MATH §5).

- Sinusoidal (Vaswani et al. 2017): PE[p, 2j] = sin(p / 10000^(2j/C)), PE[p, 2j+1] = cos(same),
  computed from the int64 positions in fp32 at every call (no table, so no length limit).
- Learned: a table [max_len, C]; positions >= max_len raise (MATH §5).
Their attention layers use NoPE. Both return x's contribution [B, T, C] in fp32.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor, nn

from phaselab.workloads.models.config import ContextExtension
from phaselab.workloads.models.positional.base import Fp32Buffers, NoPE, check_positions


class SinusoidalPE(Fp32Buffers):
    name: ClassVar[str] = "sinusoidal"

    def __init__(self, d_model: int, base: float = 10_000.0) -> None:
        super().__init__()
        if d_model % 2:
            raise ValueError(f"sinusoidal positions need an even d_model, got {d_model}")
        j = torch.arange(0, d_model, 2, dtype=torch.float64)
        self.register_fp32_buffer("inv_freq", base ** (-j / d_model))

    def forward(self, pos_BT: Tensor) -> Tensor:
        """pos_BT int64 -> pe_BTC fp32 with interleaved (sin, cos) columns."""
        check_positions(pos_BT)
        angle_BTF = pos_BT.float()[..., None] * self.inv_freq
        return torch.stack([angle_BTF.sin(), angle_BTF.cos()], dim=-1).flatten(-2)

    def check_extension(self, ext: ContextExtension) -> None:
        """Only rule "none" applies (validated per layer by NoPE.extended)."""


class LearnedPE(nn.Module):
    name: ClassVar[str] = "learned"

    def __init__(self, max_len: int, d_model: int) -> None:
        super().__init__()
        self.max_len = max_len
        self.wpe = nn.Embedding(max_len, d_model)

    def forward(self, pos_BT: Tensor) -> Tensor:
        """pos_BT int64 in [0, max_len) -> pe_BTC fp32; out-of-range positions raise."""
        check_positions(pos_BT)
        if pos_BT.numel() and (int(pos_BT.max()) >= self.max_len or int(pos_BT.min()) < 0):
            raise ValueError(f"learned positions cover [0, {self.max_len}); got positions in "
                             f"[{int(pos_BT.min())}, {int(pos_BT.max())}] (MATH §5)")
        return self.wpe(pos_BT).float()

    def check_extension(self, ext: ContextExtension) -> None:
        """A learned table cannot cover positions it never had: a longer block_size raises."""
        if ext.block_size is not None and ext.block_size > self.max_len:
            raise ValueError(f"learned positions cover {self.max_len} positions; extension "
                             f"block_size={ext.block_size} exceeds them")


class SinusoidalNoPE(NoPE):
    """pe.kind "sinusoidal": NoPE in attention (its name stays "none"), `SinusoidalPE` on the embeddings."""

    @classmethod
    def input_module(cls, cfg) -> nn.Module:
        return SinusoidalPE(cfg.d_model)


class LearnedNoPE(NoPE):
    """pe.kind "learned": NoPE in attention (its name stays "none"), a `LearnedPE` table of
    block_size rows on the embeddings."""

    @classmethod
    def input_module(cls, cfg) -> nn.Module:
        return LearnedPE(cfg.block_size, cfg.d_model)
