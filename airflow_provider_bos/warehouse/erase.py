"""Erasure on request: a person's rows out of the records table, its history, provenance, lineage and rejects.

:func:`erase_records` deletes every row of the given record_refs, and of the same people's earlier
records merged into them (superseded by one of them, as the rows or ``<table>_lineage`` say), from
``<table>``, ``<table>_history``, ``<table>_sources``, ``<table>_lineage`` (as predecessor or successor) and
``<table>_rejects``, in
ONE transaction under the writers' lock; in the same transaction it replaces the refs in every
audit row's ``error_message`` (a failed run's error names the record it refused) and writes an audit
row that says how many rows went from each table but names no ref. After the commit it reclaims
the space the deleted rows held (:mod:`.reclaim`), so the database files keep no copy of them.
A later sync brings a person back only if BOS still returns them.

A request may name a person by an email, a phone number or an external id instead of a ref: the
refs of every row of the records table or its history that holds it are found first, in the same
transaction (:mod:`.erase_finders`, under the table's personal-data policy), and erased alike; so are
those of the records quarantined whole in the rejects table (a quarantined record without a ref is
deleted by its run and an identity the database computes from it).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import sqlalchemy as sa
from pydantic import ValidationError

from airflow_provider_bos.exceptions import BosConfigurationError, BosWarehouseError
from airflow_provider_bos.models import SOURCE_ERROR_CODES, SourceRef, stored_source_error
from airflow_provider_bos.pii import PolicyFingerprint
from airflow_provider_bos.warehouse.audit import SyncRunInfo, audit_insert, utcnow, without_refs
from airflow_provider_bos.warehouse.dialects import WarehouseDialect
from airflow_provider_bos.warehouse.erase_finders import (
    Finders,
    KeySource,
    find_quarantined,
    find_refs,
    refs_in,
    reject_row_id,
)
from airflow_provider_bos.warehouse.policy_store import read_stored_policy
from airflow_provider_bos.warehouse.reclaim import reclaim_space
from airflow_provider_bos.warehouse.records import MAX_RECORD_REF_LENGTH
from airflow_provider_bos.warehouse.schema import (
    SUPERSEDED_BY_COLUMN,
    companion_table_name,
    history_table,
    lineage_table,
    policy_table,
    records_table,
    rejects_table,
)
from airflow_provider_bos.warehouse.schema import audit_table as audit_table_definition
from airflow_provider_bos.warehouse.stored_json import JsonColumns
from airflow_provider_bos.warehouse.transaction import RunTransaction, db_detail, execute
from airflow_provider_bos.warehouse.upsert import WarehouseWriter

__all__ = ["ERASE_TOOL_NAME", "ErasedRows", "erase_records"]

log = logging.getLogger(__name__)

#: The audit row's ``tool_name`` of an erasure.
ERASE_TOOL_NAME = "airflow-provider-bos erase"
_REFS_PER_STATEMENT = 500  # bound parameters per DELETE (SQLite before 3.32 allows 999)


@dataclass
class ErasedRows:
    """How many rows one erasure deleted from each table."""

    run_id: str
    #: Refs the finders (email, phone, external id) matched, and quarantined records without a ref they matched.
    found: int = 0
    #: Refs of the same people's earlier records, merged into an erased one (superseded by it).
    merged: int = 0
    records: int = 0
    history: int = 0
    lineage: int = 0
    #: Provenance entries (``<table>_sources``) of the erased rows.
    sources: int = 0
    rejects: int = 0
    #: Audit rows whose error_message named an erased ref (now replaced).
    audit_messages: int = 0
    #: Audit rows whose source_errors held more than the contract's fields, as runs once kept them:
    #: a server's own words, which may quote the person (now reduced to the source and the code).
    audit_source_errors: int = 0
    #: What was run after the commit to reclaim the deleted rows' space.
    reclaimed: str = ""

    def as_dict(self) -> dict[str, int | str]:
        return asdict(self)


def _checked_refs(record_refs: list[str], *, finders: bool) -> list[str]:
    if (not record_refs and not finders) or any(not isinstance(r, str) or not r for r in record_refs):
        raise BosConfigurationError("Give at least one record_ref to erase, each a non-empty string (or an "
                                    "email, phone or external id to find them by).")
    return sorted(set(record_refs))


def erase_records(
    engine: sa.Engine, *, table: str, record_refs: Iterable[str] = (), schema: str | None = None,
    audit_table: str = "bos_sync_runs", conn_id: str | None = None, lock_timeout_s: float = 300.0,
    emails: Iterable[str] = (), phones: Iterable[str] = (), external_ids: Iterable[str] = (),
    key: KeySource = None,
) -> ErasedRows:
    """Delete ``record_refs`` from ``table`` and the tables beside it, in one transaction; audit it.

    ``emails``, ``phones``, ``external_ids`` (``SOURCE:ID``): also erase every ref whose row, history
    version or quarantined record holds one of them, and every quarantined record without a ref that
    holds one (:mod:`.erase_finders`). ``key``: the table's personal-data
    hash key, or a callable giving it; needed only when the table's policy hashes a field named.

    After the commit the space the deleted rows held is reclaimed (:func:`~.reclaim.reclaim_space`:
    SQLite VACUUM, a rewrite of the DuckDB file, PostgreSQL VACUUM, MariaDB OPTIMIZE TABLE). On
    DuckDB no other connection of this process may have the database file open.

    :param conn_id: the warehouse connection, recorded in the audit row.
    :raises BosConfigurationError: no ref, or a table name that is not valid.
    :raises BosWarehouseError: the database refused (nothing was deleted), or the space could not be
        reclaimed after the commit (the message says so and what to run).
    """
    finders = Finders.parse(emails, phones, external_ids)
    refs = _checked_refs(list(record_refs), finders=bool(finders))
    writer = WarehouseWriter(engine, table=table, schema=schema, audit_table=audit_table, lock_timeout_s=lock_timeout_s)
    try:
        present = sa.inspect(engine)
        if not present.has_table(writer.table, schema=writer.schema):
            raise BosConfigurationError(f"There is no table {writer.destination_table} to erase from.")
        writer.ensure_tables()  # the audit table (and columns added since) for the erasure's row
        companions = {
            kind: name for kind in ("history", "lineage", "sources", "rejects", "policy")
            if present.has_table(name := companion_table_name(writer.table, kind), schema=writer.schema)
        }
    except sa.exc.SQLAlchemyError as exc:
        raise BosWarehouseError(f"Could not inspect {writer.destination_table}: {db_detail(exc)}") from exc
    run = SyncRunInfo(run_id=str(uuid.uuid4()), conn_id=conn_id, tool_name=ERASE_TOOL_NAME, started_at=utcnow())
    audit = audit_table_definition(sa.MetaData(), writer.dialect.name, writer.audit_table, writer.schema)
    erased = ErasedRows(run_id=run.run_id)
    d = writer.dialect
    tx = RunTransaction(engine, d, table=writer.table, schema=writer.schema, run_id=run.run_id,
                        lock_timeout_s=lock_timeout_s, guard_index=None)
    try:
        try:
            tx.begin()
            tx.lock()
            unnamed: list[tuple[str, Any]] = []
            rejects = (rejects_table(sa.MetaData(), d.name, companions["rejects"], writer.schema)
                       if "rejects" in companions else None)
            if finders:
                found = _find(tx.conn, writer, companions, finders, key)
                if rejects is not None:
                    quarantined = find_quarantined(tx.conn, d, rejects, finders)
                    found |= quarantined.refs
                    unnamed = quarantined.unnamed
                erased.found = len(found) + len(unnamed)
                refs = sorted(set(refs) | found)
            merged = _merged_into(tx.conn, writer, companions, refs)
            erased.merged = len(merged)
            refs = sorted(set(refs) | merged)
            for i in range(0, len(refs), _REFS_PER_STATEMENT):
                chunk = refs[i : i + _REFS_PER_STATEMENT]
                # An over-long ref is only ever in the rejects table (it was quarantined for its length).
                keys = [r for r in chunk if len(r) <= MAX_RECORD_REF_LENGTH]
                if keys:
                    erased.records += tx.exec(d.delete_refs(writer.table, writer.schema, "record_ref",
                                                            keys)).rowcount
                if keys and "history" in companions:
                    erased.history += tx.exec(d.delete_refs(companions["history"], writer.schema, "record_ref",
                                                            keys)).rowcount
                if keys and "sources" in companions:
                    erased.sources += tx.exec(d.delete_refs(companions["sources"], writer.schema, "record_ref",
                                                            keys)).rowcount
                if keys and "lineage" in companions:
                    for column in ("record_ref", "successor_ref"):
                        erased.lineage += tx.exec(d.delete_refs(companions["lineage"], writer.schema, column,
                                                                keys)).rowcount
                if "rejects" in companions:
                    erased.rejects += tx.exec(d.delete_refs(companions["rejects"], writer.schema, "record_ref",
                                                            chunk)).rowcount
            if rejects is not None and unnamed:
                erased.rejects += _delete_unnamed(tx.conn, d, rejects, unnamed)
            erased.audit_messages = _scrub_audit_messages(tx.conn, audit, refs)
            erased.audit_source_errors = _reduce_source_errors(tx.conn, d, audit)
            note = (f"Erasure of {len(refs)} record_ref(s) on request ({erased.merged} of them earlier records merged "
                    f"into another): deleted {erased.records} row(s) from "
                    f"{writer.destination_table}, {erased.history} history version(s), {erased.sources} provenance "
                    f"entries, {erased.lineage} lineage row(s), {erased.rejects} quarantined record(s); replaced "
                    f"the refs in {erased.audit_messages} audit message(s); reduced {erased.audit_source_errors} audit "
                    f"row(s)' source errors to their sources and codes.")
            tx.exec(audit_insert(d, writer.audit_table, writer.schema, run, status="complete", finished_at=utcnow(),
                                 completeness=None, result_count=len(refs),
                                 error_message=note, destination_table=writer.destination_table,
                                 present=writer.audit_columns))
            tx.conn.commit()
        except BaseException as exc:
            tx.rollback()
            if isinstance(exc, sa.exc.SQLAlchemyError):
                raise BosWarehouseError(f"Erasing from {writer.destination_table} failed and was rolled back "
                                        f"(nothing was deleted): {db_detail(exc)}") from exc
            raise
    finally:
        tx.close()
    log.info("BOS erasure %s: %s", run.run_id, note)
    touched = [name for kind, name in companions.items() if kind != "policy"]
    erased.reclaimed = reclaim_space(engine, d, [writer.table, *touched, writer.audit_table], writer.schema)
    return erased


def _find(conn: sa.Connection, writer: WarehouseWriter, companions: dict[str, str], finders: Finders,
          key: KeySource) -> set[str]:
    """The refs the finders match in the records table and its history, under the table's policy."""
    metadata, name = sa.MetaData(), writer.dialect.name
    stored = None
    if "policy" in companions:
        text = read_stored_policy(conn, policy_table(metadata, name, companions["policy"], writer.schema))
        stored = PolicyFingerprint.parse(text) if text is not None else None
    tables = [records_table(metadata, name, writer.table, writer.schema)]
    if "history" in companions:
        tables.append(history_table(metadata, name, companions["history"], writer.schema))
    return find_refs(conn, tables, finders, stored, key, writer.dialect)


