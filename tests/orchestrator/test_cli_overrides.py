"""Overrides that address the stage config (``train.steps`` = the defaults, ``STAGE.train.steps``
= one stage), grid errors reported all at once, ``when`` values checked against their axis, and
error text shown with its brackets."""

from __future__ import annotations

from pathlib import Path

import pytest
from _orchestrator_grids import BASE
from typer.testing import CliRunner

from phaselab.orchestrator.cli.main import app
from phaselab.orchestrator.language.yamlio import GridError
from phaselab.orchestrator.plan.dag import plan_grid

WITH_FT = BASE + """\
  ft:
    kind: finetune
    needs: [pretrain]
    when: {pe: rope}
    train: {steps: 3}
"""


def _grid(tmp_path: Path, text: str = WITH_FT) -> Path:
    path = tmp_path / "g.yaml"
    path.write_text(text)
    return path


def _steps(dag) -> dict[str, int]:
    return {n.label: n.config["train"]["steps"] for n in dag.nodes.values() if "train" in n.config}


def test_a_section_key_means_the_defaults_and_a_stage_name_one_stage(tmp_path: Path) -> None:
    grid = _grid(tmp_path)
    assert _steps(plan_grid(grid, ["train.steps=7"])) == {
        "pretrain[pe=rope,seed=0]": 7, "pretrain[pe=pope,seed=0]": 7,
        "ft[pe=rope,seed=0]": 3}                     # a value the stage sets itself wins
    assert _steps(plan_grid(grid, ["ft.train.steps=5"])) == {
        "pretrain[pe=rope,seed=0]": 2, "pretrain[pe=pope,seed=0]": 2, "ft[pe=rope,seed=0]": 5}
    # the short and the full form give the same stages (same hashes)
    assert set(plan_grid(grid, ["train.steps=7", "ft.train.steps=5"]).nodes) == set(
        plan_grid(grid, ["defaults.train.steps=7", "stages.ft.train.steps=5"]).nodes)
    dag = plan_grid(grid, ["model.pe.rope.base=500"])
    assert {n.config["model"]["pe"]["rope"]["base"] for n in dag.nodes.values() if n.kind == "pretrain"} == {500.0}


def test_a_short_sweep_is_an_axis_named_as_typed(tmp_path: Path) -> None:
    dag = plan_grid(_grid(tmp_path), ["train.lr=1e-3,3e-3"])
    assert [c.key for c in dag.cells] == ["pe=rope,train.lr=0.001,seed=0", "pe=rope,train.lr=0.003,seed=0",
                                          "pe=pope,train.lr=0.001,seed=0", "pe=pope,train.lr=0.003,seed=0"]
    lrs = sorted(n.config["train"]["lr"] for n in dag.nodes.values() if n.kind == "pretrain")
    assert lrs == [1e-3, 1e-3, 3e-3, 3e-3]


def test_a_section_name_wins_over_a_stage_of_that_name(tmp_path: Path) -> None:
    grid = _grid(tmp_path, BASE.replace("  pretrain:\n    kind: pretrain", "  train:\n    kind: pretrain")
                 .replace("needs: [pretrain]", "needs: [train]"))
    assert set(_steps(plan_grid(grid, ["train.steps=9"])).values()) == {9}
    assert set(_steps(plan_grid(grid, ["stages.train.train.steps=4"])).values()) == {4}


def test_every_override_problem_in_one_error(tmp_path: Path) -> None:
    with pytest.raises(GridError) as info:
        plan_grid(_grid(tmp_path), ["trian.steps=3", "defaults.train.steps", "grid=a,b"])
    shown = [str(i.mark) for i in info.value.issues]
    assert shown == ["<override 'trian.steps=3'>", "<override 'defaults.train.steps'>", "<override 'grid=a,b'>"]
    assert info.value.issues[0].suggestion == "train"


def test_config_errors_of_several_stages_in_one_error(tmp_path: Path) -> None:
    text = WITH_FT.replace("train: {steps: 3}", "train: {stepz: 3}").replace(
        "eval: {suite: ppl-by-length, ppl: {lengths: [32]}, device: cpu}",
        "eval: {suite: ppl-by-length, ppl: {lenghts: [32]}, device: cpu}")
    with pytest.raises(GridError) as info:
        plan_grid(_grid(tmp_path, text), ["model.n_layr=1"])
    keys = sorted(i.key for i in info.value.issues)
    assert keys == ["defaults.model.n_layr", "stages.ft.train.stepz", "stages.ppl.eval.ppl.lenghts"], info.value
    model = next(i for i in info.value.issues if i.key == "defaults.model.n_layr")
    assert model.suggestion == "n_layer" and "(and 1 more cells)" in model.message   # rope and pope: one line


def test_a_when_value_no_cell_takes_is_an_error_with_the_nearest_value(tmp_path: Path) -> None:
    grid = _grid(tmp_path, WITH_FT.replace("when: {pe: rope}", "when: {pe: ropee}"))
    with pytest.raises(GridError) as info:
        plan_grid(grid)
    (issue,) = info.value.issues
    assert issue.key == "stages.ft.when.pe" and issue.suggestion == "rope"
    assert str(issue.mark) == f"{grid}:{WITH_FT.splitlines().index('    when: {pe: rope}') + 1}:12"
    assert "never takes the value 'ropee'" in issue.message
    with pytest.raises(GridError, match="stages.ft.when.seed.1"):
        plan_grid(_grid(tmp_path, WITH_FT.replace("when: {pe: rope}", "when: {seed: [0, 7]}")))
    # narrowing the axis on the command line drops the stage on purpose: no error
    dag = plan_grid(_grid(tmp_path), ["axes.product.pe=[pope]"])
    assert sorted(n.name for n in dag.nodes.values()) == ["ppl", "pretrain"]


def test_error_text_keeps_its_brackets(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["why", "pretrain[pe=alibi,seed=0]", "--grid", str(_grid(tmp_path))])
    assert res.exit_code == 1
    assert "no stage 'pretrain[pe=alibi,seed=0]' in grid t" in res.output


def test_version_and_shipped_grids() -> None:
    from phaselab import __version__

    res = CliRunner().invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == f"phaselab {__version__}"
    res = CliRunner().invoke(app, ["grids", "--json"])
    import json

    rows = {r["name"]: r for r in json.loads(res.output)["grids"]}
    assert rows["quickstart"]["cells"] == 3 and rows["quickstart"]["stages"] == 4
    assert rows["pope_jsb"]["cells"] == 6
    assert Path(rows["quickstart"]["path"]).is_file()
