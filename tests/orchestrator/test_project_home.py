"""The project home (catalog/store/home.py): every command finds the catalog and the runs from any
sub-folder of the project, and says which catalog it looked for when there is none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _orchestrator_grids import BASE
from typer.testing import CliRunner

from phaselab.catalog.store import db, home
from phaselab.catalog.store.api import CatalogStore
from phaselab.catalog.tracking.mlflow_common import catalog_dir
from phaselab.orchestrator.cli.main import app
from phaselab.orchestrator.engine.controller import Controller, default_runs_root
from phaselab.orchestrator.plan.dag import plan_grid


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("PHASELAB_CATALOG_URL", "PHASELAB_RUNS_ROOT", "PHASELAB_HOME", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    root = tmp_path / "proj"
    (root / "notes" / "deep").mkdir(parents=True)
    (root / "g.yaml").write_text(BASE)
    store = CatalogStore(f"sqlite:///{root / '.phaselab' / 'catalog.db'}")
    store.upgrade()
    Controller(store, plan_grid(root / "g.yaml"), runs_root=root / ".phaselab" / "runs").submit()
    return root


def _cli(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, list(args))
    return res.exit_code, res.output


def test_status_from_a_sub_folder_reads_the_project_catalog(project: Path, monkeypatch) -> None:
    monkeypatch.chdir(project / "notes" / "deep")
    assert home.project_home() == project.resolve()
    assert db.default_url() == f"sqlite:///{project.resolve() / '.phaselab' / 'catalog.db'}"
    assert default_runs_root() == project.resolve() / ".phaselab" / "runs"
    assert catalog_dir() == project.resolve() / ".phaselab"
    code, out = _cli("status", "t", "--json")
    assert code == 0, out
    assert [s["state"] for s in json.loads(out)["stages"]] == ["PLANNED"] * 4
    assert not (project / "notes" / "deep" / ".phaselab").exists()


def test_no_catalog_names_the_catalog_it_looked_for(project: Path, tmp_path: Path, monkeypatch) -> None:
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / ".phaselab").mkdir(parents=True)
    (elsewhere / ".phaselab" / "catalog_url").write_text("x")   # a bare .phaselab is no marker
    monkeypatch.chdir(elsewhere)
    assert home.find_home() is None
    code, out = _cli("status", "t")
    text = " ".join(out.split())
    assert code == 1
    assert f"there is no catalog at {elsewhere.resolve() / '.phaselab' / 'catalog.db'}" in text
    assert f"in {elsewhere.resolve()} or any folder above it" in text and "phaselab run t" in text
    monkeypatch.setenv("PHASELAB_HOME", str(project / "notes"))
    code, out = _cli("status", "t", "--json")
    assert code == 1 and "under $PHASELAB_HOME" in json.loads(out)["error"]
    monkeypatch.setenv("PHASELAB_HOME", str(project))
    code, out = _cli("status", "t", "--json")
    assert code == 0 and len(json.loads(out)["stages"]) == 4
    monkeypatch.setenv("PHASELAB_HOME", str(project / "missing"))
    with pytest.raises(ValueError, match="PHASELAB_HOME=.*is not a folder"):
        home.project_home()
