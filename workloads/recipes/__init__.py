"""Named recipes for the paper configurations (DESIGN §5.9, §7 example 3).

    from phaselab.workloads.recipes import recipe, recipe_names
    spec = recipe("pope.ii_paper")(pe="rope", seed=1)      # a plain training spec mapping

Recipes are resolved lazily from "module:function" strings, so importing this package imports
nothing heavy.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

_RECIPES: dict[str, str] = {
    "pope.ii_paper": "phaselab.workloads.recipes.pope:ii_paper",
    "pope.ii_tiny": "phaselab.workloads.recipes.pope:ii_tiny",
    "pope.ii_demo": "phaselab.workloads.recipes.pope:ii_demo",
    "pope.jsb": "phaselab.workloads.recipes.pope:jsb",
    "pope.maestro": "phaselab.workloads.recipes.pope:maestro",
    "pope.genome": "phaselab.workloads.recipes.pope:genome",
    "pope.owt": "phaselab.workloads.recipes.pope:owt",
    "pope.owt_finetune_yarn": "phaselab.workloads.recipes.pope:owt_finetune_yarn",
    "pope.owt_finetune_pope": "phaselab.workloads.recipes.pope:owt_finetune_pope",
    "pope.shakespeare_char": "phaselab.workloads.recipes.pope:shakespeare_char",
    "tapa.llama7b_pretrain": "phaselab.workloads.recipes.tapa:llama7b_pretrain",
    "tapa.cpt_32k": "phaselab.workloads.recipes.tapa:cpt_32k",
    "tapa.tapa_owt124m": "phaselab.workloads.recipes.tapa:tapa_owt124m",
    "extension.owt_finetune": "phaselab.workloads.recipes.extension:owt_finetune",
    "extension.char_lm_finetune": "phaselab.workloads.recipes.extension:char_lm_finetune",
}


def recipe_names() -> tuple[str, ...]:
    return tuple(sorted(_RECIPES))


def recipe(name: str) -> Callable[..., dict[str, Any]]:
    """The recipe function registered as ``name`` (ValueError naming the known ones)."""
    if name not in _RECIPES:
        raise ValueError(f"unknown recipe {name!r}; known: {', '.join(recipe_names())}")
    module, fn = _RECIPES[name].split(":")
    return getattr(importlib.import_module(module), fn)
