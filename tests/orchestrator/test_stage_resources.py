"""A ``ray_train`` stage's declared per-worker resources reach ``ray_entry.fit`` as
``resources_per_worker``, without changing any stage hash.

The way a real stage gets there: grid YAML -> DAG node -> ``Controller._payload`` (real SQLite
catalog, the upstream's checkpoint artifact committed through ``finalize_success``) ->
``Resources(**payload["resources"])`` and ``StageContext`` as ``runner`` builds them ->
``fit_kwargs``, which is what ``PretrainStage.run`` calls ``fit`` with. The kwargs are then bound
to ``fit``'s real signature and given to ``ray_entry.scaling_config`` (Ray's ScalingConfig, no
cluster started), which must keep the resources as given.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from phaselab.catalog.tracking import NullTracker
from phaselab.orchestrator.engine.controller import Controller
from phaselab.orchestrator.plan.dag import build_dag, load_grid
from phaselab.orchestrator.stages import STAGES, Resources, StageContext
from phaselab.orchestrator.stages.pretrain import resources_per_worker

GRID = """\
grid: res
seeds: [0]
axes: {}
defaults:
  model: {preset: tiny, block_size: 32, n_layer: 1, n_head: 2, d_model: 32, pe: {kind: rope}}
  data: {kind: text, block_size: 32}
  train: {steps: 4, batch_size: 4, warmup: 1, eval_every: 0, device: cpu}
  launcher: ray_train
stages:
  pretrain:
    kind: pretrain
    resources: {cpus: 6, gpus: 1, memory_gb: 48, num_workers: 4, accelerator: H200}
  yarn:
    kind: finetune
    needs: [pretrain]
    extend: {rule: yarn, factor: 2.0, original_max_seq_len: 32, block_size: 64}
    resources: {cpus: 3, num_workers: 2}
"""


def _dag(tmp_path: Path, text: str, name: str = "grid.yaml"):
    path = tmp_path / name
    path.write_text(text)
    spec, marks, sub, res = load_grid(path, [])
    return build_dag(spec, marks, yaml_submitted=sub, yaml_resolved=res)


def _contexts(tmp_path: Path) -> dict[str, StageContext]:
    """name -> the StageContext ``runner`` would build from the controller's payload."""
    from phaselab.catalog.store.api import ArtifactSpec, CatalogStore

    dag = _dag(tmp_path, GRID)
    store = CatalogStore(f"sqlite:///{tmp_path / 'catalog.db'}")
    store.upgrade()
    controller = Controller(store, dag, runs_root=tmp_path / "runs")
    controller.submit()
    pre = next(h for h, n in dag.nodes.items() if n.name == "pretrain")
    assert controller.pending() and store.claim(pre, controller.owner)
    store.finalize_success(pre, metrics=[], env={}, backend=None, mlflow_run_id=None, artifacts=[
        ArtifactSpec(name="checkpoint", uri=str(tmp_path / "ckpt" / "model.pt"), sha256="0" * 64, bytes=1,
                     kind="checkpoint")])
    rows = controller._rows()
    out = {}
    for h, node in dag.nodes.items():
        payload = controller._payload(node, rows)
        out[node.name] = StageContext(
            stage_hash=h, name=node.name, config=payload["config"], out_dir=Path(payload["out_dir"]),
            runs_root=Path(payload["runs_root"]), tracker=NullTracker(), upstream=payload["upstream"],
            launcher=payload["launcher"], resources=Resources(**payload["resources"]))
    return out


def test_declared_resources_reach_fit(tmp_path: Path) -> None:
    from phaselab.workloads.train.ray_entry import fit, scaling_config

    ctx = _contexts(tmp_path)
    pre, ft = ctx["pretrain"], ctx["yarn"]
    kw = STAGES["pretrain"].fit_kwargs(pre)
    assert kw == {"spec": {k: pre.config[k] for k in ("model", "data", "train")}, "out_dir": pre.out_dir,
                  "run_name": pre.stage_hash, "storage_path": str(tmp_path / "runs" / "ray_train"),
                  "num_workers": 4, "use_gpu": True, "init_from": None,
                  "resources_per_worker": {"CPU": 6.0, "GPU": 1.0, "accelerator_type:H200": 0.001}}
    kw_ft = STAGES["finetune"].fit_kwargs(ft)   # cpt and finetune inherit PretrainStage's
    assert kw_ft["spec"]["extend"]["rule"] == "yarn" and "model" not in kw_ft["spec"]
    assert kw_ft["init_from"] == tmp_path / "ckpt" / "model.pt"      # the upstream's committed checkpoint
    assert (kw_ft["num_workers"], kw_ft["use_gpu"], kw_ft["resources_per_worker"]) == (2, False, {"CPU": 3.0})
    assert kw_ft["run_name"] == ft.stage_hash != pre.stage_hash
    for args in (kw, kw_ft):
        inspect.signature(fit).bind(**args)   # every key is a parameter of the real fit
        scaling = scaling_config(num_workers=args["num_workers"], use_gpu=args["use_gpu"],
                                 resources_per_worker=args["resources_per_worker"])
        assert scaling.resources_per_worker == args["resources_per_worker"]
        assert scaling._resources_per_worker_not_none == args["resources_per_worker"]
        assert (scaling.num_workers, scaling.use_gpu) == (args["num_workers"], args["use_gpu"])


@pytest.mark.parametrize("res,want", [
    (Resources(), {"CPU": 1}),
    (Resources(cpus=0, gpus=0.5), {"CPU": 0, "GPU": 0.5}),
    (Resources(cpus=2, gpus=8, accelerator="H100", num_workers=64), {"CPU": 2, "GPU": 8, "accelerator_type:H100": 0.001}),
])
def test_resources_per_worker(res: Resources, want: dict) -> None:
    assert resources_per_worker(res) == want


def test_resources_do_not_change_stage_hashes(tmp_path: Path) -> None:
    """The same grid without any resources (Ray's defaults) plans the same stage hashes."""
    bare = "\n".join(line for line in GRID.splitlines() if "resources:" not in line) + "\n"
    with_res, without = _dag(tmp_path, GRID), _dag(tmp_path, bare, name="bare.yaml")
    assert sorted(with_res.nodes) == sorted(without.nodes)
    by_name = {n.name: n.resources for n in with_res.nodes.values()}
    assert by_name["pretrain"].num_workers == 4 and by_name["yarn"].cpus == 3
    # no gpus: left to the packing rule (stages/gpu_packing.py), which gives a CPU stage none
    assert {n.name: n.resources for n in without.nodes.values()}["pretrain"] == Resources(
        gpus=0, gpus_auto=True, gpus_why="its device is cpu")
