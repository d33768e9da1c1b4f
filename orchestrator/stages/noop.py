"""``noop``: a stage that does no work (optionally it sleeps ``sleep_s``). It is the unit of the
orchestrator-overhead benchmark (200 no-op stages through phaselab vs the same trials through a
Ray Tune grid, ``benchmarks/orchestrator_overhead.py``) and a cheap way to check a
cluster end to end. It takes the normal path (claim -> Ray task -> runner -> finalize_success),
so what it costs is the orchestrator's own cost.

Identical stages collapse to one node (DESIGN §5.4): to get one stage per cell, put an axis value
in ``tag``::

    axes: {product: {i: [0, 1, 2]}}
    stages:
      nothing: {kind: noop, noop: {tag: "${i}", sleep_s: 0.0}}
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from phaselab.catalog.tracking import MetricRecord
from phaselab.orchestrator.stages.base import Stage, StageContext, StageResult, convert_section


@dataclass(frozen=True, kw_only=True)
class NoopConfig:
    """``sleep_s``: seconds the stage sleeps (0: returns at once). ``tag``: any scalar; it only
    enters the cache key, so cells with different tags are different stages."""

    sleep_s: float = 0.0
    tag: str | int | float | None = None

    def __post_init__(self) -> None:
        if not math.isfinite(self.sleep_s) or self.sleep_s < 0:
            raise ValueError(f"sleep_s must be a finite number >= 0, got {self.sleep_s!r}")


class NoopStage(Stage):
    kind = "noop"
    sections = ("noop",)

    def normalize(self, sections: Mapping[str, Any]) -> dict[str, Any]:
        return {"noop": convert_section(NoopConfig, sections.get("noop") or {}, "noop")}

    def run(self, ctx: StageContext) -> StageResult:
        sleep_s = float(ctx.config["noop"]["sleep_s"])
        start = time.monotonic()
        if sleep_s > 0:
            time.sleep(sleep_s)
        slept = time.monotonic() - start
        return StageResult(status="succeeded", metrics={"slept_s": slept}, artifacts={},
                           records=[MetricRecord(name="slept_s", value=slept, unit="s")])
