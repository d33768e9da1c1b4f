"""The quickstart through the real CLI in a subprocess, shrunk to seconds of training per stage
(same 8 stages, same DAG), for the tests that watch a whole run from outside."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from phaselab.orchestrator.engine.reaper import descendants

__all__ = ["ORPHANS_WITHIN_S", "KilledQuickstart", "closed_port", "descendants", "killed_quickstart", "quickstart_cmd",
           "quickstart_env", "start_quickstart", "wait_for_stage"]

TINY = ["defaults.train.steps=4", "defaults.train.final_eval_batches=1", "defaults.train.ckpt_every=2",
        "stages.yarn.train.steps=2", "stages.yarn.train.ckpt_every=1",
        "stages.ppl.eval.ppl.max_tokens=512", "stages.ppl_yarn.eval.ppl.max_tokens=512"]


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def quickstart_cmd(work: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "phaselab.orchestrator.cli.main", "run", "quickstart", *TINY, "--num-cpus", "2",
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


# How long the socket census watches the running cluster, and how long the cluster's processes
# may outlive their killed controller.
CENSUS_S = 6.0
ORPHANS_WITHIN_S = 10.0


@dataclass
class KilledQuickstart:
    """What :func:`killed_quickstart` saw of one run."""

    home: Path
    noted: dict[int, tuple[str, float]] = field(default_factory=dict)   # pid -> (name, start time)
    sockets: set[tuple[str, int]] = field(default_factory=set)        # listening (ip, port)
    token_mode: int | None = None
    killed_while_running: bool = False
    left: list[str] = field(default_factory=list)   # noted processes alive ORPHANS_WITHIN_S after the kill
    gone_after_s: float = 0.0

    @property
    def names(self) -> set[str]:
        return {name for name, _ in self.noted.values()}


def _listening(pids: set[int]) -> set[tuple[str, int]]:
    import psutil

    return {(c.laddr.ip, c.laddr.port) for c in psutil.net_connections("inet")
            if c.status == psutil.CONN_LISTEN and c.pid in pids}


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


def killed_quickstart(root: Path) -> KilledQuickstart:
    """The quickstart (``--no-mlflow``, a fresh ``~`` so its Ray token is created by this run):
    every process of its cluster and every socket they listen on, noted from the first stage on
    for CENSUS_S; then the controller SIGKILLed and its cluster's processes polled until gone."""
    seen = KilledQuickstart(home=root / "home")
    seen.home.mkdir()
    env = quickstart_env(HOME=str(seen.home))
    env.pop("RAY_AUTH_TOKEN_PATH", None)
    env.pop("RAY_AUTH_MODE", None)
    proc = start_quickstart(root / "work", "--no-mlflow", env=env)
    try:
        seen.noted = wait_for_stage(proc)
        deadline = time.monotonic() + CENSUS_S
        while time.monotonic() < deadline and proc.poll() is None:
            kids = descendants(proc.pid)
            seen.noted |= kids
            seen.sockets |= _listening(set(kids) | {proc.pid})
            time.sleep(0.5)
        token = seen.home / ".ray" / "auth_token"
        seen.token_mode = stat.S_IMODE(token.stat().st_mode) if token.exists() else None
    finally:
        seen.killed_while_running = proc.poll() is None
        if seen.killed_while_running:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    killed = time.monotonic()
    seen.left = _still_there(seen.noted)
    while seen.left and time.monotonic() - killed < ORPHANS_WITHIN_S:
        time.sleep(0.25)
        seen.left = _still_there(seen.noted)
    seen.gone_after_s = time.monotonic() - killed
    return seen
