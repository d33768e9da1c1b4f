"""Kill-and-resume reproduces the uninterrupted run's losses bit for bit on CPU.

Two kinds of kill: ``stop_after`` (the loop stops without a final checkpoint, as a kill would
leave it) at several steps, and a real SIGKILL of a subprocess at an arbitrary moment — possibly
in the middle of writing a checkpoint, which must then be ignored.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from phaselab.catalog.tracking import RecordingTracker
from phaselab.workloads.config import to_dict
from phaselab.workloads.models.presets import preset
from phaselab.workloads.train.api import run_training
from phaselab.workloads.train.checkpoint import CheckpointDir


def _spec(steps: int) -> dict:
    # PoPE (δ projection after each step) with dropout (RNG state must round-trip) and
    # gradient accumulation: every piece of state that resume has to restore is exercised.
    model = preset("tiny", n_layer=1, d_model=32, n_head=2, block_size=48, dropout=0.1,
                   pe={"kind": "pope", "pope": {"delta_init": "uniform"}})
    return {"model": to_dict(model),
            "data": {"kind": "indirect_indexing", "ii": {"n_valid": 64, "n_test": 64}},
            "train": {"steps": steps, "batch_size": 8, "grad_accum": 2, "lr": 3e-3, "min_lr": 3e-4,
                      "warmup": 2, "eval_every": 0, "eval_batches": 1, "final_eval_batches": 1,
                      "ckpt_every": 3, "log_every": 1}}


def _losses(tracker: RecordingTracker) -> dict[int, float]:
    return {s: m["train/loss"] for s, m in tracker.metrics if "train/loss" in m}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[int, float]:
    tracker = RecordingTracker()
    run_training(_spec(12), out_dir=tmp_path_factory.mktemp("ref"), tracker=tracker)
    losses = _losses(tracker)
    assert sorted(losses) == list(range(1, 13))
    return losses


@pytest.mark.parametrize("kill_at", [4, 7])
def test_stop_and_resume_is_bitwise(tmp_path, reference, kill_at):
    first = RecordingTracker()
    out = run_training(_spec(12), out_dir=tmp_path, tracker=first, stop_after=kill_at)
    assert out.records == [] and out.metrics["step"] == kill_at
    last_ckpt = (kill_at // 3) * 3
    assert CheckpointDir(tmp_path / "checkpoints").latest().name == f"step_{last_ckpt:07d}"
    second = RecordingTracker()
    run_training(_spec(12), out_dir=tmp_path, tracker=second)
    resumed = _losses(second)
    assert sorted(resumed) == list(range(last_ckpt + 1, 13))
    for step, loss in resumed.items():
        assert loss == reference[step], (step, loss, reference[step])  # bitwise, not approx
    for step, loss in _losses(first).items():
        assert loss == reference[step]


_CHILD = """
import sys, json
from pathlib import Path
from phaselab.catalog.tracking import NullTracker
from phaselab.workloads.train.api import run_training
run_training(json.loads(sys.argv[1]), out_dir=Path(sys.argv[2]), tracker=NullTracker())
"""


def test_sigkill_mid_run_then_resume(tmp_path, reference):
    import json

    out_dir = tmp_path / "run"
    spec = _spec(12)
    spec["train"]["steps"] = 100_000  # never finishes on its own
    spec["train"]["decay_steps"] = 12  # the reference's lr schedule
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, json.dumps(spec), str(out_dir)],
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    ckpts = CheckpointDir(out_dir / "checkpoints")
    deadline = time.monotonic() + 120
    try:
        while not any(s >= 3 for s in ckpts.steps()):
            assert proc.poll() is None, "child exited early"
            assert time.monotonic() < deadline, "no checkpoint within 120 s"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    start = int(ckpts.latest().name[5:])
    assert start >= 3 and start % 3 == 0
    tracker = RecordingTracker()
    run_training(spec, out_dir=out_dir, tracker=tracker, stop_after=start + 3)
    resumed = _losses(tracker)
    assert sorted(resumed) == list(range(start + 1, start + 4))
    compared = [step for step in resumed if step in reference]
    assert compared, f"killed too late (checkpoint {start}) to compare with the reference"
    for step in compared:
        assert resumed[step] == reference[step], (step, resumed[step], reference[step])
