"""One in-process local Ray cluster (2 CPUs, no dashboard, on 127.0.0.1) for the tests that drive
Ray from the test process: a start costs 5-8 s on 2 cores, so consecutive tests of one folder
share it. ``tests/conftest.py`` shuts it down before a test of another folder (unless that test
uses it too) and at the end of the session, so no idle cluster runs beside the other folders'
tests. A test that needs a
cluster of its own options calls :func:`own` and shuts that one down itself."""

from __future__ import annotations

OPTIONS = {"num_cpus": 2, "include_dashboard": False, "dashboard_host": "127.0.0.1"}

_shared = False


def shared() -> str:
    """The shared cluster's GCS address, started on first use."""
    import ray

    global _shared
    if ray.is_initialized():
        if not _shared:
            raise RuntimeError("a test left its own Ray cluster running")
    else:
        ray.init(**OPTIONS)
        _shared = True
    return ray.get_runtime_context().gcs_address


def own(**options: object) -> object:
    """``ray.init(**options)`` after the shared cluster is shut down; the caller shuts it down."""
    import ray

    stop_shared()
    return ray.init(**options)


def stop_shared() -> None:
    import sys

    global _shared
    ray = sys.modules.get("ray")
    if _shared and ray is not None and ray.is_initialized():
        ray.shutdown()
    _shared = False
