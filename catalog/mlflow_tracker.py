"""``MlflowTracker``: the Tracker interface backed by MLflow (DESIGN §3.4, §5.5; issue 7).

Layout: one experiment per grid, a parent run per grid cell, a child run per stage linked by the
``mlflow.parentRunId`` tag, so a stage running in any Ray worker attaches to its cell without
MLflow's process-local nesting (ray-project/ray#19978). Tags on a stage run:
``phaselab.stage_hash``, ``phaselab.grid_id``, ``phaselab.cell_id``, ``phaselab.stage_kind``,
``phaselab.upstream``, ``phaselab.attn.backend`` and ``mlflow.source.git.commit``.

Rules this module enforces:

- **Rank 0 only.** Other ranks get an inert tracker (``RANK`` env var unless ``rank=`` is given).
- **Params** are flattened to dotted keys; values longer than MLflow's 6000-character limit
  (mlflow/mlflow#9709) are truncated with a marker and listed in the ``phaselab.truncated_params``
  tag; the full resolved config goes in as an artifact (:meth:`log_config`).
- **Resume reattaches** to the stored ``run_id`` (or the run tagged with the stage hash) and never
  re-logs a param with a new value: MLflow refuses that (ray-project/ray#20473). Conflicting keys
  are skipped, logged as a warning and listed in the ``phaselab.param_conflicts`` tag.
- **Metric names**: :func:`metric_key` = ``MetricRecord.key()`` with ``=`` written as ``_``
  (``ppl/ctx_4096``, ``niah_acc/ctx_65536/depth_0.5``): MLflow accepts only ``[/\\w.\\- :]`` in
  names and refuses ``:`` on Windows clients.
- **Never raises into training.** Every call goes to MLflow or, if that fails, to a JSONL spool
  (``spool_path``) in call order with its original timestamp; while spooling, each call retries
  at most every ``retry_interval_s``; :meth:`flush` replays explicitly. A new tracker for the same
  spool replays it first, so an outage that outlives the process is caught up on resume.
- **Tracking store**: ``MLFLOW_TRACKING_URI`` or ``sqlite:///<catalog dir>/mlflow.db`` with the
  artifact root ``<catalog dir>/mlartifacts``; never the deprecated file store (mlflow/mlflow#18534).

mlflow is imported inside methods only (``import phaselab.catalog`` stays light).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from phaselab.catalog.tracking import MetricRecord

log = logging.getLogger(__name__)

MAX_PARAM_VALUE = 6000   # mlflow.utils.validation.MAX_PARAM_VAL_LENGTH
MAX_KEY = 250            # mlflow.utils.validation.MAX_ENTITY_KEY_LENGTH
TRUNCATION_MARK = "...[truncated: see the config/resolved.yaml artifact]"
_NOT_ALLOWED = re.compile(r"[^/\w.\- ]")
# An unreachable server must not stall training for minutes of MLflow's default HTTP retries.
_HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                  "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}


def sanitize_key(key: str) -> str:
    """A param/metric key MLflow accepts on every platform: ``=`` and other characters become
    ``_``; at most 250 characters."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"MLflow key must be a non-empty string, got {key!r}")
    return _NOT_ALLOWED.sub("_", key)[:MAX_KEY]


def metric_key(record: MetricRecord) -> str:
    """The MLflow metric name of a record, e.g. ``ppl/ctx_4096``."""
    return sanitize_key(record.key())


def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"model": {"pe": {"kind": "rope"}}}`` → ``{"model.pe.kind": "rope"}``; lists as JSON."""
    flat: dict[str, str] = {}
    for key, value in params.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten_params(value, prefix=f"{dotted}."))
        elif isinstance(value, (list, tuple, Mapping)):
            flat[sanitize_key(dotted)] = json.dumps(value, sort_keys=True, default=str)
        else:
            flat[sanitize_key(dotted)] = str(value)
    return flat


def catalog_dir(catalog_url: str | None = None) -> Path:
    """Folder of the SQLite catalog file (``<cwd>/.phaselab`` for a server catalog)."""
    from phaselab.catalog import db

    path = db.sqlite_path(db.normalize_url(db.default_url() if catalog_url is None else catalog_url))
    return path.parent if path is not None else Path.cwd() / ".phaselab"


def default_tracking_uri(catalog_url: str | None = None) -> str:
    """``MLFLOW_TRACKING_URI`` if set, else ``sqlite:///<catalog dir>/mlflow.db``."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{catalog_dir(catalog_url) / 'mlflow.db'}"


def default_artifact_root(catalog_url: str | None = None) -> str:
    return (catalog_dir(catalog_url) / "mlartifacts").resolve().as_uri()


def _is_local_store(uri: str) -> bool:
    return uri.split(":", 1)[0].split("+", 1)[0] in ("sqlite", "postgresql", "mysql", "mssql")


def _chunks(items: list[Any], n: int) -> Iterable[list[Any]]:
    for i in range(0, len(items), n):
        yield items[i:i + n]


