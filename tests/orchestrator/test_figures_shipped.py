"""``phaselab figures GRID`` with its defaults draws every shipped grid: catalog rows are built
from each grid's own plan (its cells, stages and the lengths its evals measure) through the store
API, without training, and the figure is rendered through the real CLI."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from phaselab.catalog.store.api import CatalogStore
from phaselab.catalog.tracking import MetricRecord
from phaselab.orchestrator.cli.main import app
from phaselab.orchestrator.engine.controller import Controller
from phaselab.orchestrator.language.library import shipped_grids
from phaselab.orchestrator.plan.dag import plan_grid

pytestmark = pytest.mark.slow


def _records(config: dict, label: str) -> list[MetricRecord]:
    """What the stage would report, with values that differ between stages (not asserted)."""
    ev = config.get("eval") or {}
    v = 1.0 + zlib.crc32(label.encode()) % 97 / 10.0
    suite = ev.get("suite")
    if suite == "ppl-by-length":
        lengths = (ev.get("ppl") or {}).get("lengths") or [64, 128]
        return [MetricRecord(name=m, value=v * (1 + i) if m == "ppl" else v / 3, context_len=int(L), split="test")
                for i, L in enumerate(lengths) for m in ("ppl", "nll")]
    if suite == "task":
        return [MetricRecord(name=ev.get("metric") or "nll", value=v / 10, split=ev.get("split") or "test")]
    if suite == "niah":
        return [MetricRecord(name="niah_acc", value=1 / v, context_len=L, depth=d) for L in (1024, 2048)
                for d in (0.0, 0.5, 1.0)]
    if suite == "lm-eval":
        return [MetricRecord(name="acc", value=1 / v, task="hellaswag")]
    if config.get("train"):
        return [MetricRecord(name="loss", value=v, split="valid")]
    return []


def _fill(store: CatalogStore, grid: str, runs: Path) -> None:
    dag = plan_grid(grid)
    Controller(store, dag, runs_root=runs).submit()
    for h, node in dag.nodes.items():
        store.transition(h, "READY", expected={"PLANNED"})
        assert store.claim(h, "fixture")
        store.finalize_success(h, metrics=_records(dict(node.config), node.label), artifacts=[],
                               env={"git_sha": None}, backend=None, mlflow_run_id=None)


@pytest.mark.parametrize("grid", sorted(shipped_grids()))
def test_figures_with_defaults_draw_every_shipped_grid(grid: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    store = CatalogStore(url)
    store.upgrade()
    _fill(store, grid, tmp_path / "runs")
    res = CliRunner().invoke(app, ["figures", grid, "--catalog", url, "--out", str(tmp_path / "fig"), "--json"])
    assert res.exit_code == 0, res.output
    paths = [Path(p) for p in json.loads(res.output)["figures"]]
    assert [p.name for p in paths] == [f"{grid}_length.png", f"{grid}_length.pdf"]
    assert all(p.stat().st_size > 5000 for p in paths)
