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

Why this module is above ~500 lines: every method is one locked transaction on the same row, and
its three dialect branches (row lock, lock-wait restore, upsert), the seed/binding checks, the
exact-key check and the one-step reseal must be read together to see that no path writes half a
grant or another key's row. What does not hold the lock lives beside it:
the row as a value (:mod:`.stored_grant`), the sealing of its tokens (:mod:`.sealed`) and the
SQLite file (:mod:`.sqlite_file`).
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine, make_url

from airflow_provider_bos.auth.sealed import (
    LEGACY_PREFIX,
    SEALED_PREFIX,
    Cipher,
    RowBinding,
    seal,
    unseal,
    unseal_legacy,
)
from airflow_provider_bos.auth.sqlite_file import (
    DEFAULT_FILE_NAME,
    SQLITE_BEGIN_OPTION,
    configure_sqlite,
    default_token_store_path,
    default_token_store_url,
    ensure_private_sqlite_file,
    read_only_sqlite_engine,
)
from airflow_provider_bos.auth.stored_grant import (
    MAX_TOKEN_CHARS,
    StoredGrant,
    refresh_token_fingerprint,
    token_problem,
)
from airflow_provider_bos.exceptions import (
    BosConfigurationError,
    BosTokenBindingError,
    BosTokenStoreError,
    excerpt,
)
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

DEFAULT_TABLE = "bos_oauth_grants"
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_RAW_PREFIX = "raw:"
# Where one row can be locked for a refresh. A warehouse such as Snowflake has no row locks (a
# writer locks the table until commit) and bills per second of a running warehouse: not a token store.
_ROW_LOCKING_BACKENDS = frozenset({"sqlite", "postgresql", "mysql", "mariadb"})
# Columns added after the first release, with their DDL type: ensure_table adds missing ones.
_ADDED_COLUMNS = {"consumed_seeds": "TEXT"}
# Commit attempts for a rotated grant (the old refresh token is already spent at the server).
_ROTATED_COMMIT_ATTEMPTS = 4
# MySQL/MariaDB: the table's character set and binary collation (as the warehouse tables have): keys
# that differ only in case are different rows.
_MYSQL_TABLE_OPTIONS: dict[str, Any] = {
    "mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin",
}
_TOKEN_COLUMNS = ("access_token", "refresh_token")


@dataclass(frozen=True)
class ResealReport:
    """What :meth:`SqlTokenStore.reseal_legacy` did: the rows re-sealed (key, resource, token endpoint)
    and the rows it refused, with why (a reconnect replaces them)."""

    resealed: tuple[tuple[str, str, str], ...]
    refused: tuple[tuple[str, str], ...]


class _RetryInsert(Exception):
    """Two workers inserted the same missing row at once; take the lock again."""


