"""Untuned kernel configs (triton_common.TUNE_DEFAULTS, default_tile, untuned_pick and the flash
core's pruner): which tile each kernel runs without autotuning (a launch's AUTOTUNE constexpr,
`AttentionOptions.autotune`). Plain Python over the
GPU config lists (the interpreter's one-config lists are switched off per test), no kernel runs."""

from __future__ import annotations

import pytest
import torch

from phaselab.kernels.common import triton_common
from phaselab.kernels.common.triton_common import TUNE_DEFAULTS, default_tile, pruner, untuned_pick
from phaselab.kernels.flash import triton_flash


@pytest.fixture
def gpu_lists(monkeypatch):
    """The GPU autotune lists (not the interpreter's single 16x16 config); untuned mode."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    return {"flash_fwd": triton_flash.fwd_configs(), "flash_dkdv": triton_flash.dkdv_configs(),
            "flash_dq": triton_flash.dq_configs(), "pope_fwd": triton_common._fwd_configs(),
            "tapa_fwd": triton_common._fwd_configs(), "pope_dkdv": triton_common._bwd_configs(),
            "pope_dq": triton_common._bwd_configs(), "tapa_dq": triton_common._bwd_configs(),
            "tapa_dkdv": triton_common._bwd_configs(first=(32, 64, 4, 2))}


def _tile(c):
    return (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages)


def _args(dtype=torch.bfloat16, **widths):
    return {"q": torch.empty(0, dtype=dtype), **widths}


def test_every_default_is_in_its_kernels_list(gpu_lists):
    for (kernel, _, _), tile in TUNE_DEFAULTS.items():
        assert tile in [_tile(c) for c in gpu_lists[kernel.removesuffix("_atomic")]], (kernel, tile)


@pytest.mark.parametrize("kernel, widths, want", [
    ("pope_fwd", {"BLOCK_D": 64}, (256, 64, 8, 2)),
    ("pope_fwd", {"BLOCK_D": 128}, (128, 128, 8, 2)),
    ("pope_dkdv", {"BLOCK_D": 64}, (64, 128, 8, 2)),
    ("tapa_dkdv", {"BLOCK_V": 64}, (32, 64, 4, 2)),
    ("tapa_dkdv", {"BLOCK_V": 64, "ATOMIC_DQ": True}, (64, 64, 4, 2)),
    ("tapa_dkdv", {"BLOCK_V": 128}, (64, 32, 4, 2)),
    ("tapa_dq", {"BLOCK_V": 128}, (64, 32, 4, 2)),
])
def test_untuned_pick_takes_the_measured_tile(gpu_lists, kernel, widths, want):
    for dtype in (torch.bfloat16, torch.float16):
        got = untuned_pick(kernel, gpu_lists[kernel], _args(dtype, **widths), {})
        assert [_tile(c) for c in got] == [want]


def test_untuned_pick_without_a_measured_tile(gpu_lists):
    # fp32 inputs and unlisted widths keep the first config, or the first 8-warp one at >= 128 wide
    assert default_tile("tapa_dq", gpu_lists["tapa_dq"], _args(torch.float32, BLOCK_V=128), {}) is None
    got = untuned_pick("tapa_dq", gpu_lists["tapa_dq"], _args(torch.float32, BLOCK_V=128), {})
    assert [_tile(c) for c in got] == [(64, 64, 8, 2)]
    got = untuned_pick("pope_dq", gpu_lists["pope_dq"], _args(BLOCK_D=32), {})
    assert [_tile(c) for c in got] == [(64, 64, 4, 2)]
    got = untuned_pick("pope_dq", gpu_lists["pope_dq"], _args(BLOCK_D=256), {})
    assert [_tile(c) for c in got] == [(64, 64, 8, 2)]
    # a measured tile that is not among the candidates (pruned as not fitting) is not forced in
    rest = [c for c in gpu_lists["pope_fwd"] if _tile(c) != (256, 64, 8, 2)]
    assert default_tile("pope_fwd", rest, _args(BLOCK_D=64), {}) is None


def test_pruners_time_everything_only_with_autotune(gpu_lists):
    args = _args(BLOCK_D=64)
    assert [_tile(c) for c in pruner("pope_fwd")(gpu_lists["pope_fwd"], args)] == [(256, 64, 8, 2)]
    assert [_tile(c) for c in pruner("pope_fwd")(gpu_lists["pope_fwd"], args, AUTOTUNE=False)] == [(256, 64, 8, 2)]
    assert len(pruner("pope_fwd")(gpu_lists["pope_fwd"], args, AUTOTUNE=True)) == len(gpu_lists["pope_fwd"])
    # 256-row query blocks are not timed for 128-wide heads
    tuned = pruner("pope_fwd")(gpu_lists["pope_fwd"], _args(BLOCK_D=128), AUTOTUNE=True)
    assert tuned and all(c.kwargs["BLOCK_M"] < 256 for c in tuned)
    # the flash core's pruner: every main config that fits, or the measured tile
    flash = triton_flash._pruner("fwd")
    assert len(flash(gpu_lists["flash_fwd"], _args(BLOCK_D=64, BLOCK_V=64), AUTOTUNE=True)) == triton_flash._MAIN["fwd"]
    assert len(flash(gpu_lists["flash_fwd"], _args(BLOCK_D=64, BLOCK_V=64), AUTOTUNE=False)) == 1


def test_autotune_is_part_of_every_tuning_key():
    """A tile picked without timing must never be reused for an autotuned launch of the same
    shape (or the other way round): Triton caches picks by the key."""
    from phaselab.kernels.pope import triton_pope
    from phaselab.kernels.tapa import triton_tapa

    kernels = (triton_pope.pope_fwd_kernel, triton_pope.pope_bwd_kernel_dkdv, triton_pope.pope_bwd_kernel_dq,
               triton_tapa.tapa_fwd_kernel, triton_tapa.tapa_bwd_kernel_dkdv, triton_tapa.tapa_bwd_kernel_dq,
               triton_flash.flash_fwd_kernel, triton_flash.flash_bwd_kernel_dkdv, triton_flash.flash_bwd_kernel_dq)
    for kernel in kernels:
        assert "AUTOTUNE" in kernel.keys and "AUTOTUNE" in kernel.arg_names, kernel.base_fn.__name__


@pytest.mark.parametrize("kind, bd, bv, want", [
    ("fwd", 64, 64, (128, 64, 8, 3)),
    ("fwd", 128, 64, (128, 64, 4, 3)),  # PoPE's expanded q_hat / k_hat
    ("dkdv", 128, 128, (32, 128, 8, 3)),
    ("dq", 64, 64, (128, 64, 8, 3)),
])
def test_flash_pruner_takes_the_measured_tile(gpu_lists, kind, bd, bv, want):
    prune = triton_flash._pruner(kind)
    got = prune(gpu_lists[f"flash_{kind}"], _args(BLOCK_D=bd, BLOCK_V=bv))
    assert [_tile(c) for c in got] == [want]
    # fp32: the first main config that fits, as before the measured tiles
    got32 = prune(gpu_lists[f"flash_{kind}"], _args(torch.float32, BLOCK_D=bd, BLOCK_V=bv))
    fits = [c for c in gpu_lists[f"flash_{kind}"][:triton_flash._MAIN[kind]]
            if triton_flash._fits(kind, c, bd, bv)]
    assert [_tile(c) for c in got32] == [_tile(fits[0])]


def test_autotune_results_are_cached_on_disk():
    # Triton >= 3.2 keeps each tuned shape's timings in its cache directory
    assert triton_common.TUNE_CACHE == {"cache_results": True}
