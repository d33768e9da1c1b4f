"""The run folder's per-step log (catalog/tracking/run_folder.py): one complete line per write, a torn
final line skipped by readers and cut away by the next writer, corruption before it refused
with file and line, the first value per (step, metric), and the live view's tail read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phaselab.catalog.tracking import run_folder
from phaselab.catalog.tracking.run_folder import (
    MetricsFileError,
    StepLog,
    first_values,
    last_step,
    read_steps,
    steps_path,
)


def test_lines_round_trip_and_a_torn_tail_is_skipped_then_cut(tmp_path: Path) -> None:
    log = StepLog.of(tmp_path / "run")
    log.append(1, {"train/loss": 2.5, "train/lr": 1e-3})
    log.append(2, {"train/loss": 2.25})
    path = steps_path(tmp_path / "run")
    assert path.name == run_folder.STEPS_FILE == "metrics.jsonl"
    assert read_steps(path) == [{"step": 1, "train/loss": 2.5, "train/lr": 1e-3}, {"step": 2, "train/loss": 2.25}]
    with open(path, "ab") as f:   # a writer killed mid-line
        f.write(b'{"step": 3, "train/lo')
    assert [r["step"] for r in read_steps(path)] == [1, 2]
    assert last_step(tmp_path / "run") == {"step": 2, "train/loss": 2.25}
    resumed = StepLog(path)       # a resumed run's new writer repairs before appending
    resumed.append(3, {"train/loss": 2.0})
    assert path.read_text().splitlines()[-1] == '{"step": 3, "train/loss": 2.0}'
    assert [r["step"] for r in resumed.read()] == [1, 2, 3]


def test_corruption_before_the_last_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / run_folder.STEPS_FILE
    path.write_text('{"step": 1, "train/loss": 1.0}\nnot json\n{"step": 2, "train/loss": 0.5}\n')
    with pytest.raises(MetricsFileError, match=r"metrics.jsonl:2: malformed"):
        read_steps(path)
    with pytest.raises(MetricsFileError):
        StepLog(path).append(3, {"train/loss": 0.25})
    assert read_steps(tmp_path / "absent.jsonl") == []


def test_first_values_keep_the_first_attempt_and_last_step_reads_the_tail(tmp_path: Path) -> None:
    log = StepLog.of(tmp_path)
    for step, loss in ((1, 3.0), (2, 2.0), (2, 9.0), (3, 1.5)):   # step 2 logged again after a resume
        log.append(step, {"train/loss": loss})
    log.append(3, {"valid/loss": 1.75})
    assert first_values(read_steps(steps_path(tmp_path)), "train/loss") == {1: 3.0, 2: 2.0, 3: 1.5}
    assert last_step(tmp_path) == {"step": 3, "train/loss": 1.5}
    assert last_step(tmp_path, "valid/loss")["valid/loss"] == 1.75
    # a file longer than the tail window: the read starts mid-line and still finds the newest step
    for step in range(4, 400):
        log.append(step, {"train/loss": 1.0 / step, "train/tokens_per_s": 1e6})
    assert last_step(tmp_path)["step"] == 399
    assert last_step(tmp_path / "nowhere") is None
    assert json.loads(steps_path(tmp_path).read_text().splitlines()[-1])["step"] == 399
