"""WarehouseWriter: lands a run's final records and its audit row in ONE transaction.

The transaction skeleton only (:meth:`WarehouseWriter._write`, top-down): begin, prepare, load ->
outcome, read guards, settle the outcome, rejects, reconcile, audit row, commit. The steps live in
their modules (see the package docstring). Any failure rolls the whole transaction back, so the
records table is either the old state or the new one, never a mix.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from airflow_provider_bos.exceptions import BosFinalFrameRestarted, BosWarehouseError
from airflow_provider_bos.warehouse.dialects import WarehouseDialect, dialect_class, dialect_for
from airflow_provider_bos.warehouse.run.audit import SyncRunInfo, audit_insert, record_failed_run, utcnow
from airflow_provider_bos.warehouse.run.audit_fields import (
    audit_row_fields,
    partial_with,
    with_note,
    with_rehash_note,
)
from airflow_provider_bos.warehouse.run.catalog import column_names, find_guard_index
from airflow_provider_bos.warehouse.run.claims import WireHashSet, kept_claims, load_known_wire_hashes
from airflow_provider_bos.warehouse.run.coverage import count_coverage, watched_columns
from airflow_provider_bos.warehouse.run.history import seed_history
from airflow_provider_bos.warehouse.run.load_methods import loader_for
from airflow_provider_bos.warehouse.run.loads import SeenKeys
from airflow_provider_bos.warehouse.run.promoted import PromotedRun, WrongTypes, fill_written
from airflow_provider_bos.warehouse.run.provenance import seed_provenance
from airflow_provider_bos.warehouse.run.reconcile import Lifecycle, read_guards, reconcile, scope_key
from airflow_provider_bos.warehouse.run.rehash import rehash_stamped_rows
from airflow_provider_bos.warehouse.run.rejects import Rejects
from airflow_provider_bos.warehouse.run.settle import (
    DirectLoad,
    LoadOutcome,
    StagedLoad,
    StagedWithKeptClaims,
    settle,
)
from airflow_provider_bos.warehouse.run.transaction import RunTransaction, UpsertCounts, db_detail, execute
from airflow_provider_bos.warehouse.tables.attribute_columns import AttributeColumns, column_type
from airflow_provider_bos.warehouse.tables.companions import (
    COLUMNS,
    COMPANIONS,
    HISTORY,
    LINEAGE,
    POLICY,
    REJECTS,
    SOURCES,
    Companion,
    Created,
)
from airflow_provider_bos.warehouse.tables.identifiers import validate_identifier, validate_schema
from airflow_provider_bos.warehouse.tables.policy_store import (
    read_stored_policy,
    refuse_unless_same,
    store_policy,
)
from airflow_provider_bos.warehouse.tables.records import UnstorableRecord, parse_timestamp
from airflow_provider_bos.warehouse.tables.schema import (
    ADDED_AUDIT_COLUMNS,
    COVERAGE_COLUMN,
    LIFECYCLE_COLUMNS,
    REJECTED_COLUMN,
    SCOPE_COLUMN,
    WIRE_HASH_COLUMN,
    audit_table,
    records_table,
)
from airflow_provider_bos.wire import ReconcileOptions, WriteOptions, check_invalid_records

if TYPE_CHECKING:
    from airflow_provider_bos.pii import PolicyFingerprint

__all__ = ["UpsertCounts", "WarehouseWriter", "WriteOptions"]

log = logging.getLogger(__name__)
# How long adding a column to a table made before it waits for the table's lock (see _add_column).
ADD_COLUMN_TIMEOUT_S = 5.0

class WarehouseWriter:
    """Writes federated records into a records table keyed by ``record_ref``, plus the audit row.

    :param engine: a SQLAlchemy engine on PostgreSQL (psycopg 3 gets COPY), MySQL/MariaDB
        (``mysql+pymysql``) or SQLite.
    :param table: records table name (validated identifier).
    :param schema: PostgreSQL schema / MySQL database; SQLite: ``None`` or ``"main"``.
    :param audit_table: audit table name, in the same schema.
    :param batch_size: rows per staging ``executemany`` chunk (memory bound; ignored by COPY).
    :param lock_timeout_s: how long to wait for another writer of the same table (SQLite: of the
        same database file, whose busy timeout it also is unless ``sqlite_busy_timeout_s`` is given).
    :param use_copy: force COPY on/off on PostgreSQL; default: on when the driver is psycopg 3.
    """

    def __init__(
        self,
        engine: sa.Engine,
        *,
        table: str = "bos_records",
        schema: str | None = None,
        audit_table: str = "bos_sync_runs",
        batch_size: int = 5000,
        lock_timeout_s: float = 300.0,
        sqlite_busy_timeout_s: float | None = None,
        use_copy: bool | None = None,
    ) -> None:
        self.engine = engine
        # The dialect itself is built once, by ensure_tables: the records table says whether it has
        # the wire-hash column (tables made before it sync without it), and so which SQL a run sends.
        self._dialect_class = dialect_class(engine)
        self._dialect_options: dict[str, Any] = self._dialect_class.writer_options(
            sqlite_busy_timeout_s=sqlite_busy_timeout_s, lock_timeout_s=lock_timeout_s, use_copy=use_copy,
        )
        self._dialect: WarehouseDialect | None = None
        self._dialect_class.prepare_engine(engine, lock_timeout_s=lock_timeout_s)
        self.table = validate_identifier(table, kind="table")
        self.audit_table = validate_identifier(audit_table, kind="audit table")
        self.schema = validate_schema(schema, self._dialect_class.name)
        if batch_size < 1:
            raise BosWarehouseError("batch_size must be at least 1.")
        # A database with a statement-size limit caps the chunk (Snowflake's multi-row INSERT).
        self.batch_size = min(batch_size, self._dialect_class.capabilities.max_batch_rows or batch_size)
        self.lock_timeout_s = lock_timeout_s
        # The DB-API's base error: COPY runs on the raw driver connection, outside SQLAlchemy.
        self._driver_error: type[BaseException] = getattr(
            getattr(engine.dialect, "loaded_dbapi", None), "Error", sa.exc.SQLAlchemyError
        )
        self._tables_ready = False
        self._companions_ready: set[str] = set()  # the rejects and history tables made (see _ensure_companion)
        self._columns_looked = False  # whether <table>_columns was looked for (see _ensure_promoted_columns)
        #: Which of the columns added after the first release the audit table has (see ensure_tables).
        self.audit_columns: set[str] = set(ADDED_AUDIT_COLUMNS)
        # The records table's covering index for the change test, when it has one (MySQL).
        self.guard_index: str | None = None

    @property
    def dialect(self) -> WarehouseDialect:
        """The SQL of this writer's database and table, built once by :meth:`ensure_tables` (run first
        if it has not run yet)."""
        self._ensure_once()
        assert self._dialect is not None  # built by ensure_tables before it returns
        return self._dialect

    @property
    def destination_table(self) -> str:
        """``schema.table`` (or ``table``), as recorded in the audit row."""
        return self._qualified(self.table)

    @property
    def rejects_destination(self) -> str:
        """``schema.<table>_rejects`` (or the hashed name of a long table), where quarantine puts records."""
        return self._qualified(REJECTS.name(self.table))

    @property
    def audit_rejected_column(self) -> bool:
        """The audit table has the ``rejected`` column (False: one made before it that could not be altered)."""
        return REJECTED_COLUMN in self.audit_columns

    @property
    def sources_destination(self) -> str:
        """``schema.<table>_sources``: one row per provenance entry of every row of the records table."""
        return self._qualified(SOURCES.name(self.table))

    @property
    def policy_destination(self) -> str:
        """``schema.<table>_policy``: the personal-data policy the table was written with."""
        return self._qualified(POLICY.name(self.table))

    @property
    def staging_method(self) -> str:
        """``"copy"``, ``"executemany"`` or ``"staged_file"``: how rows reach the staging table."""
        return loader_for(self.dialect.capabilities.load_method).name

    def _qualified(self, name: str) -> str:
        return f"{self.schema}.{name}" if self.schema else name

    # --- DDL (the one place the writer creates or inspects tables) -------------------------------

    def _records_table(self) -> sa.Table:
        return records_table(sa.MetaData(), self._dialect_class.name, self.table, self.schema)

    def _companion(self, companion: Companion) -> sa.Table:
        return companion.table(self.table, self._dialect_class.name, self.schema)

    def ensure_tables(self) -> None:
        """Create the records and audit tables if missing; check an existing table has our columns.

        Each table in a transaction of its own, never the run's (MySQL commits DDL implicitly).
        """
        records = self._records_table()
        audit = audit_table(sa.MetaData(), self._dialect_class.name, self.audit_table, self.schema)
        try:
            for table in (audit, records, *(self._companion(c) for c in COMPANIONS if c.created is Created.ALWAYS)):
                self._create_table(table)
            for table in (records, audit):
                present = column_names(self.engine, self._dialect_class, table.name, self.schema)
                if table is records and self._dialect is None:
                    self._dialect = dialect_for(self.engine, wire_hash_column=WIRE_HASH_COLUMN in present,
                                                **self._dialect_options)
                    if WIRE_HASH_COLUMN not in present:
                        log.info("%s has no %s column: re-runs decode every record (see sql/ to add it).",
                                 self._qualified(table.name), WIRE_HASH_COLUMN)
                if table is audit:
                    # Columns added after the first release: added in place (a small table).
                    self.audit_columns = {c for c in ADDED_AUDIT_COLUMNS if c in present or self._add_column(audit, c)}
                else:
                    self._add_lifecycle_columns(records, present)
                optional = (WIRE_HASH_COLUMN, *ADDED_AUDIT_COLUMNS, *LIFECYCLE_COLUMNS)
                missing = [c.name for c in table.columns if c.name not in present and c.name not in optional]
                if missing:
                    raise BosWarehouseError(
                        f"Table {self._qualified(table.name)} exists but lacks the columns {missing}; "
                        "add them (see sql/ for the DDL) or choose another table."
                    )
            if self._dialect_class.capabilities.uses_guard_index:
                self.guard_index = find_guard_index(sa.inspect(self.engine), records.name, self.schema)
            self._present_policy_table()  # once per writer: whether the table was written under a policy
        except sa.exc.SQLAlchemyError as exc:
            raise BosWarehouseError(
                f"Could not create or inspect {self._qualified(self.table)} / "
                f"{self._qualified(self.audit_table)}: {db_detail(exc)}"
            ) from exc
        self._tables_ready = True

    def _add_lifecycle_columns(self, records: sa.Table, present: set[str]) -> None:
        """Add ``_bos_deleted_at`` and ``_bos_superseded_by`` to a records table made before them
        (nullable: no row is rewritten; NULL means current). Required: every run may supersede."""
        for name in LIFECYCLE_COLUMNS:
            if name not in present and not self._add_column(records, name):
                raise BosWarehouseError(
                    f"{self._qualified(records.name)} has no {name} column and it could not be added now; "
                    "add it with the ALTER TABLE in sql/ (NULL for every existing row) and run again."
                )

    def _add_column(self, table: sa.Table, name: str) -> bool:
        """Add the nullable column ``name`` to ``table`` made before it, in a transaction of its own.

        True once the column is there (added here, or by a writer racing this one); False if it
        cannot be added now (no ALTER privilege, or the table stayed locked for
        :data:`ADD_COLUMN_TIMEOUT_S`): the run then goes on without it, and the next writer tries again.
        """
        d = self._dialect
        assert d is not None  # ensure_tables built it with the records table, before any column is added
        type_sql = table.c[name].type.compile(dialect=self.engine.dialect)
        statements = d.add_column(table.name, self.schema, name, type_sql, timeout_s=ADD_COLUMN_TIMEOUT_S)
        try:
            with self.engine.connect() as conn:
                try:
                    with conn.begin():
                        for statement in statements:
                            execute(conn, statement)
                finally:
                    for statement in d.add_column_reset():
                        execute(conn, statement)
            log.info("Added the %s column to %s.", name, self._qualified(table.name))
            return True
        except sa.exc.SQLAlchemyError as exc:
            try:
                if name in column_names(self.engine, d, table.name, self.schema):
                    return True
            except sa.exc.SQLAlchemyError:
                pass
            log.warning("%s has no %s column and it could not be added now (%s); runs are audited without it "
                        "until a later run adds it, or add it with the ALTER TABLE in sql/.",
                        self._qualified(table.name), name, db_detail(exc))
            return False

    def _create_table(self, table: sa.Table) -> None:
        """Create ``table`` and its indexes if missing, in a transaction of its own.

        Parallel first runs race on the shared audit table: the loser's CREATE fails (PostgreSQL:
        a duplicate ``pg_type`` row; MySQL: the table exists) once the winner committed. Only this
        table is rolled back then (never another writer's records table), and it is looked for again.
        """
        try:
            with self.engine.begin() as conn:
                table.create(conn, checkfirst=True)
        except (sa.exc.ProgrammingError, sa.exc.IntegrityError, sa.exc.OperationalError):
            if not sa.inspect(self.engine).has_table(table.name, schema=self.schema):
                raise

    def ensure_companion(self, companion: Companion) -> sa.Table:
        """Create ``companion`` beside the records table if missing (its own transaction, as :meth:`ensure_tables`)."""
        return self._ensure_companion(self._companion(companion))

    def ensure_rejects_table(self) -> sa.Table:
        """Create ``<table>_rejects`` if missing (as :meth:`ensure_tables` does: its own transaction)."""
        return self._ensure_companion(self._companion(REJECTS))

    def ensure_history_table(self) -> sa.Table:
        """Create ``<table>_history`` if missing (its own transaction, as :meth:`ensure_tables`)."""
        return self._ensure_companion(self._companion(HISTORY))

    def ensure_policy_table(self) -> sa.Table:
        """Create ``<table>_policy`` if missing (its own transaction, as :meth:`ensure_tables`)."""
        return self._ensure_companion(self._companion(POLICY))

    def _present_policy_table(self, *, look: bool = True) -> sa.Table | None:
        """``<table>_policy`` if it exists (a table written under a policy), else None. ``look=False``:
        as :meth:`ensure_tables` or the last :meth:`require_pii_policy` found it (no query: a run
        without a policy adds none)."""
        table = self._companion(POLICY)
        if look and table.name not in self._companions_ready and sa.inspect(self.engine).has_table(
                table.name, schema=self.schema):
            self._companions_ready.add(table.name)
        return table if table.name in self._companions_ready else None

    def _holds_rows(self, conn: sa.Connection) -> bool:
        """The records table, its history or its rejects hold a record (an empty table adopts any policy).

        A quarantined record counts only if it is kept whole (a run without a policy): under a policy, or
        after ``pii-apply``, a rejects row is a ref and a reason."""
        present = sa.inspect(conn)
        queries = [sa.select(sa.literal(1)).select_from(self._records_table())]
        if present.has_table(HISTORY.name(self.table), schema=self.schema):
            queries.append(sa.select(sa.literal(1)).select_from(self._companion(HISTORY)))
        if present.has_table(REJECTS.name(self.table), schema=self.schema):
            quarantined = self._companion(REJECTS)
            empty = sa.bindparam("empty", b"", type_=quarantined.c.record.type)
            queries.append(sa.select(sa.literal(1)).where(quarantined.c.record != empty))
        return any(conn.execute(query.limit(1)).first() is not None for query in queries)

    def require_pii_policy(self, fingerprint: PolicyFingerprint | None) -> None:
        """Refuse a run whose personal-data policy (``None``: none) is not the one the table was written
        with, before it reads anything: :class:`~airflow_provider_bos.pii.PiiPolicyMismatch` names the
        difference and the way forward. One small query (two when the table holds a policy).

        A table without a stored policy was written without one, unless it holds no row: a new or
        emptied table (and its history) adopts the run's policy, stored by its first write.
        """
        looked = not self._tables_ready  # ensure_tables looks for the policy table: no second look
        self._ensure_once()
        try:
            policy = self._present_policy_table(look=not looked)
            with self.engine.connect() as conn:
                self._refuse_other_policy(conn, policy, fingerprint)
        except sa.exc.SQLAlchemyError as exc:
            raise BosWarehouseError(f"Could not read the personal-data policy of {self.destination_table}: "
                                    f"{db_detail(exc)}") from exc

    def _refuse_other_policy(self, conn: sa.Connection, policy: sa.Table | None,
                             fingerprint: PolicyFingerprint | None) -> str | None:
        """Raise unless ``fingerprint`` matches the stored one (or the table is empty); return the stored text."""
        stored = read_stored_policy(conn, policy) if policy is not None else None
        if stored is None and (fingerprint is None or not fingerprint.rules):
            return stored
        if stored is not None and fingerprint is not None and stored == fingerprint.text:
            return stored
        if self._holds_rows(conn):
            refuse_unless_same(stored, fingerprint, table=self.table)
        return stored

    def _settle_policy(self, tx: RunTransaction, policy: sa.Table | None, fingerprint: PolicyFingerprint | None,
                       run_id: str) -> None:
        """In the run's transaction: refuse another policy (a run may have changed it since
        :meth:`require_pii_policy`), and store this run's when the table has another or none."""
        if policy is None:
            return
        stored = self._refuse_other_policy(tx.conn, policy, fingerprint)
        if fingerprint is not None and stored != fingerprint.text:
            store_policy(tx.conn, policy, fingerprint, run_id=run_id, at=utcnow())
        elif fingerprint is None and stored is not None:  # an emptied table, written without a policy now
            tx.conn.execute(policy.delete())

    def _refuse_late_policy(self, tx: RunTransaction, run_id: str) -> None:
        """A run that found no policy table before its read looks again under the writers' lock, which
        ``pii-apply`` takes too: one committed during the read has put the table under a policy, and
        this run's records, stored as read, are refused (nothing raw lands in a hashed table)."""
        capabilities = self.dialect.capabilities
        # Where the run holds the writers' lock from its start (MySQL, DuckDB, SQLite's database lock),
        # no pii-apply commits during its read; Snowflake has no writers' lock to look under.
        if capabilities.lock_before_staging or capabilities.ddl_commits:
            return
        tx.lock()
        table = self._companion(POLICY)
        if sa.inspect(tx.conn).has_table(table.name, schema=self.schema):
            self._companions_ready.add(table.name)
            self._settle_policy(tx, table, None, run_id)

    def _ensure_companion(self, table: sa.Table) -> sa.Table:
        """Create a companion table of the records table once per writer, when a run first needs it."""
        if table.name not in self._companions_ready:
            try:
                self._create_table(table)
            except sa.exc.SQLAlchemyError as exc:
                raise BosWarehouseError(f"Could not create {self._qualified(table.name)}: {db_detail(exc)}") from exc
            self._companions_ready.add(table.name)
        return table

    def _ensure_once(self) -> None:
        if not self._tables_ready:
            self.ensure_tables()

    # --- promoted attributes -------------------------------------------------------------------

    def _ensure_promoted_columns(self, options: WriteOptions) -> PromotedRun | None:
        """Before the run: the promoted columns added to the records table (and its history, if it
        exists) where missing, ``<table>_columns`` made. None when the run promotes nothing and the
        table never had a promoted column (no query after the first run of this writer).

        :raises BosWarehouseError: a column that could not be added (the run would leave it empty).
        :raises BosConfigurationError: a promoted path the run's personal-data policy drops, or
            hashes into a column that is not text.
        """
        self._ensure_once()
        columns = options.attribute_columns or AttributeColumns()
        if columns and options.pii is not None:
            columns.check_policy(options.pii.rules)
        marker = self._companion(COLUMNS)
        try:
            if not columns:  # looked for once per writer: runs that never promote pay one catalog query
                if not self._columns_looked and sa.inspect(self.engine).has_table(marker.name, schema=self.schema):
                    self._companions_ready.add(marker.name)
                self._columns_looked = True
                return PromotedRun(marker, columns, None, None) if marker.name in self._companions_ready else None
            inspector = sa.inspect(self.engine)
            self._ensure_companion(marker)
            history = HISTORY.name(self.table)
            tables = [self._records_table()]
            if inspector.has_table(history, schema=self.schema):
                tables.append(self._companion(HISTORY))
            for table in tables:
                present = {c.lower() for c in column_names(self.engine, self._dialect_class, table.name, self.schema)}
                for column in columns.columns:
                    if column.name.lower() in present:
                        continue
                    table.append_column(sa.Column(column.name, column_type(self._dialect_class.name, column.type)))
                    if not self._add_column(table, column.name):
                        raise BosWarehouseError(
                            f"Could not add the promoted column {column.name} to {self._qualified(table.name)} now; "
                            "add it with the ALTER TABLE shown in sql/ (nullable, the type for its kind) and run again."
                        )
        except sa.exc.SQLAlchemyError as exc:
            raise BosWarehouseError(f"Could not prepare the promoted columns of {self.destination_table}: "
                                    f"{db_detail(exc)}") from exc
        policy = options.pii.text if options.pii is not None and options.pii.rules else None
        return PromotedRun(marker, columns, history if len(tables) > 1 else None, policy)

    # --- known records ------------------------------------------------------------------------

    def known_wire_hashes(self) -> WireHashSet:
        """The wire hashes stored in the records table (empty if it has none or no such column).

        Given to the read (``StreamingFinalResult.use_known_wire_hashes``), it lets byte-identical
        records through as :class:`~airflow_provider_bos.wire.KnownRecord` claims, never decoded;
        :meth:`write_run` verifies every claim in SQL. Read outside the run's transaction: a row
        changed in between fails that verification (and the run), it is never skipped.
        """
        self._ensure_once()
        if not self.dialect.wire_hash_column:
            return WireHashSet()
        try:
            with self.engine.connect() as conn:
                return load_known_wire_hashes(conn, self.dialect, self.table, self.schema)
        except sa.exc.SQLAlchemyError as exc:
            raise BosWarehouseError(f"Could not read the stored wire hashes of {self.destination_table}: "
                                    f"{db_detail(exc)}") from exc

    def last_confirmed(self) -> dict[str, datetime]:
        """When each current row was last confirmed: the later of its ``_bos_observed_at`` (its content
        observed) and the newest ``confirmed_at`` of its scope (a complete full read returned it or
        would have retired it). Rows are not rewritten to say so; docs/sync-modes.md gives the SQL."""
        self._ensure_once()
        statement = self.dialect.last_confirmed(self.table, self.audit_table, self.schema)
        with self.engine.connect() as conn:
            rows = execute(conn, statement).all()
        return {ref: max(parse_timestamp(observed), parse_timestamp(newest)) if newest is not None
                else parse_timestamp(observed) for ref, observed, newest in rows}

    # --- the run ------------------------------------------------------------------------------

    def write_run(self, run: SyncRunInfo, records: Iterable[Any], options: WriteOptions) -> UpsertCounts:
        """Upsert ``records`` and write exactly one audit row, in ONE transaction.

        ``records`` (FederatedRecord objects, dicts, wire records and KnownRecord claims) is
        consumed once, streamed into staging. On any error everything is rolled back: the records
        table is untouched and no audit row is left; errors from the records iterator itself (e.g.
        the stream ended early) propagate as they are, database errors become
        :class:`BosWarehouseError`. The caller writes the ``failed`` row (:meth:`record_failure`).

        ``options.audit``: the audit fields, or a callable giving them once every record is
        staged (inside the transaction; it may also update ``run``, e.g. ``context_handle``: the
        audit row is built after it returns). ``options.known``: the :meth:`known_wire_hashes` the
        read matched its claims against; with it, PostgreSQL (COPY) keeps claims out of staging
        and confirms them all at once (the table's state token); without it, each claim is staged
        and verified by a join.
        """
        if not callable(options.audit):
            audit_row_fields(options.audit)  # refused before anything is read
        check_invalid_records(options.invalid_records)
        if not isinstance(options.reconcile, ReconcileOptions):
            raise BosWarehouseError("WriteOptions.reconcile must be a ReconcileOptions (see wire.check_reconcile).")
        default_observed_at = options.default_observed_at
        try:
            default_obs = parse_timestamp(default_observed_at) if default_observed_at else None
        except ValueError:
            raise BosWarehouseError(f"default_observed_at {str(default_observed_at)[:40]!r} is not ISO 8601.") from None
        self._ensure_once()
        if options.reconcile.sync_mode == "full" and SCOPE_COLUMN not in self.audit_columns:
            raise BosWarehouseError(
                f"{self._qualified(self.audit_table)} has no {SCOPE_COLUMN} column, which a full read needs to "
                "know which rows its scope wrote; add it with the ALTER TABLE in sql/ and run again."
            )
        quarantine = self.ensure_rejects_table() if options.invalid_records == "quarantine" else None
        try:
            policy = self.ensure_policy_table() if options.pii is not None else self._present_policy_table(look=False)
        except sa.exc.SQLAlchemyError as exc:
            raise BosWarehouseError(f"Could not inspect {self.policy_destination}: {db_detail(exc)}") from exc
        for companion in COMPANIONS:  # what this run's options ask for (the history, held retirements, ...)
            if companion.created.asked_by(options):
                self.ensure_companion(companion)
        history = HISTORY.name(self.table) if options.reconcile.history else None
        promoted = self._ensure_promoted_columns(options)
        life = Lifecycle(options.reconcile, self.audit_table, LINEAGE.name(self.table), history,
                         SOURCES.name(self.table), frozenset(self.audit_columns))
        return self._write(run, records, default_obs, options, quarantine, life, policy, promoted)

    def _write(
        self, run: SyncRunInfo, records: Iterable[Any], default_obs: datetime | None, options: WriteOptions,
        quarantine: sa.Table | None, life: Lifecycle, policy: sa.Table | None = None,
        promoted: PromotedRun | None = None,
    ) -> UpsertCounts:
        ddl_commits = self.dialect.capabilities.ddl_commits
        # The promoted attribute columns are watched too: a field BOS stops filling empties them.
        watched = watched_columns(
            options.coverage_columns, options.pii,
            lambda: column_names(self.engine, self.dialect, self.table, self.schema), table=self.destination_table,
            promoted=options.promoted_columns,
        ) if COVERAGE_COLUMN in self.audit_columns else None
        tx = RunTransaction(self.engine, self.dialect, table=self.table, schema=self.schema, run_id=run.run_id,
                            lock_timeout_s=self.lock_timeout_s, guard_index=self.guard_index)
        try:
            try:
                tx.begin()
                if policy is not None:  # the stored policy read under the lock: no pii-apply commits in between
                    tx.lock()
                    self._settle_policy(tx, policy, options.pii, run.run_id)
                columns = options.attribute_columns or AttributeColumns()
                tx.carried_columns = columns.names  # new history versions carry them
                rehashed = self._prepare(tx, life)
                filled = promoted.settle(tx, run.run_id, options.invalid_records) if promoted is not None else None
                direct, parse_json = self._prepare_staging(tx, options)
                rejects, loaded, wrong = self._load_records(tx, records, default_obs, options, quarantine is not None,
                                                            direct=direct, parse_json=parse_json)
                if policy is None:
                    self._refuse_late_policy(tx, run.run_id)
                # Known only now that every record was consumed; raising here rolls back.
                audit = audit_row_fields(options.audit() if callable(options.audit) else options.audit)
                read_guards(tx, audit, life, run)
                counts = settle(tx, loaded)
                if columns and counts.written:  # the merge wrote attributes; the columns follow them
                    fill_written(tx, columns, run.run_id)
                if rejects:
                    assert quarantine is not None
                    tx.conn.execute(quarantine.insert(), rejects.table_rows(run.run_id, utcnow()))
                    counts.rejected = len(rejects)
                    audit = partial_with(audit, rejects.note(self._qualified(quarantine.name)))
                if rehashed:
                    audit = with_rehash_note(audit, rehashed, run.run_id)
                if wrong is not None and wrong.nulls:
                    counts.attribute_type_errors = sum(wrong.nulls.values())
                    log.warning("BOS run %s: %s", run.run_id, wrong.note())
                    audit = with_note(audit, wrong.note())
                # After the merge, under the lock, with the staged keys: supersede, retire, history.
                audit = reconcile(tx, counts, audit, life=life, run=run, loaded=loaded)
                if filled is not None:  # after reconcile: a stored value does not stop a complete read retiring
                    audit = (partial_with if filled.partial else with_note)(audit, filled.note)
                coverage = count_coverage(tx, counts, loaded, watched)  # before staging is dropped
                audit.pop("observed_at", None)
                if not ddl_commits:  # else after the commit: a DROP would commit the run half-done
                    tx.drop_staging()
                tx.exec(audit_insert(self.dialect, self.audit_table, self.schema, run, finished_at=utcnow(),
                                     counts=counts.as_dict(), destination_table=self.destination_table,
                                     present=self.audit_columns, scope=scope_key(life.options, run), coverage=coverage,
                                     **audit))
                tx.conn.commit()
            except BaseException as exc:
                tx.rollback()
                if isinstance(exc, (sa.exc.SQLAlchemyError, self._driver_error)):  # COPY raises the driver's own
                    raise BosWarehouseError(
                        f"Writing to {self.destination_table} failed and was rolled back (the table is "
                        f"unchanged): {db_detail(exc)}"
                    ) from exc
                raise
            if ddl_commits:
                tx.drop_committed_staging()
        finally:
            tx.close()
        log.info(
            "BOS run %s -> %s: inserted=%d updated=%d unchanged=%d skipped_stale=%d duplicates=%d retired=%d "
            "superseded=%d (%s)",
            run.run_id, self.destination_table, counts.inserted, counts.updated, counts.unchanged,
            counts.skipped_stale, counts.duplicates, counts.retired, counts.superseded, self.staging_method,
        )
        return counts

    def _prepare(self, tx: RunTransaction, life: Lifecycle) -> int:
        """Before the records: temporary tables where DDL commits, the one-time re-hash (its count), history."""
        if self.dialect.capabilities.ddl_commits:  # every temporary table before the first write
            tx.precreate()
        rehashed = rehash_stamped_rows(tx, self._records_table())
        if life.history_table is not None:
            seed_history(tx, life.history_table)
        seed_provenance(tx, life.sources_table)
        return rehashed

    def _prepare_staging(self, tx: RunTransaction, options: WriteOptions) -> tuple[bool, bool]:
        """Decide how this run loads, create its staging table; return (direct, parse_json)."""
        capabilities = self.dialect.capabilities
        # An empty target (first run, full reload): every row will be written, so the dialect may
        # parse JSON while staging. Only a hint: classification and merge run under the lock and
        # are correct for either staging form.
        empty = (capabilities.uses_copy or capabilities.direct_load) and tx.target_is_empty()
        direct = False
        if empty and capabilities.direct_load:
            # Load the records into the table itself as they stream in. The writers' lock is taken
            # now and the table looked at again under it: it must still be empty.
            tx.lock()
            direct = tx.target_is_empty()
        # JSONB documents in staging (PostgreSQL): parsed while they are copied, during the stream,
        # instead of in the merge after it. Worth it when the staged rows are mostly written: an
        # empty table, or a read with wire hashes (unchanged records then arrive as claims, not
        # documents). Measured: first sync into a table holding 200k other rows 11.70 s -> 8.97 s
        # (median, bench/README.md).
        parse_json = capabilities.uses_copy and not direct and (empty or options.known is not None)
        tx.create_staging(parse_json=parse_json)
        return direct, parse_json

    def _load_records(
        self, tx: RunTransaction, records: Iterable[Any], default_obs: datetime | None, options: WriteOptions,
        quarantine: bool, *, direct: bool, parse_json: bool,
    ) -> tuple[Rejects | None, LoadOutcome, WrongTypes | None]:
        """Load every record; return the run's rejects (with ``quarantine``), what was loaded, and the
        promoted attribute values of the wrong type (with ``options.attribute_columns``).

        If the stream is resumed and the final frame comes again from its start
        (:class:`BosFinalFrameRestarted`), nothing loaded from the cut frame may merge: it is
        discarded and the records are loaded again from the new frame.
        """
        loader = loader_for(self.dialect.capabilities.load_method)
        synced_at = utcnow()
        tx.mark_records_start()
        while True:
            # Under a personal-data policy a quarantined record keeps only its ref and reason.
            rejects = Rejects(keep_records=options.pii is None or not options.pii.rules) if quarantine else None
            columns, wrong = options.attribute_columns, None
            checked = records
            if columns:  # a promoted value of the wrong type: quarantined, fails the run, or NULL
                wrong = WrongTypes(columns, rejects)
                checked = columns.checked(records, wrong)
            try:
                if direct:
                    loaded, staged = loader.load_direct(tx, checked, default_obs, synced_at,
                                                        batch_size=self.batch_size, rejects=rejects)
                    return rejects, DirectLoad(loaded, staged, synced_at), wrong
                seen = SeenKeys()
                kept = kept_claims(tx, options.known, keeps_claims=loader.keeps_claims)
                staged = loader.stage(tx, checked, default_obs, batch_size=self.batch_size,
                                      seen=seen, kept=kept, rejects=rejects)
                if kept is not None and kept.count:
                    return rejects, StagedWithKeptClaims(staged, seen, parse_json, kept), wrong
                return rejects, StagedLoad(staged, seen, parse_json), wrong
            except UnstorableRecord as refused:
                if options.pii is None or not options.pii.rules:
                    raise
                # Under a personal-data policy the run's error (its log, the failed audit row) quotes no value.
                raise UnstorableRecord(refused.without_values, without_values=refused.without_values) from None
            except BosFinalFrameRestarted as restart:
                tx.discard_records()
                records = restart.records
                log.warning("BOS run %s: the final frame restarted on a resumed stream; the records "
                            "loaded from the cut frame were discarded.", tx.run_id)

    # --- failures ---------------------------------------------------------------------------

    def record_failure(
        self,
        run: SyncRunInfo,
        *,
        error: str,
        source_summary: list[Any] | None = None,
        provisional_records: int = 0,
        provisional_pages: int = 0,
    ) -> None:
        """Write a ``failed`` audit row for ``run`` in its own small transaction.

        Idempotent for failures: if a failed row exists it is updated. A run already committed as
        complete/partial is left as it is (its records did land) and a warning is logged.
        """
        self._ensure_once()
        record_failed_run(self.engine, self.dialect, self.audit_table, self.schema, run, error=error,
                          destination_table=self.destination_table, present=self.audit_columns,
                          source_summary=source_summary, provisional_records=provisional_records,
                          provisional_pages=provisional_pages)
