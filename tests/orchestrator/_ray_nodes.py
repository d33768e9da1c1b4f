"""Real Ray nodes for the multi-node tests: each one a ``ray start --block`` process (through
``python -m phaselab.orchestrator.engine.ray_local start``, everything on 127.0.0.1) with its own temp
dir and ports, started, identified (its node id, from its raylet's command line), killed like a
lost machine (SIGKILL to the whole process tree) and stopped."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from phaselab.orchestrator.engine.reaper import descendants

# every port a node listens on; a head adds the GCS, dashboard and Ray Client ports
NODE_PORTS = ("node-manager-port", "object-manager-port", "dashboard-agent-listen-port",
              "dashboard-agent-grpc-port", "metrics-export-port", "runtime-env-agent-port")
HEAD_PORTS = ("port", "dashboard-port", "ray-client-server-port")
WORKER_PORTS = 20   # --min-worker-port .. --max-worker-port
OWN_OPTIONS = {f"--{p}" for p in (*NODE_PORTS, *HEAD_PORTS, "min-worker-port", "max-worker-port",
                                  "temp-dir", "address")}


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_block(n: int) -> list[int]:
    """``n`` consecutive ports free on 127.0.0.1 (Redis holds 6379; other tests hold theirs)."""
    for _ in range(200):
        base = random.randrange(20000, 30000 - n)
        if all(_free(p) for p in range(base, base + n)):
            return list(range(base, base + n))
    raise RuntimeError(f"no block of {n} free ports on 127.0.0.1")


class RayNode:
    """One Ray node of a loopback cluster (see the module docstring)."""

    def __init__(self, temp_dir: Path, env: dict[str, str], argv: list[str], *, head_address: str | None = None) -> None:
        """``argv``: the options of a documented ``ray_local start`` command (docs/CLUSTER.md);
        its temp dir, head address and ports are replaced by this node's."""
        self.temp_dir, self.env, self.head_address = Path(temp_dir), env, head_address
        self.documented = [a for a in argv if a.split("=", 1)[0] not in OWN_OPTIONS]
        self.proc: subprocess.Popen | None = None
        self.ports: dict[str, int] = {}
        self.node_id: str | None = None

    @property
    def gcs_address(self) -> str:
        return f"127.0.0.1:{self.ports['port']}"

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.ports['dashboard-port']}"

    def _argv(self) -> list[str]:
        names = NODE_PORTS + (HEAD_PORTS if self.head_address is None else ())
        block = free_port_block(len(names) + WORKER_PORTS)
        self.ports = dict(zip(names, block, strict=False))
        argv = [*self.documented, *(f"--{k}={v}" for k, v in self.ports.items()),
                f"--min-worker-port={block[len(names)]}", f"--max-worker-port={block[-1]}",
                f"--temp-dir={self.temp_dir}", "--disable-usage-stats"]
        return argv if self.head_address is None else [*argv, f"--address={self.head_address}"]

    def start(self, timeout_s: float = 90.0) -> RayNode:
        """Start the node and wait until its raylet runs; sets ``node_id``."""
        self.temp_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.temp_dir / "ray-start.log"
        seen = log_path.stat().st_size if log_path.exists() else 0   # a restart appends to the log
        log = open(log_path, "ab")   # noqa: SIM115 - kept open by the child
        self.proc = subprocess.Popen([sys.executable, "-m", "phaselab.orchestrator.engine.ray_local", "start", *self._argv()],
                                     env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        log.close()
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            self.node_id = self._raylet_node_id()
            started = b"Ray runtime started" in log_path.read_bytes()[seen:]
            if self.node_id and started:
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.3)
        tail = log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"Ray node in {self.temp_dir} did not start:\n{tail}")

    def _raylet_node_id(self) -> str | None:
        import psutil

        for pid, (name, _) in descendants(self.proc.pid).items():
            if name != "raylet":
                continue
            with contextlib.suppress(psutil.Error):
                for arg in psutil.Process(pid).cmdline():
                    if arg.startswith("--node_id="):
                        return arg.split("=", 1)[1]
        return None

    def kill(self) -> None:
        """SIGKILL the node's whole process tree at once, as a lost machine ends."""
        if self.proc is None:
            return
        pids = [*descendants(self.proc.pid), self.proc.pid]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM ``ray start --block`` (it stops its node), then SIGKILL what is left."""
        if self.proc is None or self.proc.poll() is not None:
            return
        pids = [*descendants(self.proc.pid), self.proc.pid]
        self.proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=grace_s)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
