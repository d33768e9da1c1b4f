"""Real file-system faults for the resource-fault tests: a tiny tmpfs that can be filled (ENOSPC)
or remounted read-only (EROFS). Mounting needs root (CAP_SYS_ADMIN); where it is refused the
tests that need it skip and say why. A chmod'ed folder is no read-only folder for root, who
passes every permission check, so these use a real mount."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def _mount(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30, check=False)


@contextmanager
def tiny_fs(path: Path, size_kb: int = 512) -> Iterator[Path]:
    """A ``size_kb`` tmpfs mounted at ``path`` (created), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    res = _mount("-t", "tmpfs", "-o", f"size={size_kb}k,mode=0755", "tmpfs", str(path))
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30, check=False)


def make_readonly(path: Path) -> None:
    """Remount the tmpfs at ``path`` read-only."""
    res = _mount("-o", "remount,ro", str(path))
    assert res.returncode == 0, res.stderr


def fill(path: Path) -> int:
    """Write ``path/fill`` until the file system is full; returns the bytes written."""
    written = 0
    with open(path / "fill", "wb", buffering=0) as f:
        try:
            while True:
                written += f.write(b"\0" * 4096)
        except OSError as err:
            assert err.errno == 28, err   # ENOSPC
    return written
