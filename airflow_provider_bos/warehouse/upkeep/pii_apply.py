"""Re-applying a stricter personal-data policy to a stored table (``airflow-provider-bos pii-apply``).

:func:`apply_stricter_policy` rewrites the records table, ``<table>_history`` and ``<table>_rejects``
as a run under the new policy would have written them, in ONE transaction under the writers' lock,
without reading BOS again: what was kept and is now hashed is hashed, what is now dropped is
dropped; what was hashed already stays as it is. It then stores the new policy's fingerprint.

Why not in SQL: HMAC-SHA-256 is not available in SQLite, MariaDB or DuckDB SQL, and a key bound into
SQL text would reach the server's statement logs. So the rows are read in batches, changed in
Python with the same plan a run applies, and written back with their values bound (on DuckDB, where
one ``UPDATE`` per row costs ~0.7 ms, through a staged file of the new values, in the stored form
only, and one ``UPDATE ... FROM`` it). Each rewritten
row gets its content hash again (the function the writer uses), so the next sync under the policy
finds it unchanged. Wire hashes: a table written without a policy holds each record's raw wire hash;
it is keyed (under the key, as a run under a policy keys it) so the next re-run still skips
byte-identical records; a table written under a policy already has them in its policy's form, and
they are cleared (the next run decodes every record once and stores them again).

A looser policy (hash or drop to keep, drop to hash), another key or recipe cannot be applied to
stored rows: the raw values are gone. It is refused, saying it needs a full re-read.

Promoted attribute columns are filled again from the rewritten attributes. A column a DAG no longer
promotes keeps its values but not its path (``<table>_columns`` forgets it), so it cannot be filled
again: when the policy hashes or drops anything under ``attributes``, such a column is cleared
(NULL) in the records table and its history, and the result names it.

Audit: like an erasure, one row with ``tool_name`` ``airflow-provider-bos pii-apply`` and a note of
the counts and the fields changed (no value, no ref); the sensors look up runs by their read's tool
name, so it is never taken for a sync. After the commit the freed space is reclaimed
(:mod:`.reclaim`): the raw values remain in the database's free pages until then.
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import sqlalchemy as sa

from airflow_provider_bos.exceptions import BosConfigurationError, BosWarehouseError
from airflow_provider_bos.pii import PiiKey, PiiPlan, PiiPolicy, PiiPolicyMismatch, PolicyFingerprint
from airflow_provider_bos.warehouse.dialects.base import WarehouseDialect
from airflow_provider_bos.warehouse.run.audit import SyncRunInfo, audit_insert, utcnow
from airflow_provider_bos.warehouse.run.catalog import column_names
from airflow_provider_bos.warehouse.run.promoted import refill_promoted
from airflow_provider_bos.warehouse.run.provenance import rebuild_provenance
from airflow_provider_bos.warehouse.run.stage_dir import run_stage_directory
from airflow_provider_bos.warehouse.run.transaction import RunTransaction, db_detail
from airflow_provider_bos.warehouse.tables.companions import COMPANIONS, Created, PolicyRewrite
from airflow_provider_bos.warehouse.tables.policy_store import (
    action_changes,
    effective_action,
    loosening,
    read_stored_policy,
    store_policy,
    way_forward,
)
from airflow_provider_bos.warehouse.tables.records import (
    CONTENT_FIELDS,
    JSON_CONTENT_FIELDS,
    parse_timestamp,
    record_to_row,
    stored_json_columns,
    stored_record,
)
from airflow_provider_bos.warehouse.tables.schema import (
    RECORD_COLUMNS,
    WIRE_HASH_COLUMN,
    records_table,
)
from airflow_provider_bos.warehouse.upkeep.reclaim import reclaim_space
from airflow_provider_bos.warehouse.upkeep.scan import rows_in_batches
from airflow_provider_bos.warehouse.writer import WarehouseWriter

__all__ = ["PII_APPLY_TOOL_NAME", "PolicyApplied", "apply_stricter_policy", "delta_policy"]

log = logging.getLogger(__name__)

#: The audit row's ``tool_name`` of a re-applied policy.
PII_APPLY_TOOL_NAME = "airflow-provider-bos pii-apply"
_BATCH = 1000
# The columns a policy can change (record_ref and the _bos_* columns never change).
_POLICY_COLUMNS = ("display_name", "email", "phone", "lifecycle", "identity_match", "attributes", "sources")


@dataclass
class PolicyApplied:
    """What one re-application rewrote."""

    run_id: str
    fingerprint: str
    records: int = 0
    history: int = 0
    rejects: int = 0
    #: Rows whose wire hash was keyed (or cleared).
    wire_hashes: int = 0
    #: Promoted attribute columns filled again from the rewritten attributes.
    promoted_columns: int = 0
    #: Columns no longer promoted (their path forgotten) cleared because the policy changes attributes.
    cleared_columns: list[str] = field(default_factory=list)
    #: What was run after the commit to reclaim the rewritten rows' old space.
    reclaimed: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def delta_policy(stored: PolicyFingerprint | None, new: PolicyFingerprint) -> PiiPolicy:
    """What rows stored under ``stored`` need to be stored as under ``new`` (which is as strict or
    stricter): hash what was kept and is hashed now, drop what is dropped now and was not; leave the
    rest (a hashed value is not hashed again)."""
    was = dict(stored.rules) if stored is not None else {}
    rules: dict[str, str] = {}
    for name in sorted(set(was) | set(new.rules) | {"attributes"}):
        before, after = effective_action(was, name), effective_action(dict(new.rules), name)
        rules[name] = ("hash" if (before, after) == ("keep", "hash")
                        else "drop" if after == "drop" and before != "drop" else "keep")
    return PiiPolicy.parse(rules)


def apply_stricter_policy(
    engine: sa.Engine, *, table: str, policy: PiiPolicy | Mapping[str, str], key: PiiKey | None,
    schema: str | None = None, audit_table: str = "bos_sync_runs", conn_id: str | None = None,
    lock_timeout_s: float = 300.0,
) -> PolicyApplied:
    """Re-apply ``policy`` (with ``key``) to ``table``, its history and rejects in one transaction.

    :raises PiiPolicyMismatch: the policy is looser than the table's, or the key or recipe differs
        (nothing changed; a full re-read is needed).
    :raises BosConfigurationError: no such table, an invalid policy, a policy that hashes without a key.
    :raises BosWarehouseError: the database refused (rolled back), or the space could not be reclaimed
        after the commit.
    """
    policy = PiiPolicy.parse(policy)
    new = policy.fingerprint(key)
    writer = WarehouseWriter(engine, table=table, schema=schema, audit_table=audit_table, lock_timeout_s=lock_timeout_s)
    try:
        inspector = sa.inspect(engine)
        if not inspector.has_table(writer.table, schema=writer.schema):
            raise BosConfigurationError(f"There is no table {writer.destination_table} to apply a policy to.")
        extra_columns = sorted(c for c in column_names(engine, writer.dialect, writer.table, writer.schema)
                               if c not in RECORD_COLUMNS and not c.startswith("_bos_"))
        writer.ensure_tables()
        policy_table = writer.ensure_policy_table()
        present = [c for c in COMPANIONS if c.created is Created.ALWAYS
                   or inspector.has_table(c.name(writer.table), schema=writer.schema)]
    except sa.exc.SQLAlchemyError as exc:
        raise BosWarehouseError(f"Could not inspect {writer.destination_table}: {db_detail(exc)}") from exc
    d = writer.dialect
    run = SyncRunInfo(run_id=str(uuid.uuid4()), conn_id=conn_id, tool_name=PII_APPLY_TOOL_NAME, started_at=utcnow())
    applied = PolicyApplied(run_id=run.run_id, fingerprint=new.text)
    metadata = sa.MetaData()
    records = records_table(metadata, d.name, writer.table, writer.schema)
    tx = RunTransaction(engine, d, table=writer.table, schema=writer.schema, run_id=run.run_id,
                        lock_timeout_s=lock_timeout_s, guard_index=None)
    try:
        try:
            tx.begin()
            tx.lock()
            stored_text = read_stored_policy(tx.conn, policy_table)
            stored = PolicyFingerprint.parse(stored_text) if stored_text is not None else None
            refused = loosening(stored, new)
            if refused:
                raise PiiPolicyMismatch(writer.destination_table, refused,
                                        way_forward=way_forward(stored, new, table=writer.table))
            if stored_text == new.text or (stored is None and policy.is_empty):
                tx.rollback()
                return applied
            delta = delta_policy(stored, new)
            plan = delta.plan(key if delta.needs_key else None)
            # Raw wire hashes (no policy before) are keyed; a policy's own form is cleared.
            wire_key = key if stored is None else None
            with contextlib.ExitStack() as files:
                directory = files.enter_context(run_stage_directory()) if d.capabilities.updates_from_file else None
                applied.records, applied.wire_hashes = _rewrite(
                    tx.conn, records, plan, d, key=("record_ref",), wire=(wire_key,) if d.wire_hash_column else None,
                    directory=directory,
                )
                for companion in present:
                    if companion.pii_apply is PolicyRewrite.ROWS:
                        rewritten, _ = _rewrite(tx.conn, companion.table(writer.table, d.name, writer.schema, metadata),
                                                plan, d, key=companion.row_key, wire=None, directory=directory)
                        setattr(applied, companion.suffix, rewritten)
            # Promoted columns live in the records table and the tables of its rows' versions.
            versions = [c.name(writer.table) for c in present if c.pii_apply is PolicyRewrite.ROWS]
            configured: list[str] = []
            for companion in present:
                if companion.pii_apply is PolicyRewrite.REBUILT:  # from the rewritten records' JSON
                    rebuild_provenance(tx, companion.name(writer.table))
                elif companion.pii_apply is PolicyRewrite.COLUMNS_REFILLED:  # from the rewritten attributes
                    configured = refill_promoted(tx, companion.table(writer.table, d.name, writer.schema, metadata),
                                                 versions[0] if versions else None, policy=new.text,
                                                 run_id=run.run_id, at=utcnow())
                    applied.promoted_columns = len(configured)
                elif companion.pii_apply is PolicyRewrite.RECORDS_EMPTIED and not policy.is_empty:
                    setattr(applied, companion.suffix, _empty_quarantined_records(
                        tx.conn, companion.table(writer.table, d.name, writer.schema, metadata)))
                elif companion.pii_apply is PolicyRewrite.POLICY_STORED:
                    store_policy(tx.conn, policy_table, new, run_id=run.run_id, at=utcnow())
            if _changes_attributes(delta):
                applied.cleared_columns = [c for c in extra_columns if c not in configured]
                for table_name in (writer.table, *versions):
                    if applied.cleared_columns:
                        tx.exec(d.clear_columns(table_name, writer.schema, applied.cleared_columns))
            note = _note(stored, new, applied, writer.destination_table)
            tx.exec(audit_insert(d, writer.audit_table, writer.schema, run, status="complete", finished_at=utcnow(),
                                 completeness=None, result_count=applied.records, error_message=note,
                                 destination_table=writer.destination_table, present=writer.audit_columns))
            tx.conn.commit()
        except BaseException as exc:
            tx.rollback()
            if isinstance(exc, sa.exc.SQLAlchemyError):
                raise BosWarehouseError(f"Applying the policy to {writer.destination_table} failed and was rolled "
                                        f"back (nothing changed): {db_detail(exc)}") from exc
            raise
    finally:
        tx.close()
    log.info("BOS pii-apply %s: %s", run.run_id, note)
    changed = (PolicyRewrite.ROWS, PolicyRewrite.REBUILT, PolicyRewrite.RECORDS_EMPTIED)
    tables = [writer.table, *(c.name(writer.table) for c in present if c.reclaimed and c.pii_apply in changed)]
    applied.reclaimed = reclaim_space(engine, d, tables, writer.schema)
    return applied


def _json_value(dialect_name: str, column: sa.Column[Any], name: str) -> sa.ColumnElement[Any]:
    """A bound JSON text for ``column``: cast where the column's type is not text (PostgreSQL JSONB,
    DuckDB JSON), parsed on Snowflake (a text bound to a VARIANT would be stored as a string, not the
    object); MariaDB's JSON and SQLite's columns take the text as it is."""
    value = sa.bindparam(name, type_=sa.Text())
    if dialect_name == "snowflake":
        return sa.func.parse_json(value)
    return sa.cast(value, column.type) if dialect_name in ("postgresql", "duckdb") else value


def _rewrite(
    conn: sa.Connection, table: sa.Table, plan: PiiPlan, dialect: WarehouseDialect, *, key: tuple[str, ...],
    wire: tuple[PiiKey | None] | None, directory: Path | None,
) -> tuple[int, int]:
    """Apply ``plan`` to every row of ``table``; with ``wire``, key each wire hash with its key (or
    clear it, key ``None``). Returns (rows whose content changed, rows whose wire hash changed).

    The new values go back with bound parameters, a batch at a time, or (``directory``, where the
    dialect ``updates_from_file``) through staged files there and one ``UPDATE`` per file."""
    written: _BoundUpdates | _FileUpdates = (
        _FileUpdates(conn, table, dialect, key=key, wire=wire is not None, directory=directory)
        if directory is not None else _BoundUpdates(conn, table, dialect.name, key=key, wire=wire is not None))
    columns = [*CONTENT_FIELDS, "_bos_observed_at", *((WIRE_HASH_COLUMN,) if wire is not None else ())]
    json_columns = stored_json_columns(table)
    changed = rekeyed = 0
    with written:
        for rows in rows_in_batches(conn, table, columns, key=key, batch_size=_BATCH):
            contents: list[dict[str, Any]] = []
            wires: list[dict[str, Any]] = []
            for row in rows:
                ident = {f"k_{name}": row[name] for name in key}
                wire_hash = _new_wire_hash(row[WIRE_HASH_COLUMN], wire[0]) if wire is not None else None
                record = stored_record(row, json_columns)
                stored = plan.apply(record)
                rekeyed += wire is not None and wire_hash != row[WIRE_HASH_COLUMN]  # changed, not just written
                if stored != record:
                    new_row = record_to_row(stored, default_observed_at=parse_timestamp(row["_bos_observed_at"]),
                                            stored=True)
                    contents.append({**ident, "display_name": new_row.display_name, "email": new_row.email,
                                     "phone": new_row.phone, "lifecycle": new_row.lifecycle,
                                     "identity_match": new_row.identity_match, "attributes": new_row.attributes,
                                     "sources": new_row.sources, "record_hash": new_row.record_hash,
                                     **({"wire_hash": wire_hash} if wire is not None else {})})
                elif wire is not None and wire_hash != row[WIRE_HASH_COLUMN]:
                    wires.append({**ident, "wire_hash": wire_hash})
            written.add(contents, wires)
            changed += len(contents)
    return changed, rekeyed


class _BoundUpdates:
    """Rewritten rows written back a batch at a time: one ``UPDATE`` by key per row, values bound."""

    def __init__(self, conn: sa.Connection, table: sa.Table, dialect_name: str, *, key: tuple[str, ...],
                 wire: bool) -> None:
        self.conn = conn
        where = sa.and_(*(table.c[name] == sa.bindparam(f"k_{name}", type_=table.c[name].type) for name in key))
        content = {name: (_json_value(dialect_name, table.c[name], name) if name in JSON_CONTENT_FIELDS
                          else sa.bindparam(name, type_=sa.Text()))
                   for name in _POLICY_COLUMNS}
        self.update_content = sa.update(table).where(where).values(
            **content, _bos_record_hash=sa.bindparam("record_hash", type_=sa.Text()),
            **({WIRE_HASH_COLUMN: sa.bindparam("wire_hash", type_=sa.Text())} if wire else {}),
        )
        self.update_wire = sa.update(table).where(where).values(
            {WIRE_HASH_COLUMN: sa.bindparam("wire_hash", type_=sa.Text())})

    def __enter__(self) -> _BoundUpdates:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def add(self, contents: list[dict[str, Any]], wires: list[dict[str, Any]]) -> None:
        if contents:
            self.conn.execute(self.update_content, contents)
        if wires:
            self.conn.execute(self.update_wire, wires)


class _FileUpdates:
    """Rewritten rows written to two NDJSON files (new content; new wire hash only) in ``directory``,
    each applied by one ``UPDATE ... FROM`` the file when the table has been read (see
    :meth:`~.dialects.duckdb.DuckDBDialect.update_from_file`); the files are removed after."""

    def __init__(self, conn: sa.Connection, table: sa.Table, dialect: WarehouseDialect, *,
                 key: tuple[str, ...], wire: bool, directory: Path) -> None:
        self.conn, self.table, self.dialect, self.key = conn, table, dialect, key
        content = (*_POLICY_COLUMNS, "_bos_record_hash")
        self.columns = {"content": (*content, *((WIRE_HASH_COLUMN,) if wire else ())), "wire": (WIRE_HASH_COLUMN,)}
        self.paths = {kind: directory / f"bos-pii-{table.name}-{kind}.ndjson" for kind in self.columns}
        self.files = {kind: os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600), "wb")
                      for kind, path in self.paths.items()}
        self.longest = dict.fromkeys(self.columns, 0)
        self.lines = dict.fromkeys(self.columns, 0)

    def __enter__(self) -> _FileUpdates:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        try:
            for out in self.files.values():
                out.close()
            if exc_type is None:
                for kind, path in self.paths.items():
                    if self.lines[kind]:
                        self._apply(kind, path)
        finally:
            for path in self.paths.values():
                path.unlink(missing_ok=True)

    def add(self, contents: list[dict[str, Any]], wires: list[dict[str, Any]]) -> None:
        self._write("content", [{**{f"k_{name}": _key_value(row[f"k_{name}"]) for name in self.key},
                                 "display_name": row["display_name"], "email": row["email"], "phone": row["phone"],
                                 **{name: None if row[name] is None else orjson.Fragment(row[name])
                                    for name in ("lifecycle", "identity_match")},
                                 "attributes": orjson.Fragment(row["attributes"]),
                                 "sources": orjson.Fragment(row["sources"]), "_bos_record_hash": row["record_hash"],
                                 **({WIRE_HASH_COLUMN: row["wire_hash"]} if "wire_hash" in row else {})}
                                for row in contents])
        self._write("wire", [{**{f"k_{name}": _key_value(row[f"k_{name}"]) for name in self.key},
                              WIRE_HASH_COLUMN: row["wire_hash"]} for row in wires])

    def _write(self, kind: str, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        lines = [orjson.dumps(row) + b"\n" for row in rows]
        self.longest[kind] = max(self.longest[kind], *map(len, lines))
        self.lines[kind] += len(lines)
        self.files[kind].write(b"".join(lines))

    def _apply(self, kind: str, path: Path) -> None:
        update = self.dialect.update_from_file(self.table.name, self.table.schema, str(path), key=self.key,
                                               columns=self.columns[kind], longest_line=self.longest[kind])
        self.conn.exec_driver_sql(update.sql, update.params)


def _key_value(value: Any) -> Any:
    """A key column's value as the staged file holds it (a timestamp as ISO 8601 text)."""
    return value.isoformat() if isinstance(value, datetime) else value


