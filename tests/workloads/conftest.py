"""Fixtures shared by the workloads tests."""

from __future__ import annotations

from collections.abc import Iterator

import local_ray
import pytest

# Ray Train's controller polls its workers every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S (default 2 s)
# and takes one worker report per poll, so each checkpoint report, the start and the end of a run
# wait for the next poll: ~5 s of an idle cluster per `fit` of these tiny runs (measured 25-31 s
# -> 20 s for the ZeRO-2 reference on 2 cores). A poll that does not answer in time counts as
# "still running" (Ray marks a worker dead only after WORKER_HEALTH_CHECK_TIMEOUT_S, 10 min), so
# polling faster changes when the controller looks, not what it does. Ray Train reads the
# variable in the driver at each `fit` and passes it on to the controller and the workers.
_RAY_TRAIN_ENV = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.1"}


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    """The shared local Ray cluster (2 CPUs, local_ray.py) with DeepSpeed's CPU environment and
    Ray Train's fast controller polling for the module's fits."""
    pytest.importorskip("ray")
    from phaselab.workloads.train.deepspeed_engine import prebuild_comm_op

    prebuild_comm_op()  # the environment, and the JIT cache warm (make install already built it)
    address = local_ray.shared()
    with pytest.MonkeyPatch.context() as mp:
        for name, value in _RAY_TRAIN_ENV.items():
            mp.setenv(name, value)
        yield address
