"""Live progress: the training loop's progress file, the live table of `phaselab run`, `status`
with axis values, step progress and failure reasons, the failure summary and exit code of
`run`, and the notification hooks (a shell command and a webhook, both real)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import ClassVar

import local_ray
import pytest
from _orchestrator_grids import BASE
from typer.testing import CliRunner

from phaselab.catalog.store.api import CatalogStore
from phaselab.catalog.tracking.run_folder import steps_path
from phaselab.orchestrator.cli.main import app
from phaselab.orchestrator.engine.controller import Controller
from phaselab.orchestrator.engine.notify import Notifier
from phaselab.orchestrator.engine.progress import RunView, read_progress
from phaselab.orchestrator.plan.dag import plan_grid

TRAIN = {"model": {"preset": "tiny", "block_size": 16}, "data": {"kind": "text", "block_size": 16},
         "train": {"steps": 5, "batch_size": 2, "warmup": 0, "eval_every": 0, "final_eval_batches": 1,
                   "ckpt_every": 5, "log_every": 2, "device": "cpu"}}


def test_the_training_loop_reports_its_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from phaselab.catalog.tracking import FanoutTracker, RecordingTracker
    from phaselab.orchestrator.stages.base import normalize_model
    from phaselab.workloads.train.api import run_training
    from phaselab.workloads.train.ray_entry import JsonlTracker

    tracker = RecordingTracker()   # the stage's own tracker beside the per-step log, as pretrain runs it
    run_training({**TRAIN, "model": normalize_model(TRAIN["model"])}, out_dir=tmp_path / "run",
                 tracker=FanoutTracker(tracker, JsonlTracker(steps_path(tmp_path))))
    logged = [(s, m) for s, m in tracker.metrics if "train/loss" in m]
    assert [s for s, _ in logged] == [2, 4, 5]             # log_every 2, and the last step
    p = read_progress(tmp_path, 5)
    assert (p["step"], p["steps"], p["eta_s"]) == (5, 5, 0.0)
    assert p["loss"] == logged[-1][1]["train/loss"]
    assert p["tokens_per_s"] == logged[-1][1]["train/tokens_per_s"] > 0
    assert 0.0 <= p["age_s"] < 60.0


def test_a_ray_train_run_is_read_from_its_metrics_file(tmp_path: Path) -> None:
    from phaselab.workloads.train.ray_entry import JsonlTracker

    jsonl = JsonlTracker(tmp_path / "metrics.jsonl")
    jsonl.log_metrics({"train/loss": 3.0, "train/steps_per_s": 2.0, "train/tokens_per_s": 64.0}, step=10)
    jsonl.log_metrics({"valid/loss": 2.9}, step=10)
    jsonl.log_metrics({"train/loss": 2.5, "train/steps_per_s": 4.0, "train/tokens_per_s": 128.0}, step=20)
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 30, "train/lo')                  # a torn line of a writer killed now
    p = read_progress(tmp_path, 100)
    assert (p["step"], p["steps"], p["loss"], p["tokens_per_s"]) == (20, 100, 2.5, 128.0)
    assert p["eta_s"] == pytest.approx(80 / 4.0)
    assert read_progress(tmp_path / "nothing", 100) is None


def test_the_live_table_shows_running_stages_and_the_grid_bar(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    from phaselab.workloads.train.ray_entry import JsonlTracker

    grid = tmp_path / "g.yaml"
    grid.write_text(BASE)
    dag = plan_grid(grid, ["train.steps=8"])
    console = Console(record=True, width=120, force_terminal=False)
    view = RunView(dag, console, live=False, plain_every_s=3600)
    view.start({h: "PLANNED" for h in dag.nodes}, tmp_path / "runs")
    try:
        pre = [n for n in dag.nodes.values() if n.name == "pretrain"]
        view.event("started", pre[0], "attempt 1")
        view.event("started", pre[1], "attempt 1")
        (tmp_path / "runs" / pre[0].hash).mkdir(parents=True)
        JsonlTracker(steps_path(tmp_path / "runs" / pre[0].hash)).log_metrics(
            {"train/loss": 2.71828, "train/tokens_per_s": 2500.0, "train/steps_per_s": 0.5}, step=3)
        view.event("succeeded", pre[1], "1.0 s")
        console.print(view.renderable())
    finally:
        view.stop()
    text = console.export_text()
    assert "started   pretrain pretrain[pe=rope,seed=0]" in text          # events above the table
    row = next(line for line in text.splitlines() if "│ pretrain" in line)
    cells = [c.strip() for c in row.split("│")[1:-1]]
    assert cells[:6] + cells[7:] == ["pretrain", "rope", "0", "3/8 (38%)", "2.7183", "2.5k", "10s"], row
    # ETA: 5 steps at 0.5 steps/s
    assert "t: 1/4 stages done, 1 running" in text


@pytest.fixture
def ray_local() -> str:
    return local_ray.shared()


class _Hook(BaseHTTPRequestHandler):
    got: ClassVar[list[dict]] = []

    def do_POST(self) -> None:
        _Hook.got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def webhook():
    server = HTTPServer(("127.0.0.1", 0), _Hook)
    _Hook.got = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/hook", _Hook.got
    server.shutdown()


@pytest.mark.ray
def test_run_names_every_failed_stage_exits_1_and_notifies(tmp_path: Path, ray_local, webhook) -> None:
    grid = tmp_path / "g.yaml"
    grid.write_text(BASE)
    url, posted = webhook
    events = tmp_path / "events.jsonl"
    env = {"PHASELAB_NOTIFY_CMD": f'cat >> {events}; echo >> {events}; echo "$PHASELAB_EVENT $PHASELAB_STAGE" '
                                  f'>> {tmp_path / "env.txt"}', "PHASELAB_NOTIFY_URL": url}
    catalog = f"sqlite:///{tmp_path / 'catalog.db'}"
    # perplexity at a length longer than the validation split: both evals fail for good
    res = CliRunner().invoke(app, ["run", str(grid), "ppl.eval.ppl.lengths=[10000000]", "--catalog", catalog,
                                   "--runs-root", str(tmp_path / "runs"), "--no-mlflow"], env=env)
    assert res.exit_code == 1, res.output
    status = json.loads(CliRunner().invoke(app, ["status", "t", "--catalog", catalog, "--json"]).output)
    failed = {s["hash"]: s for s in status["stages"] if s["state"] != "SUCCEEDED"}
    assert len(failed) == 2 and {s["name"] for s in failed.values()} == {"ppl"}
    summary = res.output[res.output.index("2 of 4 stages did not succeed"):]
    for h, s in failed.items():
        assert f"ppl[{s['cells'][0]}] {h[:12]}" in summary
        assert "no document has more than 10000000 tokens" in s["message"]
    got = [json.loads(line) for line in events.read_text().splitlines() if line.strip()]
    assert sorted(e["event"] for e in got) == ["grid_done", "stage_failed", "stage_failed"]
    done = next(e for e in got if e["event"] == "grid_done")
    assert done["ok"] is False and done["counts"] == {"SUCCEEDED": 2, "FAILED": 2}
    assert {f["hash"] for f in done["failures"]} == set(failed)
    assert sorted(ln.strip() for ln in (tmp_path / "env.txt").read_text().splitlines()) == ["grid_done", "stage_failed ppl",
                                                                       "stage_failed ppl"]
    assert sorted(e["event"] for e in posted) == ["grid_done", "stage_failed", "stage_failed"]
    assert all(e["text"].startswith("phaselab t: ") for e in posted)

    # status: axis columns and the reason of each failed stage
    # wide enough for the reason beside the long tmp paths of a pytest-xdist worker
    text = CliRunner().invoke(app, ["status", "t", "--catalog", catalog], env={"COLUMNS": "400"}).output
    line = next(ln for ln in text.splitlines() if "ppl" in ln and "pope" in ln)
    assert "FAILED" in line and "no document has more than 10000000 tokens" in line


def test_status_shows_the_running_stage_step_and_eta(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from phaselab.workloads.train.ray_entry import JsonlTracker

    grid = tmp_path / "g.yaml"
    grid.write_text(BASE)
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    store = CatalogStore(url)
    store.upgrade()
    dag = plan_grid(grid, ["train.steps=40"])
    controller = Controller(store, dag, runs_root=tmp_path / "runs")
    controller.submit()
    h = next(n.hash for n in dag.nodes.values() if n.name == "pretrain" and n.members[0][0] == "pe=pope,seed=0")
    store.transition(h, "READY", expected={"PLANNED"})
    assert store.claim(h, "someone")
    controller.out_dir(h).mkdir(parents=True)

    JsonlTracker(steps_path(controller.out_dir(h))).log_metrics(
        {"train/loss": 3.5, "train/tokens_per_s": 100.0, "train/steps_per_s": 2.0}, step=10)
    out = json.loads(CliRunner().invoke(app, ["status", "t", "--catalog", url, "--json"]).output)
    (row,) = [s for s in out["stages"] if s["hash"] == h]
    assert row["axes"] == {"pe": "pope", "seed": 0} and row["cells"] == ["pe=pope,seed=0"]
    assert (row["progress"]["step"], row["progress"]["steps"], row["progress"]["eta_s"]) == (10, 40, 15.0)
    assert [s["axes"]["pe"] for s in out["stages"]] == ["rope", "rope", "pope", "pope"]   # grouped by cell
    text = CliRunner().invoke(app, ["status", "t", "--catalog", url], env={"COLUMNS": "200"}).output
    line = next(ln for ln in text.splitlines() if "RUNNING" in ln)
    assert "pope" in line and "10/40 (25%)" in line and "3.5000" in line and "15s" in line


def test_a_notification_that_fails_never_fails_the_grid(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(ValueError, match="PHASELAB_NOTIFY_URL must be an http"):
        Notifier("g", url="file:///etc/passwd")
    import socket

    with socket.socket() as s:   # a port nothing listens on

        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    n = Notifier("g", command="exit 3", url=f"http://127.0.0.1:{port}/", timeout_s=2.0)
    n.grid_done(True, {"SUCCEEDED": 1}, [], 1.0)
    n.close()
    err = capsys.readouterr().err
    assert "PHASELAB_NOTIFY_CMD exited 3" in err and "PHASELAB_NOTIFY_URL" in err


def test_status_shows_the_node_column_only_when_stages_ran_on_several_nodes() -> None:
    from rich.console import Console

    from phaselab.orchestrator.cli.views import status_renderable

    def row(name: str, node: str | None) -> dict:
        return {"hash": name * 12, "kind": "pretrain", "name": name, "state": "SUCCEEDED", "failure_class": None,
                "attempts": 1, "seconds": 3.0, "cells": ["pe=rope"], "axes": {"pe": "rope"}, "progress": None,
                "message": None, "node": node}

    def text(rows: list[dict]) -> str:
        console = Console(width=200, record=True)
        console.print(status_renderable("g", rows))
        return console.export_text()

    one = text([row("a", "n" * 40), row("b", "n" * 40)])
    two = text([row("a", "headnode0001xyz"), row("b", "worker000002xyz")])
    assert " node " not in one and "nnnnnnnnnnnn" not in one
    assert " node " in two and "headnode0001" in two and "worker000002" in two
