"""Getting a run's records into the database: the two loaders that run a statement per batch.

- :class:`Loader`: how a dialect's rows travel (its ``capabilities.load_method``, mapped by
  :mod:`.load_methods`): every record into the run's staging table (``stage``), or, for an empty
  locked target, into the table itself as the records arrive (``load_direct``: a possible repeat of
  a record_ref goes to staging, merged after the last record by :mod:`.settle`).
- :data:`COPY_LOADER` (PostgreSQL with psycopg 3: document-staged rows by COPY) and
  :data:`ROWS_LOADER` (chunked ``executemany`` of column-staged rows); the staged file of
  :mod:`.file_load` beside them. A database that loads another way adds a loader, not a branch.
- :class:`SeenKeys`: the key filter every load uses (which record_refs it has seen).

Every path, :mod:`.file_load`'s too, encodes its records in one loop, :func:`encoded`: with
``rejects`` (a :class:`~.rejects.Rejects`, ``invalid_records="quarantine"``) a record the encoders
refuse goes there instead of failing the run (the ``try`` costs nothing until a record is refused).
Imports nothing of the dialects or the transaction at run time: the dialects name their load method.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from datetime import datetime
from itertools import islice
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, cast

from airflow_provider_bos.exceptions import BosWarehouseError
from airflow_provider_bos.warehouse.tables.records import column_values, document_values, row_values
from airflow_provider_bos.wire import KnownRecord

if TYPE_CHECKING:
    from airflow_provider_bos.warehouse.dialects import PostgresDialect
    from airflow_provider_bos.warehouse.dialects.capabilities import DialectCapabilities
    from airflow_provider_bos.warehouse.run.claims import KeptClaims
    from airflow_provider_bos.warehouse.run.rejects import Rejects
    from airflow_provider_bos.warehouse.run.transaction import RunTransaction

__all__ = [
    "COPY_LOADER", "ROWS_LOADER", "CopyLoader", "Loader", "RowsLoader", "SeenKeys", "encoded", "keys_distinct",
]

# COPY lines are sent in blocks (a write per line cost a third of the client's staging time).
_COPY_BLOCK = 2048
# Staged rows a direct load holds in memory before it pauses the target's COPY to stage them (~2 MB;
# at a million records the filter's ~1.5% false positives alone would otherwise hold ~10 MB).
_PENDING_LIMIT = 2_000


class SeenKeys:
    """The record_refs a load has seen so far: a Bloom filter of one probe, 8 MiB.

    Key ``k`` is "seen" if bit ``hash(k) % BITS`` is set (Python's salted str hash: stable within
    a process, which is all one load needs). Never wrong for a key added before (no false
    negatives); sometimes right for a new key too (~0.3% at 200k keys, ~1.5% at a million).
    Staging passes its rows through :meth:`watch` and the suspects are then looked up in staging
    to tell real repeats from false positives; the direct load diverts them to staging instead.
    """

    BITS = 1 << 26
    #: How many suspects :meth:`watch` remembers (~1 MB of keys); past it, ``suspects`` is None.
    SUSPECTS_LIMIT = 10_000

    def __init__(self) -> None:
        self.bits = bytearray(self.BITS >> 3)
        #: Keys that found their bit set: 0 proves every key was distinct.
        self.repeats = 0
        #: Those keys: every later occurrence of a repeated key is among them, with the filter's
        #: false positives (~300 at 200k keys).
        self.suspects: list[str] | None = []

    def watch(
        self, rows: Iterable[tuple[Any, ...]], divert: list[tuple[Any, ...]] | None = None, divert_limit: int = 0,
    ) -> Iterator[tuple[Any, ...] | None]:
        """Pass rows (record_ref first) through, noting possible repeats of their key.

        ``divert``: a possible repeat is appended there instead of passed through (and not
        counted in :attr:`repeats`); whenever it then holds ``divert_limit`` rows, ``None`` is
        yielded so the consumer can empty it. The filter is tested and set inline (a method call
        per row cost more than the test).
        """
        bits, mask = self.bits, self.BITS - 1
        for row in rows:
            h = hash(row[0]) & mask
            byte, bit = h >> 3, 1 << (h & 7)
            if bits[byte] & bit:
                if divert is not None:
                    divert.append(row)
                    if len(divert) >= divert_limit:
                        yield None
                    continue
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


def keys_distinct(tx: RunTransaction, seen: SeenKeys) -> bool:
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
    staged = tx.staged_key_counts(suspects)
    return len(staged) == len(suspects) and all(n == 1 for n in staged.values())


def encoded(
    records: Iterable[Any], encode: Callable[[Any, datetime | None], tuple[Any, ...]], default_obs: datetime | None,
    rejects: Rejects | None,
) -> Iterator[tuple[int, Any, tuple[Any, ...] | None]]:
    """``(seq, record, encode(record, default_obs))`` of each record, ``seq`` its position in the
    result; a :class:`KnownRecord` (a claim: nothing to encode) comes with ``None``.

    A record ``encode`` refuses (:class:`BosWarehouseError`) goes to ``rejects`` and is left out;
    without ``rejects`` the error is raised.
    """
    for seq, record in enumerate(records):
        if type(record) is KnownRecord:
            yield seq, record, None
            continue
        try:
            values = encode(record, default_obs)
        except BosWarehouseError as exc:
            if rejects is None:
                raise
            rejects.add(record, exc)
        else:
            yield seq, record, values


def _send(copy: Any, lines: list[bytes]) -> int:
    """Write ``lines`` to a COPY in one block and empty the list; return how many were sent."""
    count = len(lines)
    if count:
        copy.write(b"".join(lines))
        lines.clear()
    return count


def _chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    """``items`` in lists of ``size`` (the last one shorter)."""
    items = iter(items)
    while chunk := list(islice(items, size)):
        yield chunk


# --- staging --------------------------------------------------------------------------------------


def _documents(
    records: Iterable[Any], default_obs: datetime | None, kept: KeptClaims | None = None,
    rejects: Rejects | None = None,
) -> Iterator[tuple[Any, ...]]:
    """Document-staged tuples: (record_ref, document as UTF-8 bytes, observed_at, hash, wire hash, seq).

    A known record: (record_ref, None, its own observed_at or None, None, wire hash, seq), unless
    ``kept`` keeps it.
    """
    keep = kept.keep if kept is not None else None
    for seq, record, values in encoded(records, document_values, default_obs, rejects):
        if values is not None:
            yield (*values, getattr(record, "wire_hash", None), seq)
        elif keep is None or not keep(record, seq):
            yield (record.record_ref, None, record.observed_at, None, record.wire_hash, seq)


def _row_encoder(capabilities: DialectCapabilities) -> Callable[[Any, datetime | None], tuple[Any, ...]]:
    """:func:`row_values`, refusing what this database's columns cannot hold (its capabilities)."""
    unpadded, depth = capabilities.keys_ignore_trailing_spaces, capabilities.max_json_depth
    if not unpadded and depth is None:
        return row_values

    def encode(record: Any, default_obs: datetime | None) -> tuple[Any, ...]:
        values = row_values(record, default_obs)
        if unpadded and values[0].endswith(" "):
            raise BosWarehouseError(
                f"Record {values[0]!r}: its record_ref ends in a space, and this database compares keys ignoring "
                "trailing spaces (MySQL/MariaDB's PAD SPACE collation), so it would be stored as the key of "
                "another record_ref, the same without them. Sync this read to another destination, or ask BOS "
                "why a record_ref ends in a space."
            )
        if depth is not None:
            _check_json_depth(values, depth)
        return values

    return encode


