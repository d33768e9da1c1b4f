"""``status``, ``resume`` and ``export`` act on the grid version last run or submitted (an older
version re-run after a newer one is current again), or on the one named with ``--version``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _orchestrator_grids import BASE
from typer.testing import CliRunner

from phaselab.orchestrator.cli.main import _stored_dag, app
from phaselab.orchestrator.plan.dag import plan_grid


def _cli(*args: str) -> tuple[int, dict]:
    res = CliRunner().invoke(app, [*args, "--json"])
    return res.exit_code, json.loads(res.stdout)


@pytest.fixture
def two_versions(tmp_path: Path) -> tuple[str, Path, set[str], set[str]]:
    """Catalog URL, grid file, and the stage hashes of v1 and v2, after v1, v2, then v1 again."""
    path = tmp_path / "t.yaml"
    path.write_text(BASE)
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    v1 = set(plan_grid(path).nodes)
    v2 = set(plan_grid(path, ["defaults.train.steps=3"]).nodes)
    assert len(v1) == len(v2) == 4 and not v1 & v2
    for extra in ([], ["defaults.train.steps=3"], []):
        code, out = _cli("submit", str(path), *extra, "--catalog", url)
        assert code == 0, out
    assert out["version"] == 1
    return url, path, v1, v2


def test_status_shows_the_version_last_submitted_not_the_highest(two_versions) -> None:
    url, _, v1, v2 = two_versions
    code, out = _cli("status", "t", "--catalog", url)
    assert code == 0 and {s["hash"] for s in out["stages"]} == v1
    code, out = _cli("status", "t", "--catalog", url, "--version", "2")
    assert code == 0 and {s["hash"] for s in out["stages"]} == v2
    code, out = _cli("status", "t", "--catalog", url, "--all-versions")
    assert {s["hash"] for s in out["stages"]} == v1 | v2
    code, out = _cli("status", "t", "--catalog", url, "--version", "7")
    assert code == 1 and out["error"] == "grid 't' has no version 7 (versions: 1, 2)"


def test_resume_rebuilds_the_version_last_submitted_or_named(two_versions) -> None:
    from phaselab.catalog.store.api import CatalogStore

    url, _, v1, v2 = two_versions
    store = CatalogStore(url)
    assert set(_stored_dag(store, "t", True).nodes) == v1
    assert set(_stored_dag(store, "t", True, version=2).nodes) == v2
    code, out = _cli("resume", "t", "--catalog", url, "--version", "3")
    assert code == 1 and "has no version 3" in out["error"]


def test_export_writes_the_version_last_submitted(two_versions, tmp_path: Path) -> None:
    import pyarrow.dataset as ds

    url, path, v1, v2 = two_versions
    code, out = _cli("export", "t", "--catalog", url, "--format", "csv", "--out", str(tmp_path / "x"))
    assert code == 0, out
    table = ds.dataset(tmp_path / "x" / "stages", format="csv", partitioning="hive").to_table()
    assert set(table.column("stage_hash").to_pylist()) == v1
    code, out = _cli("submit", str(path), "defaults.train.steps=3", "--catalog", url)
    code, out = _cli("export", "t", "--catalog", url, "--format", "csv", "--out", str(tmp_path / "y"))
    table = ds.dataset(tmp_path / "y" / "stages", format="csv", partitioning="hive").to_table()
    assert set(table.column("stage_hash").to_pylist()) == v2
