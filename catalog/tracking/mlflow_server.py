"""``phaselab mlflow``: start an MLflow tracking server beside the catalog (DESIGN §5.5).

- Binds 127.0.0.1 by default; another address must be asked for explicitly
  (``allow_remote=True``), because the server has no authentication of its own.
- The backend store is SQL (SQLite or PostgreSQL), never the deprecated file store
  (mlflow/mlflow#18534, refused by default since MLflow 3.13). On PostgreSQL MLflow needs its own
  database: its tables would clash with the catalog's (STACK.md).
- Artifacts are proxied through the server (``--artifacts-destination``), so workers need only
  the tracking URI, not access to the artifact store.
- One worker: SQLite breaks under parallel writers (mlflow/mlflow#4123).
"""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from phaselab.catalog.tracking.mlflow_tracker import catalog_dir


def default_backend_uri(catalog_url: str | None = None) -> str:
    return f"sqlite:///{catalog_dir(catalog_url).resolve() / 'mlflow.db'}"


def default_artifact_root(catalog_url: str | None = None) -> str:
    return str(catalog_dir(catalog_url).resolve() / "mlartifacts")


def server_command(*, host: str, port: int, backend_uri: str, artifact_root: str,
                   workers: int = 1, allow_remote: bool = False, access_log: bool = False) -> list[str]:
    """The ``mlflow server`` command line (validated; see the module docstring). Without
    ``access_log`` (default False) uvicorn writes no line per HTTP request (the UI makes dozens
    a page); startup messages and errors are still written."""
    scheme = backend_uri.split(":", 1)[0].split("+", 1)[0]
    if scheme not in ("sqlite", "postgresql", "mysql", "mssql"):
        raise ValueError(f"backend_uri {backend_uri!r} is not a SQL store; the file store is refused")
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback and not allow_remote:
        raise ValueError(f"host {host!r} is not a loopback address; pass allow_remote=True to expose "
                         "an unauthenticated MLflow server")
    if not 0 < int(port) < 65536:
        raise ValueError(f"port must be in 1..65535, got {port!r}")
    if "://" not in artifact_root:
        Path(artifact_root).mkdir(parents=True, exist_ok=True)
    return [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend_uri,
            "--artifacts-destination", artifact_root, "--host", host, "--port", str(int(port)),
            "--workers", str(int(workers)), *([] if access_log else ["--uvicorn-opts", "--no-access-log"])]


def wait_healthy(url: str, timeout_s: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    """Poll ``<url>/health`` until it answers OK; raises TimeoutError (or RuntimeError if ``proc``
    exited) otherwise."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"mlflow server at {url} not healthy after {timeout_s:.0f} s")


def serve(host: str = "127.0.0.1", port: int = 5000, backend_uri: str | None = None,
          artifact_root: str | None = None, *, catalog_url: str | None = None, workers: int = 1,
          allow_remote: bool = False, block: bool = True, log_path: Path | None = None,
          on_start: Callable[[], None] | None = None, access_log: bool = False,
          on_ready: Callable[[str], None] | None = None) -> subprocess.Popen | int:
    """Start ``mlflow server``. ``block=True`` (the CLI): run until interrupted, return its exit
    code. ``block=False``: return the process once ``/health`` answers (stop it with :func:`stop`).
    Defaults: SQLite ``mlflow.db`` and ``mlartifacts/`` beside the catalog. ValueError (before
    anything starts) for a non-loopback host without ``allow_remote`` or a bad port;
    ``on_start`` is called once the command is valid, just before the server starts, and
    ``on_ready(url)`` (``block=True``) from a thread once ``/health`` answers."""
    cmd = server_command(host=host, port=port, workers=workers, allow_remote=allow_remote, access_log=access_log,
                         backend_uri=backend_uri or default_backend_uri(catalog_url),
                         artifact_root=artifact_root or default_artifact_root(catalog_url))
    if on_start is not None:
        on_start()
    # MLflow's server job runner (a huey consumer and its workers, for GenAI judge jobs and trace
    # roll-ups) is on by default; phaselab submits no MLflow jobs, so it stays off unless asked for
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": os.environ.get("MLFLOW_DISABLE_TELEMETRY", "true"),
           "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": os.environ.get("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")}
    out = open(log_path, "ab") if log_path is not None else None  # noqa: SIM115 (lives with the process)
    # Own process group: gunicorn/uvicorn workers are stopped with the server (stop()).
    proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT if out else None,
                            start_new_session=True)
    if block:
        # SIGTERM (a service manager, `kill`) stops the server with us: it runs in its own
        # process group, so without this it would outlive the command that started it
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, _interrupt) if main else None
        if on_ready is not None:
            threading.Thread(target=_when_healthy, args=(f"http://{host}:{port}", proc, on_ready),
                             daemon=True).start()
        try:
            return proc.wait()
        except KeyboardInterrupt:
            stop(proc)
            return 0
        finally:
            if main:
                signal.signal(signal.SIGTERM, previous)
    try:
        wait_healthy(f"http://{host}:{port}", proc=proc, timeout_s=120)
    except Exception:
        stop(proc)
        raise
    return proc


def _when_healthy(url: str, proc: subprocess.Popen, callback: Callable[[str], None]) -> None:
    try:
        wait_healthy(url, proc=proc, timeout_s=120)
    except (TimeoutError, RuntimeError):
        return
    callback(url)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def stop(proc: subprocess.Popen, timeout_s: float = 20.0) -> None:
    """Stop a server started by :func:`serve` and its workers (its process group)."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout_s)
