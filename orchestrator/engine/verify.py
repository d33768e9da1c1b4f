"""``phaselab verify STAGE``: re-run the first K steps of a finished training stage and compare
its logged losses with the stored run (DESIGN §5.9), in this process, without Ray.

The stored values come from the stage's per-step log (``run_folder.STEPS_FILE``, written by
the training process every ``train.log_every`` steps; the first attempt's value of a step wins). The re-run uses the stage's stored
resolved config and upstream checkpoint, stops after K steps (``run_training(stop_after=K)``,
same schedule), and writes only to a scratch folder.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

from phaselab.catalog.tracking.run_folder import first_values, read_steps, steps_path
from phaselab.orchestrator.stages import STAGES


def stored_losses(out_dir: Path, metric: str = "train/loss") -> dict[int, float]:
    path = steps_path(out_dir)
    if not path.is_file():
        raise ValueError(f"{path} does not exist: the stage logged no per-step metrics")
    return first_values(read_steps(path), metric)


def verify_stage(store: Any, stage_hash: str, *, steps: int, rtol: float, metric: str = "train/loss") -> dict[str, Any]:
    """Re-run ``steps`` steps of the SUCCEEDED training stage and compare ``metric``; returns
    {"ok", "compared": [(step, stored, rerun, rel)], "max_rel"}. Raises ValueError if it cannot."""
    from phaselab.catalog.tracking import RecordingTracker
    from phaselab.workloads.train.api import run_training

    row = store.get_stage(stage_hash)
    stage = STAGES.get(row.kind) if row is not None else None
    spec = stage.training_spec(row.config) if stage is not None else None
    if spec is None or row.state != "SUCCEEDED":
        raise ValueError(f"stage {stage_hash[:12]} is not a SUCCEEDED training stage")
    if steps < 1:
        raise ValueError(f"--steps must be >= 1, got {steps}")
    stored = stored_losses(Path(row.storage_uri), metric)
    init_from = None
    if stage.starts_from == "checkpoint":   # the upstream checkpoint it started from
        ups = [u for u, d, rel in store.reads.edges(stage_hash) if d == stage_hash and rel == stage.relation]
        init_from = next((Path(a.uri) for u in ups for a in store.reads.artifacts_for_stage(u) if a.name == "checkpoint"),
                         None)
    tracker = RecordingTracker()
    with tempfile.TemporaryDirectory(prefix="phaselab-verify-") as tmp:
        run_training(spec, out_dir=Path(tmp), tracker=tracker, init_from=init_from, stop_after=steps)
    rerun = {s: m[metric] for s, m in tracker.metrics if metric in m and s <= steps}
    compared = []
    for s in sorted(set(rerun) & set(stored)):
        rel = abs(rerun[s] - stored[s]) / max(abs(stored[s]), 1e-12)
        compared.append((s, stored[s], rerun[s], rel))
    if not compared:
        raise ValueError(f"no common logged step <= {steps} (stored steps: {sorted(stored)[:5]}...); "
                         "raise --steps past train.log_every")
    max_rel = max(c[3] for c in compared)
    return {"ok": math.isfinite(max_rel) and max_rel <= rtol, "compared": compared, "max_rel": max_rel,
            "rtol": rtol, "metric": metric}
