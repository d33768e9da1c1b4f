"""The dataset a table's numbers were measured on, named from the stages that produced them.

A table module may define ``DATASET``: the label of the data its shipped grid reads, as it
appears in the title (quickstart: "Tiny Shakespeare"). When the stages behind a rendered table
read other data (each stage config's ``eval.data``, else its ``data`` section: the grid's own
``data``), :func:`named` puts their label in the title instead, so a table rendered over one's
own corpus is not captioned with the shipped one. Stages whose config names no data (synthetic
catalogs) leave the title as it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import PurePath
from typing import Any

from phaselab.catalog.reports.tables.spec import TableSpec

# shipped assets -> the name their papers use (workloads/data/assets/DATA.README.md)
SHIPPED = {"tinyshakespeare.txt": "Tiny Shakespeare", "austen": "Jane Austen"}
GLOB_CHARS = frozenset("*?[")


def _path_label(path: str) -> str:
    """A file's stem, a folder's name, a glob's fixed folder ("corpus/**/*.md" -> "corpus")."""
    parts = [p for p in PurePath(path).parts if p not in ("/", "")]
    fixed = [p for p in parts[: next((i for i, p in enumerate(parts) if set(p) & GLOB_CHARS), len(parts))]]
    name = fixed[-1] if fixed else path
    return PurePath(name).stem if PurePath(name).suffix in (".txt", ".md") else name


def dataset_label(data: Mapping[str, Any]) -> str:
    """A short, human label of one DataConfig dict (the shipped names as their papers write them)."""
    kind = str(data.get("kind", "?"))
    if kind == "text":
        path = str((data.get("text") or {}).get("path", "tinyshakespeare.txt"))
        return SHIPPED.get(path) or _path_label(path)
    shards = (data.get("real") or {}).get("shards_dir")
    return _path_label(str(shards)) if kind == "tokens" and shards else kind


def stage_data(config: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The data a stage's numbers come from: ``eval.data`` for an eval, else ``data``."""
    ev = config.get("eval")
    data = ev.get("data") if isinstance(ev, Mapping) else None
    data = data if isinstance(data, Mapping) else config.get("data")
    return data if isinstance(data, Mapping) and "kind" in data else None


def named(spec: TableSpec, shipped: str | None, configs: Iterable[Mapping[str, Any]]) -> TableSpec:
    """``spec`` with ``shipped`` in its title replaced by the label(s) of the data in ``configs``
    (joined with " + " when the stages read several); unchanged when they name none or ``shipped``."""
    if not shipped or shipped not in spec.title:
        return spec
    labels = sorted({dataset_label(d) for c in configs if (d := stage_data(c)) is not None})
    if not labels or labels == [shipped]:
        return spec
    return replace(spec, title=spec.title.replace(shipped, " + ".join(labels)))


def from_store(store: Any, spec: TableSpec, grid_ids: Iterable[int], stage_hashes: Iterable[str],
               shipped: str | None) -> TableSpec:
    """:func:`named` over the configs of ``stage_hashes`` (the stages behind a built table) in the
    grids ``grid_ids``; ``shipped``: the ``DATASET`` of the spec's table module (None for pivots,
    which name no dataset)."""
    if not shipped:
        return spec
    wanted = set(stage_hashes)
    configs = [s.config for g in grid_ids for s in store.stages_for_grid(g, current_only=True)
               if s.stage_hash in wanted and isinstance(s.config, Mapping)]
    return named(spec, shipped, configs)
