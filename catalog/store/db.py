"""Engine and migration helpers for the catalog (DESIGN §5.1).

- URL: explicit, else ``PHASELAB_CATALOG_URL``, else ``sqlite:///<project home>/.phaselab/catalog.db``
  (the project home: ``catalog/store/home.py``).
- SQLite: WAL journal (readers never block the writer), ``busy_timeout`` (writers wait instead of
  failing), foreign keys on, and every transaction opened with ``BEGIN IMMEDIATE``. A deferred
  transaction that reads and then writes can fail at once with SQLITE_BUSY when another writer
  holds the lock (the busy handler is not consulted for that lock upgrade); taking the write lock
  at BEGIN makes concurrent writers queue on the busy timeout instead.
- PostgreSQL: ``postgresql://`` is read as ``postgresql+psycopg://`` (psycopg 3 is the driver we
  pin); ``pool_pre_ping`` so a restarted server does not leave dead pooled connections.
- Migrations: Alembic, ``upgrade`` runs from the controller or an init job, never from workers
  (parallel migrations race: langflow-ai/langflow#14389). Several controllers may still start at
  once on a fresh catalog, so every upgrade/downgrade is serialised: on PostgreSQL by a
  transaction-level advisory lock taken first in the migration's transaction, on SQLite by an
  exclusive ``flock`` on ``<database>.migrate.lock``. The process that waited then finds the
  schema at head and does nothing.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url

CATALOG_URL_ENV = "PHASELAB_CATALOG_URL"
SQLITE_BUSY_TIMEOUT_MS = 30_000
_HERE = Path(__file__).resolve().parent
# One key for every phaselab catalog migration (pg_advisory_xact_lock takes a bigint).
MIGRATION_LOCK_KEY = zlib.crc32(b"phaselab.catalog.migrations")


def default_url(cwd: Path | None = None) -> str:
    """``PHASELAB_CATALOG_URL`` if set, else a SQLite file under ``<project home>/.phaselab/``
    (``home.project_home``: found from ``cwd``, default the working directory, up)."""
    from phaselab.catalog.store.home import state_dir

    env = os.environ.get(CATALOG_URL_ENV)
    if env:
        return env
    return f"sqlite:///{(state_dir(cwd) / 'catalog.db').resolve()}"


class StorageFault(OSError):
    """A folder phaselab must write to cannot take writes (read-only, full, not writable, not a
    folder); ``str()`` is one line naming the folder and the fix, ``errno`` the cause."""

    def __init__(self, code: int, line: str, folder: Path) -> None:
        super().__init__(code, line, str(folder))
        self.line = line

    def __str__(self) -> str:
        return self.line


CATALOG_FIX = ("make it writable or free space there, or put the catalog elsewhere (--catalog, "
               f"${CATALOG_URL_ENV}, or $PHASELAB_HOME for all of .phaselab)")
_PROBE_BYTES = 1 << 20   # a catalog transaction with its WAL frames needs at least this much


def check_writable(folder: Path, *, what: str, fix: str) -> None:
    """Create ``folder`` if needed and prove it takes a write (a 1 MiB file, synced, removed),
    before any work starts; raises :class:`StorageFault` naming ``what`` (e.g. "catalog
    folder"), the folder, the cause and ``fix`` (the settings that move it elsewhere). A probe
    write, not ``os.access``: root passes every permission check, yet a read-only mount or a
    full disk still refuses it."""
    folder = Path(folder)
    probe = folder / f".phaselab-write-probe-{os.getpid()}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not folder.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(folder))
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"\0" * _PROBE_BYTES)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as err:
        code = err.errno or errno.EIO
        why = {errno.EROFS: "is on a read-only file system",
               errno.ENOSPC: "has no space left on its device",
               errno.EDQUOT: "is over its disk quota",
               errno.EACCES: f"is not writable by this user (uid {os.getuid()})",
               errno.EPERM: f"is not writable by this user (uid {os.getuid()})",
               errno.ENOTDIR: "is not a folder (a file is in its way)",
               errno.EEXIST: "is not a folder (a file is in its way)"}.get(code, f"refused a write ({err.strerror})")
        raise StorageFault(code, f"the {what} {folder} {why} [{errno.errorcode.get(code, code)}]: {fix}",
                           folder) from None
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()


def normalize_url(url: str) -> str:
    """Validate a catalog URL and pick our drivers. Raises ValueError naming a bad URL."""
    if not isinstance(url, str) or not url:
        raise ValueError(f"catalog URL must be a non-empty string, got {url!r}")
    try:
        parsed = make_url(url)
    except Exception as exc:  # sqlalchemy raises ArgumentError with a terse message
        raise ValueError(f"unparseable catalog URL {url!r}: {exc}") from exc
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise ValueError(f"catalog URL {url!r}: backend {backend!r} is not sqlite or postgresql")
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def sqlite_path(url: str) -> Path | None:
    """The database file of a SQLite URL (None for in-memory or non-SQLite URLs)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    # Take transaction control away from pysqlite so the "begin" hook decides (SQLAlchemy docs,
    # "Serializable isolation / Savepoints / Transactional DDL" for pysqlite).
    dbapi_connection.isolation_level = None
    cur = dbapi_connection.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def _sqlite_on_begin(conn: Any) -> None:
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def make_engine(url: str | None = None) -> Engine:
    """Create the engine for ``url`` (see the module docstring for the per-backend settings)."""
    url = normalize_url(default_url() if url is None else url)
    path = sqlite_path(url)
    if make_url(url).get_backend_name() == "sqlite":
        if path is not None and not path.parent.is_dir():
            check_writable(path.parent, what="catalog folder", fix=CATALOG_FIX)   # creates it
        # timeout= is pysqlite's own busy wait, used before our PRAGMA runs on a new connection.
        engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000,
                                                  "check_same_thread": False})
        event.listen(engine, "connect", _sqlite_on_connect)
        event.listen(engine, "begin", _sqlite_on_begin)
        return engine
    return create_engine(url, pool_pre_ping=True)


