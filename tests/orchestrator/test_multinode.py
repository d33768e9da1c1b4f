"""A real two-node Ray cluster on this machine (head + worker, each its own ``ray start`` with
its own temp dir and ports, all on 127.0.0.1, token authentication on), driven by
``phaselab run --address`` with the catalog on PostgreSQL: which node ran each stage attempt,
a worker node lost mid-stage and restarted (the stage is retried on the new node from its
checkpoint, no duplicate rows), a stage no node can run (a visible wait, then a clear failure)
and a missing or wrong token (a clear error, no traceback)."""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from _ray_nodes import RayNode
from pg_schema import postgres_schema

pytestmark = [pytest.mark.ray, pytest.mark.postgres]

ACCEL = "simgpu"   # the documented worker declares it: --resources '{"accelerator_type:simgpu": 1}'
DOC = Path(__file__).resolve().parents[2] / "docs" / "CLUSTER.md"


def documented_example() -> tuple[str, list[list[str]]]:
    """The grid and the commands of "Try it on one machine" in docs/CLUSTER.md: the test runs
    them (with its own ports, folders, token and catalog)."""
    text = DOC.read_text().split("## Try it on one machine", 1)[1].split("\n## ", 1)[0]
    grid = re.search(r"```yaml\n(.*?)```", text, flags=re.DOTALL).group(1)
    bash = re.search(r"```bash\n(.*?)```", text, flags=re.DOTALL).group(1)
    commands = [shlex.split(line, comments=True) for line in bash.splitlines()]
    return grid, [c[:-1] if c and c[-1] == "&" else c for c in commands if c]


GRID, COMMANDS = documented_example()


def _command(prefix: list[str]) -> list[str]:
    (found,) = [c for c in COMMANDS if c[:len(prefix)] == prefix]
    return found


def _node_options(head: bool) -> list[str]:
    (argv,) = [c[4:] for c in COMMANDS if c[:4] == ["python", "-m", "phaselab.orchestrator.engine.ray_local", "start"]
               and ("--head" in c) == head]
    return argv


PHASELAB = str(Path(sys.executable).parent / "phaselab")


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    """The CI PostgreSQL in a schema of its own (dropped afterwards)."""
    with postgres_schema("phaselab_mn") as url:
        yield url


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[dict]:
    """Head (1 CPU) + worker (1 CPU, accelerator ACCEL) on loopback, sharing a 0600 token file."""
    root = tmp_path_factory.mktemp("multinode")
    # Ray's socket paths under --temp-dir must stay below 108 bytes: a short folder of their own
    ray_tmp = Path(os.environ.get("RAY_TMPDIR", "/tmp")) / f"mn-{uuid.uuid4().hex[:8]}"
    token = root / "auth_token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    env = {**os.environ, "RAY_AUTH_TOKEN_PATH": str(token), "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_AUTH_MODE", None)   # the wrapper turns token auth on because a token exists
    env.pop("RAY_ADDRESS", None)
    assert [c[1].split("=")[0] for c in COMMANDS if c[0] == "export"] == ["RAY_AUTH_TOKEN_PATH", "PHASELAB_CATALOG_URL"]
    head = RayNode(ray_tmp / "head", env, _node_options(head=True)).start()
    worker = RayNode(ray_tmp / "worker", env, _node_options(head=False), head_address=head.gcs_address)
    assert f"--resources={json.dumps({f'accelerator_type:{ACCEL}': 1})}" in worker.documented
    try:
        worker.start()
        yield {"root": root, "env": env, "head": head, "worker": worker, "token": token}
    finally:
        worker.stop()
        head.stop()
        shutil.rmtree(ray_tmp, ignore_errors=True)


