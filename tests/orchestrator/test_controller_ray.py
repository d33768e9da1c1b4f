"""The controller with REAL tiny stages on a local Ray cluster (2 CPUs, local_ray.shared()):
completion, all-cached re-run, kill -9 of the controller then resume, a killed worker retried
from its checkpoint, and failing stages classified in the catalog."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import local_ray
import pytest

from phaselab.orchestrator.engine.controller import Controller
from phaselab.orchestrator.plan.dag import build_dag, load_grid

pytestmark = pytest.mark.ray

GRID = """\
grid: raytiny
seeds: [0]
axes:
  zip:
    - {pe: [rope, pope], steps: [6, STEPS]}
defaults:
  model: {preset: tiny, block_size: 32, n_layer: 1, n_head: 2, d_model: 32, pe: {kind: "${pe}"}}
  data: {kind: text, block_size: 32}
  train: {steps: "${steps}", batch_size: 4, warmup: 2, eval_every: 0, final_eval_batches: 2,
          ckpt_every: 5, log_every: 1, device: cpu}
  resources: {cpus: 1, memory_gb: 1}
  launcher: ray_task
stages:
  pretrain: {kind: pretrain}
  ppl:
    kind: eval
    needs: [pretrain]
    eval: {suite: ppl-by-length, ppl: {lengths: [32], max_tokens: 256}, device: cpu}
