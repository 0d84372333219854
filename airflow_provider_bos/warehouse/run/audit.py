"""The audit table ``bos_sync_runs``: one row per sync run, and the reader the sensor uses.

Rows are written by :class:`~..writer.WarehouseWriter` (inside the run's transaction, or on their
own for failures); :class:`AuditReader` answers "what was the latest run of this read?".
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from airflow_provider_bos.exceptions import BosWarehouseError, excerpt
from airflow_provider_bos.redaction import redact
from airflow_provider_bos.warehouse.dialects import Statement, WarehouseDialect, dialect_for
from airflow_provider_bos.warehouse.run.catalog import column_names
from airflow_provider_bos.warehouse.run.db_calls import db_detail, execute
from airflow_provider_bos.warehouse.tables.identifiers import validate_identifier, validate_schema
from airflow_provider_bos.warehouse.tables.records import parse_timestamp
from airflow_provider_bos.warehouse.tables.schema import (
    ADDED_AUDIT_COLUMNS,
    AUDIT_COUNT_COLUMNS,
    AUDIT_JSON_COLUMNS,
    CONFIRMED_AT_COLUMN,
    COVERAGE_COLUMN,
    ERROR_MESSAGE_MAX,
    NOTES_COLUMN,
    REJECTED_COLUMN,
    RETIRED_COLUMN,
    SCOPE_COLUMN,
    SUPERSEDED_COLUMN,
    WITHHELD_COLUMN,
)
from airflow_provider_bos.warehouse.tables.schema import audit_table as audit_table_definition
from airflow_provider_bos.warehouse.tables.stored_json import JsonColumns

__all__ = [
    "ERASED_REF", "RUN_STATUSES", "AuditReader", "SyncRunInfo", "audit_insert", "truncate_error", "utcnow",
    "without_refs",
]

log = logging.getLogger(__name__)

RUN_STATUSES = ("complete", "partial", "failed")
#: What stands in an audit text for a record_ref that was erased.
ERASED_REF = "[erased record_ref]"
# A quoted literal of a message (Python's repr of a string, escapes included), which may be the
# start of a ref: a message names an over-long ref by its first characters.
_QUOTED = re.compile(r"'((?:[^'\\\n]|\\.){8,})'|\"((?:[^\"\\\n]|\\.){8,})\"")


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass
class SyncRunInfo:
    """Who ran a sync and what it read; the audit row's identifying part.

    ``run_id`` is ours (a UUID string), distinct from Airflow's ``airflow_run_id``.
    """

    run_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    dag_id: str | None = None
    task_id: str | None = None
    airflow_run_id: str | None = None
    conn_id: str | None = None
    context_handle: str | None = None
    tool_name: str | None = None
    arguments_hash: str | None = None
    started_at: datetime | str | None = field(default_factory=utcnow)


def truncate_error(message: str | None, limit: int = ERROR_MESSAGE_MAX) -> str | None:
    """The error text as stored: registered secrets redacted, then at most ``limit`` characters
    (redacted first: a secret cut in two is no longer recognisable)."""
    if message is None:
        return None
    text = redact(str(message))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def without_refs(text: str, refs: Collection[str], placeholder: str = ERASED_REF) -> str:
    """``text`` with each of ``refs`` replaced by ``placeholder``, and any quoted start of one (at
    least 8 characters: a message may quote only an over-long ref's first characters). A ref is
    found as it is and as a message's ``repr`` quotes it (a backslash, a control character or a
    quote escaped)."""
    forms = {form for ref in refs if ref for form in (ref, repr(ref)[1:-1])}
    for form in sorted(forms, key=len, reverse=True):
        text = text.replace(form, placeholder)

    def quoted(match: re.Match[str]) -> str:
        inner = match.group(1) or match.group(2)
        return placeholder if any(form.startswith(inner) for form in forms) else match.group(0)

    return _QUOTED.sub(quoted, text)


def _jsonable(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if dump is not None:
        return dump(mode="json")
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def _json_text(value: Any) -> str | None:
    if value is None:
        return None
    return json.dumps(_jsonable(value), ensure_ascii=False, default=str, separators=(",", ":"))


def audit_insert(
    dialect: WarehouseDialect,
    table: str,
    schema: str | None,
    run: SyncRunInfo,
    *,
    status: str,
    finished_at: datetime,
    completeness: str | None = None,
    result_count: int | None = None,
    counts: Mapping[str, int] | None = None,
    provisional_records: int | None = None,
    provisional_pages: int | None = None,
    source_errors: Any = None,
    source_summary: Any = None,
    error_message: str | None = None,
    notes: str | None = None,
    destination_table: str | None = None,
    present: Collection[str] = ADDED_AUDIT_COLUMNS,
    scope: str | None = None,
    confirmed_at: datetime | None = None,
    coverage: Mapping[str, Any] | None = None,
) -> Statement:
    """The INSERT of one audit row (values bound, JSON serialised, timestamps in UTC).

    ``present``: which of :data:`~.schema.ADDED_AUDIT_COLUMNS` the table has (one made before them
    lacks them). ``scope``: the read's scope key (see :func:`~.reconcile.scope_key`).
    ``confirmed_at``: the read time of a complete full read (it confirmed every current row of its scope).
    ``coverage``: how many of the run's records had a value per watched column (see :mod:`.coverage`).
    ``notes``: what the run says for information (``error_message``: why it failed or is partial); in
    a table still without the ``notes`` column they are kept in ``error_message``, after the error.
    """
    if status not in RUN_STATUSES:
        raise BosWarehouseError(f"Audit status must be one of {RUN_STATUSES}, not {status!r}.")
    started = parse_timestamp(run.started_at) if run.started_at is not None else None
    counts = dict(counts or {})
    if notes and NOTES_COLUMN not in present:  # not lost: shown where readers looked before the column
        error_message = f"{error_message} {notes}" if error_message else notes
    row: dict[str, Any] = {
        "run_id": run.run_id,
        "dag_id": run.dag_id,
        "task_id": run.task_id,
        "airflow_run_id": run.airflow_run_id,
        "conn_id": run.conn_id,
        "context_handle": run.context_handle,
        "tool_name": run.tool_name,
        "arguments_hash": run.arguments_hash,
        "started_at": dialect.bind_timestamp(started) if started else None,
        "finished_at": dialect.bind_timestamp(finished_at),
        "status": status,
        "completeness": completeness,
        "result_count": result_count,
        **{c: counts.get(c) for c in AUDIT_COUNT_COLUMNS},
        **{c: counts.get(c) for c in (REJECTED_COLUMN, RETIRED_COLUMN, SUPERSEDED_COLUMN) if c in present},
        **({SCOPE_COLUMN: scope} if SCOPE_COLUMN in present else {}),
        **({WITHHELD_COLUMN: counts.get(WITHHELD_COLUMN)} if WITHHELD_COLUMN in present else {}),
        **({CONFIRMED_AT_COLUMN: dialect.bind_timestamp(confirmed_at) if confirmed_at else None}
           if CONFIRMED_AT_COLUMN in present else {}),
        **({COVERAGE_COLUMN: _json_text(coverage)} if COVERAGE_COLUMN in present else {}),
        **({NOTES_COLUMN: truncate_error(notes)} if NOTES_COLUMN in present else {}),
        "provisional_records": provisional_records,
        "provisional_pages": provisional_pages,
        "source_errors": _json_text(source_errors),
        "source_summary": _json_text(source_summary),
        "error_message": truncate_error(error_message),
        "destination_table": destination_table,
    }
    columns = list(row)
    statement = dialect.insert_audit(table, schema, columns, {*AUDIT_JSON_COLUMNS, COVERAGE_COLUMN})
    return Statement(statement.sql, tuple(row[c] for c in columns))


def _as_utc(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    if isinstance(value, str):  # a driver that hands back text
        try:
            return parse_timestamp(value)
        except ValueError:
            return value
    return value


def record_failed_run(
    engine: sa.Engine, d: WarehouseDialect, audit_table: str, schema: str | None, run: SyncRunInfo, *,
    error: str, destination_table: str, present: Collection[str], source_summary: list[Any] | None,
    provisional_records: int, provisional_pages: int,
) -> None:
    """Write a ``failed`` audit row for ``run`` in its own small transaction.

    Idempotent for failures: a failed row of the run is replaced. A run already committed as
    complete/partial is left as it is (its records did land) and a warning is logged.
    """
    audit = audit_table_definition(sa.MetaData(), d.name, audit_table, schema)
    statement = audit_insert(
        d, audit_table, schema, run, status="failed", finished_at=utcnow(), completeness=None, result_count=None,
        provisional_records=provisional_records, provisional_pages=provisional_pages, source_errors=None,
        source_summary=source_summary, error_message=error, destination_table=destination_table, present=present,
    )
    try:
        with engine.begin() as conn:
            existing = conn.execute(sa.select(audit.c.status).where(audit.c.run_id == run.run_id)).scalar()
            if existing is None:
                execute(conn, statement)
            elif existing == "failed":  # replace the earlier failure with this, newer one
                conn.execute(audit.delete().where(audit.c.run_id == run.run_id))
                execute(conn, statement)
            else:
                log.warning("Run %s is already recorded as %s; not overwriting it with a failure (%s).",
                            run.run_id, existing, excerpt(error, 200))
    except sa.exc.SQLAlchemyError as exc:
        raise BosWarehouseError(f"Could not write the failed audit row for run {run.run_id}: {db_detail(exc)}") from exc


class AuditReader:
    """Reads ``bos_sync_runs``. Rows come back as dicts: JSON decoded, timestamps aware UTC."""

    def __init__(
        self,
        engine: sa.Engine,
        *,
        table: str = "bos_sync_runs",
        schema: str | None = None,
        audit_table: str | None = None,
    ) -> None:
        """``audit_table`` is an alias of ``table`` (the writer's parameter name)."""
        table = audit_table or table
        self.engine = engine
        self.dialect = dialect_for(engine)
        self.schema = validate_schema(schema, self.dialect.name)
        self.table = audit_table_definition(
            sa.MetaData(), self.dialect.name, validate_identifier(table, kind="audit table"), self.schema
        )
        self._columns_checked = False

    def _stored_table(self) -> sa.Table:
        """The table as it is stored: without those of :data:`~.schema.ADDED_AUDIT_COLUMNS` it was made before."""
        if not self._columns_checked:
            try:
                present = column_names(self.engine, self.dialect, self.table.name, self.schema)
            except sa.exc.SQLAlchemyError:  # no table yet (looked for again next time), or the query says why
                return self.table
            missing = [c for c in ADDED_AUDIT_COLUMNS if c not in present]
            if not missing:
                self._columns_checked = True  # for good: a column is never dropped by us
            else:  # looked for again next time: a writer may add them meanwhile
                return audit_table_definition(
                    sa.MetaData(), self.dialect.name, self.table.name, self.schema, omit=missing,
                )
        return self.table

    def _decode(self, row: sa.Row[Any]) -> dict[str, Any]:
        data = dict(row._mapping)
        for column in ADDED_AUDIT_COLUMNS:
            data.setdefault(column, None)  # a table made before the column
        json_columns = JsonColumns(self.table, (*AUDIT_JSON_COLUMNS, COVERAGE_COLUMN))
        for column in (*AUDIT_JSON_COLUMNS, COVERAGE_COLUMN):
            data[column] = json_columns.value(column, data.get(column))
        for column in ("started_at", "finished_at"):
            data[column] = _as_utc(data.get(column))
        return data

    def _since(self, value: datetime | str) -> datetime:
        # Bound through the column's SQLAlchemy type; MySQL DATETIME holds naive UTC.
        moment = parse_timestamp(value)
        return moment.replace(tzinfo=None) if self.dialect.name == "mysql" else moment

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        """The audit row of ``run_id``, or ``None`` (also when the audit table does not exist yet)."""
        t = self._stored_table()
        row = self._first(sa.select(t).where(t.c.run_id == run_id))
        return self._decode(row) if row is not None else None

    def _first(self, query: sa.Select[Any]) -> sa.Row[Any] | None:
        try:
            with self.engine.connect() as conn:
                return conn.execute(query).first()
        except sa.exc.SQLAlchemyError as exc:
            # No audit table yet means no run yet (the first sync creates it).
            try:
                exists = sa.inspect(self.engine).has_table(self.table.name, schema=self.schema)
            except sa.exc.SQLAlchemyError:
                exists = True
            if not exists:
                return None
            raise _read_error(exc) from exc

    def latest_run(
        self,
        conn_id: str | None,
        context_handle: str | None,
        tool_name: str | None,
        *,
        status: str | Iterable[str] | None = None,
        since: datetime | str | None = None,
        statuses: Iterable[str] | None = None,
    ) -> dict[str, Any] | None:
        """The newest run (by ``finished_at``) of this read, or ``None`` (none yet, or no audit table).

        ``status``/``statuses`` keep only runs with one of those statuses; ``since`` keeps only runs
        that finished at or after it. ``None`` for ``conn_id``/``context_handle``/``tool_name`` means
        "any" (e.g. the default context, whose handle the run row records once resolved).
        """
        wanted: set[str] = set()
        for value in (status, statuses):
            if value is None:
                continue
            wanted.update([value] if isinstance(value, str) else value)
        t = self._stored_table()
        query = sa.select(t)
        for column, value in ((t.c.conn_id, conn_id), (t.c.context_handle, context_handle), (t.c.tool_name, tool_name)):
            if value is not None:
                query = query.where(column == value)
        if wanted:
            query = query.where(t.c.status.in_(sorted(wanted)))
        if since is not None:
            query = query.where(t.c.finished_at >= self._since(since))
        query = query.order_by(t.c.finished_at.desc(), t.c.started_at.desc(), t.c.run_id.desc()).limit(1)
        row = self._first(query)
        return self._decode(row) if row is not None else None


def _read_error(exc: sa.exc.SQLAlchemyError) -> BosWarehouseError:
    return BosWarehouseError(f"Reading the BOS audit table failed: {db_detail(exc)}")
