"""What runs inside a stage's Ray task: set up the tracker, run the stage, digest its outputs,
fingerprint the environment, and hand everything back to the controller, which alone writes the
catalog's results (a stage is SUCCEEDED only through ``CatalogStore.finalize_success``).

The one catalog write a worker makes is its liveness: while the stage runs, a daemon thread of
the task's process refreshes the stage row's ``heartbeat_at`` (:class:`WorkerHeartbeat`). A hung
or vanished worker therefore stops beating and the controller's stale-stage check sees it; a
heartbeat written by the controller would only prove that the controller is alive. With its first
beat the thread also records the Ray node the attempt runs on (``attempt.node_id``): only the
worker knows it, and an attempt lost with its node must still say where it ran.

Workload errors are classified here, where their types live (``failures.classify``); a worker
that dies (kill -9, OOM killer, lost node) never returns and is classified by the controller from
Ray's exception.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

from phaselab.catalog.tracking.run_folder import ATTEMPTS_FILE, RUNNING_FILE

TRACKING_ENV = ("MLFLOW_TRACKING_URI", "PHASELAB_CATALOG_URL", "PHASELAB_MLFLOW_EXPERIMENT")
log = logging.getLogger(__name__)


class WorkerHeartbeat:
    """Refreshes ``stage.heartbeat_at`` every ``interval_s`` from a daemon thread of the process
    that runs the stage, from ``__enter__`` until ``__exit__`` (always reached: ``execute`` wraps
    the stage in it). It stops early when the row is no longer RUNNING (cancelled or reclaimed:
    the controller acts on that) or, with ``attempt``, when the row belongs to another attempt (a
    frozen worker that wakes up after its stage was relaunched must not keep the new attempt
    alive). A catalog error is logged and retried at the next beat; it never fails the stage.
    ``beats`` counts the refreshes that were written.
    """

    def __init__(self, catalog_url: str, stage_hash: str, *, interval_s: float, attempt: int | None = None,
                 node_id: str | None = None) -> None:
        if not interval_s > 0:
            raise ValueError(f"heartbeat interval_s must be > 0, got {interval_s!r}")
        self.catalog_url, self.stage_hash, self.interval_s = catalog_url, stage_hash, interval_s
        self.attempt, self.node_id = attempt, node_id
        self._placed = attempt is None   # the attempt's node is recorded (or there is no attempt)
        self.beats = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"phaselab-heartbeat-{stage_hash[:12]}",
                                        daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=max(10.0, 2 * self.interval_s))

    def _loop(self) -> None:
        from phaselab.catalog.store.api import CatalogStore

        store = CatalogStore(self.catalog_url)   # never migrates (DESIGN §5.1: workers don't)
        try:
            while not self._stop.is_set():
                try:
                    if not self._beat(store):
                        log.warning("stage %s (attempt %s) is no longer RUNNING; heartbeats stop",
                                    self.stage_hash[:12], self.attempt)
                        return
                    self.beats += 1
                except Exception as exc:  # noqa: BLE001 - a catalog outage must not kill the stage
                    log.warning("heartbeat of stage %s failed: %s", self.stage_hash[:12], exc)
                self._stop.wait(self.interval_s)
        finally:
            store.dispose()

    def _beat(self, store: Any) -> bool:
        if self.attempt is not None:
            row = store.get_stage(self.stage_hash)
            if row is None or row.state != "RUNNING" or row.attempts != self.attempt:
                return False
        if not store.heartbeat(self.stage_hash):
            return False
        if not self._placed:
            self._placed = store.record_attempt_start(self.stage_hash, self.attempt, self.node_id)
        return True


def ray_node_id() -> str | None:
    """The id (hex) of the Ray node this process runs on; None outside a connected Ray process
    (a stage run by ``phaselab train`` or a test without Ray)."""
    import sys

    if "ray" not in sys.modules:
        return None
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


def worker_catalog_url(url: str) -> str:
    """The catalog URL as a worker must see it: a relative SQLite path made absolute (a Ray
    worker's working directory is not the controller's)."""
    from phaselab.catalog.store import db

    path = db.sqlite_path(url)
    if path is None or path.is_absolute():
        return url
    return url.replace(str(path), str(path.resolve()), 1)


def _heartbeat(payload: Mapping[str, Any]) -> Any:
    """The worker's heartbeat for this payload (a no-op without ``catalog_url``: a stage run
    outside the controller has no catalog row to keep alive)."""
    import contextlib

    if not payload.get("catalog_url"):
        return contextlib.nullcontext()
    return WorkerHeartbeat(payload["catalog_url"], payload["stage_hash"],
                           interval_s=float(payload.get("heartbeat_s") or 5.0), attempt=payload.get("attempt"),
                           node_id=ray_node_id())


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def path_digest(path: Path) -> tuple[str, int]:
    """(sha256, bytes) of a file, or of a folder: sha256 over sorted (relative path, file sha256)."""
    path = Path(path)
    if path.is_file():
        return file_sha256(path), path.stat().st_size
    if not path.is_dir():
        raise FileNotFoundError(f"artifact {str(path)!r} does not exist")
    h, total = hashlib.sha256(), 0
    for p in sorted(q for q in path.rglob("*") if q.is_file()):
        h.update(f"{p.relative_to(path)}\0{file_sha256(p)}\n".encode())
        total += p.stat().st_size
    return h.hexdigest(), total


def _tracker(payload: Mapping[str, Any]):
    """RecordingTracker (its records go to the catalog) fanned out to MLflow when configured."""
    from phaselab.catalog.tracking import FanoutTracker, RecordingTracker

    recording = RecordingTracker()
    mlflow_cfg = payload.get("mlflow")
    if not mlflow_cfg:
        return recording, recording, None
    from phaselab.catalog.tracking.mlflow_tracker import MlflowTracker

    ml = MlflowTracker.for_stage(**{**mlflow_cfg, "spool_dir": Path(mlflow_cfg["spool_dir"])})
    ml.log_params(payload["config"])
    ml.log_config((Path(payload["out_dir"]) / "stage.yaml").read_text())   # params may be truncated
    return FanoutTracker(recording, ml), recording, ml


def _write_stage_file(payload: Mapping[str, Any], out_dir: Path) -> None:
    """The resolved config next to the stage's outputs (DESIGN §5.9)."""
    import yaml

    doc = {k: payload[k] for k in ("stage_hash", "kind", "name", "launcher", "config", "upstream")}
    (out_dir / "stage.yaml").write_text(yaml.safe_dump(doc, sort_keys=True))


