"""The documented maxima of what a grid (file or overrides) may ask for, in one place.

Every limit is checked before the thing it bounds is expanded or allocated: the file size before
it is read, the YAML node count and nesting depth while the node tree is composed (an alias is
counted once per place it is used, so a "billion laughs" file is refused in linear time), the
cell and stage counts from the axis lengths before a single cell is built, and numeric config
values where the stage sections are resolved (``.inf`` and ``.nan`` are refused there too). The
same limits hold for command-line overrides: their values are read by the grid files' loader and
the document they make is counted again (``yamlio.check_tree``). None of them changes a stage's
cache key: they only refuse.

==========================  =========  ===================================================
limit                       default    bounds
==========================  =========  ===================================================
``MAX_YAML_BYTES``          1 MiB      a grid file's size
``MAX_YAML_NODES``          100 000    YAML nodes after alias expansion (``x-`` keys too)
``MAX_YAML_DEPTH``          64         nesting of mappings and lists
``MAX_SCALAR_CHARS``        65 536     one scalar's text
``MAX_SEEDS``               1 000      entries of ``seeds``
``MAX_SWEEP_VALUES``        10 000     values of one axis or override sweep (``range()``)
``MAX_CELLS``               10 000     cells of a grid (axes product x zips x seeds)
``MAX_STAGES``              100 000    stage instances (cells x stage templates)
``MAX_STEPS``               10^8       any ``*steps`` / ``*_every`` key of a section
``MAX_BATCH``               2^20       any ``*batch_size`` / ``grad_accum`` key (at least 1) and
                                       ``*batches`` key
``MAX_LENGTH``              2^24       any ``*len*`` / ``*length*`` / ``block_size`` key (tokens;
                                       ``block_size`` at least 1)
``MAX_SEED``                2^32 - 1   ``seeds`` and any ``seed`` key
``MAX_INT``                 2^53       any other integer of a section (magnitude)
==========================  =========  ===================================================

``MAX_CELLS`` and ``MAX_STAGES`` can be raised for one run with the environment variables
``PHASELAB_MAX_CELLS`` / ``PHASELAB_MAX_STAGES`` (the CLI's ``--max-cells`` sets the first).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

MAX_YAML_BYTES = 1 << 20
MAX_YAML_NODES = 100_000
MAX_YAML_DEPTH = 64
MAX_SCALAR_CHARS = 1 << 16
MAX_SEEDS = 1_000
MAX_SWEEP_VALUES = 10_000
MAX_CELLS = 10_000
MAX_STAGES = 100_000
MAX_STEPS = 10**8
MAX_BATCH = 1 << 20
MAX_LENGTH = 1 << 24
MAX_SEED = 2**32 - 1
MAX_INT = 2**53

CELLS_ENV = "PHASELAB_MAX_CELLS"
STAGES_ENV = "PHASELAB_MAX_STAGES"

# (pattern on a section's leaf key, lowest allowed, highest allowed, what it is)
_KEY_BOUNDS: tuple[tuple[re.Pattern[str], int, int, str], ...] = (
    (re.compile(r"^seed$"), 0, MAX_SEED, "seed"),
    (re.compile(r"(^|_)steps$|_every$"), 0, MAX_STEPS, "step count"),
    (re.compile(r"batch_size$|^grad_accum$"), 1, MAX_BATCH, "batch size"),
    (re.compile(r"batches$"), 0, MAX_BATCH, "batch count"),
    (re.compile(r"^block_size$"), 1, MAX_LENGTH, "length in tokens"),
    (re.compile(r"len|length"), 0, MAX_LENGTH, "length in tokens"),
)


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or len(raw) > 12 or int(raw) < 1:
        raise ValueError(f"{name}={raw!r} must be a positive integer")
    return int(raw)


def max_cells() -> int:
    """``MAX_CELLS``, or ``PHASELAB_MAX_CELLS`` when set (an explicit, per-run override)."""
    return _env_int(CELLS_ENV, MAX_CELLS)


def max_stages() -> int:
    return _env_int(STAGES_ENV, MAX_STAGES)


def bounds_for(key: str) -> tuple[int, int, str]:
    """(lowest, highest, what) for an integer under the leaf name ``key``."""
    for pattern, low, high, what in _KEY_BOUNDS:
        if pattern.search(key):
            return low, high, what
    return -MAX_INT, MAX_INT, "integer"


def out_of_range(key: str, value: Any) -> str | None:
    """Why the integer ``value`` of leaf ``key`` is outside its documented range, or None.
    Non-integers pass (their type is the config converter's business)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    low, high, what = bounds_for(key)
    if low <= value <= high:
        return None
    shown = str(value) if len(str(value)) <= 24 else f"an integer of {len(str(abs(value)))} digits"
    return f"{what} must be in [{low}, {high}], got {shown}"


def not_finite(value: Any) -> str | None:
    """Why ``value`` is refused as a number (``.inf``, ``.nan``: no setting takes them), or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"a number must be finite, got {value}"
    return None


def iter_leaves(value: Any, name: str) -> Iterator[tuple[str, Any]]:
    """(dotted name, value) of every scalar under ``value``; list items share their list's name."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from iter_leaves(v, f"{name}.{k}" if name else str(k))
    elif isinstance(value, list):
        for v in value:
            yield from iter_leaves(v, name)
    else:
        yield name, value
