"""PoPE paper recipes (EXPERIMENTS §2): Indirect Indexing, JSB / MAESTRO / genome, OpenWebText,
and the 1024 → 4096 fine-tunes of §2.4 (RoPE + YaRN, PoPE+ft). Each takes the PE kind
(``"rope" | "pope" | "tapa" | ...``) and a seed; every number cites its table.
"""

from __future__ import annotations

from typing import Any

from phaselab.workloads.recipes.base import finetune_train, merge, model_preset, pretrain_train, spec

_OWT_PRESETS = {"124m": "owt-124m", "253m": "owt-253m", "774m": "owt-774m"}


def ii_paper(pe: str = "pope", *, seed: int = 0, **train: Any) -> dict[str, Any]:
    """Indirect Indexing, v2 Tables 6/7: 8L/512, batch 64, lr 2e-4 → 2e-5, warm-up 4000,
    decay = max iters 100 000, wd 0.01, clip 1.0, β2 0.99; splits 1M/10k/10k."""
    return spec(
        model=model_preset("ii-8l512", pe),
        data={"kind": "indirect_indexing", "block_size": 48, "seed": seed},
        train=pretrain_train(**merge({"steps": 100_000, "decay_steps": 100_000, "batch_size": 64,
                                      "lr": 2e-4, "min_lr": 2e-5, "warmup": 4000, "beta2": 0.99,
                                      "eval_every": 2000, "ckpt_every": 5000, "seed": seed}, train)))


