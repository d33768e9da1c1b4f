"""Which files a ``data.text.path`` names, read in one deterministic order, with bounded cost.

``text.path`` is one of
- a file: that file;
- a folder: every ``*.txt`` file under it, recursively (hidden files and folders skipped);
- a glob (``*``, ``?`` or ``[`` in the last components, e.g. ``corpus/**/*.md``): the regular
  files it matches.
Relative paths and globs are taken under the shipped assets folder and may not escape it;
absolute ones are the user's explicit choice. Files are read in the sorted order of their path
relative to the folder or glob root and concatenated byte for byte (a single file is the
one-file case of the same rule), so the train/valid split of ``TextDataset`` (the first
``train_fraction`` of the characters train, the rest valid) is a pure function of the files'
names and bytes. At most ``MAX_FILES`` files and ``MAX_BYTES`` bytes in all: a larger corpus is
prepared into shards once (``phaselab data prepare``) and read as ``kind: tokens``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from phaselab.workloads.data import file_sha256, resolve_path

MAX_FILES = 10_000
MAX_BYTES = 1 << 30   # the text is held in memory and tokenised in one process
GLOB_CHARS = frozenset("*?[")


def _is_glob(value: str) -> bool:
    return any(c in GLOB_CHARS for c in value)


def _visible(path: Path, root: Path) -> bool:
    return path.is_file() and not any(part.startswith(".") for part in path.relative_to(root).parts)


def _glob_root(value: str, root: Path) -> tuple[Path, str]:
    """(the folder before the first glob component, the pattern after it)."""
    parts = Path(value).expanduser().parts
    first = next(i for i, p in enumerate(parts) if _is_glob(p))
    if first == 0 or (first == 1 and Path(value).is_absolute()):
        base = Path(parts[0]) if Path(value).is_absolute() else Path(".")
    else:
        base = Path(*parts[:first])
    pattern = str(Path(*parts[first:]))
    if ".." in Path(pattern).parts:
        raise ValueError(f"text.path={value!r}: '..' is not allowed after a glob character")
    return resolve_path(str(base), root=root, what="text.path"), pattern


def _bounded(found: list[Path], what: str) -> list[Path]:
    if len(found) > MAX_FILES:
        raise ValueError(f"{what} matches more than {MAX_FILES} files; prepare the corpus into shards "
                         "with `phaselab data prepare` and use data.kind: tokens")
    return found


def text_files(value: str, *, root: Path) -> tuple[Path, list[Path]]:
    """(the root the files are named relative to, the files in reading order) for a
    ``text.path`` value (module docstring). Raises ValueError naming the value when nothing
    matches, a bound is passed, or a relative value escapes ``root``."""
    if _is_glob(value):
        base, pattern = _glob_root(value, root)
        found: list[Path] = []
        for p in base.glob(pattern) if base.is_dir() else ():
            if _visible(p, base):
                found.append(p)
                _bounded(found, f"text.path={value!r}")
        files = sorted(found, key=lambda p: p.relative_to(base).as_posix())
    else:
        base = resolve_path(value, root=root, what="text.path")
        if base.is_file():
            return base.parent, [base]
        if not base.is_dir():
            raise ValueError(f"text.path {base} does not exist (a file, a folder of .txt files or a glob)")
        found = []
        for p in base.rglob("*.txt"):
            if _visible(p, base):
                found.append(p)
                _bounded(found, f"text.path={value!r}")
        files = sorted(found, key=lambda p: p.relative_to(base).as_posix())
    if not files:
        raise ValueError(f"text.path={value!r} matches no text file under {base}")
    total = sum(p.stat().st_size for p in files)
    if total > MAX_BYTES:
        raise ValueError(f"text.path={value!r} holds {total} bytes, more than {MAX_BYTES}; prepare it into "
                         "shards with `phaselab data prepare` and use data.kind: tokens")
    return base, files


def files_sha256(base: Path, files: list[Path]) -> str:
    """sha256 over the files' relative names and byte digests, in reading order."""
    listing = [[p.relative_to(base).as_posix(), file_sha256(p)] for p in files]
    return hashlib.sha256(json.dumps(listing).encode()).hexdigest()


def read_text(files: list[Path]) -> str:
    """The files' UTF-8 text, concatenated in order (a decoding error names the file)."""
    parts = []
    for p in files:
        try:
            parts.append(p.read_bytes().decode("utf-8"))
        except UnicodeDecodeError as err:
            raise ValueError(f"{p} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    return "".join(parts)