def execute(payload: Mapping[str, Any]) -> dict[str, Any]:
    """Run one stage (``payload`` from ``Controller._payload``) while this process heartbeats
    it; never raises for workload errors: returns ``{"ok": False, "failure_class", "message",
    "traceback"}`` instead."""
    with _heartbeat(payload):
        return _run_stage(payload)


def _run_stage(payload: Mapping[str, Any]) -> dict[str, Any]:
    from phaselab.orchestrator.engine.failures import failure_report
    from phaselab.orchestrator.stages import STAGES, Resources, StageContext

    start = time.monotonic()
    out_dir = Path(payload["out_dir"])
    ml = None
    recording = None
    try:   # a full or read-only runs folder fails here already: reported like any other fault
        out_dir.mkdir(parents=True, exist_ok=True)
        _write_json(out_dir / RUNNING_FILE, {"pid": os.getpid(), "attempt": payload.get("attempt"),
                                               "started": time.time()})
        _write_stage_file(payload, out_dir)
        tracker, recording, ml = _tracker(payload)
        ctx = StageContext(stage_hash=payload["stage_hash"], name=payload["name"], config=payload["config"],
                           out_dir=out_dir, runs_root=Path(payload["runs_root"]), tracker=tracker,
                           upstream=payload["upstream"], launcher=payload["launcher"],
                           resources=Resources(**payload["resources"]))
        from phaselab.workloads.train.ray_entry import train_run_name

        with train_run_name(payload.get("ray_name")):   # a Ray Train run reads as its task does
            result = STAGES[payload["kind"]].run(ctx)
        artifacts = []
        for name, path in sorted(result.artifacts.items()):
            sha, size = path_digest(path)
            artifacts.append({"name": name, "uri": str(Path(path).resolve()), "sha256": sha, "bytes": size,
                              "kind": "checkpoint" if name == "checkpoint" else "file"})
        children = []
        for child in result.children:
            child = dict(child)
            if child.get("checkpoint"):
                sha, size = path_digest(Path(child["checkpoint"]))
                child["artifact"] = {"name": "checkpoint", "uri": str(Path(child["checkpoint"]).resolve()),
                                     "sha256": sha, "bytes": size, "kind": "checkpoint"}
            children.append(child)
        env = _fingerprint(payload, out_dir)
        _log_attempt(out_dir, payload, recording, time.monotonic() - start, "succeeded")
        if ml is not None:
            ml.log_env(env)
            ml.log_outputs(artifacts)
            ml.end("FINISHED")
        seconds = time.monotonic() - start
        res = payload["resources"]
        return {"ok": True, "records": [r.to_dict() for r in result.records], "artifacts": artifacts,
                "env": env, "backend": _backend(env), "children": children, "mlflow_run_id": getattr(ml, "run_id", None),
                "node_id": ray_node_id(),
                "seconds": seconds, "gpu_seconds": seconds * res.get("gpus", 0) * res.get("num_workers", 1)}
    except BaseException as exc:
        if isinstance(exc, (SystemExit, KeyboardInterrupt)):
            raise
        if ml is not None:
            ml.end("FAILED")
        report = failure_report(exc, where=out_dir)
        try:   # on a full disk this log line cannot be written either; the report still goes back
            _log_attempt(out_dir, payload, recording, time.monotonic() - start, str(report["failure_class"]))
        except OSError as err:
            log.warning("attempt log of stage %s not written: %s", payload["stage_hash"][:12], err)
        return {**report, "traceback": traceback.format_exc()[-8000:], "seconds": time.monotonic() - start}


