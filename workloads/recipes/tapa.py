"""TAPA paper recipes (EXPERIMENTS §3): LLaMA-3 "7B" pretraining, the 32k continued pretraining
variants of §3.2, and the scaled-down 124M TAPA of §3.5.
"""

from __future__ import annotations

from typing import Any

from phaselab.workloads.recipes.base import merge, model_preset, pretrain_train, spec

# EXPERIMENTS §3.1: per-method peak lr (the paper did NOT train both at one lr; §6 #20).
PRETRAIN_LR = {"rope": 1e-4, "tapa": 2e-5}

# EXPERIMENTS §3.2 variants: the ContextExtension each one applies to the 8k-pretrained model.
CPT_VARIANTS: dict[str, dict[str, Any]] = {
    "tapa": {"rule": "none"},
    "rope-5e5": {"rule": "none"},  # b = 5e5 unchanged
    "rope-2e8": {"rule": "none", "base": 2e8},
    "pi": {"rule": "pi", "factor": 8.0, "original_max_seq_len": 8192},  # L' = 65 536
    "yarn": {"rule": "yarn", "factor": 8.0, "original_max_seq_len": 8192},  # β 32/1, index ramp
}


def llama7b_pretrain(pe: str = "tapa", *, seed: int = 0, lr: float | None = None,
                     **train: Any) -> dict[str, Any]:
    """§3.1: LLaMA-3-shaped 7B, Pile chunked to 8k (pre-tokenised shards), global batch
    256 × 8192, 200 000 steps (420 B tokens), AdamW (0.9, 0.95), ε 1e-8, no weight decay,
    5000 warm-up, cosine to 0.1 × peak; peak 1e-4 (RoPE) / 2e-5 (TAPA); TAPA α 0.1, θ 0.5."""
    if lr is None:
        if pe not in PRETRAIN_LR:
            raise ValueError(f"no paper lr for pe={pe!r}; pass lr= explicitly ({PRETRAIN_LR})")
        lr = PRETRAIN_LR[pe]
    return spec(
        model=model_preset("llama-7b", pe, pe={"tapa": {"alpha": 0.1, "theta": 0.5}}),
        data={"kind": "tokens", "block_size": 8192, "seed": seed},
        train=pretrain_train(**merge({"steps": 200_000, "batch_size": 256, "lr": lr, "min_lr": 0.1 * lr,
                                      "warmup": 5000, "beta2": 0.95, "weight_decay": 0.0,
                                      "eval_every": 2000, "ckpt_every": 1000, "zero_stage": 3,
                                      "seed": seed}, train)))


def cpt_32k(variant: str = "tapa", *, seed: int = 0, **train: Any) -> dict[str, Any]:
    """§3.2: continued pretraining on PG-19 chunked to 32k: global batch 128, 500 steps, peak
    lr 2e-5 for every method, 50 warm-up steps, otherwise as in pretraining (AdamW 0.9/0.95,
    no weight decay, cosine to 0.1 × peak). The model comes from ``init_from``."""
    if variant not in CPT_VARIANTS:
        raise ValueError(f"unknown 32k CPT variant {variant!r}; expected one of {list(CPT_VARIANTS)}")
    return spec(
        model=None,
        data={"kind": "pg19", "block_size": 32_768, "seed": seed},
        train=pretrain_train(**merge({"steps": 500, "batch_size": 128, "lr": 2e-5, "min_lr": 2e-6,
                                      "warmup": 50, "beta2": 0.95, "weight_decay": 0.0,
                                      "eval_every": 100, "ckpt_every": 50, "zero_stage": 3,
                                      "seed": seed}, train)),
        extend={**CPT_VARIANTS[variant], "block_size": 32_768})


def tapa_owt124m(pe: str = "tapa", *, seed: int = 0, lr: float = 6e-4, **train: Any) -> dict[str, Any]:
    """§3.5: TAPA in the PoPE-scale 124M OpenWebText recipe (head dim 64 → 32 + 32); the peak lr
    is a grid axis because the paper needed a 5× lower lr for TAPA."""
    from phaselab.workloads.recipes.pope import owt

    out = owt("124m", pe, seed=seed, **merge({"lr": lr, "min_lr": 0.1 * lr}, train))
    out["model"] = merge(out["model"], {"pe": {"tapa": {"alpha": 0.1, "theta": 0.5}}})
    return out
