"""Canonical JSON and content digests: what cache keys (``plan.hashing``) and the stages' own
input digests (a dataset's files, an eval's task folder) are computed from. Floats that are whole
numbers hash as ints, NaN and infinities as strings, mappings with sorted keys."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def normalize(obj: Any) -> Any:
    """JSON-safe canonical form (see module docstring)."""
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, int):
        return obj
    if isinstance(obj, float):
        if math.isnan(obj):
            return "nan"
        if math.isinf(obj):
            return "inf" if obj > 0 else "-inf"
        if obj.is_integer() and abs(obj) < 2**53:
            return int(obj)
        return float(repr(obj))
    if isinstance(obj, Mapping):
        return {str(k): normalize(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [normalize(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"cannot hash a value of type {type(obj).__name__}: {obj!r}")


def canonical_json(obj: Any) -> str:
    return json.dumps(normalize(obj), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_hex(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def package_root(package: str) -> Path:
    """Source folder of a package without importing it (find_spec imports only its parents)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"package {package!r} is not importable")
    return Path(next(iter(spec.submodule_search_locations)))
