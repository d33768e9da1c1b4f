"""Every named recipe builds a spec that the training entry accepts strictly, and the paper
recipes carry EXPERIMENTS.md's numbers (steps, warm-up, peak lr, schedule)."""

from __future__ import annotations

import pytest

from phaselab.workloads.recipes import recipe, recipe_names
from phaselab.workloads.train.api import parse_spec

# name -> (steps, warmup, lr, schedule), from EXPERIMENTS §2.1, §2.2, §2.3, §2.4, §3.1, §3.2
PAPER = {
    "pope.ii_paper": (100_000, 4000, 2e-4, "cosine"),
    "pope.jsb": (3000, 10, 6e-4, "cosine"),
    "pope.maestro": (60_000, 500, 6e-4, "cosine"),
    "pope.genome": (100_000, 4000, 2.5e-4, "cosine"),
    "pope.owt": (100_000, 1000, 6e-4, "cosine"),
    "pope.owt_finetune_yarn": (500, 20, 6e-5, "constant"),
    "pope.owt_finetune_pope": (500, 20, 6e-5, "constant"),
    "tapa.llama7b_pretrain": (200_000, 5000, 2e-5, "cosine"),
    "tapa.cpt_32k": (500, 50, 2e-5, "cosine"),
}


@pytest.mark.parametrize("name", recipe_names())
def test_every_recipe_parses_strictly(name: str) -> None:
    parsed = parse_spec(recipe(name)())
    assert parsed.train.steps > 0 and parsed.train.lr > 0


@pytest.mark.parametrize("name", sorted(PAPER))
def test_paper_recipes_match_experiments(name: str) -> None:
    steps, warmup, lr, schedule = PAPER[name]
    t = parse_spec(recipe(name)()).train
    assert (t.steps, t.warmup, t.schedule) == (steps, warmup, schedule)
    assert t.lr == pytest.approx(lr, rel=1e-12)


def test_unknown_recipe_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="pope.jsb"):
        recipe("pope.jbs")
