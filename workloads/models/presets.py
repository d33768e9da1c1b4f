"""Named model configurations for every experiment in EXPERIMENTS.md (CONTRACTS §3.2).

`preset(name, **overrides)` returns a validated `ModelConfig`; overrides follow
`dataclasses.replace` but nested mappings are merged into the sub-config, and everything goes
through the strict converter (unknown keys raise with a suggestion):

    >>> preset("owt-124m", pe={"kind": "pope"}).pe.pope.delta_init
    'zero'
    >>> preset("llama-7b", n_layer=2, d_model=256, n_head=4, n_kv_head=2).head_dim
    64

Each preset fixes the architecture and the paper's per-experiment PE settings (RoPE/PoPE base,
PoPE δ init: "uniform" for II/JSB/MAESTRO/genome, "zero" for OpenWebText, MATH §3.2); the PE
kind defaults to "rope" and is chosen by the recipe.

Parameter counts (`Transformer.num_params()`): every unique parameter, the token embedding
counted ONCE (tied with the output head) and INCLUDING its padding rows (50257 -> 50304), no
position table for RoPE/PoPE/TAPA, RMSNorm weights, no biases; PoPE adds H*D per layer.
With RoPE: owt-124m 123,587,328; owt-253m 252,871,680; owt-774m 772,271,360 (within 0.4 % of
124M / 253M / 774M; tests/workloads/test_presets.py recomputes them on the meta device).
Excluding the embedding (`num_params(exclude_embeddings=True)`): 84,953,856; 201,360,384;
707,882,240. llama-7b: 8,030,261,248 (LLaMA-3-8B).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from phaselab.workloads.config import from_dict, merge, to_dict
from phaselab.workloads.models.config import ModelConfig

_GPT2_VOCAB = 50_257


def _owt(n_layer: int, d_model: int, n_head: int) -> dict[str, Any]:
    # EXPERIMENTS §2.3: GPT-2 BPE padded to a multiple of 64, block 1024, dropout 0, δ init zero
    return {"vocab_size": _GPT2_VOCAB, "vocab_multiple": 64, "block_size": 1024, "n_layer": n_layer,
            "d_model": d_model, "n_head": n_head, "dropout": 0.0,
            "pe": {"kind": "rope", "pope": {"delta_init": "zero"}}}


_PRESETS: dict[str, dict[str, Any]] = {
    # EXPERIMENTS §2.1: 8 / 512 / 8 / 64, vocab 66, block 48 (EXPERIMENTS §6 #6), δ uniform
    "ii-8l512": {"vocab_size": 66, "block_size": 48, "n_layer": 8, "d_model": 512, "n_head": 8,
                 "dropout": 0.0, "pe": {"kind": "rope", "pope": {"delta_init": "uniform"}}},
    # EXPERIMENTS §2.2: JSB 6 / 256 / 8 / 32, dropout 0.2, vocab 90, max length 2048
    "jsb-6l256": {"vocab_size": 90, "block_size": 2048, "n_layer": 6, "d_model": 256, "n_head": 8,
                  "dropout": 0.2, "pe": {"kind": "rope", "pope": {"delta_init": "uniform"}}},
    # MAESTRO 6 / 384 / 8 / 48, dropout 0.1, REMI vocab 328, max length 2048
    "maestro-6l384": {"vocab_size": 328, "block_size": 2048, "n_layer": 6, "d_model": 384, "n_head": 8,
                      "dropout": 0.1, "pe": {"kind": "rope", "pope": {"delta_init": "uniform"}}},
    # Genome 16 / 1024 / 16 / 64, dropout 0.1, 6-mer vocab 4107, max length 1000
    "genome-16l1024": {"vocab_size": 4107, "block_size": 1000, "n_layer": 16, "d_model": 1024,
                       "n_head": 16, "dropout": 0.1,
                       "pe": {"kind": "rope", "pope": {"delta_init": "uniform"}}},
    "owt-124m": _owt(12, 768, 12),
    "owt-253m": _owt(16, 1024, 16),
    "owt-774m": _owt(36, 1280, 20),
    # EXPERIMENTS §3.1 "LLaMA3 7B": LLaMA-3-8B shapes (32 / 4096 / 32 heads of 128, 8 kv heads,
    # SwiGLU 14336 = 3.5 * 4096, untied, LLaMA-3 vocab 128256), RoPE base 5e5, 8k context.
    "llama-7b": {"vocab_size": 128_256, "block_size": 8192, "n_layer": 32, "d_model": 4096,
                 "n_head": 32, "n_kv_head": 8, "mlp": "swiglu", "mlp_ratio": 3.5,
                 "tie_embeddings": False, "dropout": 0.0,
                 "pe": {"kind": "rope", "rope": {"base": 500_000.0}}},
    # CI: EXPERIMENTS §4 "Indirect Indexing, tiny (2 layers, width 128)"
    "tiny": {"vocab_size": 66, "block_size": 64, "n_layer": 2, "d_model": 128, "n_head": 4,
             "dropout": 0.0, "pe": {"kind": "rope"}},
}

PRESET_NAMES: tuple[str, ...] = tuple(_PRESETS)


def preset_fields(name: str) -> dict[str, Any]:
    """The fields preset `name` sets, as a fresh plain mapping (the rest are ModelConfig's
    defaults); unknown names raise ValueError."""
    if name not in _PRESETS:
        raise ValueError(f"unknown model preset {name!r}; known: {', '.join(PRESET_NAMES)}")
    return copy.deepcopy(_PRESETS[name])


def preset(name: str, **overrides: Any) -> ModelConfig:
    """The ModelConfig of preset `name`, with field overrides (nested mappings are merged; config
    dataclass instances replace the whole sub-config). Unknown names/keys raise ValueError."""
    plain = {k: to_dict(v) if not isinstance(v, Mapping) else v for k, v in overrides.items()}
    # one conversion: from_dict fills every field the preset and the overrides leave out
    return from_dict(ModelConfig, merge(preset_fields(name), plain), path=f"preset[{name}]")