"""


@pytest.fixture
def ray_address() -> str:
    return local_ray.shared()


def _grid(tmp_path: Path, steps: int = 8, overrides: tuple[str, ...] = ()) -> tuple[Path, object]:
    path = tmp_path / "grid.yaml"
    path.write_text(GRID.replace("STEPS", str(steps)))
    spec, marks, text, resolved = load_grid(path, list(overrides))
    return path, build_dag(spec, marks, yaml_submitted=text, yaml_resolved=resolved)


def _store(tmp_path: Path):
    from phaselab.catalog.store.api import CatalogStore

    store = CatalogStore(f"sqlite:///{tmp_path / 'catalog.db'}")
    store.upgrade()
    return store


_COUNTS = {  # fixed statements; values are bound parameters
    "metric": "SELECT COUNT(*) FROM metric",
    "metric_distinct": "SELECT COUNT(*) FROM (SELECT DISTINCT stage_hash, ident FROM metric)",
    "artifact": "SELECT COUNT(*) FROM artifact",
    "stage": "SELECT COUNT(*) FROM stage",
    "cell_stage": "SELECT COUNT(*) FROM cell_stage",
    "attempt_of": "SELECT COUNT(*) FROM attempt WHERE stage_hash = :h",
}


def _count(store, what: str, **params) -> int:
    from sqlalchemy import text

    with store.engine.connect() as conn:
        return conn.execute(text(_COUNTS[what]), params).scalar_one()


def _wait(pred, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_grid_runs_to_completion_then_everything_is_cached(tmp_path: Path, ray_address) -> None:
    from phaselab.orchestrator.engine.runner import path_digest

    _, dag = _grid(tmp_path)
    store = _store(tmp_path)
    mlflow_cfg = {"tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
                  "artifact_root": (tmp_path / "mlartifacts").as_uri()}
    summary = Controller(store, dag, runs_root=tmp_path / "runs", heartbeat_s=1.0, mlflow=mlflow_cfg,
                         env_vars={"MLFLOW_TRACKING_URI": mlflow_cfg["tracking_uri"]}).run(timeout_s=240)
    assert summary.ok, summary.failed
    _check_mlflow(mlflow_cfg["tracking_uri"], dag, store)
    assert sorted(summary.launched) == sorted(dag.nodes)
    for h, node in dag.nodes.items():
        row = store.get_stage(h)
        assert (row.state, row.attempts) == ("SUCCEEDED", 1)
        arts = store.reads.artifacts_for_stage(h)
        assert arts and all(path_digest(Path(a.uri)) == (a.sha256, a.bytes) for a in arts)
        names = {m.name for m in store.reads.metrics_for_stage(h)}
        assert names >= ({"ppl", "nll"} if node.kind == "eval" else {"loss", "acc"})
        assert (tmp_path / "runs" / h / "stage.yaml").is_file()
    for h in dag.nodes:
        _check_what_ran(store, h)
    ppl = [m for h, n in dag.nodes.items() if n.kind == "eval" for m in store.reads.metrics_for_stage(h) if m.name == "ppl"]
    assert all(1.0 < m.value < 66.0 for m in ppl)    # a trained char model: better than uniform over 66
    n_metrics, n_artifacts = _count(store, "metric"), _count(store, "artifact")

    # `phaselab eval CHECKPOINT --suite ...` on a stage's checkpoint, outside any grid
    from typer.testing import CliRunner

    from phaselab.orchestrator.cli.main import app

    ckpt = next(a.uri for h, n in dag.nodes.items() if n.kind == "pretrain" for a in store.reads.artifacts_for_stage(h))
    res = CliRunner().invoke(app, ["eval", ckpt, "--suite", "ppl-by-length", "ppl.lengths=[16,32]",
                                   "ppl.max_tokens=128", "data.kind=text", "device=cpu",
                                   "--out", str(tmp_path / "eval"), "--json"])
    assert res.exit_code == 0, res.output
    recs = json.loads(res.output)["records"]
    assert sorted(r["context_len"] for r in recs if r["name"] == "ppl") == [16, 32]

    # `phaselab verify STAGE --steps K`: the first K losses re-run in this process match the stored run
    pre = next(h for h, n in dag.nodes.items() if n.kind == "pretrain")
    res = CliRunner().invoke(app, ["verify", pre[:16], "--steps", "3", "--catalog",
                                   f"sqlite:///{tmp_path / 'catalog.db'}", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert [c[0] for c in out["compared"]] == [1, 2, 3] and out["max_rel"] <= 1e-4

    again = Controller(store, dag, runs_root=tmp_path / "runs").run(timeout_s=60)
    assert again.ok and again.launched == []          # every stage is a cache hit
    assert again.seconds < 10
    assert (_count(store, "metric"), _count(store, "artifact")) == (n_metrics, n_artifacts)
    assert all(store.get_stage(h).attempts == 1 for h in dag.nodes)


def _check_what_ran(store, stage_hash: str) -> None:
    """The stage's worker reported what ran (workloads.provenance) and the catalog holds it: the
    backend of every attention call site, the implementation each op took, determinism (on CPU
    every implementation is), precision, graph mode and device (DESIGN §4)."""
    from sqlalchemy import text

    env = store.get_stage(stage_hash).env
    ran = env["provenance"]
    sites = ran["attention"]["sites"]
    assert sites and set(sites) == {"h.0.attn"} and set(sites.values()) <= {"sdpa", "reference"}, ran
    assert env["attn_backend"] == sites
    assert set(ran["attention"]["impls"]) == set(sites.values()) and ran["attention"]["impls"].get("sdpa", ["torch"]) == ["torch"]
    assert (env["deterministic"], ran["deterministic"], ran["device"], ran["precision"]) == (True, True, "cpu", "fp32")
    assert ran["compile"] is False and ran["cuda_graphs"] is False
    with store.engine.connect() as conn:
        backends = conn.execute(text("SELECT attn_backend FROM attempt WHERE stage_hash = :h"),
                                {"h": stage_hash}).scalars().all()
    assert backends and all(set(b.split(",")) == set(sites.values()) for b in backends), backends


def _check_mlflow(uri: str, dag, store) -> None:
    """A top-level run per stage, tagged with the stage hash and its cell, with the stage's
    metrics; the catalog stores the run id (DESIGN §5.5)."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(dag.spec.grid)
    runs = client.search_runs([exp.experiment_id])
    assert "cell" not in {r.data.tags.get("phaselab.run_level") for r in runs}
    stages = {r.data.tags["phaselab.stage_hash"]: r for r in runs if r.data.tags.get("phaselab.run_level") == "stage"}
    assert set(stages) == set(dag.nodes)
    for h, run in stages.items():
        assert run.info.status == "FINISHED"
        assert "mlflow.parentRunId" not in run.data.tags
        assert run.data.tags["phaselab.cell_key"] == dag.nodes[h].members[0][0]
        assert store.get_stage(h).mlflow_run_id == run.info.run_id
        assert run.data.metrics, h


