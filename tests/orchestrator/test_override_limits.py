"""Command-line overrides are input too: the grid files' limits hold for them (alias bombs, depth,
sizes), every refusal names the override and its key, booleans are not numbers, axis values are
unique, non-finite numbers are refused at their key, and any axis can be swept with typed values."""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import pytest
from _orchestrator_grids import BASE, locate
from typer.testing import CliRunner

from phaselab.orchestrator.cli.main import app
from phaselab.orchestrator.language import limits
from phaselab.orchestrator.language.yamlio import GridError
from phaselab.orchestrator.plan.dag import plan_grid

# 9 aliases of 9 aliases ... 9 levels deep: 9^9 = 387M strings from under 400 bytes
BOMB = "[" + ",".join(["&a0 [" + ",".join(["lol"] * 9) + "]"] + ["*a0"] * 8) + "]"
for _i in range(1, 9):
    BOMB = f"[&a{_i} {BOMB}," + ",".join([f"*a{_i}"] * 8) + "]"


def _grid(tmp_path: Path, text: str = BASE) -> Path:
    path = tmp_path / "g.yaml"
    path.write_text(text)
    return path


def _refused(path: Path, overrides: list[str]) -> GridError:
    """plan_grid must refuse ``overrides`` in under 2 s and 64 MiB."""
    start = time.monotonic()
    with pytest.raises(GridError) as info:
        plan_grid(path, overrides)
    assert time.monotonic() - start < 2.0
    tracemalloc.start()
    try:
        with pytest.raises(GridError):
            plan_grid(path, overrides)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, f"peak {peak >> 20} MiB"
    return info.value


@pytest.mark.parametrize("override", ["train.final_eval_splits={}", "+axes.product.zz={}", "model.x={}",
                                      "train.lr=1,{}"])
def test_an_alias_bomb_override_is_refused_with_its_text_and_key(tmp_path: Path, override: str) -> None:
    assert len(BOMB) < 1200
    text = override.format(BOMB)
    err = _refused(_grid(tmp_path), [text])
    issue = err.issues[0]
    assert "alias expansion" in issue.message
    assert issue.mark.file.startswith(f"<override {text[:100]!r}"[:-1]) and issue.mark.line == 0
    assert issue.key.startswith(override.split("=")[0].lstrip("+"))


def test_many_small_bombs_share_one_budget(tmp_path: Path) -> None:
    small = "[&b [" + ",".join(["x"] * 100) + "]," + ",".join(["*b"] * 99) + "]"   # ~10k nodes each
    overrides = [f"+x-{i}={small}" for i in range(12)]
    err = _refused(_grid(tmp_path), overrides)
    assert any(f"more than {limits.MAX_YAML_NODES} YAML nodes" in i.message for i in err.issues), err
    plan_grid(_grid(tmp_path), overrides[:5])   # under the budget: accepted


@pytest.mark.parametrize("override,key", [("model=" + "[" * 5000, "model.0.0"),
                                          ("model.x=" + "[" * 100 + "]" * 100, "model.x.0.0"),
                                          ("++x-a=" + "{a: " * 100 + "1" + "}" * 100, "x-a.a.a")])
def test_a_deep_override_is_refused_at_the_files_depth(tmp_path: Path, override: str, key: str) -> None:
    err = _refused(_grid(tmp_path), [override])
    issue = err.issues[0]
    assert f"nested deeper than {limits.MAX_YAML_DEPTH} levels" in issue.message
    assert issue.key.startswith(key) and issue.mark.file.startswith("<override '")
    assert len(str(issue.mark)) < 160   # the override's text is shortened, not printed whole


