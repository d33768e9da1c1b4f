"""The registry of stage kinds: one instance per kind, by name.

Whatever depends on the kinds (the grid schema's sections and per-kind rules, the DAG's inputs,
edges and resources, the controller's Ray options and child stages, the plan view, ``verify``,
``gc``) reads this registry and the declarations of each stage (``base.Stage``); nothing else
lists kinds. Adding a kind is writing its module (a ``Stage`` subclass: declarations,
``normalize``, ``run``) and adding an instance to ``BUILTIN``; a plugin or a test calls
:func:`register` instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from phaselab.orchestrator.stages.analysis import AnalysisStage
from phaselab.orchestrator.stages.base import Resources, SectionError, Stage, StageContext, StageResult
from phaselab.orchestrator.stages.cpt import CptStage
from phaselab.orchestrator.stages.dataset import DatasetStage, data_digest
from phaselab.orchestrator.stages.evaluate import EvalStage
from phaselab.orchestrator.stages.finetune import FinetuneStage
from phaselab.orchestrator.stages.noop import NoopStage
from phaselab.orchestrator.stages.pretrain import PretrainStage
from phaselab.orchestrator.stages.tune import TuneStage

# Registration order is the order kinds and sections are listed in errors and in the grid
# schema (pretrain first: its sections model, data, train lead).
BUILTIN: tuple[Stage, ...] = (PretrainStage(), DatasetStage(), CptStage(), FinetuneStage(), EvalStage(),
                              AnalysisStage(), TuneStage(), NoopStage())

STAGES: dict[str, Stage] = {}


def register(stage: Stage) -> Stage:
    """Add a stage kind (an instance of a ``Stage`` subclass). Registering the same instance
    again is a no-op; another instance under a registered name is refused."""
    if not isinstance(stage, Stage):
        raise TypeError(f"register() takes a Stage instance, got {stage!r}")
    known = STAGES.get(stage.kind)
    if known is not None and known is not stage:
        raise ValueError(f"stage kind {stage.kind!r} is already registered ({type(known).__name__})")
    STAGES[stage.kind] = stage
    return stage


def unregister(kind: str) -> None:
    """Remove a kind added by :func:`register` (built-in kinds stay)."""
    if any(s.kind == kind for s in BUILTIN):
        raise ValueError(f"stage kind {kind!r} is built in")
    STAGES.pop(kind, None)


@contextlib.contextmanager
def registered(stage: Stage) -> Iterator[Stage]:
    """``stage`` registered for the duration of the block, whatever was registered under its
    name before restored after (a built-in kind can only be replaced by its own class)."""
    previous = STAGES.get(stage.kind)
    builtin = next((b for b in BUILTIN if b.kind == stage.kind), None)
    if builtin is not None and type(builtin) is not type(stage):
        raise ValueError(f"stage kind {stage.kind!r} is built in ({type(builtin).__name__})")
    STAGES[stage.kind] = stage
    try:
        yield stage
    finally:
        if previous is None:
            STAGES.pop(stage.kind, None)
        else:
            STAGES[stage.kind] = previous


def section_names() -> tuple[str, ...]:
    """Every config section some registered kind reads, in registration order."""
    return tuple(dict.fromkeys(sec for stage in STAGES.values() for sec in stage.sections))


def child_kinds() -> frozenset[str]:
    """Catalog kinds of the child stages registered kinds report (tune's trials)."""
    return frozenset(s.child_kind for s in STAGES.values() if s.child_kind)


def storage_roots() -> frozenset[str]:
    """Folders under the runs root that the kinds' launchers share between stages."""
    return frozenset(root for s in STAGES.values() for root in s.storage_roots)


for _stage in BUILTIN:
    register(_stage)

__all__ = ["BUILTIN", "STAGES", "Resources", "SectionError", "Stage", "StageContext", "StageResult",
           "child_kinds", "data_digest", "register", "registered", "section_names", "storage_roots",
           "unregister"]
