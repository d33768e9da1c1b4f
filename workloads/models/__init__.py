"""phaselab.workloads.models: configs (torch-free), presets, the Transformer, checkpoints.

Configs and presets import without torch; `Transformer`, `KVCache`, `save_model` and
`load_model` are loaded lazily on first access.
"""

from __future__ import annotations

from typing import Any

from phaselab.workloads.models.config import (
    AlibiConfig,
    AttentionConfig,
    ContextExtension,
    ModelConfig,
    PEConfig,
    PopeConfig,
    RopeConfig,
    TapaConfig,
)
from phaselab.workloads.models.presets import PRESET_NAMES, preset

__all__ = [
    "PRESET_NAMES",
    "AlibiConfig",
    "AttentionConfig",
    "ContextExtension",
    "KVCache",
    "ModelConfig",
    "PEConfig",
    "PopeConfig",
    "RopeConfig",
    "TapaConfig",
    "Transformer",
    "load_model",
    "preset",
    "save_model",
]

_LAZY = {"Transformer": "transformer", "KVCache": "transformer",
         "save_model": "checkpoint_io", "load_model": "checkpoint_io"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module = importlib.import_module(f"phaselab.workloads.models.{_LAZY[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
