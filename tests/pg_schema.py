"""A PostgreSQL schema of its own for one test (or module): the CI database
(``PHASELAB_TEST_POSTGRES_URL``) is shared, so each user gets a fresh schema, dropped after."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator


def url_with_schema(base: str, schema: str) -> str:
    sep = "&" if "?" in base else "?"
    # libpq "options" sets search_path for every pooled connection, so our tables and
    # alembic_version live in the test's own schema.
    return f"{base}{sep}options=-csearch_path%3D{schema}"


@contextlib.contextmanager
def postgres_schema(prefix: str) -> Iterator[str]:
    """The URL of the CI PostgreSQL with a new schema ``<prefix>_<random>`` on its search path."""
    from sqlalchemy import create_engine

    from phaselab.catalog.store.db import normalize_url

    base = normalize_url(os.environ["PHASELAB_TEST_POSTGRES_URL"])
    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base)
    with admin.begin() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    try:
        yield url_with_schema(base, schema)
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
        admin.dispose()
