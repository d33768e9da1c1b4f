"""Where a grid names no launcher, a training stage runs in one Ray task unless it has several
workers or ZeRO (then Ray Train): a one-worker stage does not wait for a Ray Train worker group
(~30 s a stage on the H200). A launcher the grid names always wins."""

from __future__ import annotations

import pytest

from phaselab.orchestrator.plan.dag import plan_grid


def _launchers(grid: str, *overrides: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for node in plan_grid(grid, list(overrides)).nodes.values():
        out.setdefault(node.name, set()).add(node.launcher)
    return out


@pytest.mark.parametrize("grid,stage,launcher", [
    ("pope_jsb", "train", "ray_task"),                    # one worker
    ("pope_indirect_indexing", "train", "ray_task"),
    ("pope_maestro", "train", "ray_task"),
    ("tapa_long_context", "pretrain_8k", "ray_train"),    # ZeRO-3 on 64 workers
    ("tapa_long_context", "cpt_32k", "ray_train"),        # cpt inherits the rule
])
def test_a_training_stage_without_a_named_launcher_gets_the_one_it_needs(grid, stage, launcher) -> None:
    assert _launchers(grid)[stage] == {launcher}


def test_a_named_launcher_wins_and_one_worker_with_zero_still_needs_ray_train() -> None:
    assert _launchers("pope_jsb", "+defaults.launcher=ray_train")["train"] == {"ray_train"}
    assert _launchers("pope_jsb", "+defaults.train.zero_stage=2", "defaults.train.cuda_graphs=false")["train"] == {"ray_train"}
    assert _launchers("pope_jsb", "+defaults.resources.num_workers=2")["train"] == {"ray_train"}
