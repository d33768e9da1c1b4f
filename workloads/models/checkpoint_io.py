"""Model checkpoints with the config embedded (CONTRACTS §3.2).

File format (torch.save of a dict; loaded with weights_only=True):
    {"format": "phaselab.model/1", "config_json": json of to_dict(model.cfg),
     "state_dict": model.state_dict()}
Writes are atomic: a temporary file in the same directory, then os.replace, so a reader never
sees a half-written checkpoint. An extended model (RoPE rule changed) stores its new config and
reloads as the extended model.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch

from phaselab.workloads.config import from_dict, to_dict
from phaselab.workloads.models.config import ModelConfig
from phaselab.workloads.models.transformer import Transformer

FORMAT = "phaselab.model/1"


def save_model(model: Transformer, path: str | os.PathLike) -> Path:
    """Atomically write `model`'s config and weights to `path`; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"format": FORMAT, "config_json": json.dumps(to_dict(model.cfg), sort_keys=True),
               "state_dict": model.state_dict()}
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _read(path: str | os.PathLike, map_location: str | torch.device) -> dict:
    payload = torch.load(Path(path), map_location=map_location, weights_only=True)
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise ValueError(f"{path}: not a {FORMAT} checkpoint (format={found!r})")
    return payload


def load_config(path: str | os.PathLike) -> ModelConfig:
    """The ModelConfig embedded in a checkpoint (strictly parsed)."""
    payload = _read(path, "cpu")
    return from_dict(ModelConfig, json.loads(payload["config_json"]), path="checkpoint.model")


def load_model(path: str | os.PathLike, *, map_location: str | torch.device = "cpu") -> Transformer:
    """Rebuild the Transformer from the embedded config and load its weights (strict)."""
    payload = _read(path, map_location)
    cfg = from_dict(ModelConfig, json.loads(payload["config_json"]), path="checkpoint.model")
    model = Transformer(cfg)
    model.load_state_dict(payload["state_dict"], strict=True)
    return model.to(map_location)