# The JSON columns of row_values' tuple, by name.
_JSON_FIELDS = {4: "lifecycle", 5: "identity_match", 6: "attributes", 7: "sources"}


def _check_json_depth(values: tuple[Any, ...], limit: int) -> None:
    """Refuse a row whose JSON column nests deeper than ``limit`` levels. A text with fewer brackets
    than that cannot (one count each, in C); only then is the value walked, its containers only."""
    for at, name in _JSON_FIELDS.items():
        text = values[at]
        if text is None or text.count("[") + text.count("{") <= limit:
            continue
        deepest, pending = 0, [(json.loads(text), 0)]
        while pending:
            value, level = pending.pop()
            if isinstance(value, dict | list):
                level += 1
                deepest = max(deepest, level)
                pending.extend((child, level) for child in (value.values() if isinstance(value, dict) else value))
        if deepest > limit:
            raise BosWarehouseError(
                f"Record {values[0]!r}: its {name} nests {deepest} levels deep, and this database's JSON columns "
                f"hold at most {limit} levels (MariaDB's JSON_VALID). Sync this read to another destination, or "
                "quarantine such records (invalid_records='quarantine')."
            )


def _rows(
    tx: RunTransaction, records: Iterable[Any], default_obs: datetime | None, rejects: Rejects | None = None,
) -> Iterator[tuple[Any, ...]]:
    """Column-staged tuples (:data:`~.dialects.STAGE_COLUMNS` order)."""
    known_value, bind_ts = tx.dialect.known_value, tx.dialect.bind_timestamp
    encode = _row_encoder(tx.dialect.capabilities)
    for seq, record, fields in encoded(records, encode, default_obs, rejects):
        if fields is None:
            observed = record.observed_at
            yield known_value(record.record_ref, record.wire_hash, seq,
                              None if observed is None else bind_ts(observed))
        else:
            yield (*fields[:8], bind_ts(fields[8]), fields[9], getattr(record, "wire_hash", None), seq)


