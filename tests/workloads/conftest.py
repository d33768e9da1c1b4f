"""Fixtures shared by the workloads tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster (2 CPUs) with DeepSpeed's CPU environment, one per test module."""
    ray = pytest.importorskip("ray")
    from phaselab.workloads.train.deepspeed_engine import configure_environment

    configure_environment()
    from deepspeed.accelerator import get_accelerator

    get_accelerator().create_op_builder("ShareMemCommBuilder").load()  # warm the JIT cache
    ray.init(num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()
