"""The ``phaselab`` command line (DESIGN §5.9). Heavy imports (ray, torch, mlflow, sqlalchemy)
happen inside the commands, so ``phaselab --help`` stays fast.

Every verb takes ``--json`` and exits 0 on success, 1 otherwise. Environment:
``PHASELAB_CATALOG_URL`` (default ``sqlite:///<cwd>/.phaselab/catalog.db``), ``MLFLOW_TRACKING_URI``
(default: SQLite ``mlflow.db`` beside the catalog), ``RAY_ADDRESS`` (default: a local cluster).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import typer

from phaselab.orchestrator.cli import data as cli_data
from phaselab.orchestrator.cli import maint as cli_maint
from phaselab.orchestrator.cli import reports as cli_catalog
from phaselab.orchestrator.cli import tracking as cli_tracking
from phaselab.orchestrator.cli import train as cli_train
from phaselab.orchestrator.cli.common import (
    CATALOG,
    JSON,
    RUNS,
    emit,
    fail,
    make_console,
    no_catalog,
    open_store,
)
from phaselab.orchestrator.cli.timing import efficiency_line, stages_efficiency
from phaselab.orchestrator.engine.progress import failure_rows

app = typer.Typer(add_completion=True, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="phaselab: positional-encoding experiment grids on Ray, reproducibly.")


def _print_version(value: bool) -> None:
    if value:
        from phaselab import __version__

        typer.echo(f"phaselab {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(show_version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                            help="Print the version and exit.")) -> None:
    """phaselab: positional-encoding experiment grids on Ray, reproducibly."""

ADDRESS = typer.Option(None, "--address", help="Ray cluster address (default $RAY_ADDRESS, else a local cluster).")
METRICS = typer.Option(False, "--metrics", help="Turn on the local cluster's Prometheus metrics endpoints "
                       "(127.0.0.1, no authentication; off by default).")
ALL_VERSIONS = typer.Option(False, "--all-versions", help="Include stages of earlier versions of the grid.")
JOBS_ADDRESS = typer.Option(None, "--address", help="Ray Jobs address (http://HEAD:8265): send the controller "
                            "there as a Ray job; without it, only register the grid.")
OVERRIDES = typer.Argument(None, help="Overrides: key=v, +key=v, ~key, key=a,b, key=range(0,3).")
MAX_CELLS = typer.Option(None, "--max-cells", min=1, help="Allow this many cells for this run (default "
                         "10000; sets PHASELAB_MAX_CELLS).")
VERSION = typer.Option(None, "--version", min=1, help="Grid version (default: the one last run or submitted).")


def _max_cells(n: int | None) -> None:
    """An explicit, per-run cell maximum: through the environment, so planning in this process
    and in a submitted Ray job see the same limit."""
    if n is not None:
        from phaselab.orchestrator.language import limits

        os.environ[limits.CELLS_ENV] = str(int(n))


def _plan(grid: str, overrides: list[str] | None, as_json: bool) -> Any:
    from phaselab.orchestrator.language.yamlio import GridError
    from phaselab.orchestrator.plan.dag import plan_grid

    try:
        return plan_grid(grid, overrides or [])
    except (GridError, OSError, ValueError) as err:   # OSError: a directory, an unreadable file
        fail(as_json, str(err))


def _get_grid(store: Any, name: str, as_json: bool) -> dict[str, Any]:
    """The grid's catalog row with its versions; a clean error when there is no catalog, it
    cannot be read (no schema, server down) or the grid is not in it."""
    from sqlalchemy.exc import SQLAlchemyError

    hint = f"(run `phaselab run {name}` first)"
    if store is None:
        fail(as_json, no_catalog(hint=hint))
    try:
        grid = store.reads.get_grid(name)
    except SQLAlchemyError as err:
        where = store.engine.url.render_as_string(hide_password=True)
        why = str(getattr(err, "orig", None) or err).strip().splitlines()[0]
        fail(as_json, f"cannot read the catalog at {where}: {why} {hint}")
    if grid is None:
        fail(as_json, f"grid {name!r} is not in the catalog {hint}")
    return grid


def _grid_id(store: Any, name: str, as_json: bool) -> int:
    return _get_grid(store, name, as_json)["id"]


def _version(store: Any, name: str, version: int | None, as_json: bool) -> dict[str, Any]:
    """The grid version ``version``, or the one last run or submitted (see ``pick_version``)."""
    from phaselab.catalog.store.queries import pick_version

    try:
        return pick_version(_get_grid(store, name, as_json), version)
    except LookupError as err:
        fail(as_json, str(err))


def _grid_rows(store: Any, name: str, as_json: bool, all_versions: bool, version: int | None = None) -> list[Any]:
    """Stage rows of a grid: its version ``version`` or the one last run (with its tune
    trials), or every stage ever linked to its cells with ``all_versions``."""
    from phaselab.orchestrator.engine.controller import version_stages
    from phaselab.orchestrator.stages import child_kinds

    grid_id = _grid_id(store, name, as_json)
    rows = store.stages_for_grid(grid_id)
    current = None if all_versions else version_stages({"versions": [_version(store, name, version, as_json)]})
    if current is None:
        return rows
    children = child_kinds()
    return [r for r in rows if r.stage_hash in current or (r.kind in children and r.config.get("parent") in current)]


def _mlflow_settings(catalog: str | None, enabled: bool) -> dict[str, str] | None:
    if not enabled:
        return None
    from phaselab.catalog.tracking.mlflow_tracker import default_artifact_root, default_tracking_uri

    return {"tracking_uri": default_tracking_uri(catalog), "artifact_root": default_artifact_root(catalog)}


def stage_env(catalog: str | None, ml: dict[str, str] | None) -> dict[str, str]:
    """The environment every stage task gets through Ray's runtime_env (remote nodes do not
    inherit the driver's): where the catalog and MLflow are."""
    env = {"PHASELAB_CATALOG_URL": catalog or os.environ.get("PHASELAB_CATALOG_URL"),
           "MLFLOW_TRACKING_URI": ml["tracking_uri"] if ml else None,
           "MLFLOW_DISABLE_TELEMETRY": os.environ.get("MLFLOW_DISABLE_TELEMETRY", "true")}
    return {k: v for k, v in env.items() if v}


