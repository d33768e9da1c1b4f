"""RoPE context-extension fine-tunes (PI / NTK / YaRN), EXPERIMENTS §2.4 and §4.

- ``owt_finetune(rule)``: 1024 → 4096 on OpenWebText with factor 4. YaRN (and NTK) use the PoPE
  paper's fine-tune recipe (500 steps, 20 warm-up, lr 6e-5 constant); PI uses its own paper's
  budget, ~1000 steps (Chen et al. 2023, arXiv 2306.15595: 1000 steps, lr 2e-5, 20 warm-up,
  AdamW (0.9, 0.95), no weight decay).
- ``char_lm_finetune(rule)``: the offline miniature — the Tiny Shakespeare char LM trained at
  256, fine-tuned at 1024 (factor 4), then perplexity at 256 … 2560 by the eval stage.
"""

from __future__ import annotations

from typing import Any

from phaselab.workloads.recipes.base import finetune_train, merge, spec

RULES = ("pi", "ntk", "yarn")


def _extend(rule: str, *, factor: float, original: int, block: int) -> dict[str, Any]:
    if rule not in RULES:
        raise ValueError(f"unknown extension rule {rule!r}; expected one of {RULES}")
    return {"rule": rule, "factor": factor, "original_max_seq_len": original, "block_size": block}


def pi_train(**overrides: Any) -> dict[str, Any]:
    """PI's fine-tune (arXiv 2306.15595 §3): 1000 steps, lr 2e-5, 20 warm-up, no decay,
    AdamW (0.9, 0.95), weight decay 0, batch 64."""
    return finetune_train(**merge({"steps": 1000, "lr": 2e-5, "min_lr": 2e-5, "warmup": 20,
                                   "beta2": 0.95, "weight_decay": 0.0}, overrides))


def owt_finetune(rule: str = "yarn", *, seed: int = 0, factor: float = 4.0, **train: Any) -> dict[str, Any]:
    """OpenWebText fine-tune at 4096 of a 1024-pretrained RoPE model (model from init_from)."""
    base = pi_train if rule == "pi" else finetune_train
    return spec(
        model=None,
        data={"kind": "openwebtext", "block_size": 4096, "seed": seed},
        train=base(**merge({"beta2": 0.95, "seed": seed, "eval_every": 100, "ckpt_every": 100}, train)),
        extend=_extend(rule, factor=factor, original=1024, block=4096))


def char_lm_finetune(rule: str = "yarn", *, seed: int = 0, steps: int = 200, **train: Any) -> dict[str, Any]:
    """Tiny Shakespeare char LM: 256 → 1024 (factor 4) with a short constant-lr fine-tune."""
    return spec(
        model=None,
        data={"kind": "text", "block_size": 1024, "seed": seed, "text": {"tokenizer": "char"}},
        train=finetune_train(**merge({"steps": steps, "warmup": max(1, steps // 25), "lr": 3e-4,
                                      "min_lr": 3e-4, "batch_size": 8, "beta2": 0.99,
                                      "eval_every": max(1, steps // 4), "eval_batches": 4,
                                      "ckpt_every": max(1, steps // 4), "seed": seed}, train)),
        extend=_extend(rule, factor=4.0, original=256, block=1024))
