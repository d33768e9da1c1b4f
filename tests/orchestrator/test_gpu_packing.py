"""``resources.gpus: auto``: the packing rule's arithmetic, its resolution over a DAG for a GPU
node described as Ray and ``nvidia-smi`` describe one, explicit numbers winning, unchanged
stage hashes, the grid errors, and what ``phaselab plan`` prints."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from phaselab.orchestrator.cli.main import app
from phaselab.orchestrator.language.yamlio import GridError
from phaselab.orchestrator.plan.dag import build_dag, load_grid
from phaselab.orchestrator.plan.placement import cluster_gpu, local_gpu, with_auto_gpus
from phaselab.orchestrator.stages import STAGES, gpu_packing
from phaselab.orchestrator.stages.base import normalize_model

GIB = 2**30
H200 = {"name": "NVIDIA H200", "memory_bytes": 140.4 * GIB, "source": "test"}

GRID = """\
grid: packs
seeds: [0, 1]
axes: {product: {pe: [rope, pope]}}
defaults:
  model: {preset: jsb-6l256, pe: {kind: "${pe}"}}
  data: {kind: jsb, block_size: 2048}
  train: {steps: 30, batch_size: 4}
  resources: {cpus: 4, memory_gb: 16}
stages:
  train: {kind: pretrain}
  test_nll:
    kind: eval
    needs: [train]
    eval: {suite: task, split: test, metric: nll, batch_size: 4}