class TokenStoreDatabaseError(BosTokenStoreError):
    """The store's database failed; the message carries the driver's own text (for logs and the CLI,
    not for a page whose user chose the database)."""


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
        if not _IDENTIFIER.match(table):
            raise BosConfigurationError(f"Token store table name {table!r} is not a plain SQL identifier.")
        self._cipher = cipher
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
                reader = read_only_sqlite_engine(database, busy_timeout_s=busy_timeout_s)
                self._absent = reader is None
                # A missing file is an empty store: an engine that is never connected stands in.
                self._engine = reader or sa.create_engine("sqlite://", poolclass=sa.pool.NullPool)
            else:
                ensure_private_sqlite_file(database)
                self._engine = sa.create_engine(
                    url, connect_args={"timeout": busy_timeout_s}, hide_parameters=True
                )
                configure_sqlite(self._engine)
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
            sa.Column("consumed_seeds", sa.Text, nullable=True),
            **_MYSQL_TABLE_OPTIONS,
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

    def _fail(self, action: str, exc: BaseException) -> BosTokenStoreError:
        orig = getattr(exc, "orig", None) or exc
        # Only the driver's message, trimmed: SQLAlchemy's own text would include bound parameters.
        first_line = str(orig).splitlines()[0] if str(orig) else ""
        return TokenStoreDatabaseError(
            f"Token store {action} failed on {self._label} "
            f"(table {self._table.name}): {type(orig).__name__}: {excerpt(first_line, 160)}"
        )

    def _refuse_write(self) -> None:
        if self._read_only:
            raise BosTokenStoreError(
                f"The token store {self._label} (table {self._table.name}) is opened read-only here."
            )

    def _exact(self, row: Any, key: str) -> Any:
        """``row`` when its key is exactly ``key``: a database whose key column compares keys as
        equal that are not (a case-insensitive collation) must not hand one Connection another's row."""
        if row is None:
            return None
        found = row._mapping["key"]
        if found != key:
            raise BosTokenStoreError(
                f"The token store answered the row {found!r} when asked for {key!r}: its key column "
                f"(table {self._table.name}) treats different keys as equal, and that row is neither used "
                f"nor changed. {self._collation_fix()}"
            )
        return row

    def _collation_fix(self) -> str:
        if self._dialect_name in ("mysql", "mariadb"):
            return f"Run, as a user who may alter the table: {self.binary_key_statement()}"
        return "Give the key column a binary (case-sensitive) collation."

    def binary_key_statement(self) -> str:
        """The MySQL/MariaDB statement that gives an existing table binary keys."""
        table = self._engine.dialect.identifier_preparer.quote_identifier(self._table.name)
        return f"ALTER TABLE {table} CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;"

    @contextmanager
    def _writing(self) -> Iterator[Connection]:
        """A write transaction; on SQLite ``BEGIN IMMEDIATE`` so the busy timeout applies.

        (A deferred SQLite transaction that reads and then writes cannot wait for the write lock:
        SQLite answers "database is locked" at once to avoid a deadlock.)
        """
        with self._engine.connect() as conn:
            if self._dialect_name == "sqlite":
                conn.execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE"})
            with conn.begin():
                yield conn

    def ensure_table(self) -> None:
        """Create the table if it does not exist (safe when several workers race to do it)."""
        if self._table_ready:
            return
        self._refuse_write()
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
        self._add_missing_columns()
        self._ensure_binary_keys()
        self._table_ready = True

    def _key_collation(self) -> str | None:
        try:
            with self._engine.connect() as conn:
                return conn.execute(
                    sa.text(
                        "SELECT COLLATION_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() "
                        "AND TABLE_NAME = :table AND COLUMN_NAME = 'key'"
                    ),
                    {"table": self._table.name},
                ).scalar()
        except sa.exc.SQLAlchemyError as exc:
            raise self._fail("collation check", exc) from None

    def _ensure_binary_keys(self) -> None:
        """MySQL/MariaDB: a table made by an earlier release has the database's default collation,
        which compares keys case-insensitively; convert it to ``utf8mb4_bin`` (once, safe when several
        workers race), or refuse the store with the statement to run."""
        if self._dialect_name not in ("mysql", "mariadb"):
            return
        collation = self._key_collation()
        if collation is None or collation.lower().endswith("_bin"):
            return
        statement = self.binary_key_statement()
        try:
            with self._engine.begin() as conn:
                conn.exec_driver_sql(statement.rstrip(";"))
        except sa.exc.SQLAlchemyError as exc:
            now = self._key_collation()
            if now is None or not now.lower().endswith("_bin"):
                orig = getattr(exc, "orig", None) or exc
                raise BosTokenStoreError(
                    f"The token store table {self._table.name} compares its keys case-insensitively "
                    f"(collation {collation}), so one Connection id could read another's grant; converting it "
                    f"failed ({type(orig).__name__}). Run, as a user who may alter the table: {statement}"
                ) from None
        logger.warning(
            "Token store table %s: key collation %s converted to utf8mb4_bin (keys are case-sensitive).",
            self._table.name,
            collation,
        )

    def _add_missing_columns(self) -> None:
        """Bring a table made by an older release up to date: add the columns it lacks (nullable,
        so existing rows stay valid). Safe when several workers race to do it."""
        try:
            present = {column["name"] for column in sa.inspect(self._engine).get_columns(self._table.name)}
        except sa.exc.SQLAlchemyError as exc:
            raise self._fail("schema check", exc) from None
        preparer = self._engine.dialect.identifier_preparer
        for name, ddl_type in _ADDED_COLUMNS.items():
            if name in present:
                continue
            try:
                with self._writing() as conn:
                    conn.exec_driver_sql(
                        f"ALTER TABLE {preparer.quote(self._table.name)} ADD COLUMN {preparer.quote(name)} "
                        f"{ddl_type} NULL"
                    )
            except sa.exc.SQLAlchemyError as exc:
                columns = sa.inspect(self._engine).get_columns(self._table.name)
                if name not in {column["name"] for column in columns}:
                    raise self._fail(f"adding column {name}", exc) from None
            logger.info("Token store table %s: added column %s.", self._table.name, name)

    def _encode(self, value: str | None, binding: RowBinding, column: str) -> str | None:
        if value is None:
            return None
        if self._cipher is None:
            return _RAW_PREFIX + value
        return seal(self._cipher, binding, column, value)

    def _decode(self, binding: RowBinding, column: str, stored: str | None) -> str | None:
        """The token in a column (refused unless it was written for this row, column and target)."""
        key = binding.key
        if stored is None:
            return None
        if stored.startswith(_RAW_PREFIX):
            if self._cipher is not None:
                raise BosTokenStoreError(
                    f"The token store row {key!r} ({column}) is not encrypted, but the store is opened with "
                    "a Fernet key: a row written without the key is not trusted. Reconnect to replace it."
                )
            value = stored[len(_RAW_PREFIX) :]
        elif stored.startswith((SEALED_PREFIX, LEGACY_PREFIX)):
            if self._cipher is None:
                raise BosTokenStoreError(
                    f"The token store row {key!r} is encrypted ({column}); open the store with the same "
                    "Fernet key (Airflow's [core] fernet_key) to read it."
                )
            value = unseal(self._cipher, stored, binding, column)
        else:
            raise BosTokenStoreError(f"The token store row {key!r} ({column}) has an unknown format.")
        register_secret(value)
        return value

    def _row_to_grant(self, row: Any, *, tolerant: bool = False) -> StoredGrant:
        """The row as a grant; ``tolerant`` leaves tokens that cannot be read as None (for a
        re-seed, which replaces them anyway)."""
        m = row._mapping
        binding = RowBinding(m["key"], m["client_id"], m["resource"], m["token_endpoint"])
        tokens: dict[str, str | None] = {}
        try:
            for column in _TOKEN_COLUMNS:
                try:
                    tokens[column] = self._decode(binding, column, m[column])
                except BosTokenStoreError:
                    if not tolerant:
                        raise
                    tokens[column] = None
        except BosTokenBindingError:
            if not tolerant:
                raise
            tokens = {"access_token": None, "refresh_token": None}
        consumed = set((m.get("consumed_seeds") or "").split())
        if m["seed_fingerprint"]:
            consumed.add(m["seed_fingerprint"])  # rows from before consumed_seeds existed
        return StoredGrant(
            key=m["key"],
            client_id=m["client_id"],
            token_endpoint=m["token_endpoint"],
            resource=m["resource"],
            scope=m["scope"],
            access_token=tokens["access_token"],
            refresh_token=tokens["refresh_token"],
            expires_at=None if m["expires_at"] is None else float(m["expires_at"]),
            generation=int(m["generation"]),
            seed_fingerprint=m["seed_fingerprint"],
            updated_at=float(m["updated_at"]),
            consumed_seeds=frozenset(consumed),
        )

    def _values(self, grant: StoredGrant) -> dict[str, Any]:
        return {
            "client_id": grant.client_id,
            "token_endpoint": grant.token_endpoint,
            "resource": grant.resource,
            "scope": grant.scope,
            "access_token": self._encode(grant.access_token, grant.binding, "access_token"),
            "refresh_token": self._encode(grant.refresh_token, grant.binding, "refresh_token"),
            # Never NaN/Infinity (SQLite stores NaN as NULL = "never expires", MySQL refuses it):
            # a lifetime that cannot be stored counts as expired.
            "expires_at": (
                grant.expires_at if grant.expires_at is None or math.isfinite(grant.expires_at) else 0.0
            ),
            "generation": grant.generation,
            "seed_fingerprint": grant.seed_fingerprint,
            "updated_at": grant.updated_at,
            "consumed_seeds": " ".join(sorted(grant.consumed_seeds)) or None,
        }

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
                    row = self._exact(
                        conn.execute(sa.select(self._table).where(self._table.c.key == key).with_for_update()).first(),
                        key,
                    )
                    yield conn, (self._row_to_grant(row, tolerant=tolerant) if row is not None else None)
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
        values = self._values(new)
        if current is None:
            try:
                conn.execute(sa.insert(self._table).values(key=new.key, **values))
            except sa.exc.IntegrityError:
                # Someone inserted first; the transaction rolls back and the caller locks again.
                # (No savepoint: MySQL ends the whole transaction on a deadlock anyway.)
                raise _RetryInsert() from None
            return
        result = conn.execute(
            sa.update(self._table)
            .where(self._table.c.key == new.key, self._table.c.generation == current.generation)
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
                    raise self._fail("locked update", exc) from None
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
        failure = self._fail("saving the rotated grant", error)
        raise BosTokenStoreError(
            f"{failure} BOS already rotated the refresh token, so the grant {new.key!r} is lost: reconnect "
            f"with: airflow-provider-bos connect --conn-id {new.key}"
        ) from None

    # --- public API --------------------------------------------------------------------------

    def _read_row(self, key: str) -> Any:
        """The row of ``key`` as stored (exactly that key), or None; creates nothing when read-only."""
        if self._read_only:
            if self._absent or not self._table_present():
                return None
        else:
            self.ensure_table()
        try:
            with self._engine.connect() as conn, conn.begin():
                return self._exact(conn.execute(sa.select(self._table).where(self._table.c.key == key)).first(), key)
        except sa.exc.SQLAlchemyError as exc:
            raise self._fail("read", exc) from None

    def _table_present(self) -> bool:
        try:
            return sa.inspect(self._engine).has_table(self._table.name)
        except sa.exc.SQLAlchemyError as exc:
            raise self._fail("schema check", exc) from None

    def load(self, key: str) -> StoredGrant | None:
        """The current row, without a lock (a consistent snapshot)."""
        row = self._read_row(key)
        return self._row_to_grant(row) if row is not None else None

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
            with self._writing() as conn:
                where = self._table.c.key == key
                found = conn.execute(sa.select(self._table.c.key).where(where)).scalars().all()
                if any(name != key for name in found):  # another key the column takes for equal
                    raise BosTokenStoreError(
                        f"Not deleting the token store row {key!r}: the key column treats other keys as equal "
                        f"to it. {self._collation_fix()}"
                    )
                return conn.execute(sa.delete(self._table).where(where)).rowcount > 0
        except sa.exc.SQLAlchemyError as exc:
            raise self._fail("delete", exc) from None

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
        if self._cipher is None:
            raise BosConfigurationError(
                "Re-sealing needs the Fernet key the tokens were encrypted with (Airflow's [core] fernet_key)."
            )
        self.ensure_table()
        table = self._table
        legacy = sa.or_(*(table.c[column].like(f"{LEGACY_PREFIX}%") for column in _TOKEN_COLUMNS))
        resealed: list[tuple[str, str, str]] = []
        refused: list[tuple[str, str]] = []
        try:
            with self._writing() as conn:
                query = sa.select(table).where(legacy).order_by(table.c.key)
                if self._dialect_name != "sqlite":
                    query = query.with_for_update()
                rows = [row._mapping for row in conn.execute(query)]
                places = Counter(
                    m[column]
                    for m in rows
                    for column in _TOKEN_COLUMNS
                    if str(m[column] or "").startswith(LEGACY_PREFIX)
                )
                for m in rows:
                    values = self._resealed_values(m, places, refused)
                    if values is None:
                        continue
                    conn.execute(
                        sa.update(table)
                        .where(table.c.key == m["key"], table.c.generation == m["generation"])
                        .values(**values)
                    )
                    resealed.append((m["key"], m["resource"], m["token_endpoint"]))
        except sa.exc.SQLAlchemyError as exc:
            raise self._fail("re-seal", exc) from None
        for key, resource, _endpoint in resealed:
            logger.info("Token store row %r (%s): re-sealed to its row.", key, resource)
        return ResealReport(tuple(resealed), tuple(refused))

    def _resealed_values(
        self, m: Any, places: Counter[str], refused: list[tuple[str, str]]
    ) -> dict[str, str] | None:
        assert self._cipher is not None
        binding = RowBinding(m["key"], m["client_id"], m["resource"], m["token_endpoint"])
        values: dict[str, str] = {}
        for column in _TOKEN_COLUMNS:
            stored = m[column]
            if not str(stored or "").startswith(LEGACY_PREFIX):
                continue
            if places[stored] > 1:
                refused.append((m["key"], "its token is also in another row or column (a copy); reconnect it"))
                return None
            try:
                token = unseal_legacy(self._cipher, stored, m["key"], column)
            except BosTokenStoreError:
                refused.append((m["key"], "the configured Fernet key cannot decrypt it; reconnect it"))
                return None
            values[column] = seal(self._cipher, binding, column, token)
        return values
