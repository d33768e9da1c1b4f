"""Model checkpoints with the config embedded (CONTRACTS §3.2).

File format (torch.save of a dict; loaded with weights_only=True):
    {"format": "phaselab.model/1", "config_json": json of to_dict(model.cfg),
     "state_dict": model.state_dict()}
Writes are atomic: a temporary file in the same directory, then os.replace, so a reader never
sees a half-written checkpoint. An extended model (RoPE rule changed) stores its new config and
reloads as the extended model. A file that is not such a checkpoint is refused as
:class:`UnreadableCheckpoint` (a ValueError naming the file), never loaded as arbitrary pickle.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import tempfile
import warnings
from pathlib import Path

import torch

from phaselab.workloads.config import from_dict, to_dict
from phaselab.workloads.models.config import ModelConfig
from phaselab.workloads.models.transformer import Transformer
from phaselab.workloads.paths import PathRefused, check_path, shown

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


class UnreadableCheckpoint(PathRefused):
    """A checkpoint file that is not one: truncated, garbage, another format, or a pickle that
    ``weights_only`` loading refuses (arbitrary code is never run)."""


# What torch.load and the strict rebuild raise on a damaged or foreign file: RuntimeError (torch's
# zip reader, a state_dict of other shapes), UnpicklingError (garbage, or a pickle naming code),
# EOFError (truncated), KeyError/TypeError/ValueError (a dict without our fields, bad JSON).
_DAMAGED = (RuntimeError, pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError,
            AttributeError, IndexError, OSError)


def _reason(err: BaseException) -> str:
    """One short line saying why a load failed (torch's messages run to paragraphs)."""
    text = " ".join(str(err).split())
    if isinstance(err, pickle.UnpicklingError):   # never suggest weights_only=False, as torch's text does
        found = re.search(r"(Unsupported (?:global: GLOBAL \S+|operand \d+))", text)
        return ("it holds objects other than tensors and plain containers, refused unrun"
                + (f" ({found.group(1)[:120]})" if found else ""))
    first = text.split(". ")[0]
    return f"{type(err).__name__}: {first[:160]}" if first else type(err).__name__


def _read(path: str | os.PathLike, map_location: str | torch.device) -> dict:
    path = check_path(path, what="checkpoint", expect="file")
    try:
        with warnings.catch_warnings():   # torch warns about the pickle protocol of foreign files
            warnings.simplefilter("ignore")
            payload = torch.load(path, map_location=map_location, weights_only=True)
    except _DAMAGED as err:
        raise UnreadableCheckpoint(f"checkpoint {shown(path)} is not a readable {FORMAT} file ({_reason(err)}); "
                                   "it may be truncated or not a model.pt") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise UnreadableCheckpoint(f"checkpoint {shown(path)}: not a {FORMAT} checkpoint (format={found!r})")
    return payload


def _config(path: str | os.PathLike, payload: dict) -> ModelConfig:
    try:
        return from_dict(ModelConfig, json.loads(payload["config_json"]), path="checkpoint.model")
    except _DAMAGED as err:   # ConfigError is a ValueError
        raise UnreadableCheckpoint(f"checkpoint {shown(path)} holds no valid model config ({_reason(err)})") from None


def load_config(path: str | os.PathLike) -> ModelConfig:
    """The ModelConfig embedded in a checkpoint (strictly parsed); UnreadableCheckpoint if none."""
    return _config(path, _read(path, "cpu"))


def load_model(path: str | os.PathLike, *, map_location: str | torch.device = "cpu") -> Transformer:
    """Rebuild the Transformer from the embedded config and load its weights (strict);
    UnreadableCheckpoint when the file is damaged or its weights do not fit its config."""
    payload = _read(path, map_location)
    model = Transformer(_config(path, payload))
    try:
        model.load_state_dict(payload["state_dict"], strict=True)
    except _DAMAGED as err:
        raise UnreadableCheckpoint(f"checkpoint {shown(path)}: its weights do not fit its model config "
                                   f"({_reason(err)})") from None
    return model.to(map_location)