def _execute(dag: Any, *, catalog: str | None, runs_root: Path | None, address: str | None,
             num_cpus: int | None, mlflow: bool, dashboard: bool, as_json: bool, requeue: bool,
             metrics: bool = False) -> Any:
    from phaselab.catalog.store.db import StorageFault
    from phaselab.orchestrator.engine.controller import Controller, init_ray

    console = make_console()
    try:   # a read-only or full .phaselab is refused here, before any work starts
        store = open_store(catalog, create=True)
    except StorageFault as err:
        fail(as_json, str(err))
    ml = _mlflow_settings(catalog, mlflow)
    env_vars = stage_env(catalog, ml)

    from phaselab.orchestrator.engine.notify import Notifier
    from phaselab.orchestrator.engine.progress import Interrupted, RunView, watch_run

    view = RunView(dag, console)
    try:
        notifier = Notifier.from_env(dag.spec.grid)
    except ValueError as err:
        fail(as_json, str(err))

    def event(kind: str, node: Any, detail: str) -> None:
        if not as_json:
            view.event(kind, node, detail)
        if kind == "failed":
            notifier.stage_failed(node, detail)

    controller = Controller(store, dag, runs_root=runs_root, env_vars=env_vars, mlflow=ml, on_event=event,
                            fixed_cluster=not (address or os.environ.get("RAY_ADDRESS")))
    try:
        controller.check_runs_root()
    except StorageFault as err:
        fail(as_json, str(err))
    # The cluster is reached before the grid version is registered: an unreachable one leaves
    # no READY stage that no controller owns. Everything cached: no Ray, no MLflow, seconds.
    if controller.needs_cluster(requeue=requeue):
        from phaselab.orchestrator.engine.ray_local import ClusterAccessError

        try:
            url = init_ray(address=address, num_cpus=num_cpus, dashboard=dashboard, env_vars=env_vars,
                           log_to_driver=not as_json, metrics=metrics)
        except ClusterAccessError as err:
            fail(as_json, str(err))
        if url and not as_json:
            from phaselab.orchestrator.engine.ray_local import dashboard_banner

            for line in dashboard_banner(url, local=not (address or os.environ.get("RAY_ADDRESS"))):
                console.print(line, markup=False)
    elif dashboard and not as_json:   # --dashboard asked for: say why there is none to open
        console.print("dashboard: every stage is cached, so no Ray cluster was started and there is no "
                      "dashboard to open (`phaselab status` shows the stages)", markup=False)
    controller.submit(requeue=requeue)
    try:
        summary = watch_run(controller, view, notifier, live=not as_json)
    except Interrupted as stop:   # Ctrl-C: running stages are back to READY, nothing RUNNING is left
        if as_json:
            emit(True, {"ok": False, "interrupted": True, "grid": dag.spec.grid, "stopped": stop.stages,
                        "continue": f"phaselab resume {dag.spec.grid}"})
        else:
            console.print(stop.advice(), markup=False)
        raise typer.Exit(130) from None
    links = None
    if ml:   # calls spooled by this or an earlier run while MLflow was down, then the comparison
        from phaselab.orchestrator.cli.tracking import comparison_links, settle_tracking

        settle_tracking(store, ml["tracking_uri"], controller.runs_root)
        links = comparison_links(store, ml["tracking_uri"], dag.spec.grid, launched=bool(summary.launched))
    return store, summary, links


