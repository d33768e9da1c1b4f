"""The quickstart through the real CLI in a subprocess, shrunk to seconds of training per stage
(same 8 stages, same DAG), for the tests that watch a whole run from outside."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from phaselab.orchestrator.reaper import descendants

__all__ = ["closed_port", "descendants", "quickstart_cmd", "quickstart_env", "start_quickstart", "wait_for_stage"]

TINY = ["defaults.train.steps=4", "defaults.train.final_eval_batches=1", "defaults.train.ckpt_every=2",
        "stages.yarn.train.steps=2", "stages.yarn.train.ckpt_every=1",
        "stages.ppl.eval.ppl.max_tokens=512", "stages.ppl_yarn.eval.ppl.max_tokens=512"]


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def quickstart_cmd(work: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "phaselab.orchestrator.cli", "run", "quickstart", *TINY, "--num-cpus", "2",
            "--catalog", f"sqlite:///{work / 'catalog.db'}", "--runs-root", str(work / "runs"), *extra]


def quickstart_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS")}
    return env | extra


def start_quickstart(work: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    work.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(quickstart_cmd(work, *extra), cwd=work, env=env or quickstart_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_for_stage(proc: subprocess.Popen, timeout_s: float = 90.0) -> dict[int, tuple[str, float]]:
    """Wait until a stage's Ray task runs under ``proc``; returns the descendants then."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        kids = descendants(proc.pid)
        if any(name.startswith("ray::quickstart:") for name, _ in kids.values()):
            return kids
        time.sleep(0.3)
    raise AssertionError(f"no stage started within {timeout_s} s (exit code {proc.poll()})")
