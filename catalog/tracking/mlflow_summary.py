"""A grid's comparison in MLflow, for a reader who does not know MLflow (DESIGN §5.5).

When a grid has no pending stage, :func:`publish` draws the comparison with phaselab's own figure
code (``catalog.reports.grid_figures.length_curves``: the default metric, perplexity where the
grid has it, against context length on a log-2 axis, the training length marked, one line per
encoding) and renders its table (``catalog.reports.tables.render_pivot``), then

- logs both to one **summary run** per grid (tag ``phaselab.run_level = grid``, run name
  ``<grid> summary``, the table as its description so the run's overview page shows it), with
  the grid's paper tables (``phaselab tables``' named tables of the grid) under ``tables/``, and
- logs the figure to every evaluation run that measured the metric by length
  (``figures/comparison.png``), so the comparison is one click from any of them.

:func:`links` returns the deep links ``phaselab run``/``resume`` and ``phaselab mlflow`` print: the
summary figure itself (0 clicks) and the experiment's runs table. MLflow's UI routes these as
``#/experiments/<id>/runs/<run>/artifacts/<path>`` and ``#/experiments/<id>/runs``.

Never raises: MLflow is a view and the catalog holds the results.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phaselab.catalog.tracking.mlflow_common import http_defaults, is_local_store, reachable, redact
from phaselab.catalog.tracking.mlflow_experiment import NOTE, experiment_id, git_tags

log = logging.getLogger(__name__)
FIGURE_DIR = "comparison"
EVAL_FIGURE = "comparison.png"          # under each evaluation run's figures/
LOCAL_UI = "http://127.0.0.1:5000"      # where `phaselab mlflow` serves a local store by default


@dataclass(frozen=True)
class Links:
    experiment: str                # the grid's runs table
    comparison: str | None         # the summary run's comparison figure (None: not published yet)
    local: bool = False            # a local store: the links work once `phaselab mlflow` serves it


def ui_base(tracking_uri: str, ui: str | None = None) -> str:
    """The UI's address: an HTTP tracking server is its own UI; a local store is browsed through
    ``phaselab mlflow`` (``ui``, default :data:`LOCAL_UI`)."""
    if ui:
        return ui.rstrip("/")
    return LOCAL_UI if is_local_store(tracking_uri) else tracking_uri.rstrip("/")


def _summary_run(client: Any, exp_id: str, grid_id: int | None) -> Any | None:
    """The grid's summary run (of catalog grid ``grid_id``; None: the newest of any catalog)."""
    where = "tags.`phaselab.run_level` = 'grid'"
    if grid_id is not None:
        where += f" and tags.`phaselab.grid_id` = '{int(grid_id)}'"
    found = client.search_runs([exp_id], max_results=1, order_by=["attributes.start_time DESC"],
                               filter_string=where)
    return found[0] if found else None


def grids(tracking_uri: str) -> list[str]:
    """Names of the phaselab grids (experiments with stage or summary runs) MLflow holds, or []."""
    if not reachable(tracking_uri):
        return []
    http_defaults()
    try:
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=tracking_uri)
        return sorted(e.name for e in client.search_experiments()
                      if client.search_runs([e.experiment_id], max_results=1,
                                            filter_string="tags.`phaselab.run_level` != ''"))
    except Exception as exc:  # noqa: BLE001 - the tracker is a view
        log.warning("MLflow at %s failed (%s)", redact(tracking_uri), redact(str(exc)))
        return []


def links(tracking_uri: str, grid: str, grid_id: int | None = None, *, ui: str | None = None) -> Links | None:
    """Deep links into the grid's experiment, or None when MLflow has no such experiment or is
    unreachable. ``ui``: the address the UI is served at (default: :func:`ui_base`)."""
    if not reachable(tracking_uri):
        return None
    http_defaults()
    try:
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=tracking_uri)
        exp = client.get_experiment_by_name(grid)
        if exp is None:
            return None
        base = f"{ui_base(tracking_uri, ui)}/#/experiments/{exp.experiment_id}"
        run = _summary_run(client, exp.experiment_id, grid_id)
        figure = None
        if run is not None and run.data.tags.get("phaselab.summary_figure"):
            figure = f"{base}/runs/{run.info.run_id}/artifacts/{run.data.tags['phaselab.summary_figure']}"
        return Links(experiment=f"{base}/runs", comparison=figure, local=is_local_store(tracking_uri) and not ui)
    except Exception as exc:  # noqa: BLE001 - the tracker is a view
        log.warning("MLflow at %s failed (%s)", redact(tracking_uri), redact(str(exc)))
        return None


