"""`phaselab train CONFIG.yaml [key=value ...]`: one training stage outside the
orchestrator, on the tiny preset on the CPU. Resume must reproduce the uninterrupted run; bad keys
must name the file and line (or the override) like the grid loader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from phaselab.orchestrator.cli.main import app

ROOT = Path(__file__).resolve().parents[2]

CONFIG = """\
model:
  preset: tiny
  block_size: 32
data:
  kind: text
  block_size: 32
train:
  steps: 6
  batch_size: 4
  lr: 1.0e-3
  schedule: constant
  warmup: 2
  eval_every: 0
  eval_batches: 1
  final_eval_batches: 2
  ckpt_every: 3
  log_every: 1
  device: cpu
"""


@pytest.fixture(autouse=True)
def _in_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test runs with tmp_path as the project folder (out_dir must lie inside it)."""
    monkeypatch.chdir(tmp_path)


def _cli(*args: str) -> tuple[int, dict | str]:
    res = CliRunner().invoke(app, ["train", *args, "--json"])
    try:
        return res.exit_code, json.loads(res.output)
    except json.JSONDecodeError:
        return res.exit_code, res.output


def test_rerun_with_same_out_dir_resumes_like_the_uninterrupted_run(tmp_path: Path) -> None:
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(CONFIG)
    code, full = _cli(str(cfg), f"out_dir={tmp_path / 'full'}")
    assert code == 0, full
    assert full["resumed_from_step"] == 0 and full["metrics"]["step"] == 6

    # 3 steps, then the same out_dir asked for 6: the second call starts at the step-3 checkpoint.
    # (The constant schedule makes the learning rate independent of train.steps.)
    split = f"out_dir={tmp_path / 'split'}"
    code, first = _cli(str(cfg), split, "train.steps=3")
    assert code == 0, first
    assert first["metrics"]["step"] == 3
    code, second = _cli(str(cfg), split)
    assert code == 0, second
    assert second["resumed_from_step"] == 3 and second["metrics"]["step"] == 6
    assert Path(second["checkpoint"]).is_file()
    assert Path(second["checkpoint"]).parent.name == "step_0000006"
    for key in ("train/loss", "valid/loss", "valid/acc"):   # bitwise on the CPU (api.py docstring)
        assert second["metrics"][key] == full["metrics"][key], key
    assert full["metrics"]["train/loss"] != first["metrics"]["train/loss"]   # it did train on

    # A finished run only re-evaluates: same step, same numbers, nothing trained.
    code, again = _cli(str(cfg), split)
    assert code == 0, again
    assert again["resumed_from_step"] == 6 and again["metrics"]["valid/loss"] == second["metrics"]["valid/loss"]


def test_override_sets_a_field_the_yaml_leaves_at_its_default(tmp_path: Path) -> None:
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(CONFIG)
    out = tmp_path / "pope"
    code, got = _cli(str(cfg), f"out_dir={out}", "train.steps=1", "model.pe.kind=pope", "train.seed=3")
    assert code == 0, got
    spec = json.loads((out / "checkpoints" / "step_0000001" / "spec.json").read_text())
    assert spec["model"]["pe"]["kind"] == "pope" and spec["train"]["seed"] == 3
    assert spec["model"]["n_layer"] == 2 and spec["model"]["d_model"] == 128   # from the preset


def test_unknown_keys_name_file_line_or_override(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(CONFIG.replace("  warmup: 2\n", "  wamup: 2\n"))
    line = CONFIG.splitlines().index("  warmup: 2") + 1
    code, got = _cli(str(bad), f"out_dir={tmp_path / 'x'}")
    assert code == 1 and got["ok"] is False
    assert f"{bad}:{line}:3: train.wamup: unknown key" in got["error"]
    assert "did you mean 'warmup'?" in got["error"]
    assert not (tmp_path / "x").exists()   # nothing ran

    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(CONFIG)
    code, got = _cli(str(cfg), "train.lrr=1")
    assert code == 1 and "<override 'train.lrr=1'>: train.lrr: unknown key" in got["error"]
    assert "did you mean 'lr'?" in got["error"]

    code, got = _cli(str(cfg), "trian.steps=1")
    assert code == 1 and "<override 'trian.steps=1'>: trian: unknown key 'trian'" in got["error"]
    assert "did you mean 'train'?" in got["error"]

    top = tmp_path / "top.yaml"
    top.write_text(CONFIG + "outdir: /tmp/x\n")
    code, got = _cli(str(top))
    assert code == 1 and f"{top}:{len(CONFIG.splitlines()) + 1}:1: outdir: unknown key" in got["error"]
    assert "did you mean 'out_dir'?" in got["error"]

    code, got = _cli(str(cfg), "model.preset=tiy")
    assert code == 1 and "did you mean 'tiny'?" in got["error"]
    code, got = _cli(str(tmp_path / "missing.yaml"))
    assert code == 2 and got["error"] == f"training config '{tmp_path / 'missing.yaml'}' does not exist; expected a file"
    code, got = _cli(str(tmp_path))
    assert code == 2 and got["error"] == f"training config '{tmp_path}' is a folder; expected a file"


def _refused(*args: str) -> str:
    """The one-line error of a refused path: exit 2 (a bad argument, as click's own path checks)."""
    code, got = _cli(*args)
    assert code == 2, got
    assert got["ok"] is False and "\n" not in got["error"] and "Traceback" not in got["error"]
    return got["error"]


def test_out_dir_with_a_nul_too_long_or_naming_a_file_is_a_one_line_error(tmp_path: Path) -> None:
    nul = tmp_path / "nul.yaml"
    nul.write_text('out_dir: "run\\0x"\n' + CONFIG)
    assert _refused(str(nul)) == f"{nul}:1:1: out_dir: path 'run\\x00x' holds a NUL byte, which no path can contain"
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(CONFIG)
    long_name = "n" * 256
    error = _refused(str(cfg), f"out_dir={long_name}")
    assert error.startswith("<override ") and "out_dir: path 'nnn" in error
    assert error.endswith("has a name of 256 bytes; a name may have at most 255")
    (tmp_path / "afile").write_text("keep")
    error = _refused(str(cfg), "out_dir=afile")
    assert error == ("<override 'out_dir=afile'>: out_dir: path 'afile' names an existing file; "
                     "expected a folder (existing or new)")
    assert "is a file, not a folder" in _refused(str(cfg), "out_dir=afile/run")
    assert (tmp_path / "afile").read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "nul.yaml", "tiny.yaml"]   # nothing ran


