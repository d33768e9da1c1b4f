"""The one check of every path a user gives (a training config's ``out_dir`` and ``init_from``,
``phaselab eval``'s checkpoint and ``--out``) and of the run folders phaselab writes into.

It lives in ``workloads`` (standard library only) so that the command line (``orchestrator``) and
the run-folder writers (``train.checkpoint``, ``train.api``) share it; the layering rule forbids
the other direction (tests/test_layering.py).

    check_path(raw, what="out_dir", expect="new_dir", within=Path.cwd())   # -> Path(raw)
    check_run_folder(Path("runs/x"))    # no symlink under runs/x leads outside it
    confine(Path("runs/x/checkpoints"), Path("runs/x"))

A refusal is :class:`PathRefused` (a ValueError) whose one-line message names the path, as typed,
and what is wrong with it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

# Linux limits (<linux/limits.h>): PATH_MAX counts the terminating NUL, NAME_MAX one component.
MAX_PATH_BYTES = 4095
MAX_NAME_BYTES = 255
# A run folder holds a few checkpoints of a handful of files each; a walk of more entries than
# this is refused instead of taking unbounded time.
MAX_RUN_FOLDER_ENTRIES = 100_000
EXPECTS = ("file", "dir", "exists", "new_dir")


class PathRefused(ValueError):
    """A path that cannot be used; the message names it and what is wrong."""


def shown(raw: Any, limit: int = 400) -> str:
    """``raw`` quoted for a one-line message (NUL and newlines escaped, long paths shortened)."""
    text = repr(os.fspath(raw) if isinstance(raw, (str, os.PathLike)) else raw)
    return text if len(text) <= limit else f"{text[: limit // 2]}...{text[-limit // 2:]} ({len(text)} chars)"


def _text(raw: Any, what: str) -> str:
    if isinstance(raw, os.PathLike):
        raw = os.fspath(raw)
    if not isinstance(raw, str):
        raise PathRefused(f"{what} must be a path string, got {type(raw).__name__} {shown(raw)}")
    if not raw:
        raise PathRefused(f"{what} is empty; give a path")
    if "\x00" in raw:
        raise PathRefused(f"{what} {shown(raw)} holds a NUL byte, which no path can contain")
    size = len(os.fsencode(raw))
    if size > MAX_PATH_BYTES:
        raise PathRefused(f"{what} {shown(raw)} is {size} bytes long; a path may have at most {MAX_PATH_BYTES}")
    longest = max((len(os.fsencode(part)) for part in raw.split(os.sep)), default=0)
    if longest > MAX_NAME_BYTES:
        raise PathRefused(f"{what} {shown(raw)} has a name of {longest} bytes; a name may have at most "
                          f"{MAX_NAME_BYTES}")
    return raw


def resolved(path: Path, what: str) -> Path:
    """``path`` with every symlink on the way resolved (missing tails kept as written)."""
    try:
        return Path(path).resolve(strict=False)
    except (OSError, RuntimeError) as err:   # a symlink loop, a component that is not a folder
        raise PathRefused(f"{what} {shown(path)} cannot be resolved: {getattr(err, 'strerror', None) or err}") from None


def confine(path: Path, within: Path, *, what: str = "path") -> Path:
    """``path`` resolved; PathRefused unless it lies inside ``within`` (also resolved): every
    symlink on the way counts, so a link to elsewhere is refused, not followed."""
    real, root = resolved(path, what), resolved(within, what)
    if not real.is_relative_to(root):
        raise PathRefused(f"{what} {shown(path)} leads to {str(real)!r}, outside {str(root)!r}")
    return real


def _check_kind(raw: str, real: Path, what: str, expect: str) -> None:
    if expect == "file" and not real.is_file():
        problem = "is a folder" if real.is_dir() else "does not exist"
        raise PathRefused(f"{what} {shown(raw)} {problem}; expected a file")
    if expect == "dir" and not real.is_dir():
        problem = "names an existing file" if real.exists() else "does not exist"
        raise PathRefused(f"{what} {shown(raw)} {problem}; expected a folder")
    if expect == "exists" and not real.exists():
        raise PathRefused(f"{what} {shown(raw)} does not exist")
    if expect == "new_dir":
        if real.exists() and not real.is_dir():
            raise PathRefused(f"{what} {shown(raw)} names an existing file; expected a folder (existing or new)")
        parent = real.parent
        while not parent.exists():
            parent = parent.parent
        if not parent.is_dir():
            raise PathRefused(f"{what} {shown(raw)} lies under {str(parent)!r}, which is a file, not a folder")


def check_path(raw: Any, *, what: str, expect: str = "exists", within: Path | None = None) -> Path:
    """Check one user-given path and return it as a Path (as written, not resolved).

    Args:
        raw: a str or os.PathLike.
        what: how messages name it (``"out_dir"``, ``"checkpoint"``).
        expect: ``"file"`` (an existing file), ``"dir"`` (an existing folder), ``"exists"``
            (either; default) or ``"new_dir"`` (a folder to write: existing, or creatable under
            folders only).
        within: when given, the path must lead inside this folder after every symlink on the way
            is resolved (:func:`confine`).
    Raises:
        PathRefused: NUL byte, empty, longer than MAX_PATH_BYTES or a name longer than
            MAX_NAME_BYTES, unresolvable (symlink loop), outside ``within``, or of the wrong type.
    """
    if expect not in EXPECTS:
        raise ValueError(f"expect={expect!r}: expected one of {EXPECTS}")
    text = _text(raw, what)
    real = confine(Path(text), within, what=what) if within is not None else resolved(Path(text), what)
    _check_kind(text, real, what, expect)
    return Path(text)


def check_run_folder(folder: Path, *, what: str = "run folder",
                     max_entries: int = MAX_RUN_FOLDER_ENTRIES) -> None:
    """PathRefused when any entry under ``folder`` is a symlink that leads outside it (writing
    through it would put files elsewhere), or when it holds more than ``max_entries`` entries.
    ``folder`` itself is the caller's to confine (:func:`check_path` with ``within``); a missing
    folder passes (there is nothing in it yet)."""
    folder = Path(folder)
    root = resolved(folder, what)
    if not root.is_dir():
        return
    count = 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            count += 1
            if count > max_entries:
                raise PathRefused(f"{what} {shown(folder)} holds more than {max_entries} entries; "
                                  "is it the right folder?")
            entry = Path(dirpath, name)
            if entry.is_symlink():
                confine(entry, root, what=f"{what} {shown(folder)}: symlink")