def ii_tiny(pe: str = "pope", *, seed: int = 0, steps: int = 2000, **train: Any) -> dict[str, Any]:
    """Indirect Indexing, CI scale (EXPERIMENTS §4: 2 layers, width 128, 2k steps); the paper's
    optimiser settings with a proportionally short warm-up and a higher peak lr (tiny models
    tolerate it; 2e-4 needs the paper's 100k steps)."""
    return spec(
        model=model_preset("tiny", pe, block_size=48, pe={"pope": {"delta_init": "uniform"}}),
        data={"kind": "indirect_indexing", "block_size": 48, "seed": seed,
              "ii": {"n_valid": 2000, "n_test": 2000}},
        train=pretrain_train(**merge({"steps": steps, "batch_size": 64, "lr": 1e-3, "min_lr": 1e-4,
                                      "warmup": max(1, steps // 20), "beta2": 0.99,
                                      "eval_every": max(1, steps // 4), "eval_batches": 8,
                                      "ckpt_every": steps, "seed": seed}, train)))


def ii_demo(pe: str = "pope", *, seed: int = 0, steps: int = 1200, short: bool = True,
            **train: Any) -> dict[str, Any]:
    """The offline demo's Indirect Indexing: 2 layers, width 64, 4 heads, batch 64,
    lr 3e-3 → 3e-4. ``short`` (default) shrinks the generator to 8-12 letters and shifts in ±4
    (block 24) so that a 2-core CPU sees learning within minutes; with the paper's generator
    (20-40 letters, ±15) every encoding stays at chance (~2.5 %) for the first few thousand
    steps at this size (measured). ``short=False`` uses EXPERIMENTS §2.1 exactly."""
    ii = {"n_valid": 500, "n_test": 2000}
    block = 48
    if short:
        ii |= {"n_min": 8, "n_max": 12, "max_shift": 4}
        block = 24  # longest example: 12 + ",c," + "+4" + ",t" = 19 tokens
    out = ii_tiny(pe, seed=seed, steps=steps, **merge(
        {"lr": 3e-3, "min_lr": 3e-4, "eval_every": 0, "eval_batches": 2, "eval_batch_size": 250,
         "final_eval_splits": ["test"]}, train))
    out["model"] = merge(out["model"], {"d_model": 64, "block_size": block})
    out["data"] = merge(out["data"], {"block_size": block, "ii": ii})
    return out


def jsb(pe: str = "pope", *, seed: int = 0, **train: Any) -> dict[str, Any]:
    """JSB chorales (§2.2): 6L/256, dropout 0.2, batch 4 × 2048, lr 6e-4 → 6e-5, warm-up 10,
    decay = max iters 3000, β2 0.99, eval every 100 (best-valid selection)."""
    return spec(
        model=model_preset("jsb-6l256", pe),
        data={"kind": "jsb", "block_size": 2048, "seed": seed},
        train=pretrain_train(**merge({"steps": 3000, "batch_size": 4, "lr": 6e-4, "min_lr": 6e-5,
                                      "warmup": 10, "beta2": 0.99, "eval_every": 100,
                                      "eval_batches": 0, "ckpt_every": 500, "seed": seed}, train)))


def maestro(pe: str = "pope", *, seed: int = 0, **train: Any) -> dict[str, Any]:
    """MAESTRO (§2.2, real scale): 6L/384, batch 16 × 2048, lr 6e-4 → 6e-5, warm-up 500,
    decay = max iters 60 000, β2 0.99."""
    return spec(
        model=model_preset("maestro-6l384", pe),
        data={"kind": "maestro", "block_size": 2048, "seed": seed},
        train=pretrain_train(**merge({"steps": 60_000, "batch_size": 16, "lr": 6e-4, "min_lr": 6e-5,
                                      "warmup": 500, "beta2": 0.99, "eval_every": 1000,
                                      "ckpt_every": 5000, "seed": seed}, train)))


def genome(pe: str = "pope", *, seed: int = 0, **train: Any) -> dict[str, Any]:
    """Human reference genome (§2.2, real scale): 16L/1024, batch 64 × 1000, lr 2.5e-4 → 2.5e-5,
    warm-up 4000, decay = max iters 100 000, β2 0.999."""
    return spec(
        model=model_preset("genome-16l1024", pe),
        data={"kind": "human_genome", "block_size": 1000, "seed": seed},
        train=pretrain_train(**merge({"steps": 100_000, "batch_size": 64, "lr": 2.5e-4,
                                      "min_lr": 2.5e-5, "warmup": 4000, "beta2": 0.999,
                                      "eval_every": 2000, "ckpt_every": 5000, "seed": seed}, train)))


def owt(size: str = "124m", pe: str = "pope", *, seed: int = 0, **train: Any) -> dict[str, Any]:
    """OpenWebText (§2.3): batch 64 × 1024, lr 6e-4 → 6e-5, warm-up 1000, decay = max iters
    100 000, wd 0.01, clip 1.0, β2 0.95 (≈ 6.55 B tokens)."""
    if size not in _OWT_PRESETS:
        raise ValueError(f"unknown OpenWebText size {size!r}; expected one of {list(_OWT_PRESETS)}")
    return spec(
        model=model_preset(_OWT_PRESETS[size], pe),
        data={"kind": "openwebtext", "block_size": 1024, "seed": seed},
        train=pretrain_train(**merge({"steps": 100_000, "batch_size": 64, "lr": 6e-4, "min_lr": 6e-5,
                                      "warmup": 1000, "beta2": 0.95, "eval_every": 2000,
                                      "ckpt_every": 2000, "seed": seed}, train)))


def owt_finetune_yarn(*, seed: int = 0, factor: float = 4.0, **train: Any) -> dict[str, Any]:
    """RoPE + YaRN fine-tune at 4096 (§2.4): factor 4 = 4096/1024, original length 1024,
    β 32/1, index ramp, default temperature; 500 steps, 20 warm-up, lr 6e-5 constant, batch 64,
    β2 0.95 as in pretraining. The model comes from ``init_from`` (an ``owt(pe="rope")`` run)."""
    return spec(
        model=None,
        data={"kind": "openwebtext", "block_size": 4096, "seed": seed},
        train=finetune_train(**merge({"beta2": 0.95, "seed": seed, "eval_every": 100,
                                      "ckpt_every": 100}, train)),
        extend={"rule": "yarn", "factor": factor, "original_max_seq_len": 1024, "block_size": 4096})


def owt_finetune_pope(*, seed: int = 0, **train: Any) -> dict[str, Any]:
    """PoPE+ft (§2.4): the same fine-tune at 4096 with NO frequency interpolation."""
    return spec(
        model=None,
        data={"kind": "openwebtext", "block_size": 4096, "seed": seed},
        train=finetune_train(**merge({"beta2": 0.95, "seed": seed, "eval_every": 100,
                                      "ckpt_every": 100}, train)),
        extend={"rule": "none", "block_size": 4096})


def shakespeare_char(pe: str = "pope", *, seed: int = 0, steps: int = 2000, **train: Any) -> dict[str, Any]:
    """Char-level LM on Tiny Shakespeare at 256 (EXPERIMENTS §4, the default offline LM):
    4L/128, batch 32, lr 1e-3 → 1e-4, β2 0.99."""
    return spec(
        model=model_preset("tiny", pe, vocab_size=128, block_size=256, n_layer=4),
        data={"kind": "text", "block_size": 256, "seed": seed, "text": {"tokenizer": "char"}},
        train=pretrain_train(**merge({"steps": steps, "batch_size": 32, "lr": 1e-3, "min_lr": 1e-4,
                                      "warmup": max(1, steps // 20), "beta2": 0.99,
                                      "eval_every": max(1, steps // 4), "eval_batches": 8,
                                      "ckpt_every": max(1, steps // 4), "seed": seed}, train)))
