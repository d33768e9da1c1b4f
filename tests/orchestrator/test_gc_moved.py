"""``phaselab gc`` in a moved project: the catalog's absolute artifact paths name the old folder,
and the committed checkpoints must still count as referenced where they are now."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from _orchestrator_grids import BASE
from typer.testing import CliRunner

from phaselab.catalog.store.api import ArtifactSpec, CatalogStore
from phaselab.orchestrator.cli.main import app
from phaselab.orchestrator.engine.controller import Controller
from phaselab.orchestrator.plan.dag import plan_grid


def _tree(runs: Path, pre: str) -> tuple[Path, Path]:
    keep = runs / pre / "checkpoints" / "step_0000002"
    old = runs / pre / "checkpoints" / "step_0000001"
    for d in (keep, old):
        d.mkdir(parents=True)
        (d / "model.pt").write_bytes(b"x" * 10)
    return keep, old


def test_gc_dry_run_in_a_moved_project_keeps_committed_checkpoints(tmp_path: Path) -> None:
    first = tmp_path / "first"
    first.mkdir()
    (first / "g.yaml").write_text(BASE)
    store = CatalogStore(f"sqlite:///{first / 'catalog.db'}")
    store.upgrade()
    dag = plan_grid(first / "g.yaml")
    Controller(store, dag).submit()
    pre = next(h for h, n in dag.nodes.items() if n.kind == "pretrain")
    keep, _ = _tree(first / "runs", pre)
    store.transition(pre, "READY", expected={"PLANNED"})
    assert store.claim(pre, "test-owner")
    store.finalize_success(pre, metrics=[], artifacts=[ArtifactSpec(
        name="checkpoint", uri=str((keep / "model.pt").resolve()), sha256="0" * 64, bytes=10, kind="checkpoint")],
        env={"git_sha": None}, backend=None, mlflow_run_id=None)
    store.dispose()

    moved = tmp_path / "moved"
    shutil.move(first, moved)
    url = f"sqlite:///{moved / 'catalog.db'}"
    res = CliRunner().invoke(app, ["gc", "--catalog", url, "--runs-root", str(moved / "runs"), "--dry-run", "--json"])
    assert res.exit_code == 0, res.output
    paths = {Path(p["path"]) for p in json.loads(res.output)["paths"]}
    assert paths == {(moved / "runs" / pre / "checkpoints" / "step_0000001").resolve()}

    # a relative stored path is read under the runs root
    from phaselab.orchestrator.engine.gc import kept_paths

    rel = kept_paths([f"{pre}/checkpoints/step_0000002/model.pt"], moved / "runs", {pre})
    assert (moved / "runs" / pre / "checkpoints" / "step_0000002" / "model.pt").resolve() in rel
