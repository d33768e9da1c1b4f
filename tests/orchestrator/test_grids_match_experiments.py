"""The shipped grids carry EXPERIMENTS.md's numbers: the training configuration each paper stage
runs with (steps, warm-up, peak and final learning rate, schedule, batch), read from the grid as
``phaselab plan`` types it, so this checks what runs."""

from __future__ import annotations

import pytest

from phaselab.orchestrator.plan.dag import stage_config

# (grid, stage, axes) -> (steps, warmup, lr, min_lr, schedule, batch_size);
# EXPERIMENTS §2.1, §2.2, §2.3, §2.4, §3.1, §3.2
PAPER = {
    ("pope_indirect_indexing", "train", (("variant", "pope"),)): (100_000, 4000, 2e-4, 2e-5, "cosine", 64),
    ("pope_indirect_indexing", "train", (("variant", "rope"),)): (100_000, 4000, 2e-4, 2e-5, "cosine", 64),
    ("pope_jsb", "train", (("pe", "pope"),)): (3000, 10, 6e-4, 6e-5, "cosine", 4),
    ("pope_maestro", "train", (("pe", "pope"),)): (60_000, 500, 6e-4, 6e-5, "cosine", 16),
    ("pope_genome", "train", (("pe", "pope"),)): (100_000, 4000, 2.5e-4, 2.5e-5, "cosine", 64),
    ("pope_owt_extrapolation", "pretrain", (("size", "124m"), ("pe", "rope"))):
        (100_000, 1000, 6e-4, 6e-5, "cosine", 64),
    ("pope_owt_extrapolation", "yarn_4k", (("size", "124m"), ("pe", "rope"))):
        (500, 20, 6e-5, 6e-5, "constant", 64),
    ("pope_owt_extrapolation", "pope_ft_4k", (("size", "124m"), ("pe", "pope"))):
        (500, 20, 6e-5, 6e-5, "constant", 64),
    ("tapa_long_context", "pretrain_8k", (("pe", "rope"),)): (200_000, 5000, 1e-4, 1e-5, "cosine", 256),
    ("tapa_long_context", "pretrain_8k", (("pe", "tapa"),)): (200_000, 5000, 2e-5, 2e-6, "cosine", 256),
    ("tapa_long_context", "cpt_32k", (("pe", "tapa"),)): (500, 50, 2e-5, 2e-6, "cosine", 128),
}


@pytest.mark.parametrize("case", sorted(PAPER), ids=lambda c: f"{c[0]}:{c[1]}:{dict(c[2])}")
def test_shipped_grids_carry_the_papers_training_numbers(case) -> None:
    grid, stage, axes = case
    steps, warmup, lr, min_lr, schedule, batch = PAPER[case]
    train = stage_config(grid, stage, **dict(axes))["train"]
    assert (train["steps"], train["warmup"], train["schedule"]) == (steps, warmup, schedule)
    assert train["lr"] == pytest.approx(lr, rel=1e-12)
    assert train["min_lr"] == pytest.approx(min_lr, rel=1e-12)
    assert train["batch_size"] == batch


def test_stage_config_names_what_there_is_when_nothing_matches() -> None:
    with pytest.raises(ValueError, match=r"0 stages named 'trian'.*stages: \['test_nll', 'train'\]"):
        stage_config("pope_jsb", "trian", pe="pope")
    with pytest.raises(ValueError, match="0 stages named 'train'"):
        stage_config("pope_jsb", "train", pe="xpos")