def test_overrides_that_are_too_long_or_too_wide(tmp_path: Path) -> None:
    path = _grid(tmp_path)
    err = _refused(path, ["description=" + "a" * (limits.MAX_SCALAR_CHARS + 1)])
    assert f"at most {limits.MAX_SCALAR_CHARS}" in err.issues[0].message and err.issues[0].key == "description"
    err = _refused(path, ["train.steps=" + "9" * 400])
    assert "no setting takes more than 32 digits" in err.issues[0].message
    assert err.issues[0].key == "train.steps"
    n = limits.MAX_SWEEP_VALUES + 1
    err = _refused(path, ["train.lr=" + ",".join(["1"] * n)])
    assert f"a sweep of {n} values" in err.issues[0].message


def test_the_cli_prints_a_message_not_a_traceback(tmp_path: Path) -> None:
    for override in ("model=" + "[" * 5000, "train.final_eval_splits=" + BOMB):
        res = CliRunner().invoke(app, ["plan", str(_grid(tmp_path)), override, "--json"])
        assert res.exit_code == 1, res.output
        assert "<override '" in res.output and "Traceback" not in res.output
        assert "RecursionError" not in res.output


@pytest.mark.parametrize("old,new,needle,key", [
    ("seeds: [0]", "seeds: [true]", "true", "seeds.0"),
    ("launcher: ray_task", "launcher: ray_task\n  resources: {num_workers: true}", "num_workers", "defaults.resources.num_workers"),
    ("launcher: ray_task", "launcher: ray_task\n  resources: {cpus: false}", "cpus", "defaults.resources.cpus"),
])
def test_a_boolean_is_not_a_number(tmp_path: Path, old: str, new: str, needle: str, key: str) -> None:
    text = BASE.replace(old, new)
    path = _grid(tmp_path, text)
    with pytest.raises(GridError) as info:
        plan_grid(path)
    (issue,) = info.value.issues
    assert issue.key == key and "a boolean is not a number" in issue.message
    assert (issue.mark.file, issue.mark.line, issue.mark.column) == (str(path), *locate(text, needle))
    with pytest.raises(GridError, match="<override 'seeds=\\[true\\]'>: seeds.0: a boolean is not a number"):
        plan_grid(_grid(tmp_path), ["seeds=[true]"])


def test_an_axis_value_listed_twice_is_refused_at_the_second(tmp_path: Path) -> None:
    text = BASE.replace("pe: [rope, pope]", "pe: [rope, pope, rope]")
    path = _grid(tmp_path, text)
    with pytest.raises(GridError) as info:
        plan_grid(path)
    (issue,) = info.value.issues
    assert issue.key == "axes.product.pe.2" and "'rope' is listed twice (also at index 0)" in issue.message
    assert (issue.mark.line, issue.mark.column) == locate(text, "rope]")
    with pytest.raises(GridError) as info:
        plan_grid(_grid(tmp_path), ["train.lr=1e-3,3e-3,1e-3"])
    assert str(info.value.issues[0].mark) == "<override 'train.lr=1e-3,3e-3,1e-3'>"
    assert info.value.issues[0].key == "axes.product.train.lr.2"
    assert len(plan_grid(_grid(tmp_path), ["+axes.product.flag=[true,1]"]).cells) == 4   # not the same value


def test_a_zip_may_repeat_a_value_but_not_a_tuple(tmp_path: Path) -> None:
    """In a zip the cells are the tuples: (rope, 6), (pope, 6) are two cells; (rope, 6) twice is one."""
    grid = BASE.replace("  product:\n    pe: [rope, pope]", "  zip:\n    - {pe: [rope, pope], n: [6, 6]}")
    assert grid != BASE
    assert len(plan_grid(_grid(tmp_path, grid)).cells) == 2
    twice = grid.replace("{pe: [rope, pope], n: [6, 6]}", "{pe: [rope, pope, rope], n: [6, 6, 6]}")
    with pytest.raises(GridError, match=r"axes.zip.0.2: value \['rope', 6\] is listed twice \(also at index 0\)"):
        plan_grid(_grid(tmp_path, twice))


