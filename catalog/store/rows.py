"""Value types of the catalog API (re-exported by ``phaselab.catalog.store.api``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from phaselab.catalog.store.schema import STATES


class StateError(ValueError):
    """A stage is not in a state that allows the requested operation."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StageSpec:
    """What the orchestrator knows about a stage before it runs (one ``stage`` row)."""

    stage_hash: str
    kind: str
    config: Mapping[str, Any]
    cache_key_parts: Mapping[str, Any]
    name: str | None = None
    state: str = "PLANNED"
    ray_run_name: str | None = None
    storage_uri: str | None = None

    def __post_init__(self) -> None:
        check_hash(self.stage_hash)
        if not isinstance(self.kind, str) or not 0 < len(self.kind) <= 32:
            raise ValueError(f"stage kind must be a 1..32 character string, got {self.kind!r}")
        check_state(self.state)


@dataclass(frozen=True, kw_only=True, slots=True)
class ArtifactSpec:
    """A committed output of a stage: where it is and its digest."""

    name: str
    uri: str
    sha256: str
    bytes: int
    kind: str

    def __post_init__(self) -> None:
        if not isinstance(self.sha256, str) or len(self.sha256) != 64 or \
                any(c not in "0123456789abcdef" for c in self.sha256):
            raise ValueError(f"artifact {self.name!r}: sha256 must be 64 lowercase hex digits, "
                             f"got {self.sha256!r}")
        if isinstance(self.bytes, bool) or not isinstance(self.bytes, int) or self.bytes < 0:
            raise ValueError(f"artifact {self.name!r}: bytes must be an int >= 0, got {self.bytes!r}")
        if not self.uri or not self.name:
            raise ValueError(f"artifact needs a name and a uri, got name={self.name!r} uri={self.uri!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class StageRow:
    """A read-only snapshot of one ``stage`` row."""

    stage_hash: str
    kind: str
    name: str | None
    config: dict[str, Any]
    cache_key_parts: dict[str, Any]
    env: dict[str, Any] | None
    state: str
    failure_class: str | None
    message: str | None
    attempts: int
    owner: str | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    heartbeat_at: datetime | None
    gpu_seconds: float | None
    ray_run_name: str | None
    storage_uri: str | None
    mlflow_run_id: str | None
    backend: str | None
    node_id: str | None = None   # Ray node of the latest attempt

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any]) -> StageRow:
        return cls(**{f.name: m[f.name] for f in fields(cls)})


def check_hash(stage_hash: Any) -> None:
    if not isinstance(stage_hash, str) or not 0 < len(stage_hash) <= 64:
        raise ValueError(f"stage_hash must be a 1..64 character string, got {stage_hash!r}")


def check_state(state: Any) -> None:
    if state not in STATES:
        raise ValueError(f"unknown stage state {state!r}; expected one of {STATES}")
