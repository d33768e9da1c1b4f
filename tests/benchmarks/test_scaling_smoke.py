"""benchmarks/scaling.py and plot_loss_curves.py.

The fast tests check the arithmetic on hand-made metrics lines with known answers; the one Ray
test runs ONE short real ``ray_entry.fit`` (tiny model, DeepSpeed ZeRO-2, 1 CPU worker, fp32) and
checks what scaling.py derives from the metrics.jsonl it wrote against the loop's own numbers.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import local_ray
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import plot_loss_curves
import scaling
import scaling_cases
import scaling_measure
import scaling_report


def _bench(**kw) -> scaling_cases.Bench:
    base = {"device": "cpu", "steps": 8, "warmup_steps": 2, "batch_size": 8, "max_world": 2,
            "block_size": 64, "ckpt_at": 4, "lr": 1e-3}
    return scaling_cases.Bench(**(base | kw))


def _lines(seconds: dict[int, float], tokens_per_step: int) -> list[dict]:
    out = [{"step": 1, "train/loss": 4.0}]
    for s, t in sorted(seconds.items()):
        out.append({"step": s, "train/loss": 4.0 - 0.1 * s, "train/steps_per_s": 1 / t,
                    "train/tokens_per_s": tokens_per_step / t})
    return out


def test_throughput_known_answers():
    bench = _bench()  # 8 x 64 = 512 tokens per step
    secs = {2: 9.0, 3: 0.5, 4: 0.25, 5: 1.25, 6: 0.25, 7: 0.5, 8: 0.5}  # step 5 follows the ckpt
    lines = _lines(secs, bench.tokens_per_step)
    got = scaling_measure.throughput(lines, bench=bench, world=2, after_ckpt=5)
    # kept: steps 3, 4, 6, 7, 8 (warm-up 1-2 and step 5 out): 5 steps in 2.0 s
    assert got["tokens_per_s"] == pytest.approx(5 * 512 / 2.0, rel=1e-12)
    assert got["tokens_per_s_per_gpu"] == pytest.approx(5 * 512 / 2.0 / 2, rel=1e-12)
    assert got["step_ms_median"] == pytest.approx(500.0)
    assert got["steps_measured"] == 5


def test_telemetry_reads_what_the_loop_logged():
    """Checkpoint times and the peak come from the loop's own lines, at the right steps; a run
    without them (CPU: no peak; a killed run: no final save) gives None, not a made-up number."""
    bench = _bench()  # steps 8, mid-run checkpoint at 4
    lines = _lines({2: 0.5, 3: 0.5, 4: 0.5, 5: 0.5}, bench.tokens_per_step)
    lines[2]["train/peak_mem_gib"], lines[4]["train/peak_mem_gib"] = 3.5, 2.25
    lines += [{"step": 4, "ckpt/save_s": 0.125}, {"step": 8, "ckpt/save_s": 0.375},
              {"step": 8, "valid/loss": 3.0}]
    assert scaling_measure.telemetry(lines, bench=bench) == {
        "ckpt_save_s": 0.125, "ckpt_save_s_final": 0.375, "peak_mem_gib_alloc": 3.5}
    cpu_killed = [m for m in lines if m.get("step") != 8 and "train/peak_mem_gib" not in m]
    assert scaling_measure.telemetry(cpu_killed, bench=bench) == {
        "ckpt_save_s": 0.125, "ckpt_save_s_final": None, "peak_mem_gib_alloc": None}
    assert scaling_measure.logged(lines, "ckpt/save_s") == {4: 0.125, 8: 0.375}


def test_first_train_line_skips_the_restore_line():
    lines = [{"step": 4, "ckpt/load_s": 0.5}, {"step": 5, "train/loss": 3.0}, {"step": 6, "train/loss": 2.9}]
    assert scaling_measure.first_train_line_s(lines, [7.0, 9.5, 9.75]) == 9.5
    assert scaling_measure.first_train_line_s(lines[:1], [7.0]) is None


def test_efficiency_pairs_each_world_with_its_one_worker_run():
    rows = [{"preset": "p", "encoding": "rope", "zero_stage": 2, "world": 1, "error": None, "tokens_per_s": 1000.0},
            {"preset": "p", "encoding": "rope", "zero_stage": 2, "world": 2, "error": None, "tokens_per_s": 1800.0},
            {"preset": "p", "encoding": "pope", "zero_stage": 2, "world": 2, "error": None, "tokens_per_s": 900.0}]
    eff = scaling_report.add_efficiency(rows)
    assert eff == [{"preset": "p", "encoding": "rope", "zero_stage": 2, "from": 1, "to": 2, "efficiency": 0.9}]
    assert rows[1]["efficiency_vs_1"] == pytest.approx(0.9)
    assert "efficiency_vs_1" not in rows[2]  # no 1-worker pope run to compare with


def test_bench_rejects_bad_settings_naming_the_value():
    with pytest.raises(ValueError, match="ckpt_at=7"):
        _bench(ckpt_at=7)
    with pytest.raises(ValueError, match="--batch 6"):
        _bench(batch_size=6, max_world=4)
    with pytest.raises(ValueError, match="every --workers value must divide"):
        scaling.parse_args(["--device", "cpu", "--workers", "2,3"])


def test_spec_keeps_micro_batches_identical_across_world_sizes():
    """grad_accum * world is constant, so every world size draws the same micro-batch indices."""
    from phaselab.workloads.train.api import parse_spec

    bench = _bench(max_world=4)
    micro = set()
    for world in (1, 2, 4):
        spec = parse_spec(scaling_cases.build_spec(scaling_cases.Case(preset="tiny", encoding="pope", zero_stage=3,
                                                          world=world), bench))
        assert spec.train.grad_accum * world == 4
        assert spec.train.zero_stage == 3 and spec.train.precision == "fp32"
        assert spec.model.pe.kind == "pope"
        micro.add(spec.train.micro_batch(world))
    assert micro == {2}


def test_loss_curve_diff_and_plot(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("\n".join(json.dumps(x) for x in [{"step": 1, "train/loss": 4.0}, {"step": 2, "train/loss": 2.0},
                                                     {"step": 2, "valid/loss": 9.0}]) + "\n")
    b.write_text("\n".join(json.dumps(x) for x in [{"step": 1, "train/loss": 4.2}, {"step": 2, "train/loss": 2.2},
                                                     {"step": 3, "train/loss": 1.0}]) + "\n")
    diffs = plot_loss_curves.compare({"1": a, "2": b}, tmp_path / "c.png", title="t")
    assert diffs["2"]["max_rel_diff"] == pytest.approx(0.1)  # |2.2-2|/2 > |4.2-4|/4
    assert diffs["2"]["at_step"] == 2 and diffs["2"]["steps_compared"] == 2
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="share no step"):
        plot_loss_curves.max_rel_diff({1: 1.0}, {2: 1.0})


@pytest.mark.ray
@pytest.mark.slow
def test_one_real_fit_measured(tmp_path):
    """One real fit (ZeRO-2, 1 worker, 6 steps, checkpoint at 3): the numbers scaling.py derives
    agree with the loop's own per-step accounting."""
    pytest.importorskip("ray")
    from phaselab.catalog.tracking.run_folder import read_steps
    from phaselab.workloads.train.deepspeed_engine import prebuild_comm_op

    # DeepSpeed's shm comm op is JIT-compiled once per checkout (~30 s, STACK.md; make install
    # does it): here, in one process, if not yet, rather than inside the timed worker
    prebuild_comm_op()
    local_ray.shared()
    bench = _bench(steps=6, warmup_steps=1, ckpt_at=3, max_world=1)
    case = scaling_cases.Case(preset="tiny", encoding="rope", zero_stage=2, world=1)
    row = scaling_measure.run_case(case, bench, tmp_path, "t")
    assert row["error"] is None
    lines = [m for m in read_steps(Path(row["metrics_path"])) if "train/loss" in m]
    assert [m["step"] for m in lines] == [1, 2, 3, 4, 5, 6]
    for m in lines[1:]:  # the loop counts global tokens: batch 8 x 64 per step
        assert m["train/tokens_per_s"] / m["train/steps_per_s"] == pytest.approx(512, rel=1e-9)
    kept = [1 / m["train/steps_per_s"] for m in lines if m["step"] not in (1, 4)]
    assert row["steps_measured"] == 4
    assert row["tokens_per_s_per_gpu"] == pytest.approx(4 * 512 / sum(kept), rel=1e-9)
    assert row["ckpt_save_s"] is not None and math.isfinite(row["ckpt_save_s"]) and row["ckpt_save_s"] > 0
    saves = {m["step"]: m["ckpt/save_s"] for m in read_steps(Path(row["metrics_path"])) if "ckpt/save_s" in m}
    assert saves == {3: row["ckpt_save_s"], 6: row["ckpt_save_s_final"]}  # the loop's numbers, as logged
    assert row["peak_mem_gib_alloc"] is None  # CPU: no allocator peak is logged, none is invented
    assert row["final_loss"] < row["first_loss"] < 4.3  # ln(66) = 4.19 at init
    assert row["first_line_s"] is not None and 0 < row["first_line_s"] < row["wall_s"]
    ckpts = sorted(p.name for p in (tmp_path / "ray_train" / "scal-tiny-rope-z2-w1-t").glob("step_*"))
    assert ckpts == ["step_0000003", "step_0000006"]


