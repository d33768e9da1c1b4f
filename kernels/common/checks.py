"""Input checks of the fused attention wrappers (pope/function.py, tapa/function.py) and the
limits the `triton` backend states (function.py): dtypes, BHTD shapes, GQA, integer positions on
q's device, a finite scale; the device capability the routing checks ask for.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 128


_CAPABILITY: dict[int, tuple[int, int]] = {}


def capability(index: int) -> tuple[int, int]:
    """torch.cuda.get_device_capability of CUDA device `index`, asked once: it is fixed, and the
    query took 4-12 us of host time on an H100 machine, in routing checks that run every call. A
    plain dict, not functools.lru_cache: torch.compile traces the routing of a compiled model and
    warns at every lru_cache it meets."""
    cap = _CAPABILITY.get(index)
    if cap is None:
        cap = _CAPABILITY[index] = torch.cuda.get_device_capability(index)
    return cap


def check_device(name: str, t: Tensor, device: torch.device) -> None:
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, q is on {device}")


def check_qkv(q_BHTD: Tensor, k_BGSD: Tensor, v_BGSD: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    for name, t in (("q_BHTD", q_BHTD), ("k_BGSD", k_BGSD), ("v_BGSD", v_BGSD)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.ndim != 4:
            raise ValueError(f"{name} must be 4-D (BHTD layout), got shape {tuple(t.shape)}")
        if t.dtype not in DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; the Triton kernels take {DTYPES}")
        check_device(name, t, q_BHTD.device)
    B, H, T, D = q_BHTD.shape
    if k_BGSD.shape[0] != B or k_BGSD.shape[3] != D or v_BGSD.shape != k_BGSD.shape:
        raise ValueError(f"k {tuple(k_BGSD.shape)} and v {tuple(v_BGSD.shape)} must be [B={B}, G, S, D={D}] "
                         f"(raw D-wide q/k/v; q is {tuple(q_BHTD.shape)})")
    if k_BGSD.dtype != q_BHTD.dtype or v_BGSD.dtype != q_BHTD.dtype:
        raise TypeError(f"q, k, v dtypes differ: {q_BHTD.dtype}, {k_BGSD.dtype}, {v_BGSD.dtype}")
    G = k_BGSD.shape[1]
    if G == 0 or H % G:
        raise ValueError(f"query heads H={H} must be divisible by kv heads G={G}")
    if not 1 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"head dim D={D} must be in [1, {MAX_HEAD_DIM}] (register-resident heads)")
    if T == 0 or k_BGSD.shape[2] == 0:
        raise ValueError(f"empty sequence: T={T}, S={k_BGSD.shape[2]}")
    # the kernels need a contiguous last dim: the custom ops (pope/ops.py, tapa/ops.py) make it so,
    # where they also see the layouts a compiled caller picks; any other strides are passed through
    return q_BHTD, k_BGSD, v_BGSD


def check_pos(name: str, pos: Tensor, batch: int, length: int, device: torch.device) -> Tensor:
    if not isinstance(pos, Tensor):
        raise TypeError(f"{name} must be an integer torch.Tensor, got {type(pos).__name__}")
    if pos.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name} must be int64 (or int32), got {pos.dtype} (MATH §7.2: never float)")
    if pos.ndim != 2 or pos.shape[0] not in (1, batch) or pos.shape[1] != length:
        raise ValueError(f"{name} has shape {tuple(pos.shape)}, expected ({batch} or 1, {length})")
    check_device(name, pos, device)
    return positions(pos)


def positions(pos: Tensor) -> Tensor:
    """Checked positions (`check_pos`) as the kernels read them: int64, contiguous."""
    return pos.to(torch.int64).contiguous()


def check_scale(scale: float) -> float:
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"scale={scale!r} must be a finite number")
    return float(scale)
