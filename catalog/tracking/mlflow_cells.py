"""A grid's experiment and its cells' parent runs in MLflow (DESIGN §5.5).

The controller creates them once per run of a grid (:func:`prepare_cell_runs`), so Ray workers
only attach child runs; it ends them when no stage of the grid is pending (:func:`end_cell_runs`).
The experiment carries the grid's description (MLflow's ``mlflow.note.content`` tag, shown on
the experiment page) with its axes and how to compare; a cell run is named by its axis values and
has them as params and tags, plus the git commit and dirty flag of the code that planned it.

Never raises into the controller: the tracker is a view, the catalog holds the states.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from phaselab.catalog.tracking.mlflow_common import (
    MAX_PARAM_VALUE,
    axis_params,
    chunks,
    http_defaults,
    is_local_store,
    reachable,
    redact,
    run_label,
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
            f"phaselab grid `{grid}`: one parent run per cell, one child run per stage "
            f"(named `<stage> <axis>=<value> ...`). Axes: {axes}. Compare runs by their `axis.*` "
            "params; perplexity and NIAH accuracy against context length are the `.../by_ctx` "
            "metrics (step = context length). Seed statistics and paper tables: `phaselab tables`.")


def ensure_cell_run(client: Any, experiment_id: str, *, grid: str, grid_id: int, cell_id: int,
                    cell_key: str, axes: Mapping[str, Any], git: Mapping[str, str] | None = None) -> str:
    """The parent run of a cell: found by its tags, else created (named by its axis values, with
    them as params and tags). Returns its run id."""
    from mlflow.entities import Param

    found = client.search_runs(
        [experiment_id], max_results=1, order_by=["attributes.start_time ASC"],
        filter_string=(f"tags.`phaselab.run_level` = 'cell' and tags.`phaselab.grid_id` = '{grid_id}' "
                       f"and tags.`phaselab.cell_id` = '{cell_id}'"))
    if found:
        return found[0].info.run_id
    tags = {"phaselab.run_level": "cell", "phaselab.grid": grid, "phaselab.grid_id": str(grid_id),
            "phaselab.cell_id": str(cell_id), "phaselab.cell_key": cell_key[:5000],
            **axis_params(axes), **(git_tags() if git is None else git)}
    run = client.create_run(experiment_id, tags=tags, run_name=run_label("", axes))
    params = [Param(k, v[:MAX_PARAM_VALUE]) for k, v in axis_params(axes).items()]
    for chunk in chunks(params, 100):
        client.log_batch(run.info.run_id, params=chunk)
    return run.info.run_id


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


def prepare_cell_runs(tracking_uri: str, experiment: str, cells: Iterable[Mapping[str, Any]], *,
                      artifact_root: str | None = None, description: str = "") -> dict[str, str | None]:
    """The parent run of each cell (``cells``: ``cell_key``, ``cell_id``, ``grid_id``, ``axes``
    and the stored ``run_id`` or None), created where missing. Never raises and never waits
    longer than one probe when the server is down: the cells without a run then map to None,
    and their stages' trackers create the parent when their spools are replayed."""
    cells = list(cells)
    known = {c["cell_key"]: c.get("run_id") for c in cells}
    if not reachable(tracking_uri):
        log.warning("MLflow at %s unreachable; tracking is spooled until it is back", redact(tracking_uri))
        return known
    http_defaults()
    try:
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=tracking_uri)
        exp_id = experiment_id(client, experiment, artifact_location(tracking_uri, artifact_root, experiment),
                               describe_grid(experiment, description, cells))
        git = git_tags()
        for c in cells:
            if known[c["cell_key"]] is None:
                known[c["cell_key"]] = ensure_cell_run(
                    client, exp_id, grid=experiment, grid_id=c["grid_id"], cell_id=c["cell_id"],
                    cell_key=c["cell_key"], axes=dict(c.get("axes") or {}), git=git)
    except Exception as exc:  # noqa: BLE001 - the tracker is a view: training goes on without it
        log.warning("MLflow at %s failed (%s); tracking is spooled", redact(tracking_uri), redact(str(exc)))
    return known


def end_cell_runs(tracking_uri: str, statuses: Mapping[str, str]) -> None:
    """End each cell's parent run (``{run_id: FINISHED | FAILED}``) once its stages are done, so
    no parent stays RUNNING. Never raises; a dead server costs one probe (the parents are then
    ended by the next run that reaches it)."""
    if not statuses or not reachable(tracking_uri):
        return
    http_defaults()
    try:
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=tracking_uri)
        for run_id, status in statuses.items():
            client.set_terminated(run_id, status=status)
    except Exception as exc:  # noqa: BLE001 - the tracker is a view: the catalog has the states
        log.warning("MLflow at %s failed ending cell runs (%s)", redact(tracking_uri), redact(str(exc)))


def _cell_statuses(store: Any, grid_id: int) -> tuple[str | None, dict[str, str | None]]:
    """(grid name, {cell id: FINISHED | FAILED | None while a stage of it is still pending})
    from the catalog's current version of the grid."""
    states: dict[str, list[str]] = {}
    name = None
    for row in store.stages_for_grid(grid_id, current_only=True):
        for cell in store.reads.cells_for_stage(row.stage_hash):
            if cell["grid_id"] == grid_id:
                name = cell["grid"]
                states.setdefault(str(cell["cell_id"]), []).append(row.state)
    out: dict[str, str | None] = {}
    for cell_id, s in states.items():
        out[cell_id] = None if set(s) & {"PLANNED", "READY", "RUNNING"} else \
            "FINISHED" if set(s) == {"SUCCEEDED"} else "FAILED"
    return name, out


def end_done_cell_runs(tracking_uri: str, store: Any) -> dict[str, str]:
    """End the parent runs still RUNNING whose cell has no pending stage in the catalog
    ``store`` (FINISHED when every stage succeeded, else FAILED): the runs a spool replay
    created after the cell ended (the tracker was down when the controller ended its cells).
    Returns ``{run_id: status}`` of the runs ended. Never raises."""
    if not reachable(tracking_uri):
        return {}
    http_defaults()
    ended: dict[str, str] = {}
    try:
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=tracking_uri)
        exps = [e.experiment_id for e in client.search_experiments()]
        runs = client.search_runs(exps, max_results=5000, filter_string=(
            "tags.`phaselab.run_level` = 'cell' and attributes.status = 'RUNNING'")) if exps else []
        grids: dict[int, tuple[str | None, dict[str, str | None]]] = {}
        for run in runs:
            tags = run.data.tags
            grid_id = int(tags.get("phaselab.grid_id", "-1"))
            name, cells = grids.setdefault(grid_id, _cell_statuses(store, grid_id))
            status = cells.get(tags.get("phaselab.cell_id", ""))
            if status and name == tags.get("phaselab.grid"):
                client.set_terminated(run.info.run_id, status=status)
                ended[run.info.run_id] = status
    except Exception as exc:  # noqa: BLE001 - the tracker is a view: the catalog has the states
        log.warning("MLflow at %s failed ending cell runs (%s)", redact(tracking_uri), redact(str(exc)))
    return ended
