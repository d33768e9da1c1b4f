"""A killed writer may leave a torn last line in ``metrics.jsonl``; nothing half-written is ever
read back as finished.

Real files written by the real ``ray_entry.JsonlTracker`` (and, for the replay, by the real
training loop through ``run_training``); the torn tails are what a write cut short leaves: a
prefix of the next real line, a complete record that lost its newline, NUL padding after a crash,
a terminated line that does not parse. Checked: ``read_steps`` returns exactly the complete
lines and logs a warning naming the file and line; a bad line in the middle raises with the file
name and line number; a resumed writer cuts the torn line before appending (the file is valid
JSONL again, byte for byte); ``replay_metrics`` replays the complete lines before and after.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from phaselab.catalog.tracking import RecordingTracker
from phaselab.catalog.tracking.run_folder import (
    REPLAY_STATE_FILE,
    MetricsFileError,
    read_steps,
    truncate_torn_tail,
)
from phaselab.orchestrator.engine.failures import classify
from phaselab.orchestrator.stages.pretrain import replay_metrics
from phaselab.workloads.train.ray_entry import JsonlTracker

LOGGER = "phaselab.catalog.tracking.run_folder"
ROWS = [{"train/loss": 4.5, "train/lr": 1e-3}, {"train/loss": 4.25, "train/lr": 2e-3},
        {"train/loss": 4.0, "valid/loss": 4.125}]
NEXT = json.dumps({"step": 4, "train/loss": 3.75, "train/lr": 3e-3}) + "\n"
TORN_TAILS = {
    "prefix-of-next-line": NEXT[: len(NEXT) // 2].encode(),
    "record-without-newline": NEXT[:-1].encode(),     # parses, yet was never finished
    "nul-padding": b"\x00" * 24,                      # a crash after the size grew, before the data landed
    "terminated-garbage": b'{"step": 4, "train/lo\n',   # ends in a newline but does not parse
    "not-an-object": b"4\n",
}


def _write(path: Path) -> bytes:
    """Three records by the real writer; returns the file's bytes."""
    writer = JsonlTracker(path)
    for step, row in enumerate(ROWS, start=1):
        writer.log_metrics(row, step=step)
    return path.read_bytes()


def _expected() -> list[dict]:
    return [{"step": step, **row} for step, row in enumerate(ROWS, start=1)]


@pytest.mark.parametrize("tail", list(TORN_TAILS), ids=list(TORN_TAILS))
def test_a_torn_last_line_is_skipped_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                    tail: str) -> None:
    path = tmp_path / "metrics.jsonl"
    good = _write(path)
    assert good.count(b"\n") == 3 and good.endswith(b"\n")          # one complete line per record
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert read_steps(path) == _expected()
    assert caplog.records == []                                     # a healthy file: no warning
    with open(path, "ab") as f:
        f.write(TORN_TAILS[tail])
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert read_steps(path) == _expected()
    (warning,) = caplog.records
    assert warning.levelno == logging.WARNING and f"{path}:4" in warning.getMessage()
    assert "torn final line" in warning.getMessage()