class MlflowTracker:
    """Tracker → one MLflow run (see the module docstring). ``run_id`` is None until the run
    exists on the server (it may be created later, when a spooled start is replayed)."""

    def __init__(self, *, tracking_uri: str, experiment: str, run_name: str, spool_path: Path,
                 tags: Mapping[str, str] | None = None, parent_run_id: str | None = None,
                 parent_cell: Mapping[str, Any] | None = None, run_id: str | None = None,
                 artifact_root: str | None = None, rank: int | None = None,
                 retry_interval_s: float = 30.0) -> None:
        if rank is None:
            rank = int(os.environ.get("RANK", "0"))
        self.active = rank == 0
        self.tracking_uri = tracking_uri
        self.run_id = run_id
        self.spool_path = Path(spool_path)
        self.retry_interval_s = retry_interval_s
        self._client_obj: Any = None
        self._logged_params: dict[str, str] = {}
        self._last_try = 0.0
        self._offline = self.spool_path.exists() and self.spool_path.stat().st_size > 0
        if not self.active:
            return
        for key, value in _HTTP_DEFAULTS.items():
            os.environ.setdefault(key, value)
        if self._offline:
            self.flush()
        location = None
        if artifact_root is not None and _is_local_store(tracking_uri):
            location = f"{artifact_root.rstrip('/')}/{sanitize_key(experiment)}"
        self._submit({"op": "start", "experiment": experiment, "run_name": run_name, "run_id": run_id,
                      "tags": dict(tags or {}), "parent_run_id": parent_run_id,
                      "parent_cell": None if parent_cell is None else dict(parent_cell),
                      "artifact_location": location})

    @classmethod
    def for_stage(cls, *, tracking_uri: str, grid: str, grid_id: int, cell_id: int, cell_key: str,
                  stage_hash: str, stage_kind: str, spool_dir: Path, axes: Mapping[str, Any] | None = None,
                  upstream: Iterable[str] = (), attn_backend: str | None = None,
                  git_commit: str | None = None, parent_run_id: str | None = None,
                  run_id: str | None = None, run_name: str | None = None,
                  artifact_root: str | None = None, rank: int | None = None) -> MlflowTracker:
        """The child run of one stage in its grid's experiment under its cell's parent run
        (looked up or created by cell tags when ``parent_run_id`` is None)."""
        tags = {"phaselab.stage_hash": stage_hash, "phaselab.grid_id": str(grid_id),
                "phaselab.cell_id": str(cell_id), "phaselab.stage_kind": stage_kind,
                "phaselab.upstream": ",".join(upstream), "phaselab.run_level": "stage"}
        if attn_backend:
            tags["phaselab.attn.backend"] = attn_backend
        if git_commit:
            tags["mlflow.source.git.commit"] = git_commit
        parent_cell = None if parent_run_id else {"grid": grid, "grid_id": grid_id, "cell_id": cell_id,
                                                  "cell_key": cell_key, "axes": dict(axes or {})}
        return cls(tracking_uri=tracking_uri, experiment=grid,
                   spool_path=Path(spool_dir) / f"{stage_hash}.jsonl",
                   run_name=run_name or f"{stage_kind}-{stage_hash[:12]}", tags=tags,
                   parent_run_id=parent_run_id, parent_cell=parent_cell, run_id=run_id,
                   artifact_root=artifact_root, rank=rank)

    # -- Tracker protocol ---------------------------------------------------------------------
    def log_params(self, params: Mapping[str, Any]) -> None:
        self._submit({"op": "params", "params": flatten_params(params)})

    def log_metrics(self, metrics: Mapping[str, float], *, step: int) -> None:
        self._submit({"op": "metrics", "metrics": [[sanitize_key(k), float(v), int(step)]
                                                   for k, v in metrics.items()]})

    def log_records(self, records: list[MetricRecord]) -> None:
        self._submit({"op": "metrics", "metrics": [[metric_key(r), float(r.value), int(r.step or 0)]
                                                   for r in records]})

    def log_artifact(self, path: Path, *, name: str) -> None:
        self._submit({"op": "artifact", "path": str(path), "name": name})

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self._submit({"op": "tags", "tags": {k: str(v) for k, v in tags.items()}})

    # -- phaselab additions -------------------------------------------------------------------
    def log_config(self, resolved_yaml: str) -> None:
        """The full resolved config, as ``config/resolved.yaml`` (params may be truncated)."""
        self._submit({"op": "text", "text": resolved_yaml, "file": "config/resolved.yaml"})

    def log_env(self, fingerprint: Mapping[str, Any]) -> None:
        """The environment fingerprint (catalog.fingerprint), as ``env/fingerprint.json``."""
        self._submit({"op": "text", "text": json.dumps(fingerprint, indent=2, sort_keys=True, default=str),
                      "file": "env/fingerprint.json"})

    def end(self, status: str = "FINISHED") -> None:
        if status not in ("FINISHED", "FAILED", "KILLED"):
            raise ValueError(f"run status must be FINISHED, FAILED or KILLED, got {status!r}")
        self._submit({"op": "end", "status": status})

    @property
    def pending(self) -> int:
        """Number of spooled calls not yet in MLflow."""
        if not self.spool_path.exists():
            return 0
        return sum(1 for line in self.spool_path.read_text().splitlines() if line.strip())

    def flush(self) -> bool:
        """Replay the spool in order; True when everything reached MLflow. Never raises."""
        if not self.active or not self.spool_path.exists():
            self._offline = False
            return True
        self._last_try = time.monotonic()
        ops = [json.loads(line) for line in self.spool_path.read_text().splitlines() if line.strip()]
        for i, op in enumerate(ops):
            try:
                self._apply(op)
            except Exception as exc:  # still unreachable: keep the rest, in order
                log.warning("MLflow still unreachable (%s); %d calls stay spooled", exc, len(ops) - i)
                tmp = self.spool_path.with_suffix(".tmp")
                tmp.write_text("".join(json.dumps(o) + "\n" for o in ops[i:]))
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
        if self._offline:
            self._spool(op)
            if time.monotonic() - self._last_try >= self.retry_interval_s:
                self.flush()
            return
        try:
            self._apply(op)
        except Exception as exc:  # never into training: spool and catch up later
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
            self.spool_path.parent.mkdir(parents=True, exist_ok=True)
            with self.spool_path.open("a") as f:
                f.write(json.dumps(op, default=str) + "\n")
        except Exception as exc:  # a full disk must not kill training either
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
        if self.run_id is None:
            raise RuntimeError("MLflow run not started yet")
        client, run_id = self._client(), self.run_id
        if kind == "params":
            self._log_params(op["params"])
        elif kind == "metrics":
            from mlflow.entities import Metric

            batch = [Metric(k, v, op["ts"], s) for k, v, s in op["metrics"]]
            for chunk in _chunks(batch, 1000):
                client.log_batch(run_id, metrics=chunk)
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

    def _log_tags(self, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(k, v) for k, v in tags.items()]
        for chunk in _chunks(items, 100):
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
        for chunk in _chunks(new, 100):
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
        exp_id = self._experiment_id(op["experiment"], op.get("artifact_location"))
        run_id = self.run_id or op.get("run_id")
        stage_hash = op["tags"].get("phaselab.stage_hash")
        if run_id is None and stage_hash:
            found = client.search_runs(
                [exp_id], filter_string=f"tags.`phaselab.stage_hash` = '{stage_hash}'", max_results=1,
                order_by=["attributes.start_time ASC"])
            run_id = found[0].info.run_id if found else None
        if run_id is not None:  # resume: reattach, remember what is logged, never re-log params
            run = client.get_run(run_id)
            self._logged_params = dict(run.data.params)
            if run.info.status != "RUNNING":
                client.update_run(run_id, status="RUNNING")
            self.run_id = run_id
            if op["tags"]:
                self._log_tags(op["tags"])
            return
        tags = dict(op["tags"])
        parent = op.get("parent_run_id")
        if parent is None and op.get("parent_cell"):
            parent = ensure_cell_run(client, exp_id, **op["parent_cell"])
        if parent:
            tags["mlflow.parentRunId"] = parent
        run = client.create_run(exp_id, start_time=op["ts"], tags=tags, run_name=op["run_name"])
        self.run_id = run.info.run_id
        self._logged_params = {}

    def _experiment_id(self, name: str, artifact_location: str | None) -> str:
        client = self._client()
        exp = client.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        try:
            return client.create_experiment(name, artifact_location=artifact_location)
        except Exception:  # another process created it first
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id


