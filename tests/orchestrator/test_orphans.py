"""A controller SIGKILLed mid-run leaves no process of its local Ray cluster behind (raylet,
GCS, dashboard and runtime-env agents, workers) for more than a few seconds."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from _quickstart import start_quickstart, wait_for_stage

pytestmark = [pytest.mark.ray, pytest.mark.slow]

WITHIN_S = 10.0


def _still_there(noted: dict[int, tuple[str, float]]) -> list[str]:
    import psutil

    left = []
    for pid, (name, created) in noted.items():
        try:
            p = psutil.Process(pid)
            if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{name} ({pid})")
        except psutil.Error:
            pass
    return left


def test_no_cluster_process_outlives_a_killed_controller(tmp_path: Path) -> None:
    proc = start_quickstart(tmp_path, "--no-mlflow")
    try:
        noted = wait_for_stage(proc)
        time.sleep(1.0)   # the agents are up by now; note them too
        noted |= wait_for_stage(proc)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    names = {name for name, _ in noted.values()}
    assert {"raylet", "gcs_server", "ray::DashboardAgent", "ray::RuntimeEnvAgent"} <= names, names
    killed = time.monotonic()
    left = _still_there(noted)
    while left and time.monotonic() - killed < WITHIN_S:
        time.sleep(0.25)
        left = _still_there(noted)
    print(f"cluster processes gone {time.monotonic() - killed:.1f} s after the controller's SIGKILL")
    assert not left, f"still running {WITHIN_S:g} s after the controller was killed: {left}"
