"""deploy/gpu/run_grid.sh on CPU: the quickstart grid through `phaselab run`, packed the way a
GPU machine returns it, then collect.py into a results folder (the GPU run itself is the same
script with the carried wheels installed)."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from phaselab.catalog.reports.export import read_metrics

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "gpu" / "run_grid.sh"
# fewer steps than the shipped quickstart: the packing, not the numbers, is under test
FAST = ["defaults.train.steps=6", "defaults.train.ckpt_every=3", "stages.yarn.train.steps=2",
        "stages.yarn.train.ckpt_every=1", "stages.ppl.eval.ppl.max_tokens=512",
        "stages.ppl_yarn.eval.ppl.max_tokens=512"]


def test_scripts_parse_and_the_device_command_fits() -> None:
    for name in ("run_grid.sh", "fetch_wheels.sh"):
        res = subprocess.run(["bash", "-n", str(ROOT / "deploy" / "gpu" / name)], capture_output=True, text=True,
                             check=False)
        assert res.returncode == 0, res.stderr
    readme = (ROOT / "deploy" / "gpu" / "README.md").read_text()
    commands = re.findall(r"```bash\n(PHASELAB_GIT_COMMIT=.*?)\n```", readme, flags=re.DOTALL)
    assert commands and all(len(c) < 2000 for c in commands)


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("gpu-run")
    env = {**os.environ, "PHASELAB_PYTHON": sys.executable, "PHASELAB_GIT_COMMIT": "0123abcd"}
    res = subprocess.run(["bash", str(SCRIPT), "quickstart", *FAST, "--work", str(work), "--out",
                          str(work / "out"), "--num-cpus", "2"], env=env, capture_output=True, text=True,
                         timeout=500, check=False)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert "dependencies import already: no install" in res.stdout
    return work / "out"


@pytest.mark.slow
@pytest.mark.ray
def test_packed_files(packed: Path, tmp_path: Path) -> None:
    names = sorted(p.name for p in packed.iterdir())
    assert names == ["curves.jsonl.gz", "export.tar", "figures.tar", "log.txt.gz", "run.json", "tables.md"]
    assert all(p.stat().st_size < 16 << 20 for p in packed.iterdir())
    info = json.loads((packed / "run.json").read_text())
    assert info["grid"] == "quickstart" and info["git_commit"] == "0123abcd"
    assert info["states"] == {"SUCCEEDED": 8} and info["run_exit_code"] == 0
    assert info["card"].startswith("cpu") and info["date"].startswith("20") and info["wall_seconds"] > 0
    assert info["overrides"] == FAST and "run_grid.sh quickstart" in info["command"]
    with tarfile.open(packed / "export.tar") as tar:
        tar.extractall(tmp_path, filter="data")
    metrics = read_metrics(tmp_path, grid="quickstart").to_pylist()
    assert len({m["stage_hash"] for m in metrics}) == 8
    ppl = {(m["role"], json.loads(m["axes_json"])["pe"], m["context_len"]): m["value"]
           for m in metrics if m["name"] == "ppl"}
    assert len(ppl) == 4 * 4 and all(1.0 < v < 70.0 for v in ppl.values())   # char vocab of 66
    table = (packed / "tables.md").read_text()
    assert "Quickstart: Tiny Shakespeare perplexity" in table
    assert f"{ppl[('ppl', 'pope', 128)]:.2f}" in table
    with tarfile.open(packed / "figures.tar") as tar:
        assert sorted(tar.getnames()) == ["quickstart_ppl.pdf", "quickstart_ppl.png"]
    with gzip.open(packed / "curves.jsonl.gz", "rt") as f:
        curves = [json.loads(line) for line in f]
    assert {c["stage"] for c in curves} == {"pretrain", "yarn"}
    # ray_task stages write metrics.jsonl beside their tracker, so curves survive --no-mlflow
    assert {c["source"] for c in curves} == {"metrics.jsonl"}
    assert all(c["train/loss"] > 0 for c in curves if "train/loss" in c)
    assert max(c["step"] for c in curves if c["stage"] == "pretrain") == 6


@pytest.mark.slow
@pytest.mark.ray
def test_collect_writes_the_results_folder(packed: Path, tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, str(ROOT / "deploy" / "gpu" / "collect.py"), str(packed),
                          "--results", str(tmp_path)], capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    dest = tmp_path / "quickstart"
    assert {"README.md", "tables.md", "run.json", "quickstart_ppl.png", "export"} <= {p.name for p in dest.iterdir()}
    readme = (dest / "README.md").read_text()
    assert "`0123abcd`" in readme and "SUCCEEDED 8" in readme and "![quickstart_ppl.png](quickstart_ppl.png)" in readme
    assert len(read_metrics(dest / "export", grid="quickstart")) > 0
