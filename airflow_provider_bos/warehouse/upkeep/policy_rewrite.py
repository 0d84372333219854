"""Rewriting a table's stored rows with a policy's plan (``pii-apply``): read, changed in Python, written back.

The rows are read in key order a round at a time (a batch of the table's rows and the versions of
their refs), each changed by the plan a run applies and given its content hash again by the writer's
own functions (the orjson path of :func:`~..tables.records.json_column_values` where it applies,
:func:`~..tables.records.record_to_row` otherwise: the same texts and hash either way). HMAC-SHA-256
is done here, never in SQL: the key would reach the server's statement logs. The rounds are read by
key ranges (no cursor stays open), or on DuckDB (``reads_in_one_pass``) cut from one ordered query,
a range there being a scan of the whole table. What goes back is only the stored form, the cheapest
way each database offers:

* PostgreSQL: each round ``COPY``'d into a temporary table keyed by the row's key, then one
  ``UPDATE ... FROM`` it per table, bounded by the round's refs so it reads them through the key's
  index, run while the next round is changed here (one statement per row cost a round trip and a
  plan each; the update is the server's work, the change this process's: two cores);
* DuckDB (``updates_from_file``): staged NDJSON files of at most :data:`FILE_ROWS` rows, each applied
  by one ``UPDATE ... FROM read_json`` per table (one ``UPDATE`` per row costs ~0.7 ms there);
* the others: one ``UPDATE`` by key per row, values bound, a batch per ``executemany``.

On PostgreSQL and DuckDB a version that stores its ref's row's content (the current version always
does) is not read at all: the database finds it by comparing it with the row, and gives it the row's
new values from what is staged for the row, before the row itself is updated (a table holding one
version per ref is read and encoded once, not twice).

On PostgreSQL and DuckDB the JSON columns are read as their text and decoded by msgspec (the drivers
decode with :func:`json.loads`, several times slower; orjson would turn an integer beyond 64 bits into
a float); a text msgspec refuses (a lone surrogate) is decoded by :func:`json.loads`, as before.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import operator
import os
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO

import msgspec
import orjson
import sqlalchemy as sa

from airflow_provider_bos.exceptions import BosWarehouseError, excerpt
from airflow_provider_bos.pii import PiiKey, PiiPlan
from airflow_provider_bos.warehouse.dialects.base import WarehouseDialect
from airflow_provider_bos.warehouse.dialects.upkeep_sql import (
    copy_staged_updates,
    create_staged_updates,
    drop_staged_updates,
    empty_staged_updates,
    unlike_any_row_of,
    update_from_staged,
)
from airflow_provider_bos.warehouse.run.transaction import execute
from airflow_provider_bos.warehouse.tables.records import (
    CONTENT_FIELDS,
    JSON_CONTENT_FIELDS,
    json_column_values,
    parse_timestamp,
    record_to_row,
    row_fields,
)
from airflow_provider_bos.warehouse.tables.schema import WIRE_HASH_COLUMN, records_table
from airflow_provider_bos.warehouse.tables.stored_json import JsonColumns
from airflow_provider_bos.warehouse.upkeep.scan import rows_in_batches, rows_in_one_pass
from airflow_provider_bos.warehouse.upkeep.snapshot_reader import exported_snapshot, reader_on_snapshot

__all__ = ["Rewritten", "rewrite_rows", "rewrite_targets"]

log = logging.getLogger(__name__)

#: Rows read (and held) at a time.
BATCH = 5000
#: Rows of the first round read by key ranges: the database has nothing to update until this process
#: has read and changed it, so a small one starts the database's work sooner.
FIRST_BATCH = 500
#: Rewritten rows per staged file on DuckDB, each file applied by its own ``UPDATE``: the join of one
#: statement over 200,000 people and their versions did not fit a 512 MB ``memory_limit``, four did;
#: each scans the table again (their time 1.5 -> 2.4 s).
FILE_ROWS = 50_000
# The columns a policy can change (record_ref and the _bos_* columns never change).
_POLICY_COLUMNS = ("display_name", "email", "phone", "lifecycle", "identity_match", "attributes", "sources")
# The JSON columns the databases below hand back as their text when asked to (CAST AS TEXT).
_TEXT_JSON_DIALECTS = ("postgresql", "duckdb")


@dataclass
class Rewritten:
    """What one table's rewrite changed."""

    #: Rows whose content changed.
    rows: int = 0
    #: Rows whose wire hash changed (keyed, or cleared).
    wire_hashes: int = 0
    #: The columns whose value changed in at least one row (of any table rewritten alongside).
    fields: frozenset[str] = frozenset()


