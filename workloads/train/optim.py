"""AdamW with phaselab's parameter groups (EXPERIMENTS §1 ``optim.decay_params``, MATH §3.2).

Rules, in order (first match wins):

1. PoPE's phase bias δ — any parameter whose *name* ends in ``.delta`` (the model names them
   ``...pe.delta``, CONTRACTS §3.2) — goes to group ``"delta"``: weight decay only if
   ``delta_weight_decay`` (default off, EXPERIMENTS §6 #3) and lr × ``delta_lr_mult``. δ is
   excluded **by name, not by rank**: it is a 2-D (H, D) tensor and a rank rule would decay it
   toward 0, the upper end of its [−2π, 0] range (MATH §3.2).
2. Embedding tables (parameters of ``nn.Embedding`` modules) are decayed only if
   ``decay_embeddings`` (nanoGPT decays its tied ``wte``; the default follows it).
3. Other 2-D tensors (weight matrices) are decayed; everything else (norm gains, biases, scalars)
   is not.

Every group carries ``lr_mult`` so the loop sets ``group["lr"] = lr * group["lr_mult"]`` each
step; that also works through DeepSpeed, which keeps the client optimizer's group dicts.
"""

from __future__ import annotations

import torch
from torch import nn

from phaselab.workloads.train.config import OptimConfig


def is_delta(name: str) -> bool:
    """True for PoPE's δ parameters (named ``...pe.delta``)."""
    return name == "delta" or name.endswith(".delta")


def param_groups(model: nn.Module, cfg: OptimConfig) -> list[dict]:
    """Split ``model``'s trainable parameters into the groups of the module docstring.

    Returns a list of dicts ``{"name", "params", "param_names", "weight_decay", "lr_mult"}`` with
    empty groups dropped; ``param_names`` is kept for tests and logging (torch ignores it).
    """
    embedding_ids = {id(p) for m in model.modules() if isinstance(m, nn.Embedding)
                     for p in m.parameters(recurse=False)}
    buckets: dict[str, list[tuple[str, nn.Parameter]]] = {"decay": [], "no_decay": [], "delta": []}
    for name, p in model.named_parameters():  # shared (tied) tensors are listed once
        if not p.requires_grad:
            continue
        if is_delta(name):
            buckets["delta"].append((name, p))
        elif id(p) in embedding_ids:
            buckets["decay" if cfg.decay_embeddings else "no_decay"].append((name, p))
        elif p.dim() == 2:
            buckets["decay"].append((name, p))
        else:
            buckets["no_decay"].append((name, p))
    settings = {
        "decay": (cfg.weight_decay, 1.0),
        "no_decay": (0.0, 1.0),
        "delta": (cfg.weight_decay if cfg.delta_weight_decay else 0.0, cfg.delta_lr_mult),
    }
    groups = []
    for group_name, items in buckets.items():
        if not items:
            continue
        wd, mult = settings[group_name]
        groups.append({"name": group_name, "params": [p for _, p in items],
                       "param_names": [n for n, _ in items], "weight_decay": wd, "lr_mult": mult})
    return groups


def build_optimizer(model: nn.Module, cfg: OptimConfig, *, allow_fused: bool = True) -> torch.optim.AdamW:
    """torch AdamW over :func:`param_groups` (also DeepSpeed's client optimizer, STACK.md, which
    passes ``allow_fused=False``: ZeRO swaps the groups for flat partitions, possibly on the CPU)."""
    groups = param_groups(model, cfg)
    if not groups:
        raise ValueError("model has no trainable parameters")
    # One fused kernel for the whole update when every parameter lives on a GPU (the
    # multi-tensor path launches several kernels per parameter group per step); CPU keeps foreach.
    fused = allow_fused and all(p.is_cuda for g in groups for p in g["params"])
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                             fused=fused or None)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Apply the schedule's lr to every group, times the group's multiplier."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_mult", 1.0)
