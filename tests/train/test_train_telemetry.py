"""Telemetry of the training loop: checkpoint save/restore times and peak memory.

A tiny single-process run (``api.run_training``) writes through a real ``JsonlTracker``; the
metrics file is read back and checked: ``ckpt/save_s`` at every checkpoint step, ``ckpt/load_s``
at the step a resume starts from, and no ``train/peak_mem_gib`` on CPU (torch keeps no allocator
counter there, so the loop must not invent one). On a GPU the peak is checked against the bytes
the weights and AdamW moments must occupy.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
import torch

from phaselab.catalog.tracking.run_folder import read_steps
from phaselab.workloads.config import from_dict, to_dict
from phaselab.workloads.models.config import ModelConfig
from phaselab.workloads.models.presets import preset
from phaselab.workloads.models.transformer import Transformer
from phaselab.workloads.train.api import run_training
from phaselab.workloads.train.checkpoint import CheckpointDir
from phaselab.workloads.train.ray_entry import JsonlTracker

TEXT = {"kind": "text", "block_size": 32, "text": {"tokenizer": "char"}}


def _spec(*, steps: int, device: str) -> dict:
    model = preset("tiny", n_layer=1, d_model=32, n_head=2, block_size=32, pe={"kind": "rope"})
    return {"model": to_dict(model), "data": TEXT,
            "train": {"steps": steps, "batch_size": 8, "lr": 3e-3, "min_lr": 3e-4, "warmup": 1,
                      "eval_every": 0, "eval_batches": 1, "final_eval_batches": 1, "ckpt_every": 2,
                      "log_every": 1, "device": device}}


class _CheckpointWitness(JsonlTracker):
    """A JsonlTracker that also notes, when ``ckpt/save_s`` arrives, which checkpoint is complete
    on disk: the time must be logged after the atomic save finished, not before."""

    def __init__(self, path: Path, ckpt_root: Path) -> None:
        super().__init__(path)
        self.ckpt_root = ckpt_root
        self.latest_at_log: dict[int, str | None] = {}

    def log_metrics(self, metrics, *, step: int) -> None:
        if "ckpt/save_s" in metrics:
            latest = CheckpointDir(self.ckpt_root).latest()
            self.latest_at_log[step] = latest.name if latest else None
        super().log_metrics(metrics, step=step)


def _values(lines: list[dict], key: str) -> dict[int, float]:
    return {int(m["step"]): m[key] for m in lines if key in m}


def _positive_finite(values: dict[int, float], *, below: float) -> None:
    for step, v in values.items():
        assert math.isfinite(v) and 0.0 < v < below, (step, v, below)


def test_save_and_load_times_reach_the_metrics_file(tmp_path):
    out = tmp_path / "run"
    first_file, second_file = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    witness = _CheckpointWitness(first_file, out / "checkpoints")
    t0 = time.perf_counter()
    killed = run_training(_spec(steps=6, device="cpu"), out_dir=out, tracker=witness, stop_after=3)
    first_wall = time.perf_counter() - t0
    assert killed.metrics["step"] == 3  # a simulated kill after step 3: last checkpoint is step 2
    first = read_steps(first_file)
    saves = _values(first, "ckpt/save_s")
    assert sorted(saves) == [2]
    _positive_finite(saves, below=first_wall)
    assert witness.latest_at_log == {2: "step_0000002"}
    assert "ckpt/load_s" not in {k for m in first for k in m}  # a fresh run restores nothing

    t0 = time.perf_counter()
    resumed = run_training(_spec(steps=6, device="cpu"), out_dir=out, tracker=JsonlTracker(second_file))
    second_wall = time.perf_counter() - t0
    assert resumed.metrics["step"] == 6
    second = read_steps(second_file)
    loads = _values(second, "ckpt/load_s")
    assert sorted(loads) == [2]  # logged at the step the run resumes from
    _positive_finite(loads, below=second_wall)
    assert second.index(next(m for m in second if "ckpt/load_s" in m)) == 0  # before any step
    assert min(_values(second, "train/loss")) == 3
    saves = _values(second, "ckpt/save_s")
    assert sorted(saves) == [4, 6]  # every ckpt_every step and the last one
    _positive_finite(saves, below=second_wall)


def test_cpu_loop_logs_no_peak_memory(tmp_path):
    tracker_file = tmp_path / "m.jsonl"
    out = run_training(_spec(steps=3, device="cpu"), out_dir=tmp_path / "run",
                       tracker=JsonlTracker(tracker_file))
    lines = read_steps(tracker_file)
    assert len(_values(lines, "train/loss")) == 3
    assert not any("train/peak_mem_gib" in m for m in lines)
    assert "train/peak_mem_gib" not in out.metrics


@pytest.mark.gpu
def test_cuda_loop_logs_peak_memory_per_window(tmp_path):
    """Each log step's peak covers at least the fp32 weights, grads and both AdamW moments (all
    resident during the optimiser step) and at most the card."""
    tracker_file = tmp_path / "m.jsonl"
    spec = _spec(steps=4, device="cuda")
    run_training(spec, out_dir=tmp_path / "run", tracker=JsonlTracker(tracker_file))
    peaks = _values(read_steps(tracker_file), "train/peak_mem_gib")
    assert sorted(peaks) == [1, 2, 3, 4]
    n_params = sum(p.numel() for p in Transformer(from_dict(ModelConfig, spec["model"])).parameters())
    floor = 4 * n_params * 4 / 2**30  # weights + grads + exp_avg + exp_avg_sq, fp32
    card = torch.cuda.get_device_properties(0).total_memory / 2**30
    for step, peak in peaks.items():
        assert math.isfinite(peak) and floor <= peak < card, (step, peak, floor)