# --- the direct load of an empty table --------------------------------------------------------------


class _Staged(NamedTuple):
    """A direct load's rows for staging (possible repeats of a loaded record_ref), as COPY text."""

    text: bytes
    rows: int


def _direct_items(
    tx: RunTransaction, copy: PostgresDialect, records: Iterable[Any], default_obs: datetime | None,
    synced_at: datetime, rejects: Rejects | None,
) -> Iterator[bytes | _Staged]:
    """The direct load's COPY lines for the target, and, every ``_PENDING_LIMIT`` possible repeats
    and after the last record, a :class:`_Staged` block of them (in order: the writer ends the
    target's COPY to stage it).

    The key filter of :class:`SeenKeys` is tested and set inline, not through :meth:`SeenKeys.watch`:
    each generator layer cost ~0.2 us per record.
    """
    line = copy.target_lines(synced_at=synced_at, run_id=tx.run_id).line
    seen = SeenKeys()
    bits, mask = seen.bits, seen.BITS - 1
    pending: list[tuple[Any, ...]] = []  # document-staged tuples (see _documents)
    for seq, record, values in encoded(records, column_values, default_obs, rejects):
        if values is None:
            # A claim on a stored row, yet the table was empty under the lock: that row is gone.
            raise tx.unverified(1)
        ref, parts, observed, record_hash, document = values
        wire_hash = getattr(record, "wire_hash", None)
        h = hash(ref) & mask
        byte, bit = h >> 3, 1 << (h & 7)
        if bits[byte] & bit:  # maybe loaded already: staged, merged after the last record
            pending.append((ref, document, observed, record_hash, wire_hash, seq))
            if len(pending) >= _PENDING_LIMIT:
                yield _Staged(b"".join(copy.copy_lines(pending)), len(pending))
                pending.clear()
            continue
        bits[byte] |= bit
        yield line(parts, document, observed, record_hash, wire_hash)
    if pending:
        yield _Staged(b"".join(copy.copy_lines(pending)), len(pending))