def _phaselab(args: list[str], env: dict, **kw) -> subprocess.Popen:
    return subprocess.Popen([PHASELAB, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, **kw)


def _wait(pred, timeout: float, what: str) -> float:
    start = end = time.monotonic()
    end += timeout
    while time.monotonic() < end:
        if pred():
            return time.monotonic() - start
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _count(store, sql: str) -> int:
    from sqlalchemy import text

    with store.engine.connect() as conn:
        return conn.execute(text(sql)).scalar_one()


def test_stages_placed_by_node_and_a_lost_worker_node_is_survived(cluster, pg_url, tmp_path: Path) -> None:
    from phaselab.catalog.store.api import CatalogStore
    from phaselab.orchestrator.plan.dag import build_dag, load_grid

    head, worker = cluster["head"], cluster["worker"]
    grid = tmp_path / "grid.yaml"
    grid.write_text(GRID)
    spec, marks, submitted, resolved = load_grid(grid)
    dag = build_dag(spec, marks, yaml_submitted=submitted, yaml_resolved=resolved)
    hashes = {n.name: h for h, n in dag.nodes.items()}
    runs = cluster["root"] / "shared-runs"      # a folder both nodes see (one machine)
    run = _command(["phaselab", "run"])   # the documented command, with this cluster's address and folders
    run = [{"grid.yaml": str(grid), "127.0.0.1:6380": head.gcs_address, "/tmp/phaselab-runs": str(runs)}.get(a, a)
           for a in run[1:]]
    proc = _phaselab([*run, "--catalog", pg_url, "--no-mlflow", "--json"], cluster["env"])
    store = CatalogStore(pg_url)
    accel = hashes["on_accel"]
    try:
        def first_attempt_checkpointed() -> bool:
            nodes = store.reads.attempt_nodes([accel]) if store.revision() else {}
            return bool(nodes.get(accel)) and any((runs / accel / "checkpoints").glob("step_*"))
        _wait(first_attempt_checkpointed, 150, "the accelerator stage to start on the worker and checkpoint")
        assert store.reads.attempt_nodes([accel])[accel] == [(1, worker.node_id)]
        lost = worker.node_id
        killed_at = datetime.now(UTC)
        worker.kill()                            # the worker node is lost mid-stage ...
        worker.start()                           # ... and a replacement joins (a new node id)
        rejoined_s = (datetime.now(UTC) - killed_at).total_seconds()
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads(out)
    assert summary["ok"] and summary["counts"] == {"SUCCEEDED": 2}

    rows = {h: store.get_stage(h) for h in dag.nodes}
    nodes = store.reads.attempt_nodes(list(dag.nodes))
    assert worker.node_id != lost
    assert nodes[accel] == [(1, lost), (2, worker.node_id)]        # retried on the replacement node
    assert (rows[accel].state, rows[accel].attempts, rows[accel].node_id) == ("SUCCEEDED", 2, worker.node_id)
    assert "preemption" not in (rows[accel].message or "")          # finalised: the retry note is cleared
    anywhere = hashes["anywhere"]
    assert nodes[anywhere] == [(1, head.node_id)] and rows[anywhere].attempts == 1   # the head had a free CPU
    attempts = [json.loads(line) for line in (runs / accel / "attempts.jsonl").read_text().splitlines()]
    assert attempts[-1]["outcome"] == "succeeded" and attempts[-1]["first_step"] > 1   # resumed from a checkpoint
    steps = dag.nodes[accel].config["train"]["steps"]
    assert attempts[-1]["last_step"] == steps
    # no duplicate rows: one per stage, one attempt row per attempt, metrics unique per identity
    assert _count(store, "SELECT COUNT(*) FROM stage") == 2
    assert _count(store, "SELECT COUNT(*) FROM attempt") == 3
    assert _count(store, "SELECT COUNT(*) FROM metric") == \
        _count(store, "SELECT COUNT(*) FROM (SELECT DISTINCT stage_hash, ident FROM metric) AS d")
    final = {(m.name, m.split): m for m in store.reads.metrics_for_stage(accel)}
    assert final[("step", None)].value == steps and final[("loss", "valid")].step == steps
    started = {a["attempt_no"]: a["started_at"] for a in store.reads.attempts_for_stage(accel)}
    assert started[1] < killed_at < started[2] < rows[accel].finished_at
    status = subprocess.run([PHASELAB, *_command(["phaselab", "status"])[1:], "--catalog", pg_url], env=cluster["env"],
                            capture_output=True, text=True, check=False, timeout=60)
    assert status.returncode == 0, status.stderr[-2000:]
    shown = json.loads(status.stdout)["stages"]
    assert {s["name"]: s["state"] for s in shown} == {"anywhere": "SUCCEEDED", "on_accel": "SUCCEEDED"}
    assert {s["name"]: s["node"] for s in shown} == {"anywhere": head.node_id, "on_accel": worker.node_id}
    print(f"\nmulti-node: attempt nodes {json.dumps(nodes)}; head {head.node_id}; lost worker {lost}; after the "
          f"kill: replacement node up {rejoined_s:.1f} s, attempt 2 started "
          f"{(started[2] - killed_at).total_seconds():.1f} s, stage SUCCEEDED "
          f"{(rows[accel].finished_at - killed_at).total_seconds():.1f} s (resumed at step {attempts[-1]['first_step']})")
    store.dispose()


def test_a_stage_no_node_can_run_waits_visibly_then_fails(cluster, pg_url, tmp_path: Path) -> None:
    from phaselab.catalog.store.api import CatalogStore

    grid = tmp_path / "grid.yaml"
    # resources are not part of a stage's key: another step count keeps it from being a cache hit
    text = GRID.replace("grid: multinode", "grid: nonode").replace(f"accelerator: {ACCEL}", "accelerator: H200")
    text = text.replace("steps: 500", "steps: 7")
    grid.write_text(text.replace("  anywhere: {kind: pretrain}\n", ""))
    env = {**cluster["env"], "PHASELAB_RESOURCE_WAIT_S": "4"}
    proc = _phaselab(["run", str(grid), "--address", cluster["head"].gcs_address, "--catalog", pg_url,
                      "--runs-root", str(tmp_path / "runs"), "--no-mlflow", "--json"], env)
    store = CatalogStore(pg_url)
    try:
        def waiting() -> bool:
            grid_row = store.reads.get_grid("nonode") if store.revision() else None
            rows = store.stages_for_grid(grid_row["id"]) if grid_row else []
            return bool(rows) and rows[0].state == "READY" and "waiting for resources" in (rows[0].message or "")
        try:
            _wait(waiting, 60, "the stage's waiting message")
        except AssertionError:
            proc.kill()
            raise AssertionError(proc.communicate()) from None
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err[-2000:]
    (row,) = store.stages_for_grid(store.reads.get_grid("nonode")["id"])
    assert (row.state, row.failure_class, row.attempts) == ("FAILED", "config", 0)
    assert "asks for accelerator 'H200', which no node of the cluster has" in row.message
    assert ACCEL in row.message and "PHASELAB_RESOURCE_WAIT_S=4" in row.message
    assert json.loads(out)["failed"][row.stage_hash][0] == "config"
    store.dispose()


def test_a_missing_or_wrong_token_is_a_clear_error(cluster, tmp_path: Path) -> None:
    grid = tmp_path / "grid.yaml"
    grid.write_text(GRID)
    bad = tmp_path / "wrong_token"
    bad.write_text(secrets.token_hex(32))
    home = tmp_path / "home"   # no ~/.ray/auth_token there
    home.mkdir()
    head = cluster["head"]
    base = {k: v for k, v in cluster["env"].items() if k not in ("RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN")}
    cases = {
        "missing": ({**base, "HOME": str(home)}, ["run", str(grid), "--address", head.gcs_address]),
        "wrong": ({**base, "RAY_AUTH_TOKEN_PATH": str(bad)}, ["run", str(grid), "--address", head.gcs_address]),
        "jobs-wrong": ({**base, "RAY_AUTH_TOKEN_PATH": str(bad)}, ["submit", str(grid), "--address", head.dashboard]),
    }
    procs = {k: _phaselab([*args, "--catalog", f"sqlite:///{tmp_path / k}.db", "--runs-root", str(tmp_path / "r"),
                           *(["--no-mlflow"] if args[0] == "run" else []), "--json"], env)
             for k, (env, args) in cases.items()}
    results = {k: p.communicate(timeout=120) for k, p in procs.items()}
    for k, p in procs.items():
        out, err = results[k]
        assert p.returncode == 1, (k, out, err[-2000:])
        assert "Traceback" not in err, (k, err[-2000:])
        results[k] = json.loads(out)["error"]
    assert results["missing"].startswith(f"the Ray cluster at {head.gcs_address} requires token authentication "
                                         f"and no token was found in RAY_AUTH_TOKEN and {home / '.ray' / 'auth_token'}")
    assert results["wrong"].startswith(f"the Ray cluster at {head.gcs_address} rejected the token from "
                                       f"RAY_AUTH_TOKEN_PATH={bad}")
    assert results["jobs-wrong"].startswith(f"the Ray Jobs API at {head.dashboard} rejected the token from "
                                            f"RAY_AUTH_TOKEN_PATH={bad}")