@dataclass(eq=False)  # a target is itself: found among the current versions by identity
class _Target:
    table: sa.Table
    key: tuple[str, ...]
    written: _Updates
    #: The wire hash's key (``None``: clear it); ``None`` for a table without wire hashes.
    wire: tuple[PiiKey | None] | None
    done: Rewritten = field(default_factory=Rewritten)


def rewrite_rows(
    conn: sa.Connection, table: sa.Table, plan: PiiPlan, dialect: WarehouseDialect, *, key: tuple[str, ...],
    wire: tuple[PiiKey | None] | None, directory: Path | None,
    versions: Sequence[tuple[sa.Table, tuple[str, ...]]] = (),
) -> list[Rewritten]:
    """Apply ``plan`` to every row of ``table`` (keyed by ``key``: its record_ref) and of each table of
    ``versions`` (``(table, key)``: the history, keyed by record_ref first); with ``wire``, key each
    wire hash of ``table`` with its key (or clear it, key ``None``). Returns what changed in each
    table, ``table``'s first.

    The versions are read alongside: after each batch of ``table``, the versions of the refs it
    covered. A version whose content is a row's of the batch (the current version always is) takes
    that row's new values without being transformed again; memory holds one batch. Where the rows go
    back through a staged table or file (PostgreSQL, DuckDB), such a version is not even read: the
    database gives it the new values of its ref's row, from what is staged for that row
    (:attr:`_Updates.current_versions`).

    ``directory``: where the DuckDB path stages its files (where the dialect ``updates_from_file``)."""
    if any(version_key[0] != key[0] for _, version_key in versions):  # pragma: no cover - a caller's mistake
        raise ValueError("each version table is keyed by the records table's key first")
    main = _Target(table, key, _updates(conn, table, dialect, key=key, wire=wire is not None, directory=directory),
                   wire)
    others = [_Target(t, k, _updates(conn, t, dialect, key=k, wire=False, directory=directory), None)
              for t, k in versions]
    if main.written.updates_alike:
        main.written.update_alike(others)
    with contextlib.ExitStack() as stack:
        # Before anything is written: the reader sees the tables as they were.
        reader = _reader_beside(stack, conn, dialect, [main.table, *(t.table for t in others)])
        # The records table's updates are applied first (the last entered exits first): they find the
        # versions alike by the row as it was.
        for target in (*others, main):
            stack.enter_context(target.written)
        fields = rewrite_targets(conn, main, others, plan, dialect, reader=reader)
    # Counted apart while the rounds ran (on PostgreSQL on the updates' thread), added once they are done.
    for target, alike in zip(main.written.current_versions, main.written.alike_updated, strict=True):
        target.done.rows += alike
    for target in (main, *others):
        target.done.fields = fields
    return [target.done for target in (main, *others)]


def _reader_beside(stack: contextlib.ExitStack, conn: sa.Connection, dialect: WarehouseDialect,
                   tables: Sequence[sa.Table]) -> sa.Connection | None:
    """A connection that reads ``tables`` beside the transaction's writes (:mod:`.snapshot_reader`),
    open until ``stack`` closes; ``None`` (the rounds are read on the transaction's own connection)
    where the dialect has none, or the database refuses it (a role's connection limit, a lock
    request queued on a table)."""
    if not dialect.capabilities.reads_beside_writes:
        return None
    snapshot = exported_snapshot(conn, dialect)  # the transaction's: a failure here is its own
    try:
        return stack.enter_context(reader_on_snapshot(conn.engine, dialect, snapshot,
                                                      tables=[(t.name, t.schema) for t in tables]))
    except sa.exc.DBAPIError as exc:
        refused = excerpt(str(getattr(exc, "orig", None) or exc), 300)
        log.warning("pii-apply reads the rows on its transaction's own connection, more slowly: a second "
                    "connection to read beside it was refused (%s)", refused)
        return None


