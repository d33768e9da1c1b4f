"""CatalogStore on SQLite and PostgreSQL: migrations, idempotent upserts, compare-and-set state
changes, transactional and concurrent finalisation (DESIGN §5.1)."""

from __future__ import annotations

import math
import multiprocessing
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import sqlalchemy as sa
from catalog_testlib import add_stage, cell, h, run_stage

from phaselab.catalog.store import db
from phaselab.catalog.store.api import ArtifactSpec, CatalogStore, StageSpec, StateError
from phaselab.catalog.store.schema import Base
from phaselab.catalog.tracking import MetricRecord

CATALOG_TABLES = {"grid", "grid_version", "cell", "stage", "cell_stage", "stage_edge", "metric",
                  "artifact", "attempt", "eval_meta", "table_build"}


def _count(store: CatalogStore, table: str, where: str = "", **params: object) -> int:
    sql = f"SELECT count(*) FROM {table}" + (f" WHERE {where}" if where else "")
    with store.engine.connect() as conn:
        return conn.execute(sa.text(sql), params).scalar_one()


def _running_stage(store: CatalogStore, label: str = "s") -> str:
    gid = store.upsert_grid(name="g", grid_hash="gh", yaml_submitted="a: 1", yaml_resolved="a: 1")
    cid = cell(store, gid, {"pe": "rope", "seed": 0})
    sh = add_stage(store, cid, label)
    assert store.transition(sh, "READY", expected={"PLANNED"})
    assert store.claim(sh, "owner-1")
    return sh


def _records(k: int = 5) -> list[MetricRecord]:
    return [MetricRecord(name="ppl", value=10.0 + i, unit="ppl", context_len=1024 * (i + 1), n=100)
            for i in range(k)] + [MetricRecord(name="acc", value=0.5, task="blimp", split="test")]


def test_migrations_upgrade_downgrade_match_models(catalog_url: str) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    store = CatalogStore(catalog_url)
    assert store.revision() is None
    store.upgrade()
    assert store.revision() == db.head_revision() == "0003"
    assert CATALOG_TABLES <= set(sa.inspect(store.engine).get_table_names())
    with store.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}),
                                Base.metadata)
    assert diff == [], f"migration head and schema.py differ: {diff}"
    db.downgrade(store.engine, "0001")
    assert "grid_version" not in {c["name"] for c in sa.inspect(store.engine).get_columns("cell_stage")}
    db.downgrade(store.engine, "base")
    assert set(sa.inspect(store.engine).get_table_names()) & CATALOG_TABLES == set()
    store.upgrade()  # and back up from empty
    assert store.revision() == "0003"
    store.dispose()


def test_upserts_are_idempotent(store: CatalogStore) -> None:
    g1 = store.upsert_grid(name="g", grid_hash="h1", yaml_submitted="x: 1", yaml_resolved="x: 1\ny: 2")
    assert store.upsert_grid(name="g", grid_hash="h1", yaml_submitted="x: 1", yaml_resolved="x") == g1
    assert store.upsert_grid(name="g", grid_hash="h2", yaml_submitted="x: 2", yaml_resolved="x: 2") == g1
    grid = store.reads.get_grid("g")
    assert grid["grid_hash"] == "h2"
    assert [(v["version"], v["grid_hash"], v["yaml_resolved"]) for v in grid["versions"]] == \
        [(1, "h1", "x: 1\ny: 2"), (2, "h2", "x: 2")]

    c1 = cell(store, g1, {"pe": "rope", "seed": 0})
    assert cell(store, g1, {"pe": "rope", "seed": 0}) == c1
    with pytest.raises(ValueError, match="exists with axes"):
        store.upsert_cell(grid_id=g1, cell_key="pe=rope,seed=0", axes={"pe": "pope", "seed": 0})

    spec = StageSpec(stage_hash=h("pre"), kind="pretrain", config={"lr": 6e-4}, cache_key_parts={"k": 1})
    assert store.upsert_stage(spec) is True
    assert store.upsert_stage(spec) is False
    ev = add_stage(store, c1, "eval")
    for _ in range(2):
        store.link_cell_stage(c1, spec.stage_hash, role="pretrain")
        store.add_edge(spec.stage_hash, ev, "evaluates")
    assert _count(store, "stage") == 2 and _count(store, "cell_stage") == 2
    assert store.reads.edges(ev) == [(spec.stage_hash, ev, "evaluates")]
    assert {s.stage_hash for s in store.stages_for_grid(g1)} == {spec.stage_hash, ev}
    with pytest.raises(ValueError, match="relation"):
        store.add_edge(spec.stage_hash, ev, "feeds")
    with pytest.raises(ValueError, match="state"):
        StageSpec(stage_hash=h("x"), kind="eval", config={}, cache_key_parts={}, state="DONE")