def _new_wire_hash(stored: str | None, key: PiiKey | None) -> str | None:
    """A raw wire hash keyed as a run under a policy keys it (:meth:`PiiKey.wire_hash_hex`); ``None``
    without a key."""
    if stored is None or key is None:
        return None
    return key.wire_hash_hex(stored)


def _empty_quarantined_records(conn: sa.Connection, rejects: sa.Table) -> int:
    """Under a policy a quarantined record keeps only its ref and reason: empty the stored records."""
    empty = sa.bindparam("empty", b"", type_=rejects.c.record.type)
    result = conn.execute(sa.update(rejects).where(rejects.c.record != empty).values(record=b"", truncated=False))
    return int(result.rowcount or 0)


def _changes_attributes(delta: PiiPolicy) -> bool:
    """True when ``delta`` hashes or drops something under ``attributes``."""
    return any(name == "attributes" or name.startswith("attributes.") for name, action in delta.rules
               if action != "keep")


def _note(stored: PolicyFingerprint | None, new: PolicyFingerprint, applied: PolicyApplied, table: str) -> str:
    changes = ", ".join(f"{name} {a} -> {b}" for name, (a, b) in action_changes(stored, new).items())
    cleared = (f"; cleared the column(s) {', '.join(applied.cleared_columns)}, no longer promoted (their path is "
               "not known, so they could not be filled again)" if applied.cleared_columns else "")
    return (f"Re-applied a stricter personal-data policy ({changes}) without a re-read: rewrote "
            f"{applied.records} row(s) of {table}, {applied.history} history version(s), emptied "
            f"{applied.rejects} quarantined record(s); {applied.wire_hashes} wire hash(es) keyed or cleared"
            f"{cleared}.")
