"""A read-only, full or blocked ``.phaselab`` is refused before any work starts, in one line
naming the folder and the fix; a run whose cluster cannot be reached registers nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _fs_faults import fill, make_readonly, tiny_fs
from typer.testing import CliRunner

from phaselab.catalog.store.api import CatalogStore
from phaselab.orchestrator.cli.main import app


def _run(monkeypatch: pytest.MonkeyPatch, catalog: Path, runs: Path, *extra: str, verb: str = "run") -> dict:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("PHASELAB_CATALOG_URL", raising=False)
    flags = ["--no-mlflow"] if verb == "run" else []
    res = CliRunner().invoke(app, [verb, "quickstart", "--catalog", f"sqlite:///{catalog}", "--runs-root",
                                   str(runs), *flags, "--json", *extra])
    assert res.exit_code == 1, (res.output, res.exception)
    assert isinstance(res.exception, SystemExit), res.exception   # an error, not a traceback
    out = json.loads(res.stdout)
    assert out["ok"] is False and "\n" not in out["error"]
    return out


def test_a_read_only_catalog_folder_is_refused_before_any_work(tmp_path: Path, monkeypatch) -> None:
    with tiny_fs(tmp_path / "state") as state:
        with CatalogStore(f"sqlite:///{state / 'catalog.db'}") as store:   # an existing catalog
            store.upgrade()
        make_readonly(state)
        out = _run(monkeypatch, state / "catalog.db", tmp_path / "runs")
    assert out["error"].startswith(f"the catalog folder {state} is on a read-only file system [EROFS]: ")
    assert "--catalog" in out["error"] and "PHASELAB_HOME" in out["error"]
    assert not (tmp_path / "runs").exists()   # nothing started


def test_a_full_catalog_folder_is_refused_before_any_work(tmp_path: Path, monkeypatch) -> None:
    with tiny_fs(tmp_path / "state", size_kb=512) as state:
        fill(state)
        out = _run(monkeypatch, state / "catalog.db", tmp_path / "runs")
        assert not (state / "catalog.db").exists()
    assert out["error"].startswith(f"the catalog folder {state} has no space left on its device [ENOSPC]: ")


def test_a_file_in_place_of_the_catalog_folder_is_refused(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "state").write_text("not a folder")   # a real fault for any user, root included
    for verb in ("run", "submit"):
        out = _run(monkeypatch, tmp_path / "state" / "catalog.db", tmp_path / "runs", verb=verb)
        assert out["error"].startswith(f"the catalog folder {tmp_path / 'state'} is not a folder")


def test_a_read_only_runs_folder_is_refused_before_any_work(tmp_path: Path, monkeypatch) -> None:
    with tiny_fs(tmp_path / "runs") as runs:
        make_readonly(runs)
        out = _run(monkeypatch, tmp_path / "catalog.db", runs)
    assert out["error"].startswith(f"the runs folder {runs} is on a read-only file system [EROFS]: ")
    assert "--runs-root" in out["error"]
    assert CatalogStore(f"sqlite:///{tmp_path / 'catalog.db'}").reads.get_grid("quickstart") is None


def test_an_unreachable_cluster_registers_no_grid_version(tmp_path: Path, monkeypatch) -> None:
    import socket

    # a port held bound but not listening: refused, and no process of a test running beside this
    # one can take it meanwhile, as it could a port merely released
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{held.getsockname()[1]}"
        out = _run(monkeypatch, tmp_path / "catalog.db", tmp_path / "runs", "--address", address)
    assert out["error"].startswith("no Ray cluster answers at 127.0.0.1:")
    store = CatalogStore(f"sqlite:///{tmp_path / 'catalog.db'}")
    assert store.reads.get_grid("quickstart") is None   # no version, so no READY stage without a controller
    assert store.stages_in_state(["PLANNED", "READY", "RUNNING"]) == []
