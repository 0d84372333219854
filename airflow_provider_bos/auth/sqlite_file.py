"""The token store's SQLite file: created owner-only, and driven so that its locks hold.

The default store is ``$AIRFLOW_HOME/bos_token_store.db`` (``0600`` in a ``0700`` directory when it
creates them). pysqlite's own transaction handling is replaced so that ``BEGIN IMMEDIATE`` can be
asked for per connection (the execution option :data:`SQLITE_BEGIN_OPTION`).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

__all__ = ["ensure_private_sqlite_file", "default_token_store_url", "configure_sqlite", "SQLITE_BEGIN_OPTION",
           "DEFAULT_FILE_NAME"]

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


def default_token_store_url() -> str:
    """``sqlite:///$AIRFLOW_HOME/bos_token_store.db`` (``~/airflow`` without AIRFLOW_HOME), created 0600.

    Right for a single machine only; see the module docstring for shared deployments.
    """
    home = Path(os.environ.get("AIRFLOW_HOME") or Path.home() / "airflow").expanduser()
    file = ensure_private_sqlite_file(home / DEFAULT_FILE_NAME)
    return f"sqlite:///{file}"


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

