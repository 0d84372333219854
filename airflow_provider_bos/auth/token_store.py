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
the access/refresh token columns hold each token sealed to its row (:mod:`.sealed`: encrypted with
the row's key, client id, resource and token endpoint, and checked against them on every read, so a
ciphertext copied into another row or under altered columns is refused); without one they hold
``raw:<token>``. A store opened without the key refuses encrypted rows rather than mis-reading them,
and a store opened with a key refuses ``raw:`` rows (whoever wrote them did not hold the key).

Rows of the earlier unbound format (``enc:v1:``, each token encrypted alone) are refused on read
(:class:`~.sealed.LegacyTokenError`): such a ciphertext names no row, so a table writer could move
it into a row of their own. :meth:`SqlTokenStore.reseal_legacy` (the admin command
``airflow-provider-bos token-store reseal``) re-seals every such row to the row it is in, in one
transaction, and refuses a ciphertext that is in more than one place (a copy).

Keys are compared exactly. A new table on MySQL/MariaDB is created ``utf8mb4_bin`` (the default
collations compare case-insensitively: ``bos_prod`` would read and overwrite ``Bos_Prod``'s row);
an existing table whose key column is not binary is converted once (or, when the store's user may
not ALTER it, refused with the statement to run), and on every dialect the row a query returns is
used only when its key is exactly the one asked for.

Read-only stores (``read_only=True``, for the Admin -> BOS page): nothing is created or changed: a
SQLite file is opened ``mode=ro`` (a missing file is an empty store, never created, never chmod-ed),
and a missing table is an empty store (no ``CREATE TABLE``).

Seeds: the row remembers ``sha256`` of every refresh token it was ever seeded from
(``consumed_seeds``). A seed it has consumed never replaces the row again (an old Connection, a
stale secrets cache), and a value that cannot be a token (``***``, empty) is refused outright; only
a never-seen seed (a real reconnect) replaces the row.

This module is the locked refresh protocol: :class:`SqlTokenStore`, each of whose writes is one
transaction holding the row's lock, with its dialect branches (row lock, lock-wait restore, upsert)
and the seed checks, read together so that no path writes half a grant. Beside it: the table, its
DDL and upgrades and the exact-key check (:mod:`.grant_table`); a grant as a row and back, its
tokens sealed or raw (:mod:`.grant_codec`); the one-step re-seal of ``enc:v1:`` rows
(:mod:`.reseal`); the row as a value (:mod:`.stored_grant`); the sealing of a token to its row
(:mod:`.sealed`); and the SQLite file (:mod:`.sqlite_file`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine, make_url

from airflow_provider_bos.auth.grant_codec import GrantCodec
from airflow_provider_bos.auth.grant_table import (
    DEFAULT_TABLE,
    GrantTable,
    TokenStoreDatabaseError,
    check_table_name,
)
from airflow_provider_bos.auth.reseal import ResealReport, reseal_legacy
from airflow_provider_bos.auth.sealed import Cipher
from airflow_provider_bos.auth.sqlite_file import (
    DEFAULT_FILE_NAME,
    SQLITE_BEGIN_OPTION,
    default_token_store_path,
    default_token_store_url,
    ensure_private_sqlite_file,
    sqlite_store_engine,
)
from airflow_provider_bos.auth.stored_grant import (
    MAX_TOKEN_CHARS,
    StoredGrant,
    refresh_token_fingerprint,
    token_problem,
)
from airflow_provider_bos.exceptions import BosConfigurationError, BosTokenStoreError
from airflow_provider_bos.redaction import register_secret

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_FILE_NAME",
    "DEFAULT_TABLE",
    "MAX_TOKEN_CHARS",
    "Cipher",
    "ResealReport",
    "SqlTokenStore",
    "StoredGrant",
    "TokenStoreDatabaseError",
    "default_token_store_path",
    "default_token_store_url",
    "ensure_private_sqlite_file",
    "refresh_token_fingerprint",
    "token_problem",
]

# Where one row can be locked for a refresh. A warehouse such as Snowflake has no row locks (a
# writer locks the table until commit) and bills per second of a running warehouse: not a token store.
_ROW_LOCKING_BACKENDS = frozenset({"sqlite", "postgresql", "mysql", "mariadb"})
# Commit attempts for a rotated grant (the old refresh token is already spent at the server).
_ROTATED_COMMIT_ATTEMPTS = 4


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
        read_only: bool = False,
    ) -> None:
        check_table_name(table)  # before anything is opened or created
        self._codec = GrantCodec(cipher)
        self._lock_timeout_s = lock_timeout_s
        self._read_only = read_only
        self._absent = False  # a read-only SQLite store whose file does not exist
        url = engine_or_url.url if isinstance(engine_or_url, Engine) else make_url(engine_or_url)
        self._label = url.render_as_string(hide_password=True)
        self._dialect_name = url.get_backend_name()
        if self._dialect_name not in _ROW_LOCKING_BACKENDS:
            raise BosConfigurationError(
                f"The token store cannot live in {self._dialect_name!r}: it needs a database that locks one "
                "row for a refresh (SELECT ... FOR UPDATE), so use SQLite, PostgreSQL or MySQL/MariaDB "
                "for token_store_url (the default is a SQLite file in AIRFLOW_HOME)."
            )
        if self._dialect_name == "sqlite":
            engine = sqlite_store_engine(url, read_only=read_only, busy_timeout_s=busy_timeout_s)
            self._absent = engine is None
            # A missing file is an empty store: an engine that is never connected stands in.
            self._engine = engine or sa.create_engine("sqlite://", poolclass=sa.pool.NullPool)
            self._owns_engine = True
        elif isinstance(engine_or_url, Engine):
            self._engine = engine_or_url
            self._owns_engine = False
        else:
            self._engine = sa.create_engine(url, pool_pre_ping=True, hide_parameters=True)
            self._owns_engine = True
        self._table = GrantTable(
            self._engine, table, dialect_name=self._dialect_name, label=self._label, read_only=read_only
        )

    # --- plumbing ---------------------------------------------------------------------------

    @property
    def engine(self) -> Engine:
        return self._engine

    @property
    def table_name(self) -> str:
        return self._table.name

    @property
    def encrypted(self) -> bool:
        return self._codec.cipher is not None

    @property
    def read_only(self) -> bool:
        return self._read_only

    def dispose(self) -> None:
        """Release pooled connections (only of an engine this store created)."""
        if self._owns_engine:
            self._engine.dispose()

    def __repr__(self) -> str:
        return (
            f"SqlTokenStore({self._label!r}, table={self._table.name!r}, encrypted={self.encrypted}"
            f"{', read-only' if self._read_only else ''})"
        )

    def binary_key_statement(self) -> str:
        """The MySQL/MariaDB statement that gives an existing table binary keys."""
        return self._table.binary_key_statement()

    def ensure_table(self) -> None:
        """Create the table if it does not exist (safe when several workers race to do it)."""
        self._table.ensure()

    @contextmanager
    def _locked(self, key: str, *, tolerant: bool = False) -> Iterator[tuple[Connection, StoredGrant | None]]:
        """One short transaction holding the row lock (or SQLite's write lock); commits on exit.

        On MySQL/MariaDB the lock wait is a session setting: the previous value is put back before
        the connection returns to the pool (a pooled connection is shared with other code).
        """
        self.ensure_table()
        with self._engine.connect() as conn:
            if self._dialect_name == "sqlite":
                conn.execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE"})
            previous_wait: int | None = None
            try:
                with conn.begin():
                    if self._dialect_name == "postgresql":
                        # Fail clearly rather than wait forever behind a stuck refresher.
                        conn.exec_driver_sql(
                            f"SET LOCAL lock_timeout = '{int(self._lock_timeout_s * 1000)}ms'"
                        )
                    elif self._dialect_name in ("mysql", "mariadb"):
                        previous_wait = int(
                            conn.exec_driver_sql("SELECT @@SESSION.innodb_lock_wait_timeout").scalar_one()
                        )
                        conn.exec_driver_sql(
                            f"SET SESSION innodb_lock_wait_timeout = {max(1, round(self._lock_timeout_s))}"
                        )
                    row = self._table.exact(conn.execute(self._table.row_query(key).with_for_update()).first(), key)
                    yield conn, (self._codec.grant(row, tolerant=tolerant) if row is not None else None)
            finally:
                if previous_wait is not None:
                    self._restore_lock_wait(conn, previous_wait)

    @staticmethod
    def _restore_lock_wait(conn: Connection, seconds: int) -> None:
        try:
            conn.exec_driver_sql(f"SET SESSION innodb_lock_wait_timeout = {int(seconds)}")
            conn.commit()
        except sa.exc.SQLAlchemyError:
            # A connection whose session setting is unknown must not go back to the pool.
            conn.invalidate()

    def _write(self, conn: Connection, current: StoredGrant | None, new: StoredGrant) -> None:
        table = self._table.table
        values = self._codec.values(new)
        if current is None:
            try:
                conn.execute(sa.insert(table).values(key=new.key, **values))
            except sa.exc.IntegrityError:
                # Someone inserted first; the transaction rolls back and the caller locks again.
                # (No savepoint: MySQL ends the whole transaction on a deadlock anyway.)
                raise _RetryInsert() from None
            return
        result = conn.execute(
            sa.update(table)
            .where(table.c.key == new.key, table.c.generation == current.generation)
            .values(**values)
        )
        if result.rowcount != 1:
            raise BosTokenStoreError(
                f"The token store row {new.key!r} changed while locked; "
                "the database does not honour row locks."
            )

    def _run_locked(
        self,
        key: str,
        update: Callable[[StoredGrant | None], StoredGrant | None],
        *,
        tolerant: bool = False,
        spends_grant: bool = False,
    ) -> StoredGrant | None:
        """Run ``update`` under the lock and write what it returns.

        ``spends_grant``: ``update`` calls the token endpoint, so once it has returned a new row the
        old refresh token is spent at the server; a failed write or commit is then retried on its
        own rather than given up (giving up loses the grant).
        """
        for attempt in range(3):
            creating = False  # only a row creation is safe to retry: ``update`` did nothing external
            before: StoredGrant | None = None
            new: StoredGrant | None = None
            try:
                with self._locked(key, tolerant=tolerant) as (conn, current):
                    creating = current is None
                    before = current
                    new = update(current)
                    if new is None or new is current:
                        return current
                    if new.key != key:
                        raise BosTokenStoreError("A grant cannot change its key.")
                    self._write(conn, current, new)
                return new
            except _RetryInsert:
                if spends_grant and new is not None:
                    raise BosTokenStoreError(
                        f"The token store row {key!r} was created by another worker during a refresh."
                    ) from None
                if attempt == 2:
                    raise BosTokenStoreError(f"Could not insert the token store row {key!r}.") from None
            except sa.exc.SQLAlchemyError as exc:
                if spends_grant and new is not None and before is not None:
                    return self._commit_rotated(before, new, exc)
                # MySQL may pick a gap-lock deadlock victim when two workers create the same row.
                deadlock = "deadlock" in str(getattr(exc, "orig", exc)).lower()
                if attempt == 2 or not (creating and deadlock and isinstance(exc, sa.exc.OperationalError)):
                    raise self._table.fail("locked update", exc) from None
        raise AssertionError("unreachable")

    def _commit_rotated(
        self, before: StoredGrant, new: StoredGrant, first_error: BaseException
    ) -> StoredGrant:
        """Write a grant the server already rotated after the first write or commit failed.

        Each attempt is a fresh transaction that re-locks the row and writes only if it is still the
        row the refresh started from (nobody else can have a newer one: they would need the
        refresh token this refresh just spent).
        """
        error: BaseException = first_error
        for attempt in range(1, _ROTATED_COMMIT_ATTEMPTS):
            logger.warning(
                "Token store: saving the rotated grant %r failed (%s); retrying (%d/%d).",
                new.key,
                type(getattr(error, "orig", error)).__name__,
                attempt,
                _ROTATED_COMMIT_ATTEMPTS - 1,
            )
            time.sleep(0.2 * 2**attempt)  # back off from a transient database failure
            try:
                with self._locked(new.key, tolerant=True) as (conn, current):
                    if current is not None and current.refresh_token == new.refresh_token:
                        return current  # the failed COMMIT had in fact reached the database
                    if current is None or current.generation != before.generation:
                        raise BosTokenStoreError(
                            f"The token store row {new.key!r} changed while its rotated grant was being "
                            "saved; the grant is probably lost."
                        )
                    self._write(conn, current, new)
                return new
            except sa.exc.SQLAlchemyError as exc:
                error = exc
        failure = self._table.fail("saving the rotated grant", error)
        raise BosTokenStoreError(
            f"{failure} BOS already rotated the refresh token, so the grant {new.key!r} is lost: reconnect "
            f"with: airflow-provider-bos connect --conn-id {new.key}"
        ) from None

    # --- public API --------------------------------------------------------------------------

    def _read_row(self, key: str) -> Any:
        """The row of ``key`` as stored (exactly that key), or None; creates nothing when read-only."""
        if self._read_only:
            if self._absent or not self._table.present():
                return None
        else:
            self.ensure_table()
        try:
            with self._engine.connect() as conn, conn.begin():
                return self._table.exact(conn.execute(self._table.row_query(key)).first(), key)
        except sa.exc.SQLAlchemyError as exc:
            raise self._table.fail("read", exc) from None

    def load(self, key: str) -> StoredGrant | None:
        """The current row, without a lock (a consistent snapshot)."""
        row = self._read_row(key)
        return self._codec.grant(row) if row is not None else None

    def refresh_locked(
        self,
        key: str,
        update: Callable[[StoredGrant | None], StoredGrant | None],
        *,
        spends_grant: bool = False,
    ) -> StoredGrant | None:
        """Run ``update(current_row)`` under the row lock and persist what it returns.

        ``update`` sees the row as re-read after the lock was taken (``None`` when absent). It returns
        ``None`` (or the row it got) to change nothing, or a new :class:`StoredGrant` that is written
        and committed before this method returns. An exception from ``update`` rolls back and
        propagates. Keep ``update`` short: it holds the lock (a token refresh call is the intended
        exception: serialising refreshes is the point). ``spends_grant``: ``update`` calls the token
        endpoint, so a failed commit of what it returns is retried (see :meth:`_commit_rotated`).
        """
        return self._run_locked(key, update, spends_grant=spends_grant)

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
        """Install a freshly connected grant, unless the row has already consumed this seed.

        The row remembers ``sha256`` of every refresh token it was seeded from. A seed it has
        consumed is a no-op (the row has moved on by rotation since; re-using that token would make
        BOS revoke the grant); a never-seen one replaces the row: that is a re-connected
        Connection. ``force`` (the connect command, which has just received the token) replaces
        regardless. A value that cannot be a token (``***``, empty) is refused with
        :class:`BosTokenStoreError` and nothing is written. A new row starts at generation 1; a
        replaced row continues at ``generation + 1`` so workers holding the old row see it moved.
        """
        problem = token_problem(refresh_token)
        if problem is not None:
            raise BosTokenStoreError(
                f"Refusing to seed the token store row {key!r}: the refresh token is {problem}."
            )
        register_secret(refresh_token)
        register_secret(access_token)
        fingerprint = refresh_token_fingerprint(refresh_token)
        replaced: list[bool] = []

        def update(current: StoredGrant | None) -> StoredGrant | None:
            if current is not None and fingerprint in current.consumed_seeds and not force:
                return None
            replaced.append(True)
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
                consumed_seeds=(current.consumed_seeds if current else frozenset()) | {fingerprint},
            )

        # Tolerant: a row this seed replaces may be unreadable (another key, a raw row).
        result = self._run_locked(key, update, tolerant=True)
        if not replaced:
            return self._require(key)  # the row as it is, or the clear error if it is unreadable
        assert result is not None
        return result

    def _require(self, key: str) -> StoredGrant:
        grant = self.load(key)
        if grant is None:
            raise BosTokenStoreError(f"The token store row {key!r} disappeared.")
        return grant

    def delete(self, key: str) -> bool:
        """Remove the row; True when there was one."""
        self.ensure_table()
        try:
            table = self._table.table
            with self._table.writing() as conn:
                where = table.c.key == key
                found = conn.execute(sa.select(table.c.key).where(where)).scalars().all()
                if any(name != key for name in found):  # another key the column takes for equal
                    raise BosTokenStoreError(
                        f"Not deleting the token store row {key!r}: the key column treats other keys as equal "
                        f"to it. {self._table.collation_fix()}"
                    )
                return conn.execute(sa.delete(table).where(where)).rowcount > 0
        except sa.exc.SQLAlchemyError as exc:
            raise self._table.fail("delete", exc) from None

    def raw_row(self, key: str) -> dict[str, Any] | None:
        """The row exactly as stored (ciphertext included): for diagnostics, the page and tests."""
        row = self._read_row(key)
        return dict(row._mapping) if row is not None else None

    def reseal_legacy(self) -> ResealReport:
        """Re-seal every row that still holds tokens of the earlier unbound format (``enc:v1:``), in
        one transaction holding every such row's lock (SQLite: the write lock).

        Each such token is bound to the row it is in now. A ciphertext found in more than one place
        (two rows, or both columns) was copied: neither row can say which is its own, so those rows
        are left as they are (refused on read; a reconnect replaces them) and reported. So are rows
        whose tokens the configured key cannot decrypt.
        """
        return reseal_legacy(self._table, self._codec.cipher)
