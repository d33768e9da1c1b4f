"""Hostile grids: every one is refused quickly, in little memory, with a message that names the
file, the line and the key. Each case runs under a time budget (2 s) and a tracemalloc peak."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _orchestrator_grids import BASE, locate

from phaselab.orchestrator.language import limits
from phaselab.orchestrator.language.expand import check_size, expand_cells, resolve_cell
from phaselab.orchestrator.language.spec import validate_spec
from phaselab.orchestrator.language.yamlio import GridError, Marks, load_yaml, load_yaml_file
from phaselab.orchestrator.plan.dag import plan_grid

BUDGET_S = 2.0
BUDGET_BYTES = 64 << 20


def _bounded(fn: Callable[[], Any]) -> GridError:
    """Run ``fn``, which must raise GridError, within the time budget; then once more under
    tracemalloc (which slows Python several times over, so it is not timed) for the memory peak."""
    start = time.monotonic()
    with pytest.raises(GridError) as info:
        fn()
    seconds = time.monotonic() - start
    assert seconds < BUDGET_S, f"took {seconds:.2f} s"
    tracemalloc.start()
    try:
        with pytest.raises(GridError):
            fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < BUDGET_BYTES, f"peak {peak >> 20} MiB"
    return info.value


def _write(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "hostile.yaml"
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def _plan_text(text: str, file: str = "g.yaml") -> None:
    """Load, validate, count, expand and resolve ``text`` as the planner does."""
    doc, marks = load_yaml(text, file=file)
    spec = validate_spec(doc, marks)
    for cell in expand_cells(spec, marks):
        resolve_cell(spec, cell, marks)


def _bomb(levels: int = 9, width: int = 9, under: str = "x-") -> str:
    """A billion-laughs document: ``width ** levels`` strings from a few hundred bytes."""
    lines = [f"{under}l0: &l0 [" + ", ".join(["lol"] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"{under}l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n" + BASE


@pytest.mark.parametrize("under", ["x-", "description_"])
def test_alias_bomb_is_refused_before_expansion(tmp_path: Path, under: str) -> None:
    text = _bomb(under=under)
    assert len(_bomb(under=under).split("grid:")[0]) < 1000
    path = _write(tmp_path, text)
    err = _bounded(lambda: plan_grid(path))
    issue = err.issues[0]
    assert "alias expansion" in issue.message
    assert issue.mark.file == str(path)
    key = issue.key.split(".")[0]
    assert key.startswith(under)
    line, _ = locate(text, f"{key}: &")
    assert issue.mark.line == line
    assert f"{path}:{line}:" in str(err)


def test_recursive_alias_is_refused(tmp_path: Path) -> None:
    text = BASE + "x-loop: &loop [*loop]\n"
    err = _bounded(lambda: plan_grid(_write(tmp_path, text)))
    assert err.issues[0].key == "x-loop.0"
    assert err.issues[0].mark.line == locate(text, "x-loop")[0]
    assert "refers to itself" in err.issues[0].message


@pytest.mark.parametrize("style", ["flow", "block"])
def test_20000_deep_nesting_is_a_clean_error(tmp_path: Path, style: str) -> None:
    deep = "[" * 20_000 + "]" * 20_000 if style == "flow" else "\n" + "- " * 20_000 + "x"
    text = BASE + f"x-deep: {deep}\n"
    path = _write(tmp_path, text)
    err = _bounded(lambda: plan_grid(path))
    issue = err.issues[0]
    assert f"nested deeper than {limits.MAX_YAML_DEPTH} levels" in issue.message
    assert issue.key.startswith("x-deep.0.0")
    assert issue.mark.file == str(path)
    assert issue.mark.line == locate(text, "x-deep")[0] + (style == "block")


def test_oversized_file_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = _write(tmp_path, BASE + "x-pad: '" + "a" * (limits.MAX_YAML_BYTES + 10) + "'\n")
    err = _bounded(lambda: load_yaml_file(path))
    assert f"over the limit of {limits.MAX_YAML_BYTES} bytes" in err.issues[0].message
    assert str(err).startswith(f"invalid grid:\n  {path}:1:1:")


@pytest.mark.parametrize("payload,line", [
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", 1),
    (BASE.encode() + b"description: caf\xe9\n", BASE.count("\n") + 1),
    (b"grid: t\nx: \x00\n", 2),
])
def test_binary_or_latin1_file_names_the_file_and_line(tmp_path: Path, payload: bytes, line: int) -> None:
    path = _write(tmp_path, payload)
    err = _bounded(lambda: load_yaml_file(path))
    issue = err.issues[0]
    assert "not a UTF-8 text file" in issue.message
    assert (issue.mark.file, issue.mark.line) == (str(path), line)
    assert f"{path}:{line}:" in str(err)


def test_400_digit_steps_is_refused_at_its_key(tmp_path: Path) -> None:
    text = BASE.replace("steps: 2,", "steps: " + "9" * 400 + ",")
    path = _write(tmp_path, text)
    err = _bounded(lambda: plan_grid(path))
    issue = err.issues[0]
    assert issue.key == "defaults.train.steps"
    assert (issue.mark.file, issue.mark.line, issue.mark.column) == (str(path), *locate(text, "9" * 400))
    assert "400 characters" in issue.message


@pytest.mark.parametrize("old,new,needle,key,fragment", [
    ("steps: 2,", f"steps: {limits.MAX_STEPS + 1},", "steps:", "defaults.train.steps", "step count must be in"),
    ("batch_size: 2,", f"batch_size: {limits.MAX_BATCH + 1},", "batch_size:", "defaults.train.batch_size",
     "batch size must be in"),
    ("lengths: [32]", f"lengths: [32, {limits.MAX_LENGTH * 4}]", "lengths:", "stages.ppl.eval.ppl.lengths",
     "length in tokens"),
    ("steps: 2,", "steps: 2, seed: -1,", "seed: -1", "defaults.train.seed", "seed must be in"),
    ("seeds: [0]", f"seeds: [0, {limits.MAX_SEED + 1}]", str(limits.MAX_SEED + 1), "seeds.1", "seed must be in"),
])
def test_numbers_outside_their_documented_range(old: str, new: str, needle: str, key: str, fragment: str) -> None:
    text = BASE.replace(old, new)
    err = _bounded(lambda: _plan_text(text))
    issue = next(i for i in err.issues if fragment in i.message)
    assert issue.key == key
    assert (issue.mark.file, issue.mark.line, issue.mark.column) == ("g.yaml", *locate(text, needle))


def test_numbers_at_their_maximum_pass() -> None:
    text = BASE.replace("steps: 2,", f"steps: {limits.MAX_STEPS}, seed: {limits.MAX_SEED},")
    _plan_text(text)


def test_a_million_seeds_is_refused_before_planning() -> None:
    doc, marks = load_yaml(BASE, file="g.yaml")
    doc["seeds"] = list(range(10**6))
    err = _bounded(lambda: _plan_text_doc(doc, marks))
    issue = err.issues[0]
    assert issue.key == "seeds"
    assert (issue.mark.file, issue.mark.line) == ("g.yaml", locate(BASE, "seeds:")[0])
    assert f"1000000 seeds; at most {limits.MAX_SEEDS}" in issue.message


def _plan_text_doc(doc: dict, marks: Marks) -> None:
    spec = validate_spec(doc, marks)
    for cell in expand_cells(spec, marks):
        resolve_cell(spec, cell, marks)


def test_a_2_56m_cell_product_is_refused_before_any_cell_exists() -> None:
    axes = "".join(f"\n    a{i}: [{', '.join(map(str, range(40)))}]" for i in range(4))   # 40^4 = 2.56M
    text = BASE.replace("pe: [rope, pope]", "pe: [rope]" + axes)
    err = _bounded(lambda: _plan_text(text))
    issue = err.issues[0]
    assert issue.key == "axes"
    assert (issue.mark.file, issue.mark.line) == ("g.yaml", locate(text, "axes:")[0])
    assert f"2560000 cells (axes x seeds); at most {limits.MAX_CELLS}" in issue.message


def test_axis_with_too_many_values_is_refused_at_its_key() -> None:
    n = limits.MAX_SWEEP_VALUES + 1
    text = BASE.replace("pe: [rope, pope]", f"pe: [rope]\n    lr: [{', '.join(map(str, range(n)))}]")
    err = _bounded(lambda: _plan_text(text))
    issue = next(i for i in err.issues if "values; an axis takes at most" in i.message)
    assert issue.key == "axes.product.lr"
    assert issue.mark.line == locate(text, "lr: [")[0]


def test_cell_and_stage_maxima_can_be_raised_explicitly(monkeypatch: pytest.MonkeyPatch) -> None:
    doc, marks = load_yaml(BASE, file="g.yaml")
    spec = validate_spec(doc, marks)
    assert check_size(spec, marks) == 2
    with pytest.raises(GridError, match="the grid has 2 cells"):
        check_size(spec, marks, max_cells=1)
    with pytest.raises(GridError, match=r"2 cells x 2 stages = 4 stage instances; at most 3"):
        check_size(spec, marks, max_stages=3)
    monkeypatch.setenv(limits.CELLS_ENV, "1")
    with pytest.raises(GridError, match="PHASELAB_MAX_CELLS"):
        expand_cells(spec, marks)
    monkeypatch.setenv(limits.CELLS_ENV, "2")
    assert len(expand_cells(spec, marks)) == 2
    monkeypatch.setenv(limits.CELLS_ENV, "many")
    with pytest.raises(ValueError, match="PHASELAB_MAX_CELLS='many'"):
        limits.max_cells()


def test_deep_grid_through_the_cli_prints_a_message_not_a_traceback(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from phaselab.orchestrator.cli.main import app

    path = _write(tmp_path, BASE + "x-deep: " + "[" * 20_000 + "]" * 20_000 + "\n")
    res = CliRunner().invoke(app, ["plan", str(path), "--json"])
    assert res.exit_code == 1, res.output
    assert "nested deeper than" in res.output and str(path) in res.output
    assert "Traceback" not in res.output and "RecursionError" not in res.output


@pytest.mark.parametrize("payload", [b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR",
                                     BASE.encode() + b"description: caf\xe9\n"])
def test_binary_or_latin1_file_through_plan_names_the_file(tmp_path: Path, payload: bytes) -> None:
    from typer.testing import CliRunner

    from phaselab.orchestrator.cli.main import app

    path = _write(tmp_path, payload)
    err = _bounded(lambda: plan_grid(path))
    assert err.issues[0].mark.file == str(path)
    res = CliRunner().invoke(app, ["plan", str(path), "--json"])
    assert res.exit_code == 1, res.output
    assert str(path) in res.output and "not a UTF-8 text file" in res.output
    assert "Traceback" not in res.output and "UnicodeDecodeError" not in res.output


def test_a_2_56m_cell_grid_through_plan_names_the_file(tmp_path: Path) -> None:
    axes = "".join(f"\n    a{i}: [{', '.join(map(str, range(40)))}]" for i in range(4))
    text = BASE.replace("pe: [rope, pope]", "pe: [rope]" + axes)
    path = _write(tmp_path, text)
    err = _bounded(lambda: plan_grid(path))
    issue = err.issues[0]
    assert (issue.mark.file, issue.mark.line, issue.key) == (str(path), locate(text, "axes:")[0], "axes")
    assert f"{path}:{issue.mark.line}:" in str(err)
    assert "2560000 cells" in issue.message


def test_huge_range_override_is_refused_before_it_is_built(tmp_path: Path) -> None:
    path = _write(tmp_path, BASE)
    err = _bounded(lambda: plan_grid(path, ["defaults.train.lr=range(0,100000000)"]))
    issue = err.issues[0]
    assert "range(0,100000000) has 100000000 values" in issue.message
    assert f"at most {limits.MAX_SWEEP_VALUES}" in issue.message
    assert "defaults.train.lr=range(0,100000000)" in str(err)
    with pytest.raises(GridError, match="step must not be 0"):
        plan_grid(path, ["defaults.train.lr=range(0,5,0)"])
    n = limits.MAX_SWEEP_VALUES
    with pytest.raises(GridError, match=f"the grid has {2 * n} cells"):   # the limit itself passes the sweep
        plan_grid(path, [f"defaults.train.seed=range(0,{n})"])


def _cli_json(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict]:
    import json

    from typer.testing import CliRunner

    from phaselab.orchestrator.cli.main import app

    res = CliRunner().invoke(app, [*args, "--json"], env=env)
    assert "Traceback" not in res.output, res.output
    return res.exit_code, json.loads(res.stdout)


@pytest.mark.parametrize("verb", [["status", "t"], ["retry", "t", "--failed"], ["resume", "t"]])
def test_verbs_without_a_catalog_print_a_message(tmp_path: Path, verb: list[str]) -> None:
    missing = f"sqlite:///{tmp_path / 'none' / 'catalog.db'}"
    code, out = _cli_json(*verb, "--catalog", missing)
    assert code == 1 and out["error"] == (f"there is no catalog at {tmp_path / 'none' / 'catalog.db'} "
                                          "(named by --catalog) (run `phaselab run t` first)")
    empty = tmp_path / "empty.db"
    empty.touch()   # a file without the schema
    code, out = _cli_json(*verb, "--catalog", f"sqlite:///{empty}")
    assert code == 1 and out["error"].startswith(f"cannot read the catalog at sqlite:///{empty}: no such table")


def test_mlflow_on_a_public_host_is_a_message(tmp_path: Path) -> None:
    code, out = _cli_json("mlflow", "--host", "0.0.0.0", "--catalog", f"sqlite:///{tmp_path / 'c.db'}")
    assert code == 1 and out == {"ok": False, "error": "host '0.0.0.0' is not a loopback address; pass "
                                 "allow_remote=True to expose an unauthenticated MLflow server"}


def test_max_cells_flag_raises_the_cell_maximum_for_one_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(limits.CELLS_ENV, "1")
    path = _write(tmp_path, BASE)
    code, out = _cli_json("plan", str(path))
    assert code == 1 and "the grid has 2 cells" in out["error"] and "--max-cells" in out["error"]
    code, out = _cli_json("plan", str(path), "--max-cells", "2")
    assert code == 0 and len(out["cells"]) == 2


def test_sync_tracking_reports_what_is_still_pending(tmp_path: Path) -> None:
    import socket

    from phaselab.catalog.tracking.mlflow_tracker import MlflowTracker

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    runs = tmp_path / "runs"
    t = MlflowTracker(tracking_uri=dead, experiment="t", run_name="r", spool_path=runs / "_mlflow_spool" / "a.jsonl")
    t.log_metrics({"loss": 1.0}, step=1)
    t.end("FINISHED")
    args = ("sync-tracking", "--catalog", f"sqlite:///{tmp_path / 'c.db'}", "--runs-root", str(runs))
    code, out = _cli_json(*args, env={"MLFLOW_TRACKING_URI": dead})
    assert code == 1 and out["pending"] == {"a.jsonl": 3} and out["pending_calls"] == 3
    code, out = _cli_json(*args, env={"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"})
    assert code == 0 and out["pending"] == {} and out["spools"] == 1
    assert not (runs / "_mlflow_spool" / "a.jsonl").exists()
