"""The shared test helpers fail when they should (a tolerance helper that cannot fail is useless)."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from phaselab.kernels.testing import (
    assert_close,
    calibrated_close,
    forced_config,
    generator,
    rel_rms,
    shape_id,
)


def test_rel_rms_values():
    ref = torch.tensor([3.0, 4.0])
    assert rel_rms(ref, ref) == 0.0
    assert math.isclose(rel_rms(ref, torch.tensor([3.0, 4.5])), 0.5 / 5.0)
    assert math.isclose(rel_rms(torch.zeros(4), torch.full((4,), 2.0)), 2.0)  # absolute RMS for a zero ref


def test_assert_close_passes_fails_and_logs(caplog):
    ref = torch.randn(100, generator=generator())
    with caplog.at_level(logging.INFO, logger="phaselab.kernels.testing"):
        err = assert_close("ok", ref, ref * (1 + 1e-4), 2e-4)
    assert math.isclose(err, 1e-4, rel_tol=1e-2)
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["ok"]
    with pytest.raises(AssertionError, match="1.000e-02 > 1.0e-03"):
        assert_close("bad", ref, ref * 1.01, 1e-3)
    bad = ref.clone()
    bad[3] = float("nan")
    with pytest.raises(AssertionError, match="NaN"):
        assert_close("nan", ref, bad, 1.0)
    with pytest.raises(AssertionError, match="shape"):
        assert_close("shape", ref, ref[:-1], 1.0)


def test_calibrated_close_is_the_2x_rule():
    ref = torch.zeros(10, dtype=torch.float64)
    torch_err = torch.full((10,), 0.01)
    assert calibrated_close("ok", ref, torch.full((10,), 0.019), torch_err, atol=0.0) == pytest.approx((0.019, 0.01))
    with pytest.raises(AssertionError, match="2.0 x PyTorch"):
        calibrated_close("bad", ref, torch.full((10,), 0.021), torch_err, atol=0.0)
    calibrated_close("atol", ref, torch.full((10,), 0.021), torch_err, atol=0.002)
    calibrated_close("factor", ref, torch.full((10,), 0.029), torch_err, factor=3.0, atol=0.0)
    with pytest.raises(AssertionError):
        calibrated_close("nan", ref, torch.full((10,), float("nan")), torch_err)
    one_outlier = torch.zeros(10)
    one_outlier[0] = 0.05  # max 0.05 > 2 x 0.01, but rms 0.0158 <= 2 x 0.01
    with pytest.raises(AssertionError, match="max error"):
        calibrated_close("max", ref, one_outlier, torch_err, atol=0.0)
    assert calibrated_close("rms", ref, one_outlier, torch_err, atol=0.0, metric="rms")[0] == pytest.approx(
        0.05 / math.sqrt(10))
    with pytest.raises(ValueError, match="'median'"):
        calibrated_close("bad-metric", ref, torch_err, torch_err, metric="median")


def test_shape_id_format():
    assert shape_id(B=2, T=63, H=4, D=60, dtype=torch.bfloat16) == "B2-T63-H4-D60-bf16"
    assert shape_id(T=1, S=64, dtype=torch.float32, causal=True) == "T1-S64-fp32-causal"
    assert shape_id(D=48, dtype=torch.float16, causal=False, layout="concat") == "D48-fp16-nocausal-concat"
    with pytest.raises(TypeError, match="x="):
        shape_id(x=[1])


def test_forced_config_sets_one_config_and_restores_on_error():
    """On the real autotuned kernels: one config inside the block, the lists back afterwards, even
    when the block raises."""
    import triton

    from phaselab.kernels.pope import triton_pope

    kernels = (triton_pope.pope_bwd_kernel_dkdv, triton_pope.pope_bwd_kernel_dq)
    before = [list(k.configs) for k in kernels]
    cfg = triton.Config({"BLOCK_M": 32, "BLOCK_N": 16}, num_warps=4, num_stages=1)
    with pytest.raises(RuntimeError, match="inside"), forced_config(cfg, *kernels):
        assert [k.configs for k in kernels] == [[cfg], [cfg]]
        raise RuntimeError("inside")
    assert [k.configs for k in kernels] == before
