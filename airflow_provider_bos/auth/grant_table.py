"""The token store's table on one database: its definition, its creation and upgrades, exact keys.

``bos_oauth_grants`` holds one row per Connection id. :class:`GrantTable` creates it when missing
(safe when several workers race to do it) and brings a table made by an earlier release up to date:
the columns added since are added (nullable, so existing rows stay valid), and on MySQL/MariaDB a key
column that compares case-insensitively is converted to ``utf8mb4_bin`` once, or the store is refused
with the statement to run. On every dialect a row a query returns is used only when its key is
exactly the one asked for (:meth:`GrantTable.exact`): ``bos_prod`` must never read ``Bos_Prod``'s row.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from airflow_provider_bos.auth.sqlite_file import SQLITE_BEGIN_OPTION
from airflow_provider_bos.exceptions import BosConfigurationError, BosTokenStoreError, excerpt

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_TABLE", "GrantTable", "TokenStoreDatabaseError", "check_table_name"]

DEFAULT_TABLE = "bos_oauth_grants"
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
# Columns added after the first release, with their DDL type: ensure adds missing ones.
_ADDED_COLUMNS = {"consumed_seeds": "TEXT"}
# MySQL/MariaDB: the table's character set and binary collation (as the warehouse tables have): keys
# that differ only in case are different rows.
_MYSQL_TABLE_OPTIONS: dict[str, Any] = {
    "mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin",
}


def check_table_name(name: str) -> None:
    """Refuse a table name that is not a plain SQL identifier (letters, digits, underscores)."""
    if not _IDENTIFIER.match(name):
        raise BosConfigurationError(f"Token store table name {name!r} is not a plain SQL identifier.")


class TokenStoreDatabaseError(BosTokenStoreError):
    """The store's database failed; the message carries the driver's own text (for logs and the CLI,
    not for a page whose user chose the database)."""


class GrantTable:
    """The grants table named ``name`` on ``engine``; ``label`` names the database in messages
    (its URL without the password) and ``dialect_name`` is the URL's backend name."""

    def __init__(self, engine: Engine, name: str, *, dialect_name: str, label: str, read_only: bool) -> None:
        check_table_name(name)
        self.engine = engine
        self.dialect_name = dialect_name
        self.label = label
        self.read_only = read_only
        self.table = sa.Table(
            name,
            sa.MetaData(),
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
        self._ready = False

    @property
    def name(self) -> str:
        return self.table.name

    @property
    def columns(self) -> sa.ColumnCollection[str, sa.Column[Any]]:
        """The table's columns as this release defines them (not as the database reports them)."""
        return self.table.columns

    def fail(self, action: str, exc: BaseException) -> TokenStoreDatabaseError:
        """The error to raise for a database failure during ``action``."""
        orig = getattr(exc, "orig", None) or exc
        # Only the driver's message, trimmed: SQLAlchemy's own text would include bound parameters.
        first_line = str(orig).splitlines()[0] if str(orig) else ""
        return TokenStoreDatabaseError(
            f"Token store {action} failed on {self.label} "
            f"(table {self.name}): {type(orig).__name__}: {excerpt(first_line, 160)}"
        )

    @contextmanager
    def writing(self) -> Iterator[Connection]:
        """A write transaction; on SQLite ``BEGIN IMMEDIATE`` so the busy timeout applies.

        (A deferred SQLite transaction that reads and then writes cannot wait for the write lock:
        SQLite answers "database is locked" at once to avoid a deadlock.)
        """
        with self.engine.connect() as conn:
            if self.dialect_name == "sqlite":
                conn.execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE"})
            with conn.begin():
                yield conn

    def present(self) -> bool:
        """Whether the table exists (a read-only store never creates it)."""
        try:
            return sa.inspect(self.engine).has_table(self.name)
        except sa.exc.SQLAlchemyError as exc:
            raise self.fail("schema check", exc) from None

    def ensure(self) -> None:
        """Create the table if it does not exist and bring it up to date (once per object)."""
        if self._ready:
            return
        if self.read_only:
            raise BosTokenStoreError(
                f"The token store {self.label} (table {self.name}) is opened read-only here."
            )
        try:
            with self.writing() as conn:
                self.table.create(conn, checkfirst=True)
        except sa.exc.SQLAlchemyError as exc:
            # Another process may have created it between the check and the CREATE.
            try:
                exists = sa.inspect(self.engine).has_table(self.name)
            except sa.exc.SQLAlchemyError:
                exists = False
            if not exists:
                raise self.fail("table creation", exc) from None
        self._add_missing_columns()
        self._ensure_binary_keys()
        self._ready = True

    def row_query(self, key: str) -> sa.Select[Any]:
        """The SELECT of the row of ``key``; pass what it returns through :meth:`exact`."""
        return sa.select(self.table).where(self.table.c.key == key)

    def exact(self, row: Any, key: str) -> Any:
        """``row`` when its key is exactly ``key``: a database whose key column compares keys as
        equal that are not (a case-insensitive collation) must not hand one Connection another's row."""
        if row is None:
            return None
        found = row._mapping["key"]
        if found != key:
            raise BosTokenStoreError(
                f"The token store answered the row {found!r} when asked for {key!r}: its key column "
                f"(table {self.name}) treats different keys as equal, and that row is neither used "
                f"nor changed. {self.collation_fix()}"
            )
        return row

    def collation_fix(self) -> str:
        """What an operator does about a key column that takes different keys for equal."""
        if self.dialect_name in ("mysql", "mariadb"):
            return f"Run, as a user who may alter the table: {self.binary_key_statement()}"
        return "Give the key column a binary (case-sensitive) collation."

    def binary_key_statement(self) -> str:
        """The MySQL/MariaDB statement that gives an existing table binary keys."""
        table = self.engine.dialect.identifier_preparer.quote_identifier(self.name)
        return f"ALTER TABLE {table} CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;"

    def _key_collation(self) -> str | None:
        try:
            with self.engine.connect() as conn:
                return conn.execute(
                    sa.text(
                        "SELECT COLLATION_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() "
                        "AND TABLE_NAME = :table AND COLUMN_NAME = 'key'"
                    ),
                    {"table": self.name},
                ).scalar()
        except sa.exc.SQLAlchemyError as exc:
            raise self.fail("collation check", exc) from None

    def _ensure_binary_keys(self) -> None:
        """MySQL/MariaDB: a table made by an earlier release has the database's default collation,
        which compares keys case-insensitively; convert it to ``utf8mb4_bin`` (once, safe when several
        workers race), or refuse the store with the statement to run."""
        if self.dialect_name not in ("mysql", "mariadb"):
            return
        collation = self._key_collation()
        if collation is None or collation.lower().endswith("_bin"):
            return
        statement = self.binary_key_statement()
        try:
            with self.engine.begin() as conn:
                conn.exec_driver_sql(statement.rstrip(";"))
        except sa.exc.SQLAlchemyError as exc:
            now = self._key_collation()
            if now is None or not now.lower().endswith("_bin"):
                orig = getattr(exc, "orig", None) or exc
                raise BosTokenStoreError(
                    f"The token store table {self.name} compares its keys case-insensitively "
                    f"(collation {collation}), so one Connection id could read another's grant; converting it "
                    f"failed ({type(orig).__name__}). Run, as a user who may alter the table: {statement}"
                ) from None
        logger.warning(
            "Token store table %s: key collation %s converted to utf8mb4_bin (keys are case-sensitive).",
            self.name,
            collation,
        )

    def _add_missing_columns(self) -> None:
        """Bring a table made by an older release up to date: add the columns it lacks (nullable,
        so existing rows stay valid). Safe when several workers race to do it."""
        try:
            present = {column["name"] for column in sa.inspect(self.engine).get_columns(self.name)}
        except sa.exc.SQLAlchemyError as exc:
            raise self.fail("schema check", exc) from None
        preparer = self.engine.dialect.identifier_preparer
        for name, ddl_type in _ADDED_COLUMNS.items():
            if name in present:
                continue
            try:
                with self.writing() as conn:
                    conn.exec_driver_sql(
                        f"ALTER TABLE {preparer.quote(self.name)} ADD COLUMN {preparer.quote(name)} "
                        f"{ddl_type} NULL"
                    )
            except sa.exc.SQLAlchemyError as exc:
                columns = sa.inspect(self.engine).get_columns(self.name)
                if name not in {column["name"] for column in columns}:
                    raise self.fail(f"adding column {name}", exc) from None
            logger.info("Token store table %s: added column %s.", self.name, name)