@pytest.mark.parametrize("old,new,needle,key,fragment", [
    ("steps: 2,", "steps: 2, lr: .inf,", ".inf", "defaults.train.lr", "must be finite, got inf"),
    ("batch_size: 2,", "batch_size: 0,", "batch_size", "defaults.train.batch_size", "batch size must be in [1,"),
    ("launcher: ray_task", "launcher: ray_task\n  resources: {gpus: .nan}", "gpus", "defaults.resources.gpus", "finite"),
])
def test_bad_numbers_are_refused_at_their_key(tmp_path: Path, old: str, new: str, needle: str, key: str,
                                              fragment: str) -> None:
    text = BASE.replace(old, new)
    path = _grid(tmp_path, text)
    with pytest.raises(GridError) as info:
        plan_grid(path)
    issue = next(i for i in info.value.issues if fragment in i.message)
    assert issue.key == key
    assert (issue.mark.file, issue.mark.line) == (str(path), locate(text, needle)[0])
    assert f"{path}:{issue.mark.line}:" in str(info.value)


def test_a_nan_override_names_the_override_and_key(tmp_path: Path) -> None:
    with pytest.raises(GridError) as info:
        plan_grid(_grid(tmp_path), ["train.lr=.nan"])
    (issue,) = info.value.issues
    assert (str(issue.mark), issue.key) == ("<override 'train.lr=.nan'>", "defaults.train.lr")
    assert "must be finite, got nan" in issue.message


def test_a_directory_is_reported_as_a_directory(tmp_path: Path) -> None:
    folder = tmp_path / "grid.yaml"
    folder.mkdir()
    for source in (folder, tmp_path):
        with pytest.raises(IsADirectoryError, match="is a directory"):
            plan_grid(source)
    res = CliRunner().invoke(app, ["plan", str(folder), "--json"])
    assert res.exit_code == 1 and "is a directory" in res.output and "does not exist" not in res.output


def test_errors_from_an_installed_grid_name_the_override(tmp_path: Path) -> None:
    with pytest.raises(GridError) as info:
        plan_grid("quickstart", ["train.steps=many"])
    (issue,) = info.value.issues
    assert str(issue.mark) == "<override 'train.steps=many'>" and issue.key == "defaults.train.steps"
    assert "grids/quickstart.yaml" not in str(info.value)


LR_AXIS = BASE.replace("pe: [rope, pope]", "pe: [rope, pope]\n    lr: [1.0e-3]").replace(
    "steps: 2,", "steps: 2, lr: \"${lr}\",")


@pytest.mark.parametrize("override", ["lr=[3e-3,1e-2]", "lr=3e-3,1e-2", "train.lr=3e-3,1e-2",
                                      "axes.product.lr=[3e-3,1e-2]"])
def test_a_grid_axis_is_swept_from_the_command_line_with_typed_values(tmp_path: Path, override: str) -> None:
    dag = plan_grid(_grid(tmp_path, LR_AXIS), [override])
    assert [c.key for c in dag.cells] == ["pe=rope,lr=0.003,seed=0", "pe=rope,lr=0.01,seed=0",
                                          "pe=pope,lr=0.003,seed=0", "pe=pope,lr=0.01,seed=0"]
    assert sorted({n.config["train"]["lr"] for n in dag.nodes.values() if n.kind == "pretrain"}) == [3e-3, 1e-2]


def test_typed_lists_and_axis_short_forms(tmp_path: Path) -> None:
    path = _grid(tmp_path)
    assert [c.key for c in plan_grid(path, ["pe=pope"]).cells] == ["pe=pope,seed=0"]
    assert [c.key for c in plan_grid(path, ["seed=3,4", "pe=[rope]"]).cells] == ["pe=rope,seed=3", "pe=rope,seed=4"]
    dag = plan_grid(path, ["+axes.product.lr=[3e-3,1e-2]", "train.lr=${lr}"])
    assert [c.axes["lr"] for c in dag.cells][:2] == [3e-3, 1e-2]
    with pytest.raises(GridError) as info:   # a list where a number goes: the floats are typed
        plan_grid(path, ["train.lr=[3e-3,1e-2]"])
    assert "got list [0.003, 0.01]" in str(info.value)
