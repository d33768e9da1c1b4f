"""Failure class ``hung``: a stage whose worker stopped heartbeating is force-cancelled by the
controller and retried with a small budget (``failures.POLICIES["hung"]``), not a preemption's 100.

The policy arithmetic directly; then the controller's own decision (``Controller._fail`` with the
outcome ``_watch`` builds) on a real SQLite catalog, attempt after attempt, until the stage is
FAILED(hung) with advice; then the CLI's ``retry --class hung`` and ``status`` views of it. The
path through a frozen Ray worker is ``test_worker_heartbeat.py``'s Ray test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from phaselab.orchestrator.cli.main import app
from phaselab.orchestrator.engine.controller import Controller
from phaselab.orchestrator.engine.failures import (
    CLASSES,
    POLICIES,
    classify,
    policy_of,
    retry_limit,
    should_retry,
)
from phaselab.orchestrator.plan.dag import build_dag, load_grid

GRID = """\
grid: hangs
axes: {}
stages:
  nap: {kind: noop, noop: {sleep_s: 0.0, tag: hangs}, resources: {cpus: 1, memory_gb: 0.25}, max_retries: 5}
"""
WIDE = {"COLUMNS": "200"}   # rich wraps table cells to the terminal width
HUNG = {"ok": False, "failure_class": "hung", "message": "no heartbeat from the stage's worker for 60 s"}


def test_hung_has_a_small_budget_of_its_own() -> None:
    assert "hung" in CLASSES and "preemption" in CLASSES
    hung = POLICIES["hung"]
    assert hung.retry and hung.max_retries == 2 and not hung.fail_fast and "heartbeat" in hung.advice
    assert policy_of("hung") is hung and policy_of("no-such-class") is POLICIES["code"]
    assert retry_limit("hung", 5) == 2                  # its own budget, not the stage's
    assert retry_limit("preemption", 5) == 100
    assert retry_limit("nccl", 5) == 5 and retry_limit("storage", 1) == 1   # the stage's max_retries
    assert retry_limit("oom", 5) is None and retry_limit("code", 5) is None
    assert [should_retry("hung", attempts=a, stage_max_retries=5) for a in (1, 2, 3, 4)] == [True, True, False, False]
    assert [should_retry("preemption", attempts=a, stage_max_retries=5) for a in (3, 100, 101)] == [True, True, False]
    assert not should_retry("config", attempts=1, stage_max_retries=5)


def test_no_exception_classifies_as_hung() -> None:
    """Only the controller says ``hung`` (a silent worker raises nothing)."""
    import ray.exceptions as rex

    for exc in (TimeoutError("timed out"), rex.WorkerCrashedError(), RuntimeError("hung")):
        assert classify(exc) != "hung"


def _setup(tmp_path: Path):
    from phaselab.catalog.store.api import CatalogStore

    path = tmp_path / "grid.yaml"
    path.write_text(GRID)
    spec, marks, text, resolved = load_grid(path, [])
    dag = build_dag(spec, marks, yaml_submitted=text, yaml_resolved=resolved)
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    store = CatalogStore(url)
    store.upgrade()
    events: list[tuple[str, str]] = []
    controller = Controller(store, dag, runs_root=tmp_path / "runs",
                            on_event=lambda kind, node, detail: events.append((kind, detail)))
    controller.submit()
    (h,) = dag.nodes
    assert controller.pending() and store.get_stage(h).state == "READY"
    return store, controller, h, events, url


def test_the_controller_retries_a_hung_stage_twice_then_fails_it(tmp_path: Path) -> None:
    store, controller, h, events, _ = _setup(tmp_path)
    for attempt in (1, 2):
        assert store.claim(h, controller.owner)
        controller._fail(h, HUNG)
        row = store.get_stage(h)
        assert (row.state, row.failure_class, row.attempts) == ("READY", "hung", attempt)
        assert row.message.startswith("retrying after hung: no heartbeat")
        assert events[-1][0] == "retrying" and events[-1][1].startswith("hung:")
    assert store.claim(h, controller.owner)
    controller._fail(h, HUNG)
    row = store.get_stage(h)
    assert (row.state, row.failure_class, row.attempts) == ("FAILED", "hung", 3)   # max_retries: 5 does not apply
    assert "advice:" in row.message and POLICIES["hung"].advice in row.message
    assert events[-1][0] == "failed"
    # the same third attempt ending in a preemption would still be retried
    assert store.transition(h, "READY", expected={"FAILED"}) and store.claim(h, controller.owner)
    controller._fail(h, {"ok": False, "failure_class": "preemption", "message": "node died"})
    assert (store.get_stage(h).state, store.get_stage(h).failure_class) == ("READY", "preemption")


def test_status_shows_hung_and_retry_takes_the_class(tmp_path: Path) -> None:
    store, controller, h, _, url = _setup(tmp_path)
    assert store.claim(h, controller.owner)
    controller._fail(h, HUNG)
    res = CliRunner().invoke(app, ["status", "hangs", "--catalog", url], env=WIDE)
    assert res.exit_code == 0 and "READY(hung)" in res.output     # waiting for its retry
    for _ in (2, 3):
        assert store.claim(h, controller.owner)
        controller._fail(h, HUNG)
    res = CliRunner().invoke(app, ["status", "hangs", "--catalog", url, "--json"])
    (stage,) = json.loads(res.output)["stages"]
    assert (stage["state"], stage["failure_class"], stage["attempts"]) == ("FAILED", "hung", 3)
    assert "FAILED(hung)" in CliRunner().invoke(app, ["status", "hangs", "--catalog", url], env=WIDE).output
    res = CliRunner().invoke(app, ["retry", "hangs", "--failed", "--class", "preemption", "--catalog", url, "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["requeued"] == []
    res = CliRunner().invoke(app, ["retry", "hangs", "--failed", "--class", "hung", "--catalog", url, "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["requeued"] == [h]
    assert store.get_stage(h).state == "PLANNED"


@pytest.mark.parametrize("bad", ["hang", "HUNG"])
def test_retry_names_the_classes_it_knows(tmp_path: Path, bad: str) -> None:
    _, _, _, _, url = _setup(tmp_path)
    res = CliRunner().invoke(app, ["retry", "hangs", "--failed", "--class", bad, "--catalog", url, "--json"])
    assert res.exit_code == 1 and f"unknown failure class {bad!r}" in res.output and "hung" in res.output
