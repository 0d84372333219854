"""Erasure on request: a person's rows out of the records table, its history, provenance, lineage and rejects.

:func:`erase_records` deletes every row of the given record_refs, of the same people's earlier
records merged into them (superseded by one of them, as the rows or ``<table>_lineage`` say), and of
the records they were merged into (their successors, followed forward: the person's current record;
a split is followed only as decided, see :func:`erase_records`), from
``<table>``, ``<table>_history``, ``<table>_sources``, ``<table>_lineage`` (as predecessor or successor) and
``<table>_rejects``, in
ONE transaction under the writers' lock; in the same transaction it replaces the refs in every
audit row's ``error_message`` and ``notes`` (a failed run's error names the record it refused) and writes an audit
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
from dataclasses import asdict, dataclass, field
from typing import Any

import sqlalchemy as sa
from pydantic import ValidationError

from airflow_provider_bos.exceptions import BosConfigurationError, BosWarehouseError
from airflow_provider_bos.models import SOURCE_ERROR_CODES, SourceRef, stored_source_error
from airflow_provider_bos.pii import PolicyFingerprint
from airflow_provider_bos.warehouse.dialects import WarehouseDialect
from airflow_provider_bos.warehouse.run.audit import SyncRunInfo, audit_insert, utcnow, without_refs
from airflow_provider_bos.warehouse.run.transaction import RunTransaction, db_detail, execute
from airflow_provider_bos.warehouse.tables.companions import (
    COMPANIONS,
    LINEAGE,
    POLICY,
    REJECTS,
    SOURCES,
    Companion,
)
from airflow_provider_bos.warehouse.tables.policy_store import read_stored_policy
from airflow_provider_bos.warehouse.tables.records import MAX_RECORD_REF_LENGTH
from airflow_provider_bos.warehouse.tables.schema import (
    NOTES_COLUMN,
    SUPERSEDED_BY_COLUMN,
    records_table,
)
from airflow_provider_bos.warehouse.tables.schema import audit_table as audit_table_definition
from airflow_provider_bos.warehouse.tables.stored_json import JsonColumns
from airflow_provider_bos.warehouse.upkeep.erase_finders import (
    Finders,
    KeySource,
    find_quarantined,
    find_refs,
    refs_in,
    reject_row_id,
)
from airflow_provider_bos.warehouse.upkeep.reclaim import reclaim_space
from airflow_provider_bos.warehouse.writer import WarehouseWriter

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
    #: Refs of the records an erased one was merged into (its only successor), followed on: the
    #: person's later records, erased as theirs. :attr:`successor_refs` names them.
    successors: int = 0
    records: int = 0
    #: Rows deleted from each companion table that holds people, by its suffix (``history``,
    #: ``sources``: the provenance entries, ``lineage``, ``rejects``); :meth:`as_dict` lists them flat.
    deleted: dict[str, int] = field(default_factory=dict)
    #: Audit rows whose error_message named an erased ref (now replaced).
    audit_messages: int = 0
    #: Audit rows whose source_errors held more than the contract's fields, as runs once kept them:
    #: a server's own words, which may quote the person (now reduced to the source and the code).
    audit_source_errors: int = 0
    #: What was run after the commit to reclaim the deleted rows' space.
    reclaimed: str = ""
    #: The refs counted in :attr:`successors` (for the one who asked: never written to the audit table).
    successor_refs: list[str] = field(default_factory=list)
    #: Records an erased one was merged or split into that were left, each ``{"record_ref", "reason"}``:
    #: the other successors of a split one of whose successors was erased, and those named to keep.
    left: list[dict[str, str]] = field(default_factory=list)

    @property
    def history(self) -> int:
        return self.deleted.get("history", 0)

    @property
    def lineage(self) -> int:
        return self.deleted.get("lineage", 0)

    @property
    def sources(self) -> int:
        return self.deleted.get("sources", 0)

    @property
    def rejects(self) -> int:
        return self.deleted.get("rejects", 0)

    def as_dict(self) -> dict[str, Any]:
        fields = asdict(self)
        return {**{k: v for k, v in fields.items() if k != "deleted"}, **self.deleted}


def _checked_refs(record_refs: list[str], *, finders: bool) -> list[str]:
    if (not record_refs and not finders) or any(not isinstance(r, str) or not r for r in record_refs):
        raise BosConfigurationError("Give at least one record_ref to erase, each a non-empty string (or an "
                                    "email, phone or external id to find them by).")
    return sorted(set(record_refs))


def erase_records(
    engine: sa.Engine, *, table: str, record_refs: Iterable[str] = (), schema: str | None = None,
    audit_table: str = "bos_sync_runs", conn_id: str | None = None, lock_timeout_s: float = 300.0,
    emails: Iterable[str] = (), phones: Iterable[str] = (), external_ids: Iterable[str] = (),
    external_ids_of_type: Iterable[str] = (), keep_successors: Iterable[str] = (), key: KeySource = None,
) -> ErasedRows:
    """Delete ``record_refs`` from ``table`` and the tables beside it, in one transaction; audit it.

    ``emails``, ``phones``, ``external_ids`` (``SOURCE:ID``: an entry of the source_identity SOURCE),
    ``external_ids_of_type`` (``TYPE:ID``: of any source whose source_type is TYPE): also erase every ref
    whose row, history version or quarantined record holds one of them (an external id exactly as
    given), and every quarantined record without a ref that holds one (:mod:`.erase_finders`). ``key``:
    the table's personal-data hash key, or a callable giving it; needed only when the table's policy
    hashes a field named.

    Each ref erased takes the records merged into it (its predecessors) and the record it was merged
    into (its successor, when ``<table>_lineage`` and its row name that one only), and so on both
    ways: they are the same person's, and the successor is their current record. A ref split into
    several records is not followed: when one of them is erased too, the others are left (another
    person's, as BOS now says) and named in :attr:`ErasedRows.left`; when none is, the erasure refuses,
    naming them, and erases nothing, until the request names the ones that are the person's
    (``record_refs``) and the others in ``keep_successors`` (refs to leave, named in the output; a ref
    there that is not a successor of an erased record is ignored).

    After the commit the space the deleted rows held is reclaimed (:func:`~.reclaim.reclaim_space`:
    SQLite VACUUM, a rewrite of the DuckDB file, PostgreSQL VACUUM, MariaDB OPTIMIZE TABLE). On
    DuckDB no other connection of this process may have the database file open.

    :param conn_id: the warehouse connection, recorded in the audit row.
    :raises BosConfigurationError: no ref, a table name that is not valid, a split not decided (nothing
        was deleted), or a ref both to erase and to keep.
    :raises BosWarehouseError: the database refused (nothing was deleted), or the space could not be
        reclaimed after the commit (the message says so and what to run).
    """
    finders = Finders.parse(emails, phones, external_ids, external_ids_of_type)
    refs = _checked_refs(list(record_refs), finders=bool(finders))
    keep = set(keep_successors)
    if any(not isinstance(r, str) or not r for r in keep):
        raise BosConfigurationError("Each record_ref to keep must be a non-empty string.")
    writer = WarehouseWriter(engine, table=table, schema=schema, audit_table=audit_table, lock_timeout_s=lock_timeout_s)
    try:
        present = sa.inspect(engine)
        if not present.has_table(writer.table, schema=writer.schema):
            raise BosConfigurationError(f"There is no table {writer.destination_table} to erase from.")
        writer.ensure_tables()  # the audit table (and columns added since) for the erasure's row
        companions = {c: c.name(writer.table) for c in COMPANIONS
                      if present.has_table(c.name(writer.table), schema=writer.schema)}
    except sa.exc.SQLAlchemyError as exc:
        raise BosWarehouseError(f"Could not inspect {writer.destination_table}: {db_detail(exc)}") from exc
    run = SyncRunInfo(run_id=str(uuid.uuid4()), conn_id=conn_id, tool_name=ERASE_TOOL_NAME, started_at=utcnow())
    audit = audit_table_definition(sa.MetaData(), writer.dialect.name, writer.audit_table, writer.schema)
    erased = ErasedRows(run_id=run.run_id, deleted={c.suffix: 0 for c in COMPANIONS if c.holds_people})
    d = writer.dialect
    tx = RunTransaction(engine, d, table=writer.table, schema=writer.schema, run_id=run.run_id,
                        lock_timeout_s=lock_timeout_s, guard_index=None)
    try:
        with tx.committed(f"Erasing from {writer.destination_table} failed and was rolled back "
                          f"(nothing was deleted)"):
            tx.begin()
            tx.lock()
            unnamed: list[tuple[str, Any]] = []
            # Quarantined records are found by their own finder: each is kept whole, raw (erase_finders).
            rejects = REJECTS.table(writer.table, d.name, writer.schema) if REJECTS in companions else None
            if finders:
                found = _find(tx.conn, writer, companions, finders, key)
                if rejects is not None:
                    quarantined = find_quarantined(tx.conn, d, rejects, finders)
                    found |= quarantined.refs
                    unnamed = quarantined.unnamed
                erased.found = len(found) + len(unnamed)
                refs = sorted(set(refs) | found)
            people = _same_people(tx.conn, writer, companions, refs, keep)
            erased.merged, erased.successors = len(people.merged), len(people.successors)
            erased.successor_refs = sorted(people.successors)
            erased.left = [{"record_ref": r, "reason": why} for r, why in sorted(people.left.items())]
            refs = sorted(set(refs) | people.merged | people.successors)
            for i in range(0, len(refs), _REFS_PER_STATEMENT):
                chunk = refs[i : i + _REFS_PER_STATEMENT]
                # An over-long ref is only ever in the rejects table (it was quarantined for its length).
                keys = [r for r in chunk if len(r) <= MAX_RECORD_REF_LENGTH]
                if keys:
                    erased.records += tx.exec(d.delete_refs(writer.table, writer.schema, "record_ref",
                                                            keys)).rowcount
                for companion, name in companions.items():
                    erasable = chunk if companion.any_ref_length else keys
                    for column in companion.erased_by if erasable else ():
                        erased.deleted[companion.suffix] += tx.exec(d.delete_refs(name, writer.schema, column,
                                                                                  erasable)).rowcount
            if rejects is not None and unnamed:
                erased.deleted[REJECTS.suffix] += _delete_unnamed(tx.conn, d, rejects, unnamed)
            erased.audit_messages = _scrub_audit_messages(tx.conn, audit, refs, writer.audit_columns)
            erased.audit_source_errors = _reduce_source_errors(tx.conn, d, audit)
            note = (f"Erasure of {len(refs)} record_ref(s) on request ({erased.merged} of them earlier records merged "
                    f"into another, {erased.successors} the records they were merged into; {len(erased.left)} "
                    f"record(s) an erased one was split or merged into left): deleted {erased.records} row(s) from "
                    f"{writer.destination_table}, "
                    + "".join(f"{n} from its {kind}, " for kind, n in _deleted_by_kind(companions, erased)) +
                    f"replaced the refs in {erased.audit_messages} audit message(s); reduced "
                    f"{erased.audit_source_errors} audit row(s)' source errors to their sources and codes.")
            tx.exec(audit_insert(d, writer.audit_table, writer.schema, run, status="complete", finished_at=utcnow(),
                                 completeness=None, result_count=len(refs),
                                 notes=note, destination_table=writer.destination_table,
                                 present=writer.audit_columns))
    finally:
        tx.close()
    log.info("BOS erasure %s: %s", run.run_id, note)
    touched = [name for companion, name in companions.items() if companion.reclaimed]
    erased.reclaimed = reclaim_space(engine, d, [writer.table, *touched, writer.audit_table], writer.schema)
    return erased


def _deleted_by_kind(companions: dict[Companion, str], erased: ErasedRows) -> list[tuple[str, int]]:
    """``(the companion's kind, rows deleted)`` of each companion that holds people, for the audit note."""
    return [(c.kind, erased.deleted[c.suffix]) for c in companions if c.holds_people]


def _find(conn: sa.Connection, writer: WarehouseWriter, companions: dict[Companion, str], finders: Finders,
          key: KeySource) -> set[str]:
    """The refs the finders match in the records table and the companions they search (the rows' earlier
    versions), under the table's policy."""
    metadata, name = sa.MetaData(), writer.dialect.name
    stored = None
    if POLICY in companions:
        text = read_stored_policy(conn, POLICY.table(writer.table, name, writer.schema, metadata))
        stored = PolicyFingerprint.parse(text) if text is not None else None
    versions = [c.table(writer.table, name, writer.schema, metadata) for c in companions if c.searched_by_finders]
    provenance = SOURCES.table(writer.table, name, writer.schema, metadata) if SOURCES in companions else None
    return find_refs(conn, records_table(metadata, name, writer.table, writer.schema), versions, finders, stored,
                     key, writer.dialect, provenance=provenance)


#: Why a record an erased one was merged or split into is left (ErasedRows.left).
LEFT_SPLIT = ("split: BOS split an erased record into this one and others, one of which was erased as the "
              "person's; this one is another person's (erase it by --record-ref if it is theirs too)")
LEFT_KEPT = "kept as asked (--keep-successor): an erased record was merged or split into it"
_SPLITS_NAMED = 20  # splits a refusal lists


@dataclass
class _SamePeople:
    """The refs an erasure takes with the ones it was given or found, and the ones it leaves."""

    merged: set[str] = field(default_factory=set)  # records merged into an erased one
    successors: set[str] = field(default_factory=set)  # the records an erased one was merged into
    left: dict[str, str] = field(default_factory=dict)  # ref -> why it stays


def _same_people(conn: sa.Connection, writer: WarehouseWriter, companions: dict[Companion, str], refs: list[str],
                 keep: set[str]) -> _SamePeople:
    """The records of the same people as ``refs``, followed through the lineage both ways.

    Back: the records merged into an erased one (superseded by it, as their rows or the lineage say),
    the same person's earlier records; without them an erased ref would stay in their
    ``_bos_superseded_by``. Forward: the record an erased one was merged into, when the lineage and its
    row name that one only (all its entries went there: BOS says it is the same person, and it holds
    their current data), unless ``keep`` names it. A record split into several is not followed: which
    of them is the person's is not known. When one of them is erased anyway (named, found, or the
    split reached from it), the others are left and said so; when none is and ``keep`` does not name
    them all, the erasure refuses (nothing is deleted), naming them.

    :raises BosConfigurationError: a split not decided, or a ref of ``keep`` that is erased.
    """
    metadata, name = sa.MetaData(), writer.dialect.name
    records = records_table(metadata, name, writer.table, writer.schema)
    lineage = LINEAGE.table(writer.table, name, writer.schema, metadata) if LINEAGE in companions else None
    people, erased = _SamePeople(), set(refs)
    successors_of: dict[str, set[str]] = {}
    backward = forward = {r for r in refs if len(r) <= MAX_RECORD_REF_LENGTH}
    while backward or forward:
        earlier: set[str] = set()
        if backward:
            earlier = refs_in(conn, records, SUPERSEDED_BY_COLUMN, backward)
            if lineage is not None:
                earlier |= refs_in(conn, lineage, "successor_ref", backward)
            earlier -= erased
        people.merged |= earlier
        erased |= earlier
        later: set[str] = set()
        for ref, successors in _successors(conn, records, lineage, forward | earlier).items():
            successors_of[ref] = successors
            if len(successors) == 1 and not successors & (erased | keep):
                later |= successors
        people.successors |= later
        erased |= later
        backward, forward = earlier | later, later
    clash = sorted(keep & erased)
    if clash:
        raise BosConfigurationError(
            f"Nothing was erased: {len(clash)} ref(s) to keep are erased too (named, found, or merged into an "
            f"erased record): {', '.join(clash[:_SPLITS_NAMED])}. Name a ref either to erase or to keep, not both.")
    undecided: list[list[str]] = []
    for ref in sorted(erased):
        successors = successors_of.get(ref, set())
        rest = successors - erased
        if len(successors) > 1 and not successors & erased and rest - keep:
            undecided.append(sorted(successors))
            continue
        for successor in rest:
            people.left[successor] = LEFT_KEPT if successor in keep else LEFT_SPLIT
    if undecided:
        splits = "; ".join(", ".join(group) for group in undecided[:_SPLITS_NAMED])
        more = f" (and {len(undecided) - _SPLITS_NAMED} more)" if len(undecided) > _SPLITS_NAMED else ""
        raise BosConfigurationError(
            f"Nothing was erased: BOS split {len(undecided)} record(s) to erase into several, and which of them "
            f"are this person's is not known: {splits}{more}. Name the ones that are theirs with --record-ref "
            f"(record_refs), the others with --keep-successor (keep_successors: they stay, and the output names "
            f"them), and erase again.")
    return people


def _successors(conn: sa.Connection, records: sa.Table, lineage: sa.Table | None,
                refs: set[str]) -> dict[str, set[str]]:
    """The records each of ``refs`` was merged or split into: its row's ``_bos_superseded_by`` and its
    lineage rows' successors (every one of a split; and of each time it was superseded)."""
    found: dict[str, set[str]] = {}
    ordered = sorted(refs)
    columns = [(records, SUPERSEDED_BY_COLUMN)] + ([(lineage, "successor_ref")] if lineage is not None else [])
    for table, column in columns:
        successor = table.c[column]
        query = sa.select(table.c.record_ref, successor).distinct().where(successor.is_not(None))
        for i in range(0, len(ordered), _REFS_PER_STATEMENT):
            chunk = ordered[i : i + _REFS_PER_STATEMENT]
            for ref, later in conn.execute(query.where(table.c.record_ref.in_(chunk))):
                if ref in refs and later != ref:  # exactly: a PAD SPACE collation also matches 'r:7 '
                    found.setdefault(ref, set()).add(later)
    return found


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


def _scrub_audit_messages(conn: sa.Connection, audit: sa.Table, refs: list[str], present: Iterable[str]) -> int:
    """Replace ``refs`` in every audit row's ``error_message`` and ``notes`` (of any table's runs; ``notes``
    where the table has it, per ``present``); return how many texts changed."""
    changed = 0
    for column in ("error_message", *((NOTES_COLUMN,) if NOTES_COLUMN in present else ())):
        rows = conn.execute(sa.select(audit.c.run_id, audit.c[column]).where(audit.c[column].is_not(None))).all()
        for run_id, message in rows:
            scrubbed = without_refs(message, refs)
            if scrubbed != message:
                conn.execute(audit.update().where(audit.c.run_id == run_id).values({column: scrubbed}))
                changed += 1
    return changed
