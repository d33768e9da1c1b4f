"""Base recipes: the shared training defaults every named recipe derives from.

DESIGN §5.9 / §7 example 3: a paper configuration is a *named function* returning a plain spec
mapping ``{"model", "data", "train", "extend"}`` (the input of ``train.api.run_training`` and of
the orchestrator's stages), derived from these bases with explicit overrides — never a new CLI flag.
Specs are plain JSON-safe dicts, so they hash and log like any YAML grid cell.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from phaselab.workloads.config import merge  # re-exported: recipes derive specs by merging


def pretrain_train(**overrides: Any) -> dict[str, Any]:
    """EXPERIMENTS §1: nanoGPT-style AdamW (β1 0.9, ε 1e-8), linear warm-up then cosine to
    min_lr at decay_steps, grad clip 1.0, weight decay 0.01 on 2-D weights only (δ excluded),
    bf16 autocast on GPU, grad_accum 1."""
    return merge({"schedule": "cosine", "beta1": 0.9, "eps": 1e-8, "weight_decay": 0.01,
                  "grad_clip": 1.0, "grad_accum": 1, "precision": "auto"}, overrides)


def finetune_train(**overrides: Any) -> dict[str, Any]:
    """EXPERIMENTS §2.4 fine-tune recipe (YaRN and PoPE+ft): 500 steps, 20 warm-up steps,
    lr 6e-5 constant after warm-up (no decay), batch 64; other optimiser settings as in the
    pretraining recipe (pass them as overrides)."""
    return pretrain_train(**merge({"steps": 500, "warmup": 20, "lr": 6e-5, "min_lr": 6e-5,
                                   "schedule": "constant", "batch_size": 64}, overrides))


def spec(*, model: Mapping[str, Any] | None, data: Mapping[str, Any], train: Mapping[str, Any],
         extend: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Assemble a training spec (model None = taken from the ``init_from`` checkpoint)."""
    out: dict[str, Any] = {"data": dict(data), "train": dict(train), "extend": extend}
    if model is not None:
        out["model"] = dict(model)
    return out


def model_preset(name: str, kind: str, /, **overrides: Any) -> dict[str, Any]:
    """``models.presets.preset(name)`` with ``pe.kind = kind`` and nested overrides, as a dict."""
    from phaselab.workloads.config import to_dict
    from phaselab.workloads.models.presets import preset

    return to_dict(preset(name, **merge({"pe": {"kind": kind}}, overrides)))
