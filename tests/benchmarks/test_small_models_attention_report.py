"""Reporting paths of benchmarks/small_models.py (--profile sections) and benchmarks/attention.py
(the tapa-public method, loaded at run time from a checkout; the pope-expand-flex path's numbers),
on synthetic inputs: no GPU, no training."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import attention
import small_models

META = {"card": "test card", "date": "2026-12-02", "command": "python x", "commit": "abc", "torch": "2"}


def _row(profile: dict | None) -> dict:
    row = {"model": "ii-8l512", "pe": "pope", "backend": "sdpa", "mode": "graphs-compiled", "steps": 300,
           "batch_workers": 4, "steps_per_s": 284.3, "gpu_busy": 0.0, "wall_s": 20.0, "final_loss": 3.929}
    return row | ({"profile": profile} if profile else {})


def test_profile_without_device_events_says_so_instead_of_idle():
    prof = {"steps": 10, "wall_ms_per_step": 3.54, "busy_ms_per_step": 0.0, "idle_share": 1.0,
            "categories": {}, "top": []}
    md = small_models.markdown([_row(prof)], [], META)
    assert "| ii-8l512 | pope | sdpa | graphs-compiled (4 batch workers) | 284.3 |" in md
    assert "wall 3.54 ms/step over 10 replays; the profiler recorded no device events" in md
    assert "idle 100 %" not in md


def test_profile_with_device_events_gets_the_kernel_tables():
    prof = {"steps": 10, "wall_ms_per_step": 3.0, "busy_ms_per_step": 2.4, "idle_share": 0.2,
            "categories": {"gemm": {"ms_per_step": 1.2, "share": 0.5}},
            "top": [{"name": "nvjet_x", "category": "gemm", "calls_per_step": 48, "ms_per_step": 1.2,
                     "share": 0.5}]}
    md = small_models.markdown([_row(prof)], [], META)
    assert "busy 2.4 ms/step (idle 20 %)" in md
    assert "| gemm | 1.200 | 50.0 % |" in md and "| `nvjet_x` | 48 | 1.200 | 50.0 % |" in md


def test_tapa_public_loads_a_checkout_and_passes_the_benchmark_settings(tmp_path, monkeypatch):
    (tmp_path / "attention_triton.py").write_text(
        "def tapa_attention_triton(xq, xk, xv, theta, alpha, causal=True):\n"
        "    return (xq + 2 * xk + 3 * xv) * theta * alpha * (1 if causal else -1)\n")
    monkeypatch.setattr(attention, "_PUBLIC", {})
    attention.load_tapa_public(str(tmp_path))
    q, k, v = (torch.full((1, 1, 2, 4), float(i)) for i in (1, 2, 3))
    with torch.no_grad():
        out = attention.tapa_public(q, k, v, None, {})
    assert torch.equal(out, torch.full((1, 1, 2, 4), 14 * 0.5 * 0.1))
    with pytest.raises(RuntimeError, match="forward only"):   # fwd+bwd rows get this status
        attention.tapa_public(q.requires_grad_(), k, v, None, {})


def test_tapa_public_names_a_missing_checkout(tmp_path, monkeypatch):
    monkeypatch.setattr(attention, "_PUBLIC", {})
    with pytest.raises(SystemExit, match="no attention_triton.py"):
        attention.load_tapa_public(str(tmp_path))
    with pytest.raises(RuntimeError, match="needs --tapa-public"):
        attention.tapa_public(None, None, None, None, {})


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") != "1", reason="CPU: the prologue under the interpreter")
def test_pope_expand_flex_computes_pope_attention(monkeypatch):
    """The user path the PoPE rows are compared with (our prologue + FlexAttention, v D wide):
    forward against the float64 reference on an awkward shape. Eager flex_attention stands in for
    the compiled one (the same function; CPU has no FlexAttention backward, so forward only)."""
    from torch.nn.attention.flex_attention import flex_attention

    from phaselab.kernels.attention import reference
    from phaselab.kernels.common.score_mod import ScoreMod, pope_inv_freq

    monkeypatch.setattr(attention, "_FLEX", {"fn": flex_attention})
    B, H, N, D = 2, 3, 37, 8
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(B, H, N, D, generator=gen) for _ in range(3))
    pos = torch.arange(N)[None]
    ctx = {"inv_freq": pope_inv_freq(D), "delta": -2 * torch.pi * torch.rand(H, D, generator=gen)}
    with torch.no_grad():
        out = attention.pope_expand_flex(q, k, v, pos, ctx)
    want = reference.attention(q.double(), k.double(), v.double(), pos_q_BT=pos, pos_k_BS=pos, scale=D ** -0.5,
                               score_mod=ScoreMod(kind="pope", params={"inv_freq": ctx["inv_freq"],
                                                                       "delta": ctx["delta"]}),
                               compute_dtype=torch.float64)
    assert out.shape == (B, H, N, D) and out.dtype == torch.float32
    err = ((out.double() - want).norm() / want.norm()).item()
    assert err < 1e-5, err
    assert set(attention._FLEX) == {"fn", N}   # one block mask per length


def test_every_attention_method_has_a_flop_kind():
    """The TFLOP/s column needs each method's FLOP count (MATH §6): a method without a kind would
    fail only on the GPU, after the earlier rows had spent their time."""
    assert set(attention.METHODS) == set(attention.METHOD_KIND)
    assert set(attention.METHOD_KIND.values()) <= set(attention.FLOPS_PER_L2D)
    assert attention.METHOD_KIND["pope-expand-cudnn-dv"] == "pope" and attention.METHOD_KIND["tapa-public"] == "tapa"


def test_attention_table_reports_host_ms_ratios_and_profiles():
    """attention.py's table: the host ms column, ratios to both SDPA backends from add_ratios, an
    error row that keeps its columns, and a --profile section per profiled row."""
    prof = {"steps": 3, "wall_ms_per_step": 4.0, "busy_ms_per_step": 3.0, "idle_share": 0.25,
            "categories": {"attention": {"ms_per_step": 3.0, "share": 1.0}},
            "top": [{"name": "pope_chain_kernel", "category": "attention", "calls_per_step": 2.0,
                     "ms_per_step": 0.5, "share": 0.167}]}
    base = {"N": 1024, "B": 64, "H": 16, "D": 64, "mode": "fwd+bwd", "status": "ok", "tflops": 100.0, "peak_gib": 0.5}
    rows = [{**base, "method": "sdpa-flash", "ms": 3.0, "host_ms": 0.4},
            {**base, "method": "sdpa-cudnn", "ms": 2.0, "host_ms": 0.3},
            {**base, "method": "pope-cudnn", "ms": 4.0, "host_ms": 2.5, "profile": prof},
            {**base, "method": "pope-expand", "status": "OOM"}]
    attention.add_ratios(rows)
    assert rows[2]["x_sdpa-cudnn"] == pytest.approx(2.0) and rows[2]["x_sdpa-flash"] == pytest.approx(4 / 3)
    md = attention.table(rows)
    lines = md.splitlines()
    assert lines[0].endswith("| peak GiB | host ms |")
    assert "| 64 | 1024 | 64 | fwd+bwd | pope-cudnn | 4.000 | 100 | 1.33 | 2.00 | 0.50 | 2.500 |" in lines
    assert "| 64 | 1024 | 64 | fwd+bwd | pope-expand | OOM | | | | | |" in lines
    assert all(line.count("|") == 12 for line in lines[:6])
    assert "### pope-cudnn fwd+bwd D=64 N=1024: 3 profiled steps, wall 4.0 ms/step, busy 3.0 ms/step" in md
    rows[1]["queued_ms"] = 1.5   # a column once a row has it, "-" in those without
    lines = attention.table(rows).splitlines()
    assert lines[0].endswith("| host ms | queued ms |") and all(line.count("|") == 13 for line in lines[:6])
    assert "| 64 | 1024 | 64 | fwd+bwd | sdpa-cudnn | 2.000 | 100 | 0.67 | 1.00 | 0.50 | 0.300 | 1.500 |" in lines
    assert "| 64 | 1024 | 64 | fwd+bwd | pope-cudnn | 4.000 | 100 | 1.33 | 2.00 | 0.50 | 2.500 | - |" in lines
    assert "| `pope_chain_kernel` | 2 | 0.500 | 16.7 % |" in md
