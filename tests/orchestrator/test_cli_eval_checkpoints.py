"""`phaselab train` refuses to resume a run of another config; `phaselab eval` takes any
checkpoint form (model.pt, step folder, checkpoints/, checkpoints/latest, run folder) and runs
ppl-by-length without explicit lengths."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from phaselab.orchestrator.cli.main import app

CONFIG = """\
model: {preset: tiny, block_size: 16}
data: {kind: text, block_size: 16}
train: {steps: 2, batch_size: 2, warmup: 0, eval_every: 0, final_eval_batches: 1, ckpt_every: 1,
        log_every: 1, device: cpu, schedule: constant}
"""


def _cli(*args: str) -> tuple[int, dict | str]:
    res = CliRunner().invoke(app, [*args, "--json"])
    try:
        return res.exit_code, json.loads(res.output)
    except json.JSONDecodeError:
        return res.exit_code, res.output


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 2-step run (checkpoints step_0000001, step_0000002, latest)."""
    work = tmp_path_factory.mktemp("train")
    cfg = work / "tiny.yaml"
    cfg.write_text(CONFIG)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)
        code, got = _cli("train", str(cfg), "out_dir=run")
    assert code == 0, got
    return work


def test_a_resume_whose_config_changed_is_refused(run_dir: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    shutil.copytree(run_dir, tmp_path, dirs_exist_ok=True)   # the other tests read the original
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path
    code, got = _cli("train", "tiny.yaml", "out_dir=run", "model.pe.kind=pope", "train.lr=0.01")
    assert code == 1, got
    assert "model.pe.kind: 'rope' -> 'pope'" in got["error"] and "train.lr: 0.0006 -> 0.01" in got["error"]
    assert "out_dir=run-2" in got["error"]
    assert sorted(p.name for p in (run_dir / "run" / "checkpoints").glob("step_*")) == ["step_0000001",
                                                                                      "step_0000002"]
    # more steps and another logging cadence are a resume, not another run
    code, got = _cli("train", "tiny.yaml", "out_dir=run", "train.steps=3", "train.log_every=2")
    assert code == 0, got
    assert got["resumed_from_step"] == 2 and got["metrics"]["step"] == 3


@pytest.mark.parametrize("where", ["run/checkpoints/step_0000001/model.pt", "run/checkpoints/step_0000001",
                                   "run/checkpoints/latest", "run/checkpoints", "run"])
def test_eval_takes_every_checkpoint_form(run_dir: Path, where: str) -> None:
    code, got = _cli("eval", str(run_dir / where), "--suite", "ppl-by-length", "ppl.lengths=[16]", "device=cpu",
                     "ppl.max_tokens=256", "--out", str(run_dir / "eval"))
    assert code == 0, got
    latest = (run_dir / "run" / "checkpoints" / "latest").read_text().strip()
    step = "step_0000001" if "step_0000001" in where else latest
    assert got["checkpoint"] == str(run_dir / "run" / "checkpoints" / step / "model.pt")
    assert [r["context_len"] for r in got["records"] if r["name"] == "ppl"] == [16]


def test_ppl_by_length_defaults_to_the_context_and_its_multiples(run_dir: Path) -> None:
    code, got = _cli("eval", str(run_dir / "run"), "--suite", "ppl-by-length", "device=cpu", "ppl.max_tokens=512",
                     "--out", str(run_dir / "eval"))
    assert code == 0, got
    assert got["default_ppl_lengths"] == [16, 32, 64]
    ppl = {r["context_len"]: r["value"] for r in got["records"] if r["name"] == "ppl"}
    assert sorted(ppl) == [16, 32, 64] and all(1.0 < v < 100.0 for v in ppl.values())
    code, got = _cli("eval", str(run_dir / "run"), "--suite", "ppl-by-length", "device=cpu", "ppl.max_tokens=512",
                     "extend.rule=yarn", "extend.factor=2", "extend.original_max_seq_len=16", "extend.block_size=32",
                     "--out", str(run_dir / "eval"))
    assert code == 0, got
    assert got["default_ppl_lengths"] == [32, 64, 128]


def test_eval_on_a_folder_without_a_checkpoint_is_a_clean_error(tmp_path: Path) -> None:
    code, got = _cli("eval", str(tmp_path), "--suite", "ppl-by-length")
    assert code == 2 and "holds no model.pt and no complete checkpoint" in got["error"]
    code, got = _cli("eval", str(tmp_path / "nothing"), "--suite", "ppl-by-length")
    assert code == 2 and got["error"] == f"checkpoint '{tmp_path / 'nothing'}' does not exist"


class _RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def _refused(*args: str) -> str:
    """The one-line error of a refused eval (exit 2, the code of a bad argument)."""
    code, got = _cli("eval", *args, "--suite", "ppl-by-length", "ppl.lengths=[16]", "device=cpu")
    assert code == 2, got
    assert got["ok"] is False and "\n" not in got["error"] and "Traceback" not in got["error"]
    return got["error"]


def test_files_that_are_no_checkpoint_are_one_line_errors(run_dir: Path, tmp_path: Path) -> None:
    model = run_dir / "run" / "checkpoints" / "step_0000002" / "model.pt"
    (tmp_path / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (tmp_path / "truncated.pt").write_bytes(model.read_bytes()[:4000])
    (tmp_path / "garbage.pt").write_bytes(bytes(range(256)) * 40)
    for name in ("passwd", "truncated.pt", "garbage.pt"):
        error = _refused(str(tmp_path / name))
        assert error.startswith(f"checkpoint '{tmp_path / name}' is not a readable phaselab.model/1 file"), error
    marker = tmp_path / "ran"
    torch.save({"format": "phaselab.model/1", "x": _RunsCode(marker)}, tmp_path / "evil.pt")
    assert "refused unrun" in _refused(str(tmp_path / "evil.pt"))
    assert not marker.exists()
    # `latest` names a step folder, never a path: a pointer out of checkpoints/ is not followed
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "model.pt").write_bytes(model.read_bytes())
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest").write_text("../elsewhere\n")
    assert "names no complete step_N/ folder" in _refused(str(tmp_path / "checkpoints" / "latest"))


def test_eval_out_must_be_a_folder_that_writes_nowhere_else(run_dir: Path, tmp_path: Path) -> None:
    model = str(run_dir / "run" / "checkpoints" / "step_0000002" / "model.pt")
    (tmp_path / "afile").write_text("keep")
    error = _refused(model, "--out", str(tmp_path / "afile"))
    assert error == f"--out '{tmp_path / 'afile'}' names an existing file; expected a folder (existing or new)"
    assert (tmp_path / "afile").read_text() == "keep"
    (tmp_path / "out").mkdir()
    (tmp_path / "victim.json").write_text("keep")
    (tmp_path / "out" / "records.json").symlink_to(tmp_path / "victim.json")
    error = _refused(model, "--out", str(tmp_path / "out"))
    assert "records.json' leads to" in error and "outside" in error
    assert (tmp_path / "victim.json").read_text() == "keep"


def test_a_resume_from_a_damaged_checkpoint_names_the_file(run_dir: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    shutil.copytree(run_dir / "run", tmp_path / "run")
    shutil.copy(run_dir / "tiny.yaml", tmp_path)
    monkeypatch.chdir(tmp_path)
    model = tmp_path / "run" / "checkpoints" / "step_0000002" / "model.pt"
    model.write_bytes(model.read_bytes()[:4000])
    code, got = _cli("train", "tiny.yaml", "out_dir=run", "train.steps=3")
    assert code == 2, got
    assert got["error"].startswith("checkpoint 'run/checkpoints/step_0000002/model.pt' is not a readable"), got
    spec = tmp_path / "run" / "checkpoints" / "step_0000002" / "spec.json"
    spec.write_text('{"model": ')
    code, got = _cli("train", "tiny.yaml", "out_dir=run", "train.steps=3")
    assert code == 2 and f"checkpoint spec '{spec.relative_to(tmp_path)}' is damaged" in got["error"], got
