"""The training spec (CONTRACTS §3.4): ``{"model", "data", "train", "extend"}`` mappings converted
strictly into one typed :class:`TrainSpec` (unknown keys are ``ConfigError`` naming the dotted
path), and ``train.eval_splits``, the one key read beside the typed config. Every launcher parses
through here (``api.run_training``, ``ray_entry``, the command line); ``session.TrainSession``
runs the parsed spec."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from phaselab.workloads.config import ConfigError, from_dict
from phaselab.workloads.data import DataConfig
from phaselab.workloads.models.config import ContextExtension, ModelConfig
from phaselab.workloads.train.config import TrainConfig

SPEC_KEYS = ("model", "data", "train", "extend")
EVAL_SPLITS = "eval_splits"


@dataclass(frozen=True, kw_only=True)
class TrainSpec:
    """The typed form of a training spec (model None = take it from ``init_from``)."""

    model: ModelConfig | None = None
    data: DataConfig
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    extend: ContextExtension | None = None


def parse_spec(spec: Mapping[str, Any]) -> TrainSpec:
    """Strictly convert a spec mapping (CONTRACTS §3.1 rules); raises ConfigError.
    ``train.eval_splits`` is read by :func:`periodic_splits`, not by TrainConfig."""
    if not isinstance(spec, Mapping):
        raise TypeError(f"training spec must be a mapping, got {type(spec).__name__}")
    if "data" not in spec:
        raise ConfigError("data: required section of a training spec is missing")
    periodic_splits(spec)
    train = spec.get("train")
    if isinstance(train, Mapping) and EVAL_SPLITS in train:
        spec = {**spec, "train": {k: v for k, v in train.items() if k != EVAL_SPLITS}}
    return from_dict(TrainSpec, spec)


# ``train.eval_splits``: the splits evaluated at every periodic validation. The loop validates
# on "valid"; the others are evaluated through its ``on_eval`` hook, logged as ``<split>/loss``
# and ``<split>/acc`` and their minimum loss kept (EXPERIMENTS §2.2: the minimum test NLL over
# evaluations, labelled as such). Default ["valid"], left out of the typed config.


def parse_eval_splits(raw: Any) -> tuple[str, ...]:
    """A list of split names that includes "valid" (ConfigError naming ``train.eval_splits``)."""
    key = f"train.{EVAL_SPLITS}"
    if not isinstance(raw, (list, tuple)) or not all(isinstance(s, str) and s for s in raw):
        raise ConfigError(f"{key}: expected a list of split names like [valid, test], got {raw!r}")
    if "valid" not in raw or len(set(raw)) != len(raw):
        raise ConfigError(f"{key}: must name 'valid' (the loop's own validation) once, and each "
                          f"split once; got {list(raw)!r}")
    return tuple(raw)


def periodic_splits(spec: Mapping[str, Any]) -> tuple[str, ...]:
    """The splits of ``train.eval_splits`` besides "valid" (empty by default)."""
    train = spec.get("train")
    if not isinstance(train, Mapping) or EVAL_SPLITS not in train:
        return ()
    return tuple(s for s in parse_eval_splits(train[EVAL_SPLITS]) if s != "valid")


def with_eval_splits(resolved: dict[str, Any], spec: Mapping[str, Any]) -> dict[str, Any]:
    """The resolved spec with ``train.eval_splits`` put back when the spec sets other splits."""
    if not periodic_splits(spec):
        return resolved
    return {**resolved, "train": {**resolved["train"], EVAL_SPLITS: list(spec["train"][EVAL_SPLITS])}}
