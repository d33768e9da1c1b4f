"""MlflowTracker against a real MLflow SQLite tracking store (and a real server for the outage
test): nested runs, flattened params, resume, rank-0 only, spool and replay (DESIGN §5.5)."""

from __future__ import annotations

import json
import shutil
import socket
import time
from pathlib import Path

import pytest

from phaselab.catalog.tracking import MetricRecord, mlflow_server
from phaselab.catalog.tracking.mlflow_tracker import MlflowTracker, flatten_params, metric_key

STAGE = "ab" * 32


@pytest.fixture(scope="module")
def mlflow_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An MLflow SQLite store with its schema created once (creating it costs seconds)."""
    from mlflow import MlflowClient

    path = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def tracking(mlflow_template: Path, tmp_path: Path) -> tuple[str, str]:
    """(tracking URI, artifact root) of a fresh copy of the template store."""
    db = tmp_path / "mlflow.db"
    shutil.copy(mlflow_template, db)
    return f"sqlite:///{db}", (tmp_path / "mlartifacts").as_uri()


def _stage_tracker(uri: str, root: str | None, tmp_path: Path, stage_hash: str = STAGE,
                   **kw: object) -> MlflowTracker:
    kw.setdefault("axes", {"pe": "pope", "size": "124M", "seed": 1})
    return MlflowTracker.for_stage(tracking_uri=uri, grid="owt", grid_id=3, cell_id=7,
                                   cell_key="pe=pope,seed=1,size=124M", stage_hash=stage_hash,
                                   stage_kind="eval", upstream=["cd" * 32], attn_backend="sdpa",
                                   git_commit="f" * 40, spool_dir=tmp_path / "spool",
                                   artifact_root=root, **kw)


def test_metric_key_and_flatten() -> None:
    assert metric_key(MetricRecord(name="ppl", value=1.0, context_len=4096)) == "ppl/ctx_4096"
    assert metric_key(MetricRecord(name="niah_acc", value=1.0, context_len=65536, depth=0.5)) == \
        "niah_acc/ctx_65536/depth_0.5"
    assert metric_key(MetricRecord(name="acc", value=0.5, task="blimp_anaphor")) == "acc/blimp_anaphor"
    assert flatten_params({"model": {"pe": {"kind": "rope", "base": 1e4}, "layers": [1, 2]}, "lr": 3e-4}) == \
        {"model.pe.kind": "rope", "model.pe.base": "10000.0", "model.layers": "[1, 2]", "lr": "0.0003"}


def test_nested_runs_params_metrics_artifacts(tracking: tuple[str, str], tmp_path: Path) -> None:
    from mlflow import MlflowClient

    uri, root = tracking
    t = _stage_tracker(uri, root, tmp_path)
    t.log_params({"model": {"pe": {"kind": "pope", "pope": {"delta": True}, "rope": {"base": 1e4}}, "n_layer": 12},
                  "blob": "x" * 7000})
    t.log_metrics({"train/loss": 2.5}, step=10)
    t.log_metrics({"train/loss": 2.25}, step=20)
    t.log_records([MetricRecord(name="ppl", value=21.33, context_len=4096, split="valid")])
    t.log_config("model:\n  pe: pope\n")
    t.log_env({"git_sha": "f" * 40, "dirty_diff_hash": None, "world_size": 1, "device": "cpu",
               "attn_backend": {"layers.0": "sdpa", "layers.1": "sdpa"}})
    t.end()
    second = _stage_tracker(uri, root, tmp_path, stage_hash="ef" * 32)
    second.end()
    assert t.pending == 0 and t.run_id is not None

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("owt")
    assert exp.artifact_location == f"{root}/owt"
    runs = client.search_runs([exp.experiment_id])
    assert {r.info.run_id for r in runs} == {t.run_id, second.run_id}    # top-level stage runs only
    assert not any("mlflow.parentRunId" in r.data.tags for r in runs)     # no cell run to collapse them under
    assert {r.data.tags["phaselab.cell_key"] for r in runs} == {"pe=pope,seed=1,size=124M"}
    run = client.get_run(t.run_id)
    tags = run.data.tags
    assert (tags["phaselab.stage_hash"], tags["phaselab.grid_id"], tags["phaselab.cell_id"],
            tags["phaselab.stage_kind"], tags["phaselab.upstream"], tags["phaselab.attn.backend"],
            tags["mlflow.source.git.commit"]) == (STAGE, "3", "7", "eval", "cd" * 32, "sdpa", "f" * 40)
    assert run.info.run_name == "eval pe=pope size=124M seed=1"   # stage, then its axis values
    assert run.data.params["model.pe.kind"] == "pope" and run.data.params["model.n_layer"] == "12"
    assert run.data.params["model.pe.pope.delta"] == "True" and "model.pe.rope.base" not in run.data.params
    assert {k: v for k, v in run.data.params.items() if k.startswith("axis.")} == \
        {"axis.pe": "pope", "axis.size": "124M", "axis.seed": "1"}
    assert (tags["axis.pe"], tags["axis.seed"], tags["phaselab.git.dirty"], tags["phaselab.device"]) == \
        ("pope", "1", "false", "cpu")
    assert run.data.params["attn.backend"] == "sdpa"
    assert len(run.data.params["blob"]) == 6000 and run.data.params["blob"].endswith("artifact]")
    assert tags["phaselab.truncated_params"] == "blob"
    assert run.data.metrics == {"train/loss": 2.25, "ppl/split_valid/ctx_4096": 21.33,
                                "ppl/split_valid/by_ctx": 21.33}   # the length series: step = context length
    assert [(m.step, m.value) for m in client.get_metric_history(t.run_id, "ppl/split_valid/by_ctx")] == \
        [(4096, 21.33)]
    assert [(m.step, m.value) for m in client.get_metric_history(t.run_id, "train/loss")] == \
        [(10, 2.5), (20, 2.25)]
    arts = {a.path for a in client.list_artifacts(t.run_id, "config")} | \
        {a.path for a in client.list_artifacts(t.run_id, "env")}
    assert arts == {"config/resolved.yaml", "env/fingerprint.json"}
    assert run.info.status == "FINISHED"


def test_resume_reattaches_and_never_relogs_params(tracking: tuple[str, str], tmp_path: Path) -> None:
    from mlflow import MlflowClient

    uri, root = tracking
    first = _stage_tracker(uri, root, tmp_path)
    first.log_params({"optim": {"lr": 6e-4}})
    first.log_metrics({"loss": 3.0}, step=1)
    first.end("FAILED")                                      # the attempt crashed
    again = _stage_tracker(uri, root, tmp_path, run_id=first.run_id)
    assert again.run_id == first.run_id
    again.log_params({"optim": {"lr": 6e-4}, "resume_count": 1})
    again.log_params({"optim": {"lr": 1e-3}})               # must not overwrite
    again.log_metrics({"loss": 2.0}, step=2)
    # Without a stored id the stage hash tag finds the run too.
    by_tag = _stage_tracker(uri, root, tmp_path)
    assert by_tag.run_id == first.run_id and again.pending == 0

    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(first.run_id)
    assert run.data.params == {"optim.lr": "0.0006", "resume_count": "1", "axis.pe": "pope", "axis.seed": "1",
                               "axis.size": "124M"}
    assert run.data.tags["phaselab.param_conflicts"] == "optim.lr"
    assert run.info.status == "RUNNING"
    assert [m.value for m in client.get_metric_history(first.run_id, "loss")] == [3.0, 2.0]
    exp = client.get_experiment_by_name("owt")
    assert len(client.search_runs([exp.experiment_id], "tags.`phaselab.run_level` = 'stage'")) == 1


def test_non_zero_rank_is_inert(tracking: tuple[str, str], tmp_path: Path) -> None:
    from mlflow import MlflowClient

    uri, root = tracking
    t = _stage_tracker(uri, root, tmp_path, rank=1)
    t.log_params({"a": 1})
    t.log_metrics({"loss": 1.0}, step=1)
    assert t.run_id is None and t.pending == 0
    assert MlflowClient(tracking_uri=uri).get_experiment_by_name("owt") is None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_unreachable_server_spools_then_flush_backfills(mlflow_template: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    port = _free_port()
    uri = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    t = _stage_tracker(uri, None, tmp_path)
    t.log_params({"optim": {"lr": 6e-4}})
    for step in range(3):
        t.log_metrics({"loss": 3.0 - step}, step=step)
    ckpt_note = tmp_path / "note.txt"
    ckpt_note.write_text("resolved config")
    t.log_artifact(ckpt_note, name="notes")
    ckpt_note.unlink()                                      # the replay must not need the original
    t.log_records([MetricRecord(name="ppl", value=20.5, context_len=1024)])
    t.end()
    assert time.monotonic() - started < 30                  # training was not held up
    assert t.run_id is None and t.pending == 9              # start, axis params, 7 calls
    assert t.flush() is False and t.pending == 9            # still down: nothing lost

    backend = tmp_path / "server.db"
    shutil.copy(mlflow_template, backend)
    proc = mlflow_server.serve(port=port, backend_uri=f"sqlite:///{backend}", block=False,
                               artifact_root=str(tmp_path / "server-artifacts"),
                               log_path=tmp_path / "server.log")
    try:
        assert t.flush() is True and t.pending == 0
        client = MlflowClient(tracking_uri=uri)
        run = client.get_run(t.run_id)
        assert run.data.params == {"optim.lr": "0.0006", "axis.pe": "pope", "axis.seed": "1", "axis.size": "124M"}
        assert [m.value for m in client.get_metric_history(t.run_id, "loss")] == [3.0, 2.0, 1.0]
        assert run.data.metrics["ppl/ctx_1024"] == 20.5 and run.info.status == "FINISHED"
        assert [a.path for a in client.list_artifacts(t.run_id, "notes")] == ["notes/note.txt"]
        assert run.data.tags["phaselab.cell_key"] == "pe=pope,seed=1,size=124M"   # the replayed start's tags
    finally:
        mlflow_server.stop(proc)


def test_server_command_refuses_file_store_and_public_bind(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="file store"):
        mlflow_server.server_command(host="127.0.0.1", port=5000, backend_uri="./mlruns",
                                     artifact_root=str(tmp_path))
    with pytest.raises(ValueError, match="loopback"):
        mlflow_server.server_command(host="0.0.0.0", port=5000, backend_uri="sqlite:///x.db",
                                     artifact_root=str(tmp_path))
    cmd = mlflow_server.server_command(host="127.0.0.1", port=5001, backend_uri="sqlite:///x.db",
                                       artifact_root=str(tmp_path))
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and cmd[cmd.index("--workers") + 1] == "1"


def test_lineage_glue_and_resume_by_stored_run_id(tracking: tuple[str, str], tmp_path: Path) -> None:
    from catalog_testlib import add_stage, cell
    from mlflow import MlflowClient

    from phaselab.catalog.store.api import CatalogStore
    from phaselab.catalog.tracking import lineage

    uri, root = tracking
    store = CatalogStore(f"sqlite:///{tmp_path / 'catalog.db'}")
    store.upgrade()
    gid = store.upsert_grid(name="quickstart", grid_hash="q" * 64, yaml_submitted="", yaml_resolved="")
    cid = cell(store, gid, {"pe": "rope", "seed": 0})
    pre = add_stage(store, cid, "pretrain", kind="pretrain")
    ev = add_stage(store, cid, "ppl")
    store.add_edge(pre, ev, "evaluates")
    t = lineage.stage_tracker(store, ev, tracking_uri=uri, spool_dir=tmp_path / "spool", attn_backend="sdpa",
                              artifact_root=root)
    t.log_metrics({"loss": 1.0}, step=1)
    store.update_stage_info(ev, mlflow_run_id=t.run_id)
    resumed = lineage.stage_tracker(store, ev, tracking_uri=uri, spool_dir=tmp_path / "spool")
    assert resumed.run_id == t.run_id
    run = MlflowClient(tracking_uri=uri).get_run(t.run_id)
    assert "mlflow.parentRunId" not in run.data.tags and run.data.tags["phaselab.cell_id"] == str(cid)
    assert run.data.tags["phaselab.upstream"] == pre and run.data.tags["phaselab.stage_kind"] == "eval"
    store.dispose()


def test_dead_tracker_at_start_costs_no_waiting(tmp_path: Path) -> None:
    """A closed port: no HTTP retries at all, every call is spooled at once."""
    from phaselab.catalog.tracking.mlflow_experiment import prepare_experiment
    from phaselab.catalog.tracking.mlflow_tracker import replay_spools

    uri = f"http://127.0.0.1:{_free_port()}"
    started = time.monotonic()
    assert prepare_experiment(uri, "owt", [{"axes": {"pe": "rope"}}, {"axes": {"pe": "pope"}}]) is False
    t = _stage_tracker(uri, None, tmp_path)
    for step in range(200):
        t.log_metrics({"train/loss": 1.0 / (step + 1)}, step=step)
    t.end("FINISHED")
    assert replay_spools(tmp_path / "spool", uri) == {f"{STAGE}.jsonl": 203}
    assert time.monotonic() - started < 3.0
    assert t.run_id is None and t.pending == 203   # start, axis params, 200 points, end


def _server(port: int, backend: Path, tmp_path: Path):
    return mlflow_server.serve(port=port, backend_uri=f"sqlite:///{backend}", block=False,
                               artifact_root=str(tmp_path / "server-artifacts"),
                               log_path=tmp_path / f"server-{time.monotonic_ns()}.log")


@pytest.mark.slow
def test_mid_run_outage_is_replayed_once_by_the_next_run(mlflow_template: Path, tmp_path: Path) -> None:
    """Server killed mid-run, the attempt crashes, a retry re-runs steps and logs its final
    metric twice; once the server is back, replaying the spools from a fresh process state
    leaves one point per (metric, step), the run FINISHED, and nothing spooled."""
    from mlflow import MlflowClient

    from phaselab.catalog.tracking.mlflow_tracker import replay_spools

    port = _free_port()
    uri = f"http://127.0.0.1:{port}"
    backend = tmp_path / "server.db"
    shutil.copy(mlflow_template, backend)
    proc = _server(port, backend, tmp_path)
    first = _stage_tracker(uri, None, tmp_path)
    for step in range(3):
        first.log_metrics({"loss": 10.0 - step}, step=step)
    run_id = first.run_id
    mlflow_server.stop(proc)
    started = time.monotonic()
    for step in range(3, 6):                                 # the server is gone: spooled
        first.log_metrics({"loss": 10.0 - step}, step=step)
    del first                                                # the attempt crashes: no end()
    retry = _stage_tracker(uri, None, tmp_path, run_id=run_id)
    for step in range(4, 8):                                 # resumed from the step-4 checkpoint
        retry.log_metrics({"loss": 20.0 - step}, step=step)
    retry.log_metrics({"valid/loss": 1.5}, step=7)
    retry.log_metrics({"valid/loss": 1.25}, step=7)          # the final evaluation, same step
    retry.end("FINISHED")
    assert time.monotonic() - started < 15                  # one bounded failure, then spooling
    assert retry.pending > 0

    proc = _server(port, backend, tmp_path)
    try:
        assert replay_spools(tmp_path / "spool", uri) == {f"{STAGE}.jsonl": 0}
        assert replay_spools(tmp_path / "spool", uri) == {}
        client = MlflowClient(tracking_uri=uri)
        history = [(m.step, m.value) for m in client.get_metric_history(run_id, "loss")]
        assert sorted(history) == [(0, 10.0), (1, 9.0), (2, 8.0), (3, 7.0), (4, 6.0), (5, 5.0),
                                   (6, 14.0), (7, 13.0)]
        assert [m.value for m in client.get_metric_history(run_id, "valid/loss")] == [1.5]
        assert client.get_run(run_id).info.status == "FINISHED"
        exp = client.get_experiment_by_name("owt")
        assert len(client.search_runs([exp.experiment_id], "tags.`phaselab.run_level` = 'stage'")) == 1
    finally:
        mlflow_server.stop(proc)


def test_half_applied_replay_keeps_the_run_for_the_calls_left(tracking: tuple[str, str], tmp_path: Path) -> None:
    """Spooled from the start (no run id yet); the replay creates the run, then fails on an
    artifact whose file is missing: the calls left must carry the new run's id, or no later
    replay (another process) could ever apply them."""
    from mlflow import MlflowClient

    from phaselab.catalog.tracking.mlflow_tracker import replay_spools

    uri, _ = tracking
    dead = _stage_tracker(f"http://127.0.0.1:{_free_port()}", None, tmp_path)
    dead.log_metrics({"loss": 2.0}, step=1)
    missing = tmp_path / "late" / "report.json"
    dead.log_artifact(missing, name="reports")
    dead.end("FAILED")
    assert replay_spools(tmp_path / "spool", uri) == {f"{STAGE}.jsonl": 2}   # artifact + end left
    left = [line for line in (tmp_path / "spool" / f"{STAGE}.jsonl").read_text().splitlines() if line]
    run_ids = {json.loads(line).get("run_id") for line in left}
    assert len(run_ids) == 1 and None not in run_ids
    missing.parent.mkdir()
    missing.write_text("{}")
    assert replay_spools(tmp_path / "spool", uri) == {f"{STAGE}.jsonl": 0}
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_ids.pop())
    assert run.info.status == "FAILED"
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss")] == [(1, 2.0)]
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["reports"]
