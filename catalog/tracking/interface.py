"""The tracker interface: the only part of ``phaselab.catalog`` that workloads may import.

Workloads report through a :class:`Tracker`; they never import mlflow (DESIGN §3.4). This module
imports nothing heavy (no torch, no mlflow, no sqlalchemy) so it is cheap on every worker.

Every evaluation writes its results as :class:`MetricRecord` rows, one documented schema that the
catalog stores in its ``metric`` table:

======== ===================================================================
field    meaning
======== ===================================================================
name     metric name, e.g. ``"ppl"``, ``"nll"``, ``"acc"``, ``"niah_acc"``
value    the number (float)
unit     ``"nats/token"``, ``"ppl"``, ``"fraction"``, ``"tokens/s"``, ...
step     training step the value belongs to (None for a final eval)
context_len  evaluation context length in tokens (None if not applicable)
depth    needle depth in [0, 1] for NIAH (None otherwise)
task     task / dataset name, e.g. ``"blimp"``, ``"pg19"``, ``"indirect_indexing"``
split    ``"train" | "valid" | "test"`` (None if not applicable)
n        number of items (tokens, examples, trials) the value is computed from
stderr   standard error when the evaluator provides one
======== ===================================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True, kw_only=True, slots=True)
class MetricRecord:
    """One evaluation result in the catalog's long format (see the module docstring)."""

    name: str
    value: float
    unit: str = ""
    step: int | None = None
    context_len: int | None = None
    depth: float | None = None
    task: str | None = None
    split: str | None = None
    n: int | None = None
    stderr: float | None = None

    def key(self) -> str:
        """MLflow-friendly metric name, e.g. ``ppl/ctx=4096`` or ``niah_acc/ctx=65536/depth=0.5``."""
        parts = [self.name if self.task is None else f"{self.task}/{self.name}"]
        if self.split is not None:
            parts.append(f"split={self.split}")
        if self.context_len is not None:
            parts.append(f"ctx={self.context_len}")
        if self.depth is not None:
            parts.append(f"depth={self.depth:g}")
        return "/".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@runtime_checkable
class Tracker(Protocol):
    """What a workload may report. Implementations: Null, Recording (tests), MLflow (catalog)."""

    def log_params(self, params: Mapping[str, Any]) -> None: ...

    def log_metrics(self, metrics: Mapping[str, float], *, step: int) -> None: ...

    def log_records(self, records: list[MetricRecord]) -> None: ...

    def log_artifact(self, path: Path, *, name: str) -> None: ...

    def set_tags(self, tags: Mapping[str, str]) -> None: ...


class NullTracker:
    """Discards everything."""

    def log_params(self, params: Mapping[str, Any]) -> None:
        pass

    def log_metrics(self, metrics: Mapping[str, float], *, step: int) -> None:
        pass

    def log_records(self, records: list[MetricRecord]) -> None:
        pass

    def log_artifact(self, path: Path, *, name: str) -> None:
        pass

    def set_tags(self, tags: Mapping[str, str]) -> None:
        pass


@dataclass
class RecordingTracker:
    """Keeps everything in memory, in call order; used by tests and by the stage runner, which
    hands the records to the catalog in one transaction when the stage finishes."""

    params: dict[str, Any] = field(default_factory=dict)
    metrics: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    records: list[MetricRecord] = field(default_factory=list)
    artifacts: dict[str, Path] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)

    def log_params(self, params: Mapping[str, Any]) -> None:
        self.params.update(params)

    def log_metrics(self, metrics: Mapping[str, float], *, step: int) -> None:
        self.metrics.append((step, {k: float(v) for k, v in metrics.items()}))

    def log_records(self, records: list[MetricRecord]) -> None:
        self.records.extend(records)

    def log_artifact(self, path: Path, *, name: str) -> None:
        self.artifacts[name] = Path(path)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self.tags.update(tags)

    def last(self, name: str) -> float | None:
        """Most recent value of a scalar metric, or None if it was never logged."""
        for _, metrics in reversed(self.metrics):
            if name in metrics:
                return metrics[name]
        return None


class FanoutTracker:
    """Sends every call to several trackers (e.g. Recording for the catalog + MLflow)."""

    def __init__(self, *trackers: Tracker) -> None:
        self.trackers = trackers

    def log_params(self, params: Mapping[str, Any]) -> None:
        for t in self.trackers:
            t.log_params(params)

    def log_metrics(self, metrics: Mapping[str, float], *, step: int) -> None:
        for t in self.trackers:
            t.log_metrics(metrics, step=step)

    def log_records(self, records: list[MetricRecord]) -> None:
        for t in self.trackers:
            t.log_records(records)

    def log_artifact(self, path: Path, *, name: str) -> None:
        for t in self.trackers:
            t.log_artifact(path, name=name)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        for t in self.trackers:
            t.set_tags(tags)