def test_killed_controller_then_resume_repeats_nothing(tmp_path: Path, ray_address) -> None:
    # the slow pretrain must still run, checkpointed, once the quick one (6 steps) is done: both
    # spend ~10 s starting, so 150 steps (~0.1 s of training) could end inside one 0.2 s poll
    path, dag = _grid(tmp_path, steps=1000)
    store = _store(tmp_path)
    db, runs, log = tmp_path / "catalog.db", tmp_path / "runs", tmp_path / "run.log"
    pope = next(h for h, n in dag.nodes.items() if n.kind == "pretrain" and "pe=pope" in n.members[0][0])
    exe = Path(sys.executable).parent / "phaselab"
    env = {**os.environ, "RAY_ADDRESS": ray_address}
    with log.open("wb") as sink:
        proc = subprocess.Popen([str(exe), "run", str(path), "--catalog", f"sqlite:///{db}", "--runs-root",
                                 str(runs), "--no-mlflow"], env=env, stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        def mid_grid() -> bool:
            states = {h: r.state for h in dag.nodes if (r := store.get_stage(h)) is not None}
            if proc.poll() is not None or states.get(pope) == "SUCCEEDED":
                raise AssertionError(f"the controller exited ({proc.returncode}) or the slow pretrain "
                                     f"finished before the kill; states {states}; its output:\n"
                                     f"{log.read_text()[-3000:]}")
            return ("SUCCEEDED" in states.values() and states.get(pope) == "RUNNING"
                    and any((runs / pope / "checkpoints").glob("step_*")))
        _wait(mid_grid, 180, "one stage done and the slow pretrain checkpointed")
        before = {h: store.get_stage(h) for h in dag.nodes}
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\ncontroller output:\n{log.read_text()[-3000:]}") from None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    done_before = {h for h, r in before.items() if r.state == "SUCCEEDED"}
    assert before[pope].state == "RUNNING"

    summary = Controller(store, dag, runs_root=runs, heartbeat_s=1.0).run(timeout_s=300)   # resume
    assert summary.ok, summary.failed
    assert set(summary.launched).isdisjoint(done_before)        # finished work is not repeated
    for h in done_before:
        row = store.get_stage(h)
        assert row.attempts == 1 and row.finished_at == before[h].finished_at
        assert _count(store, "attempt_of", h=h) == 1
    assert store.get_stage(pope).attempts == 2
    attempts = [json.loads(line) for line in (runs / pope / "attempts.jsonl").read_text().splitlines()]
    assert attempts[-1]["outcome"] == "succeeded" and attempts[-1]["first_step"] > 1   # resumed from a checkpoint
    # no duplicate rows: one stage row per hash, one membership per (cell, stage), metrics unique
    assert _count(store, "stage") == len(dag.nodes)
    assert _count(store, "cell_stage") == sum(len(s) for s in dag.cell_stages.values())
    assert _count(store, "metric") == _count(store, "metric_distinct")


def test_cancel_stops_running_stages(tmp_path: Path, ray_address) -> None:
    import threading

    from typer.testing import CliRunner

    from phaselab.orchestrator.cli.main import app

    _, dag = _grid(tmp_path, steps=2000)
    store = _store(tmp_path)
    runs = tmp_path / "runs"
    pope = next(h for h, n in dag.nodes.items() if n.kind == "pretrain" and "pe=pope" in n.members[0][0])
    controller = Controller(store, dag, runs_root=runs, heartbeat_s=0.5)
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(summary=controller.run(timeout_s=300)))
    thread.start()
    _wait(lambda: (runs / pope / "running.json").is_file(), 120, "the slow pretrain to start")
    res = CliRunner().invoke(app, ["cancel", "raytiny", "--catalog", f"sqlite:///{tmp_path / 'catalog.db'}", "--json"])
    assert res.exit_code == 0, res.output
    thread.join(timeout=60)
    assert not thread.is_alive()
    states = result["summary"].states
    assert states[pope] == "CANCELLED"
    assert all(s in ("SUCCEEDED", "CANCELLED") for s in states.values())
    assert store.reads.metrics_for_stage(pope) == []


