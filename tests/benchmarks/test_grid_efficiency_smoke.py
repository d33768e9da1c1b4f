"""benchmarks/grid_efficiency.py on a tiny grid: one real ``phaselab run`` (subprocess, fresh
catalog, local Ray cluster), then the catalog's time breakdown, the JSON and the Markdown."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import grid_efficiency as ge

GRID = """\
grid: tiny_eff
seeds: [0]
defaults:
  model: {preset: tiny, block_size: 16, n_layer: 1, d_model: 32, n_head: 2}
  data: {kind: text, block_size: 16}
  train: {steps: 20, batch_size: 4, warmup: 2, eval_every: 0, final_eval_batches: 1, ckpt_every: 0,
          log_every: 10, device: cpu}
  resources: {cpus: 1, memory_gb: 1}
stages:
  pretrain: {kind: pretrain}
  ppl:
    kind: eval
    needs: [pretrain]
    eval: {suite: ppl-by-length, ppl: {lengths: [16], max_tokens: 256, batch_size: 4}, device: cpu}
"""


@pytest.mark.ray
def test_grid_efficiency_runs_a_tiny_grid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = tmp_path / "tiny.yaml"
    grid.write_text(GRID)
    out = tmp_path / "result" / "grid-efficiency-cpu-tiny"
    assert ge.main([str(grid), "train.steps=30", "--no-mlflow", "--num-cpus", "2", "--work", str(tmp_path / "w"),
                    "--out", str(out)]) == 0
    result = json.loads(out.with_suffix(".json").read_text())
    meta, run = result["meta"], result["runs"][0]
    assert meta["grid"] == str(grid) and meta["overrides"] == ["train.steps=30"] and not meta["mlflow"]
    assert meta["card"] and meta["date"] and "grid_efficiency" in meta["command"] and meta["commit"]
    stages = {s["kind"]: s for s in run["stages"]}
    assert set(stages) == {"pretrain", "eval"} and all(s["state"] == "SUCCEEDED" for s in stages.values())
    t = stages["pretrain"]["times"]
    assert t["train"] > 0 and t["wall"] == pytest.approx(stages["pretrain"]["seconds"])
    assert t["wall"] == pytest.approx(t["startup"] + sum(t[p] for p in ("setup", "train", "eval", "ckpt", "other")))
    assert stages["eval"]["times"] is None and stages["eval"]["seconds"] > 0
    eff = run["efficiency"]
    assert eff["scope"] == "all" and eff["stages"] == 2
    assert eff["value"] == pytest.approx(t["train"] / (t["wall"] + stages["eval"]["seconds"]))
    assert run["wall_s"] >= run["span_s"] > 0 and result["median_wall_s"] == run["wall_s"]
    md = out.with_suffix(".md").read_text()
    assert "| pretrain[seed=0] | SUCCEEDED | no |" in md and "Training-step share (no GPU stage)" in md
    assert f"**{100 * eff['value']:.1f} %**" in md
    assert "run 0:" in capsys.readouterr().out


def test_a_failing_run_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = tmp_path / "bad.yaml"
    grid.write_text(GRID.replace("kind: text", "kind: nosuchdata"))
    assert ge.main([str(grid), "--no-mlflow", "--work", str(tmp_path / "w")]) == 1
    assert "phaselab run exited 1" in capsys.readouterr().err