def ensure_cell_run(client: Any, experiment_id: str, *, grid: str, grid_id: int, cell_id: int,
                    cell_key: str, axes: Mapping[str, Any]) -> str:
    """The parent run of a cell: found by its tags, else created with the axes as params (so the
    compare view lines cells up by encoding, size and seed). Returns its run id."""
    from mlflow.entities import Param

    found = client.search_runs(
        [experiment_id], max_results=1, order_by=["attributes.start_time ASC"],
        filter_string=(f"tags.`phaselab.run_level` = 'cell' and tags.`phaselab.grid_id` = '{grid_id}' "
                       f"and tags.`phaselab.cell_id` = '{cell_id}'"))
    if found:
        return found[0].info.run_id
    tags = {"phaselab.run_level": "cell", "phaselab.grid": grid, "phaselab.grid_id": str(grid_id),
            "phaselab.cell_id": str(cell_id), "phaselab.cell_key": cell_key[:5000]}
    run = client.create_run(experiment_id, tags=tags, run_name=cell_key[:250])
    params = [Param(k, v[:MAX_PARAM_VALUE]) for k, v in flatten_params(dict(axes), prefix="axis.").items()]
    for chunk in _chunks(params, 100):
        client.log_batch(run.info.run_id, params=chunk)
    return run.info.run_id