class _TargetCopy:
    """The direct load's COPY into the target: started with the load and again after each staging
    (one COPY at a time per connection), its server-side row count checked at each end."""

    def __init__(self, cursor: Any, sql: str, destination: str) -> None:
        self._cursor, self._sql, self._destination = cursor, sql, destination
        self._open: Any = None  # psycopg's Copy context manager while a COPY runs
        self._out: Any = None
        self._sent = 0

    def start(self) -> None:
        """Start a COPY (each round has one, even if no line comes: the server counts it)."""
        if self._open is None:
            self._open = self._cursor.copy(self._sql)
            self._out = self._open.__enter__()
            self._sent = 0

    def send(self, lines: list[bytes]) -> None:
        if lines:
            self.start()
            self._sent += _send(self._out, lines)

    def end(self) -> int:
        """End the running COPY (if any); return how many rows it loaded."""
        if self._open is None:
            return 0
        running, self._open = self._open, None
        running.__exit__(None, None, None)
        if 0 <= self._cursor.rowcount != self._sent:  # pragma: no cover - the server's own count
            raise BosWarehouseError(f"COPY into {self._destination} loaded {self._cursor.rowcount} "
                                    f"rows where {self._sent} were sent; rolled back.")
        return self._sent

    def abort(self, exc: BaseException) -> None:
        """End a running COPY with ``exc`` (psycopg fails it on the server; the transaction is rolled back)."""
        if self._open is not None:
            running, self._open = self._open, None
            with suppress(Exception):  # the original error is the one to raise
                running.__exit__(type(exc), exc, exc.__traceback__)


# --- the loaders ---------------------------------------------------------------------------------


class Loader(Protocol):
    """How one dialect's rows reach the database: staged (every dialect) and, where its capabilities'
    ``direct_load`` allow it, straight into an empty locked target."""

    #: What the writer's log and ``staging_method`` say (``"copy"``, ``"executemany"``, ...).
    name: str
    #: Claims matched against a state token may be kept out of staging (see :mod:`.claims`).
    keeps_claims: bool

    def stage(
        self, tx: RunTransaction, records: Iterable[Any], default_obs: datetime | None, *, batch_size: int,
        seen: SeenKeys, kept: KeptClaims | None, rejects: Rejects | None,
    ) -> int:
        """Every record into ``tx``'s staging table; how many were staged."""
        ...

    def load_direct(
        self, tx: RunTransaction, records: Iterable[Any], default_obs: datetime | None, synced_at: datetime, *,
        batch_size: int, rejects: Rejects | None,
    ) -> tuple[int, int]:
        """The records into the (empty, locked) target as they arrive; (loaded, staged)."""
        ...


class CopyLoader:
    """COPY (PostgreSQL with psycopg 3): document staging, or the direct load into the target."""

    name = "copy"
    keeps_claims = True

    def stage(self, tx: RunTransaction, records: Iterable[Any], default_obs: datetime | None, *, batch_size: int,
              seen: SeenKeys, kept: KeptClaims | None, rejects: Rejects | None) -> int:
        """Document-staged rows by one COPY (``batch_size`` unused: COPY streams); ``kept`` takes the
        claims it can; ``seen`` watches the staged keys; ``rejects`` takes the records the encoders
        refuse (else the first one raises)."""
        copy = cast("PostgresDialect", tx.dialect)
        received = 0
        raw = tx.conn.connection.driver_connection  # psycopg.Connection, same transaction
        assert raw is not None  # None only for a closed connection, not one inside a transaction
        lines = copy.copy_lines(seen.watch(_documents(records, default_obs, kept, rejects)))  # type: ignore[arg-type]
        with raw.cursor() as cursor, cursor.copy(copy.copy_staging(tx.stage, tx.schema)) as out:
            for block in _chunks(lines, _COPY_BLOCK):
                received += _send(out, block)
        return received

    def load_direct(self, tx: RunTransaction, records: Iterable[Any], default_obs: datetime | None,
                    synced_at: datetime, *, batch_size: int, rejects: Rejects | None) -> tuple[int, int]:
        """COPY the records into the (empty, locked) target as they arrive; return (loaded, staged).

        A record whose record_ref may already have been loaded by this run (a duplicate, or a rare
        false positive of :class:`SeenKeys`) goes to staging instead, to be merged after the last
        record (:mod:`.settle`); so the target holds each record_ref's FIRST copy and staging
        every later one. Staged rows wait (as COPY text, at most ``_PENDING_LIMIT``) while the target's
        COPY runs (one COPY at a time per connection); then that COPY is ended, they are staged, and a
        new one starts with the next block.
        """
        copy = cast("PostgresDialect", tx.dialect)
        raw = tx.conn.connection.driver_connection  # psycopg.Connection, same transaction
        assert raw is not None  # None only for a closed connection, not one inside a transaction
        items = _direct_items(tx, copy, records, default_obs, synced_at, rejects)
        loaded = staged = 0
        with raw.cursor() as cursor:
            target = _TargetCopy(cursor, copy.copy_target(tx.table, tx.schema), tx.destination_table)
            try:
                target.start()
                for block in _chunks(items, _COPY_BLOCK):
                    lines: list[bytes] = []
                    for item in block:
                        if type(item) is bytes:
                            lines.append(item)
                            continue
                        target.send(lines)
                        loaded += target.end()
                        with cursor.copy(copy.copy_staging(tx.stage, tx.schema)) as out:
                            out.write(item.text)
                        staged += item.rows
                        target.start()
                    target.send(lines)
                loaded += target.end()
            except BaseException as exc:
                target.abort(exc)
                raise
        return loaded, staged


