"""Presets match EXPERIMENTS.md; OWT parameter counts within 2 % of 124M / 253M / 774M."""

from __future__ import annotations

import pytest
import torch

from phaselab.workloads.config import ConfigError
from phaselab.workloads.models import ModelConfig, preset
from phaselab.workloads.models.presets import PRESET_NAMES
from phaselab.workloads.models.transformer import Transformer

# (layers, width, heads, head dim, vocab, block, dropout, δ init) from EXPERIMENTS §2.1-§2.3, §3.1
TABLE = {
    "ii-8l512": (8, 512, 8, 64, 66, 48, 0.0, "uniform"),
    "jsb-6l256": (6, 256, 8, 32, 90, 2048, 0.2, "uniform"),
    "maestro-6l384": (6, 384, 8, 48, 328, 2048, 0.1, "uniform"),
    "genome-16l1024": (16, 1024, 16, 64, 4107, 1000, 0.1, "uniform"),
    "owt-124m": (12, 768, 12, 64, 50257, 1024, 0.0, "zero"),
    "owt-253m": (16, 1024, 16, 64, 50257, 1024, 0.0, "zero"),
    "owt-774m": (36, 1280, 20, 64, 50257, 1024, 0.0, "zero"),
}


def _meta_model(cfg: ModelConfig) -> Transformer:
    with torch.device("meta"):  # shapes only: the 774M/8B presets never allocate memory
        return Transformer(cfg)


@pytest.mark.parametrize("name", sorted(TABLE))
def test_preset_matches_experiments_table(name):
    cfg = preset(name)
    layers, width, heads, head_dim, vocab, block, dropout, delta_init = TABLE[name]
    assert (cfg.n_layer, cfg.d_model, cfg.n_head, cfg.head_dim) == (layers, width, heads, head_dim)
    assert (cfg.vocab_size, cfg.block_size, cfg.dropout) == (vocab, block, dropout)
    assert cfg.pe.pope.delta_init == delta_init and cfg.pe.rope.base == cfg.pe.pope.base == 10_000.0
    assert (cfg.mlp, cfg.mlp_ratio, cfg.bias, cfg.tie_embeddings) == ("gelu", 4.0, False, True)
    assert cfg.kv_heads == cfg.n_head


def test_llama_preset():
    cfg = preset("llama-7b")
    assert (cfg.n_layer, cfg.d_model, cfg.n_head, cfg.kv_heads, cfg.head_dim) == (32, 4096, 32, 8, 128)
    assert (cfg.mlp, cfg.mlp_hidden, cfg.tie_embeddings) == ("swiglu", 14336, False)
    assert cfg.pe.rope.base == 5e5 and cfg.pe.tapa.alpha == 0.1 and cfg.pe.tapa.theta == 0.5
    model = _meta_model(preset("llama-7b", pe={"kind": "tapa"}))
    assert model.h[0].attn.pe.d_amp == model.h[0].attn.pe.d_phase == 64  # 64 + 64 (EXPERIMENTS §3.1)
    assert abs(model.num_params() / 8.03e9 - 1) < 0.01  # LLaMA-3-8B shapes


def _analytic_count(cfg: ModelConfig) -> int:
    """Independent count: padded tied embedding + per layer (q,k,v,o + MLP + 2 norms) + final norm."""
    C, L = cfg.d_model, cfg.n_layer
    per_layer = 4 * C * C + 2 * C * cfg.mlp_hidden + 2 * C
    return cfg.padded_vocab_size * C + L * per_layer + C


@pytest.mark.parametrize("name,target", [("owt-124m", 124e6), ("owt-253m", 253e6), ("owt-774m", 774e6)])
def test_owt_parameter_counts(name, target):
    cfg = preset(name)
    assert cfg.padded_vocab_size == 50304
    model = _meta_model(cfg)
    n = model.num_params()
    assert n == _analytic_count(cfg)
    assert abs(n / target - 1) < 0.02, (name, n)
    assert model.num_params(exclude_embeddings=True) == n - 50304 * cfg.d_model
    pope = _meta_model(preset(name, pe={"kind": "pope"}))
    assert pope.num_params() == n + cfg.n_layer * cfg.n_head * cfg.head_dim  # δ [H, D] per layer
    assert abs(pope.num_params() / target - 1) < 0.02


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_every_preset_builds_for_every_kind(name):
    for kind in ("none", "rope", "pope", "tapa", "alibi", "sinusoidal", "learned"):
        model = _meta_model(preset(name, n_layer=1, pe={"kind": kind}))  # head shapes are what matter
        assert type(model.h[0].attn.pe).name == ("none" if kind in ("sinusoidal", "learned") else kind)


def test_overrides_merge_and_validate():
    cfg = preset("owt-124m", pe={"kind": "pope", "pope": {"amplitude": "relu"}}, dropout=0.1)
    assert cfg.pe.kind == "pope" and cfg.pe.pope.amplitude == "relu"
    assert cfg.pe.pope.delta_init == "zero"  # merged, not replaced
    assert cfg.dropout == 0.1 and cfg.n_layer == 12
    with pytest.raises(ConfigError, match=r"did you mean 'n_layer'"):
        preset("tiny", n_layers=3)
    with pytest.raises(ValueError, match="unknown model preset 'owt-125m'"):
        preset("owt-125m")
    base = preset("tiny")
    assert preset("tiny", pe=base.pe) == base  # a config instance is accepted too
