"""``finetune``: PI / NTK / YaRN (or PoPE+ft, no interpolation) fine-tunes (EXPERIMENTS §2.4)."""

from __future__ import annotations

from phaselab.orchestrator.stages.pretrain import ContinuedStage


class FinetuneStage(ContinuedStage):
    kind = "finetune"
    relation = "finetunes"
