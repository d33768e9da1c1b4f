"""``phaselab gc``: delete checkpoints that no retained stage references (DESIGN §5.7 retention;
copies have filled head-node disks, ray-project/ray#23688).

Deleted: (a) folders under the runs root whose name is no stage hash in the catalog (the
folders the kinds' launchers share, ``Stage.storage_roots``, are not stages); (b) of SUCCEEDED
stages, checkpoint folders that hold no committed artifact of any stage, as each kind lists them
(``Stage.intermediate_checkpoints``: a run's ``checkpoints/step_*``, Ray Train's copies
``ray_train/<hash>/step_*|checkpoint_*``, tune trials' ``trials/*/checkpoints/step_*``). Kept: every committed artifact, and all outputs of stages
that are not SUCCEEDED (they may resume from their checkpoints).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from phaselab.orchestrator.engine.controller import default_runs_root
from phaselab.orchestrator.stages import STAGES, storage_roots


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def _checkpoint_dirs(root: Path, h: str, kind: str) -> list[Path]:
    stage = STAGES.get(kind)   # child stages (tune trials) live inside their parent's folder
    found = stage.intermediate_checkpoints(root, h) if stage is not None else []
    return sorted(p.resolve() for p in found if p.is_dir())


def _rerooted(path: Path, root: Path, anchors: set[str]) -> Path | None:
    """``path`` re-rooted at ``root`` from its first component that names a stage folder or a
    shared storage root (``/old/project/.phaselab/runs/<hash>/x`` -> ``<root>/<hash>/x``)."""
    parts = path.parts
    for i, part in enumerate(parts):
        if part in anchors:
            return root.joinpath(*parts[i:])
    return None


def kept_paths(uris: list[str], root: Path, hashes: set[str]) -> set[Path]:
    """Where the committed artifacts ``uris`` are on this machine (see the module docstring)."""
    anchors = hashes | set(storage_roots())
    keep: set[Path] = set()
    for uri in uris:
        path = Path(uri.removeprefix("file://"))
        if not path.is_absolute():
            keep |= {(root / path).resolve(), path.resolve()}
            continue
        keep.add(path.resolve())
        moved = _rerooted(path, root, anchors)
        if moved is not None:
            keep.add(moved.resolve())
    return keep


def collect(store: Any, runs_root: Path | None) -> list[dict[str, Any]]:
    root = Path(runs_root or default_runs_root())
    if store is None or not root.is_dir():
        return []
    from phaselab.catalog.store.schema import STATES

    rows = {r.stage_hash: r for r in store.stages_in_state(STATES)}
    keep = kept_paths([a.uri for h in rows for a in store.reads.artifacts_for_stage(h)], root, set(rows))
    out: list[dict[str, Any]] = []
    for d in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("_")):
        if d.name in storage_roots():
            continue
        if d.name not in rows:
            out.append({"path": str(d), "bytes": _size(d), "why": "no such stage in the catalog"})
    for h, row in rows.items():
        if row.state != "SUCCEEDED":
            continue
        for ck in _checkpoint_dirs(root, h, row.kind):
            if not any(k == ck or ck in k.parents for k in keep):
                out.append({"path": str(ck), "bytes": _size(ck),
                            "why": f"intermediate checkpoint of succeeded stage {h[:12]}"})
    return out


def delete(victims: list[dict[str, Any]]) -> None:
    for v in victims:
        p = Path(v["path"])
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
