"""Where an OAuth grant lives between task runs: one SQL row per connection, refreshed under a lock.

Airflow 3 tasks cannot write Connections, and BOS refresh tokens rotate (each refresh returns a new
refresh token and reusing an old one revokes the grant). So the current refresh token lives in a
SQL table, ``bos_oauth_grants``, one row per connection id, and every refresh happens under that
row's lock: ``SELECT ... FOR UPDATE`` on PostgreSQL and MySQL/MariaDB, ``BEGIN IMMEDIATE`` on
SQLite. The refresher re-reads the row after taking the lock, so a token another worker just
refreshed is reused instead of refreshed again, and the new refresh token is committed before the
new access token is handed out.

Which store to use:

- **SQLite file** (the default, ``$AIRFLOW_HOME/bos_token_store.db``, owner-only ``0600``): right
  when every task that uses the connection runs on ONE machine (LocalExecutor, ``airflow
  standalone``, a single Celery worker host). SQLite locks are only reliable on a local disk; do not
  put the file on NFS or share it between hosts.
- **A shared SQL database** (a SQLAlchemy URL or an Airflow SQL connection, PostgreSQL or
  MySQL/MariaDB): required when tasks run on several hosts (Celery with several workers,
  Kubernetes). Every worker must point at the same table, or two of them will refresh the same
  grant independently and the server will revoke it.

Secrets at rest: pass a :class:`Cipher` (Airflow's Fernet, or ``cryptography.fernet.Fernet``) and
the access/refresh token columns hold ``enc:v1:<base64 ciphertext>``; without one they hold
``raw:<token>``. A store opened without the key refuses encrypted rows rather than mis-reading them.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine, make_url

from airflow_provider_bos.exceptions import BosConfigurationError, BosTokenStoreError, excerpt
from airflow_provider_bos.redaction import register_secret

__all__ = [
    "Cipher",
    "StoredGrant",
    "SqlTokenStore",
    "default_token_store_url",
    "ensure_private_sqlite_file",
    "refresh_token_fingerprint",
    "DEFAULT_TABLE",
    "DEFAULT_FILE_NAME",
]

DEFAULT_TABLE = "bos_oauth_grants"
DEFAULT_FILE_NAME = "bos_token_store.db"
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_ENC_PREFIX = "enc:v1:"
_RAW_PREFIX = "raw:"
_SQLITE_BEGIN_OPTION = "bos_sqlite_begin"


@runtime_checkable
class Cipher(Protocol):
    """Symmetric encryption of token columns; ``cryptography.fernet.Fernet`` satisfies it."""

    def encrypt(self, data: bytes) -> bytes: ...

    def decrypt(self, token: bytes) -> bytes: ...


def refresh_token_fingerprint(refresh_token: str) -> str:
    """sha256 hex of a refresh token: identifies the seed without storing it twice."""
    return hashlib.sha256(refresh_token.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class StoredGrant:
    """One row of the token store, tokens decrypted. The repr never shows a token."""

    key: str
    client_id: str
    token_endpoint: str
    resource: str
    scope: str
    access_token: str | None
    refresh_token: str | None
    expires_at: float | None  # epoch seconds; None = the server gave no lifetime
    generation: int
    seed_fingerprint: str | None
    updated_at: float

    def __repr__(self) -> str:
        return (
            f"StoredGrant(key={self.key!r}, client_id={self.client_id!r}, resource={self.resource!r}, "
            f"generation={self.generation}, expires_at={self.expires_at!r}, "
            f"access_token={'***' if self.access_token else None}, "
            f"refresh_token={'***' if self.refresh_token else None})"
        )

    __str__ = __repr__

    def access_token_valid(self, *, margin_s: float = 0.0, now: float | None = None) -> bool:
        """An access token is present and does not expire within ``margin_s``."""
        if not self.access_token:
            return False
        if self.expires_at is None:
            return True
        return self.expires_at - margin_s > (time.time() if now is None else now)


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


def _configure_sqlite(engine: Engine) -> None:
    # pysqlite's legacy transaction control emits BEGIN itself (and not before SELECT), which
    # defeats locking; take over BEGIN as SQLAlchemy's SQLite docs describe.
    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        mode = conn.get_execution_options().get(_SQLITE_BEGIN_OPTION, "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")


class _RetryInsert(Exception):
    """Two workers inserted the same missing row at once; take the lock again."""


class SqlTokenStore:
    """Grants in a SQL table on any SQLAlchemy engine or URL (SQLite, PostgreSQL, MySQL/MariaDB).

    For SQLite the store always builds its own engine from the URL (so pysqlite's transaction
    handling can be fixed and a busy timeout set); other engines are used as given. Create one store
    per process: engines must not cross ``fork``.
    """

    def __init__(
        self,
        engine_or_url: Engine | str | sa.URL,
        *,
        table: str = DEFAULT_TABLE,
        cipher: Cipher | None = None,
        busy_timeout_s: float = 60.0,
        lock_timeout_s: float = 60.0,
    ) -> None:
        if not _IDENTIFIER.match(table):
            raise BosConfigurationError(f"Token store table name {table!r} is not a plain SQL identifier.")
        self._cipher = cipher
        self._lock_timeout_s = lock_timeout_s
        url = engine_or_url.url if isinstance(engine_or_url, Engine) else make_url(engine_or_url)
        self._dialect_name = url.get_backend_name()
        if self._dialect_name == "sqlite":
            database = url.database or ""
            if (
                database in ("", ":memory:")
                or database.startswith("file::memory:")
                or "mode=memory" in str(url)
            ):
                raise BosConfigurationError(
                    "The token store must be durable: an in-memory SQLite database is not."
                )
            ensure_private_sqlite_file(database)
            self._engine = sa.create_engine(
                url, connect_args={"timeout": busy_timeout_s}, hide_parameters=True
            )
            _configure_sqlite(self._engine)
            self._owns_engine = True
        elif isinstance(engine_or_url, Engine):
            self._engine = engine_or_url
            self._owns_engine = False
        else:
            self._engine = sa.create_engine(url, pool_pre_ping=True, hide_parameters=True)
            self._owns_engine = True
        metadata = sa.MetaData()
        self._table = sa.Table(
            table,
            metadata,
            sa.Column("key", sa.String(250), primary_key=True),
            sa.Column("client_id", sa.String(255), nullable=False),
            sa.Column("token_endpoint", sa.Text, nullable=False),
            sa.Column("resource", sa.Text, nullable=False),
            sa.Column("scope", sa.Text, nullable=False),
            sa.Column("access_token", sa.Text, nullable=True),
            sa.Column("refresh_token", sa.Text, nullable=True),
            sa.Column("expires_at", sa.Double, nullable=True),
            sa.Column("generation", sa.Integer, nullable=False),
            sa.Column("seed_fingerprint", sa.String(64), nullable=True),
            sa.Column("updated_at", sa.Double, nullable=False),
        )
        self._table_ready = False

    # --- plumbing ---------------------------------------------------------------------------

    @property
    def engine(self) -> Engine:
        return self._engine

    @property
    def table_name(self) -> str:
        return self._table.name

    @property
    def encrypted(self) -> bool:
        return self._cipher is not None

    def dispose(self) -> None:
        """Release pooled connections (only of an engine this store created)."""
        if self._owns_engine:
            self._engine.dispose()

    def __repr__(self) -> str:
        return (
            f"SqlTokenStore({self._engine.url.render_as_string(hide_password=True)!r}, "
            f"table={self._table.name!r}, encrypted={self.encrypted})"
        )

    def _fail(self, action: str, exc: BaseException) -> BosTokenStoreError:
        orig = getattr(exc, "orig", None) or exc
        # Only the driver's message, trimmed: SQLAlchemy's own text would include bound parameters.
        first_line = str(orig).splitlines()[0] if str(orig) else ""
        return BosTokenStoreError(
            f"Token store {action} failed on {self._engine.url.render_as_string(hide_password=True)} "
            f"(table {self._table.name}): {type(orig).__name__}: {excerpt(first_line, 160)}"
        )

    @contextmanager
    def _writing(self) -> Iterator[Connection]:
        """A write transaction; on SQLite ``BEGIN IMMEDIATE`` so the busy timeout applies.

        (A deferred SQLite transaction that reads and then writes cannot wait for the write lock:
        SQLite answers "database is locked" at once to avoid a deadlock.)
        """
        with self._engine.connect() as conn:
            if self._dialect_name == "sqlite":
                conn.execution_options(**{_SQLITE_BEGIN_OPTION: "IMMEDIATE"})
            with conn.begin():
                yield conn

    def ensure_table(self) -> None:
        """Create the table if it does not exist (safe when several workers race to do it)."""
        if self._table_ready:
            return
        try:
            with self._writing() as conn:
                self._table.create(conn, checkfirst=True)
        except sa.exc.SQLAlchemyError as exc:
            # Another process may have created it between the check and the CREATE.
            try:
                exists = sa.inspect(self._engine).has_table(self._table.name)
            except sa.exc.SQLAlchemyError:
                exists = False
            if not exists:
                raise self._fail("table creation", exc) from None
        self._table_ready = True

    def _encode(self, value: str | None) -> str | None:
        if value is None:
            return None
        if self._cipher is None:
            return _RAW_PREFIX + value
        ciphertext = self._cipher.encrypt(value.encode("utf-8"))
        return _ENC_PREFIX + base64.urlsafe_b64encode(ciphertext).decode("ascii")

    def _decode(self, key: str, column: str, stored: str | None) -> str | None:
        if stored is None:
            return None
        if stored.startswith(_RAW_PREFIX):
            value = stored[len(_RAW_PREFIX) :]
        elif stored.startswith(_ENC_PREFIX):
            if self._cipher is None:
                raise BosTokenStoreError(
                    f"The token store row {key!r} is encrypted ({column}); open the store with the same "
                    "Fernet key (Airflow's [core] fernet_key) to read it."
                )
            try:
                value = self._cipher.decrypt(base64.urlsafe_b64decode(stored[len(_ENC_PREFIX) :])).decode(
                    "utf-8"
                )
            except Exception:  # noqa: BLE001 - InvalidToken, binascii.Error, UnicodeDecodeError
                raise BosTokenStoreError(
                    f"The token store row {key!r} ({column}) cannot be decrypted with the configured key; "
                    "use the key it was written with, or reconnect."
                ) from None
        else:
            raise BosTokenStoreError(f"The token store row {key!r} ({column}) has an unknown format.")
        register_secret(value)
        return value

    def _row_to_grant(self, row: Any) -> StoredGrant:
        m = row._mapping
        return StoredGrant(
            key=m["key"],
            client_id=m["client_id"],
            token_endpoint=m["token_endpoint"],
            resource=m["resource"],
            scope=m["scope"],
            access_token=self._decode(m["key"], "access_token", m["access_token"]),
            refresh_token=self._decode(m["key"], "refresh_token", m["refresh_token"]),
            expires_at=None if m["expires_at"] is None else float(m["expires_at"]),
            generation=int(m["generation"]),
            seed_fingerprint=m["seed_fingerprint"],
            updated_at=float(m["updated_at"]),
        )

    def _values(self, grant: StoredGrant) -> dict[str, Any]:
        return {
            "client_id": grant.client_id,
            "token_endpoint": grant.token_endpoint,
            "resource": grant.resource,
            "scope": grant.scope,
            "access_token": self._encode(grant.access_token),
            "refresh_token": self._encode(grant.refresh_token),
            "expires_at": grant.expires_at,
            "generation": grant.generation,
            "seed_fingerprint": grant.seed_fingerprint,
            "updated_at": grant.updated_at,
        }

    @contextmanager
    def _locked(self, key: str) -> Iterator[tuple[Connection, StoredGrant | None]]:
        """One short transaction holding the row lock (or SQLite's write lock); commits on exit."""
        self.ensure_table()
        with self._writing() as conn:
            if self._dialect_name == "postgresql":
                # Fail clearly rather than wait forever behind a stuck refresher.
                conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{int(self._lock_timeout_s * 1000)}ms'")
            elif self._dialect_name in ("mysql", "mariadb"):
                conn.exec_driver_sql(
                    f"SET SESSION innodb_lock_wait_timeout = {max(1, round(self._lock_timeout_s))}"
                )
            row = conn.execute(
                sa.select(self._table).where(self._table.c.key == key).with_for_update()
            ).first()
            yield conn, (self._row_to_grant(row) if row is not None else None)

    def _write(self, conn: Connection, current: StoredGrant | None, new: StoredGrant) -> None:
        if current is None:
            try:
                conn.execute(sa.insert(self._table).values(key=new.key, **self._values(new)))
            except sa.exc.IntegrityError:
                # Someone inserted first; the transaction rolls back and the caller locks again.
                # (No savepoint: MySQL ends the whole transaction on a deadlock anyway.)
                raise _RetryInsert() from None
            return
        result = conn.execute(
            sa.update(self._table)
            .where(self._table.c.key == new.key, self._table.c.generation == current.generation)
            .values(**self._values(new))
        )
        if result.rowcount != 1:
            raise BosTokenStoreError(
                f"The token store row {new.key!r} changed while locked; "
                "the database does not honour row locks."
            )

    def _run_locked(
        self, key: str, update: Callable[[StoredGrant | None], StoredGrant | None]
    ) -> StoredGrant | None:
        for attempt in range(3):
            creating = False  # only a row creation is safe to retry: ``update`` did nothing external
            try:
                with self._locked(key) as (conn, current):
                    creating = current is None
                    new = update(current)
                    if new is None or new is current:
                        return current
                    if new.key != key:
                        raise BosTokenStoreError("A grant cannot change its key.")
                    self._write(conn, current, new)
                return new
            except _RetryInsert:
                if attempt == 2:
                    raise BosTokenStoreError(f"Could not insert the token store row {key!r}.") from None
            except sa.exc.OperationalError as exc:
                # MySQL may pick a gap-lock deadlock victim when two workers create the same row.
                deadlock = "deadlock" in str(getattr(exc, "orig", exc)).lower()
                if attempt == 2 or not (creating and deadlock):
                    raise self._fail("locked update", exc) from None
            except sa.exc.SQLAlchemyError as exc:
                raise self._fail("locked update", exc) from None
        raise AssertionError("unreachable")

    # --- public API --------------------------------------------------------------------------

    def load(self, key: str) -> StoredGrant | None:
        """The current row, without a lock (a consistent snapshot)."""
        self.ensure_table()
        try:
            with self._engine.connect() as conn, conn.begin():
                row = conn.execute(sa.select(self._table).where(self._table.c.key == key)).first()
        except sa.exc.SQLAlchemyError as exc:
            raise self._fail("read", exc) from None
        return self._row_to_grant(row) if row is not None else None

    def refresh_locked(
        self, key: str, update: Callable[[StoredGrant | None], StoredGrant | None]
    ) -> StoredGrant | None:
        """Run ``update(current_row)`` under the row lock and persist what it returns.

        ``update`` sees the row as re-read after the lock was taken (``None`` when absent). It returns
        ``None`` (or the row it got) to change nothing, or a new :class:`StoredGrant` that is written
        and committed before this method returns. An exception from ``update`` rolls back and
        propagates. Keep ``update`` short: it holds the lock (a token refresh call is the intended
        exception: serialising refreshes is the point).
        """
        return self._run_locked(key, update)

    def save(self, grant: StoredGrant) -> StoredGrant:
        """Write ``grant`` as the row for ``grant.key`` unconditionally (under the lock)."""
        stamped = replace(grant, updated_at=time.time())
        self._run_locked(grant.key, lambda _current: stamped)
        return stamped

    def seed(
        self,
        key: str,
        *,
        client_id: str,
        token_endpoint: str,
        resource: str,
        scope: str,
        refresh_token: str,
        access_token: str | None = None,
        expires_at: float | None = None,
        force: bool = False,
    ) -> StoredGrant:
        """Install a freshly connected grant, unless the row already holds this same seed.

        The row remembers ``sha256(refresh_token)`` of its seed. A seed with the same fingerprint is a
        no-op (the row has moved on by rotation since), a different one replaces the row: that is a
        re-connected Connection. ``force`` replaces regardless. A new row starts at generation 1; a
        replaced row continues at ``generation + 1`` so workers holding the old row see it moved.
        """
        register_secret(refresh_token)
        register_secret(access_token)
        fingerprint = refresh_token_fingerprint(refresh_token)

        def update(current: StoredGrant | None) -> StoredGrant | None:
            if current is not None and current.seed_fingerprint == fingerprint and not force:
                return None
            return StoredGrant(
                key=key,
                client_id=client_id,
                token_endpoint=token_endpoint,
                resource=resource,
                scope=scope,
                access_token=access_token,
                refresh_token=refresh_token,
                expires_at=expires_at,
                generation=1 if current is None else current.generation + 1,
                seed_fingerprint=fingerprint,
                updated_at=time.time(),
            )

        result = self._run_locked(key, update)
        assert result is not None
        return result

    def delete(self, key: str) -> bool:
        """Remove the row; True when there was one."""
        self.ensure_table()
        try:
            with self._writing() as conn:
                return conn.execute(sa.delete(self._table).where(self._table.c.key == key)).rowcount > 0
        except sa.exc.SQLAlchemyError as exc:
            raise self._fail("delete", exc) from None

    def raw_row(self, key: str) -> dict[str, Any] | None:
        """The row exactly as stored (ciphertext included): for diagnostics and tests."""
        self.ensure_table()
        with self._engine.connect() as conn, conn.begin():
            row = conn.execute(sa.select(self._table).where(self._table.c.key == key)).first()
        return dict(row._mapping) if row is not None else None
