"""Fixtures shared by the workloads tests."""

from __future__ import annotations

from collections.abc import Iterator

import local_ray
import pytest


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    """The shared local Ray cluster (2 CPUs, local_ray.py) with DeepSpeed's CPU environment; Ray
    Train's fast controller polling is set for the whole session (tests/conftest.py)."""
    pytest.importorskip("ray")
    from phaselab.workloads.train.deepspeed_engine import prebuild_comm_op

    prebuild_comm_op()  # the environment, and the JIT cache warm (make install already built it)
    yield local_ray.shared()
