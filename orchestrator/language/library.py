"""Resolve a grid by path or by name. Named grids ship as package data in
``phaselab/orchestrator/grids/*.yaml`` (the canonical copies; ``experiments/*.yaml`` in the
repository are symlinks to them), so ``phaselab run quickstart`` works from an installed wheel."""

from __future__ import annotations

import re
from pathlib import Path

from phaselab.workloads.config import suggest

_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")


def grids_dir() -> Path:
    return Path(__file__).resolve().parents[1] / "grids"


def shipped_grids() -> list[str]:
    return sorted(p.stem for p in grids_dir().glob("*.yaml"))


def resolve_grid_path(source: str | Path) -> Path:
    """An existing file path, or the name of a shipped grid (``quickstart``)."""
    path = Path(source).expanduser()
    if path.is_file():
        return path
    text = str(source)
    is_path = text.endswith((".yaml", ".yml")) or "/" in text
    if path.is_dir() and (is_path or not (grids_dir() / f"{text}.yaml").is_file()):
        raise IsADirectoryError(f"grid {text!r} is a directory; give a grid file (.yaml) or the "
                                f"name of a shipped grid ({', '.join(shipped_grids())})")
    if is_path:
        raise FileNotFoundError(f"grid file {text!r} does not exist")
    if not _NAME_RE.match(text):
        raise ValueError(f"grid name {text!r} must match {_NAME_RE.pattern}")
    shipped = grids_dir() / f"{text}.yaml"
    if shipped.is_file():
        return shipped
    hint = suggest(text, shipped_grids())
    raise FileNotFoundError(f"no grid named {text!r}; shipped grids: {', '.join(shipped_grids())}"
                            + (f" (did you mean {hint!r}?)" if hint else ""))


def describe_shipped() -> list[dict]:
    """Name, description, cell count (axes x seeds, before ``exclude``) and stage templates of
    every shipped grid, read from its YAML without planning it."""
    import yaml

    out = []
    for name in shipped_grids():
        doc = yaml.safe_load((grids_dir() / f"{name}.yaml").read_text(encoding="utf-8")) or {}
        axes = doc.get("axes") or {}
        cells = len(doc.get("seeds") or [0])
        for values in (axes.get("product") or {}).values():
            cells *= len(values)
        for group in axes.get("zip") or []:
            cells *= min((len(v) for v in group.values()), default=1)
        out.append({"name": name, "description": str(doc.get("description") or ""), "cells": cells,
                    "stages": len(doc.get("stages") or {}), "path": str(grids_dir() / f"{name}.yaml")})
    return out