def _doc(rows: list[dict], setup: str = "s", resume: list[dict] = ()) -> dict:
    return {"title": "t", "device": "cuda", "card": "2 x H200", "date": "d", "command": "c", "software": "x",
            "setup": setup, "bench": {}, "notes": [], "missing": [], "cases": rows, "resume": list(resume)}


def _row(world: int, tps: float, losses: dict[str, float]) -> dict:
    return {"preset": "owt-124m", "encoding": "rope", "zero_stage": 1, "world": world, "error": None,
            "tokens_per_s": tps, "tokens_per_s_per_gpu": tps / world, "micro_batch": 32,
            "grad_accum": 2 // world, "step_ms_median": 1.0, "peak_mem_gib_max_gpu": 10.0,
            "peak_mem_gib_alloc": 7.0 + world / 8,
            "ckpt_save_s": 0.5, "first_loss": 11.0, "final_loss": 6.0, "losses": losses,
            "metrics_path": "/nonexistent"}


def test_merge_of_two_device_calls(tmp_path):
    """Results of two calls (1 GPU, then 2 GPUs) merge into one study with its efficiency and
    the loss-curve difference computed from the embedded losses."""
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_doc([_row(1, 100_000.0, {"1": 11.0, "2": 8.0})])))
    resume = {"preset": "owt-124m", "encoding": "rope", "zero_stage": 1, "world": 2, "killed_after_step": 17,
              "resumed_first_step": 16, "ckpt_load_s": 4.125, "restore_s_est": 9.5,
              "vs_uninterrupted_max_rel_diff": 0.0}
    b.write_text(json.dumps(_doc([_row(2, 190_000.0, {"1": 11.0, "2": 8.4})], resume=[resume])))
    merged = scaling.merge([a, b], tmp_path / "out", plots=True)
    assert merged["efficiency"][0]["efficiency"] == pytest.approx(0.95)
    assert merged["loss_curves"]["owt-124m-rope-z1"]["2 GPUs"]["max_rel_diff"] == pytest.approx(0.05)
    assert (tmp_path / "out-loss-owt-124m-rope-z1.png").is_file()
    md = (tmp_path / "out.md").read_text()
    assert "| 95.0% |" in md and "| 95,000 |" in md  # efficiency and tokens/s per GPU at 2 GPUs
    assert "| peak alloc GiB | peak smi GiB | ckpt save s |" in md
    assert "| 7.25 | 10.0 | 0.50 |" in md  # the 2-GPU row: loop peak, nvidia-smi peak, save time
    assert "| 17 | 16 | 4.12 | 9.50 |" in md  # resume: killed after, resumed from, load s, restore est.
    c = tmp_path / "c.json"
    c.write_text(json.dumps(_doc([_row(2, 1.0, {"1": 1.0})], setup="other")))
    with pytest.raises(ValueError, match="different setups"):
        scaling.merge([a, c], tmp_path / "out2", plots=False)