def alembic_config(url: str | None = None) -> Any:
    """An Alembic ``Config`` for the packaged ``alembic.ini`` (bound to ``url`` when given)."""
    from alembic.config import Config

    cfg = Config(str(_HERE / "alembic.ini"))
    cfg.set_main_option("script_location", str(_HERE / "migrations"))
    if url is not None:
        # '%' must be escaped for ConfigParser interpolation (passwords, URL-encoded options).
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


@contextlib.contextmanager
def _sqlite_migration_lock(engine: Engine) -> Iterator[None]:
    """Exclusive ``flock`` beside a SQLite database file (nothing for an in-memory one)."""
    path = sqlite_path(engine.url.render_as_string(hide_password=False))
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".migrate.lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _run_command(engine: Engine, name: str, revision: str) -> None:
    """Run an Alembic command in one transaction, serialised against other processes."""
    from alembic import command
    from sqlalchemy import text

    cfg = alembic_config(engine.url.render_as_string(hide_password=False))
    sqlite = engine.url.get_backend_name() == "sqlite"
    lock = _sqlite_migration_lock(engine) if sqlite else contextlib.nullcontext()
    with lock, engine.begin() as connection:
        if engine.url.get_backend_name() == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
        cfg.attributes["connection"] = connection
        getattr(command, name)(cfg, revision)


def upgrade(engine: Engine, revision: str = "head") -> None:
    """``alembic upgrade <revision>`` on ``engine`` (run once, from the controller)."""
    _run_command(engine, "upgrade", revision)


def downgrade(engine: Engine, revision: str) -> None:
    """``alembic downgrade <revision>`` (``"base"`` drops every catalog table)."""
    _run_command(engine, "downgrade", revision)


def current_revision(engine: Engine) -> str | None:
    """The Alembic revision the database is at (None before the first upgrade)."""
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def head_revision() -> str:
    """The newest revision shipped with this version of phaselab."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config())
    head = script.get_current_head()
    if head is None:
        raise RuntimeError("no Alembic revisions shipped in phaselab.catalog.store.migrations")
    return head
