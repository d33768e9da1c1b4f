"""``phaselab mlflow`` writes no line per HTTP request by default (the UI makes dozens a page):
a real ``mlflow server`` answering requests, its log read back."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest

from phaselab.catalog.tracking import mlflow_server

pytestmark = pytest.mark.slow


def test_the_server_logs_no_line_per_request(tmp_path: Path) -> None:
    cmd = mlflow_server.server_command(host="127.0.0.1", port=5001, backend_uri="sqlite:///x.db",
                                       artifact_root=str(tmp_path / "a"))
    assert cmd[cmd.index("--uvicorn-opts") + 1] == "--no-access-log"
    loud = mlflow_server.server_command(host="127.0.0.1", port=5001, backend_uri="sqlite:///x.db",
                                        artifact_root=str(tmp_path / "a"), access_log=True)
    assert "--uvicorn-opts" not in loud
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "server.log"
    proc = mlflow_server.serve(port=port, backend_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", block=False,
                               artifact_root=str(tmp_path / "artifacts"), log_path=log)
    try:
        for path in ("/health", "/version", "/health"):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
                assert resp.status == 200
    finally:
        mlflow_server.stop(proc)
    text = log.read_text(errors="replace")
    assert "Uvicorn running on http://127.0.0.1" in text or "Application startup complete" in text, text[-2000:]
    assert "GET /health" not in text and "GET /version" not in text, text[-2000:]