def test_transition_and_claim_are_compare_and_set(store: CatalogStore) -> None:
    gid = store.upsert_grid(name="g", grid_hash="gh", yaml_submitted="", yaml_resolved="")
    sh = add_stage(store, cell(store, gid, {"seed": 0}), "s")
    assert store.claim(sh, "a") is False                      # PLANNED is not claimable
    assert store.transition(sh, "READY", expected={"PLANNED"}) is True
    assert store.transition(sh, "READY", expected={"PLANNED"}) is False
    with pytest.raises(StateError):
        store.transition(sh, "SUCCEEDED", expected={"READY"})

    with ThreadPoolExecutor(8) as pool:                       # 8 controllers race for one stage
        wins = list(pool.map(lambda i: store.claim(sh, f"owner-{i}"), range(8)))
    assert sum(wins) == 1
    row = store.get_stage(sh)
    assert row.state == "RUNNING" and row.attempts == 1 and row.owner == f"owner-{wins.index(True)}"
    assert row.started_at is not None and row.heartbeat_at == row.started_at

    assert store.heartbeat(sh) is True
    assert store.stale_running(3600) == []
    assert [r.stage_hash for r in store.stale_running(0)] == [sh]
    assert store.record_failure(sh, failure_class="oom", message="CUDA out of memory") is True
    assert store.heartbeat(sh) is False
    failed = store.get_stage(sh)
    assert (failed.state, failed.failure_class, failed.message) == ("FAILED", "oom", "CUDA out of memory")
    assert failed.finished_at is not None
    assert store.transition(sh, "READY", expected={"FAILED"})  # retry clears the failure
    assert store.claim(sh, "b")
    again = store.get_stage(sh)
    assert (again.attempts, again.failure_class, again.finished_at) == (2, None, None)


def test_claim_ready_batches_and_skips_claimed(store: CatalogStore) -> None:
    gid = store.upsert_grid(name="g", grid_hash="gh", yaml_submitted="", yaml_resolved="")
    cid = cell(store, gid, {"seed": 0})
    hashes = [add_stage(store, cid, f"s{i}", kind="eval" if i % 2 else "pretrain") for i in range(5)]
    for sh in hashes:
        store.transition(sh, "READY", expected={"PLANNED"})
    first = store.claim_ready("c1", limit=2, kinds=["eval"])
    assert [r.kind for r in first] == ["eval", "eval"] and all(r.state == "RUNNING" for r in first)
    rest = store.claim_ready("c2", limit=10, grid_id=gid)
    assert {r.stage_hash for r in rest} == set(hashes) - {r.stage_hash for r in first}
    assert store.claim_ready("c3", limit=10) == []


def test_finalize_is_idempotent_and_records_everything(store: CatalogStore) -> None:
    sh = _running_stage(store)
    art = ArtifactSpec(name="checkpoint", uri="file:///runs/x/ckpt", sha256="ab" * 32, bytes=1234,
                       kind="checkpoint")
    env = {"git_sha": "1" * 40, "dirty_diff_hash": None, "device": "cpu", "world_size": 2,
           "seeds": [0, 1], "attn_backend": {"layer0": "sdpa", "layer1": "sdpa"},
           "packages": {"torch": "2.13.0"}}
    for _ in range(3):  # a retried report
        store.finalize_success(sh, metrics=_records(), artifacts=[art], env=env, backend="sdpa",
                               mlflow_run_id="run123", gpu_seconds=7.5,
                               eval_meta={"blimp": {"version": "1.0", "config": {"num_fewshot": 0}}})
    assert _count(store, "metric") == 6 and _count(store, "artifact") == 1
    assert _count(store, "attempt") == 1 and _count(store, "eval_meta") == 1
    row = store.get_stage(sh)
    assert (row.state, row.backend, row.mlflow_run_id, row.gpu_seconds) == \
        ("SUCCEEDED", "sdpa", "run123", 7.5)
    assert sorted(m.value for m in store.reads.metrics_for_stage(sh)) == [0.5, 10.0, 11.0, 12.0, 13.0, 14.0]
    assert store.reads.artifacts_for_stage(sh) == [art]
    attempt = store.reads.attempts_for_stage(sh)[0]
    assert (attempt["attempt_no"], attempt["world_size"], attempt["attn_backend"], attempt["seeds"]) == \
        (1, 2, "sdpa", [0, 1])
    # A later report with a corrected value updates in place, it does not add a row.
    store.finalize_success(sh, metrics=[MetricRecord(name="acc", value=0.75, task="blimp", split="test")],
                           artifacts=[], env=env, backend=None, mlflow_run_id=None)
    accs = [m for m in store.reads.metrics_for_stage(sh) if m.name == "acc"]
    assert [a.value for a in accs] == [0.75] and store.get_stage(sh).mlflow_run_id == "run123"


