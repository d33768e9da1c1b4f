"""``cpt``: long-context continued pretraining from an upstream checkpoint (EXPERIMENTS §3.2)."""

from __future__ import annotations

from phaselab.orchestrator.stages.pretrain import ContinuedStage


class CptStage(ContinuedStage):
    kind = "cpt"
    relation = "init_from"