def test_killed_worker_is_retried_and_resumes_from_checkpoint(tmp_path: Path, ray_address) -> None:
    import threading

    _, dag = _grid(tmp_path, steps=150)
    store = _store(tmp_path)
    runs = tmp_path / "runs"
    pope = next(h for h, n in dag.nodes.items() if n.kind == "pretrain" and "pe=pope" in n.members[0][0])
    controller = Controller(store, dag, runs_root=runs, heartbeat_s=1.0)
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(summary=controller.run(timeout_s=300)))
    thread.start()
    _wait(lambda: (runs / pope / "running.json").is_file() and any((runs / pope / "checkpoints").glob("step_*")),
          180, "the slow pretrain to checkpoint")
    os.kill(json.loads((runs / pope / "running.json").read_text())["pid"], signal.SIGKILL)
    thread.join(timeout=300)
    summary = result["summary"]
    assert summary.ok, summary.failed
    row = store.get_stage(pope)
    assert row.state == "SUCCEEDED" and row.attempts == 2
    attempts = [json.loads(line) for line in (runs / pope / "attempts.jsonl").read_text().splitlines()]
    assert len(attempts) == 1 and attempts[0]["first_step"] > 1 and attempts[0]["last_step"] == 150


@pytest.mark.parametrize("override,failure_class,fragment", [
    # raises in the workload, after training (plan checks block and vocabulary sizes up front)
    ("stages.pretrain.train.final_eval_splits=[nosuch]", "config", "nosuch"),
    ("defaults.train.lr=1.0e+6", "divergence", "diverged"),                   # NaN gradient
])
def test_failing_stage_leaves_a_consistent_catalog(tmp_path: Path, ray_address, override, failure_class,
                                                   fragment) -> None:
    overrides = (override, "++defaults.train.grad_clip=0.0")
    _, dag = _grid(tmp_path, steps=6, overrides=overrides)
    store = _store(tmp_path)
    summary = Controller(store, dag, runs_root=tmp_path / "runs", heartbeat_s=1.0).run(timeout_s=240)
    assert not summary.ok
    for h, node in dag.nodes.items():
        row = store.get_stage(h)
        if node.kind == "pretrain":
            assert (row.state, row.failure_class, row.attempts) == ("FAILED", failure_class, 1)
            assert fragment in row.message and "advice:" in row.message
            assert store.reads.metrics_for_stage(h) == [] and store.reads.artifacts_for_stage(h) == []
        else:
            assert row.state == "BLOCKED" and row.attempts == 0
            assert "is FAILED" in row.message


def test_ray_train_launcher_names_the_run_by_the_stage_hash(tmp_path: Path, ray_address) -> None:
    _, dag = _grid(tmp_path, steps=4, overrides=("axes.zip.0.pe=[rope]", "axes.zip.0.steps=[4]",
                                                 "defaults.launcher=ray_train", "~stages.ppl"))
    store = _store(tmp_path)
    runs = tmp_path / "runs"
    ctrl = Controller(store, dag, runs_root=runs, heartbeat_s=1.0)
    summary = ctrl.run(timeout_s=300)
    assert summary.ok, summary.failed
    # stages are told which cluster is theirs: Ray Train's placement-group cleaner resolves
    # "auto" otherwise, and fails when a second local cluster runs on the machine
    assert ctrl.env_vars["RAY_ADDRESS"] == ray_address
    (h,) = dag.nodes
    row = store.get_stage(h)
    assert row.ray_run_name == h and row.attempts == 1
    assert (runs / "ray_train" / h).is_dir()                    # Ray Train V2 storage: <runs>/ray_train/<hash>
    ckpt = store.reads.artifacts_for_stage(h)[0]
    assert Path(ckpt.uri).is_file() and {m.name for m in store.reads.metrics_for_stage(h)} >= {"loss", "acc"}
    # what ran is reported by the Ray Train worker, not the stage's task (which ran no model)
    _check_what_ran(store, h)
    import pyarrow.dataset as ds

    from phaselab.catalog.reports.export import export_grid

    export_grid(store, dag.spec.grid, "parquet", tmp_path / "export")
    (row,) = ds.dataset(tmp_path / "export" / "stages", format="parquet", partitioning="hive").to_table().to_pylist()
    assert row["backend"] in ("sdpa", "reference")
    assert (row["attn_impl"], row["deterministic"], row["precision"], row["graph_mode"], row["device"]) == \
        (f"{row['backend']}=torch", True, "fp32", "eager", "cpu")


