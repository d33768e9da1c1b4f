"""End to end through the real CLI: an encoding plugin on PYTHONPATH (examples/encodings) planned,
run and tabled beside RoPE and PoPE on a local Ray cluster, at a few steps per stage."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _quickstart import quickstart_env

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "encodings"
PES = ["rope", "pope", "phaselab_xpos:XPos", "phaselab_kerple:Kerple"]
GRID = """\
grid: plugin_e2e
seeds: [0]
axes:
  product:
    pe: [rope, pope, "phaselab_xpos:XPos", "phaselab_kerple:Kerple"]
defaults:
  model: {preset: tiny, n_layer: 1, block_size: 16, pe: {kind: "${pe}"}}
  data: {kind: text, block_size: 16}
  train: {steps: 2, batch_size: 2, eval_every: 0, final_eval_batches: 1, ckpt_every: 2, device: cpu}
  launcher: ray_task
stages:
  pretrain:
    kind: pretrain
  ppl:
    kind: eval
    needs: [pretrain]
    eval: {suite: ppl-by-length, ppl: {lengths: [16, 32], max_tokens: 256}, device: cpu}
"""


def _cli(work: Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    env = quickstart_env(PYTHONPATH=str(EXAMPLES))
    return subprocess.run([sys.executable, "-m", "phaselab.orchestrator.cli.main", *args], check=False, cwd=work, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.ray
@pytest.mark.slow
def test_plugins_plan_run_and_table_beside_rope_and_pope(tmp_path: Path) -> None:
    (tmp_path / "g.yaml").write_text(GRID)
    catalog = f"sqlite:///{tmp_path / 'catalog.db'}"
    plan = _cli(tmp_path, "plan", "g.yaml", "--json", timeout=120)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    run = _cli(tmp_path, "run", "g.yaml", "--num-cpus", "2", "--catalog", catalog, "--runs-root",
               str(tmp_path / "runs"), timeout=500)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "{'SUCCEEDED': 8}" in run.stdout, run.stdout[-3000:]
    table = _cli(tmp_path, "tables", "plugin_e2e", "--metric", "ppl", "--rows", "pe", "--cols", "context_len",
                 "--catalog", catalog, "--json", timeout=120)
    assert table.returncode == 0, table.stdout + table.stderr
    text = json.loads(table.stdout)["tables"][0]["text"]
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    for pe in PES:
        values = [float(c.strip(" *")) for c in rows[pe].split("|")[2:4]]
        assert all(1.0 < v < 200.0 for v in values), rows[pe]   # a char model after 2 steps: ~ vocab size