def test_init_from_a_file_that_is_no_checkpoint_is_a_one_line_error(tmp_path: Path) -> None:
    passwd = tmp_path / "passwd"
    passwd.write_text("root:x:0:0:root:/root:/bin/bash\n")
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(CONFIG)
    error = _refused(str(cfg), f"init_from={passwd}", "train.steps=1")
    assert error.startswith(f"init_from: checkpoint '{passwd}' is not a readable phaselab.model/1 file"), error
    error = _refused(str(cfg), f"init_from={tmp_path / 'nothing'}")
    assert error == (f"<override 'init_from={tmp_path / 'nothing'}'>: init_from: path '{tmp_path / 'nothing'}' "
                     "does not exist")


def test_a_symlink_in_out_dir_leading_outside_is_refused(tmp_path: Path) -> None:
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (tmp_path / "run" / "best").mkdir(parents=True)
    (tmp_path / "run" / "checkpoints").symlink_to(outside)
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(CONFIG)
    error = _refused(str(cfg), "out_dir=run", "train.steps=1")
    assert error == (f"run folder 'run': symlink '{tmp_path / 'run' / 'checkpoints'}' leads to '{outside}', "
                     f"outside '{tmp_path / 'run'}'")
    assert list(outside.iterdir()) == []
    (tmp_path / "run" / "checkpoints").unlink()
    (tmp_path / "run" / "metrics.json").symlink_to(outside / "metrics.json")
    assert "metrics.json' leads to" in _refused(str(cfg), "out_dir=run", "train.steps=1")
    assert list(outside.iterdir()) == [] and list((tmp_path / "run" / "best").iterdir()) == []


def test_shipped_example_config_is_valid() -> None:
    from phaselab.orchestrator.cli.train import _train_config

    spec, out_dir, init_from = _train_config(ROOT / "docs" / "examples" / "train_tiny.yaml", ["train.steps=2"])
    assert spec["model"]["n_layer"] == 2 and spec["data"]["kind"] == "text" and spec["train"]["steps"] == 2
    assert out_dir == Path(".phaselab/train/train_tiny") and init_from is None


def test_out_dir_outside_the_project_is_refused_unless_allowed(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg.yaml"
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    cfg.write_text(CONFIG + f"out_dir: ../{outside.name}\n")
    code, got = _cli(str(cfg), "train.steps=1")
    assert code != 0 and "outside the project folder" in got["error"] and "cfg.yaml:" in got["error"]
    assert not outside.exists()
    code, got = _cli(str(cfg), "train.steps=1", "--allow-outside")
    assert code == 0, got
    assert (outside / "checkpoints").is_dir()


# The options of `phaselab eval` and `phaselab train`, pinned (torchtitan's frozen-CLI test): a
# change here is a change of the user-facing command and must be deliberate. Config fields are
# never mirrored as flags; they are key=value overrides of the config (`options`, `overrides`).
FROZEN_CLI = {
    "eval": [("checkpoint", (), "argument", True, False, None),
             ("suite", ("--suite",), "option", True, False, None),
             ("options", (), "argument", False, True, None),
             ("out_dir", ("--out",), "option", False, False, ".phaselab/eval"),
             ("as_json", ("--json",), "option", False, False, False)],
    "train": [("config", (), "argument", True, False, None),
              ("overrides", (), "argument", False, True, None),
              ("as_json", ("--json",), "option", False, False, False),
              ("allow_outside", ("--allow-outside",), "option", False, False, False)],
}


@pytest.mark.parametrize("command", sorted(FROZEN_CLI))
def test_command_options_are_frozen(command: str) -> None:
    import typer.main

    params = typer.main.get_command(app).commands[command].params
    got = [(p.name, tuple(o for o in p.opts if o.startswith("-")), p.param_type_name, p.required,
            p.multiple or p.nargs == -1, None if p.default is None else (str(p.default) if isinstance(p.default, Path)
                                                                         else p.default))
           for p in params]
    assert got == FROZEN_CLI[command]
