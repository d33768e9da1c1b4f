"""The shipped grids validate and plan offline; experiments/ mirrors the packaged copies;
importing the orchestrator stays light."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from phaselab.orchestrator.language.library import grids_dir, resolve_grid_path, shipped_grids
from phaselab.orchestrator.plan.dag import plan_grid

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = {  # grid -> (cells, stages by kind)
    "quickstart": (3, {"pretrain": 3, "finetune": 1, "eval": 4}),
    "pope_indirect_indexing": (18, {"pretrain": 18, "eval": 18}),
    "pope_jsb": (6, {"pretrain": 6, "eval": 6}),
    "pope_maestro": (6, {"pretrain": 6, "eval": 6}),
    "pope_genome": (6, {"pretrain": 6, "eval": 6}),
    "pope_owt_extrapolation": (6, {"pretrain": 6, "finetune": 6, "eval": 24, "analysis": 6}),
    "pope_owt_ablation": (8, {"pretrain": 8, "eval": 8}),
    "tapa_long_context": (2, {"pretrain": 2, "cpt": 5, "eval": 13}),
    "tapa_phase": (2, {"pretrain": 2, "cpt": 2, "eval": 2}),
    "extrapolation_small": (3, {"pretrain": 3, "finetune": 2, "eval": 6}),
    "tapa_long_context_small": (8, {"pretrain": 8, "cpt": 14, "eval": 40}),
}


def test_every_experiment_is_shipped_and_identical() -> None:
    assert shipped_grids() == sorted(EXPECTED)
    for name in EXPECTED:
        user, packaged = ROOT / "experiments" / f"{name}.yaml", grids_dir() / f"{name}.yaml"
        assert user.read_bytes() == packaged.read_bytes(), name
        assert resolve_grid_path(name) == packaged


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_shipped_grid_plans_offline(name: str) -> None:
    dag = plan_grid(name)
    cells, kinds = EXPECTED[name]
    assert len(dag.cells) == cells
    got: dict[str, int] = {}
    for node in dag.nodes.values():
        got[node.kind] = got.get(node.kind, 0) + 1
    assert got == kinds


def test_paper_grid_details() -> None:
    owt = plan_grid("pope_owt_extrapolation")
    yarn = [n for n in owt.nodes.values() if n.name == "yarn_4k"]
    assert len(yarn) == 3 and all(n.config["extend"]["rule"] == "yarn" and n.config["extend"]["factor"] == 4.0
                                  for n in yarn)
    ppl = next(n for n in owt.nodes.values() if n.name == "ppl_zero_shot")
    assert ppl.config["eval"]["ppl"]["lengths"][-1] == 10240
    assert ppl.key.parts["data"]["eval_data"].startswith("declared:")   # PG-19 is not read offline
    tapa = plan_grid("tapa_long_context")
    lrs = {n.members[0][0].split(",")[0]: n.config["train"]["lr"] for n in tapa.nodes.values() if n.kind == "pretrain"}
    assert lrs == {"pe=rope": 1e-4, "pe=tapa": 2e-5}
    niah = next(n for n in tapa.nodes.values() if n.name == "niah_tapa")
    assert niah.config["eval"]["niah"]["lengths"][-1] == 65536


def test_unknown_grid_name_suggests() -> None:
    with pytest.raises(FileNotFoundError, match="did you mean 'quickstart'"):
        resolve_grid_path("quickstrat")


def test_orchestrator_imports_stay_light() -> None:
    code = ("import sys; import phaselab.orchestrator.cli.main, phaselab.orchestrator.plan.dag, phaselab.orchestrator.engine.controller, "
            "phaselab.orchestrator.cli.views; bad = [m for m in ('torch', 'ray', 'mlflow', 'triton', 'sqlalchemy') "
            "if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def test_planning_every_shipped_grid_imports_no_torch() -> None:
    """Planning converts every section through its config class (stages/base.py's normalize_*),
    and those classes live in torch-free modules (workloads/train/config.py,
    workloads/evals/options.py, the model and data configs): `phaselab plan` and the controller's
    planning never pay torch's import (about 1.3 s on 2 cores)."""
    code = ("import sys; from phaselab.orchestrator.plan.dag import plan_grid; "
            f"[plan_grid(name) for name in {sorted(EXPECTED)!r}]; print(sorted(m for m in ('torch', 'triton') "
            "if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip() == "[]", res.stdout
