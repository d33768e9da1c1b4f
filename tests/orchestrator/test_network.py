"""Network exposure: a running quickstart's local cluster listens on loopback only, Ray's token
file is readable by its owner only, and a submitted grid's catalog password never reaches the
Ray job's entrypoint nor, unsealed, its runtime_env."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from _quickstart import KilledQuickstart


def _loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    mapped = getattr(addr, "ipv4_mapped", None)
    return (mapped or addr).is_loopback


@pytest.mark.ray
@pytest.mark.slow
def test_running_quickstart_listens_on_loopback_only_and_keeps_its_token_private(
        killed_quickstart: KilledQuickstart) -> None:
    """The census of the ``killed_quickstart`` fixture (conftest.py): its run had a fresh ``~``,
    so the token file was created by that run."""
    seen = killed_quickstart
    sockets = seen.sockets
    print(f"socket census of a running quickstart ({len(sockets)} listening): "
          f"{sorted({ip for ip, _ in sockets})}")
    assert {"raylet", "gcs_server", "ray::DashboardAgent"} <= seen.names, seen.names
    assert len(sockets) >= 5, sockets   # GCS, raylet, agents, workers, metrics: the census saw them
    public = sorted(s for s in sockets if not _loopback(s[0]))
    assert not public, f"listening beyond loopback: {public}"
    assert seen.token_mode == 0o600, oct(seen.token_mode or 0)


def test_submitted_job_carries_the_catalog_password_sealed_in_its_environment_only(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from phaselab.orchestrator.engine.jobs import job_request

    url = "postgresql+psycopg://phaselab:s3cret-pw@db.internal:5432/catalog"
    for name in ("MLFLOW_DISABLE_TELEMETRY", "PHASELAB_MAX_STAGES", "PHASELAB_RESOURCE_WAIT_S"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PHASELAB_MAX_CELLS", "64")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "tok-123")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    req = job_request("http://head:8265", "quickstart", url, tmp_path / "runs", version=3)
    assert req["entrypoint"] == (f"python -m phaselab.orchestrator.cli.main resume quickstart --runs-root "
                                 f"{(tmp_path / 'runs').resolve()} --version 3")
    assert "s3cret" not in str(req) and "tok-123" not in str(req)   # sealed (test_secrets.py), token not sent
    env = req["runtime_env"]["env_vars"]
    assert sorted(env) == ["MLFLOW_TRACKING_URI", "PHASELAB_MAX_CELLS", "PHASELAB_SEALED_ENV"]
    assert (env["MLFLOW_TRACKING_URI"], env["PHASELAB_MAX_CELLS"]) == ("http://127.0.0.1:5000", "64")


def test_stage_tasks_get_the_catalog_and_mlflow_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Remote Ray nodes do not inherit the driver's environment: what a stage needs travels in
    its runtime_env. Nothing that changes what runs does: kernel choices are config fields
    (``model.attention``), so a stray PHASELAB_AUTOTUNE in the driver's environment is not passed."""
    from phaselab.orchestrator.cli.main import stage_env

    for name in ("PHASELAB_CATALOG_URL", "MLFLOW_DISABLE_TELEMETRY", "PHASELAB_AUTOTUNE"):
        monkeypatch.delenv(name, raising=False)
    ml = {"tracking_uri": "sqlite:///runs/mlflow.db", "artifact_root": "runs/mlartifacts"}
    assert stage_env("sqlite:///runs/catalog.db", ml) == {
        "PHASELAB_CATALOG_URL": "sqlite:///runs/catalog.db", "MLFLOW_TRACKING_URI": "sqlite:///runs/mlflow.db",
        "MLFLOW_DISABLE_TELEMETRY": "true"}
    monkeypatch.setenv("PHASELAB_AUTOTUNE", "1")
    monkeypatch.setenv("PHASELAB_CATALOG_URL", "postgresql+psycopg://db/catalog")
    assert stage_env(None, None) == {"PHASELAB_CATALOG_URL": "postgresql+psycopg://db/catalog",
                                     "MLFLOW_DISABLE_TELEMETRY": "true"}