def _write_json(path: Path, obj: Any) -> None:
    import json

    path.write_text(json.dumps(obj, sort_keys=True))


def _log_attempt(out_dir: Path, payload: Mapping[str, Any], recording: Any, seconds: float, outcome: str) -> None:
    """One line per attempt in ``attempts.jsonl``: where its training started and ended (a
    resumed attempt starts after step 1), how long it took and how it ended."""
    import json

    steps = [s for s, _ in recording.metrics] if recording is not None else []
    line = {"attempt": payload.get("attempt"), "pid": os.getpid(), "first_step": min(steps, default=None),
            "last_step": max(steps, default=None), "seconds": round(seconds, 3), "outcome": outcome}
    with open(out_dir / ATTEMPTS_FILE, "a", encoding="utf-8") as f:
        f.write(json.dumps(line, sort_keys=True) + "\n")


def _fingerprint(payload: Mapping[str, Any], out_dir: Path) -> dict[str, Any]:
    """The attempt's environment, with what ran as the process that ran the model reported it
    (``workloads.provenance``: a Ray Train worker under ``ray_train``, this process otherwise)."""
    from phaselab.catalog.store.fingerprint import env_fingerprint
    from phaselab.workloads import provenance

    ran = provenance.read(out_dir)
    backends = (ran or {}).get("attention", {}).get("sites") or None
    if backends is None and "phaselab.kernels.registry" in sys.modules:   # a stage without a model run
        from phaselab.kernels.registry import backends_used

        backends = dict(backends_used()) or None
    train = payload["config"].get("train", {})
    return env_fingerprint(seeds=train.get("seed"), world_size=payload["resources"].get("num_workers", 1),
                           attn_backend=backends, deterministic=(ran or {}).get("deterministic"),
                           provenance=ran, extra={"launcher": payload["launcher"], "pid": os.getpid()})


def _backend(env: Mapping[str, Any]) -> str | None:
    b = env.get("attn_backend")
    if isinstance(b, Mapping):
        return ",".join(sorted(set(map(str, b.values())))) or None
    return b