def test_finalize_rejects_bad_input_and_states(store: CatalogStore) -> None:
    sh = _running_stage(store)
    with pytest.raises(ValueError, match="NaN"):
        store.finalize_success(sh, metrics=[MetricRecord(name="ppl", value=math.nan)], artifacts=[],
                               env={}, backend=None, mlflow_run_id=None)
    with pytest.raises(ValueError, match="sha256"):
        ArtifactSpec(name="c", uri="file:///c", sha256="xyz", bytes=1, kind="checkpoint")
    with pytest.raises(KeyError):
        store.finalize_success(h("missing"), metrics=[], artifacts=[], env={}, backend=None,
                               mlflow_run_id=None)
    assert store.transition(sh, "CANCELLED", expected={"RUNNING"})
    with pytest.raises(StateError, match="CANCELLED"):
        store.finalize_success(sh, metrics=[], artifacts=[], env={}, backend=None, mlflow_run_id=None)
    # inf is a legitimate (diverged) perplexity and must survive the round trip.
    sh2 = add_stage(store, 1, "inf")
    run_stage(store, sh2, [MetricRecord(name="ppl", value=math.inf, context_len=65536)])
    assert store.reads.metrics_for_stage(sh2)[0].value == math.inf


def test_failure_mid_finalize_commits_nothing(store: CatalogStore) -> None:
    sh = _running_stage(store)

    def fail_on_artifact(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("INSERT INTO ARTIFACT"):
            raise RuntimeError("storage went away while committing the done record")

    sa.event.listen(store.engine, "before_cursor_execute", fail_on_artifact)
    try:
        with pytest.raises(RuntimeError, match="storage went away"):
            store.finalize_success(
                sh, metrics=_records(), env={}, backend="sdpa", mlflow_run_id=None,
                artifacts=[ArtifactSpec(name="c", uri="file:///c", sha256="0" * 64, bytes=1, kind="ckpt")])
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", fail_on_artifact)
    assert store.get_stage(sh).state == "RUNNING"
    assert _count(store, "metric") == 0 and _count(store, "artifact") == 0
    # the claim's attempt row stays as the claim wrote it: no fingerprint from the rolled-back finalize
    assert [(r["attempt_no"], r["env"], r["git_sha"]) for r in store.reads.attempts_for_stage(sh)] == [(1, {}, None)]


def test_concurrent_finalize_from_8_threads(store: CatalogStore) -> None:
    shared = _running_stage(store, "shared")
    own = [add_stage(store, 1, f"own{i}") for i in range(8)]
    for sh in own:
        store.transition(sh, "READY", expected={"PLANNED"})
        store.claim(sh, "c")
    barrier = threading.Barrier(8)

    def report(i: int) -> None:
        barrier.wait()
        for sh in (shared, own[i]):
            store.finalize_success(sh, metrics=_records(), artifacts=[], env={"worker": i},
                                   backend="sdpa", mlflow_run_id=None)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(report, range(8)))
    assert _count(store, "metric") == 9 * 6
    assert _count(store, "metric", "stage_hash = :s", s=shared) == 6
    assert _count(store, "attempt") == 9
    assert all(store.get_stage(sh).state == "SUCCEEDED" for sh in [shared, *own])


def _process_report(url: str, shared: str, own: str, seed: int) -> None:
    store = CatalogStore(url)
    for sh in (shared, own, shared):  # the shared report arrives twice from every process
        store.finalize_success(sh, metrics=_records(), artifacts=[], env={"seed": seed},
                               backend="sdpa", mlflow_run_id=None)
    store.dispose()


@pytest.mark.slow
def test_concurrent_finalize_from_8_processes(store: CatalogStore) -> None:
    shared = _running_stage(store, "shared")
    own = [add_stage(store, 1, f"p{i}") for i in range(8)]
    for sh in own:
        store.transition(sh, "READY", expected={"PLANNED"})
        store.claim(sh, "c")
    store.engine.dispose()  # no pooled connection crosses the fork
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_process_report, args=(store.url, shared, own[i], i)) for i in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * 8
    assert _count(store, "metric") == 9 * 6
    assert _count(store, "metric", "stage_hash = :s", s=shared) == 6
    assert all(store.get_stage(sh).state == "SUCCEEDED" for sh in [shared, *own])


