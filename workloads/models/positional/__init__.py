"""Positional encodings (DESIGN §3.1). `build_pe` makes one attention-side module per layer;
`build_input_pe` makes the embedding-side module of the absolute encodings (or None)."""

from __future__ import annotations

from torch import nn

from phaselab.workloads.models import pe_registry
from phaselab.workloads.models.config import ModelConfig
from phaselab.workloads.models.positional.absolute import LearnedPE, SinusoidalPE
from phaselab.workloads.models.positional.alibi import ALiBi
from phaselab.workloads.models.positional.base import NoPE, PositionalEncoding, with_extension
from phaselab.workloads.models.positional.pope import PoPE
from phaselab.workloads.models.positional.rope import RoPE
from phaselab.workloads.models.positional.tapa import TAPA

__all__ = [
    "TAPA",
    "ALiBi",
    "LearnedPE",
    "NoPE",
    "PoPE",
    "PositionalEncoding",
    "RoPE",
    "SinusoidalPE",
    "build_input_pe",
    "build_pe",
    "with_extension",
]

def build_pe(cfg: ModelConfig) -> PositionalEncoding:
    """A NEW attention-side encoding for one layer (never shared between layers), of the class
    the registry names for `cfg.pe.kind` (built-in, entry point or "module:Class")."""
    cls = pe_registry.load(cfg.pe.kind)
    return cls(cfg.pe, n_head=cfg.n_head, n_kv_head=cfg.kv_heads, head_dim=cfg.head_dim)


def build_input_pe(cfg: ModelConfig) -> nn.Module | None:
    """The embedding-side module of `cfg.pe.kind` (sinusoidal / learned, max_len = block_size), or None."""
    return pe_registry.load(cfg.pe.kind).input_module(cfg)
