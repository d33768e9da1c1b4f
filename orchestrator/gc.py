"""``phaselab gc``: delete checkpoints that no retained stage references (DESIGN §5.7 retention;
copies have filled head-node disks, ray-project/ray#23688).

Deleted: (a) folders under the runs root whose name is no stage hash in the catalog; (b) inside
SUCCEEDED stages, ``checkpoints/step_*`` folders that hold none of the stage's committed
artifacts. Kept: every committed artifact, and all outputs of stages that are not SUCCEEDED
(they may resume from their checkpoints).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from phaselab.orchestrator.controller import default_runs_root


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def collect(store: Any, runs_root: Path | None) -> list[dict[str, Any]]:
    root = Path(runs_root or default_runs_root())
    if not root.is_dir():
        return []
    out: list[dict[str, Any]] = []
    for d in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("_")):
        if d.name == "ray_train":
            continue
        row = store.get_stage(d.name) if store is not None else None
        if row is None:
            if store is not None:
                out.append({"path": str(d), "bytes": _size(d), "why": "no such stage in the catalog"})
            continue
        if row.state != "SUCCEEDED":
            continue
        keep = [Path(a.uri).resolve() for a in store.artifacts_for_stage(row.stage_hash)]
        for ck in sorted((d / "checkpoints").glob("step_*")) if (d / "checkpoints").is_dir() else []:
            ck = ck.resolve()
            if not any(k == ck or ck in k.parents for k in keep):
                out.append({"path": str(ck), "bytes": _size(ck), "why": f"intermediate checkpoint of "
                            f"succeeded stage {row.stage_hash[:12]}"})
    return out


def delete(victims: list[dict[str, Any]]) -> None:
    for v in victims:
        p = Path(v["path"])
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
