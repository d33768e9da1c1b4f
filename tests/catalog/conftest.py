"""Catalog fixtures: a fresh, migrated catalog on SQLite (a file in tmp) and, when
PHASELAB_TEST_POSTGRES_URL is set, on PostgreSQL in a per-test schema (dropped afterwards)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pg_schema import postgres_schema

from phaselab.catalog.store.api import CatalogStore


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def catalog_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty catalog database URL (not migrated)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'catalog.db'}"
        return
    with postgres_schema("phaselab_test") as url:
        yield url


@pytest.fixture
def store(catalog_url: str) -> Iterator[CatalogStore]:
    """A migrated CatalogStore."""
    s = CatalogStore(catalog_url)
    s.upgrade()
    try:
        yield s
    finally:
        s.dispose()


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[CatalogStore]:
    """A migrated CatalogStore on SQLite only (for dialect-independent rendering tests)."""
    s = CatalogStore(f"sqlite:///{tmp_path / 'catalog.db'}")
    s.upgrade()
    try:
        yield s
    finally:
        s.dispose()
