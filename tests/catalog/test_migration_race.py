"""Concurrent first use of a fresh catalog: 8 processes upgrade the same empty database at the
same moment; every one succeeds and the schema ends at head, once (SQLite and PostgreSQL)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from phaselab.catalog.store import db
from phaselab.catalog.store.api import CatalogStore

PROCESSES = 8

# Each child imports everything first, says it is ready, then waits for the common start signal
# so that the upgrades really overlap.
CHILD = """
import sys, time
from pathlib import Path
from phaselab.catalog.store.api import CatalogStore
url, ready, go = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
store = CatalogStore(url)
ready.touch()
while not go.exists():
    time.sleep(0.005)
store.upgrade()
store.dispose()
print("upgraded")
"""


def test_eight_concurrent_first_upgrades(catalog_url: str, tmp_path: Path) -> None:
    go = tmp_path / "go"
    procs, ready = [], []
    for i in range(PROCESSES):
        flag = tmp_path / f"ready-{i}"
        ready.append(flag)
        procs.append(subprocess.Popen([sys.executable, "-c", CHILD, catalog_url, str(flag), str(go)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    deadline = time.monotonic() + 60
    while not all(f.exists() for f in ready):
        assert time.monotonic() < deadline, "children did not start"
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs if p.poll() is not None]
        time.sleep(0.05)
    go.touch()
    results = [(p.wait(timeout=60), *p.communicate()) for p in procs]
    failed = [(rc, err[-2000:]) for rc, _, err in results if rc != 0]
    assert not failed, failed
    assert all(out.strip() == "upgraded" for _, out, _ in results)

    store = CatalogStore(catalog_url)
    try:
        assert db.current_revision(store.engine) == db.head_revision()
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM alembic_version").scalar() == 1
        gid = store.upsert_grid(name="race", grid_hash="r" * 64, yaml_submitted="", yaml_resolved="")
        assert store.reads.get_grid("race")["id"] == gid
    finally:
        store.dispose()
