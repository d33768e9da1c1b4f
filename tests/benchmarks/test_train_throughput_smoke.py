"""benchmarks/train_throughput.py: the FLOP and timing arithmetic on known answers, and
one real `--tiny` run on the CPU (every encoding through the real training loop)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import train_throughput as tt

from phaselab.workloads.models.presets import preset


def test_flops_per_token_known_answers():
    # owt-124m: 12 layers, d 768, 12 heads of 64; N with RoPE from the presets docstring.
    n = 123_587_328
    rope = tt.flops_per_token(preset("owt-124m"), n, 1024)
    assert rope["dense"] == 6 * n
    # causal fwd+bwd without recompute: 12 L^2 D per head / 2, per token 6 T D, x H x layers
    assert rope["attention"] == 6 * 1024 * 64 * 12 * 12 == 56_623_104
    assert rope["total"] == rope["dense"] + rope["attention"]
    pope = tt.flops_per_token(preset("owt-124m", pe={"kind": "pope"}), n, 1024)
    assert pope["attention"] == 9 * 1024 * 64 * 12 * 12   # QK 2D wide: 18 L^2 D (MATH §6)
    tapa = tt.flops_per_token(preset("owt-124m", pe={"kind": "tapa"}), n, 2048)
    assert tapa["attention"] == 2 * rope["attention"]       # linear in T per token


def test_window_excludes_warmup_steps():
    times = {1: 0.0, 2: 10.0, 3: 10.5, 4: 11.5, 5: 12.0}   # steps 1-2 are warm-up
    got = tt.window_stats(times, warmup=2, tokens_per_step=100)
    assert got["steps_measured"] == 3 and got["seconds"] == pytest.approx(2.0)
    assert got["tokens_per_s"] == pytest.approx(150.0)
    assert got["step_ms_median"] == pytest.approx(500.0) and got["step_ms_max"] == pytest.approx(1000.0)
    with pytest.raises(ValueError, match="more steps than warmup"):
        tt.window_stats(times, warmup=5, tokens_per_step=100)


def test_default_backends_by_device():
    import torch

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert [c.key for c in tt.parse_cases("rope,pope,tapa", cpu)] == ["rope:sdpa", "pope:reference", "tapa:reference"]
    assert [c.key for c in tt.parse_cases("rope,pope,tapa", cuda)] == ["rope:sdpa", "pope:triton", "tapa:triton"]
    assert [c.key for c in tt.parse_cases("pope:sdpa", cuda)] == ["pope:sdpa"]
    assert [c.key for c in tt.parse_cases("alibi,phaselab_kerple:Kerple:triton", cuda)] == \
        ["alibi:auto", "phaselab_kerple:Kerple:triton"]   # any registered kind (docs/EXTENDING.md)
    with pytest.raises(ValueError, match="unknown pe.kind 'ropee'; did you mean 'rope'"):
        tt.parse_cases("ropee", cpu)


def test_tiny_cpu_run_writes_json_and_markdown(tmp_path: Path):
    out = tmp_path / "smoke"
    code = tt.main(["--tiny", "--device", "cpu", "--encodings", "rope,pope,tapa,pope:sdpa", "--out", str(out)])
    assert code == 0
    result = json.loads(out.with_suffix(".json").read_text())
    meta, rows = result["meta"], result["rows"]
    assert meta["device"] == "cpu" and meta["command"].startswith("python benchmarks/train_throughput.py --tiny")
    assert meta["peak_tflops"] == 989.5 and meta["precision"] == "bf16"
    assert [(r["case"], r["backend_ran"]) for r in rows] == [
        ("rope:sdpa", "sdpa"), ("pope:reference", "reference"), ("tapa:reference", "reference"), ("pope:sdpa", "sdpa")]
    for r in rows:
        assert r["error"] is None and r["steps_measured"] == 3 and r["tokens_per_step"] == 4 * 64
        assert r["tokens_per_s"] == pytest.approx(3 * 256 / r["seconds"], rel=1e-12)
        assert r["mfu"] == pytest.approx(r["flops_per_token"]["total"] * r["tokens_per_s"] / 989.5e12, rel=1e-12)
        assert r["model"]["pe"]["kind"] == r["encoding"] and r["model"]["n_layer"] == 2
        assert math.isfinite(r["loss_first"]) and r["loss_last"] < r["loss_first"]   # it trained
    # same seed, same data: PoPE on sdpa (expanded q/k) trains like PoPE on the reference
    assert rows[3]["loss_last"] == pytest.approx(rows[1]["loss_last"], rel=2e-2)
    md = out.with_suffix(".md").read_text()
    assert "| pope:reference | reference |" in md and meta["command"] in md and meta["date"] in md


def test_unsupported_backend_is_a_recorded_error(tmp_path: Path):
    out = tmp_path / "bad"
    assert tt.main(["--tiny", "--device", "cpu", "--encodings", "tapa:sdpa", "--out", str(out)]) == 1
    (row,) = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert row["case"] == "tapa:sdpa" and "sdpa" in row["error"] and "TAPA" in row["error"]


def test_profile_runs_after_the_timed_window(tmp_path: Path):
    """--profile 2: two more steps (after one profiler warm-up step) are profiled; the timed window
    stays the 3 steps after warm-up, and the markdown says where the profiled steps' time went."""
    out = tmp_path / "prof"
    assert tt.main(["--tiny", "--device", "cpu", "--encodings", "rope", "--profile", "2", "--out", str(out)]) == 0
    (row,) = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert row["steps_measured"] == 3
    prof = row["profile"]
    assert prof["steps"] == 2 and prof["wall_ms_per_step"] > 0 and prof["busy_ms_per_step"] > 0
    names = [r["name"] for r in prof["top"]]
    assert "aten::mm" in names   # the linear layers: real operators, measured
    assert sum(r["share"] for r in prof["top"]) <= 1.0 + 1e-9
    md = out.with_suffix(".md").read_text()
    assert "### rope:sdpa: 2 profiled steps" in md and "| `aten::mm` |" in md


