"""benchmarks/orchestrator_overhead.py and the ``noop`` stage kind it runs.

Fast tests: the percentile arithmetic on known answers, and the noop grid's planning (one stage
per tag, unknown keys and bad values rejected). The Ray test runs the phaselab side for real on
5 stages (fresh SQLite catalog, the real controller) and checks the catalog rows and the
latencies it derives against the stage outputs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import local_ray
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import orchestrator_overhead as ob

from phaselab.orchestrator.language.yamlio import GridError
from phaselab.orchestrator.plan.dag import build_dag, load_grid


def test_percentile_known_answers():
    xs = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert ob.percentile(xs, 50) == 3.0
    assert ob.percentile(xs, 0) == 1.0 and ob.percentile(xs, 100) == 5.0
    assert ob.percentile(xs, 95) == pytest.approx(4.8)   # 4 + 0.8 * (5 - 4), numpy's linear method
    assert ob.percentile([0.0, 10.0], 25) == pytest.approx(2.5)
    with pytest.raises(ValueError, match="empty"):
        ob.percentile([], 50)
    with pytest.raises(ValueError, match="101"):
        ob.percentile(xs, 101)


def _dag(*overrides: str):
    spec, marks, text, resolved = load_grid(ob.GRID, list(overrides))
    return build_dag(spec, marks, yaml_submitted=text, yaml_resolved=resolved)


def test_noop_grid_one_stage_per_tag():
    dag = _dag("defaults.noop.tag=range(0,7)", "defaults.noop.sleep_s=0.25")
    assert len(dag.cells) == 7 and len(dag.nodes) == 7
    tags = sorted(n.config["noop"]["tag"] for n in dag.nodes.values())
    assert tags == list(range(7))
    node = next(iter(dag.nodes.values()))
    assert node.kind == "noop" and node.launcher == "ray_task"
    assert node.config["noop"]["sleep_s"] == 0.25 and node.resources.cpus == 1.0
    # identical stages collapse (DESIGN §5.4): without the sweep every cell is one stage
    assert len(_dag().nodes) == 1


def test_noop_config_errors_name_the_key():
    with pytest.raises(GridError, match="sleep_ss"):
        _dag("+defaults.noop.sleep_ss=1")
    with pytest.raises(GridError, match="sleep_s must be a finite number >= 0, got -1"):
        _dag("defaults.noop.sleep_s=-1")
    with pytest.raises(GridError, match="a noop stage takes no 'train' section"):
        _dag("+stages.nothing.train={steps: 3}")


@pytest.mark.ray
def test_phaselab_side_five_noop_stages(tmp_path: Path):
    from phaselab.catalog.store.api import CatalogStore

    local_ray.shared()
    res = ob.run_phaselab(5, tmp_path, sleep_s=0.05)
    assert res["stages"] == 5 and res["states"] == {"SUCCEEDED": 5}
    assert res["wall_s"] >= res["run_s"] > 0
    assert len(res["launch_latency_s"]) == 5 and all(0 <= x < 60 for x in res["launch_latency_s"])
    # claim -> SUCCEEDED includes the task start and the 0.05 s sleep
    assert all(t > lat + 0.05 for t, lat in zip(res["claim_to_succeeded_s"], res["launch_latency_s"]))
    store = CatalogStore(f"sqlite:///{tmp_path / 'catalog.db'}")
    try:
        rows = store.stages_for_grid(store.reads.get_grid("overhead")["id"])
        assert len(rows) == 5 and {r.state for r in rows} == {"SUCCEEDED"} and {r.attempts for r in rows} == {1}
        for r in rows:   # the noop stage's metric went through finalize_success into the catalog
            metrics = [m for m in store.reads.metrics_frame(grid="overhead") if m["stage_hash"] == r.stage_hash]
            assert [m["name"] for m in metrics] == ["slept_s"] and 0.05 <= metrics[0]["value"] < 5
            started = json.loads((tmp_path / "runs" / r.stage_hash / "running.json").read_text())["started"]
            assert started >= r.started_at.timestamp() - 1e-3   # the task starts after the claim
    finally:
        store.dispose()
