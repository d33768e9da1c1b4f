"""``MlflowTracker``: the Tracker interface backed by MLflow (DESIGN §3.4, §5.5).

Layout: one experiment per grid (its description from the grid, :mod:`mlflow_experiment`), one
top-level run per stage, found again by its stage hash from any Ray worker. A stage run is named
``<stage> <axis>=<value> ...`` and carries the axis values as ``axis.*`` params and tags
(:mod:`mlflow_common`: names, params, metric keys); tags ``phaselab.stage_hash``,
``phaselab.grid_id``, ``phaselab.cell_id``, ``phaselab.cell_key``, ``phaselab.stage_kind``,
``phaselab.stage``, ``phaselab.upstream``, ``phaselab.attn.backend`` (and the param
``attn.backend``), ``phaselab.device``, ``mlflow.source.git.commit`` with ``phaselab.git.dirty``,
and ``phaselab.checkpoint`` (relative to the runs root). Outputs: ``config/resolved.yaml``,
``env/fingerprint.json``, ``outputs.json`` (every committed artifact by relative path and
digest), copies of the small ones, and ``figures/`` drawn from the run's records.

Rules this module enforces:

- **Rank 0 only.** Other ranks get an inert tracker (``RANK`` env var unless ``rank=`` is given).
- **Params** are flattened to dotted keys; values longer than MLflow's 6000-character limit
  (mlflow/mlflow#9709) are truncated with a marker and listed in the ``phaselab.truncated_params``
  tag; the full resolved config goes in as an artifact (:meth:`log_config`).
- **Resume reattaches** to the stored ``run_id`` (or the run tagged with the stage hash) and never
  re-logs a param with a new value: MLflow refuses that (ray-project/ray#20473). Conflicting keys
  are skipped, logged as a warning and listed in the ``phaselab.param_conflicts`` tag.
- **Metric names** (:func:`metric_points`): name first, ``=`` never (MLflow refuses it, and ``:``
  on Windows clients): ``ppl/text/split_valid/ctx_4096``, plus the series
  ``ppl/text/split_valid/by_ctx`` whose step is the context length, so MLflow plots ppl (and
  NIAH accuracy) against length natively.
- **Never raises into training, never holds it up.** A remote server is probed with a TCP
  connect of ``PROBE_TIMEOUT_S`` before it is first used and before each retry; while it is
  down, every call goes to a JSONL spool (``spool_path``) in call order with its original
  timestamp and run id, and the server is probed again at most every ``retry_interval_s``.
  :meth:`flush` replays explicitly; a new tracker for the same spool replays it first, and
  :func:`replay_spools` replays every spool of a folder (the controller at each run/resume, and
  ``phaselab sync-tracking``), so an outage that outlives the process is caught up later.
- **Idempotent metrics.** A metric point is keyed by (run, metric, step): a point whose key the
  run already holds (a step re-run after a crash, a replay of a half-applied spool) is skipped;
  the first value wins, as in the catalog's own replay of ``metrics.jsonl``.
- **Tracking store**: ``MLFLOW_TRACKING_URI`` or ``sqlite:///<catalog dir>/mlflow.db`` with the
  artifact root ``<catalog dir>/mlartifacts``; never the deprecated file store (mlflow/mlflow#18534).

mlflow is imported inside methods only (``import phaselab.catalog`` stays light).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from phaselab.catalog.tracking import MetricRecord
from phaselab.catalog.tracking.mlflow_common import (  # noqa: F401 (re-exported)
    MAX_PARAM_VALUE,
    axis_params,
    catalog_dir,
    chunks,
    default_artifact_root,
    default_tracking_uri,
    flatten_params,
    http_defaults,
    is_local_store,
    locked,
    metric_key,
    metric_points,
    reachable,
    redact,
    run_label,
    sanitize_key,
    server_said_no,
    used_params,
)
from phaselab.catalog.tracking.mlflow_experiment import experiment_id, git_tags

log = logging.getLogger(__name__)

TRUNCATION_MARK = "...[truncated: see the config/resolved.yaml artifact]"
# Committed outputs up to this size are copied into MLflow (a tiny model, a figure); larger ones
# are linked by their path relative to the runs root and their digest (a 7B checkpoint would
# double the disk it uses). PHASELAB_MLFLOW_COPY_MB overrides it.
COPY_MAX_MB = 64.0


class MlflowTracker:
    """Tracker → one MLflow run (see the module docstring). ``run_id`` is None until the run
    exists on the server (it may be created later, when a spooled start is replayed)."""

    def __init__(self, *, tracking_uri: str, experiment: str, run_name: str, spool_path: Path,
                 tags: Mapping[str, str] | None = None, run_id: str | None = None,
                 artifact_root: str | None = None, rank: int | None = None,
                 retry_interval_s: float = 30.0) -> None:
        if rank is None:
            rank = int(os.environ.get("RANK", "0"))
        self._setup(tracking_uri, spool_path, run_id=run_id, active=rank == 0,
                    retry_interval_s=retry_interval_s)
        if not self.active:
            return
        http_defaults()
        if not reachable(tracking_uri):   # spool from the first call: no HTTP retries to wait for
            self._offline, self._last_try = True, time.monotonic()
        elif self._offline:
            self.flush()
        location = None
        if artifact_root is not None and is_local_store(tracking_uri):
            location = f"{artifact_root.rstrip('/')}/{sanitize_key(experiment)}"
        self._submit({"op": "start", "experiment": experiment, "run_name": run_name, "run_id": run_id,
                      "tags": dict(tags or {}), "artifact_location": location})

    def _setup(self, tracking_uri: str, spool_path: Path, *, run_id: str | None, active: bool,
               retry_interval_s: float) -> None:
        self.active = active
        self.tracking_uri = tracking_uri
        self.run_id = run_id
        self.spool_path = Path(spool_path)
        self.retry_interval_s = retry_interval_s
        self._client_obj: Any = None
        self._records: list[MetricRecord] = []        # for the figures end() draws
        self.runs_root: Path | None = None
        self._logged_params: dict[str, str] = {}
        self._points: set[tuple[str, int]] = set()   # (metric, step) the run holds
        self._points_of: str | None = None            # the run whose points those are
        self._last_try = 0.0
        self._offline = self.spool_path.exists() and self.spool_path.stat().st_size > 0

    @classmethod
    def replayer(cls, tracking_uri: str, spool_path: Path) -> MlflowTracker:
        """A tracker that only replays an existing spool (its ops carry their run ids)."""
        self = cls.__new__(cls)
        self._setup(tracking_uri, spool_path, run_id=None, active=True, retry_interval_s=0.0)
        http_defaults()
        return self

    @classmethod
    def for_stage(cls, *, tracking_uri: str, grid: str, grid_id: int, cell_id: int, cell_key: str,
                  stage_hash: str, stage_kind: str, spool_dir: Path, axes: Mapping[str, Any] | None = None,
                  upstream: Iterable[str] = (), attn_backend: str | None = None,
                  git_commit: str | None = None, run_id: str | None = None, run_name: str | None = None, stage_name: str | None = None,
                  stage_axes: Mapping[str, Any] | None = None, runs_root: Path | None = None,
                  artifact_root: str | None = None, rank: int | None = None) -> MlflowTracker:
        """The run of one stage in its grid's experiment. ``axes``: its (first) cell's;
        ``stage_axes``: those the stage stands for (default ``axes``; common_axes of its cells
        when it serves several), which name the run and become its ``axis.*`` params and tags.
        ``runs_root``: paths under it are logged relative to it."""
        mine = dict(axes or {}) if stage_axes is None else dict(stage_axes)
        tags = {"phaselab.stage_hash": stage_hash, "phaselab.grid_id": str(grid_id),
                "phaselab.cell_id": str(cell_id), "phaselab.cell_key": cell_key[:5000],
                "phaselab.stage_kind": stage_kind,
                "phaselab.stage": stage_name or stage_kind,
                "phaselab.upstream": ",".join(upstream), "phaselab.run_level": "stage", **axis_params(mine)}
        if attn_backend:
            tags["phaselab.attn.backend"] = attn_backend
        tags |= {"mlflow.source.git.commit": git_commit} if git_commit else git_tags()
        self = cls(tracking_uri=tracking_uri, experiment=grid,
                   spool_path=Path(spool_dir) / f"{stage_hash}.jsonl",
                   run_name=run_name or run_label(stage_name or stage_kind, mine), tags=tags,
                   run_id=run_id,
                   artifact_root=artifact_root, rank=rank)
        self.runs_root = None if runs_root is None else Path(runs_root).resolve()
        self._submit({"op": "params", "params": axis_params(mine)})
        return self

    # -- Tracker protocol ---------------------------------------------------------------------
    def log_params(self, params: Mapping[str, Any]) -> None:
        """Flattened; only the sections the config uses (mlflow_common.used_params); paths under
        the runs root relative to it."""
        flat = used_params(flatten_params(params))
        self._submit({"op": "params", "params": {k: self._relative(v) for k, v in flat.items()}})

    def log_metrics(self, metrics: Mapping[str, float], *, step: int) -> None:
        self._submit({"op": "metrics", "metrics": [[sanitize_key(k), float(v), int(step)]
                                                   for k, v in metrics.items()]})

    def log_records(self, records: list[MetricRecord]) -> None:
        """Each record as its scalar and, with a context length, its point of the length series
        (mlflow_common.metric_points); kept for the figures :meth:`end` draws."""
        if self.active:
            self._records.extend(records)
        self._submit({"op": "metrics", "metrics": metric_points(records)})

    def log_artifact(self, path: Path, *, name: str) -> None:
        self._submit({"op": "artifact", "path": str(path), "name": name})

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self._submit({"op": "tags", "tags": {k: str(v) for k, v in tags.items()}})

    # -- phaselab additions -------------------------------------------------------------------
    def log_config(self, resolved_yaml: str) -> None:
        """The full resolved config, as ``config/resolved.yaml`` (params may be truncated)."""
        self._submit({"op": "text", "text": resolved_yaml, "file": "config/resolved.yaml"})

    def log_env(self, fingerprint: Mapping[str, Any]) -> None:
        """The environment fingerprint (catalog.store.fingerprint) as ``env/fingerprint.json``, and
        what ran as tags: the attention backend (also the param ``attn.backend``, DESIGN §3.2),
        the device and the git commit with its dirty flag."""
        self._submit({"op": "text", "text": json.dumps(fingerprint, indent=2, sort_keys=True, default=str),
                      "file": "env/fingerprint.json"})
        backend = fingerprint.get("attn_backend")
        if isinstance(backend, Mapping):
            backend = ",".join(sorted({str(b) for b in backend.values()}))
        tags = {"phaselab.device": str(fingerprint.get("device") or "")}
        if fingerprint.get("git_sha"):
            tags |= git_tags(fingerprint["git_sha"], fingerprint.get("dirty_diff_hash"))
        if backend:
            tags["phaselab.attn.backend"] = str(backend)
            self._submit({"op": "params", "params": {"attn.backend": str(backend)}})
        self.set_tags(tags)

    def log_outputs(self, artifacts: Iterable[Mapping[str, Any]]) -> None:
        """A stage's committed artifacts (``name``, ``uri``, ``sha256``, ``bytes``): each linked
        in ``outputs.json`` by its path relative to the runs root and its digest, and copied under
        its name when a file of at most ``COPY_MAX_MB`` (figures, small checkpoints). The
        checkpoint's relative path is also the tag ``phaselab.checkpoint``."""
        limit = float(os.environ.get("PHASELAB_MLFLOW_COPY_MB", COPY_MAX_MB)) * 2**20
        links = []
        for a in artifacts:
            path = Path(a["uri"])
            copied = path.is_file() and a.get("bytes", path.stat().st_size) <= limit
            links.append({"name": a["name"], "path": self._relative(str(path)), "sha256": a.get("sha256"),
                          "bytes": a.get("bytes"), "copied": f"{a['name']}/{path.name}" if copied else None})
            if copied:
                self.log_artifact(path, name=a["name"])
            if a["name"] == "checkpoint":
                self.set_tags({"phaselab.checkpoint": self._relative(str(path))})
        if links:
            self._submit({"op": "text", "text": json.dumps(links, indent=1), "file": "outputs.json"})

    def end(self, status: str = "FINISHED") -> None:
        """End the run; a FINISHED run first gets the figures of its records (run_figures:
        a metric against context length, per-task bars) under ``figures/``."""
        if status not in ("FINISHED", "FAILED", "KILLED"):
            raise ValueError(f"run status must be FINISHED, FAILED or KILLED, got {status!r}")
        if status == "FINISHED" and self.active and self._records:
            self._log_figures()
        self._submit({"op": "end", "status": status})

    def _log_figures(self) -> None:
        import tempfile

        from phaselab.catalog.reports.run_figures import run_figures

        try:
            folder = Path(tempfile.mkdtemp(prefix="phaselab-figures-"))
            for path in run_figures(self._records, folder):
                self.log_artifact(path, name="figures")
        except Exception as exc:  # noqa: BLE001 - a figure must never fail a finished stage
            log.warning("could not draw the run's figures: %s", exc)

    def _relative(self, value: str) -> str:
        """``value`` relative to the runs root when it is a path under it."""
        root = getattr(self, "runs_root", None)
        if root is None or not value.startswith("/"):
            return value
        try:
            return str(Path(value).resolve().relative_to(root))
        except ValueError:
            return value

    @property
    def pending(self) -> int:
        """Number of spooled calls not yet in MLflow."""
        if not self.spool_path.exists():
            return 0
        return sum(1 for line in self.spool_path.read_text().splitlines() if line.strip())

    def flush(self) -> bool:
        """Replay the spool in order; True when everything reached MLflow. Never raises. A call
        the server refuses outright is dropped with a warning (it would block the rest forever);
        one that fails otherwise stays spooled, with everything after it."""
        if not self.active or not self.spool_path.exists():
            self._offline = False
            return True
        self._last_try = time.monotonic()
        if not reachable(self.tracking_uri):
            return False
        with locked(self.spool_path, blocking=False) as mine:
            if not mine:   # another process is replaying this spool
                return False
            return self._replay()

    def _replay(self) -> bool:
        if not self.spool_path.exists():
            self._offline = False
            return True
        ops = [json.loads(line) for line in self.spool_path.read_text().splitlines() if line.strip()]
        for i, op in enumerate(ops):
            try:
                self._apply(op)
            except Exception as exc:  # noqa: BLE001 (any tracker failure: keep the call spooled)
                if self.run_id is not None and server_said_no(exc):
                    log.warning("MLflow refused spooled %s call (%s); dropped", op.get("op"), exc)
                    continue
                log.warning("MLflow still unreachable (%s); %d calls stay spooled", exc, len(ops) - i)
                rest = ops[i:]
                if self.run_id is not None:   # the run exists now: a later replay must find it
                    rest = [o if o["op"] == "start" or o.get("run_id") else {**o, "run_id": self.run_id}
                            for o in rest]
                tmp = self.spool_path.with_suffix(".tmp")
                tmp.write_text("".join(json.dumps(o) + "\n" for o in rest))
                tmp.replace(self.spool_path)
                return False
        self.spool_path.unlink()
        shutil.rmtree(self._files_dir(), ignore_errors=True)
        self._offline = False
        return True

    # -- internals ----------------------------------------------------------------------------
    def _files_dir(self) -> Path:
        return self.spool_path.with_name(self.spool_path.stem + ".files")

    def _submit(self, op: dict[str, Any]) -> None:
        if not self.active:
            return
        op["ts"] = int(time.time() * 1000)
        if op["op"] != "start" and self.run_id is not None:
            op["run_id"] = self.run_id   # a replay in another process must know the run
        if self._offline:
            self._spool(op)
            if time.monotonic() - self._last_try >= self.retry_interval_s:
                self.flush()
            return
        try:
            self._apply(op)
        except Exception as exc:  # noqa: BLE001 (never into training: spool and catch up later)
            log.warning("MLflow call %s failed (%s); spooling to %s", op["op"], exc, self.spool_path)
            self._offline = True
            self._last_try = time.monotonic()
            self._spool(op)

    def _spool(self, op: dict[str, Any]) -> None:
        try:
            if op["op"] == "artifact" and Path(op["path"]).is_file():
                # Keep a copy: the stage may delete or rewrite the file before the replay.
                files = self._files_dir()
                files.mkdir(parents=True, exist_ok=True)
                copy = files / f"{op['ts']}-{len(list(files.iterdir()))}-{Path(op['path']).name}"
                shutil.copy2(op["path"], copy)
                op = {**op, "path": str(copy), "basename": Path(op["path"]).name}
            with locked(self.spool_path, blocking=True), self.spool_path.open("a") as f:
                f.write(json.dumps(op, default=str) + "\n")
        except Exception as exc:  # noqa: BLE001 (a full disk must not kill training either)
            log.error("could not spool MLflow call %s: %s", op.get("op"), exc)

    def _client(self) -> Any:
        if self._client_obj is None:
            from mlflow import MlflowClient

            self._client_obj = MlflowClient(tracking_uri=self.tracking_uri)
        return self._client_obj

    def _apply(self, op: dict[str, Any]) -> None:
        kind = op["op"]
        if kind == "start":
            self._start(op)
            return
        if self.run_id is None and op.get("run_id"):
            self._adopt(op["run_id"])
        if self.run_id is None:
            raise RuntimeError("MLflow run not started yet")
        client, run_id = self._client(), self.run_id
        if kind == "params":
            self._log_params(op["params"])
        elif kind == "metrics":
            self._log_metrics(op["metrics"], op["ts"])
        elif kind == "tags":
            self._log_tags(op["tags"])
        elif kind == "artifact":
            path = Path(op["path"])
            if "basename" in op:  # a spooled copy: restore the original file name
                tmp = path.with_name(op["basename"])
                shutil.copy2(path, tmp)
                path = tmp
            client.log_artifact(run_id, str(path), artifact_path=op["name"])
        elif kind == "text":
            client.log_text(run_id, op["text"], op["file"])
        elif kind == "end":
            client.set_terminated(run_id, status=op["status"], end_time=op["ts"])
        else:
            raise ValueError(f"unknown spooled op {kind!r}")

    def _adopt(self, run_id: str) -> None:
        """Attach to an existing run: its params and metric points are what it already holds."""
        run = self._client().get_run(run_id)
        self.run_id = run_id
        self._logged_params = dict(run.data.params)
        self._points = {(key, m.step) for key in run.data.metrics
                        for m in self._client().get_metric_history(run_id, key)}
        self._points_of = run_id

    def _log_metrics(self, metrics: list[list[Any]], ts: int) -> None:
        """Only the points whose (metric, step) the run does not hold yet (first value wins)."""
        from mlflow.entities import Metric

        if self._points_of != self.run_id:
            self._points, self._points_of = set(), self.run_id
        batch, keys = [], []
        for k, v, step in metrics:
            if (k, int(step)) not in self._points and (k, int(step)) not in keys:
                batch.append(Metric(k, v, ts, int(step)))
                keys.append((k, int(step)))
        for chunk in chunks(batch, 1000):
            self._client().log_batch(self.run_id, metrics=chunk)
        self._points.update(keys)

    def _log_tags(self, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(k, v) for k, v in tags.items()]
        for chunk in chunks(items, 100):
            self._client().log_batch(self.run_id, tags=chunk)

    def _log_params(self, params: Mapping[str, str]) -> None:
        from mlflow.entities import Param

        new, conflicts, truncated = [], [], []
        for key, value in params.items():
            if len(value) > MAX_PARAM_VALUE:
                value = value[:MAX_PARAM_VALUE - len(TRUNCATION_MARK)] + TRUNCATION_MARK
                truncated.append(key)
            old = self._logged_params.get(key)
            if old is None:
                new.append(Param(key, value))
                self._logged_params[key] = value
            elif old != value:
                conflicts.append(key)
        for chunk in chunks(new, 100):
            self._client().log_batch(self.run_id, params=chunk)
        extra = {}
        if truncated:
            extra["phaselab.truncated_params"] = ",".join(sorted(truncated))[:5000]
        if conflicts:
            log.warning("run %s: params %s already logged with other values; kept the stored ones",
                        self.run_id, conflicts)
            extra["phaselab.param_conflicts"] = ",".join(sorted(conflicts))[:5000]
        if extra:
            self._log_tags(extra)

    def _start(self, op: dict[str, Any]) -> None:
        client = self._client()
        exp_id = experiment_id(client, op["experiment"], op.get("artifact_location"))
        run_id = self.run_id or op.get("run_id")
        stage_hash = op["tags"].get("phaselab.stage_hash")
        if run_id is None and stage_hash:
            found = client.search_runs(
                [exp_id], filter_string=f"tags.`phaselab.stage_hash` = '{stage_hash}'", max_results=1,
                order_by=["attributes.start_time ASC"])
            run_id = found[0].info.run_id if found else None
        if run_id is not None:  # resume: reattach, remember what is logged, never re-log params
            self._adopt(run_id)
            if client.get_run(run_id).info.status != "RUNNING":
                client.update_run(run_id, status="RUNNING")
            if op["tags"]:
                self._log_tags(op["tags"])
            return
        run = client.create_run(exp_id, start_time=op["ts"], tags=dict(op["tags"]), run_name=op["run_name"])
        self.run_id = run.info.run_id
        self._logged_params = {}
        self._points, self._points_of = set(), self.run_id


def replay_spools(spool_dir: Path, tracking_uri: str) -> dict[str, int]:
    """Replay every stage spool under ``spool_dir`` into ``tracking_uri``; returns
    ``{spool file name: calls still pending}`` (0 for a spool that drained). Never raises; with
    the server unreachable it returns at once (one probe)."""
    spools = sorted(Path(spool_dir).glob("*.jsonl")) if Path(spool_dir).is_dir() else []
    if not spools:
        return {}
    if not reachable(tracking_uri):
        log.warning("MLflow at %s unreachable; %d spools wait for the next run", redact(tracking_uri), len(spools))
        return {p.name: MlflowTracker.replayer(tracking_uri, p).pending for p in spools}
    out = {}
    for path in spools:
        tracker = MlflowTracker.replayer(tracking_uri, path)
        try:
            tracker.flush()
        except Exception as exc:  # noqa: BLE001 - a broken spool must not stop the others
            log.warning("cannot replay %s: %s", path, exc)
        out[path.name] = tracker.pending
    return out
