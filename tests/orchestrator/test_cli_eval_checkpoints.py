"""`phaselab train` refuses to resume a run of another config; `phaselab eval` takes any
checkpoint form (model.pt, step folder, checkpoints/, checkpoints/latest, run folder) and runs
ppl-by-length without explicit lengths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from phaselab.orchestrator.cli import app

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
    assert code == 1 and "holds no model.pt and no complete checkpoint" in got["error"]
    code, got = _cli("eval", str(tmp_path / "nothing"), "--suite", "ppl-by-length")
    assert code == 1 and "does not exist" in got["error"]
