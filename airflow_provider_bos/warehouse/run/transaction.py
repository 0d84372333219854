"""One run's connection and the steps every write path shares: lock, dedupe, classify, merge.

A :class:`RunTransaction` is opened by :meth:`~..writer.WarehouseWriter.write_run` and handed to
the loading (:mod:`.loads`) and claim (:mod:`.claims`) steps; it executes the SQL the dialect
builds, in order, on one connection, and knows the run's two staging tables.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime

import sqlalchemy as sa

from airflow_provider_bos.exceptions import BosWarehouseError
from airflow_provider_bos.warehouse.dialects import Statement, WarehouseDialect, staging_table_name
from airflow_provider_bos.warehouse.dialects.lifecycle import RunKeys, ScopeFilter
from airflow_provider_bos.warehouse.run.audit import utcnow
from airflow_provider_bos.warehouse.run.db_calls import DriverResult, db_detail, execute

__all__ = ["RunTransaction", "UpsertCounts", "db_detail", "execute"]

#: The lifecycle steps' work tables (suffix, kind), made up front where DDL commits (see precreate).
LIFECYCLE_WORK_TABLES = (
    ("_c", "keys"), ("_o", "provenance"), ("_n", "provenance"), ("_s", "successors"), ("_r", "keys"),
)
# Bound parameters per suspect lookup (SQLite before 3.32 allows 999).
_KEYS_PER_QUERY = 500


@dataclass
class UpsertCounts:
    """What one run did to the records table.

    ``duplicates`` counts rows dropped because an earlier-or-equal copy of the same ``record_ref``
    came in the same result (the latest ``observed_at`` wins; a tie goes to the last occurrence).
    The other five partition the distinct ``record_ref``s. ``rejected``: records quarantined in the
    rejects table (``invalid_records="quarantine"``), not among the others.
    """

    inserted: int = 0
    updated: int = 0
    unchanged: int = 0
    skipped_stale: int = 0
    duplicates: int = 0
    rejected: int = 0
    #: Current rows this run retired (a complete full read did not return them) and superseded (all
    #: their provenance now belongs to other records of a complete result). Not among the others.
    retired: int = 0
    superseded: int = 0
    #: Rows the run would have retired but ``max_retire_fraction`` kept current (the run is partial).
    retire_withheld: int = 0
    #: Records of a partial read under a ref a complete read merged away (its successor still current):
    #: kept out of the table, not revived.
    withheld: int = 0
    #: Promoted attribute values of the wrong type stored as NULL (``attribute_type_errors="null"``).
    attribute_type_errors: int = 0

    @property
    def received(self) -> int:
        """Records received, duplicates included."""
        return self.inserted + self.updated + self.unchanged + self.skipped_stale + self.withheld + self.duplicates

    @property
    def written(self) -> int:
        return self.inserted + self.updated

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class RunTransaction:
    """The connection of one run against ``table``, with its staging tables ``stage`` and ``deduped``.

    :param guard_index: the target's covering index for the change test, when it has one (MySQL).
    """

    def __init__(
        self, engine: sa.Engine, dialect: WarehouseDialect, *, table: str, schema: str | None, run_id: str,
        lock_timeout_s: float, guard_index: str | None,
    ) -> None:
        self.dialect = dialect
        self.table = table
        self.schema = schema
        self.run_id = run_id
        self.lock_timeout_s = lock_timeout_s
        self.guard_index = guard_index
        self.target = dialect.table_ref(table, schema)
        self.destination_table = f"{schema}.{table}" if schema else table
        self.stage = staging_table_name(run_id)
        self.deduped = staging_table_name(run_id, "_d")
        conn = engine.connect()
        isolation = dialect.capabilities.isolation_level
        if isolation:
            conn = conn.execution_options(isolation_level=isolation)
        self.conn = conn
        #: What the final result says of the read, set once it is known (see :meth:`withhold`): when it
        #: observed its records; whether it was partial; and, for a read older than its scope's newest
        #: complete read, the audit table and the scope that newer read answered for.
        self.read_time: datetime | None = None
        self.partial_read = False
        self.answered_by_newer: tuple[str, ScopeFilter] | None = None
        #: Where the run's record_refs are, once a step after the merge collected them (reconcile, coverage).
        self.run_keys: RunKeys | None = None
        #: Rows re-hashed at the start of this run (a table whose hashes covered observation stamps).
        self.rehashed = 0
        self.wire_hashes_to_store = 0  # set by classify()
        #: The promoted attribute columns new history versions carry (see :mod:`.attribute_columns`).
        self.carried_columns: tuple[str, ...] = ()
        #: Work tables of the lifecycle steps (see :meth:`work_table`), dropped with the staging tables.
        self.work_tables: list[str] = []
        self._created: set[str] = set()  # temporary tables made so far
        self._precreated = False
        self._locked = False  # the writers' lock is held
        self._database = str(engine.url.database or "")
        self._process_lock: threading.Lock | None = None  # held (see WarehouseDialect.process_lock)
        self._unlock_needed = False  # ... and must be released explicitly (a named lock)

    def exec(self, statement: Statement) -> DriverResult:
        return execute(self.conn, statement)

    def begin(self) -> None:
        """Open the run's transaction (and take the lock first where the dialect needs it)."""
        for statement in self.dialect.begin():
            self.exec(statement)
        if self.dialect.capabilities.lock_before_staging:
            self.lock()

    def lock(self) -> None:
        """Serialise writers of the target until the transaction ends (a no-op once held)."""
        if self._locked:
            return
        d = self.dialect
        local = d.process_lock(self._database, self.target)
        if local is not None:
            if not local.acquire(timeout=max(self.lock_timeout_s, 0)):
                raise BosWarehouseError(
                    f"Another writer in this process held {self.destination_table} for "
                    f"{self.lock_timeout_s:.0f}s; retry the task later."
                )
            self._process_lock = local
        result = None
        locks = d.lock(self.target, timeout_s=self.lock_timeout_s)
        for statement in locks:
            result = self.exec(statement)
        if locks and d.lock_is_flag():
            if result is None or result.scalar() != 1:
                raise BosWarehouseError(
                    f"Another writer held {self.destination_table} for {self.lock_timeout_s:.0f}s; "
                    "retry the task later."
                )
            self._unlock_needed = True
        self._locked = True

    def mark_records_start(self) -> None:
        """A savepoint: everything loaded after it can be discarded by :meth:`discard_records`."""
        savepoint = self.dialect.savepoint()
        if savepoint is not None:
            self.exec(savepoint)

    def discard_records(self) -> None:
        """Undo every row loaded since :meth:`mark_records_start` (staging and direct load), in the
        same transaction; the lock and the staging tables taken before it stay."""
        for statement in self.dialect.discard_records((self.stage, self.deduped), self.table, self.schema, self.run_id):
            self.exec(statement)

    def target_is_empty(self) -> bool:
        return self.exec(self.dialect.probe_empty(self.target)).first() is None

    def create_staging(self, *, parse_json: bool) -> None:
        self._create(self.stage, self.dialect.create_staging(self.stage, self.schema, parse_json=parse_json))

    def _create(self, name: str, statement: Statement) -> bool:
        """Create the run's temporary table ``name`` unless :meth:`precreate` made it; True if made now."""
        if name in self._created:
            return False
        if self.dialect.capabilities.ddl_commits and self._precreated:  # pragma: no cover - a step precreate() misses
            raise BosWarehouseError(f"Internal error: the temporary table {name} was not made before the run's "
                                    "first write (its DDL would commit the run half-done); nothing was written.")
        self.exec(statement)
        self._created.add(name)
        return True

    def precreate(self) -> None:
        """Make every temporary table the run may use before its first write (where DDL commits)."""
        d = self.dialect
        self.create_staging(parse_json=False)
        self._create(self.deduped, d.create_deduped(self.deduped, self.schema, parse_json=False))
        for suffix, kind in LIFECYCLE_WORK_TABLES:
            self.work_table(suffix, kind)
        self._precreated = True

    # --- after staging --------------------------------------------------------------------------

    def staged_key_counts(self, keys: list[str]) -> dict[str, int]:
        """How many times each of ``keys`` is staged (absent: 0)."""
        found: dict[str, int] = {}
        for i in range(0, len(keys), _KEYS_PER_QUERY):
            statement = self.dialect.staged_key_counts(self.stage, self.schema, keys[i : i + _KEYS_PER_QUERY])
            found.update((ref, int(n)) for ref, n in self.exec(statement))
        return found

    def dedupe(self, staged: int, *, parse_json: bool) -> tuple[str, int]:
        """The staging table to merge from (one row per record_ref) and its number of rows."""
        d = self.dialect
        distinct = int(self.exec(d.count_distinct(self.stage, self.schema)).scalar_one())
        if staged == distinct:
            return self.stage, distinct
        self._create(self.deduped, d.create_deduped(self.deduped, self.schema, parse_json=parse_json))
        self.exec(d.dedupe(self.stage, self.deduped, self.schema, self.table))
        return self.deduped, distinct

    def classify(self, source: str) -> tuple[int, int, int, int]:
        """inserted, updated, unchanged, skipped_stale of ``source`` against the target (under the lock)."""
        statement = self.dialect.classify(source, self.table, self.schema, index=self.guard_index)
        inserted, updated, unchanged, stale, unverified, wire_hashes = (int(v) for v in self.exec(statement).one())
        if unverified:
            raise self.unverified(unverified)
        self.wire_hashes_to_store = wire_hashes
        return inserted, updated, unchanged, stale

    def merge(self, source: str, *, synced_at: datetime, new_only: bool, inserted: int, updated: int) -> None:
        """Run the dialect's merge of ``source``; each statement must write exactly the rows classified.

        A statement whose expected rowcount is 0 is not run (an unchanged re-run runs no merge at all).
        """
        merge = self.dialect.merge(source, self.table, self.schema, synced_at=synced_at, run_id=self.run_id,
                                   new_only=new_only)
        for statement, expected in merge:
            want = {"inserted": inserted, "updated": updated, "inserted+updated": inserted + updated}[expected]
            if want == 0:
                continue
            rowcount = self.exec(statement).rowcount
            if rowcount is not None and rowcount >= 0 and rowcount != want:
                # The counts we report must be the rows written; anything else is a bug or a
                # concurrent writer outside our lock: do not commit it.
                raise BosWarehouseError(
                    f"The merge into {self.destination_table} changed {rowcount} rows where "
                    f"{want} ({expected}) were expected; rolled back."
                )

    def classify_and_merge(self, received: int, *, parse_json: bool, maybe_duplicates: bool = True) -> UpsertCounts:
        """Staged -> deduped -> locked -> classified -> merged (the path of a table that had rows).

        ``maybe_duplicates=False`` (every staged key was seen once: SeenKeys has no false negatives)
        skips counting the distinct keys in SQL.
        """
        if maybe_duplicates:
            source, distinct = self.dedupe(received, parse_json=parse_json)
        else:
            source, distinct = self.stage, received
        self.lock()
        stale, withheld = self.withhold(source)
        inserted, updated, unchanged, guarded = self.classify(source)
        stale += guarded
        counts = UpsertCounts(inserted, updated, unchanged, stale, received - distinct, withheld=withheld)
        if inserted + updated + unchanged + stale + withheld != distinct:  # pragma: no cover - invariant
            raise BosWarehouseError(f"Classification of {distinct} records does not add up: {counts}.")
        # Under the lock the target cannot change between classification and merge, so the
        # classification may pick the merge: all new -> a plain INSERT ... SELECT.
        self.merge(source, synced_at=utcnow(), new_only=inserted == distinct and distinct > 0,
                   inserted=inserted, updated=updated)
        if self.rehashed and self.dialect.wire_hash_column:
            # The rows just re-hashed take this read's copy of their content (its wire hash above
            # all): the same one-time rewrite, so the next re-run skips them undecoded.
            self.exec(self.dialect.adopt_later_copies(source, self.table, self.schema))
        elif self.wire_hashes_to_store:
            # Unchanged rows stored without a wire hash (written without a key, or cleared by
            # pii-apply) take this read's, so the next re-run skips them undecoded.
            self.exec(self.dialect.store_wire_hashes(source, self.table, self.schema))
        return counts

    def withhold(self, source: str) -> tuple[int, int]:
        """Take out of ``source`` what this read may not write; return ``(stale, withheld)``.

        Stale: records whose row a newer read retired (an older read does not bring them back), and,
        for a read older than its scope's newest complete read, every record that read answered for.
        Withheld: a partial read's records under refs a complete read merged away.
        """
        d, stale = self.dialect, 0
        if self.read_time is not None:
            stale += self._deleted(d.withhold_revivals(source, self.table, self.schema,
                                                       observed_before=self.read_time))
        if self.answered_by_newer is not None:
            audit, scope = self.answered_by_newer
            stale += self._deleted(d.withhold_answered(source, self.table, audit, self.schema, scope=scope))
        withheld = self._deleted(d.withhold_merged_away(source, self.table, self.schema)) if self.partial_read else 0
        return stale, withheld

    def _deleted(self, statement: Statement) -> int:
        return max(int(self.exec(statement).rowcount or 0), 0)

    def unverified(self, count: int) -> BosWarehouseError:
        """The error of records skipped as known whose stored row is gone or changed since the run
        read the wire hashes: their content was never decoded, so nothing can be written."""
        return BosWarehouseError(
            f"{count} records arrived byte-identical to rows of {self.destination_table} "
            "that another writer changed or deleted during this run; nothing was written. "
            "Re-run the task (it will read them in full)."
        )

    # --- the end ------------------------------------------------------------------------------

    def work_table(self, suffix: str, kind: str) -> str:
        """Create the run's temporary work table ``kind``.

        See :meth:`~.dialects.lifecycle.LifecycleSql.create_work_table`.
        """
        name = staging_table_name(self.run_id, suffix)
        if self._create(name, self.dialect.create_work_table(name, self.schema, kind)):
            self.work_tables.append(name)
        return name

    def drop_staging(self) -> None:
        for name in (*self.work_tables, self.deduped, self.stage):
            self.exec(self.dialect.drop_staging(name, self.schema))
        self.work_tables = []
        self._created.clear()

    def drop_committed_staging(self) -> None:
        """Drop the staging tables after the run committed (where DDL would have committed it early).

        Best effort: the run is committed; a connection that cannot drop them is closed instead,
        which ends the session and its temporary tables.
        """
        try:
            self.drop_staging()
            self.conn.commit()
        except sa.exc.SQLAlchemyError:
            self.conn.invalidate()

    @contextmanager
    def committed(self, refused: str) -> Iterator[None]:
        """Commit what the block wrote; on any error roll back first. A database's refusal is raised as
        :class:`BosWarehouseError`: ``refused`` (what failed, and that nothing was written), its detail."""
        try:
            yield
            self.conn.commit()
        except BaseException as exc:
            self.rollback()
            if isinstance(exc, sa.exc.SQLAlchemyError):
                raise BosWarehouseError(f"{refused}: {db_detail(exc)}") from exc
            raise

    def rollback(self) -> None:
        try:
            self.conn.rollback()
            capabilities = self.dialect.capabilities
            if capabilities.temp_tables_survive_rollback or capabilities.ddl_commits:
                # MySQL and Snowflake temporary tables survive a rollback; the pooled connection must
                # not keep them.
                self.drop_staging()
                self.conn.commit()
        except sa.exc.SQLAlchemyError:
            self.conn.invalidate()  # a broken connection goes back to no pool

    def close(self) -> None:
        """Release a named lock (if one is held) and the connection."""
        try:
            if self._unlock_needed:
                unlock = self.dialect.unlock(self.target)
                if unlock is not None:
                    try:
                        self.exec(unlock)
                        self.conn.commit()
                    except sa.exc.SQLAlchemyError:  # closing the connection releases it too
                        self.conn.invalidate()
        finally:
            try:
                self.conn.close()
            finally:
                if self._process_lock is not None:
                    self._process_lock.release()
                    self._process_lock = None
