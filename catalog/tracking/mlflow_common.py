"""What phaselab shows MLflow, as pure functions: run names, params, metric keys (DESIGN §5.5).

Chosen so that runs compare in MLflow's own views:

- **Run names** say what a run is: the stage name and the axis values of its cells,
  ``pretrain pe=pope seed=1`` (:func:`run_label`), so lists and chart legends read as the grid.
- **Axis values** are params and tags ``axis.<name>`` on every run, evals included
  (:func:`axis_params`): the compare view lines runs up by encoding, size and seed.
- **Params** are the config a stage uses (:func:`used_params`): of the per-kind sections of a
  section with a ``kind`` (``model.pe.{rope,pope,tapa,alibi}``, ``data.{ii,jsb,text,...}``)
  only the kind's own are kept; the full resolved config is the ``config/resolved.yaml`` artifact.
- **Metric keys** start with the metric name (:func:`metric_points`), so MLflow's chart sections
  (one per first path segment) gather a metric across tasks, splits and lengths
  (``ppl/text/split_valid/ctx_128``, ``acc/blimp_anaphor``). A record with a context length is
  also one point of the series ``<key without ctx>/by_ctx`` whose *step* is the context length:
  MLflow then draws perplexity (or NIAH accuracy, one series per depth) against length as a
  line chart, one line per run.
- Keys are restricted to what MLflow accepts on every platform (``[/\\w.\\- ]``, no ``:`` or
  ``=``); values to its 6000-character limit (mlflow/mlflow#9709).

Nothing here imports mlflow.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import socket
import urllib.parse
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from phaselab.catalog.tracking import MetricRecord

MAX_PARAM_VALUE = 6000   # mlflow.utils.validation.MAX_PARAM_VAL_LENGTH
MAX_KEY = 250            # mlflow.utils.validation.MAX_ENTITY_KEY_LENGTH
MAX_RUN_NAME = 250
_NOT_ALLOWED = re.compile(r"[^/\w.\- ]")
# An unreachable server must not stall training for minutes of MLflow's default HTTP retries.
# Run links on stdout would break the CLI's --json output (and a closed stdout would fail the call).
_HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                  "MLFLOW_HTTP_REQUEST_TIMEOUT": "5", "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}
PROBE_TIMEOUT_S = 2.0
# Kinds whose settings live in a section of another name (workloads.data.DataConfig: the
# real-scale corpora share ``real``; the human genome also reads ``dna``'s tokenizer), and
# kinds with no section of their own. A kind not listed uses the section of its own name; a
# kind with neither keeps every section (nothing is dropped that cannot be reasoned about).
KIND_SECTIONS: Mapping[str, tuple[str, ...]] = {
    "indirect_indexing": ("ii",), "openwebtext": ("real",), "pg19": ("real",), "tokens": ("real",),
    "human_genome": ("real", "dna"), "none": (), "sinusoidal": (), "learned": (),
}


def http_defaults() -> None:
    """Bound MLflow's HTTP retries in this process unless the user chose other values, and keep
    a local store's schema check ("Updating database tables", at INFO each time a client opens
    it) off the user's terminal."""
    for key, value in _HTTP_DEFAULTS.items():
        os.environ.setdefault(key, value)
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)


# ``scheme://user:password@host``: the password part of a URL (catalog, MLflow, any other).
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^/:@\s]*:)(?P<pw>[^@/\s]+)(?=@)")
SECRET_NAME = re.compile(r"(TOKEN|PASSWORD|SECRET|_KEY)$")