def rewrite_targets(conn: sa.Connection, main: _Target, others: Sequence[_Target], plan: PiiPlan,
                    dialect: WarehouseDialect, *, reader: sa.Connection | None = None) -> frozenset[str]:
    """Read ``main``'s rows a batch at a time and, with each batch, each of ``others``' versions of the
    refs it covered (a round); apply ``plan`` to each row and hand its new values to its target's
    ``written``. Returns the columns some row changed. Memory holds the round changed and the next.

    While a round is changed here, the connection is free: the previous round's updates are applied
    meanwhile (:meth:`_Updates.apply_staged`, on a thread that waits for the server), so the
    database's work and this process's overlap on two cores; the last round's once every row is read.
    With a ``reader`` (a connection that sees what ``conn``'s transaction saw: :mod:`.snapshot_reader`),
    the rounds are read on it, the next on a thread while this one is changed and the last applied."""
    rewrite = _Rewrite(plan, dialect)
    targets = (main, *others)
    staged_range: tuple[Any, Any] = (None, None)
    rounds: Iterator[_Round]
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(ThreadPoolExecutor(max_workers=1, thread_name_prefix="bos-pii-apply"))
        if reader is not None:
            reads = stack.enter_context(ThreadPoolExecutor(max_workers=1, thread_name_prefix="bos-pii-read"))
            rounds = stack.enter_context(contextlib.closing(
                _read_ahead(_rounds_by_key(reader, main, others, dialect), reads)))
        elif dialect.capabilities.reads_in_one_pass and not any(t.written.runs_statements for t in targets):
            rounds = _rounds_in_one_pass(conn, main, others, dialect)
        else:
            rounds = _rounds_by_key(conn, main, others, dialect)
        for within, round_rows in rounds:
            applied = server.submit(_apply_staged, targets, frozenset(rewrite.fields), staged_range)
            memo: dict[tuple[Any, ...], tuple[Any, ...] | None] = {}
            changed = [(target, rewrite.batch(target, target_rows, memo)) for target, target_rows in round_rows]
            applied.result()
            for target, (contents, wires) in changed:
                target.written.add(contents, wires)
            staged_range = within
    _apply_staged(targets, frozenset(rewrite.fields), staged_range)
    return frozenset(rewrite.fields)


#: A round: the bounds of its refs (above, up to; ``None`` unbounded) and its rows by target.
_Round = tuple[tuple[Any, Any], list[tuple[_Target, Sequence[Mapping[Any, Any]]]]]


def _read_ahead(rounds: Generator[_Round, None, None], reads: ThreadPoolExecutor) -> Generator[_Round, None, None]:
    """``rounds``, the next one read on ``reads``' thread while the caller works on the one it has."""
    ahead = reads.submit(next, rounds, None)
    try:
        while (current := ahead.result()) is not None:
            ahead = reads.submit(next, rounds, None)
            yield current
    finally:
        with contextlib.suppress(Exception):  # raised above already, if it failed
            ahead.result()  # the read under way ends before the rounds are closed
        rounds.close()


def _rounds_by_key(conn: sa.Connection, main: _Target, others: Sequence[_Target],
                   dialect: WarehouseDialect) -> Generator[_Round, None, None]:
    """Rounds read by key ranges, each read when the previous round is done with (no cursor stays open)."""
    as_text = _as_text(dialect)
    above: Any = None
    batches = rows_in_batches(conn, main.table, _columns(main), key=main.key, batch_size=BATCH, as_text=as_text,
                              first_batch_size=min(FIRST_BATCH, BATCH))
    versions_read = [_not_alike(conn, dialect, main, other) for other in others]  # the same every round
    # None: the versions after the last row's ref (or of an empty table).
    for rows in itertools.chain(batches, (None,)):
        round_rows: list[tuple[_Target, Sequence[Mapping[Any, Any]]]] = [] if rows is None else [(main, rows)]
        up_to = None if rows is None else rows[-1][main.key[0]]
        for other, unlike in zip(others, versions_read, strict=True):
            round_rows.extend((other, version_rows) for version_rows in rows_in_batches(
                conn, other.table, _columns(other), key=other.key, batch_size=BATCH, as_text=as_text,
                within=(above, up_to), where=unlike))
        yield (above, up_to), round_rows
        above = up_to