def test_metrics_frame_joins_cell_axes(store: CatalogStore) -> None:
    gid = store.upsert_grid(name="ii", grid_hash="gh", yaml_submitted="", yaml_resolved="")
    other = store.upsert_grid(name="other", grid_hash="gh2", yaml_submitted="", yaml_resolved="")
    c_rope = cell(store, gid, {"pe": "rope", "seed": 0})
    c_pope = cell(store, gid, {"pe": "pope", "seed": 0})
    shared = add_stage(store, c_rope, "dataset", kind="dataset")
    store.link_cell_stage(c_pope, shared, role="dataset")
    ev_r, ev_p = add_stage(store, c_rope, "ev-r"), add_stage(store, c_pope, "ev-p")
    pending = add_stage(store, cell(store, other, {"pe": "tapa"}), "pending")
    run_stage(store, shared, [MetricRecord(name="tokens", value=1e6)])
    run_stage(store, ev_r, [MetricRecord(name="acc", value=0.11, task="ii", split="test")])
    run_stage(store, ev_p, [MetricRecord(name="acc", value=0.94, task="ii", split="test")])
    store.transition(pending, "READY", expected={"PLANNED"})

    rows = store.reads.metrics_frame(grid="ii")
    got = sorted((r["axes"]["pe"], r["stage_kind"], r["name"], r["value"]) for r in rows)
    assert got == [("pope", "dataset", "tokens", 1e6), ("pope", "eval", "acc", 0.94),
                   ("rope", "dataset", "tokens", 1e6), ("rope", "eval", "acc", 0.11)]
    assert {r["grid"] for r in rows} == {"ii"} and all(r["state"] == "SUCCEEDED" for r in rows)
    assert store.reads.metrics_frame(grid="other") == []
    assert len(store.reads.metrics_frame()) == 4


def test_resubmitted_grid_shows_only_its_current_version(store: CatalogStore) -> None:
    gid = store.upsert_grid(name="g", grid_hash="v1", yaml_submitted="", yaml_resolved="")
    cid = cell(store, gid, {"pe": "rope", "seed": 0})
    old = add_stage(store, cid, "ppl-old", role="ppl")
    shared = add_stage(store, cid, "dataset", kind="dataset")
    run_stage(store, old, [MetricRecord(name="ppl", value=9.0, context_len=64)])
    run_stage(store, shared, [MetricRecord(name="tokens", value=100.0)])
    store.upsert_grid(name="g", grid_hash="v2", yaml_submitted="", yaml_resolved="")  # code changed
    new = add_stage(store, cid, "ppl-new", role="ppl")
    store.link_cell_stage(cid, shared, role="dataset")                                  # unchanged stage
    run_stage(store, new, [MetricRecord(name="ppl", value=8.0, context_len=64)])

    def seen(**kw: object) -> list[tuple[str, float, int]]:
        return sorted((r["role"], r["value"], r["grid_version"]) for r in store.reads.metrics_frame(grid="g", **kw))

    assert seen() == [("dataset", 100.0, 2), ("ppl", 8.0, 2)]
    assert seen(current_only=False) == [("dataset", 100.0, 2), ("ppl", 8.0, 2), ("ppl", 9.0, 1)]
    assert {s.stage_hash for s in store.stages_for_grid(gid, current_only=True)} == {new, shared}
    store.upsert_grid(name="g", grid_hash="v1", yaml_submitted="", yaml_resolved="")  # back to v1
    store.link_cell_stage(cid, old, role="ppl")
    store.link_cell_stage(cid, shared, role="dataset")
    assert seen() == [("dataset", 100.0, 1), ("ppl", 9.0, 1)]


def test_default_url_and_validation(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(db.CATALOG_URL_ENV, raising=False)
    assert db.default_url(tmp_path) == f"sqlite:///{tmp_path.resolve()}/.phaselab/catalog.db"
    monkeypatch.setenv(db.CATALOG_URL_ENV, "postgresql://u@h/db")
    assert db.default_url(tmp_path) == "postgresql://u@h/db"
    assert db.normalize_url("postgresql://u@h/db").startswith("postgresql+psycopg://")
    with pytest.raises(ValueError, match="mysql"):
        db.normalize_url("mysql://u@h/db")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(db.CATALOG_URL_ENV)
    s = CatalogStore()
    s.upgrade()
    assert (tmp_path / ".phaselab" / "catalog.db").exists()
    with s.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == db.SQLITE_BUSY_TIMEOUT_MS
    s.dispose()


def test_import_catalog_does_not_import_torch_or_mlflow() -> None:
    import subprocess
    import sys

    code = ("import sys, phaselab.catalog, phaselab.catalog.store.api, phaselab.catalog.tracking.mlflow_tracker, "
            "phaselab.catalog.reports.export, phaselab.catalog.reports.tables, phaselab.catalog.tracking.lineage, "
            "phaselab.catalog.reports.figures, phaselab.catalog.store.fingerprint, phaselab.catalog.tracking.mlflow_server; "
            "bad = [m for m in ('torch', 'triton', 'mlflow', 'pyarrow', 'matplotlib') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
