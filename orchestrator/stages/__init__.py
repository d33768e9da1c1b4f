"""phaselab.orchestrator.stages: the stage kinds (DESIGN §3.3, plus ``tune``), by kind name."""

from __future__ import annotations

from phaselab.orchestrator.stages.analysis import AnalysisStage
from phaselab.orchestrator.stages.base import Resources, Stage, StageContext, StageResult
from phaselab.orchestrator.stages.cpt import CptStage
from phaselab.orchestrator.stages.dataset import DatasetStage, data_digest
from phaselab.orchestrator.stages.evaluate import EvalStage
from phaselab.orchestrator.stages.finetune import FinetuneStage
from phaselab.orchestrator.stages.noop import NoopStage
from phaselab.orchestrator.stages.pretrain import PretrainStage
from phaselab.orchestrator.stages.tune import TuneStage

STAGES: dict[str, Stage] = {s.kind: s for s in (DatasetStage(), PretrainStage(), CptStage(),
                                                  FinetuneStage(), EvalStage(), AnalysisStage(), TuneStage(),
                                                  NoopStage())}

# Lineage relation of a stage to its upstream (catalog schema RELATIONS).
RELATION = {"pretrain": "uses", "cpt": "init_from", "finetune": "finetunes", "eval": "evaluates",
            "analysis": "evaluates", "dataset": "uses", "tune": "uses", "trial": "uses",
            "noop": "uses"}

__all__ = ["RELATION", "STAGES", "Resources", "Stage", "StageContext", "StageResult", "data_digest"]
