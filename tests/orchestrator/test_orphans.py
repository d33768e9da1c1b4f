"""A controller SIGKILLed mid-run leaves no process of its local Ray cluster behind (raylet,
GCS, dashboard and runtime-env agents, workers) for more than a few seconds. The run, the kill
and the polling of what it left are the ``killed_quickstart`` fixture (conftest.py)."""

from __future__ import annotations

import pytest
from _quickstart import ORPHANS_WITHIN_S, KilledQuickstart

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_no_cluster_process_outlives_a_killed_controller(killed_quickstart: KilledQuickstart) -> None:
    seen = killed_quickstart
    assert seen.killed_while_running   # the kill landed mid-run, with stages running
    assert {"raylet", "gcs_server", "ray::DashboardAgent", "ray::RuntimeEnvAgent"} <= seen.names, seen.names
    print(f"cluster processes gone {seen.gone_after_s:.1f} s after the controller's SIGKILL")
    assert not seen.left, f"still running {ORPHANS_WITHIN_S:g} s after the controller was killed: {seen.left}"