def _mlflow_out(links: Any) -> dict[str, Any] | None:
    """The run summary's MLflow part: deep links, and whether `phaselab mlflow` must serve them."""
    if links is None:
        return None
    return {"experiment": links.experiment, "comparison": links.comparison, "serve": links.local}


def _results(store: Any, dag: Any, as_json: bool) -> dict[str, Any]:
    """The results of this DAG's stages (earlier versions of the grid are left out)."""
    from phaselab.orchestrator.cli.views import render_results, results_table

    grid = dag.spec.grid
    order = {h: i for i, h in enumerate(dag.nodes)}
    frame = [m for m in store.reads.metrics_frame(grid=grid) if m["stage_hash"] in order]
    frame.sort(key=lambda m: ([c.key for c in dag.cells].index(m["cell_key"]), order[m["stage_hash"]]))
    cols, rows = results_table(frame)
    if not as_json:
        render_results(make_console(), grid, cols, rows)
    return {"columns": cols, "rows": rows}


@app.command()
def run(grid: str = typer.Argument(..., help="Grid file or shipped grid name (e.g. quickstart)."),
        overrides: list[str] = OVERRIDES, catalog: str = CATALOG, runs_root: Path = RUNS,
        address: str = ADDRESS, num_cpus: int = typer.Option(None, help="CPUs of the local Ray cluster."),
        mlflow: bool = typer.Option(True, "--mlflow/--no-mlflow", help="Track stages in MLflow."),
        dashboard: bool = typer.Option(False, help="Start the local cluster's Ray dashboard on 127.0.0.1 and "
                                       "print its URL and how to sign in (Ray's token authentication)."),
        max_cells: int = MAX_CELLS, metrics: bool = METRICS, as_json: bool = JSON) -> None:
    """Plan, submit and execute a grid to completion (idempotent: finished stages are cache hits)."""
    start = time.monotonic()
    _max_cells(max_cells)
    if dashboard and not (address or os.environ.get("RAY_ADDRESS")):   # before any planning or cluster
        from phaselab.orchestrator.engine.ray_local import DashboardUnavailable, require_dashboard

        try:
            require_dashboard()
        except DashboardUnavailable as err:
            fail(as_json, str(err))
    dag = _plan(grid, overrides, as_json)
    store, summary, links = _execute(dag, catalog=catalog, runs_root=runs_root, address=address,
                                     num_cpus=num_cpus, mlflow=mlflow, dashboard=dashboard, as_json=as_json,
                                     requeue=True, metrics=metrics)
    results = _results(store, dag, as_json)
    out = {"ok": summary.ok, "grid": dag.spec.grid, "counts": summary.counts(), "launched": summary.launched,
           "failed": summary.failed, "failures": failure_rows(dag, summary),
           "seconds": time.monotonic() - start, "results": results,
           "mlflow": _mlflow_out(links), "efficiency": stages_efficiency(store, summary.launched)}
    _finish_run(out, as_json)


