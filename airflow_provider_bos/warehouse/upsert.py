"""WarehouseWriter: lands a run's final records and its audit row in ONE transaction.

The SQL comes from :mod:`.dialects`; this module only executes it, in order, on one connection:
stage -> (dedupe) -> lock -> classify -> merge -> audit row -> commit. Any failure rolls the whole
transaction back, so the records table is either the old state or the new one, never a mix.
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from itertools import islice
from typing import Any

import sqlalchemy as sa

from airflow_provider_bos.exceptions import BosError, BosWarehouseError, excerpt
from airflow_provider_bos.warehouse.audit import RUN_STATUSES, SyncRunInfo, audit_insert, utcnow
from airflow_provider_bos.warehouse.dialects import Statement, dialect_for, staging_table_name
from airflow_provider_bos.warehouse.identifiers import validate_identifier, validate_schema
from airflow_provider_bos.warehouse.records import (
    RecordRow,
    json_column_values,
    json_document_values,
    json_row_values,
    parse_timestamp,
    record_parts,
    record_to_row,
)
from airflow_provider_bos.warehouse.schema import GUARD_INDEX_COLUMNS, WIRE_HASH_COLUMN, audit_table, records_table
from airflow_provider_bos.wire import KnownRecord, WireHashSet

__all__ = ["UpsertCounts", "WarehouseWriter"]

log = logging.getLogger(__name__)


@dataclass
class UpsertCounts:
    """What one run did to the records table.

    ``duplicates`` counts rows dropped because an earlier-or-equal copy of the same ``record_ref``
    came in the same result (the latest ``observed_at`` wins; a tie goes to the last occurrence).
    The other four partition the distinct ``record_ref``s.
    """

    inserted: int = 0
    updated: int = 0
    unchanged: int = 0
    skipped_stale: int = 0
    duplicates: int = 0

    @property
    def received(self) -> int:
        """Records received, duplicates included."""
        return self.inserted + self.updated + self.unchanged + self.skipped_stale + self.duplicates

    @property
    def written(self) -> int:
        return self.inserted + self.updated

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


# Staged rows a direct load holds in memory before it pauses the target's COPY to stage them (~2 MB;
# at a million records the filter's ~1.5% false positives alone would otherwise hold ~10 MB).
_PENDING_LIMIT = 2_000


class SeenKeys:
    """The record_refs a load has seen so far: a Bloom filter of one probe, 8 MiB.

    Key ``k`` is "seen" if bit ``hash(k) % BITS`` is set (Python's salted str hash: stable within
    a process, which is all one load needs). Never wrong for a key added before (no false
    negatives); sometimes right for a new key too (~0.3% at 200k keys, ~1.5% at a million). The
    direct load sends such a record through staging and the merge, where it lands the same (it
    tests and sets the bit inline in its loop: a method call per record cost more than the test).
    Staging passes its rows through :meth:`watch`; the suspects are then looked up in staging to
    tell real repeats from false positives.
    """

    BITS = 1 << 26
    #: How many suspects :meth:`watch` remembers (~1 MB of keys); past it, ``suspects`` is None.
    SUSPECTS_LIMIT = 10_000

    def __init__(self) -> None:
        self.bits = bytearray(self.BITS >> 3)
        #: Keys that found their bit set: 0 proves every key was distinct.
        self.repeats = 0
        #: Those keys (from :meth:`watch`): every later occurrence of a repeated key is among them,
        #: with the filter's false positives (~300 at 200k keys).
        self.suspects: list[str] | None = []

    def watch(self, rows: Iterable[tuple[Any, ...]]) -> Iterator[tuple[Any, ...]]:
        """Pass staged rows (record_ref first) through, noting possible repeats of their key."""
        bits, mask = self.bits, self.BITS - 1
        for row in rows:
            h = hash(row[0]) & mask
            byte, bit = h >> 3, 1 << (h & 7)
            if bits[byte] & bit:
                self._suspect(row[0])
            else:
                bits[byte] |= bit
            yield row

    def _suspect(self, key: str) -> None:
        self.repeats += 1
        suspects = self.suspects
        if suspects is not None:
            if len(suspects) < self.SUSPECTS_LIMIT:
                suspects.append(key)
            else:
                self.suspects = None


# Bound parameters per suspect lookup (SQLite before 3.32 allows 999).
_KEYS_PER_QUERY = 500


class _KeptClaims:
    """A run's KnownRecord claims kept out of staging: which stored rows were claimed, and when.

    A claim names a stored row by the position of its wire-hash prefix in the :class:`WireHashSet`
    the read matched it in (``hits``: 1 byte per stored row; ``last_seq``: where in the read it last
    came, for the dedupe's tie-break if it must be staged after all). A key also staged in the same
    run is found in SQL (see :meth:`WarehouseWriter._claims_apart`).
    """

    def __init__(self, known: WireHashSet) -> None:
        self.known = known
        self.hits = bytearray(len(known))
        self.last_seq = array("q", bytes(8 * len(known)))
        #: Claims kept, and how many of them repeated an earlier one (the same bytes again).
        self.count = self.repeats = 0

    def keep(self, claim: KnownRecord, seq: int) -> bool:
        """Keep ``claim`` out of staging; False for one matched elsewhere (it is staged as before)."""
        if claim.matched is not self.known:
            return False
        position = claim.handle
        if self.hits[position]:
            self.repeats += 1
        else:
            self.hits[position] = 1
        self.last_seq[position] = seq
        self.count += 1
        return True

    @property
    def rows(self) -> int:
        """How many distinct stored rows were claimed."""
        return self.count - self.repeats

    def claimed_prefix(self, prefix: str) -> bool:
        """True if a kept claim matched the stored wire hash that starts with ``prefix``."""
        try:
            position = self.known.prefix_position(int(prefix, 16)) if len(prefix) == 16 else -1
        except ValueError:  # not hex: no claim can have matched it
            return False
        return position >= 0 and self.hits[position] == 1


# COPY lines are sent in blocks (a write per line cost a third of the client's staging time).
_COPY_BLOCK = 2048


def _send(copy: Any, lines: list[bytes]) -> int:
    """Write ``lines`` to a COPY in one block and empty the list; return how many were sent."""
    count = len(lines)
    if count:
        copy.write(b"".join(lines))
        lines.clear()
    return count


def _locked() -> None:
    """The lock step of a path that took the writers' lock already."""


def _chunks(items: Iterator[Any], size: int) -> Iterator[list[Any]]:
    while chunk := list(islice(items, size)):
        yield chunk


class WarehouseWriter:
    """Writes federated records into a records table keyed by ``record_ref``, plus the audit row.

    :param engine: a SQLAlchemy engine on PostgreSQL (psycopg 3 gets COPY), MySQL/MariaDB
        (``mysql+pymysql``) or SQLite.
    :param table: records table name (validated identifier).
    :param schema: PostgreSQL schema / MySQL database; SQLite: ``None`` or ``"main"``.
    :param audit_table: audit table name, in the same schema.
    :param batch_size: rows per staging ``executemany`` chunk (memory bound; ignored by COPY).
    :param lock_timeout_s: how long to wait for another writer of the same table.
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
        sqlite_busy_timeout_s: float = 30.0,
        use_copy: bool | None = None,
    ) -> None:
        self.engine = engine
        options: dict[str, Any] = {}
        if engine.dialect.name == "sqlite":
            options["busy_timeout_s"] = sqlite_busy_timeout_s
        elif engine.dialect.name == "postgresql":
            options["use_copy"] = use_copy
        self.dialect = dialect_for(engine, **options)
        self.table = validate_identifier(table, kind="table")
        self.audit_table = validate_identifier(audit_table, kind="audit table")
        self.schema = validate_schema(schema, self.dialect.name)
        if batch_size < 1:
            raise BosWarehouseError("batch_size must be at least 1.")
        self.batch_size = batch_size
        self.lock_timeout_s = lock_timeout_s
        self.use_copy = self.dialect.uses_copy
        # The DB-API's base error: COPY runs on the raw driver connection, outside SQLAlchemy.
        self._driver_error: type[BaseException] = getattr(
            getattr(engine.dialect, "loaded_dbapi", None), "Error", sa.exc.SQLAlchemyError
        )
        self._tables_ready = False
        # The records table's covering index for the change test, when it has one (MySQL).
        self.guard_index: str | None = None

    @property
    def destination_table(self) -> str:
        """``schema.table`` (or ``table``), as recorded in the audit row."""
        return f"{self.schema}.{self.table}" if self.schema else self.table

    @property
    def staging_method(self) -> str:
        """``"copy"`` or ``"executemany"``: how rows reach the staging table."""
        return "copy" if self.use_copy else "executemany"

    # --- DDL --------------------------------------------------------------------------------

    def _metadata(self) -> tuple[sa.MetaData, sa.Table, sa.Table]:
        metadata = sa.MetaData()
        records = records_table(metadata, self.dialect.name, self.table, self.schema)
        audit = audit_table(metadata, self.dialect.name, self.audit_table, self.schema)
        return metadata, records, audit

    def ensure_tables(self) -> None:
        """Create the records and audit tables if missing; check an existing table has our columns.

        Each table in a transaction of its own, never the run's (MySQL commits DDL implicitly).
        """
        _, records, audit = self._metadata()
        try:
            for table in (audit, records):
                self._create_table(table)
            inspector = sa.inspect(self.engine)
            for table in (records, audit):
                present = {c["name"] for c in inspector.get_columns(table.name, schema=self.schema)}
                if table is records:
                    self.dialect.wire_hash_column = WIRE_HASH_COLUMN in present
                    if not self.dialect.wire_hash_column:
                        log.info("%s has no %s column: re-runs decode every record (see sql/ to add it).",
                                 self._qualified(table.name), WIRE_HASH_COLUMN)
                missing = [c.name for c in table.columns if c.name not in present and c.name != WIRE_HASH_COLUMN]
                if missing:
                    raise BosWarehouseError(
                        f"Table {self._qualified(table.name)} exists but lacks the columns {missing}; "
                        "add them (see sql/ for the DDL) or choose another table."
                    )
            if self.dialect.name == "mysql":
                self.guard_index = self._find_guard_index(inspector, records.name)
        except sa.exc.SQLAlchemyError as exc:
            raise BosWarehouseError(
                f"Could not create or inspect {self._qualified(self.table)} / "
                f"{self._qualified(self.audit_table)}: {_db_detail(exc)}"
            ) from exc
        self._tables_ready = True

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

    def _find_guard_index(self, inspector: Any, table: str) -> str | None:
        """An index of ``table`` leading with the change test's columns (tables made before it had none)."""
        for index in inspector.get_indexes(table, schema=self.schema):
            if tuple(index["column_names"][: len(GUARD_INDEX_COLUMNS)]) == GUARD_INDEX_COLUMNS:
                try:
                    return validate_identifier(index["name"], kind="index")
                except BosWarehouseError:  # a name we would have to quote unsafely: go without
                    continue
        log.info("%s has no index on %s; re-runs read whole rows (see sql/mysql.sql).",
                 self._qualified(table), ", ".join(GUARD_INDEX_COLUMNS))
        return None

    def known_wire_hashes(self) -> WireHashSet:
        """The wire hashes stored in the records table (empty if it has none or no such column).

        Given to the read (``FinalFrameScanner.known``), it lets byte-identical records through as
        :class:`~airflow_provider_bos.wire.KnownRecord` claims, never decoded; :meth:`write_run`
        verifies every claim in SQL. Read outside the run's transaction: a row changed in between
        fails that verification (and the run), it is never skipped.
        """
        self._ensure_once()
        if not self.dialect.wire_hash_column:
            return WireHashSet()
        d = self.dialect
        statement = d.wire_hash_prefixes(self.table, self.schema)
        try:
            with self.engine.connect() as conn:
                if d.wire_hash_prefixes_aggregated:
                    # The prefixes, then the table's state token from the same scan (see write_run).
                    text, *state = self._exec(conn, statement).one()
                    known = WireHashSet.from_sorted_prefix_text(text)
                    known.state = tuple(int(v) for v in state) if state else None
                else:
                    # Streamed (a server-side cursor where the driver has one): only the 8-byte
                    # prefixes are kept, not a string per stored row.
                    streamed = conn.execution_options(stream_results=True, yield_per=10_000)
                    known = WireHashSet(self._exec(streamed, statement).scalars())
        except sa.exc.SQLAlchemyError as exc:
            raise BosWarehouseError(f"Could not read the stored wire hashes of {self.destination_table}: "
                                    f"{_db_detail(exc)}") from exc
        return known

    def _qualified(self, name: str) -> str:
        return f"{self.schema}.{name}" if self.schema else name

    def _ensure_once(self) -> None:
        if not self._tables_ready:
            self.ensure_tables()

    # --- the run ----------------------------------------------------------------------------

    def write_run(
        self,
        run: SyncRunInfo,
        records: Iterable[Any],
        *,
        completeness: str | None = None,
        status: str | None = None,
        result_count: int | None = None,
        source_errors: list[Any] | None = None,
        source_summary: list[Any] | None = None,
        provisional_records: int = 0,
        provisional_pages: int = 0,
        default_observed_at: str | datetime | None = None,
        audit_failure: bool = False,
        audit: Callable[[], Mapping[str, Any]] | None = None,
        known: WireHashSet | None = None,
    ) -> UpsertCounts:
        """Upsert ``records`` and write exactly one audit row, in ONE transaction.

        ``records`` (FederatedRecord objects or dicts) is consumed once, streamed into staging.
        On any error everything is rolled back: the records table is untouched and no audit row is
        left. Errors from the records iterator itself (e.g. the stream ended early) propagate as they
        are; database errors become :class:`BosWarehouseError`. With ``audit_failure=True`` a
        ``failed`` audit row is then written in its own transaction (otherwise the caller does that
        with :meth:`record_failure`).

        ``audit``: for results whose metadata is known only once the records are consumed (a
        streamed final frame). Every record is staged first; THEN ``audit()`` is called, inside the
        same transaction, and its dict supplies any of ``completeness``, ``status``,
        ``result_count``, ``source_errors``, ``source_summary``, ``provisional_records``,
        ``provisional_pages`` (overriding the keywords). If it raises (e.g. an unknown
        completeness: fail closed), everything is rolled back and the error re-raised as is. It may
        also update ``run`` (e.g. ``context_handle``): the audit row is built after it returns.
        ``default_observed_at`` must be given up front (records are mapped while staging).

        ``known``: the :meth:`known_wire_hashes` the read matched its KnownRecord claims against.
        With it, PostgreSQL (COPY) keeps claims out of staging and confirms them all at once (the
        table's state token); without it, each claim is staged and verified by a join.
        """
        if audit is None and status not in RUN_STATUSES:
            raise BosWarehouseError(f"status must be one of {RUN_STATUSES}, not {status!r}.")
        fields: dict[str, Any] = {
            "status": status,
            "completeness": completeness,
            "result_count": result_count,
            "source_errors": source_errors,
            "source_summary": source_summary,
            "provisional_records": provisional_records,
            "provisional_pages": provisional_pages,
        }
        try:
            default_obs = parse_timestamp(default_observed_at) if default_observed_at else None
        except ValueError:
            raise BosWarehouseError(f"default_observed_at {str(default_observed_at)[:40]!r} is not ISO 8601.") from None
        try:
            self._ensure_once()
            return self._write(run, records, default_obs, audit, fields, known)
        except Exception as exc:
            if audit_failure:
                try:
                    self.record_failure(
                        run,
                        error=str(exc),
                        source_summary=fields["source_summary"],
                        provisional_records=fields["provisional_records"],
                        provisional_pages=fields["provisional_pages"],
                        source_errors=fields["source_errors"],
                        completeness=fields["completeness"],
                        result_count=fields["result_count"],
                    )
                except BosError as audit_exc:  # the original error matters more
                    log.warning("Could not record the failed run %s: %s", run.run_id, audit_exc)
            raise

    def _exec(self, conn: sa.Connection, statement: Statement) -> sa.CursorResult:
        return conn.exec_driver_sql(statement.sql, statement.params) if statement.params else conn.exec_driver_sql(
            statement.sql
        )

    def _write(
        self,
        run: SyncRunInfo,
        records: Iterable[Any],
        default_obs: datetime | None,
        audit_fn: Callable[[], Mapping[str, Any]] | None,
        audit: dict[str, Any],
        known: WireHashSet | None = None,
    ) -> UpsertCounts:
        d = self.dialect
        target = d.table_ref(self.table, self.schema)
        stage = staging_table_name(run.run_id)
        deduped = staging_table_name(run.run_id, "_d")
        conn = self.engine.connect()
        if d.isolation_level:
            conn = conn.execution_options(isolation_level=d.isolation_level)
        locked = False

        def lock() -> None:
            nonlocal locked
            result = None
            locks = d.lock(target, timeout_s=self.lock_timeout_s)
            for statement in locks:
                result = self._exec(conn, statement)
            if locks and d.lock_is_flag():
                if result is None or result.scalar() != 1:
                    raise BosWarehouseError(
                        f"Another writer held {self.destination_table} for {self.lock_timeout_s:.0f}s; "
                        "retry the task later."
                    )
                locked = True

        try:
            try:
                for statement in d.begin():
                    self._exec(conn, statement)
                if d.lock_before_staging:
                    lock()
                # An empty target (first run, full reload): every row will be written, so the
                # dialect may parse JSON while staging. Only a hint: classification and merge run
                # under the lock and are correct for either staging form.
                empty = self.use_copy and self._exec(conn, d.probe_empty(target)).first() is None
                direct = False
                kept: _KeptClaims | None = None
                if empty and d.direct_load:
                    # Load the records into the table itself as they stream in. The writers' lock
                    # is taken now and the table looked at again under it: it must still be empty.
                    lock()
                    direct = self._exec(conn, d.probe_empty(target)).first() is None
                self._exec(conn, d.create_staging(stage, self.schema, parse_json=empty and not direct))
                if direct:
                    synced_at = utcnow()
                    loaded, staged = self._load_direct(conn, stage, records, default_obs, synced_at, run.run_id)
                    received = loaded + staged
                else:
                    seen = SeenKeys()
                    kept = self._kept_claims(known)
                    received = self._stage(conn, stage, records, default_obs, seen, kept)
                if audit_fn is not None:
                    # Known only now that every record was consumed; raising here rolls back.
                    late = audit_fn()
                    unknown = set(late) - set(audit)
                    if unknown:
                        raise BosWarehouseError(f"audit() returned unknown fields {sorted(unknown)}.")
                    audit.update(late)
                    if audit["status"] not in RUN_STATUSES:
                        raise BosWarehouseError(f"status must be one of {RUN_STATUSES}, not {audit['status']!r}.")
                if direct:
                    counts = self._settle_direct(conn, stage, deduped, loaded, staged, synced_at, run.run_id)
                elif kept is not None and kept.count:
                    counts = self._settle_kept_claims(conn, lock, stage, deduped, received, run.run_id, seen, kept,
                                                      parse_json=empty)
                else:
                    counts = self._classify_and_merge(conn, lock, stage, deduped, received, run.run_id,
                                                      parse_json=empty,
                                                      maybe_duplicates=not self._keys_distinct(conn, stage, seen))

                for name in (deduped, stage):
                    self._exec(conn, d.drop_staging(name, self.schema))
                self._exec(
                    conn,
                    audit_insert(
                        d,
                        self.audit_table,
                        self.schema,
                        run,
                        finished_at=utcnow(),
                        counts=counts.as_dict(),
                        destination_table=self.destination_table,
                        **audit,
                    ),
                )
                conn.commit()
            except BaseException as exc:
                self._rollback(conn, stage, deduped)
                if isinstance(exc, (sa.exc.SQLAlchemyError, self._driver_error)):  # COPY raises the driver's own
                    raise BosWarehouseError(
                        f"Writing to {self.destination_table} failed and was rolled back (the table is "
                        f"unchanged): {_db_detail(exc)}"
                    ) from exc
                raise
            log.info(
                "BOS run %s -> %s: inserted=%d updated=%d unchanged=%d skipped_stale=%d duplicates=%d (%s)",
                run.run_id, self.destination_table, counts.inserted, counts.updated, counts.unchanged,
                counts.skipped_stale, counts.duplicates, self.staging_method,
            )
            return counts
        finally:
            if locked:
                unlock = d.unlock(target)
                if unlock is not None:
                    try:
                        self._exec(conn, unlock)
                        conn.commit()
                    except sa.exc.SQLAlchemyError:  # closing the connection releases it too
                        conn.invalidate()
            conn.close()

    # --- after staging ----------------------------------------------------------------------

    def _keys_distinct(self, conn: sa.Connection, stage: str, seen: SeenKeys) -> bool:
        """True if no record_ref was staged twice, proven without counting every distinct key in SQL.

        Every later occurrence of a repeated key found its bit set, so it is a suspect: the keys are
        distinct exactly when each suspect is staged once (a false positive's only occurrence).
        False also when there were too many suspects to look up (the dedupe then counts in SQL).
        """
        if not seen.repeats:
            return True
        if seen.suspects is None:
            return False
        suspects = sorted(set(seen.suspects))
        staged = self._staged_key_counts(conn, stage, suspects)
        return len(staged) == len(suspects) and all(n == 1 for n in staged.values())

    def _staged_key_counts(self, conn: sa.Connection, stage: str, keys: list[str]) -> dict[str, int]:
        """How many times each of ``keys`` is staged (absent: 0)."""
        found: dict[str, int] = {}
        for i in range(0, len(keys), _KEYS_PER_QUERY):
            statement = self.dialect.staged_key_counts(stage, self.schema, keys[i : i + _KEYS_PER_QUERY])
            found.update((ref, int(n)) for ref, n in self._exec(conn, statement))
        return found

    # --- claims kept out of staging ------------------------------------------------------------

    def _kept_claims(self, known: WireHashSet | None) -> _KeptClaims | None:
        """Where the run's claims go: kept out of staging (COPY with a table state token), or staged."""
        if (
            known is None or known.state is None or not len(known) or not self.use_copy
            or self.dialect.stored_wire_state(self.table, self.schema) is None or not known.unique
        ):
            return None
        return _KeptClaims(known)

    def _settle_kept_claims(
        self, conn: sa.Connection, lock: Callable[[], None], stage: str, deduped: str, staged: int, run_id: str,
        seen: SeenKeys, kept: _KeptClaims, *, parse_json: bool,
    ) -> UpsertCounts:
        """Classify and merge a run whose claims were kept out of staging.

        Usually (an unchanged re-run) no key is shared between claims and staged records and no row
        with a wire hash changed since the read matched the claims (the table's state token, taken
        again under the lock, is the one read with the hashes): the claimed rows are unchanged
        without a join. Otherwise the claims are staged from the very rows they matched, under the
        lock, and everything goes the general way (a matched row gone or changed fails the run).
        """
        apart = self._claims_apart(conn, stage, staged, seen, kept)
        lock()
        if apart and self._state_unchanged(conn, kept.known):
            if staged:
                counts = self._classify_and_merge(conn, _locked, stage, deduped, staged, run_id,
                                                  parse_json=parse_json, maybe_duplicates=False)
            else:
                counts = UpsertCounts()
            # The same bytes claimed twice are duplicates of one stored row (identical content).
            return replace(counts, unchanged=counts.unchanged + kept.rows, duplicates=counts.duplicates + kept.repeats)
        self._stage_kept_claims(conn, stage, kept)
        counts = self._classify_and_merge(conn, _locked, stage, deduped, staged + kept.rows, run_id,
                                          parse_json=parse_json, maybe_duplicates=not apart)
        return replace(counts, duplicates=counts.duplicates + kept.repeats)

    def _claims_apart(self, conn: sa.Connection, stage: str, staged: int, seen: SeenKeys, kept: _KeptClaims) -> bool:
        """True if no record_ref was staged twice, nor both staged and claimed."""
        if not self._keys_distinct(conn, stage, seen):
            return False
        if not staged:  # an unchanged re-run: nothing to look up
            return True
        # A claim's key is its stored row's: a staged key whose stored row's hash was claimed is both.
        statement = self.dialect.staged_stored_prefixes(stage, self.table, self.schema)
        return not any(kept.claimed_prefix(prefix) for prefix in self._exec(conn, statement).scalars())

    def _state_unchanged(self, conn: sa.Connection, known: WireHashSet) -> bool:
        """The table's state token now (under the lock) is the one read with ``known``."""
        statement = self.dialect.stored_wire_state(self.table, self.schema)
        assert statement is not None
        return tuple(int(v) for v in self._exec(conn, statement).one()) == known.state

    def _stage_kept_claims(self, conn: sa.Connection, stage: str, kept: _KeptClaims) -> None:
        """Stage every kept claim as a known row, from the stored row it matched (under the lock)."""
        prefixes, seqs = kept.known.prefixes, kept.last_seq
        positions = [i for i, hit in enumerate(kept.hits) if hit]
        statement = self.dialect.stage_claims(
            stage, self.table, self.schema, [f"{prefixes[i]:016x}" for i in positions], [seqs[i] for i in positions],
        )
        assert statement is not None  # kept only where the dialect has a state token (_kept_claims)
        found = self._exec(conn, statement).rowcount
        if found != len(positions):
            raise self._unverified(abs(len(positions) - found))

    def _dedupe(self, conn: sa.Connection, stage: str, deduped: str, staged: int, *, parse_json: bool) -> tuple[str, int]:
        """The staging table to merge from (one row per record_ref) and its number of rows."""
        d = self.dialect
        distinct = int(self._exec(conn, d.count_distinct(stage, self.schema)).scalar_one())
        if staged == distinct:
            return stage, distinct
        self._exec(conn, d.create_deduped(deduped, self.schema, parse_json=parse_json))
        self._exec(conn, d.dedupe(stage, deduped, self.schema, self.table))
        return deduped, distinct

    def _classify(self, conn: sa.Connection, source: str) -> tuple[int, int, int, int]:
        """inserted, updated, unchanged, skipped_stale of ``source`` against the target (under the lock)."""
        d = self.dialect
        inserted, updated, unchanged, stale, unverified = (
            int(v) for v in self._exec(conn, d.classify(source, self.table, self.schema, index=self.guard_index)).one()
        )
        if unverified:
            raise self._unverified(unverified)
        return inserted, updated, unchanged, stale

    def _unverified(self, count: int) -> BosWarehouseError:
        # Records skipped as known whose stored row is gone or changed since the run read the wire
        # hashes: their content was never decoded, so nothing can be written.
        return BosWarehouseError(
            f"{count} records arrived byte-identical to rows of {self.destination_table} "
            "that another writer changed or deleted during this run; nothing was written. "
            "Re-run the task (it will read them in full)."
        )

    def _merge(
        self, conn: sa.Connection, source: str, *, synced_at: datetime, run_id: str, new_only: bool,
        inserted: int, updated: int,
    ) -> None:
        """Run the dialect's merge of ``source``; each statement must write exactly the rows classified.

        A statement whose expected rowcount is 0 is not run (an unchanged re-run runs no merge at all).
        """
        merge = self.dialect.merge(source, self.table, self.schema, synced_at=synced_at, run_id=run_id,
                                   new_only=new_only)
        for statement, expected in merge:
            want = {"inserted": inserted, "updated": updated, "inserted+updated": inserted + updated}[expected]
            if want == 0:
                continue
            rowcount = self._exec(conn, statement).rowcount
            if rowcount is not None and rowcount >= 0 and rowcount != want:
                # The counts we report must be the rows written; anything else is a bug or a
                # concurrent writer outside our lock: do not commit it.
                raise BosWarehouseError(
                    f"The merge into {self.destination_table} changed {rowcount} rows where "
                    f"{want} ({expected}) were expected; rolled back."
                )

    def _classify_and_merge(
        self, conn: sa.Connection, lock: Callable[[], None], stage: str, deduped: str, received: int,
        run_id: str, *, parse_json: bool, maybe_duplicates: bool = True,
    ) -> UpsertCounts:
        """Staged -> deduped -> locked -> classified -> merged (the path of a table that had rows).

        ``maybe_duplicates=False`` (every staged key was seen once: SeenKeys has no false negatives)
        skips counting the distinct keys in SQL.
        """
        if maybe_duplicates:
            source, distinct = self._dedupe(conn, stage, deduped, received, parse_json=parse_json)
        else:
            source, distinct = stage, received
        if not self.dialect.lock_before_staging:
            lock()
        inserted, updated, unchanged, stale = self._classify(conn, source)
        counts = UpsertCounts(inserted, updated, unchanged, stale, received - distinct)
        if inserted + updated + unchanged + stale != distinct:  # pragma: no cover - invariant
            raise BosWarehouseError(f"Classification of {distinct} records does not add up: {counts}.")
        # Under the lock the target cannot change between classification and merge, so the
        # classification may pick the merge: all new -> a plain INSERT ... SELECT.
        self._merge(conn, source, synced_at=utcnow(), run_id=run_id, new_only=inserted == distinct and distinct > 0,
                    inserted=inserted, updated=updated)
        return counts

    # --- the direct load of an empty table ------------------------------------------------------

    def _load_direct(
        self, conn: sa.Connection, stage: str, records: Iterable[Any], default_obs: datetime | None,
        synced_at: datetime, run_id: str,
    ) -> tuple[int, int]:
        """COPY the records into the (empty, locked) target as they arrive; return (loaded, staged).

        A record whose record_ref may already have been loaded by this run (a duplicate, or a rare
        false positive of :class:`SeenKeys`) goes to staging instead, to be merged after the last
        record (:meth:`_settle_direct`); so the target holds each record_ref's FIRST copy and
        staging every later one. Staged rows wait in memory while the target's COPY runs (one COPY
        at a time per connection); past ``_PENDING_LIMIT`` that COPY is ended, they are staged,
        and a new one starts.
        """
        d = self.dialect
        raw = conn.connection.driver_connection  # psycopg.Connection, same transaction
        line = d.target_lines(synced_at=synced_at, run_id=run_id).line
        seen = SeenKeys()
        bits, mask = seen.bits, SeenKeys.BITS - 1
        source = enumerate(records)  # one iterator across COPY rounds
        pending: list[tuple[Any, ...]] = []
        loaded = staged = 0
        with raw.cursor() as cursor:
            while True:
                finished = True
                copied = 0
                with cursor.copy(d.copy_target(self.table, self.schema)) as copy:
                    lines: list[bytes] = []
                    for seq, record in source:
                        values = json_column_values(record, default_obs) if getattr(record, "from_json", False) else None
                        if values is None:
                            values = self._column_values(record, default_obs)
                        ref, parts, observed, record_hash, document = values
                        wire_hash = getattr(record, "wire_hash", None)
                        h = hash(ref) & mask  # SeenKeys' bit of this key
                        byte, bit = h >> 3, 1 << (h & 7)
                        if bits[byte] & bit:
                            pending.append((ref, document, observed, record_hash, wire_hash, seq))
                            if len(pending) >= _PENDING_LIMIT:
                                finished = False
                                break
                            continue
                        bits[byte] |= bit
                        lines.append(line(parts, document, observed, record_hash, wire_hash))
                        if len(lines) == _COPY_BLOCK:
                            copied += _send(copy, lines)
                    copied += _send(copy, lines)
                if 0 <= cursor.rowcount != copied:  # pragma: no cover - the server's own count
                    raise BosWarehouseError(f"COPY into {self.destination_table} loaded {cursor.rowcount} "
                                            f"rows where {copied} were sent; rolled back.")
                loaded += copied
                if pending:
                    with cursor.copy(d.copy_staging(stage, self.schema)) as copy:
                        copy.write(b"".join(d.copy_lines(pending)))
                    staged += len(pending)
                    pending.clear()
                if finished:
                    return loaded, staged

    def _column_values(self, record: Any, default_obs: datetime | None) -> tuple[Any, ...]:
        """The general path of :func:`json_column_values`'s tuple (any record; raises for a bad one)."""
        if type(record) is KnownRecord:
            # A claim on a stored row, yet the table was empty under the lock: that row is gone.
            raise self._unverified(1)
        return record_parts(record_to_row(record, default_observed_at=default_obs))

    def _settle_direct(
        self, conn: sa.Connection, stage: str, deduped: str, loaded: int, staged: int, synced_at: datetime,
        run_id: str,
    ) -> UpsertCounts:
        """Counts of a direct load; merges what it staged (later copies of record_refs, see _load_direct).

        The table was empty under the lock, so every row in it is this run's: a staged record_ref
        found there is a duplicate. The merge's guard (stored observed_at not newer, content
        differs) lets the staged copy replace the loaded one exactly when dedupe would have picked
        it: it is later in the result, so it wins ties.
        """
        if staged == 0:
            return UpsertCounts(inserted=loaded)
        source, _ = self._dedupe(conn, stage, deduped, staged, parse_json=False)
        new, updated, _, _ = self._classify(conn, source)
        inserted = loaded + new
        self._merge(conn, source, synced_at=synced_at, run_id=run_id, new_only=False, inserted=new, updated=updated)
        if self.dialect.wire_hash_column:
            self._exec(conn, self.dialect.adopt_wire_hashes(source, self.table, self.schema))
        return UpsertCounts(inserted=inserted, duplicates=loaded + staged - inserted)

    def _rollback(self, conn: sa.Connection, *stages: str) -> None:
        try:
            conn.rollback()
            if self.dialect.name == "mysql":
                # MySQL temporary tables survive a rollback; the pooled connection must not keep them.
                for name in stages:
                    self._exec(conn, self.dialect.drop_staging(name, self.schema))
                conn.commit()
        except sa.exc.SQLAlchemyError:
            conn.invalidate()  # a broken connection goes back to no pool

    def _documents(
        self, records: Iterable[Any], default_obs: datetime | None, kept: _KeptClaims | None = None,
    ) -> Iterator[tuple[Any, ...]]:
        """Document-staged tuples: (record_ref, document as UTF-8 bytes, observed_at, hash, wire hash, seq).

        A known record: (record_ref, None, None, None, wire hash, seq), unless ``kept`` keeps it.
        """
        keep = kept.keep if kept is not None else None
        for seq, record in enumerate(records):
            if type(record) is KnownRecord:
                if keep is None or not keep(record, seq):
                    yield (record.record_ref, None, None, None, record.wire_hash, seq)
                continue
            wire_hash = getattr(record, "wire_hash", None)
            if getattr(record, "from_json", False):
                values = json_document_values(record, default_obs)
                if values is not None:
                    yield (*values, wire_hash, seq)
                    continue
            row: RecordRow = record_to_row(record, default_observed_at=default_obs)
            yield (row.record_ref, row.document.encode("utf-8"), row.observed_at, row.record_hash, wire_hash, seq)

    def _rows(self, records: Iterable[Any], default_obs: datetime | None) -> Iterator[tuple[Any, ...]]:
        d = self.dialect
        stage_value, known_value, bind_ts = d.stage_value, d.known_value, d.bind_timestamp
        for seq, record in enumerate(records):
            if type(record) is KnownRecord:
                yield known_value(record.record_ref, record.wire_hash, seq)
                continue
            wire_hash = getattr(record, "wire_hash", None)
            if getattr(record, "from_json", False):
                # JSON-decoded wire records (the streamed final frame): straight to the staged tuple.
                values = json_row_values(record, default_obs)
                if values is not None:
                    yield (*values[:8], bind_ts(values[8]), values[9], wire_hash, seq)
                    continue
            row: RecordRow = record_to_row(record, default_observed_at=default_obs)
            yield stage_value(row, seq, wire_hash)

    def _stage(
        self, conn: sa.Connection, stage: str, records: Iterable[Any], default_obs: datetime | None,
        seen: SeenKeys | None = None, kept: _KeptClaims | None = None,
    ) -> int:
        """Stream the records into staging; return how many were staged.

        ``seen``: watches the staged keys (its ``repeats`` stays 0 when they were all distinct).
        ``kept``: takes the claims it can instead (COPY only).
        """
        d = self.dialect
        received = 0
        watch = seen.watch if seen is not None else iter
        if self.use_copy:
            raw = conn.connection.driver_connection  # psycopg.Connection, same transaction
            with raw.cursor() as cursor, cursor.copy(d.copy_staging(stage, self.schema)) as copy:
                # Document staging: COPY text lines built here, in blocks (per-row write_row() of
                # eleven columns was a third of the client's staging time).
                lines: list[bytes] = []
                for line in d.copy_lines(watch(self._documents(records, default_obs, kept))):
                    lines.append(line)
                    if len(lines) == _COPY_BLOCK:
                        received += _send(copy, lines)
                received += _send(copy, lines)
            return received
        insert = d.insert_staging(stage, self.schema).sql
        for chunk in _chunks(watch(self._rows(records, default_obs)), self.batch_size):
            conn.exec_driver_sql(insert, chunk)
            received += len(chunk)
        return received

    # --- failures ---------------------------------------------------------------------------

    def record_failure(
        self,
        run: SyncRunInfo,
        *,
        error: str,
        source_summary: list[Any] | None = None,
        provisional_records: int = 0,
        provisional_pages: int = 0,
        source_errors: list[Any] | None = None,
        completeness: str | None = None,
        result_count: int | None = None,
    ) -> None:
        """Write a ``failed`` audit row for ``run`` in its own small transaction.

        Idempotent for failures: if a failed row exists it is updated. A run already committed as
        complete/partial is left as it is (its records did land) and a warning is logged.
        """
        self._ensure_once()
        d = self.dialect
        audit = audit_table(sa.MetaData(), d.name, self.audit_table, self.schema)
        statement = audit_insert(
            d,
            self.audit_table,
            self.schema,
            run,
            status="failed",
            finished_at=utcnow(),
            completeness=completeness,
            result_count=result_count,
            provisional_records=provisional_records,
            provisional_pages=provisional_pages,
            source_errors=source_errors,
            source_summary=source_summary,
            error_message=error,
            destination_table=self.destination_table,
        )
        try:
            with self.engine.begin() as conn:
                existing = conn.execute(sa.select(audit.c.status).where(audit.c.run_id == run.run_id)).scalar()
                if existing is None:
                    self._exec(conn, statement)
                elif existing == "failed":  # replace the earlier failure with this, newer one
                    conn.execute(audit.delete().where(audit.c.run_id == run.run_id))
                    self._exec(conn, statement)
                else:
                    log.warning(
                        "Run %s is already recorded as %s; not overwriting it with a failure (%s).",
                        run.run_id, existing, excerpt(error, 200),
                    )
        except sa.exc.SQLAlchemyError as exc:
            raise BosWarehouseError(f"Could not write the failed audit row for run {run.run_id}: {_db_detail(exc)}") from exc


def _db_detail(exc: BaseException) -> str:
    # The driver's message only: str(exc) would append the SQL and its parameters (record data),
    # and a COPY error's context quotes the row.
    orig = getattr(exc, "orig", None) or exc
    primary = getattr(getattr(orig, "diag", None), "message_primary", None)
    if primary:
        return excerpt(f"{type(orig).__name__}: {primary}", 300)
    return excerpt(str(orig) if orig is not exc else exc.__class__.__name__, 300)
