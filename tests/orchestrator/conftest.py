"""One shrunk quickstart watched from outside while it runs, then SIGKILLed, for the tests that
only read what was seen (test_network: sockets and the token file; test_orphans: the cluster
processes left after the kill). A run with its local Ray cluster costs 20-30 s on 2 cores, and
both observations fit in one: the socket census needs a running cluster, the orphan check a
controller killed while its stages run."""

from __future__ import annotations

import _quickstart
import pytest


@pytest.fixture(scope="session")
def killed_quickstart(tmp_path_factory: pytest.TempPathFactory) -> _quickstart.KilledQuickstart:
    """:func:`_quickstart.killed_quickstart`, run once for the tests that read it."""
    return _quickstart.killed_quickstart(tmp_path_factory.mktemp("killed-quickstart"))