def _rounds_in_one_pass(conn: sa.Connection, main: _Target, others: Sequence[_Target],
                        dialect: WarehouseDialect) -> Iterator[_Round]:
    """The same rounds, cut from one query over every target ordered by ref (the capability
    ``reads_in_one_pass``); a version's other key columns read as text too (a timestamp's text is
    what the staged file holds)."""
    targets = (main, *others)
    as_text = (*_as_text(dialect), *(name for other in others for name in other.key[1:]))
    ref = main.key[0]
    rows = rows_in_one_pass(conn, [(t.table, [*t.key, *_columns(t)]) for t in targets], order_by=ref,
                            batch_size=BATCH, as_text=as_text,
                            where=[None, *(_not_alike(conn, dialect, main, other) for other in others)])
    by_target: list[list[Mapping[Any, Any]]] = [[] for _ in targets]
    above: Any = None
    up_to: Any = None
    mains = 0
    for index, row in rows:
        if mains == BATCH and row[ref] != up_to:  # the first row past the round's last ref
            yield (above, up_to), [(t, r) for t, r in zip(targets, by_target, strict=True) if r]
            by_target, above, mains = [[] for _ in targets], up_to, 0
        if index == 0:
            mains += 1
            up_to = row[ref]
        by_target[index].append(row)
    if mains < BATCH:  # the last round ends the table (None: nothing above it is left)
        up_to = None
    yield (above, up_to), [(t, r) for t, r in zip(targets, by_target, strict=True) if r]


def _not_alike(conn: sa.Connection, dialect: WarehouseDialect, main: _Target,
               other: _Target) -> sa.TextClause | None:
    """Which of ``other``'s versions to read: those not alike their ref's row of ``main``, where the
    database updates those from ``main``'s staged rows (``None``: every version)."""
    if other not in main.written.current_versions:
        return None
    version = conn.dialect.identifier_preparer.format_table(other.table)  # as the query names it
    return sa.text(unlike_any_row_of(dialect, version, main.table.name, main.table.schema))


def _apply_staged(targets: Sequence[_Target], fields: frozenset[str], within: tuple[Any, Any]) -> None:
    for target in targets:
        target.written.apply_staged(fields, within)


def _as_text(dialect: WarehouseDialect) -> tuple[str, ...]:
    """The columns read as their text: the JSON ones where orjson decodes them, and on DuckDB the
    observation time too (its driver converts each timestamp through pytz; the text is ISO 8601)."""
    if dialect.name not in _TEXT_JSON_DIALECTS:
        return ()
    return (*JSON_CONTENT_FIELDS, *(("_bos_observed_at",) if dialect.name == "duckdb" else ()))


def _columns(target: _Target) -> list[str]:
    return [*CONTENT_FIELDS, "_bos_observed_at", *((WIRE_HASH_COLUMN,) if target.wire is not None else ())]


def _updates(conn: sa.Connection, table: sa.Table, dialect: WarehouseDialect, *, key: tuple[str, ...], wire: bool,
             directory: Path | None) -> _Updates:
    if dialect.name == "postgresql":
        return _CopyUpdates(conn, table, dialect, key=key, wire=wire)
    if directory is not None:
        return _FileUpdates(conn, table, dialect, key=key, wire=wire, directory=directory)
    return _BoundUpdates(conn, table, dialect.name, key=key, wire=wire)


_Row = tuple[Any, ...]
#: A row's stored content, as read (the key of the memo of new values).
_content_of = operator.itemgetter(*CONTENT_FIELDS, "_bos_observed_at")
_UNSEEN: Any = object()


