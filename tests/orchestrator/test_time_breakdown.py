"""Where a grid's time went: the per-stage breakdown and the grid's GPU efficiency in ``status``
(table, ``--times`` at 80 and 160 columns, ``--json``), and ``plan``'s time estimates from what
earlier stages recorded, on a real SQLite catalog written through the controller's own calls."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import update
from typer.testing import CliRunner

from phaselab.catalog.store.api import CatalogStore
from phaselab.catalog.store.schema import Stage
from phaselab.catalog.tracking import MetricRecord
from phaselab.orchestrator.cli import timing
from phaselab.orchestrator.cli.main import app
from phaselab.orchestrator.engine.controller import Controller
from phaselab.orchestrator.plan.dag import build_dag, load_grid

GRID = """\
grid: timed
seeds: [0]
axes: {product: {pe: [rope, pope]}}
defaults:
  model: {preset: tiny, block_size: 16, pe: {kind: "${pe}"}}
  data: {kind: text, block_size: 16}
  train: {steps: 100, batch_size: 8, device: cpu}
  resources: {cpus: 1, memory_gb: 1}
stages:
  pretrain: {kind: pretrain}
  ppl:
    kind: eval
    needs: [pretrain]
    eval: {suite: ppl-by-length, ppl: {lengths: [16, 32]}, device: cpu}
