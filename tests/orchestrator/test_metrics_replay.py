"""Ray Train stages replay rank 0's ``metrics.jsonl`` into their MLflow child run.

The file is written by the real writer (``ray_entry.JsonlTracker`` fed by the real training loop
through ``run_training``, which takes the same Tracker), replayed into a real ``MlflowTracker`` on
a SQLite MLflow store, and read back through ``MlflowClient``: values and step numbers match the
file, a second replay adds nothing, and a crashed-then-resumed run (which rewrites the steps
after its checkpoint) ends with every step exactly once. A Ray Train run itself costs ~60 s, so
the stage's own wiring is checked on a ``fit`` that fails on the driver before Ray starts.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from phaselab.catalog.tracking import RecordingTracker
from phaselab.catalog.tracking.run_folder import REPLAY_STATE_FILE, read_steps
from phaselab.orchestrator.stages import base
from phaselab.orchestrator.stages.pretrain import PretrainStage, log_records_once, replay_metrics
from phaselab.workloads.train.ray_entry import JsonlTracker

STAGE = "5e" * 32


def _spec(steps: int = 8) -> dict:
    return {"model": base.normalize_model({"preset": "tiny", "block_size": 32, "n_layer": 1, "n_head": 2,
                                           "d_model": 32}),
            "data": base.normalize_data({"kind": "text", "block_size": 32}),
            "train": base.normalize_train({"steps": steps, "batch_size": 4, "warmup": 2, "eval_every": 4,
                                           "eval_batches": 1, "final_eval_batches": 1, "ckpt_every": 3,
                                           "log_every": 1, "device": "cpu"})}


@pytest.fixture(scope="module")
def mlflow_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An MLflow SQLite store with its schema created once (creating it costs seconds)."""
    from mlflow import MlflowClient

    path = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


def _tracker(uri: str, tmp_path: Path):
    from phaselab.catalog.tracking.mlflow_tracker import MlflowTracker

    return MlflowTracker.for_stage(tracking_uri=uri, grid="replay", grid_id=1, cell_id=1, cell_key="seed=0",
                                   stage_hash=STAGE, stage_kind="pretrain", spool_dir=tmp_path / "spool",
                                   artifact_root=(tmp_path / "mlartifacts").as_uri())


def _history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    from mlflow import MlflowClient

    return sorted((m.step, m.value) for m in MlflowClient(tracking_uri=uri).get_metric_history(run_id, key))


def _pairs(rows: list[dict]) -> dict[tuple[int, str], float]:
    """Reference: the first value of every (step, metric) pair of the file."""
    out: dict[tuple[int, str], float] = {}
    for row in rows:
        for k, v in row.items():
            if k != "step":
                out.setdefault((int(row["step"]), k), v)
    return out


def _curve(pairs: dict[tuple[int, str], float], key: str) -> list[tuple[int, float]]:
    return sorted((s, v) for (s, k), v in pairs.items() if k == key)


def test_replay_into_mlflow_is_exact_and_idempotent_across_a_resume(mlflow_template: Path, tmp_path: Path) -> None:
    from phaselab.workloads.train.api import run_training

    db = tmp_path / "mlflow.db"
    shutil.copy(mlflow_template, db)
    uri, out = f"sqlite:///{db}", tmp_path / "stage"
    writer = JsonlTracker(out / "metrics.jsonl")
    run_training(_spec(), out_dir=out, tracker=writer, stop_after=5)   # a kill after step 5 (checkpoint at 3)
    first = read_steps(out / "metrics.jsonl")
    assert [int(r["step"]) for r in first if "train/loss" in r] == [1, 2, 3, 4, 5]
    want = _pairs(first)

    ml = _tracker(uri, tmp_path)
    assert replay_metrics(out, ml) == len(want)
    for key in ("train/loss", "train/lr", "valid/loss"):
        assert _history(uri, ml.run_id, key) == _curve(want, key)
    assert [s for s, _ in _history(uri, ml.run_id, "train/loss")] == [1, 2, 3, 4, 5]
    assert replay_metrics(out, ml) == 0                                    # same process, again
    assert replay_metrics(out, _tracker(uri, tmp_path)) == 0               # a retried stage's new tracker
    assert len(_history(uri, ml.run_id, "train/lr")) == 5
    assert json.loads((out / REPLAY_STATE_FILE).read_text())["lines"] == len(first)

    run_training(_spec(), out_dir=out, tracker=writer)   # resumes at step 3: rewrites 4 and 5
    lines = read_steps(out / "metrics.jsonl")
    assert [int(r["step"]) for r in lines if "train/loss" in r] == [1, 2, 3, 4, 5, 4, 5, 6, 7, 8]
    every = _pairs(lines)
    resumed = _tracker(uri, tmp_path)
    assert resumed.run_id == ml.run_id                                     # reattached, not a new run
    assert replay_metrics(out, resumed) == len(every) - len(want)
    for key in {k for _, k in every}:
        assert _history(uri, ml.run_id, key) == _curve(every, key), key
    assert [s for s, _ in _history(uri, ml.run_id, "train/loss")] == list(range(1, 9))
    assert _curve(every, "valid/loss")[0] == _curve(want, "valid/loss")[0]   # step 4: the first attempt's
    assert replay_metrics(out, resumed) == 0
    assert len(_history(uri, ml.run_id, "train/loss")) == 8


