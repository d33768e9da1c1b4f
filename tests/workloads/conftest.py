"""Fixtures shared by the workloads tests."""

from __future__ import annotations

import local_ray
import pytest


@pytest.fixture(scope="module")
def ray_cluster() -> str:
    """The shared local Ray cluster (2 CPUs, local_ray.py) with DeepSpeed's CPU environment."""
    pytest.importorskip("ray")
    from phaselab.workloads.train.deepspeed_engine import configure_environment

    configure_environment()
    from deepspeed.accelerator import get_accelerator

    get_accelerator().create_op_builder("ShareMemCommBuilder").load()  # warm the JIT cache
    return local_ray.shared()