def _finish_run(out: dict[str, Any], as_json: bool) -> None:
    if as_json:
        emit(True, out)
    else:
        from phaselab.orchestrator.cli.views import render_failures

        console = make_console()
        eff = efficiency_line(out.get("efficiency"))
        console.print(f"{out['grid']}: {out['counts']} — launched {len(out['launched'])} stage(s) in "
                      f"{out['seconds']:.1f} s" + (f"; {eff}" if eff else ""))
        render_failures(console, out["grid"], out["failures"], sum(out["counts"].values()))
        ml = out.get("mlflow")
        if ml:
            serve = " (serve it with `phaselab mlflow`)" if ml["serve"] else ""
            if ml["comparison"]:
                console.print(f"compare in MLflow{serve}: {ml['comparison']}", markup=False, soft_wrap=True)
            console.print(f"all runs in MLflow: {ml['experiment']}", markup=False, soft_wrap=True)
    raise typer.Exit(0 if out["ok"] else 1)


@app.command()
def plan(grid: str = typer.Argument(...), overrides: list[str] = OVERRIDES, catalog: str = CATALOG,
         max_cells: int = MAX_CELLS, as_json: bool = JSON) -> None:
    """Show the stage DAG: cached / will run / running / failed, with GPU-hour estimates. No side effects."""
    from phaselab.orchestrator.cli.views import plan_rows, render_plan, time_estimate

    _max_cells(max_cells)
    dag = _plan(grid, overrides, as_json)
    store = open_store(catalog, create=False)
    rows, all_rows = {}, []
    if store is not None and store.revision() is not None:
        rows = {h: r for h in dag.nodes if (r := store.get_stage(h)) is not None}
        all_rows = [r for r in store.stages_in_state({"SUCCEEDED"})]
    env_now = None
    if rows:
        from phaselab.catalog.store.fingerprint import env_fingerprint

        env_now = env_fingerprint()
    recorded = _recorded(store, all_rows)
    prow = plan_rows(dag, rows, all_rows, env_now, recorded)
    warnings = _placement_warnings(dag, prow)
    estimate = time_estimate(dag, prow, _local_capacity(), recorded)
    if as_json:
        emit(True, {"ok": True, "grid": dag.spec.grid, "grid_hash": dag.grid_hash, "code": dag.code.digest,
                     "cells": [c.key for c in dag.cells], "stages": prow, "warnings": warnings,
                     "time_estimate": estimate})
    else:
        console = make_console()
        render_plan(console, dag, prow, estimate)
        from rich.markup import escape

        for line in warnings:
            console.print(f"[yellow]warning:[/yellow] {escape(line)}", highlight=False)


def _recorded(store: Any, rows: list[Any]) -> Any:
    """What the catalog's SUCCEEDED stages took (``timing.Recorded``), None without a catalog."""
    from phaselab.orchestrator.cli.timing import TIME_PREFIX, Recorded

    if store is None or not rows:
        return None
    return Recorded(rows, store.reads.final_metrics([r.stage_hash for r in rows], TIME_PREFIX), store.reads.edges())


def _local_capacity() -> dict[str, float] | None:
    """CPUs and GPUs of the local cluster `run` would start (None for a RAY_ADDRESS cluster)."""
    from phaselab.orchestrator.plan.placement import local_node

    return None if os.environ.get("RAY_ADDRESS") else local_node()


def _placement_warnings(dag: Any, prow: list[dict]) -> list[str]:
    """The stages still to run that the cluster `run` would use cannot place: the local cluster
    it would start (read without starting it); a RAY_ADDRESS cluster is checked by `run` itself."""
    from phaselab.orchestrator.plan.placement import local_node, packing_notes, plan_warnings

    todo = {r["hash"] for r in prow if r["status"] not in ("cached",)}
    notes = packing_notes(n for h, n in dag.nodes.items() if h in todo)
    if os.environ.get("RAY_ADDRESS"):
        return notes
    node = local_node()
    where = f"the local cluster `run` would start ({node['CPU']:g} CPUs, {node.get('GPU', 0):g} GPUs)"
    return plan_warnings([n for h, n in dag.nodes.items() if h in todo], [node], where, can_grow=False) + notes


