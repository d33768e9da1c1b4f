"""Stage heartbeats come from the worker that runs the stage (``runner.WorkerHeartbeat``), and the
controller acts on a worker that stops beating.

In-process: the real ``runner.execute`` on a real payload (``Controller._payload``) of a sleeping
``noop`` stage claimed in a real SQLite catalog; a second thread reads ``heartbeat_at`` while it
runs. On Ray: the stage's worker process is frozen with SIGSTOP (its heartbeat thread with it);
the controller cancels the task and relaunches the stage (failure class ``hung``), which then
succeeds.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import threading
import time
from pathlib import Path

import local_ray
import pytest

from phaselab.orchestrator.engine.controller import Controller
from phaselab.orchestrator.engine.runner import WorkerHeartbeat, execute
from phaselab.orchestrator.plan.dag import build_dag, load_grid

GRID = """\
grid: beats
axes: {}
stages:
  nap: {kind: noop, noop: {sleep_s: SLEEP, tag: beats}, resources: {cpus: 1, memory_gb: 0.25}}
"""


def _setup(tmp_path: Path, sleep_s: float, **kw):
    from phaselab.catalog.store.api import CatalogStore

    path = tmp_path / "grid.yaml"
    path.write_text(GRID.replace("SLEEP", str(sleep_s)))
    spec, marks, text, resolved = load_grid(path, [])
    dag = build_dag(spec, marks, yaml_submitted=text, yaml_resolved=resolved)
    store = CatalogStore(f"sqlite:///{tmp_path / 'catalog.db'}")
    store.upgrade()
    controller = Controller(store, dag, runs_root=tmp_path / "runs", **kw)
    controller.submit()
    (h, node), = dag.nodes.items()
    return store, controller, h, node


def _claimed_payload(store, controller, h, node) -> dict:
    assert controller.pending() and store.claim(h, controller.owner)
    return controller._payload(node, controller._rows()) | {"attempt": store.get_stage(h).attempts}


def _hb_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("phaselab-heartbeat-")]


def test_the_worker_beats_while_the_stage_runs_and_stops_after(tmp_path: Path) -> None:
    store, controller, h, node = _setup(tmp_path, 1.5, heartbeat_s=0.2)
    payload = _claimed_payload(store, controller, h, node)
    assert payload["heartbeat_s"] == 0.2 and payload["catalog_url"] == store.url
    claimed = store.get_stage(h).heartbeat_at
    seen, running = [], threading.Event()
    running.set()

    def watch() -> None:
        while running.is_set():
            seen.append(store.get_stage(h).heartbeat_at)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        out = execute(payload)
    finally:
        running.clear()
        watcher.join()
    assert out["ok"], out
    ended = store.get_stage(h).heartbeat_at
    beats = sorted(set(seen) - {claimed})
    assert len(beats) >= 4, beats               # 1.5 s of stage at 0.2 s per beat
    assert all(b > claimed for b in beats)
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(beats)]
    assert max(gaps) < 1.0, gaps                # the beats kept coming during the whole stage
    assert not _hb_threads()                    # stopped in execute's finally
    time.sleep(0.6)
    assert store.get_stage(h).heartbeat_at == ended


def test_the_heartbeat_stops_when_the_stage_is_cancelled_or_relaunched(tmp_path: Path) -> None:
    store, controller, h, node = _setup(tmp_path, 0.0, heartbeat_s=0.1)
    payload = _claimed_payload(store, controller, h, node)
    with WorkerHeartbeat(payload["catalog_url"], h, interval_s=0.1, attempt=payload["attempt"]) as hb:
        deadline = time.monotonic() + 10
        while hb.beats < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert hb.beats >= 2
        assert store.transition(h, "CANCELLED", expected={"RUNNING"}, failure_class="cancelled", message="cli")
        hb._thread.join(timeout=5)
        assert not hb._thread.is_alive()
    # a frozen worker of attempt 1 that wakes after attempt 2 was claimed stays silent
    assert store.transition(h, "READY", expected={"CANCELLED"}) and store.claim(h, controller.owner)
    second = store.get_stage(h)
    assert second.attempts == payload["attempt"] + 1
    with WorkerHeartbeat(payload["catalog_url"], h, interval_s=0.1, attempt=payload["attempt"]) as stale:
        stale._thread.join(timeout=5)
        assert stale.beats == 0
    assert store.get_stage(h).heartbeat_at == second.heartbeat_at
    with pytest.raises(ValueError, match="stale_after_s"):
        Controller(store, controller.dag, heartbeat_s=5.0, stale_after_s=5.0)


@pytest.mark.ray
def test_a_frozen_worker_is_found_by_its_silence_and_its_stage_relaunched(tmp_path: Path) -> None:
    events: list[tuple[str, str]] = []
    # 10 s of stage: the window in which this test must see the first beat and freeze the worker;
    # on a loaded 2-core machine the test's polling can lag the worker by seconds
    store, controller, h, _ = _setup(tmp_path, 10.0, heartbeat_s=0.25, stale_after_s=2.0,
                                     on_event=lambda kind, node, detail: events.append((kind, detail)))
    local_ray.shared()
    frozen = None
    try:
        result: dict = {}
        thread = threading.Thread(target=lambda: result.update(summary=controller.run(timeout_s=120)))
        thread.start()
        running = tmp_path / "runs" / h / "running.json"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            row = store.get_stage(h)
            if running.is_file() and row.heartbeat_at != row.started_at:   # the worker has beaten
                break
            time.sleep(0.05)
        frozen = json.loads(running.read_text())["pid"]
        os.kill(frozen, signal.SIGSTOP)
        row = store.get_stage(h)
        assert (row.state, row.attempts) == ("RUNNING", 1), "the stage ended before its worker was frozen"
        thread.join(timeout=120)
        assert not thread.is_alive()
        summary = result["summary"]
        assert summary.ok, summary.failed
        row = store.get_stage(h)
        assert (row.state, row.attempts) == ("SUCCEEDED", 2)
        retries = [detail for kind, detail in events if kind == "retrying"]
        assert len(retries) == 1 and retries[0].startswith("hung: no heartbeat"), events   # not a preemption
        assert json.loads(running.read_text())["pid"] != frozen
        attempts = [json.loads(line) for line in (tmp_path / "runs" / h / "attempts.jsonl").read_text().splitlines()]
        assert [a["outcome"] for a in attempts] == ["succeeded"] and attempts[0]["attempt"] == 2
    finally:
        if frozen is not None:
            try:
                os.kill(frozen, signal.SIGKILL)   # the Ray worker we froze, by its pid
            except ProcessLookupError:
                pass
