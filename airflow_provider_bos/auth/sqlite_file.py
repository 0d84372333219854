"""The token store's SQLite file: created owner-only, and driven so that its locks hold.

The default store is ``$AIRFLOW_HOME/bos_token_store.db`` (``0600`` in a ``0700`` directory when it
creates them). pysqlite's own transaction handling is replaced so that ``BEGIN IMMEDIATE`` can be
asked for per connection (the execution option :data:`SQLITE_BEGIN_OPTION`).

A reader that must change nothing (the Admin -> BOS page) opens the file with
:func:`read_only_sqlite_engine` instead: SQLite's ``mode=ro``, so no file, directory, journal or
table is created and no permission is changed; a path that does not exist is simply not opened.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import create_engine, event
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.pool import NullPool

from airflow_provider_bos.exceptions import BosConfigurationError

__all__ = ["ensure_private_sqlite_file", "default_token_store_url", "default_token_store_path", "configure_sqlite",
           "read_only_sqlite_engine", "sqlite_store_engine", "SQLITE_BEGIN_OPTION", "DEFAULT_FILE_NAME"]

DEFAULT_FILE_NAME = "bos_token_store.db"
#: The execution option naming the BEGIN mode of a connection's next transaction.
SQLITE_BEGIN_OPTION = "bos_sqlite_begin"


def _private_dir(path: Path) -> None:
    if not path.exists():
        path.mkdir(parents=True, mode=0o700, exist_ok=True)


def ensure_private_sqlite_file(path: str | os.PathLike[str]) -> Path:
    """Create the SQLite file (and its directory) owner-only; tighten an existing file to ``0600``."""
    file = Path(path).expanduser()
    _private_dir(file.parent)
    try:
        fd = os.open(file, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        os.close(fd)
    except FileExistsError:
        pass
    mode = stat.S_IMODE(file.stat().st_mode)
    if mode & 0o077:
        os.chmod(file, 0o600)
    return file


def default_token_store_path() -> Path:
    """``$AIRFLOW_HOME/bos_token_store.db`` (``~/airflow`` without AIRFLOW_HOME), not created."""
    home = Path(os.environ.get("AIRFLOW_HOME") or Path.home() / "airflow").expanduser()
    return home / DEFAULT_FILE_NAME


def default_token_store_url() -> str:
    """``sqlite:///$AIRFLOW_HOME/bos_token_store.db`` (``~/airflow`` without AIRFLOW_HOME), created 0600.

    Right for a single machine only; see the module docstring for shared deployments.
    """
    file = ensure_private_sqlite_file(default_token_store_path())
    return f"sqlite:///{file}"


def read_only_sqlite_engine(path: str | os.PathLike[str], *, busy_timeout_s: float) -> Engine | None:
    """An engine that only reads the SQLite file at ``path`` (``mode=ro``); ``None`` when there is no
    such file. A path that exists but is not a regular file (a FIFO, a device, a directory) is refused
    rather than opened: opening one could block or read something that is no database."""
    file = Path(path).expanduser()
    try:
        mode = file.stat().st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BosConfigurationError(
            f"The SQLite token store {str(file)!r} cannot be read ({type(exc).__name__})."
        ) from None
    if not stat.S_ISREG(mode):
        raise BosConfigurationError(f"The SQLite token store {str(file)!r} is not a regular file.")
    uri = f"file:{quote(str(file.resolve()))}?mode=ro"

    def connect() -> sqlite3.Connection:
        return sqlite3.connect(uri, uri=True, timeout=busy_timeout_s, check_same_thread=False)

    engine = create_engine("sqlite://", creator=connect, poolclass=NullPool, hide_parameters=True)
    configure_sqlite(engine)
    return engine


def sqlite_store_engine(url: URL, *, read_only: bool, busy_timeout_s: float) -> Engine | None:
    """The engine of the token store in the SQLite file ``url`` names: created owner-only and written
    to, or only read (``mode=ro``, ``None`` when the file does not exist). An in-memory database is
    refused: a grant that is gone when the process ends is lost at the server too."""
    database = url.database or ""
    if (
        database in ("", ":memory:")
        or database.startswith("file::memory:")
        or "mode=memory" in str(url)
    ):
        raise BosConfigurationError(
            "The token store must be durable: an in-memory SQLite database is not."
        )
    if read_only:
        return read_only_sqlite_engine(database, busy_timeout_s=busy_timeout_s)
    ensure_private_sqlite_file(database)
    engine = create_engine(url, connect_args={"timeout": busy_timeout_s}, hide_parameters=True)
    configure_sqlite(engine)
    return engine


def configure_sqlite(engine: Engine) -> None:
    # pysqlite's legacy transaction control emits BEGIN itself (and not before SELECT), which
    # defeats locking; take over BEGIN as SQLAlchemy's SQLite docs describe.
    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        mode = conn.get_execution_options().get(SQLITE_BEGIN_OPTION, "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")