@app.command()
def submit(grid: str = typer.Argument(...), overrides: list[str] = OVERRIDES, catalog: str = CATALOG,
           runs_root: Path = RUNS, address: str = JOBS_ADDRESS, max_cells: int = MAX_CELLS,
           as_json: bool = JSON) -> None:
    """Register the grid in the catalog (idempotent); with --address, launch or attach its controller
    as a Ray job with the deterministic id phaselab-<grid hash>-v<version>."""
    from phaselab.catalog.store.db import StorageFault
    from phaselab.orchestrator.engine.controller import Controller

    _max_cells(max_cells)
    dag = _plan(grid, overrides, as_json)
    try:
        store = open_store(catalog, create=True)
    except StorageFault as err:   # a read-only or full catalog folder, in one line
        fail(as_json, str(err))
    grid_id = Controller(store, dag).submit(requeue=True)
    version = next(v["version"] for v in store.reads.get_grid(dag.spec.grid)["versions"] if v["grid_hash"] == dag.grid_hash)
    out: dict[str, Any] = {"ok": True, "grid": dag.spec.grid, "grid_id": grid_id, "version": version,
                           "stages": len(dag.nodes)}
    if address:
        from phaselab.orchestrator.engine.jobs import submit_job
        from phaselab.orchestrator.engine.ray_local import ClusterAccessError

        try:
            out["job"] = submit_job(address, dag, store.url, runs_root, version)
        except ClusterAccessError as err:
            fail(as_json, str(err))
    emit(as_json, out)
    if not as_json:
        make_console().print(f"submitted {dag.spec.grid} v{version}: {len(dag.nodes)} stages"
                         + (f"; Ray job {out['job']['id']} ({out['job']['status']})" if address else
                            f"; run `phaselab resume {dag.spec.grid}` to execute"))


def _stored_dag(store: Any, name: str, as_json: bool, version: int | None = None) -> Any:
    """The DAG of the grid's version ``version`` (default: the one last run or submitted),
    rebuilt from its resolved YAML."""
    from phaselab.orchestrator.language.spec import validate_spec
    from phaselab.orchestrator.language.yamlio import GridError, load_yaml
    from phaselab.orchestrator.plan.dag import build_dag

    latest = _version(store, name, version, as_json)
    try:
        doc, marks = load_yaml(latest["yaml_resolved"], file=f"<catalog grid {name} v{latest['version']}>")
        dag = build_dag(validate_spec(doc, marks), marks, yaml_submitted=latest["yaml_submitted"],
                        yaml_resolved=latest["yaml_resolved"])
    except GridError as err:
        fail(as_json, str(err))
    if dag.grid_hash != latest["grid_hash"] and not as_json:
        make_console().print("[yellow]warning:[/] the code or data changed since this grid was submitted; "
                         "changed stages get new keys and run anew")
    return dag


@app.command()
def resume(grid: str = typer.Argument(..., help="Grid name in the catalog (or a grid file)."),
           overrides: list[str] = OVERRIDES, catalog: str = CATALOG, runs_root: Path = RUNS,
           address: str = ADDRESS, num_cpus: int = typer.Option(None), mlflow: bool = typer.Option(True, "--mlflow/--no-mlflow"),
           version: int = VERSION, max_cells: int = MAX_CELLS, metrics: bool = METRICS,
           as_json: bool = JSON) -> None:
    """Re-attach a controller to a grid: reclaim stages of a dead controller, finish the rest."""
    start = time.monotonic()
    _max_cells(max_cells)
    from phaselab.orchestrator.engine.jobs import unseal_env

    try:   # a submitted job's credentials (jobs.py), before the catalog is opened
        unseal_env()
    except ValueError as err:
        fail(as_json, str(err))
    if Path(grid).is_file() or overrides:
        dag = _plan(grid, overrides, as_json)
    else:
        dag = _stored_dag(open_store(catalog, create=False), grid, as_json, version)
    store, summary, links = _execute(dag, catalog=catalog, runs_root=runs_root, address=address,
                                     num_cpus=num_cpus, mlflow=mlflow, dashboard=False, as_json=as_json,
                                     requeue=False, metrics=metrics)
    results = _results(store, dag, as_json)
    _finish_run({"ok": summary.ok, "grid": dag.spec.grid, "counts": summary.counts(),
                 "launched": summary.launched, "failed": summary.failed, "failures": failure_rows(dag, summary),
                 "seconds": time.monotonic() - start, "results": results,
                 "mlflow": _mlflow_out(links), "efficiency": stages_efficiency(store, summary.launched)}, as_json)