def test_one_replay_of_a_rewritten_file_keeps_each_step_once(tmp_path: Path) -> None:
    """A worker killed before its replay leaves both attempts' lines to one replay; the first
    attempt's value of a step wins (as in ``verify.stored_losses``)."""
    writer = JsonlTracker(tmp_path / "metrics.jsonl")
    for step in (1, 2, 3, 2, 3, 4):
        writer.log_metrics({"train/loss": 10.0 * step + len(read_steps(writer.path))}, step=step)
    writer.log_metrics({"valid/loss": 0.5}, step=4)   # a second line at a step adds its own keys
    rec = RecordingTracker()
    assert replay_metrics(tmp_path, rec) == 5
    assert rec.metrics == [(1, {"train/loss": 10.0}), (2, {"train/loss": 21.0}), (3, {"train/loss": 32.0}),
                           (4, {"train/loss": 45.0}), (4, {"valid/loss": 0.5})]
    writer.log_metrics({"ckpt/load_s": 0.25}, step=3)   # a resume logs a new name at an old step
    writer.log_metrics({"train/loss": 99.0}, step=4)    # ... and rewrites a replayed pair
    writer.log_metrics({"train/loss": 1.0}, step=5)
    assert replay_metrics(tmp_path, rec) == 2
    assert rec.metrics[-2:] == [(3, {"ckpt/load_s": 0.25}), (5, {"train/loss": 1.0})]
    assert replay_metrics(tmp_path, RecordingTracker()) == 0


def test_records_are_logged_once(tmp_path: Path) -> None:
    from phaselab.catalog.tracking import MetricRecord

    recs = [MetricRecord(name="loss", value=2.5, step=8, split="valid", context_len=32)]
    rec = RecordingTracker()
    assert log_records_once(tmp_path, rec, recs) is True
    assert log_records_once(tmp_path, rec, recs) is False
    assert rec.records == recs


def test_a_failing_ray_train_stage_still_replays_what_was_written(tmp_path: Path) -> None:
    """``fit`` raises (here on the driver, on a config its worker would reject) after rank 0 wrote
    some steps: the stage re-raises the workload's error and the steps reached the tracker."""
    from phaselab.orchestrator.stages.base import Resources, StageContext
    from phaselab.workloads.config import ConfigError

    out = tmp_path / "stage"
    writer = JsonlTracker(out / "metrics.jsonl")
    writer.log_metrics({"train/loss": 3.25, "train/lr": 1e-3}, step=1)
    writer.log_metrics({"train/loss": 3.0, "train/lr": 2e-3}, step=2)
    config = {**_spec(), "train": {**_spec()["train"], "no_such_key": 1}}
    rec = RecordingTracker()
    ctx = StageContext(stage_hash=STAGE, name="pretrain", config=config, out_dir=out, runs_root=tmp_path,
                       tracker=rec, upstream={}, launcher="ray_train", resources=Resources())
    with pytest.raises(ConfigError, match="no_such_key"):
        PretrainStage().run(ctx)
    assert rec.metrics == [(1, {"train/loss": 3.25, "train/lr": 1e-3}), (2, {"train/loss": 3.0, "train/lr": 2e-3})]
    assert rec.records == []