def _values_of(names: Sequence[str]) -> Callable[[Mapping[Any, Any]], tuple[Any, ...]]:
    """A row's values of ``names``, as a tuple (itemgetter gives one name's value alone)."""
    if len(names) == 1:
        name = names[0]
        return lambda row: (row[name],)
    return operator.itemgetter(*names)


class _Rewrite:
    """The plan applied to a batch of rows, their new values handed to the target's updates."""

    def __init__(self, plan: PiiPlan, dialect: WarehouseDialect) -> None:
        self.plan = plan
        self.decode = _decoder(dialect)
        self.fields: set[str] = set()

    def batch(self, target: _Target, rows: Sequence[Mapping[Any, Any]],
              memo: dict[tuple[Any, ...], tuple[Any, ...] | None]) -> tuple[list[_Row], list[_Row]]:
        """The rows' new values for ``target.written`` (changed content; changed wire hash only).
        ``memo``: the new values (None: unchanged) by a row's stored content, as read."""
        wire = target.wire
        contents: list[tuple[Any, ...]] = []
        wires: list[tuple[Any, ...]] = []
        key_of = _values_of(target.key)
        for row in rows:
            ident = key_of(row)
            content = _content_of(row)
            try:
                values = memo.get(content, _UNSEEN)
                if values is _UNSEEN:
                    values = memo[content] = self._new_values(row)
            except TypeError:  # a JSON column handed back decoded (MySQL): not a key, so transformed again
                values = self._new_values(row)
            wire_hash = None
            if wire is not None:
                wire_hash = _new_wire_hash(row[WIRE_HASH_COLUMN], wire[0])
                target.done.wire_hashes += wire_hash != row[WIRE_HASH_COLUMN]  # changed, not just written
            if values is not None:
                contents.append((*ident, *values, *((wire_hash,) if wire is not None else ())))
            elif wire is not None and wire_hash != row[WIRE_HASH_COLUMN]:
                wires.append((*ident, wire_hash))
        target.done.rows += len(contents)
        return contents, wires

    def _new_values(self, row: Mapping[Any, Any]) -> tuple[Any, ...] | None:
        """The row's new :data:`_POLICY_COLUMNS` values and content hash; None if the plan changes nothing."""
        record = self.decode(row)
        stored = self.plan.apply(record)
        if stored == record:
            return None
        self.fields.update(name for name in _POLICY_COLUMNS if stored.get(name) != record.get(name))
        return _stored_values(stored, parse_timestamp(row["_bos_observed_at"]))


def _decoder(dialect: WarehouseDialect) -> Callable[[Mapping[Any, Any]], dict[str, Any]]:
    """A read row's content as the record that was stored."""
    if dialect.name not in _TEXT_JSON_DIALECTS:
        # The records table and its history hand back their JSON columns alike.
        json_columns = JsonColumns(records_table(sa.MetaData(), dialect.name), JSON_CONTENT_FIELDS)
        return lambda row: json_columns.row(row, CONTENT_FIELDS)
    json_fields = frozenset(JSON_CONTENT_FIELDS)
    return lambda row: {name: _loads(row[name]) if name in json_fields else row[name] for name in CONTENT_FIELDS}


_decode_exactly = msgspec.json.Decoder().decode


