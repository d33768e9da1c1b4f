"""Shared Triton helpers (kernels/common/triton_common.py): the softmax exponential's three
modes against float64 2**x, run as a small kernel (TRITON_INTERPRET=1 on the CPU)."""

from __future__ import annotations

import os

import pytest
import torch
import triton
import triton.language as tl

from phaselab.kernels.common.triton_common import EXP2_MODES, _exp2_tile

needs_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") != "1",
                                       reason="CPU interpreter test; the gpu tests cover CUDA")


@triton.jit
def _exp2_kernel(x, y, MODE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    o = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
    tl.store(y + o, _exp2_tile(tl.load(x + o), MODE))


def check_exp2_tile(mode: str, device: str, tol: float) -> None:
    """Softmax arguments (<= 0): integers, half-integers (rounding ties of the shifter), the
    underflow edge, -inf (masked scores) -> exactly 0; relative error <= tol where 2**x is normal."""
    gen = torch.Generator().manual_seed(0)
    x = -torch.rand(16, 32, generator=gen, dtype=torch.float64) * 140.0
    x[0, :8] = torch.tensor([0.0, -0.5, -1.0, -1.5, -2.5, -124.5, -125.0, -125.25], dtype=torch.float64)
    x[1, :3] = float("-inf")
    x32 = x.float().to(device)
    y = torch.full_like(x32, float("nan"))
    _exp2_kernel[(1,)](x32, y, MODE=EXP2_MODES[mode], BM=16, BN=32)
    x32, y = x32.cpu(), y.cpu()
    want = torch.exp2(x32.double())
    assert torch.isfinite(y).all()
    assert torch.equal(y[1, :3], torch.zeros(3))
    normal = x32 >= -125.0
    rel = ((y.double() - want).abs() / want)[normal]
    assert rel.max().item() <= tol, rel.max().item()
    # below the edge: exactly 0 (poly) or the true tiny value (MUFU); both negligible against 2**0
    assert (y[~normal] <= 2.0**-125).all()


@needs_interpreter
@pytest.mark.parametrize("mode", list(EXP2_MODES))
def test_exp2_tile_modes_match_float64(mode):
    check_exp2_tile(mode, "cpu", 3e-7)  # 2.5 fp32 ulp: the fit's 7.5e-8 plus Horner's rounding


@pytest.mark.gpu
@pytest.mark.parametrize("mode", list(EXP2_MODES))
def test_exp2_tile_modes_gpu(mode):
    check_exp2_tile(mode, "cuda", 1e-6)  # ex2.approx.f32: about 2 ulp