def test_profile_busy_is_the_union_of_device_intervals_and_kernels_are_categorised():
    import step_profile

    # [0,10) and [5,12) overlap (two streams): covered 12; [20,21) adds 1
    events = [("a", 0.0, 10.0), ("b", 5.0, 7.0), ("c", 20.0, 1.0), ("d", 2.0, 3.0)]
    assert step_profile._union_us(events) == pytest.approx(13.0)
    assert step_profile.category("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT") == "gemm"
    assert step_profile.category("cudnn_generated_fort_native_sdpa_sm90_flash_bprop") == "attention"
    assert step_profile.category("triton_poi_fused__log_softmax__log_softmax_backward_data") == "loss"
    assert step_profile.category("ce_fwd_kernel_rows") == "loss"
    assert step_profile.category("triton_poi_fused_add_mul_rms_norm_3") == "fused elementwise"
    assert step_profile.category("void at::native::multi_tensor_apply_kernel<adam>") == "optimizer"
    assert step_profile.category("some_unknown_kernel") == "other"


def test_profiler_keeps_its_events_when_stepped_past_the_last_active_step():
    # small_models.py profiles with skip=0 and calls .step() once more after the last active step;
    # with torch's default repeat=0 that step opens a new cycle whose warm-up empties events()
    import step_profile
    import torch

    prof = step_profile.make_profiler(torch.device("cpu"), skip=0, steps=3)
    a = torch.randn(64, 64)
    with prof:
        for _ in range(4):
            a @ a
            prof.step()
    summary = step_profile.summary(prof, device=torch.device("cpu"), steps=3, wall_ms_per_step=1.0)
    mm = [r for r in summary["top"] if r["name"] == "aten::mm"]
    assert mm and mm[0]["calls_per_step"] == pytest.approx(1.0)