TUNE = """\
grid: tunetiny
seeds: [0]
axes:
  product:
    pe: [rope]
defaults:
  model: {preset: tiny, block_size: 32, n_layer: 1, n_head: 2, d_model: 32, pe: {kind: "${pe}"}}
  data: {kind: text, block_size: 32}
  train: {steps: 6, batch_size: 4, warmup: 2, eval_every: 2, eval_batches: 2, final_eval_batches: 2,
          ckpt_every: 3, device: cpu}
  resources: {cpus: 1, memory_gb: 1}
stages:
  tune_lr:
    kind: tune
    tune:
      space: {train.lr: {grid: [1.0e-3, 3.0e-2]}}
      metric: valid/loss
      scheduler: asha
      max_concurrent: 2
  ppl:
    kind: eval
    needs: [tune_lr]
    eval: {suite: ppl-by-length, ppl: {lengths: [32], max_tokens: 256}, device: cpu}
"""


def test_tune_stage_records_trials_and_feeds_the_best_checkpoint(tmp_path: Path, ray_address) -> None:
    path = tmp_path / "tune.yaml"
    path.write_text(TUNE)
    spec, marks, text, resolved = load_grid(path)
    dag = build_dag(spec, marks, yaml_submitted=text, yaml_resolved=resolved)
    store = _store(tmp_path)
    summary = Controller(store, dag, runs_root=tmp_path / "runs", heartbeat_s=1.0).run(timeout_s=300)
    assert summary.ok, summary.failed
    tune_hash = next(h for h, n in dag.nodes.items() if n.kind == "tune")
    trials = [r for r in store.stages_in_state({"SUCCEEDED", "CANCELLED"}) if r.kind == "trial"]
    assert len(trials) == 2 and {tuple(r.config["overrides"].items()) for r in trials} == \
        {(("train.lr", 1e-3),), (("train.lr", 3e-2),)}
    assert all((t.stage_hash, tune_hash, "uses") in store.reads.edges(tune_hash) for t in trials)
    done = [t for t in trials if t.state == "SUCCEEDED"]
    assert done and all(t.failure_class == "early_stopped" for t in trials if t.state == "CANCELLED")
    loss = {t.stage_hash: next(m.value for m in store.reads.metrics_for_stage(t.stage_hash)
                               if m.name == "loss" and m.split == "valid") for t in done}
    best = min(loss, key=loss.get)
    best_ckpt = store.reads.artifacts_for_stage(best)[0].uri
    tune_ckpt = next(a for a in store.reads.artifacts_for_stage(tune_hash) if a.name == "checkpoint").uri
    assert tune_ckpt == best_ckpt
    # a second run is all cached, and the trials are not duplicated
    again = Controller(store, dag, runs_root=tmp_path / "runs").run(timeout_s=60)
    assert again.ok and again.launched == []
    assert len([r for r in store.stages_in_state({"SUCCEEDED", "CANCELLED"}) if r.kind == "trial"]) == 2


def test_stage_the_local_cluster_can_never_fit_fails_fast(tmp_path: Path, ray_address) -> None:
    _, dag = _grid(tmp_path, steps=6, overrides=("++stages.pretrain.resources.gpus=1",))
    store = _store(tmp_path)
    summary = Controller(store, dag, runs_root=tmp_path / "runs", fixed_cluster=True).run(timeout_s=60)
    assert not summary.ok and summary.seconds < 30
    for h, node in dag.nodes.items():
        row = store.get_stage(h)
        if node.kind == "pretrain":
            assert (row.state, row.failure_class, row.attempts) == ("FAILED", "config", 0)
            assert "asks for 1 CPUs / 1 GPUs" in row.message
        else:
            assert row.state == "BLOCKED"