def redact(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***`` (what phaselab logs)."""
    return _URL_PASSWORD.sub(r"\g<head>***", str(text))


def is_secret(name: str, value: str) -> bool:
    """Whether an environment variable carries a credential: a URL with a password in its
    value, or a name ending in TOKEN, PASSWORD, SECRET or _KEY."""
    return bool(SECRET_NAME.search(name.upper())) or redact(value) != value


def split_secrets(env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(public, secret) parts of an environment: the public part may travel where Ray logs it
    (a runtime_env); the secret part only inside task arguments or a private file."""
    public = {k: v for k, v in env.items() if not is_secret(k, v)}
    return public, {k: v for k, v in env.items() if k not in public}


def reachable(tracking_uri: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a remote tracking server accepts a TCP connection within ``timeout_s`` (a local
    SQL store always counts as reachable: there is no server to wait for)."""
    parsed = urllib.parse.urlsplit(tracking_uri)
    if parsed.scheme not in ("http", "https"):
        return True
    try:
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        with socket.create_connection((parsed.hostname or "127.0.0.1", port), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


def catalog_dir(catalog_url: str | None = None) -> Path:
    """Folder of the SQLite catalog file (``<project home>/.phaselab`` for a server catalog)."""
    from phaselab.catalog.store import db
    from phaselab.catalog.store.home import state_dir

    path = db.sqlite_path(db.normalize_url(db.default_url() if catalog_url is None else catalog_url))
    return path.parent if path is not None else state_dir()


def default_tracking_uri(catalog_url: str | None = None) -> str:
    """``MLFLOW_TRACKING_URI`` if set, else ``sqlite:///<catalog dir>/mlflow.db``."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{catalog_dir(catalog_url) / 'mlflow.db'}"


def default_artifact_root(catalog_url: str | None = None) -> str:
    return (catalog_dir(catalog_url) / "mlartifacts").resolve().as_uri()


def is_local_store(uri: str) -> bool:
    """A SQL tracking store opened directly (no server: artifacts go to a local folder)."""
    return uri.split(":", 1)[0].split("+", 1)[0] in ("sqlite", "postgresql", "mysql", "mssql")


def chunks(items: list[Any], n: int) -> Iterable[list[Any]]:
    for i in range(0, len(items), n):
        yield items[i:i + n]


def server_said_no(exc: Exception) -> bool:
    """An error the server answered with (a bad request): retrying the same call cannot help."""
    from mlflow.exceptions import RestException

    return isinstance(exc, RestException) and getattr(exc, "error_code", "") in (
        "INVALID_PARAMETER_VALUE", "RESOURCE_ALREADY_EXISTS", "RESOURCE_DOES_NOT_EXIST", "BAD_REQUEST")


@contextlib.contextmanager
def locked(path: Path, *, blocking: bool):
    """An exclusive ``flock`` on ``<path>.lock``; yields False when not blocking and it is held."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def sanitize_key(key: str) -> str:
    """A param/metric key MLflow accepts on every platform: ``=`` and other characters become
    ``_``; at most 250 characters."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"MLflow key must be a non-empty string, got {key!r}")
    return _NOT_ALLOWED.sub("_", key)[:MAX_KEY]


def _key_parts(record: MetricRecord, *, with_ctx: bool) -> list[str]:
    parts = [record.name] + ([record.task] if record.task is not None else [])
    if record.split is not None:
        parts.append(f"split_{record.split}")
    if with_ctx and record.context_len is not None:
        parts.append(f"ctx_{record.context_len}")
    if record.depth is not None:
        parts.append(f"depth_{record.depth:g}")
    return parts


def metric_key(record: MetricRecord) -> str:
    """The scalar MLflow metric of a record, e.g. ``ppl/text/split_valid/ctx_4096``."""
    return sanitize_key("/".join(_key_parts(record, with_ctx=True)))


def series_key(record: MetricRecord) -> str | None:
    """The length series a record is a point of (``ppl/text/split_valid/by_ctx``), or None."""
    if record.context_len is None:
        return None
    return sanitize_key("/".join([*_key_parts(record, with_ctx=False), "by_ctx"]))


def metric_points(records: Iterable[MetricRecord]) -> list[list[Any]]:
    """``[key, value, step]`` of each record: its scalar at its training step (0 if none) and,
    with a context length, its point of the length series at step = the context length."""
    out: list[list[Any]] = []
    for r in records:
        out.append([metric_key(r), float(r.value), int(r.step or 0)])
        series = series_key(r)
        if series is not None:
            out.append([series, float(r.value), int(r.context_len)])
    return out


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


def used_params(flat: Mapping[str, str]) -> dict[str, str]:
    """``flat`` (dotted keys) without the per-kind sections a ``kind`` does not use (module
    docstring): ``model.pe.kind=rope`` keeps ``model.pe.rope.*`` and drops ``model.pe.pope.*``."""
    drop: set[str] = set()
    for key, kind in flat.items():
        if not (key == "kind" or key.endswith(".kind")):
            continue
        prefix = key[: -len("kind")]
        sections = {k[len(prefix):].split(".")[0] for k in flat
                    if k.startswith(prefix) and "." in k[len(prefix):]}
        used = KIND_SECTIONS.get(kind, (kind,) if kind in sections else None)
        if used is not None:
            drop |= {f"{prefix}{s}." for s in sections - set(used)}
    return {k: v for k, v in flat.items() if not any(k.startswith(d) for d in drop)}


def _axis_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))


def axis_params(axes: Mapping[str, Any]) -> dict[str, str]:
    """``{"axis.<name>": value}`` for the params and tags of a run."""
    return {sanitize_key(f"axis.{k}"): _axis_text(v)[:MAX_PARAM_VALUE] for k, v in sorted(axes.items())}


def common_axes(cells: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The axis values every one of ``cells`` shares: what a stage serving several cells (one
    pretrain under fine-tunes of several learning rates) is, whatever cell it was filed under."""
    cells = list(cells)
    if not cells:
        return {}
    first = cells[0]
    return {k: v for k, v in first.items() if all(k in c and c[k] == v for c in cells[1:])}


def run_label(stage: str, axes: Mapping[str, Any]) -> str:
    """``pretrain pe=pope seed=1``: the stage name (none for a cell's run), then its axis values,
    seed last."""
    order = sorted(axes, key=lambda k: (k == "seed", k))
    words = [stage, *(f"{k}={_axis_text(axes[k])}" for k in order)]
    return " ".join(w for w in words if w)[:MAX_RUN_NAME] or "all"
