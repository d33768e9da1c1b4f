"""``phaselab mlflow`` stops its server when it is stopped: the server runs in its own process
group (so its workers can be stopped together), and a SIGTERM to the command alone must not
leave it serving."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def _until(pred, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.5)
    return False


def test_sigterm_to_phaselab_mlflow_stops_the_server(tmp_path: Path) -> None:
    port = _free_port()
    health = f"http://127.0.0.1:{port}/health"
    exe = Path(sys.executable).parent / "phaselab"
    proc = subprocess.Popen([str(exe), "mlflow", "--port", str(port), "--catalog", f"sqlite:///{tmp_path / 'c.db'}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert _until(lambda: _answers(health), 120), "the MLflow server never answered"
        os.kill(proc.pid, signal.SIGTERM)          # the command only, not its server's group
        assert proc.wait(timeout=40) == 0
        assert _until(lambda: not _answers(health), 20), "the server outlived phaselab mlflow"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_remote_host_needs_allow_remote(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from phaselab.orchestrator.cli.main import app

    res = CliRunner().invoke(app, ["mlflow", "--host", "0.0.0.0", "--port", str(_free_port()), "--catalog",
                                   f"sqlite:///{tmp_path / 'c.db'}", "--json"])
    assert res.exit_code != 0 and "allow_remote" in res.output
    assert "--allow-remote" in CliRunner().invoke(app, ["mlflow", "--help"], env={"COLUMNS": "200"}).output
