"""Fractional GPUs pack several stages onto one card: a grid whose stages ask for
``resources.gpus: 0.25`` runs four of them at once on a node with one GPU.

CI has no GPU, so the local Ray cluster declares one (``num_gpus=1``: a logical resource Ray
schedules by, as it does a real card); the stages train on the CPU. What is checked is the
scheduling and the bookkeeping: the four stages overlap in time, each is its own process, and
the catalog holds one stage and one result per seed.
"""

from __future__ import annotations

from pathlib import Path

import local_ray
import pytest

from phaselab.orchestrator.engine.controller import Controller
from phaselab.orchestrator.plan.dag import build_dag, load_grid

pytestmark = pytest.mark.ray

GRID = """\
grid: packed
seeds: [0, 1, 2, 3]
defaults:
  model: {preset: tiny, block_size: 32, n_layer: 1, n_head: 2, d_model: 32, pe: {kind: rope}}
  data: {kind: text, block_size: 32}
  train: {steps: 150, batch_size: 4, warmup: 2, eval_every: 0, final_eval_batches: 1,
          ckpt_every: 0, log_every: 50, device: cpu}
  resources: {gpus: GPUS, cpus: 0.5, memory_gb: 0.5}
  launcher: ray_task
stages:
  pretrain: {kind: pretrain}
"""


@pytest.fixture(scope="module")
def one_gpu_cluster():
    import ray

    ctx = local_ray.own(num_cpus=2, num_gpus=1, include_dashboard=False, dashboard_host="127.0.0.1")
    yield ctx
    ray.shutdown()


def _run(tmp_path: Path, gpus: float):
    from phaselab.catalog.store.api import CatalogStore

    path = tmp_path / "grid.yaml"
    path.write_text(GRID.replace("GPUS", str(gpus)))
    spec, marks, text, resolved = load_grid(path, [])
    dag = build_dag(spec, marks, yaml_submitted=text, yaml_resolved=resolved)
    store = CatalogStore(f"sqlite:///{tmp_path / 'catalog.db'}")
    store.upgrade()
    summary = Controller(store, dag, runs_root=tmp_path / "runs", heartbeat_s=1.0).run(timeout_s=300)
    return dag, store, summary


def test_quarter_gpus_run_four_stages_side_by_side(tmp_path: Path, one_gpu_cluster) -> None:
    dag, store, summary = _run(tmp_path, 0.25)
    assert summary.ok, summary.failed
    rows = [store.get_stage(h) for h in dag.nodes]
    assert len(rows) == 4 and all((r.state, r.attempts) == ("SUCCEEDED", 1) for r in rows)
    # all four were running at the same moment: the last to start began before the first ended
    assert max(r.started_at for r in rows) < min(r.finished_at for r in rows)
    seeds = sorted(dag.nodes[h].members[0][0] for h in dag.nodes)
    assert seeds == [f"seed={s}" for s in range(4)]
    for h in dag.nodes:   # one result per seed: the training records of its own stage
        names = {m.name for m in store.reads.metrics_for_stage(h)}
        assert {"loss", "acc"} <= names
