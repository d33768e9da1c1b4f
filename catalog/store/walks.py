"""Walks over the stage DAG stored in the catalog's edges: what a stage was built from
(``ancestors``), what a re-run of it taints (``descendants``), and the length its model was
trained at (``train_lengths``: the nearest trained stage above it)."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

from phaselab.catalog.store.api import CatalogStore


def _walk(store: CatalogStore, stage_hash: str | Sequence[str], *, up: bool) -> list[tuple[str, str, int]]:
    """BFS from one stage or several (one read of the edges either way)."""
    edges = store.reads.edges()
    nxt: dict[str, list[tuple[str, str]]] = {}
    for u, d, rel in edges:
        src, dst = (d, u) if up else (u, d)
        nxt.setdefault(src, []).append((dst, rel))
    seen: dict[str, tuple[str, int]] = {}
    roots = [stage_hash] if isinstance(stage_hash, str) else list(stage_hash)
    queue = deque((root, 0) for root in roots)
    while queue:
        node, depth = queue.popleft()
        for other, rel in sorted(nxt.get(node, [])):
            if other not in seen:
                seen[other] = (rel, depth + 1)
                queue.append((other, depth + 1))
    return sorted(((h, rel, depth) for h, (rel, depth) in seen.items()), key=lambda t: (t[2], t[0]))


def ancestors(store: CatalogStore, stage_hash: str) -> list[tuple[str, str, int]]:
    """Every upstream stage as (hash, relation of the first edge found, distance), nearest first."""
    return _walk(store, stage_hash, up=True)


def above(store: CatalogStore, stage_hashes: Sequence[str]) -> set[str]:
    """Every stage upstream of any of ``stage_hashes`` (the edges read once)."""
    return {h for h, _, _ in _walk(store, stage_hashes, up=True)}


def descendants(store: CatalogStore, stage_hash: str) -> list[tuple[str, str, int]]:
    """Every downstream stage as (hash, relation, distance), nearest first (what a re-run taints)."""
    return _walk(store, stage_hash, up=False)


def train_lengths(store: CatalogStore, stage_hashes: Sequence[str]) -> list[int]:
    """The distinct ``model.block_size`` of the nearest trained stage above each stage (itself
    included): the length its model saw in training."""
    found: set[int] = set()
    for h in stage_hashes:
        for other in [h, *(a for a, _, _ in ancestors(store, h))]:
            row = store.get_stage(other)
            model = (row.config or {}).get("model") if row is not None else None
            if isinstance(model, Mapping) and model.get("block_size"):
                found.add(int(model["block_size"]))
                break
    return sorted(found)