def _draw(store: Any, grid: str, out: Path) -> tuple[list[Path], str | None, str]:
    """(figure paths, the table in markdown or None, the metric) of the grid's default comparison."""
    from phaselab.catalog.reports import grid_figures as gf

    pivot = gf.default_length_pivot(store, grid)
    metric = pivot.metric
    paths = gf.length_curves(store, pivot, out / f"{grid}_{metric}_by_length", formats=("png",))   # PDFs: phaselab figures
    try:
        table = gf.length_table(store, pivot)
    except ValueError:   # no context lengths (a task metric drawn as bars): the figure says it all
        table = None
    return paths, table, metric


def publish(tracking_uri: str, store: Any, grid: str) -> Links | None:
    """Draw the grid's comparison and log it to its summary run and its evaluation runs (see the
    module docstring); returns the links, or None when there is nothing to compare yet or
    MLflow is unreachable."""
    g = store.reads.get_grid(grid)
    if g is None or not reachable(tracking_uri):
        return None
    http_defaults()
    tmp = Path(tempfile.mkdtemp(prefix="phaselab-summary-"))
    try:
        paths, table, metric = _draw(store, grid, tmp)
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=tracking_uri)
        run_id = _summary_run_id(client, grid, g["id"])
        png = next(p for p in paths if p.suffix == ".png")
        for p in paths:
            client.log_artifact(run_id, str(p), FIGURE_DIR)
        if table is not None:
            (tmp / "table.md").write_text(table)
            client.log_artifact(run_id, str(tmp / "table.md"), FIGURE_DIR)
        for path in _paper_tables(store, grid, tmp / "tables"):
            client.log_artifact(run_id, str(path), "tables")
        client.set_tag(run_id, "phaselab.summary_figure", f"{FIGURE_DIR}/{png.name}")
        client.set_tag(run_id, NOTE, f"**{grid}**: {metric} by context length, every cell of the grid "
                                     f"(`phaselab tables`, `phaselab figures {grid}`).\n\n{table or ''}")
        client.set_terminated(run_id, "FINISHED")
        shutil.copy(png, tmp / EVAL_FIGURE)
        for eval_run in _eval_runs(store, grid, metric):
            client.log_artifact(eval_run, str(tmp / EVAL_FIGURE), "figures")
    except Exception as exc:  # noqa: BLE001 - the tracker is a view: the catalog has the results
        log.warning("MLflow summary of %s not published (%s)", grid, redact(str(exc)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return links(tracking_uri, grid, g["id"])


def _summary_run_id(client: Any, grid: str, grid_id: int) -> str:
    """The grid's summary run, created in its experiment where missing."""
    exp_id = experiment_id(client, grid, None)
    run = _summary_run(client, exp_id, grid_id)
    if run is not None:
        return run.info.run_id
    return client.create_run(exp_id, run_name=f"{grid} summary", tags={
        "phaselab.run_level": "grid", "phaselab.grid": grid, "phaselab.grid_id": str(grid_id), **git_tags()}).info.run_id


def _paper_tables(store: Any, grid: str, out: Path) -> list[Path]:
    """The paper tables of the grid (``phaselab tables``' named tables that read it), as markdown
    files under ``out``; none for a grid without one."""
    from phaselab.catalog.reports.tables import TABLES, get_spec, render_table

    names = [n for n in TABLES if grid in get_spec(n).grids]
    return [r.path for n in names
            if (r := render_table(store, get_spec(n), "md", out_dir=out, record=False)).path is not None]


def _eval_runs(store: Any, grid: str, metric: str) -> list[str]:
    """MLflow run ids of the grid's SUCCEEDED stages that measured ``metric`` by context length."""
    hashes = {r["stage_hash"] for r in store.reads.metrics_frame(grid=grid)
              if r["name"] == metric and r.get("context_len") is not None}
    ids = []
    for h in sorted(hashes):
        row = store.get_stage(h)
        if row is not None and row.mlflow_run_id:
            ids.append(row.mlflow_run_id)
    return ids
