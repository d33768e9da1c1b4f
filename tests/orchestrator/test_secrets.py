"""Credentials stay out of everything others can read: a real run against PostgreSQL with a
password in the catalog URL leaves the password in no file of Ray's session folder, of the runs
root or of the project, nor in the CLI's output; a submitted job's runtime_env holds it sealed
with the cluster's token only; phaselab's log lines show URLs without their password."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from _orchestrator_grids import BASE
from _quickstart import quickstart_env
from pg_schema import postgres_schema

PASSWORD = "Pw-8c1f0e2d9b"   # trust authentication on the CI database ignores it; Ray would log it


def _with_password(url: str) -> str:
    scheme, rest = url.split("://", 1)
    user_host = rest.split("@", 1)
    if len(user_host) == 2:
        user, host = user_host
        return f"{scheme}://{user.split(':', 1)[0]}:{PASSWORD}@{host}"
    return f"{scheme}://postgres:{PASSWORD}@{rest}"


def _files_holding(root: Path, needle: bytes) -> list[str]:
    hits = []
    for path in root.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink() and needle in path.read_bytes():
                hits.append(str(path.relative_to(root)))
        except OSError:   # sockets, files of processes still going away
            pass
    return hits


@pytest.mark.postgres
@pytest.mark.ray
@pytest.mark.slow
def test_a_run_with_a_catalog_password_leaves_it_in_no_file_and_no_output(tmp_path: Path) -> None:
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    grid = work / "g.yaml"
    grid.write_text(BASE.replace("pe: [rope, pope]", "pe: [rope]"))
    # Ray's session folder of its own (short: Ray's unix socket paths are limited to 107 bytes).
    ray_tmp = Path(tempfile.mkdtemp(prefix="plsec", dir="/tmp"))
    env = quickstart_env(HOME=str(home), RAY_TMPDIR=str(ray_tmp))
    for name in ("RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE", "PHASELAB_CATALOG_URL"):
        env.pop(name, None)
    try:
        with postgres_schema("phaselab_secrets") as base:
            url = _with_password(base)
            assert PASSWORD in url
            env["PHASELAB_CATALOG_URL"] = url
            proc = subprocess.run(
                [sys.executable, "-m", "phaselab.orchestrator.cli.main", "run", str(grid), "--num-cpus", "1",
                 "--no-mlflow", "--runs-root", str(work / "runs"), "--json"],
                check=False, cwd=work, env=env, capture_output=True, text=True, timeout=400)
            out = json.loads(proc.stdout)
            assert proc.returncode == 0, proc.stderr[-3000:]
            assert out["counts"] == {"SUCCEEDED": 2}, out["counts"]
        sessions = list(ray_tmp.rglob("session_*"))
        assert sessions and _files_holding(ray_tmp, b"runtime_env"), "no Ray session folder was written"
        assert _files_holding(ray_tmp, PASSWORD.encode()) == []
        assert _files_holding(work, PASSWORD.encode()) == []
        assert PASSWORD not in proc.stdout + proc.stderr
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


def test_submitted_job_gets_credentials_sealed_with_the_cluster_token(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from phaselab.orchestrator.engine.jobs import SEALED_ENV, job_request, unseal_env

    url = f"postgresql+psycopg://phaselab:{PASSWORD}@db.internal:5432/catalog"
    for name in ("MLFLOW_DISABLE_TELEMETRY", "PHASELAB_MAX_CELLS", "PHASELAB_MAX_STAGES", "PHASELAB_RESOURCE_WAIT_S",
                 "MLFLOW_TRACKING_URI", SEALED_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN", "tok-123")
    req = job_request("http://head:8265", "quickstart", url, tmp_path / "runs")
    assert PASSWORD not in json.dumps(req) and "tok-123" not in json.dumps(req)
    env = req["runtime_env"]["env_vars"]
    assert sorted(env) == [SEALED_ENV]
    # The job's driver (on the head, holding the same token) opens it into its environment.
    monkeypatch.setenv(SEALED_ENV, env[SEALED_ENV])
    monkeypatch.delenv("PHASELAB_CATALOG_URL", raising=False)
    assert unseal_env() == ["PHASELAB_CATALOG_URL"]
    assert os.environ["PHASELAB_CATALOG_URL"] == url and SEALED_ENV not in os.environ
    # Another cluster's token cannot.
    monkeypatch.setenv(SEALED_ENV, env[SEALED_ENV])
    monkeypatch.setenv("RAY_AUTH_TOKEN", "tok-456")
    with pytest.raises(ValueError, match="another cluster's token"):
        unseal_env()
    # Without any token the credential is refused rather than sent in the clear.
    monkeypatch.delenv("RAY_AUTH_TOKEN")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "no-token"))
    with pytest.raises(ValueError, match="PHASELAB_CATALOG_URL .*no token was found"):
        job_request("http://head:8265", "quickstart", url, tmp_path / "runs")
    # A URL without a password needs no sealing.
    plain = job_request("http://head:8265", "quickstart", "postgresql+psycopg://db/catalog", tmp_path / "runs")
    assert plain["runtime_env"] == {"env_vars": {"PHASELAB_CATALOG_URL": "postgresql+psycopg://db/catalog"}}


def test_redact_and_split_secrets() -> None:
    from phaselab.catalog.tracking.mlflow_common import redact, split_secrets

    assert redact(f"cannot reach postgresql+psycopg://u:{PASSWORD}@h:5432/d?x=1 or http://a:b@h/x") == \
        "cannot reach postgresql+psycopg://u:***@h:5432/d?x=1 or http://a:***@h/x"
    assert redact("http://h:5000/x sqlite:////a/b.db") == "http://h:5000/x sqlite:////a/b.db"
    public, secret = split_secrets({"PHASELAB_CATALOG_URL": f"postgresql://u:{PASSWORD}@h/d",
                                    "MLFLOW_TRACKING_URI": "http://127.0.0.1:5000", "RAY_AUTH_TOKEN": "t",
                                    "PHASELAB_MAX_CELLS": "64"})
    assert public == {"MLFLOW_TRACKING_URI": "http://127.0.0.1:5000", "PHASELAB_MAX_CELLS": "64"}
    assert secret == {"PHASELAB_CATALOG_URL": f"postgresql://u:{PASSWORD}@h/d", "RAY_AUTH_TOKEN": "t"}