def _merged_into(conn: sa.Connection, writer: WarehouseWriter, companions: dict[str, str], refs: list[str]) -> set[str]:
    """The refs of the records merged into ``refs`` (superseded by one of them, as their rows or the
    lineage say), and of those merged into these, and so on: the same people's earlier records, which
    hold their data too. Without them an erased ref would stay behind in their ``_bos_superseded_by``."""
    metadata, name = sa.MetaData(), writer.dialect.name
    records = records_table(metadata, name, writer.table, writer.schema)
    lineage = lineage_table(metadata, name, companions["lineage"], writer.schema) if "lineage" in companions else None
    named, merged = set(refs), set[str]()
    successors = {r for r in refs if len(r) <= MAX_RECORD_REF_LENGTH}
    while successors:
        earlier = refs_in(conn, records, SUPERSEDED_BY_COLUMN, successors)
        if lineage is not None:
            earlier |= refs_in(conn, lineage, "successor_ref", successors)
        successors = earlier - merged - named
        merged |= successors
    return merged


def _delete_unnamed(conn: sa.Connection, d: WarehouseDialect, rejects: sa.Table,
                    rows: list[tuple[str, Any]]) -> int:
    """Delete quarantined records that had no ref, each by its run and the identity the database computed
    for it (:attr:`~.dialects.lifecycle.LifecycleSql.reject_row_id_sql`): the record's bytes are not bound."""
    statement = sa.delete(rejects).where(rejects.c.run_id == sa.bindparam("run"), rejects.c.record_ref.is_(None),
                                         reject_row_id(d) == sa.bindparam("row_id"))
    return sum(conn.execute(statement, {"run": run_id, "row_id": value}).rowcount for run_id, value in rows)


