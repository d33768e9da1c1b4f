"""A grid's experiment in MLflow (DESIGN §5.5).

The controller prepares it once per run of a grid (:func:`prepare_experiment`), before any stage
starts: created where missing, with the grid's description (MLflow's ``mlflow.note.content``
tag, shown on the experiment page: the grid's words, its axes, how to compare) and the
model-training kind. Stage runs are top-level runs of it: nesting them under per-cell parent runs
collapsed the evaluations under rows without metrics and, expanded, drew a child's curve in
its parent's colour under the parent's name (MLflow 3.17's chart view). A run carries its cell as
its name, its ``axis.*`` params and tags and ``phaselab.cell_key``, so MLflow's *Group by* on an
axis groups cells, and the grid's summary run (:mod:`mlflow_summary`) holds the comparison.

Never raises into the controller: the tracker is a view, the catalog holds the states.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from phaselab.catalog.tracking.mlflow_common import (
    http_defaults,
    is_local_store,
    reachable,
    redact,
)

log = logging.getLogger(__name__)
NOTE = "mlflow.note.content"   # the description MLflow shows for an experiment or a run
# MLflow 3's UI opens an experiment of unknown kind as a GenAI (traces) page; a grid is model
# training, whose page is the runs table and its charts.
KIND_TAG, KIND = "mlflow.experimentKind", "custom_model_development"


def git_tags(commit: str | None = None, dirty: str | None = None) -> dict[str, str]:
    """``mlflow.source.git.commit``, ``phaselab.git.dirty`` (true/false) and, when dirty, the
    hash of the uncommitted diff (catalog.store.fingerprint.git_state); {} outside a git checkout."""
    if commit is None:
        from phaselab.catalog.store.fingerprint import git_state

        commit, dirty = git_state()
    if commit is None:
        return {}
    tags = {"mlflow.source.git.commit": commit, "phaselab.git.dirty": "true" if dirty else "false"}
    if dirty:
        tags["phaselab.git.diff_sha256"] = dirty
    return tags


def describe_grid(grid: str, description: str, cells: Iterable[Mapping[str, Any]]) -> str:
    """The experiment's description (markdown): the grid's own words, its axes, how to compare."""
    values: dict[str, list[str]] = {}
    for c in cells:
        for k, v in (c.get("axes") or {}).items():
            text = str(v)
            if text not in values.setdefault(k, []):
                values[k].append(text)
    axes = "; ".join(f"`{k}` ∈ {{{', '.join(vs)}}}" for k, vs in sorted(values.items())) or "none"
    return (f"{description.strip() or 'phaselab grid ' + grid}\n\n"
            f"phaselab grid `{grid}`: one run per stage, named `<stage> <axis>=<value> ...`, and the "
            f"run `{grid} summary` with the comparison figure and table. Axes: {axes}. Group or "
            "compare runs by their `axis.*` params; perplexity and NIAH accuracy against context "
            "length are the `.../by_ctx` metrics (step = context length). Seed statistics and "
            "paper tables: `phaselab tables`.")


def experiment_id(client: Any, name: str, location: str | None, description: str | None = None) -> str:
    """The experiment's id, created if missing (another process may win the race); its
    description set when given."""
    exp = client.get_experiment_by_name(name)
    if exp is None:
        try:
            exp_id = client.create_experiment(name, artifact_location=location)
        except Exception:  # another process created it first
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
            exp_id = exp.experiment_id
    else:
        exp_id = exp.experiment_id
    if description:
        client.set_experiment_tag(exp_id, NOTE, description)
        client.set_experiment_tag(exp_id, KIND_TAG, KIND)
    return exp_id


def artifact_location(tracking_uri: str, artifact_root: str | None, experiment: str) -> str | None:
    """Where a new experiment keeps artifacts: under ``artifact_root`` for a local SQL store;
    None (the server's proxied ``mlflow-artifacts:/`` root, which no client path is baked
    into) for a tracking server."""
    if artifact_root is None or not is_local_store(tracking_uri):
        return None
    return f"{artifact_root.rstrip('/')}/{experiment}"


def prepare_experiment(tracking_uri: str, experiment: str, cells: Iterable[Mapping[str, Any]], *,
                       artifact_root: str | None = None, description: str = "") -> bool:
    """Create the grid's experiment where missing and describe it (``cells``: their ``axes``).
    Never raises and never waits longer than one probe when the server is down (the stages'
    trackers then spool, and create the experiment when their spools are replayed). Returns
    whether the experiment is ready."""
    if not reachable(tracking_uri):
        log.warning("MLflow at %s unreachable; tracking is spooled until it is back", redact(tracking_uri))
        return False
    http_defaults()
    try:
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=tracking_uri)
        experiment_id(client, experiment, artifact_location(tracking_uri, artifact_root, experiment),
                      describe_grid(experiment, description, cells))
        return True
    except Exception as exc:  # noqa: BLE001 - the tracker is a view: training goes on without it
        log.warning("MLflow at %s failed (%s); tracking is spooled", redact(tracking_uri), redact(str(exc)))
        return False