class RowsLoader:
    """Chunked ``executemany`` (MySQL/MariaDB, SQLite, Snowflake, PostgreSQL without COPY)."""

    name = "executemany"
    keeps_claims = False

    def stage(self, tx: RunTransaction, records: Iterable[Any], default_obs: datetime | None, *, batch_size: int,
              seen: SeenKeys, kept: KeptClaims | None, rejects: Rejects | None) -> int:
        """Column-staged rows by ``executemany`` in chunks of ``batch_size`` (claims are always staged)."""
        received = 0
        insert = tx.dialect.insert_staging(tx.stage, tx.schema).sql
        for chunk in _chunks(seen.watch(_rows(tx, records, default_obs, rejects)), batch_size):
            tx.conn.exec_driver_sql(insert, chunk)
            received += len(chunk)
        return received

    def load_direct(self, tx: RunTransaction, records: Iterable[Any], default_obs: datetime | None,
                    synced_at: datetime, *, batch_size: int, rejects: Rejects | None) -> tuple[int, int]:
        """The direct load without COPY (MySQL/MariaDB, SQLite, PostgreSQL without COPY): ``executemany`` of the
        dialect's :meth:`~.dialects.WarehouseDialect.insert_target` into the (empty, locked) target, in
        chunks of ``batch_size``, as the records arrive; return (loaded, staged).

        As :meth:`CopyLoader.load_direct`: a record whose record_ref may already have been loaded goes to staging
        (column-staged, ``executemany``) and is merged by :mod:`.settle`. No staging copy and no
        merge of the other records: MariaDB's first 200k sync 52 s -> 45 s, SQLite's writer 8.2 s -> 6.8 s
        (bench/README.md).
        """
        d = tx.dialect
        insert_target = d.insert_target(tx.table, tx.schema).sql
        insert_stage = d.insert_staging(tx.stage, tx.schema).sql
        run = (d.bind_timestamp(synced_at), tx.run_id)
        with_wire = d.wire_hash_column
        chunk: list[tuple[Any, ...]] = []
        pending: list[tuple[Any, ...]] = []  # possible repeats, column-staged (STAGE_COLUMNS order)
        loaded = staged = 0
        execute = tx.conn.exec_driver_sql
        rows = _rows(tx, records, default_obs, rejects)
        for row in SeenKeys().watch(rows, divert=pending, divert_limit=batch_size):
            if row is None:  # ``pending`` is full: stage it, to be merged after the last record
                execute(insert_stage, pending)
                staged += len(pending)
                pending.clear()
                continue
            if row[9] is None:  # a known row (no record hash): a claim on a stored row of an empty table
                raise tx.unverified(1)
            # STAGE_COLUMNS -> the target's written columns: the run's two columns after observed_at.
            chunk.append((*row[:9], *run, row[9], row[10]) if with_wire else (*row[:9], *run, row[9]))
            if len(chunk) >= batch_size:
                execute(insert_target, chunk)
                loaded += len(chunk)
                chunk = []
        if chunk:
            execute(insert_target, chunk)
            loaded += len(chunk)
        if pending:
            execute(insert_stage, pending)
            staged += len(pending)
        return loaded, staged


COPY_LOADER: Loader = CopyLoader()
ROWS_LOADER: Loader = RowsLoader()
