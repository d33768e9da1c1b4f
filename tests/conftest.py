"""Shared test setup: offline, quiet, deterministic; skips for missing hardware/services."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_SCRATCH = ROOT / ".phaselab" / "test-scratch"
_SCRATCH.mkdir(parents=True, exist_ok=True)

# Offline and quiet everywhere (EXPERIMENTS §5.3; STACK.md Ray/MLflow notes).
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".torch_extensions"))
os.environ.setdefault("RAY_TMPDIR", "/tmp/phaselab-ray")
# pytest-xdist's workers set COLUMNS=80; the CLI reads it as the reader's width (cli_common), so the
# commands under test would wrap where a pipe or a log does not. Tests that want a width set one.
os.environ.pop("COLUMNS", None)
# Tiny-shape tests on 2 cores run far faster single-threaded (0.014 s vs 0.65 s per training step
# measured under load); set before torch is imported so Ray/DeepSpeed workers inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Ray Train's controller polls its workers every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S (default 2 s)
# and takes one worker report per poll, so each checkpoint report, the start and the end of a run
# wait for the next poll: ~5 s of an idle cluster per `fit` of the tests' tiny runs (measured
# 25-31 s -> 20 s for a 2-worker ZeRO-2 run on 2 cores). A poll that does not answer in time
# counts as "still running" (Ray marks a worker dead only after WORKER_HEALTH_CHECK_TIMEOUT_S,
# 10 min), so polling faster changes when the controller looks, not what it does. Ray Train reads
# it in the driver at each `fit`, so set here it reaches every fit: in this process, and in the
# `phaselab` subprocesses and Ray jobs that inherit the environment.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.1")


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


# Without CUDA the Triton kernels run under the interpreter, which triton reads when it decorates a
# kernel: set here, before any test module is collected, because a module of another folder
# (benchmarks/ helpers) may import phaselab.kernels' Triton files before tests/kernels/conftest.py
# is loaded. Every test already ran with it set (collection precedes the first test).
if not _has_cuda():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The lm-eval adapter's tests import lm_eval at module level; a bare GPU machine that runs
# `pytest -m gpu tests` (benchmarks/run_on_gpu.sh) has no lm_eval, and one import error stops the
# whole collection. The CPU suite installs it (the `eval` extra), so there they always run.
collect_ignore = [] if importlib.util.find_spec("lm_eval") else ["workloads/test_evals_lm_harness.py"]


# The slowest files (1-2.5 min each on 2 cores), run first: `make test` runs the suite in two
# pytest-xdist processes that take whole files in collection order, so a slow file started last
# would leave the other process idle at the end.
SLOW_FIRST = ("test_readme_commands.py", "workloads/test_ray_train.py", "orchestrator/test_controller_ray.py",
              "orchestrator/test_multinode.py", "deploy/test_gpu_run_script.py",
              "orchestrator/test_mlflow_compare.py")


def _slow_rank(item: pytest.Item) -> int:
    rel = item.path.relative_to(ROOT / "tests").as_posix() if item.path.is_relative_to(ROOT / "tests") else ""
    return SLOW_FIRST.index(rel) if rel in SLOW_FIRST else len(SLOW_FIRST)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=_slow_rank)   # stable: every other file keeps its place
    cuda = _has_cuda()
    pg = os.environ.get("PHASELAB_TEST_POSTGRES_URL")
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (marker gpu; run on the H200)")
    skip_pg = pytest.mark.skip(reason="PHASELAB_TEST_POSTGRES_URL is not set (.ci/run sets it)")
    for item in items:
        if "gpu" in item.keywords and not cuda:
            item.add_marker(skip_gpu)
        if "postgres" in item.keywords and not pg:
            item.add_marker(skip_pg)


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    """A per-test scratch directory (alias of tmp_path, named for readability)."""
    return tmp_path


def _uses_shared_cluster(item: pytest.Item) -> bool:
    module = getattr(item, "module", None)
    return "ray_cluster" in getattr(item, "fixturenames", ()) or (
        module is not None and "local_ray" in vars(module))


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """The shared in-process Ray cluster (local_ray.py) lives while the tests of one folder run,
    and on into the next folder when that folder's first test uses it too (a start costs 5-8 s)."""
    local_ray = sys.modules.get("local_ray")
    if local_ray is None:
        return
    if nextitem is None or (nextitem.path.parent != item.path.parent and not _uses_shared_cluster(nextitem)):
        local_ray.stop_shared()