def _reduce_source_errors(conn: sa.Connection, d: WarehouseDialect, audit: sa.Table) -> int:
    """Reduce every audit row's ``source_errors`` to the contract's fields (:meth:`SourceErrorEntry.as_stored`,
    as runs write them now); return how many rows changed. An entry that is not a source error is kept."""
    changed = 0
    rows = conn.execute(sa.select(audit.c.run_id, audit.c.source_errors)
                        .where(audit.c.source_errors.is_not(None))).all()
    json_columns = JsonColumns(audit, ["source_errors"])
    for run_id, stored in rows:
        errors = json_columns.value("source_errors", stored)
        if not isinstance(errors, list):
            continue
        reduced = [_stored_source_error(entry) for entry in errors]
        if reduced != errors:
            text = json.dumps(reduced, ensure_ascii=False, separators=(",", ":"))
            execute(conn, d.set_audit_json(audit.name, audit.schema, "source_errors", run_id, text))
            changed += 1
    return changed


def _stored_source_error(entry: Any) -> Any:
    """``entry`` as :meth:`SourceErrorEntry.as_stored` keeps it; a code outside the contract's five (a
    final's, stored before they were checked: any text a server wrote) as ``"unknown"``."""
    error = entry.get("error") if isinstance(entry, dict) else None
    if not isinstance(error, dict) or "code" not in error:
        return entry  # not a source error
    try:
        source = SourceRef.model_validate(entry.get("source"))
    except ValidationError:
        return entry
    code = error["code"]
    return stored_source_error(source, code if isinstance(code, str) and code in SOURCE_ERROR_CODES else "unknown")


def _scrub_audit_messages(conn: sa.Connection, audit: sa.Table, refs: list[str]) -> int:
    """Replace ``refs`` in every audit row's ``error_message`` (of any table's runs); return how many changed."""
    changed = 0
    rows = conn.execute(sa.select(audit.c.run_id, audit.c.error_message)
                        .where(audit.c.error_message.is_not(None))).all()
    for run_id, message in rows:
        scrubbed = without_refs(message, refs)
        if scrubbed != message:
            conn.execute(audit.update().where(audit.c.run_id == run_id).values(error_message=scrubbed))
            changed += 1
    return changed