"""
# (wall, setup, train, eval, ckpt, other) of each pretrain; evals take 5 s and record no breakdown
PRE = {"rope": (30.0, 2.0, 20.0, 1.5, 0.5, 1.0), "pope": (50.0, 3.0, 40.0, 2.0, 1.0, 2.0)}
EVAL_S = 5.0


def test_stage_times_and_efficiency_arithmetic() -> None:
    m = {"time/setup_s": 2.0, "time/train_s": 20.0, "time/eval_s": 1.5, "time/ckpt_s": 0.5, "time/other_s": 1.0}
    t = timing.stage_times(30.0, m)
    assert t == {"wall": 30.0, "startup": 5.0, "setup": 2.0, "train": 20.0, "eval": 1.5, "ckpt": 0.5, "other": 1.0}
    assert timing.stage_times(20.0, {**m, "time/train_s": 25.0})["startup"] == 0.0   # never below 0
    assert timing.stage_times(None, m) is None and timing.stage_times(30.0, {"train/loss": 1.0}) is None
    assert timing.breakdown_text(t) == "start 5.0 · setup 2.0 · train 20.0 · eval 1.5 · ckpt 0.5 · other 1.0 s"
    stages = [{"state": "SUCCEEDED", "seconds": 30.0, "gpu": True, "times": t},
              {"state": "SUCCEEDED", "seconds": 10.0, "gpu": True, "times": None},      # a GPU eval
              {"state": "SUCCEEDED", "seconds": 60.0, "gpu": False, "times": None},     # a CPU dataset
              {"state": "RUNNING", "seconds": 99.0, "gpu": True, "times": None}]
    eff = timing.efficiency(stages)
    assert eff == {"value": 0.5, "train_s": 20.0, "wall_s": 40.0, "stages": 2, "scope": "gpu"}
    assert timing.efficiency_line(eff) == ("GPU efficiency 50% (training steps 20.0 s of 40.0 s stage time, "
                                           "2 GPU stage(s))")
    cpu = timing.efficiency([{**s, "gpu": False} for s in stages])
    assert cpu["scope"] == "all" and cpu["value"] == pytest.approx(20.0 / 100.0)
    assert timing.efficiency([]) is None


def _dag(tmp_path: Path, overrides: tuple[str, ...] = ()):
    path = tmp_path / "grid.yaml"
    path.write_text(GRID)
    spec, marks, sub, res = load_grid(path, list(overrides))
    return build_dag(spec, marks, yaml_submitted=sub, yaml_resolved=res)


@pytest.fixture
def catalog(tmp_path: Path) -> str:
    """The grid submitted and every stage finished as a run would finish it (claim, then
    finalize_success with the loop's time metrics), its wall time set to the PRE / EVAL_S seconds."""
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    store = CatalogStore(url)
    store.upgrade()
    dag = _dag(tmp_path)
    controller = Controller(store, dag, runs_root=tmp_path / "runs")
    controller.submit()
    start = datetime(2026, 1, 1, tzinfo=UTC)
    for h, node in dag.nodes.items():
        controller.pending()
        assert store.claim(h, controller.owner)
        pe = node.config.get("model", {}).get("pe", {}).get("kind") or node.members[0][0].split(",")[0][3:]
        wall, *phases = PRE[pe] if node.kind == "pretrain" else (EVAL_S,)
        metrics = [MetricRecord(name=f"time/{p}_s", value=v) for p, v in zip(timing.PHASES, phases, strict=False)]
        store.finalize_success(h, metrics=metrics, artifacts=[], env={}, backend=None, mlflow_run_id=None,
                               gpu_seconds=None)
        with store.engine.begin() as conn:
            conn.execute(update(Stage).where(Stage.stage_hash == h).values(
                started_at=start, finished_at=start + timedelta(seconds=wall)))
    store.dispose()
    return url


def test_status_json_and_tables(catalog: str, tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["status", "timed", "--catalog", catalog, "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    pre = {s["axes"]["pe"]: s["times"] for s in out["stages"] if s["kind"] == "pretrain"}
    assert pre["rope"] == pytest.approx({"wall": 30.0, "startup": 5.0, "setup": 2.0, "train": 20.0, "eval": 1.5,
                                         "ckpt": 0.5, "other": 1.0})
    assert pre["pope"]["startup"] == pytest.approx(2.0)
    assert all(s["times"] is None for s in out["stages"] if s["kind"] == "eval")
    assert out["efficiency"] == pytest.approx({"value": 60.0 / 90.0, "train_s": 60.0, "wall_s": 90.0, "stages": 4,
                                               "scope": "all"})
    for width in (80, 160):
        res = CliRunner().invoke(app, ["status", "timed", "--catalog", catalog, "--times"], env={"COLUMNS": str(width)})
        lines = res.output.rstrip().splitlines()
        assert res.exit_code == 0 and max(len(line) for line in lines) <= width, res.output
        assert "…" not in res.output
        rope = next(line.split() for line in lines if line.split()[:2] == ["pretrain", "rope"])
        assert rope[2:] == ["30.0", "5.0", "2.0", "20.0", "1.5", "0.5", "1.0", "67%"]
        assert "training steps 67% of 90.0 s stage time (4 stage(s), no GPU)" in " ".join(res.output.split())
    res = CliRunner().invoke(app, ["status", "timed", "--catalog", catalog], env={"COLUMNS": "80"})
    assert "train%" in res.output and "80%" in res.output and "67%" in res.output


def test_plan_estimates_from_recorded_stages(catalog: str, tmp_path: Path) -> None:
    env = {"PHASELAB_HOME": str(tmp_path), "COLUMNS": "200"}
    res = CliRunner().invoke(app, ["plan", str(tmp_path / "grid.yaml"), "seeds=[0,1]", "train.steps=200",
                                   "--catalog", catalog, "--json"], env=env)
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    est = {(s["kind"], s["cells"][0]): s["seconds_est"] for s in out["stages"]}
    # train.steps changed, so all are new stages: seconds per token x twice the tokens + the rest
    assert est[("pretrain", "pe=rope,seed=1")] == pytest.approx(2 * 20.0 + (30.0 - 20.0))
    assert est[("pretrain", "pe=pope,seed=0")] == pytest.approx(2 * 40.0 + (50.0 - 40.0))
    assert est[("eval", "pe=rope,seed=1")] == pytest.approx(EVAL_S)    # same eval config and model
    t = out["time_estimate"]
    assert t["sequential_s"] == pytest.approx(2 * 50.0 + 2 * 90.0 + 4 * EVAL_S) and t["unknown"] == 0
    assert t["recorded_from"] == 4
    assert t["packed_s"] is not None and t["packed_s"] < t["sequential_s"]
    res = CliRunner().invoke(app, ["plan", str(tmp_path / "grid.yaml"), "model.d_model=64", "--catalog", catalog],
                             env=env)
    assert "time to run: unknown (this catalog has recorded no stage of the same kind and model" in \
        " ".join(res.output.split())


def test_packed_seconds_follows_dependencies_and_capacity(tmp_path: Path) -> None:
    dag = _dag(tmp_path)
    est = {h: (10.0 if n.kind == "pretrain" else 2.0) for h, n in dag.nodes.items()}
    # one CPU: everything in a row; two: the two pretrains side by side, then their evals
    assert timing.packed_seconds(dag.nodes, est, {"CPU": 1.0}) == pytest.approx(24.0)
    assert timing.packed_seconds(dag.nodes, est, {"CPU": 2.0}) == pytest.approx(12.0)
    assert timing.packed_seconds(dag.nodes, est, {"CPU": 0.5}) == pytest.approx(24.0)   # never fits: alone


def test_dashboard_on_a_cached_grid_says_why_there_is_no_url(catalog: str, tmp_path: Path) -> None:
    from phaselab.orchestrator.engine.ray_local import DashboardUnavailable, require_dashboard

    try:
        require_dashboard()
    except DashboardUnavailable as err:
        pytest.skip(f"no Ray dashboard here: {err}")
    res = CliRunner().invoke(app, ["run", str(tmp_path / "grid.yaml"), "--dashboard", "--no-mlflow",
                                   "--catalog", catalog, "--runs-root", str(tmp_path / "runs")],
                             env={"COLUMNS": "200", "PHASELAB_HOME": str(tmp_path)})
    text = " ".join(res.output.split())
    assert res.exit_code == 0, res.output
    assert ("dashboard: every stage is cached, so no Ray cluster was started and there is no dashboard to open"
            in text)
    assert "launched 0 stage(s)" in text and "GPU efficiency" not in text and "training steps" not in text
