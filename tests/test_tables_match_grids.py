"""Every paper table (catalog/reports/tables/*.py) binds to a shipped grid that produces what it reads.

Checked statically, without running anything: each grid is planned offline
(``orchestrator.plan.dag.plan_grid``: axes expansion, stage templates per cell, typed configs), and
each stage's metric rows are predicted from its kind and config the way the workloads write
them (training stages: ``loss``/``acc`` per final-eval split with a ``step``; eval suites:
``workloads.evals.api``'s documented records). Those rows carry the same fields as
``CatalogStore.metrics_frame`` rows, so the spec is then *built* on them with the real
``build``: a row/column/``where`` field the rows lack raises, an ambiguity (two stages giving
one cell) raises, and every expected cell must be filled for every expected seed. The last
tests break a real spec on purpose and check that the mismatch is reported by name.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

import pytest
import yaml

from phaselab.catalog.reports.tables import TABLES, get_spec
from phaselab.catalog.reports.tables.spec import TableSpec, build, get_field
from phaselab.orchestrator.language.library import shipped_grids
from phaselab.orchestrator.plan.dag import Dag, plan_grid
from phaselab.workloads.evals.bundle import BLIMP_GROUP, TASKS_DIR

# lm-eval tasks the shipped grids name, with the metrics lm-eval reports for them (multiple
# choice: acc and acc_norm; LAMBADA: acc and perplexity). phaselab's own groups are read below.
LM_EVAL_METRICS: dict[str, tuple[str, ...]] = {
    "lambada_openai": ("acc", "perplexity"), "hellaswag": ("acc", "acc_norm"),
    "piqa": ("acc", "acc_norm"), "arc_easy": ("acc", "acc_norm"),
    "phaselab_cbt_cn": ("acc",), "phaselab_cbt_ne": ("acc",), BLIMP_GROUP: ("acc",),
}


def _lm_eval_tasks(name: str) -> Iterator[tuple[str, tuple[str, ...]]]:
    """(task, metrics) for a task or a phaselab group (group row + its sub-tasks' rows)."""
    if name in LM_EVAL_METRICS:
        yield name, LM_EVAL_METRICS[name]
        return
    group = TASKS_DIR / f"{name}.yaml"      # a group file (task files use !function: not read)
    if not group.is_file():
        raise AssertionError(f"lm-eval task {name!r}: add its metrics to LM_EVAL_METRICS")
    doc = yaml.safe_load(group.read_text())
    yield name, tuple(m["metric"] for m in doc["aggregate_metric_list"])
    for sub in doc["task"]:
        yield from _lm_eval_tasks(sub)


def predicted_records(kind: str, config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The MetricRecord fields a stage of ``kind`` with typed ``config`` will write."""
    if kind in ("pretrain", "cpt", "finetune"):
        train, data = config["train"], config.get("data") or {}
        # empty final_eval_splits = every split but train: valid and test (a superset is safe:
        # it can only reveal more ambiguity)
        splits = train["final_eval_splits"] or ("valid", "test")
        return [{"name": n, "split": s, "task": data.get("kind"), "step": train["steps"],
                 "context_len": data.get("block_size")} for s in splits for n in ("loss", "acc")]
    ev = config.get("eval") or {}
    suite, task = ev.get("suite"), (ev.get("data") or {}).get("kind")
    if suite == "ppl-by-length":
        return [{"name": n, "task": task, "split": ev["split"], "context_len": length}
                for length in ev["ppl"]["lengths"] for n in ("nll", "ppl")]
    if suite == "task":
        metric = ev.get("metric") or ("acc" if task == "indirect_indexing" else "nll")
        return [{"name": metric, "task": task, "split": ev["split"]}]
    if suite == "lm-eval":
        opts = ev["lm_eval"]
        return [{"name": m, "task": t, "context_len": opts["max_length"]}
                for name in opts["tasks"] for t, metrics in _lm_eval_tasks(name) for m in metrics]
    if suite == "niah":
        return [{"name": "niah_acc", "task": task, "split": ev["split"], "context_len": length}
                for length in ev["niah"]["lengths"]]
    return []   # freq analysis: per-layer shares, read by no table


@functools.cache
def _plan(grid: str) -> Dag:
    return plan_grid(grid)


@functools.cache
def predicted_frame(grid: str) -> tuple[dict[str, Any], ...]:
    """metrics_frame-shaped rows (value 1.0) for every (cell, stage, predicted metric)."""
    dag, rows = _plan(grid), []
    base = {"grid": grid, "grid_id": 1, "backend": None, "state": "SUCCEEDED", "attempts": 1,
            "finished_at": None, "grid_version": 1, "unit": "", "n": None, "stderr": None, "value": 1.0,
            "step": None, "context_len": None, "depth": None, "task": None, "split": None}
    for ci, cell in enumerate(dag.cells):
        for role, stage_hash in dag.cell_stages[cell.key].items():
            node = dag.nodes[stage_hash]
            for rec in predicted_records(node.kind, node.config):
                rows.append({**base, **rec, "cell_id": ci, "cell_key": cell.key, "axes": dict(cell.axes),
                             "stage_hash": stage_hash, "stage_kind": node.kind, "stage_name": node.name,
                             "role": role})
    return tuple(rows)


def _field_values(rows: list[dict[str, Any]], name: str) -> set[Any]:
    return {repr(get_field(r, name)) for r in rows}


def mismatches(spec: TableSpec) -> list[str]:
    """Why ``spec`` would not render fully from its grid(s); [] when it would."""
    shipped = shipped_grids()
    missing = [g for g in spec.grids if g not in shipped]
    if missing:
        return [f"grid {g!r} is not shipped (shipped: {', '.join(shipped)})" for g in missing]
    problems = [f"grid {g!r} runs seeds {_plan(g).spec.seeds}, the table expects {list(spec.seeds)}"
                for g in spec.grids if tuple(_plan(g).spec.seeds) != tuple(spec.seeds)]
    rows = [r for g in spec.grids for r in predicted_frame(g)]
    axes = {a for r in rows for a in r["axes"]}
    fields = [d.field for d in spec.rows] + [spec.cols.field, *spec.where, spec.seed_field]
    problems += [f"axis {f[5:]!r} is not an axis of {'/'.join(spec.grids)} (axes: {sorted(axes)})"
                 for f in fields if f.startswith("axes.") and f[5:] not in axes]
    if problems:
        return problems
    named = [r for r in rows if r["name"] == spec.metric]
    if not named:
        return [f"metric {spec.metric!r} is produced by no stage (metrics: {sorted({r['name'] for r in rows})})"]
    for dim in (*spec.rows, spec.cols):
        parts = [p for v in dim.values for p in spec.combine.get(v, (v,))] if dim is spec.cols else dim.values
        have = _field_values(named, dim.field)
        problems += [f"{dim.field} = {v!r} never occurs in {spec.metric!r} rows (values: {sorted(have)})"
                     for v in parts if repr(v) not in have]
    for key, want in spec.where.items():
        if repr(want) not in _field_values(named, key):
            problems.append(f"where {key} = {want!r} matches no {spec.metric!r} row")
    if problems:
        return problems
    try:
        built = build(spec, rows)
    except ValueError as err:           # ambiguous: two stages give one cell
        return [str(err)]
    for rk in built.row_keys:
        for col in spec.cols.values:
            stat = built.cells.get((rk, col))
            if stat is None or stat.n != len(spec.seeds):
                got = "no value" if stat is None else f"{stat.n}/{len(spec.seeds)} seeds"
                problems.append(f"cell row {rk} column {col!r}: {got}")
    return problems


@pytest.mark.parametrize("name", sorted(TABLES))
def test_table_spec_matches_its_shipped_grid(name: str) -> None:
    assert mismatches(get_spec(name)) == []


def test_every_shipped_grid_has_its_tables() -> None:
    bound = {g for name in TABLES for g in get_spec(name).grids}
    assert sorted(bound) == shipped_grids()


def test_predicted_rows_follow_the_grid() -> None:
    """Spot-check the static prediction itself against the grid file (hand-read values)."""
    rows = predicted_frame("tapa_long_context")
    tapa = {(r["role"], r["context_len"]) for r in rows if r["axes"]["pe"] == "tapa" and r["name"] == "ppl"}
    assert ("ppl_tapa", 65536) in tapa and ("ppl_zero_shot", 32768) in tapa
    assert not any(role == "ppl_rope_b5e5" for role, _ in tapa)          # `when: {pe: rope}`
    cbt = {r["task"] for r in predicted_frame("pope_owt_extrapolation") if r["role"] == "zero_shot_lm_eval"}
    assert {"phaselab_cbt", "phaselab_cbt_cn", "phaselab_cbt_ne", BLIMP_GROUP} <= cbt


# -- the check fails when a spec and its grid drift apart -------------------------------------
@pytest.mark.parametrize(("table", "change", "expected"), [
    ("pope_owt_ppl", {"grid": "pope_owt"}, "grid 'pope_owt' is not shipped"),
    ("pope_owt_ppl", {"metric": "val_ppl"}, "metric 'val_ppl' is produced by no stage"),
    ("pope_owt_ppl", {"seeds": (0, 1, 2)}, "runs seeds [0], the table expects [0, 1, 2]"),
    ("pope_owt_ablation", {"where": {"split": "val", "context_len": 1024}}, "where split = 'val'"),
    ("tapa_table3", {"seed_field": "axes.trial"}, "axis 'trial' is not an axis"),
    ("pope_indirect_indexing", {"where": {"split": "test"}}, "two values"),   # training's own test acc
])
def test_deliberate_mismatch_is_reported(table: str, change: dict[str, Any], expected: str) -> None:
    spec = get_spec(table)
    assert mismatches(spec) == []
    broken = mismatches(replace(spec, **change))
    assert any(expected in p for p in broken), broken


def test_deliberate_row_and_column_drift_is_reported() -> None:
    owt = get_spec("pope_owt_ppl")          # the paper's size labels instead of the grid's axis values
    cols = replace(owt.cols, values=("124M", "253M", "774M"))
    assert "axes.size = '124M' never occurs in 'ppl' rows" in " ".join(mismatches(replace(owt, cols=cols)))
    t1 = get_spec("tapa_table1")            # a method row whose eval stage the grid does not have
    rows = (replace(t1.rows[0], values=(*t1.rows[0].values, "ppl_ntk")),)
    assert "role = 'ppl_ntk' never occurs" in " ".join(mismatches(replace(t1, rows=rows, reference={})))
    pg = get_spec("pope_pg19_extrapolation")   # an evaluation length the grid does not evaluate
    cols = replace(pg.cols, values=(*pg.cols.values, 11264))
    assert "context_len = 11264 never occurs" in " ".join(mismatches(replace(pg, cols=cols)))
