"""Settings of a local Ray cluster started by the controller: every component on 127.0.0.1,
Ray's token file readable by its owner only, and a reaper that takes the cluster's helper
processes down with the controller (:mod:`phaselab.orchestrator.reaper`)."""

from __future__ import annotations

import os
from pathlib import Path

from phaselab.orchestrator.reaper import start_reaper

__all__ = ["loopback_only", "private_token", "ray_token_path", "start_reaper"]


def loopback_only() -> None:
    """Make Ray use 127.0.0.1 as this node's address: on Linux it otherwise resolves even an
    explicit 127.0.0.1 to the host's routable IP and binds GCS, raylet, workers and the agents'
    metrics endpoints there or on all interfaces. The environment reaches every process the
    local cluster starts; the constant covers a ``ray`` imported before this call."""
    from ray._private import ray_constants

    os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False


def ray_token_path() -> Path:
    """Where Ray reads its authentication token (RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)."""
    return Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")


def private_token() -> None:
    """Ray writes a new token with the umask's mode (world-readable under 022). Create it 0600
    ourselves when token auth is on and there is none yet, and narrow an existing one."""
    import secrets

    path = ray_token_path()
    if not path.exists() and not os.environ.get("RAY_AUTH_TOKEN") and \
            os.environ.get("RAY_AUTH_MODE", "token").lower() == "token":
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:   # another process created it first
            pass
        else:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))   # Ray's own format: 256 bits as hex
    try:
        if path.is_file() and path.stat().st_uid == os.getuid() and path.stat().st_mode & 0o077:
            path.chmod(0o600)
    except OSError:
        pass
