"""A stage's run folder: the name of every file in it, and the one per-step log.

Every writer and reader of a run folder takes its file names from here (workloads write them,
the orchestrator and catalog read them), so a name is spelt once:

    <run folder>/                      one stage, named by its content hash under the runs root
      metrics.jsonl                    STEPS_FILE: the per-step log, {"step": s, **metrics} a line
      metrics.json                     FINAL_METRICS_FILE: the final evaluation and time breakdown
      records.json                     RECORDS_FILE: the final MetricRecords
      eval_minima.json                 MINIMA_FILE: minimum loss per extra eval split
      provenance.json                  PROVENANCE_FILE: what ran (workloads.provenance)
      checkpoints/step_0001000/        CHECKPOINTS_DIR (one-process runs; Ray Train keeps its own)
        model.pt train_state.pt spec.json rng_rank0.pt   MODEL_FILE, STATE_FILE, SPEC_FILE, rng_file
      checkpoints/latest               LATEST: the newest complete checkpoint's name
      best/<metric>/model.pt, best.json   BEST_DIR, BEST_FILE (eval.select: best_valid)
      attempts.jsonl running.json      ATTEMPTS_FILE, RUNNING_FILE (the stage runner)
      metrics.replayed.json            REPLAY_STATE_FILE (lines of STEPS_FILE sent to the tracker)

The per-step log is append-only JSON lines, one per logged step, written by rank 0 of whichever
process trains (:class:`StepLog`). Each line is one unbuffered ``write()``, so a killed writer
leaves at most one torn final line: readers skip it, and the next writer cuts it away before
appending. A resumed run appends the steps after its checkpoint again; readers that need one
value per (step, metric) take the first (:func:`first_values`). The live progress view reads its
last training line (:func:`last_step`). Nothing here imports torch or the rest of phaselab.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

STEPS_FILE = "metrics.jsonl"
FINAL_METRICS_FILE = "metrics.json"
RECORDS_FILE = "records.json"
MINIMA_FILE = "eval_minima.json"
PROVENANCE_FILE = "provenance.json"
CHECKPOINTS_DIR = "checkpoints"
LATEST = "latest"
MODEL_FILE = "model.pt"
STATE_FILE = "train_state.pt"
SPEC_FILE = "spec.json"
BEST_DIR = "best"
BEST_FILE = "best.json"
ATTEMPTS_FILE = "attempts.jsonl"
RUNNING_FILE = "running.json"
REPLAY_STATE_FILE = "metrics.replayed.json"

_TAIL_BYTES = 16384   # a per-step line is < 1 KB; the last logged step is in the last few


def rng_file(rank: int) -> str:
    """One rank's RNG state inside a checkpoint folder."""
    return f"rng_rank{rank}.pt"


def steps_path(out_dir: str | Path) -> Path:
    return Path(out_dir) / STEPS_FILE


class MetricsFileError(ValueError):
    """A per-step line before the last one is malformed: corruption, not a torn write (failure
    class ``data`` when it stops a writer)."""


def _scan(path: Path, data: bytes) -> tuple[list[dict[str, Any]], tuple[int, int, str] | None]:
    """The records of a per-step file's bytes and its torn final line, if any, as
    ``(line number, byte offset, why)``. A final line is torn when it has no trailing newline or
    does not parse as a JSON object (a killed writer's); a bad line before it raises
    MetricsFileError naming ``path`` and the line number."""
    lines = data.split(b"\n")   # after the last newline: b"" or a torn line
    last = max((i for i, raw in enumerate(lines) if raw.strip()), default=-1)
    rows: list[dict[str, Any]] = []
    offset = 0
    for i, raw in enumerate(lines[:last + 1]):
        start, offset = offset, offset + len(raw) + 1
        if not raw.strip():
            continue
        if i == len(lines) - 1:
            return rows, (i + 1, start, f"no trailing newline ({len(raw)} bytes)")
        try:
            row = json.loads(raw.decode("utf-8"))
        except ValueError as err:   # JSONDecodeError, UnicodeDecodeError
            row, why = None, str(err)
        else:
            why = None if isinstance(row, dict) else f"not a JSON object but {type(row).__name__}"
        if why is None:
            rows.append(row)
        elif i == last:
            return rows, (i + 1, start, f"does not parse: {why}")
        else:
            raise MetricsFileError(f"{path}:{i + 1}: malformed metrics line {raw[:80]!r}: {why}")
    return rows, None


def truncate_torn_tail(path: str | Path) -> bool:
    """Cut a torn final line off ``path``, so what follows is appended to valid JSON lines.
    Returns whether it cut. Corruption before the last line raises MetricsFileError."""
    path = Path(path)
    if not path.is_file():
        return False
    _, torn = _scan(path, path.read_bytes())
    if torn is None:
        return False
    number, offset, why = torn
    log.warning("%s:%d: cutting a torn final line (%s) at byte %d before appending", path, number, why, offset)
    with open(path, "rb+") as f:
        f.truncate(offset)
    return True


def read_steps(path: str | Path) -> list[dict[str, Any]]:
    """The complete lines of a per-step file (``steps_path(out_dir)``), in order; [] when there
    is none. A torn final line is skipped with a logged warning, never read as finished; a
    malformed line before the last one is MetricsFileError (a ValueError) naming file and line."""
    path = Path(path)
    if not path.exists():
        return []
    rows, torn = _scan(path, path.read_bytes())
    if torn is not None:
        log.warning("%s:%d: skipping a torn final line (%s)", path, torn[0], torn[2])
    return rows


def first_values(rows: Iterable[Mapping[str, Any]], metric: str) -> dict[int, float]:
    """step -> the first logged value of ``metric`` (a resumed run logs some steps again)."""
    out: dict[int, float] = {}
    for row in rows:
        if metric in row:
            out.setdefault(int(row["step"]), float(row[metric]))
    return out


def last_step(out_dir: str | Path, metric: str = "train/loss") -> dict[str, Any] | None:
    """The newest complete line of the run's per-step log that holds ``metric``, read from the
    file's tail (a live view polls it), or None."""
    path = steps_path(out_dir)
    try:
        with open(path, "rb") as f:
            start = max(0, f.seek(0, os.SEEK_END) - _TAIL_BYTES)
            f.seek(start)
            lines = f.read().split(b"\n")
    except OSError:
        return None
    # a tail read mid-file starts mid-line; the final piece is b"" or a torn line
    for raw in reversed(lines[1:-1] if start else lines[:-1]):
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if isinstance(line, dict) and metric in line:
            return line
    return None


class StepLog:
    """The append side of a per-step file: ``append(step, metrics)`` writes one complete line.

    The first append of a log (a resumed run's new writer) cuts a torn final line away first,
    so the run appends to valid JSON lines again. Only the process that appends touches the file.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._repaired = False

    @classmethod
    def of(cls, out_dir: str | Path) -> StepLog:
        return cls(steps_path(out_dir))

    def append(self, step: int, metrics: Mapping[str, float]) -> None:
        line = json.dumps({"step": int(step), **{k: float(v) for k, v in metrics.items()}}) + "\n"
        if not self._repaired:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            truncate_torn_tail(self.path)
            self._repaired = True
        data = line.encode("utf-8")
        # Unbuffered O_APPEND: the whole line goes to the kernel in one write(2) (nothing is
        # held back in a user-space buffer to be flushed later, or in pieces).
        with open(self.path, "ab", buffering=0) as f:
            done = f.write(data)
            while done < len(data):   # a short write (disk full, signal): finish the line
                done += f.write(data[done:])

    def read(self) -> list[dict[str, Any]]:
        return read_steps(self.path)
