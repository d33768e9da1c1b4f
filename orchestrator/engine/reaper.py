"""A watchdog that takes a local Ray cluster down with the process that started it.

When a controller dies without ``ray.shutdown()`` (SIGKILL, OOM killer), the raylet and GCS
follow within seconds, but Ray's dashboard agent and runtime-env agent first try to report the
raylet's death to the dead GCS and linger for a minute or more. :func:`start_reaper` spawns a
small process, outside the controller's process group, that holds the read end of a pipe whose
write end only the controller holds (it is not inherited by anything the controller starts).
The reaper notes the controller's descendants twice a second; when the pipe reads end-of-file
(the controller is gone, however it died) it sends SIGTERM to every noted process that still
exists (same pid and start time), then SIGKILL to those left after ``GRACE_S``.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time

POLL_S = 0.5
GRACE_S = 3.0
_KEEP: list[int] = []   # write ends of reaper pipes, open until this process ends


def start_reaper() -> subprocess.Popen:
    """Spawn the reaper for this process (see the module docstring); returns it."""
    read_fd, write_fd = os.pipe()   # both non-inheritable: Ray's processes never get them
    try:
        proc = subprocess.Popen([sys.executable, "-m", "phaselab.orchestrator.engine.reaper", str(read_fd),
                                 str(os.getpid())], pass_fds=(read_fd,), start_new_session=True,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    finally:
        os.close(read_fd)
    _KEEP.append(write_fd)
    return proc


def descendants(pid: int) -> dict[int, tuple[str, float]]:
    """pid -> (name, start time) of every live descendant of ``pid``."""
    import psutil

    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return {}
    out = {}
    for k in kids:
        try:
            out[k.pid] = (k.name(), k.create_time())
        except psutil.Error:
            pass
    return out


def _running(p) -> bool:
    import psutil

    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _alive(pids: dict[int, float]) -> list:
    import psutil

    procs = []
    for pid, created in pids.items():
        try:
            p = psutil.Process(pid)
            if p.create_time() == created and _running(p):
                procs.append(p)
        except psutil.Error:
            pass
    return procs


def reap(read_fd: int, watched: int) -> None:
    """Note ``watched``'s descendants until ``read_fd`` reads EOF, then stop them."""
    import psutil

    noted: dict[int, float] = {}
    while True:
        noted.update({pid: created for pid, (_, created) in descendants(watched).items()})
        noted.pop(os.getpid(), None)   # the reaper is the controller's child too
        ready, _, _ = select.select([read_fd], [], [], POLL_S)
        if ready and not os.read(read_fd, 1):
            break
    procs = _alive(noted)
    for p in procs:
        with contextlib.suppress(psutil.Error):   # gone since
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while procs and time.monotonic() < deadline:
        time.sleep(0.1)
        procs = [p for p in procs if _running(p)]
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()


if __name__ == "__main__":
    reap(int(sys.argv[1]), int(sys.argv[2]))