def test_a_file_that_is_only_a_torn_line_reads_empty(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(TORN_TAILS["prefix-of-next-line"])
    assert read_steps(path) == []
    assert read_steps(tmp_path / "absent.jsonl") == []


@pytest.mark.parametrize("bad", [b"{not json}\n", TORN_TAILS["prefix-of-next-line"] + NEXT.encode(), b"[1, 2]\n"],
                         ids=["garbage", "torn-then-appended", "array"])
def test_a_bad_line_in_the_middle_raises_naming_file_and_line(tmp_path: Path, bad: bytes) -> None:
    """``torn-then-appended`` is what the old writer left: a torn line, then the resumed run's
    first line glued to it."""
    path = tmp_path / "metrics.jsonl"
    good = _write(path)
    lines = good.splitlines(keepends=True)
    path.write_bytes(lines[0] + bad + b"".join(lines[1:]))
    with pytest.raises(MetricsFileError, match=rf"{path}:2: malformed metrics line"):
        read_steps(path)
    with pytest.raises(MetricsFileError, match=rf"{path}:2: malformed") as err:   # nor appends to it
        JsonlTracker(path).log_metrics({"train/loss": 1.0}, step=9)
    assert isinstance(err.value, ValueError) and classify(err.value) == "data"
    assert path.read_bytes() == lines[0] + bad + b"".join(lines[1:])
    assert replay_metrics(tmp_path, RecordingTracker()) == 0        # replay reports, never fails the stage


@pytest.mark.parametrize("tail", list(TORN_TAILS), ids=list(TORN_TAILS))
def test_a_resumed_writer_cuts_the_torn_line_before_appending(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                              tail: str) -> None:
    path = tmp_path / "metrics.jsonl"
    good = _write(path)
    with open(path, "ab") as f:
        f.write(TORN_TAILS[tail])
    resumed = JsonlTracker(path)                       # a new attempt's writer
    assert path.read_bytes() == good + TORN_TAILS[tail]   # constructing it does not touch the file
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        resumed.log_metrics({"train/loss": 3.75, "train/lr": 3e-3}, step=4)
        resumed.log_metrics({"train/loss": 3.5}, step=5)
    assert [r.getMessage() for r in caplog.records if "cutting" in r.getMessage()] != []
    assert path.read_bytes() == good + NEXT.encode() + b'{"step": 5, "train/loss": 3.5}\n'
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        rows = read_steps(path)
    assert caplog.records == []                        # valid JSONL again
    assert rows == _expected() + [{"step": 4, "train/loss": 3.75, "train/lr": 3e-3}, {"step": 5, "train/loss": 3.5}]
    assert [json.loads(line) for line in path.read_text().splitlines()] == rows   # any JSONL reader agrees


def test_truncate_leaves_healthy_files_alone(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    assert truncate_torn_tail(path) is False and not path.exists()
    good = _write(path)
    assert truncate_torn_tail(path) is False and path.read_bytes() == good
    path.write_bytes(good + b"\n\n")                   # blank lines are not records, and not torn
    assert truncate_torn_tail(path) is False and read_steps(path) == _expected()
    path.write_bytes(TORN_TAILS["nul-padding"])
    assert truncate_torn_tail(path) is True and path.read_bytes() == b""


def test_replay_after_a_torn_line_replays_the_complete_lines(tmp_path: Path) -> None:
    """The real loop writes steps 1-5 (checkpoint at 3) and is killed in the middle of a line;
    the replay sends exactly the complete lines; the resumed run (a new writer) repairs the file
    and appends steps 4-8; the next replay sends only what is new, each (step, metric) once."""
    from test_metrics_replay import _pairs, _spec

    from phaselab.workloads.train.api import run_training

    out = tmp_path / "stage"
    run_training(_spec(), out_dir=out, tracker=JsonlTracker(out / "metrics.jsonl"), stop_after=5)
    complete = read_steps(out / "metrics.jsonl")
    assert [int(r["step"]) for r in complete if "train/loss" in r] == [1, 2, 3, 4, 5]
    line = json.dumps({"step": 6, "train/loss": 2.5, "train/lr": 1e-3}) + "\n"
    with open(out / "metrics.jsonl", "ab") as f:
        f.write(line[:17].encode())                    # the kill: step 6's line cut short

    first = RecordingTracker()
    assert replay_metrics(out, first) == len(_pairs(complete))
    assert first.metrics == [(int(r["step"]), {k: v for k, v in r.items() if k != "step"}) for r in complete]
    assert json.loads((out / REPLAY_STATE_FILE).read_text())["lines"] == len(complete)

    run_training(_spec(), out_dir=out, tracker=JsonlTracker(out / "metrics.jsonl"))   # resumes at step 3
    lines = read_steps(out / "metrics.jsonl")
    assert lines[: len(complete)] == complete
    assert [int(r["step"]) for r in lines if "train/loss" in r] == [1, 2, 3, 4, 5, 4, 5, 6, 7, 8]
    assert all(line.endswith("}") for line in (out / "metrics.jsonl").read_text().splitlines())
    every = _pairs(lines)
    assert replay_metrics(out, first) == len(every) - len(_pairs(complete))
    sent: dict[tuple[int, str], float] = {}
    for step, metrics in first.metrics:
        for k, v in metrics.items():
            assert (step, k) not in sent, (step, k)    # each pair once
            sent[(step, k)] = v
    assert sent == every                               # the first value of each pair, all of them
    assert replay_metrics(out, first) == 0
