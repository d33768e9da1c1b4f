"""Ray's Prometheus endpoints answer anyone on the machine without authentication, and the
dashboard agent's labels name grid, stage, cell and stage hash: a running quickstart's cluster
serves none of them by default; ``--metrics`` turns them on (still on 127.0.0.1 only)."""

from __future__ import annotations

import http.client
import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from _quickstart import descendants, quickstart_env, start_quickstart, wait_for_stage

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _metrics_endpoints(root: Path, *extra: str) -> tuple[int, dict[tuple[str, int], str]]:
    """(sockets listening, {(ip, port): process name} of those answering ``GET /metrics`` with
    Prometheus text) of the cluster of a quickstart started with ``extra``, probed while its first
    stage runs; the controller is killed afterwards (its reaper takes the cluster down)."""
    import psutil

    env = quickstart_env(HOME=str(root / "home"))
    proc = start_quickstart(root / "work", "--no-mlflow", *extra, env=env)
    try:
        wait_for_stage(proc)
        time.sleep(3)   # the agents start their exporters shortly after the node is up
        kids = descendants(proc.pid)
        listening = {(c.laddr.ip, c.laddr.port): kids.get(c.pid, ("?",))[0]
                     for c in psutil.net_connections("inet")
                     if c.status == psutil.CONN_LISTEN and c.pid in set(kids) | {proc.pid}}
        answering = {}
        for (ip, port), name in listening.items():
            try:
                with urllib.request.urlopen(f"http://{ip}:{port}/metrics", timeout=3) as resp:
                    if resp.status == 200 and b"# TYPE" in resp.read(1 << 20):
                        answering[(ip, port)] = name
            except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException):
                pass   # 401 (token-protected), not HTTP (gRPC: BadStatusLine), or closed
        return len(listening), answering
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def test_metrics_endpoints_are_off_by_default_and_on_with_the_flag(tmp_path: Path) -> None:
    (tmp_path / "off" / "home").mkdir(parents=True)
    (tmp_path / "on" / "home").mkdir(parents=True)
    n_off, off = _metrics_endpoints(tmp_path / "off")
    print(f"default: {n_off} listening, answering /metrics: {off}")
    assert n_off >= 5, n_off   # GCS, raylet, agents, workers: the probe saw the cluster
    assert off == {}
    n_on, on = _metrics_endpoints(tmp_path / "on", "--metrics")
    print(f"--metrics: {n_on} listening, answering /metrics: {on}")
    # the agent's exporter is up when the first stage runs; the dashboard's and the autoscaler's
    # (3 in all when the machine is idle) may come later on a loaded one
    assert "ray::DashboardAgent" in on.values() and 1 <= len(on) <= 3, on
    assert all(ip == "127.0.0.1" for ip, _ in on), on
