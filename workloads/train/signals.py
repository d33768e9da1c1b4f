"""SIGTERM → save a checkpoint and stop (DESIGN §5.7 "Signals and resume").

Preemption (Kubernetes, Slurm, Ray's node drain) sends SIGTERM and waits a grace period before
SIGKILL. The handler only sets a flag — doing I/O inside a signal handler could interrupt a
half-finished optimiser step — and the loop checks the flag after each step, saves a checkpoint and
raises :class:`TrainingPreempted`, so the stage is retried and resumes from exactly that step.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


class TrainingPreempted(RuntimeError):
    """Raised after a SIGTERM once the checkpoint for ``step`` is on disk."""

    def __init__(self, step: int, checkpoint: str | None) -> None:
        super().__init__(f"training stopped by SIGTERM after step {step}; checkpoint {checkpoint}")
        self.step = step
        self.checkpoint = checkpoint


@dataclass
class StopFlag:
    """Set by the SIGTERM handler; read by the loop after each optimiser step."""

    requested: bool = False
    signum: int | None = None


@contextmanager
def stop_on_sigterm() -> Iterator[StopFlag]:
    """Install a SIGTERM handler for the duration of the block and restore the previous one.

    Signal handlers can only be installed from the main thread; elsewhere (e.g. inside some Ray
    actors) the flag is returned unarmed and Ray's own preemption handling applies.
    """
    flag = StopFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def _handler(signum: int, frame: object) -> None:
        flag.requested = True
        flag.signum = signum

    previous = signal.signal(signal.SIGTERM, _handler)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGTERM, previous)
