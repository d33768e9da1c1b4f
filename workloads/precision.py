"""What a ``precision`` setting means on a device: one rule for training, evaluation and the
record of what ran. "auto" is bf16 autocast on CUDA and fp32 elsewhere; "bf16" and "fp32" are
themselves. Master weights stay fp32 either way."""

from __future__ import annotations

from typing import Any

PRECISIONS = ("auto", "fp32", "bf16")


def resolved_precision(precision: str, device: Any) -> str:
    """"bf16" or "fp32": ``precision`` ("auto" | "fp32" | "bf16") on ``device`` (a torch.device
    or anything with ``.type``)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return "bf16" if precision == "bf16" or (precision == "auto" and device.type == "cuda") else "fp32"
