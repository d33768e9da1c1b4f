"""benchmarks/run_on_gpu.sh: the one script that runs any benchmark on a GPU machine. Checked with
--dry-run (it prints the commands it would run): the editable install of the checkout, the
benchmark's command line with a relative --out under $OUT, the pytest mode, unknown names; and
benchmarks/tapa_gluon_targets.sh's steps, limits and result names the same way."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "run_on_gpu.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _dry(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OUT": str(tmp_path)}
    return subprocess.run(["bash", str(SCRIPT), "--dry-run", *args], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=60, check=False)


def test_benchmark_command_installs_the_checkout_and_writes_under_out(tmp_path):
    run = _dry(tmp_path, "attention", "--head-dims", "64", "--out", "attention-h200-d64")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.strip().splitlines()
    assert "python3 -m pip install -q --no-index --no-deps --no-build-isolation -e ." in [ln.strip() for ln in lines]
    assert lines[-1].split() == ["python3", "benchmarks/attention.py", "--head-dims", "64", "--out",
                                 f"{tmp_path}/attention-h200-d64"]


def test_pytest_mode_and_unknown_benchmark(tmp_path):
    run = _dry(tmp_path, "pytest", "tests/kernels", "-m", "gpu")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1].split() == ["python3", "-m", "pytest", "tests/kernels", "-m", "gpu"]
    bad = _dry(tmp_path, "no_such_benchmark")
    assert bad.returncode == 2 and "no benchmark" in bad.stderr


TARGETS = ROOT / "benchmarks" / "tapa_gluon_targets.sh"


def _targets(tmp_path: Path, *args: str, **env_vars: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OUT": str(tmp_path), **env_vars}
    return subprocess.run(["bash", str(TARGETS), "--dry-run", *args], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=60, check=False)


def test_targets_script_runs_its_steps_in_order_under_their_limits(tmp_path):
    run = _targets(tmp_path, "rows", "tests40")
    assert run.returncode == 0, run.stderr
    rows, large = run.stdout.strip().splitlines()
    card = rows.split("attention-")[1].split("-tapa-gluon")[0]   # nvidia-smi's short name, "gpu" without one
    assert rows.split() == ["timeout", "240", "python3", "benchmarks/attention.py", "--untuned", "--head-dims", "128",
                            "--methods", "sdpa-cudnn", "tapa-gluon", "--lengths", "4096", "16384", "--rounds", "3",
                            "--out",
                            f"{tmp_path}/attention-{card}-tapa-gluon", ">", f"{tmp_path}/attention-{card}-tapa-gluon.log"]
    assert large.startswith("timeout 120 python3 -m pytest -m gpu") and "-k backward_distances_beyond_fp32_integers" in large
    every = _targets(tmp_path).stdout.strip().splitlines()
    assert [line.split()[1] for line in every] == ["330", "120", "240", "150", "180", "180", "420"]
    assert "not\\ backward_distances_beyond_fp32_integers" in every[0]   # the 40 GB test runs alone
    logs = tmp_path / "logs"
    apart = _targets(tmp_path, "rows", LOGS=str(logs)).stdout.split()
    assert apart[-3:] == [f"{tmp_path}/attention-{card}-tapa-gluon", ">", f"{logs}/attention-{card}-tapa-gluon.log"]
    bad = _targets(tmp_path, "rows", "no_such_step")
    assert bad.returncode == 2 and "unknown step no_such_step" in bad.stderr and not bad.stdout
