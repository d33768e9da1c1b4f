"""The model a training run starts from: a fresh one from the spec's model config, or a
pretrained checkpoint's weights re-housed at the new block size and extended (continued
pretraining and fine-tunes, ``init_from``; ``api`` module docstring)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from phaselab.catalog.tracking import run_folder
from phaselab.workloads.config import ConfigError, to_dict
from phaselab.workloads.paths import PathRefused, check_path, shown
from phaselab.workloads.train.checkpoint import CheckpointDir
from phaselab.workloads.train.spec import TrainSpec


def resolve_model_file(path: Path, *, what: str = "init_from") -> Path:
    """``model.pt`` itself, a checkpoint folder holding one, or a run's ``checkpoints/`` / run
    folder (its newest complete checkpoint). ``paths.PathRefused`` (a ValueError naming ``what``
    and the path) when it is no usable path or holds no checkpoint."""
    path = check_path(path, what=what, expect="exists")
    if path.is_file():
        return path
    for candidate in (path, path / run_folder.CHECKPOINTS_DIR):
        if (candidate / run_folder.MODEL_FILE).is_file():
            return candidate / run_folder.MODEL_FILE
        if (candidate / run_folder.LATEST).exists() or any(candidate.glob("step_*")):
            latest = CheckpointDir(candidate).latest()
            if latest is not None:
                return latest / run_folder.MODEL_FILE
    raise PathRefused(f"{what} {shown(path)} holds no model.pt and no complete checkpoint")


def build_model(parsed: TrainSpec, dataset: Any, init_from: Path | None) -> torch.nn.Module:
    """A fresh model from ``parsed.model``, or the ``init_from`` weights re-housed at the new
    block size and extended (module docstring)."""
    from phaselab.workloads.models.transformer import Transformer

    if init_from is None:
        if parsed.model is None:
            raise ConfigError("model: required unless init_from is given")
        if parsed.extend is not None:
            raise ValueError("extend is only meaningful with init_from (a pretrained checkpoint)")
        cfg = parsed.model
        if cfg.block_size < dataset.block_size:
            raise ValueError(f"model.block_size={cfg.block_size} < data block_size={dataset.block_size}")
        if cfg.vocab_size < dataset.vocab_size:
            raise ValueError(f"model.vocab_size={cfg.vocab_size} < dataset vocab_size={dataset.vocab_size}")
        return Transformer(cfg)
    from phaselab.workloads.models.checkpoint_io import load_model

    try:
        source = load_model(resolve_model_file(init_from, what="checkpoint"))
    except PathRefused as err:   # names the file; say that it came from init_from
        raise PathRefused(f"init_from: {err}") from None
    ext = parsed.extend
    block = ext.block_size if ext is not None and ext.block_size is not None else dataset.block_size
    base_cfg = source.cfg
    if parsed.model is not None and dataclasses.replace(parsed.model, block_size=base_cfg.block_size) != base_cfg:
        raise ValueError("spec model differs from the init_from checkpoint's model config apart from "
                         f"block_size: {to_dict(parsed.model)} vs {to_dict(base_cfg)}")
    if block < dataset.block_size:
        raise ValueError(f"extend.block_size={block} < data block_size={dataset.block_size}")
    model = Transformer(dataclasses.replace(base_cfg, block_size=block))
    model.load_state_dict(source.state_dict(), strict=True)
    if ext is not None:
        model.extended(ext)
    return model
