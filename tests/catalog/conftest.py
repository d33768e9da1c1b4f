"""Catalog fixtures: a fresh, migrated catalog on SQLite (a file in tmp) and, when
PHASELAB_TEST_POSTGRES_URL is set, on PostgreSQL in a per-test schema (dropped afterwards)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from phaselab.catalog.store import CatalogStore


def _pg_url_with_schema(base: str, schema: str) -> str:
    sep = "&" if "?" in base else "?"
    # libpq "options" sets search_path for every pooled connection, so our tables and
    # alembic_version live in the test's own schema.
    return f"{base}{sep}options=-csearch_path%3D{schema}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def catalog_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty catalog database URL (not migrated)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'catalog.db'}"
        return
    from sqlalchemy import create_engine

    from phaselab.catalog.db import normalize_url

    base = normalize_url(os.environ["PHASELAB_TEST_POSTGRES_URL"])
    schema = f"phaselab_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base)
    with admin.begin() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    try:
        yield _pg_url_with_schema(base, schema)
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
        admin.dispose()


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