@app.command()
def status(grid: str = typer.Argument(...), catalog: str = CATALOG,
           watch: bool = typer.Option(False, "--watch", help="Refresh until nothing is pending."),
           times: bool = typer.Option(False, "--times", help="Where each finished training stage's time went "
                                      "(start-up, setup, train, eval, checkpoints, other)."),
           all_versions: bool = ALL_VERSIONS, version: int = VERSION, as_json: bool = JSON) -> None:
    """Per-stage state of a grid (the version last run or submitted, or --version), from the
    catalog: axis values, step progress and ETA of running stages, why failed stages failed,
    each training stage's share of time in training steps and the grid's GPU efficiency."""
    from phaselab.orchestrator.cli.timing import TIME_PREFIX, efficiency
    from phaselab.orchestrator.cli.views import show_status

    store = open_store(catalog, create=False)
    grid_id = _grid_id(store, grid, as_json)
    members: dict[str, list[dict[str, Any]]] = {}   # a stage's cells do not change while watching

    def rows() -> list[dict[str, Any]]:
        from phaselab.orchestrator.cli.views import status_rows

        stages = _grid_rows(store, grid, as_json, all_versions, version)
        for r in stages:
            if r.stage_hash not in members:
                members[r.stage_hash] = [c for c in store.reads.cells_for_stage(r.stage_hash) if c["grid_id"] == grid_id]
        done = [r.stage_hash for r in stages if r.state == "SUCCEEDED"]
        return status_rows(stages, members, store.reads.final_metrics(done, TIME_PREFIX))

    if as_json:
        srows = rows()
        emit(True, {"ok": True, "grid": grid, "stages": srows, "efficiency": efficiency(srows)})
        return
    show_status(make_console(), grid, rows, watch=watch, times=times)


@app.command()
def cancel(grid: str = typer.Argument(...), catalog: str = CATALOG, as_json: bool = JSON) -> None:
    """Cancel every pending stage of a grid (a running controller stops their Ray tasks). Never
    deletes artifacts."""
    store = open_store(catalog, create=False)
    grid_id = _grid_id(store, grid, as_json)
    moved = [r.stage_hash for r in store.stages_for_grid(grid_id)
             if store.transition(r.stage_hash, "CANCELLED", expected={"PLANNED", "READY", "RUNNING", "BLOCKED"},
                                 failure_class="cancelled", message="cancelled from the CLI")]
    emit(as_json, {"ok": True, "grid": grid, "cancelled": moved})
    if not as_json:
        make_console().print(f"cancelled {len(moved)} stage(s) of {grid}")


@app.command()
def retry(grid: str = typer.Argument(...), failed: bool = typer.Option(False, "--failed", help="Re-queue FAILED stages."),
          failure_class: str = typer.Option(None, "--class", help="Only this failure class (oom, hung, code, ...)."),
          catalog: str = CATALOG, as_json: bool = JSON) -> None:
    """Re-queue failed stages (then `phaselab resume GRID` runs them)."""
    from phaselab.orchestrator.engine.failures import CLASSES
    from phaselab.orchestrator.stages import child_kinds

    if not failed:
        fail(as_json, "nothing to retry: pass --failed")
    if failure_class is not None and failure_class not in CLASSES:
        fail(as_json, f"unknown failure class {failure_class!r}; expected one of {', '.join(CLASSES)}")
    store = open_store(catalog, create=False)
    moved = []
    for r in _grid_rows(store, grid, as_json, all_versions=False):   # only what `resume` will run
        if r.kind in child_kinds():   # child stages re-run with their parent
            continue
        if r.state == "FAILED" and failure_class in (None, r.failure_class):
            if store.transition(r.stage_hash, "PLANNED", expected={"FAILED"}):
                moved.append(r.stage_hash)
        elif r.state == "BLOCKED":
            store.transition(r.stage_hash, "PLANNED", expected={"BLOCKED"})
    emit(as_json, {"ok": True, "grid": grid, "requeued": moved})
    if not as_json:
        make_console().print(f"re-queued {len(moved)} stage(s); run `phaselab resume {grid}`")


