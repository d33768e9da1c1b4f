"""The Ray node of every stage attempt (migration 0003): written when the attempt starts, kept
when it succeeds, refused for a stale attempt, never duplicated; ``attempt_nodes`` and the
stage export show it."""

from __future__ import annotations

import sqlalchemy as sa

from phaselab.catalog.store import db
from phaselab.catalog.store.api import CatalogStore, StageSpec
from phaselab.catalog.tracking import MetricRecord

H = "a" * 64
NODE_1, NODE_2 = "1f" * 28, "2e" * 28   # Ray node ids are 28 bytes, written as hex


def _ready_stage(store: CatalogStore) -> None:
    gid = store.upsert_grid(name="g", grid_hash="h", yaml_submitted="x: 1", yaml_resolved="x: 1")
    cid = store.upsert_cell(grid_id=gid, cell_key="pe=rope", axes={"pe": "rope"})
    store.upsert_stage(StageSpec(stage_hash=H, kind="pretrain", config={"a": 1}, cache_key_parts={}, state="READY"))
    store.link_cell_stage(cid, H, role="pretrain")


def test_each_attempt_keeps_the_node_it_started_on(store: CatalogStore) -> None:
    _ready_stage(store)
    assert store.claim(H, "ctl-1")
    assert store.record_attempt_start(H, 1, NODE_1)
    assert store.record_attempt_start(H, 1, NODE_1)            # a repeated beat: idempotent
    assert not store.record_attempt_start(H, 2, NODE_2)        # not the running attempt: refused
    assert store.get_stage(H).node_id == NODE_1
    # attempt 1 is lost with its node; attempt 2 runs elsewhere and succeeds
    assert store.transition(H, "READY", expected={"RUNNING"}, failure_class="preemption", message="lost")
    assert store.claim(H, "ctl-1") and store.get_stage(H).node_id is None   # until its worker says where
    assert store.record_attempt_start(H, 2, NODE_2)
    store.finalize_success(H, metrics=[MetricRecord(name="loss", value=1.5, step=3)], artifacts=[],
                           env={"git_sha": "abc", "world_size": 1}, backend=None, mlflow_run_id=None)
    assert store.reads.attempt_nodes([H, "b" * 64]) == {H: [(1, NODE_1), (2, NODE_2)]}
    rows = store.reads.attempts_for_stage(H)
    assert [(r["attempt_no"], r["node_id"], r["env"]) for r in rows] == \
        [(1, NODE_1, {}), (2, NODE_2, {"git_sha": "abc", "world_size": 1})]   # env once it succeeded
    assert all(r["started_at"] is not None for r in rows) and rows[0]["started_at"] <= rows[1]["started_at"]
    assert (store.get_stage(H).state, store.get_stage(H).node_id) == ("SUCCEEDED", NODE_2)
    store.finalize_success(H, metrics=[], artifacts=[], env={"git_sha": "abc"}, backend=None,
                           mlflow_run_id=None, node_id=NODE_2)   # a retried report
    with store.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT COUNT(*) FROM attempt")).scalar_one() == 2


def test_a_success_without_a_start_record_stores_its_node(store: CatalogStore) -> None:
    _ready_stage(store)
    assert store.claim(H, "ctl-1")
    store.finalize_success(H, metrics=[], artifacts=[], env={}, backend=None, mlflow_run_id=None, node_id=NODE_1)
    assert store.reads.attempt_nodes([H]) == {H: [(1, NODE_1)]} and store.get_stage(H).node_id == NODE_1


def test_bad_attempt_numbers_and_node_ids_are_refused(store: CatalogStore) -> None:
    import pytest

    _ready_stage(store)
    for attempt, node in ((0, NODE_1), (True, NODE_1), (1, "x" * 65), (1, "")):
        with pytest.raises(ValueError, match="attempt_no|node_id"):
            store.record_attempt_start(H, attempt, node)


def test_migration_0003_adds_and_drops_the_node_columns(catalog_url: str) -> None:
    store = CatalogStore(catalog_url)
    store.upgrade()
    cols = {t: {c["name"] for c in sa.inspect(store.engine).get_columns(t)} for t in ("attempt", "stage")}
    assert {"node_id", "started_at"} <= cols["attempt"] and "node_id" in cols["stage"]
    db.downgrade(store.engine, "0002")
    cols = {t: {c["name"] for c in sa.inspect(store.engine).get_columns(t)} for t in ("attempt", "stage")}
    assert not ({"node_id", "started_at"} & cols["attempt"]) and "node_id" not in cols["stage"]
    store.upgrade()
    assert store.revision() == "0003"
    store.dispose()


def test_the_stage_export_has_the_node(store: CatalogStore) -> None:
    from phaselab.catalog.reports.export import stage_rows, stage_schema

    _ready_stage(store)
    assert store.claim(H, "ctl-1") and store.record_attempt_start(H, 1, NODE_1)
    assert "node_id" in stage_schema().names
    (row,) = stage_rows(store, store.reads.get_grid("g")["id"], "g")
    assert row["node_id"] == NODE_1


def test_every_claimed_attempt_has_a_row_however_early_it_died(store: CatalogStore) -> None:
    """Attempt 1 dies before its worker ever runs (queued in Ray, then its controller was
    killed); attempt 2 is lost after its worker said where it ran; attempt 3 fails: three rows."""
    _ready_stage(store)
    assert store.claim(H, "ctl-1")
    assert [(r["attempt_no"], r["node_id"], r["env"]) for r in store.reads.attempts_for_stage(H)] == [(1, None, {})]
    assert store.transition(H, "READY", expected={"RUNNING"}, failure_class="preemption", message="reclaimed")
    assert store.claim(H, "ctl-2") and store.record_attempt_start(H, 2, NODE_2)
    assert store.transition(H, "READY", expected={"RUNNING"}, failure_class="preemption", message="lost")
    (row,) = store.claim_ready("ctl-3")
    assert store.record_failure(H, failure_class="resource", message="no space left on device at /x")
    rows = store.reads.attempts_for_stage(H)
    assert [(r["attempt_no"], r["node_id"]) for r in rows] == [(1, None), (2, NODE_2), (3, None)]
    assert row.attempts == 3 and all(r["started_at"] is not None for r in rows)
    assert store.reads.attempt_nodes([H]) == {H: [(1, None), (2, NODE_2), (3, None)]}
