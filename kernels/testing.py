"""Test helpers shared by every kernel test (DESIGN.md §6): one assert_close, one 2x rule, shape ids.

- `assert_close(name, ref, out, ratio)`: relative RMS error ||out - ref||_2 / ||ref||_2 <= ratio,
  one log line per tensor (fla-org/flash-linear-attention fla/utils/_testing.py, without its
  CI-mode warning path: a failure is always a failure).
- `calibrated_close(name, ref64, out, same_dtype_torch, factor=2.0, atol=...)`: the error of
  `out` against the high-precision reference is at most `factor` times PyTorch's own error at the
  same dtype, plus atol (Dao-AILab/flash-attention tests/test_flash_attn.py).
- `shape_id(B=2, T=63, H=4, D=60, dtype=torch.bfloat16)` -> "B2-T63-H4-D60-bf16".
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

log = logging.getLogger(__name__)

_DTYPE_NAMES = {torch.float64: "fp64", torch.float32: "fp32", torch.bfloat16: "bf16",
                torch.float16: "fp16", torch.int64: "i64", torch.int32: "i32"}


def _check_pair(name: str, ref: Tensor, out: Tensor) -> None:
    if ref.shape != out.shape:
        raise AssertionError(f"{name}: shape {tuple(out.shape)} != reference shape {tuple(ref.shape)}")


def rel_rms(ref: Tensor, out: Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 (the absolute RMS error if ref is all zeros)."""
    ref64, out64 = ref.detach().to(torch.float64), out.detach().to(torch.float64)
    err = torch.linalg.vector_norm(out64 - ref64).item()
    norm = torch.linalg.vector_norm(ref64).item()
    if norm == 0.0:
        return err / math.sqrt(max(ref64.numel(), 1))
    return err / norm


def assert_close(name: str, ref: Tensor, out: Tensor, ratio: float) -> float:
    """Assert relative RMS error <= ratio (NaN/Inf anywhere fails); logs one line; returns the error."""
    _check_pair(name, ref, out)
    err = rel_rms(ref, out)
    log.info("%s: rel_rms=%.3e ratio=%.1e", name, err, ratio)
    if not torch.isfinite(out.detach()).all():
        raise AssertionError(f"{name}: output has NaN/Inf")
    if not err <= ratio:  # also catches NaN
        raise AssertionError(f"{name}: relative RMS error {err:.3e} > {ratio:.1e}")
    return err


def calibrated_close(name: str, ref64: Tensor, out: Tensor, same_dtype_torch: Tensor,
                     factor: float = 2.0, atol: float = 1e-5, metric: str = "max") -> tuple[float, float]:
    """The 2x rule: err(out) <= factor * err(torch_same_dtype) + atol, errors against ref64.

    Args:
        ref64: the fp32/fp64 reference. out: the tensor under test (e.g. a bf16 kernel output).
        same_dtype_torch: PyTorch's own computation at out's dtype (e.g. reference run in bf16).
        metric: "max" (max-abs error, as flash-attention's tests) or "rms" (root-mean-square
            error; stabler for gradients, whose max-abs error is one outlier among ~1e5 values).
    Returns (error of out, error of PyTorch).
    """
    _check_pair(name, ref64, out)
    _check_pair(name, ref64, same_dtype_torch)
    if metric not in ("max", "rms"):
        raise ValueError(f"metric={metric!r}: expected 'max' or 'rms'")
    ref = ref64.detach().to(torch.float64)

    def error(x: Tensor) -> float:
        diff = x.detach().to(torch.float64) - ref
        return (diff.abs().max() if metric == "max" else diff.square().mean().sqrt()).item()

    err, base = error(out), error(same_dtype_torch)
    bound = factor * base + atol
    log.info("%s: %s_err=%.3e torch_same_dtype_err=%.3e bound=%.3e", name, metric, err, base, bound)
    if not err <= bound:
        raise AssertionError(f"{name}: {metric} error {err:.3e} > {factor} x PyTorch's same-dtype error "
                             f"{base:.3e} + atol {atol:.1e} = {bound:.3e}")
    return err, base


def _format(key: str, value: Any) -> str:
    if isinstance(value, torch.dtype):
        if value not in _DTYPE_NAMES:
            raise ValueError(f"shape_id: no short name for dtype {value}")
        return _DTYPE_NAMES[value]
    if isinstance(value, bool):
        return key if value else f"no{key}"
    if isinstance(value, (int, float)):
        return f"{key}{value}"
    if isinstance(value, str):
        return value
    raise TypeError(f"shape_id: {key}={value!r} must be an int, float, bool, str or torch.dtype")


def shape_id(**dims: Any) -> str:
    """Readable parametrize id in argument order: shape_id(B=2, T=63, dtype=torch.bfloat16) ->
    "B2-T63-bf16". Ints/floats print as KEYvalue, dtypes by short name, strings verbatim, bools as
    key / nokey."""
    return "-".join(_format(key, value) for key, value in dims.items())


def generator(seed: int = 42, device: str | torch.device = "cpu") -> torch.Generator:
    """A seeded torch.Generator (tests use seed 42, DESIGN §6)."""
    return torch.Generator(device=device).manual_seed(seed)


@contextlib.contextmanager
def forced_config(config: Any, *autotuned: Any) -> Iterator[None]:
    """Run Triton `@autotune` kernels with the one `config` inside the block (the lists are
    restored on exit): GPU tests of every tile the autotuner may pick, since untuned runs take
    only the first."""
    saved = [kernel.configs for kernel in autotuned]
    try:
        for kernel in autotuned:
            kernel.configs = [config]
        yield
    finally:
        for kernel, configs in zip(autotuned, saved):
            kernel.configs = configs


def pope_inputs(B: int, H: int, G: int, T: int, S: int, D: int, dtype: torch.dtype, device: str | torch.device,
                *, delta: bool = True, offset: int = 0, broadcast: bool = True, seed: int = 42):
    """Seeded (q, k, v, pos_q, pos_k, inv_freq, delta) of a PoPE attention call: raw q [B, H, T, D] and
    k, v [B, G, S, D] in `dtype`; positions consecutive from `offset` (per batch row from its own
    origin unless `broadcast`), the queries the last T keys; fp32 inv_freq [D] and delta [H, D]
    in (-2 pi, 0] (or None). Shared by the PoPE tests and the custom-op tests."""
    from phaselab.kernels.common.score_mod import pope_inv_freq

    gen = generator(seed, device)
    q = torch.randn(B, H, T, D, generator=gen, device=device).to(dtype)
    k = torch.randn(B, G, S, D, generator=gen, device=device).to(dtype)
    v = torch.randn(B, G, S, D, generator=gen, device=device).to(dtype)
    pos_k = (torch.arange(S, device=device) + offset)[None]
    if not broadcast:  # one row per batch element, each from its own origin
        pos_k = torch.cat([pos_k + 13 * b for b in range(B)])
    pos_q = pos_k[:, S - T:].contiguous()  # bottom-right: the queries are the last T keys
    d = (-2 * math.pi * torch.rand(H, D, generator=gen, device=device)) if delta else None
    return q, k, v, pos_q, pos_k.contiguous(), pope_inv_freq(D).to(device), d