def _loads(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return _decode_exactly(text)  # exact beyond 64 bits, where orjson silently gives a float
    except (msgspec.DecodeError, RecursionError):  # a lone surrogate, deeper than msgspec reads: as before
        return json.loads(text)


def _stored_values(stored: dict[str, Any], observed: datetime) -> tuple[Any, ...]:
    """``stored``'s :data:`_POLICY_COLUMNS` values and content hash, as the writer stores them."""
    try:
        values = json_column_values(stored, observed)
    except BosWarehouseError:  # what only a read's record is refused for (an entry too long): see below
        values = None
    if values is not None:
        _, display_name, email, phone, lifecycle, identity_match, attributes, sources, _, record_hash = (
            row_fields(stored, values))
        return display_name, email, phone, lifecycle, identity_match, attributes, sources, record_hash
    row = record_to_row(stored, default_observed_at=observed, stored=True)
    return (row.display_name, row.email, row.phone, row.lifecycle, row.identity_match, row.attributes, row.sources,
            row.record_hash)


def _new_wire_hash(stored: str | None, key: PiiKey | None) -> str | None:
    """A raw wire hash keyed as a run under a policy keys it (:meth:`PiiKey.wire_hash_hex`); ``None``
    without a key."""
    if stored is None or key is None:
        return None
    return key.wire_hash_hex(stored)


class _Updates(ABC):
    """Rewritten rows, each a tuple: its key values, then (content) :data:`_POLICY_COLUMNS`, the
    content hash and, with ``wire``, the wire hash; or (wire) the wire hash only."""

    def __init__(self, table: sa.Table, *, key: tuple[str, ...], wire: bool) -> None:
        self.table, self.key = table, key
        self.columns = {"content": (*_POLICY_COLUMNS, "_bos_record_hash", *((WIRE_HASH_COLUMN,) if wire else ())),
                        "wire": (WIRE_HASH_COLUMN,)}
        #: The targets (the records table's history) whose versions alike a row staged here are updated
        #: with it, before it, from what is staged (:meth:`update_alike`, where :attr:`updates_alike`).
        self.current_versions: Sequence[_Target] = ()
        #: How many versions alike of each of them were updated: counted apart from the targets' own
        #: counts, which grow meanwhile on another thread (on PostgreSQL the updates run beside the
        #: rounds' changes).
        self.alike_updated: list[int] = []

    #: :meth:`add` and :meth:`apply_staged` run statements on the connection (a read may not stay open).
    runs_statements = True
    #: The versions alike a rewritten row can be updated by the database from what is staged for the row.
    updates_alike = False

    def update_alike(self, versions: Sequence[_Target]) -> None:
        """Update the versions alike the rows staged here, of each of ``versions``, with those rows."""
        self.current_versions = versions
        self.alike_updated = [0] * len(versions)

    def __enter__(self) -> _Updates:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:  # nothing kept back by default
        return None

    @abstractmethod
    def add(self, contents: list[tuple[Any, ...]], wires: list[tuple[Any, ...]]) -> None:
        """Write back (or stage for :meth:`apply_staged` or :meth:`__exit__`) a batch of rewritten rows."""

    def apply_staged(self, fields: frozenset[str], within: tuple[Any, Any]) -> None:
        """Apply what :meth:`add` staged (``fields``: the content columns some staged row changed;
        ``within``: bounds of the staged rows' first key column, above and up to, ``None`` unbounded); run
        while nothing else uses the connection. Nothing to do by default."""
        return None


class _BoundUpdates(_Updates):
    """Written back a batch at a time: one ``UPDATE`` by key per row, values bound."""

    def __init__(self, conn: sa.Connection, table: sa.Table, dialect_name: str, *, key: tuple[str, ...],
                 wire: bool) -> None:
        super().__init__(table, key=key, wire=wire)
        self.conn = conn
        where = sa.and_(*(table.c[name] == sa.bindparam(f"k_{name}", type_=table.c[name].type) for name in key))
        self.statements = {
            kind: sa.update(table).where(where).values(
                {name: (_json_value(dialect_name, table.c[name], name) if name in JSON_CONTENT_FIELDS
                        else sa.bindparam(name, type_=sa.Text())) for name in columns})
            for kind, columns in self.columns.items()}

    def add(self, contents: list[tuple[Any, ...]], wires: list[tuple[Any, ...]]) -> None:
        names = [f"k_{name}" for name in self.key]
        for kind, rows in (("content", contents), ("wire", wires)):
            if rows:
                fields = (*names, *self.columns[kind])
                self.conn.execute(self.statements[kind], [dict(zip(fields, row, strict=True)) for row in rows])


def _json_value(dialect_name: str, column: sa.Column[Any], name: str) -> sa.ColumnElement[Any]:
    """A bound JSON text for ``column``: cast where the column's type is not text (PostgreSQL JSONB,
    DuckDB JSON), parsed on Snowflake (a text bound to a VARIANT would be stored as a string, not the
    object); MariaDB's JSON and SQLite's columns take the text as it is."""
    value = sa.bindparam(name, type_=sa.Text())
    if dialect_name == "snowflake":
        return sa.func.parse_json(value)
    return sa.cast(value, column.type) if dialect_name in ("postgresql", "duckdb") else value


class _CopyUpdates(_Updates):
    """PostgreSQL: each batch ``COPY``'d (binary) into a temporary table (dropped at the commit) and applied by
    one ``UPDATE ... FROM`` it (:meth:`apply_staged`, while the next batch is changed), which is then
    emptied for the next."""

    updates_alike = True

    def __init__(self, conn: sa.Connection, table: sa.Table, dialect: WarehouseDialect, *,
                 key: tuple[str, ...], wire: bool) -> None:
        super().__init__(table, key=key, wire=wire)
        self.conn, self.dialect = conn, dialect
        suffix = uuid.uuid4().hex[:12]
        self.staged = {kind: f"bos_pii_{suffix}_{kind}" for kind in self.columns}
        #: Rows staged and not applied yet.
        self.lines = dict.fromkeys(self.columns, 0)
        typed = [(name, "TIMESTAMPTZ" if name == "_bos_valid_from" else "TEXT") for name in key]
        #: The key columns' types as the binary COPY sends them.
        self.key_types = [kind.lower() for _, kind in typed]
        for kind, columns in self.columns.items():
            execute(conn, create_staged_updates(dialect, self.staged[kind], key=typed, columns=columns))

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is not None:
            return  # the transaction is rolled back: the temporary tables go with it
        for kind in self.columns:
            execute(self.conn, drop_staged_updates(self.dialect, self.staged[kind]))

    def apply_staged(self, fields: frozenset[str], within: tuple[Any, Any]) -> None:
        for kind, columns in self.columns.items():
            if not self.lines[kind]:
                continue
            # A column no row changed is not set again: jsonb holds the value, not the text, so
            # its rows would be written the same, at the cost of parsing every one.
            changed = _set_again(columns, fields)
            if kind == "content" and self.current_versions:
                for at, version in enumerate(self.current_versions):
                    self.alike_updated[at] += execute(self.conn, update_from_staged(
                        self.dialect, version.table.name, version.table.schema, self.staged[kind], key=self.key,
                        columns=[c for c in changed if c != WIRE_HASH_COLUMN], json_columns=JSON_CONTENT_FIELDS,
                        within=within, alike_in=self.table.name)).rowcount
            execute(self.conn, update_from_staged(self.dialect, self.table.name, self.table.schema,
                                                  self.staged[kind], key=self.key, columns=changed,
                                                  json_columns=JSON_CONTENT_FIELDS, within=within))
            execute(self.conn, empty_staged_updates(self.dialect, self.staged[kind]))
            self.lines[kind] = 0

    def add(self, contents: list[tuple[Any, ...]], wires: list[tuple[Any, ...]]) -> None:
        driver: Any = self.conn.connection.driver_connection
        for kind, rows in (("content", contents), ("wire", wires)):
            if not rows:
                continue
            names = [*(f"k_{name}" for name in self.key), *self.columns[kind]]
            with driver.cursor() as cursor, cursor.copy(
                    copy_staged_updates(self.dialect, self.staged[kind], names)) as copy:
                copy.set_types([*self.key_types, *(["text"] * len(self.columns[kind]))])
                for row in rows:
                    copy.write_row(row)
            self.lines[kind] += len(rows)


@dataclass
class _StagedFile:
    """One staged NDJSON file of rewritten rows, applied by its own ``UPDATE``."""

    path: Path
    out: BinaryIO
    lines: int = 0
    longest: int = 0


class _FileUpdates(_Updates):
    """DuckDB: rewritten rows written to NDJSON files in ``directory`` (new content; new wire hash only),
    at most :data:`FILE_ROWS` rows each, each applied by one ``UPDATE ... FROM`` the file when the table
    has been read (see :meth:`~.dialects.duckdb.DuckDBDialect.update_from_file`); the files are
    removed after."""

    runs_statements = False
    updates_alike = True

    def __init__(self, conn: sa.Connection, table: sa.Table, dialect: WarehouseDialect, *,
                 key: tuple[str, ...], wire: bool, directory: Path) -> None:
        super().__init__(table, key=key, wire=wire)
        self.conn, self.dialect, self.directory = conn, dialect, directory
        self.files: dict[str, list[_StagedFile]] = {kind: [] for kind in self.columns}
        #: The content columns some row changed, as the rounds found them (all of them by the last).
        self.fields: frozenset[str] = frozenset()

    def apply_staged(self, fields: frozenset[str], within: tuple[Any, Any]) -> None:
        self.fields = fields  # the files are applied once the table has been read (__exit__)

    def _file(self, kind: str) -> _StagedFile:
        """The file of ``kind`` the next rows go to: a new one once the last holds :data:`FILE_ROWS`."""
        files = self.files[kind]
        if not files or files[-1].lines >= FILE_ROWS:
            path = self.directory / f"bos-pii-{self.table.name}-{kind}-{len(files)}.ndjson"
            files.append(_StagedFile(path, os.fdopen(
                os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600), "wb")))
        return files[-1]

    def __exit__(self, exc_type: object, *exc: object) -> None:
        staged = [(kind, file) for kind, files in self.files.items() for file in files]
        try:
            for _, file in staged:
                file.out.close()
            if exc_type is None:
                for kind, file in staged:
                    self._apply(kind, file)
        finally:
            for _, file in staged:
                file.path.unlink(missing_ok=True)

    def _apply(self, kind: str, file: _StagedFile) -> None:
        """The versions alike the file's rows, then the rows (a file's refs are no other file's).

        A column no row changed is not set: DuckDB holds every value an open transaction's UPDATE
        sets in memory until the commit, so each column set again for nothing costs memory as well
        as time (and keeps the stored text as it was)."""
        changed = _set_again(self.columns[kind], self.fields)
        for at, version in enumerate(self.current_versions if kind == "content" else ()):
            alike = self.dialect.update_from_file(
                version.table.name, version.table.schema, str(file.path), key=self.key,
                columns=[c for c in changed if c != WIRE_HASH_COLUMN], longest_line=file.longest,
                alike_in=self.table.name)
            self.alike_updated[at] += self.conn.exec_driver_sql(alike.sql, alike.params).rowcount
        update = self.dialect.update_from_file(self.table.name, self.table.schema, str(file.path), key=self.key,
                                               columns=changed, longest_line=file.longest)
        self.conn.exec_driver_sql(update.sql, update.params)

    def add(self, contents: list[tuple[Any, ...]], wires: list[tuple[Any, ...]]) -> None:
        keys = tuple(f"k_{name}" for name in self.key)
        for kind, rows in (("content", contents), ("wire", wires)):
            lines = _file_lines((*keys, *self.columns[kind]), rows)
            while lines:
                file = self._file(kind)
                taken, lines = lines[:FILE_ROWS - file.lines], lines[FILE_ROWS - file.lines:]
                file.longest = max(file.longest, *map(len, taken))
                file.lines += len(taken)
                file.out.write(b"".join(taken))


def _set_again(columns: Sequence[str], fields: frozenset[str]) -> list[str]:
    """Which of ``columns`` an update sets: the hashes, and the content columns some row changed."""
    return [c for c in columns if c not in _POLICY_COLUMNS or c in fields]


def _file_lines(fields: tuple[str, ...], rows: list[tuple[Any, ...]]) -> list[bytes]:
    """The rows as the staged file holds them, one JSON object per line: a JSON column's text as the
    JSON itself; a timestamp as orjson writes it (RFC 3339, its offset kept)."""
    json_at = [at for at, name in enumerate(fields) if name in JSON_CONTENT_FIELDS]
    dumps, fragment = orjson.dumps, orjson.Fragment
    lines = []
    for row in rows:
        values = list(row)
        for at in json_at:
            if values[at] is not None:
                values[at] = fragment(values[at])
        lines.append(dumps(dict(zip(fields, values, strict=True))) + b"\n")
    return lines