@app.command()
def why(stage: str = typer.Argument(..., help="Stage hash (prefix), or with --grid a stage label/name."),
        grid: str = typer.Option(None, "--grid", help="Explain a stage of this (unsubmitted) grid."),
        overrides: list[str] = OVERRIDES, catalog: str = CATALOG, as_json: bool = JSON) -> None:
    """Explain a cache hit or miss: what differs from the closest stored stage of the same kind."""
    from phaselab.catalog.store.schema import STATES
    from phaselab.orchestrator.cli.views import explain

    store = open_store(catalog, create=False)
    stored = store.stages_in_state(STATES) if store is not None else []
    if grid is not None:
        dag = _plan(grid, overrides, as_json)
        nodes = [n for n in dag.nodes.values() if n.hash.startswith(stage) or stage in (n.name, n.label)]
        if not nodes:
            fail(as_json, f"no stage {stage!r} in grid {dag.spec.grid}")
        node = nodes[0]
        h, kind, name, parts, mods = node.hash, node.kind, node.name, node.key.parts, node.key.code_modules
    else:
        rows = [r for r in stored if r.stage_hash.startswith(stage)]
        if len(rows) != 1:
            fail(as_json, f"{len(rows)} stored stages match {stage!r}; give a longer hash prefix or --grid")
        r = rows[0]
        h, kind, name = r.stage_hash, r.kind, r.name
        parts, mods = r.cache_key_parts.get("parts", {}), r.cache_key_parts.get("code_modules", {})
    own = next((r for r in stored if r.stage_hash == h), None)
    hit = own is not None and own.state == "SUCCEEDED"
    result = explain(parts, mods, [r for r in stored if r.kind == kind and r.stage_hash != h], role=name)
    out = {"ok": True, "stage": h, "kind": kind, "name": name, "hit": hit,
           "state": own.state if own is not None else None, **result}
    if as_json:
        emit(True, out)
        return
    console = make_console()
    if hit:
        console.print(f"[green]HIT[/] {kind} {name} {h[:12]}: a SUCCEEDED stage with this exact key exists "
                      f"(finished {own.finished_at}); nothing will run.")
    else:
        console.print(f"[yellow]MISS[/] {kind} {name} {h[:12]}: no SUCCEEDED stage has this key "
                      f"(state: {out['state'] or 'not submitted'}).")
    if result["closest"]:
        c = result["closest"]
        console.print(f"closest stored {kind}: {c['name']} {c['hash'][:12]} ({c['state']}); differences:")
        for line in result["differences"] or ["(none besides identity)"]:
            console.print(f"  - {line}")
    else:
        console.print(f"no other stored {kind} stage to compare with")


ENCODING_KINDS = typer.Argument(None, help="Kinds to show (also \"module:Class\"); default: all registered.")


@app.command()
def encodings(kinds: list[str] = ENCODING_KINDS, as_json: bool = JSON) -> None:
    """List the positional encodings a grid may name, with their `pe.options` (docs/EXTENDING.md)."""
    from phaselab.orchestrator.language.reference import encodings_reference

    text = encodings_reference(kinds or None)
    emit(as_json, {"ok": True, "text": text})
    if not as_json:
        typer.echo(text, nl=False)


# Verbs in their own modules, registered in this order (it is the order of `phaselab --help`).
cli_train.register(app)
cli_maint.register(app)
cli_catalog.register(app)
cli_tracking.register(app)
cli_data.register(app)


if __name__ == "__main__":   # `python -m phaselab.orchestrator.cli.main` (the Ray job entrypoint)
    app()
