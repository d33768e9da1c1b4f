"""CLI verbs on a real SQLite catalog (no Ray needed): plan statuses and GPU-hour estimates,
why (hit / miss with dotted paths), status, retry, cancel, db upgrade, gc."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _orchestrator_grids import BASE
from typer.testing import CliRunner

from phaselab.catalog.store.api import ArtifactSpec, CatalogStore
from phaselab.catalog.tracking import MetricRecord
from phaselab.orchestrator.cli.main import app
from phaselab.orchestrator.engine.controller import Controller
from phaselab.orchestrator.plan.dag import plan_grid


@pytest.fixture
def env(tmp_path: Path):
    grid = tmp_path / "g.yaml"
    grid.write_text(BASE)
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    store = CatalogStore(url)
    store.upgrade()
    return grid, url, store


def _cli(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, list(args))
    return res.exit_code, res.output


def _succeed(store: CatalogStore, h: str, *, gpu_seconds: float | None = None, uri: str = "/x/model.pt") -> None:
    store.transition(h, "READY", expected={"PLANNED"})
    assert store.claim(h, "test-owner")
    store.finalize_success(h, metrics=[MetricRecord(name="loss", value=1.5, split="valid")],
                           artifacts=[ArtifactSpec(name="checkpoint", uri=uri, sha256="0" * 64, bytes=1,
                                                   kind="checkpoint")],
                           env={"git_sha": None}, backend=None, mlflow_run_id=None, gpu_seconds=gpu_seconds)


def _nodes(dag, name: str) -> list[str]:
    return [h for h, n in dag.nodes.items() if n.name == name]


def test_plan_without_catalog_has_no_side_effects(tmp_path: Path) -> None:
    grid = tmp_path / "g.yaml"
    grid.write_text(BASE)
    db = tmp_path / "none.db"
    code, out = _cli("plan", str(grid), "--catalog", f"sqlite:///{db}", "--json")
    assert code == 0, out
    plan = json.loads(out)
    assert [s["status"] for s in plan["stages"]] == ["will run"] * 4
    assert plan["cells"] == ["pe=rope,seed=0", "pe=pope,seed=0"]
    assert not db.exists()
    code, out = _cli("plan", str(grid), "--catalog", f"sqlite:///{db}")
    assert code == 0 and "pretrain[pe=rope,seed=0]" in out and "4 will run" in out


def test_plan_shows_catalog_states_and_gpu_hours(env) -> None:
    grid, url, store = env
    dag = plan_grid(grid, ["++defaults.resources.gpus=1"])
    Controller(store, dag).submit()
    pre_rope, pre_pope = _nodes(dag, "pretrain")
    _succeed(store, pre_rope, gpu_seconds=36.0)          # 2 steps x 2 seqs x 32 tokens in 36 GPU-s
    store.record_failure(pre_pope, failure_class="oom", message="CUDA out of memory")
    code, out = _cli("plan", str(grid), "++defaults.resources.gpus=1", "--catalog", url, "--json")
    assert code == 0, out
    status = {s["hash"]: (s["status"], s["failure_class"]) for s in json.loads(out)["stages"]}
    assert status[pre_rope] == ("cached", None) and status[pre_pope] == ("failed", "oom")
    # 100x the tokens of the measured stage with the same model config -> 100 x 36 GPU-s = 1 GPU-h
    code, out = _cli("plan", str(grid), "++defaults.resources.gpus=1", "defaults.train.steps=200",
                     "--catalog", url, "--json")
    est = {s["label"]: s["gpu_hours_est"] for s in json.loads(out)["stages"] if s["kind"] == "pretrain"}
    assert est["pretrain[pe=rope,seed=0]"] == pytest.approx(1.0)
    assert est["pretrain[pe=pope,seed=0]"] is None       # no throughput measured for PoPE's model
    code, out = _cli("plan", str(grid), "++defaults.resources.gpus=1", "--catalog", url)
    assert "cached" in out and "failed(oom)" in out


def test_why_explains_hit_and_miss(env) -> None:
    grid, url, store = env
    dag = plan_grid(grid)
    Controller(store, dag).submit()
    pre_rope = _nodes(dag, "pretrain")[0]
    _succeed(store, pre_rope)
    code, out = _cli("why", pre_rope[:16], "--catalog", url, "--json")
    assert code == 0, out
    res = json.loads(out)
    assert res["hit"] is True and res["state"] == "SUCCEEDED"
    code, out = _cli("why", "pretrain[pe=rope,seed=0]", "--grid", str(grid), "defaults.train.lr=0.01",
                     "--catalog", url, "--json")
    res = json.loads(out)
    assert res["hit"] is False and res["closest"]["hash"] == pre_rope
    assert res["differences"] == ["config.train.lr: 0.0006 -> 0.01"]
    code, out = _cli("why", "pretrain[pe=rope,seed=0]", "--grid", str(grid), "defaults.train.lr=0.01", "--catalog", url)
    assert code == 0 and "MISS" in out and "config.train.lr: 0.0006 -> 0.01" in out
    code, out = _cli("why", "ffff", "--catalog", url, "--json")
    assert code == 1 and "0 stored stages match" in out


def test_status_retry_cancel(env) -> None:
    grid, url, store = env
    dag = plan_grid(grid)
    Controller(store, dag).submit()
    pre_rope, pre_pope = _nodes(dag, "pretrain")
    _succeed(store, pre_rope)
    store.record_failure(pre_pope, failure_class="oom", message="CUDA out of memory")
    code, out = _cli("status", "t", "--catalog", url, "--json")
    states = {s["hash"]: s["state"] for s in json.loads(out)["stages"]}
    assert states[pre_rope] == "SUCCEEDED" and states[pre_pope] == "FAILED"
    code, out = _cli("retry", "t", "--failed", "--class", "code", "--catalog", url, "--json")
    assert json.loads(out)["requeued"] == []
    code, out = _cli("retry", "t", "--failed", "--class", "oom", "--catalog", url, "--json")
    assert json.loads(out)["requeued"] == [pre_pope] and store.get_stage(pre_pope).state == "PLANNED"
    code, out = _cli("cancel", "t", "--catalog", url, "--json")
    cancelled = set(json.loads(out)["cancelled"])
    assert pre_rope not in cancelled and pre_pope in cancelled and len(cancelled) == 3
    assert store.get_stage(pre_rope).state == "SUCCEEDED"
    code, out = _cli("status", "t", "--catalog", url)
    assert code == 0 and "1/4 stages succeeded" in out
    code, out = _cli("status", "nope", "--catalog", url, "--json")
    assert code == 1 and "not in the catalog" in out


def test_db_upgrade_and_gc(tmp_path: Path, env) -> None:
    grid, url, store = env
    code, out = _cli("db", "upgrade", "--catalog", url, "--json")
    assert code == 0 and json.loads(out)["revision"] == store.revision()
    dag = plan_grid(grid)
    Controller(store, dag).submit()
    runs = tmp_path / "runs"
    pre = _nodes(dag, "pretrain")[0]
    keep = runs / pre / "checkpoints" / "step_0000002"
    old = runs / pre / "checkpoints" / "step_0000001"
    ray_copy = runs / "ray_train" / pre / "step_0000001"
    for d in (keep, old, ray_copy, runs / ("f" * 64)):
        d.mkdir(parents=True)
        (d / "model.pt").write_bytes(b"x" * 10)
    _succeed(store, pre, uri=str(keep / "model.pt"))
    code, out = _cli("gc", "--catalog", url, "--runs-root", str(runs), "--dry-run", "--json")
    paths = {Path(p["path"]) for p in json.loads(out)["paths"]}
    assert paths == {old.resolve(), ray_copy.resolve(), runs / ("f" * 64)} and old.exists()
    code, out = _cli("gc", "--catalog", url, "--runs-root", str(runs), "--json")
    assert code == 0 and not old.exists() and keep.exists() and not (runs / ("f" * 64)).exists()
    assert not ray_copy.exists()


def test_export_and_tables(tmp_path: Path, env) -> None:
    grid, url, store = env
    dag = plan_grid(grid)
    Controller(store, dag).submit()
    _succeed(store, _nodes(dag, "pretrain")[0])
    out = tmp_path / "export"
    code, text = _cli("export", "t", "--out", str(out), "--catalog", url, "--json")
    assert code == 0, text
    summary = json.loads(text)
    assert (summary["metric_rows"], summary["stage_rows"]) == (1, 4)
    assert (out / "metrics" / "grid=t" / "stage_kind=pretrain").is_dir()
    code, text = _cli("export", "nope", "--out", str(out), "--catalog", url, "--json")
    assert code == 1 and "not in the catalog" in text
    code, text = _cli("tables", "quickstart_ppl", "--catalog", url, "--json")
    assert code == 0 and json.loads(text)["tables"][0]["skipped"]        # its grid is not in this catalog
    code, text = _cli("tables", "--check-stale", "--catalog", url, "--json")
    assert code == 0 and json.loads(text)["stale"] == {}
    code, text = _cli("tables", "no_such_table", "--catalog", url, "--json")
    assert code == 1 and "unknown table" in text


def test_plan_warns_when_a_hit_came_from_another_environment(env) -> None:
    from phaselab.catalog.store.fingerprint import env_fingerprint

    grid, url, store = env
    dag = plan_grid(grid)
    Controller(store, dag).submit()
    pre = _nodes(dag, "pretrain")[0]
    _succeed(store, pre)
    now = env_fingerprint()
    store.record_attempt(pre, {**now, "packages": {**now["packages"], "torch": "0.0.1"}})
    code, out = _cli("plan", str(grid), "--catalog", url, "--json")
    assert code == 0, out
    rows = {s["hash"]: s for s in json.loads(out)["stages"]}
    assert rows[pre]["env_differs"] == [f"torch 0.0.1 -> {now['packages']['torch']}"]
    assert all(r["env_differs"] == [] for h, r in rows.items() if h != pre)


def test_status_and_retry_follow_the_latest_version(env) -> None:
    grid, url, store = env
    old = plan_grid(grid)
    Controller(store, old).submit()
    for h in old.nodes:
        store.record_failure(h, failure_class="code", message="boom")
    new = plan_grid(grid, ["defaults.train.lr=0.01"])
    Controller(store, new).submit()
    code, out = _cli("status", "t", "--catalog", url, "--json")
    assert {s["hash"] for s in json.loads(out)["stages"]} == set(new.nodes)
    code, out = _cli("status", "t", "--all-versions", "--catalog", url, "--json")
    assert {s["hash"] for s in json.loads(out)["stages"]} == set(new.nodes) | set(old.nodes)
    code, out = _cli("retry", "t", "--failed", "--catalog", url, "--json")
    assert code == 0 and json.loads(out)["requeued"] == []        # the old version's failures stay
    assert all(store.get_stage(h).state == "FAILED" for h in old.nodes)


def test_resume_rebuilds_the_latest_version_from_the_catalog(env) -> None:
    from phaselab.orchestrator.cli.main import _stored_dag

    grid, _url, store = env
    dag = plan_grid(grid, ["defaults.train.steps=3"])
    Controller(store, dag).submit()
    rebuilt = _stored_dag(store, "t", as_json=True)
    assert list(rebuilt.nodes) == list(dag.nodes)          # same code -> same keys, same order
    assert rebuilt.spec.defaults.train["steps"] == 3