"""


def _dag(tmp_path: Path, text: str = GRID, overrides: tuple[str, ...] = ()):
    path = tmp_path / "grid.yaml"
    path.write_text(text)
    spec, marks, sub, res = load_grid(path, list(overrides))
    return build_dag(spec, marks, yaml_submitted=sub, yaml_resolved=res)


def test_param_count_matches_the_built_model() -> None:
    from phaselab.workloads.config import from_dict
    from phaselab.workloads.models.config import ModelConfig
    from phaselab.workloads.models.transformer import Transformer

    for preset in ("tiny", "jsb-6l256"):
        model = normalize_model({"preset": preset, "pe": {"kind": "rope"}})
        built = Transformer(from_dict(ModelConfig, model))
        assert gpu_packing.param_count(model) == sum(p.numel() for p in built.parameters())
    swiglu = normalize_model({"preset": "tiny", "mlp": "swiglu", "tie_embeddings": False, "n_kv_head": 2})
    built = Transformer(from_dict(ModelConfig, swiglu))
    assert gpu_packing.param_count(swiglu) == sum(p.numel() for p in built.parameters())


def test_pack_fraction_arithmetic() -> None:
    assert gpu_packing.pack_fraction(3.3 * GIB, 140.4 * GIB) == (0.25, 4)       # capped at MAX_PACK
    assert gpu_packing.pack_fraction(30 * GIB, 80 * GIB) == (0.5, 2)            # floor(64 / 30) = 2
    assert gpu_packing.pack_fraction(20 * GIB, 80 * GIB) == (0.3333, 3)         # floor(64 / 20) = 3
    assert 3 * 0.3333 <= 1.0
    assert gpu_packing.pack_fraction(70 * GIB, 80 * GIB) == (1.0, 1)            # alone
    assert gpu_packing.pack_fraction(500 * GIB, 80 * GIB) == (1.0, 1)           # never below one stage


def test_training_memory_formula() -> None:
    model = normalize_model({"preset": "jsb-6l256", "attention": {"backend": "sdpa"}})   # fused: no scores kept
    p, d, n_layer, v = 4_744_960, 256, 6, model["vocab_size"]
    act = 4 * 2048 * (2 * 34 * d) * n_layer + 4 * 2048 * v * 8
    want = 1.5 * (16 * p + act) + 2 * GIB
    assert gpu_packing.training_memory(model, 4, 2048) == pytest.approx(want, rel=1e-12)
    ref = {**model, "attention": {**model["attention"], "backend": "reference"}}   # scores stored
    assert gpu_packing.training_memory(ref, 4, 2048) - want == pytest.approx(
        1.5 * 4 * 2048 * 2 * 5 * model["n_head"] * 2048 * n_layer, rel=1e-12)


def test_rule_order_and_explicit_numbers(tmp_path: Path) -> None:
    model = normalize_model({"preset": "tiny"})
    train = {"model": model, "train": {"batch_size": 8, "device": "auto"}, "data": {"block_size": 64}}
    resolve = gpu_packing.resolve
    assert resolve(uses_gpu=False, config=train, model=model, launcher="ray_task", gpu=H200)[0] == 0
    cpu = {**train, "train": {**train["train"], "device": "cpu"}}
    assert resolve(uses_gpu=True, config=cpu, model=model, launcher="ray_task", gpu=H200) == (0.0, "its device is cpu")
    assert resolve(uses_gpu=True, config=train, model=model, launcher="ray_task", gpu=None)[0] == 0
    assert resolve(uses_gpu=True, config=train, model=model, launcher="ray_train", gpu=H200)[0] == 1
    unknown = {"name": "X1", "memory_bytes": None}
    gpus, why = resolve(uses_gpu=True, config=train, model=model, launcher="ray_task", gpu=unknown)
    assert gpus == 1 and "PHASELAB_GPU_MEMORY_GB" in why
    gpus, why = resolve(uses_gpu=True, config=train, model=model, launcher="ray_task", gpu=H200)
    assert gpus == 0.25 and "4 per GPU" in why and "NVIDIA H200" in why
    assert not STAGES["dataset"].uses_gpu and not STAGES["noop"].uses_gpu and STAGES["eval"].uses_gpu
    explicit = STAGES["pretrain"].resources({"gpus": 1, "cpus": 2})
    assert not explicit.gpus_auto and STAGES["pretrain"].auto_gpus(explicit, train, model, "ray_task", H200) is explicit


def test_a_grid_without_gpus_packs_on_a_gpu_node(tmp_path: Path) -> None:
    dag = _dag(tmp_path)
    assert local_gpu() is None   # this CPU machine: the plan packed for no GPU
    assert {n.resources.gpus for n in dag.nodes.values()} == {0.0}
    node = {"CPU": 16.0, "GPU": 1.0, "memory": 100 * GIB, "accelerator_type:H200": 1.0}   # as ray.nodes() has it
    gpu = cluster_gpu([node, {"CPU": 8.0}])
    assert gpu["name"] == "H200" and gpu["memory_bytes"] == pytest.approx(140.4 * GIB)
    before = {h: n.resources for h, n in dag.nodes.items()}
    with_auto_gpus(dag.nodes, gpu)
    for h, n in dag.nodes.items():
        assert n.resources.gpus == 0.25 and n.resources.gpus_auto, (n.kind, n.resources)
        assert n.resources.cpus == before[h].cpus == 4
        assert STAGES[n.kind].demand(n.resources, n.config) == (4.0, 0.25)
    evals = [n for n in dag.nodes.values() if n.kind == "eval"]
    assert "estimated" in evals[0].resources.gpus_why        # sized by its upstream's model
    assert cluster_gpu([{"CPU": 4.0}]) is None


def test_explicit_gpus_win_and_hashes_do_not_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    auto = _dag(tmp_path)
    monkeypatch.setenv("PHASELAB_GPU_MEMORY_GB", "80")
    packed = _dag(tmp_path)
    one = _dag(tmp_path, overrides=("resources.gpus=1",))
    third = _dag(tmp_path, overrides=("stages.train.resources.gpus=0.3",))
    assert list(auto.nodes) == list(packed.nodes) == list(one.nodes) == list(third.nodes)
    assert {n.resources.gpus for n in packed.nodes.values()} == {0.25}
    assert {n.resources.gpus for n in one.nodes.values()} == {1.0}
    assert {(n.kind, n.resources.gpus) for n in third.nodes.values()} == {("pretrain", 0.3), ("eval", 0.25)}
    big = _dag(tmp_path, overrides=("model.d_model=2048", "model.n_head=16", "model.n_layer=12",
                                    "train.batch_size=32"))
    fractions = {n.kind: n.resources.gpus for n in big.nodes.values()}
    assert fractions["pretrain"] in (1.0, 0.5) and fractions["eval"] < 1.0


@pytest.mark.parametrize("value, message", [("lots", "gpus is 'auto' or a finite number"), ("-1", "gpus is 'auto'"),
                                            ("true", "gpus is 'auto'")])
def test_bad_gpus_are_named_at_their_line(tmp_path: Path, value: str, message: str) -> None:
    text = GRID.replace("resources: {cpus: 4, memory_gb: 16}", f"resources: {{cpus: 4, gpus: {value}}}")
    with pytest.raises(GridError) as err:
        _dag(tmp_path, text)
    assert "grid.yaml:8" in str(err.value) and "resources.gpus" in str(err.value) and message in str(err.value)


def test_plan_prints_the_resolved_fraction_and_why(tmp_path: Path) -> None:
    path = tmp_path / "grid.yaml"
    path.write_text(GRID)
    env = {"PHASELAB_GPU_MEMORY_GB": "140", "COLUMNS": "200", "PHASELAB_HOME": str(tmp_path)}
    res = CliRunner().invoke(app, ["plan", str(path)], env=env)
    out = " ".join(res.output.split())
    assert res.exit_code == 0, res.output
    # jsb-6l256 on the reference attention backend (its default), which keeps the scores
    assert "resources.gpus auto: 4 stage(s) get 0.25 GPU (~14.6 GiB estimated of the 140 GiB GPU: 4 per GPU" in out
    assert "resources.gpus auto: 4 stage(s) get 0.25 GPU (~4.1 GiB estimated" in out   # the evals
    assert "their kernels overlap only under CUDA MPS" in out
    res = CliRunner().invoke(app, ["plan", str(path), "--json"], env=env)
    import json

    stages = json.loads(res.output)["stages"]
    assert {(s["resources"]["gpus"], s["resources"]["gpus_auto"]) for s in stages} == {(0.25, True)}
