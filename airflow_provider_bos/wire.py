"""What the read (mcp/) and the record sink (warehouse/) agree on, and nothing else.

- :class:`WireRecord`: a record decoded from the final frame's JSON text; :func:`check_record` is
  the one structural check a wire record passes before anyone stores it.
- Wire hashes (:func:`wire_hash`): the *wire hash* of a record is the SHA-256 (hex) of the exact
  bytes of its JSON element in the final frame's records array, with the value of every
  ``sources[].observed_at`` blanked: BOS stamps each provenance entry with the read's time, so an
  unchanged person arrives re-stamped on every read. Identical masked bytes mean identical content,
  so a record whose wire hash the sink already stores is unchanged without decoding it (the
  converse does not hold: a server may re-order keys or entries, so the content hash
  ``_bos_record_hash`` stays the authority).
  The sink says which hashes it stores through :class:`KnownWireHashes`; the read hands back a
  :class:`KnownRecord` claim carrying the sink's opaque handle, never looking into it.
- The Protocols :func:`airflow_provider_bos.sync.run_sync` is typed against: :class:`FederatedRead`
  (a callable returning a :class:`StreamingRead`) and :class:`RecordSink` (the warehouse writer),
  with :class:`WriteOptions`, what one run asks of the sink.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from hashlib import sha256
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from airflow_provider_bos.exceptions import BosConfigurationError, BosResultError
from airflow_provider_bos.pii.fingerprint import PolicyFingerprint
from airflow_provider_bos.timestamps import parse_timestamp

if TYPE_CHECKING:
    from airflow_provider_bos.warehouse.tables.attribute_columns import AttributeColumns

__all__ = [
    "INVALID_RECORDS_MODES",
    "ReconcileOptions",
    "SYNC_MODES",
    "DELETIONS_MODES",
    "RETIRE_GUARD_ACTIONS",
    "check_reconcile",
    "check_invalid_records",
    "FederatedRead",
    "KnownRecord",
    "KnownWireHashes",
    "RefusedRecord",
    "ReadObservations",
    "RecordSink",
    "RunInfo",
    "StreamingRead",
    "WireRecord",
    "WriteCounts",
    "WriteOptions",
    "check_record",
    "latest_stamp",
    "wire_hash",
]


_SOURCES_KEY = b'"sources"'
_SOURCES_START = b'"sources":[{'
_STAMP_KEY = b'"observed_at":"'
_KEY_OPENERS = b"{,"
# Whitespace before a "]": a pretty-printed array, whose end "}]" does not mark.
_SPACED_CLOSE = re.compile(rb"[ \t\r\n]\]")
# A letter of "sources" written as a \u escape: the record may name its sources with a key the byte
# search does not see, and a "sources" it does see may be another one, inside a value.
_ESCAPED_LETTER = re.compile(rb"\\u00(?:7[235]|6[35fF])")


def wire_hash(element: bytes | bytearray, stamps: list[bytes | bytearray] | None = None) -> str:
    """The wire hash of a record's exact JSON bytes: SHA-256 with every provenance stamp blanked.

    Only the ``observed_at`` values of the entries of the record's ``sources`` array are blanked (an
    attribute of that name is content, and so is one inside an entry's object: see :func:`_nested`).
    The array is found in C calls, no parse: the record names "sources" once, compactly
    (``"sources":[{``), and the array's end is the first ``}]`` after it (a ``}]`` inside a string
    only ends the masked span early). Anything else is hashed as sent,
    which only costs the shortcut, never a missed change. ``stamps``: given, it receives the
    blanked stamps' bytes (none where nothing was blanked), for :func:`latest_stamp`.
    """
    start = element.find(_SOURCES_START)
    if start < 0 or element.count(_SOURCES_KEY) != 1 or (b"\\u00" in element and _ESCAPED_LETTER.search(element)):
        return sha256(element).hexdigest()
    start += len(_SOURCES_START) - 2
    end = element.find(b"}]", start) + 2
    if end < start or _SPACED_CLOSE.search(element, start, end) is not None or _nested(element, start, end):
        return sha256(element).hexdigest()
    digest = sha256()
    kept = 0
    stamp = element.find(_STAMP_KEY, start, end)
    while stamp >= 0:
        value = stamp + len(_STAMP_KEY)
        close = element.find(b'"', value, end)
        # An escape inside a stamp, or a key only ending in "observed_at (its quote escaped, so not
        # after the "{" or "," an entry's own key follows): not one of BOS's stamps.
        if close < 0 or element[close - 1] == 0x5C or element[stamp - 1] not in _KEY_OPENERS:
            if stamps is not None:
                stamps.clear()
            return sha256(element).hexdigest()
        digest.update(element[kept:value])
        if stamps is not None:
            stamps.append(element[value:close])
        kept = close
        stamp = element.find(_STAMP_KEY, close, end)
    digest.update(element[kept:])
    return digest.hexdigest()


def _nested(element: bytes | bytearray, start: int, end: int) -> bool:
    """Whether the array at ``start`` may hold an object inside an entry: some ``{`` in it other than
    an entry's opening one (the first, or one right after ``},``). Only an entry's own ``observed_at``
    is BOS's stamp; one in an object of an extra key is content, so such a record is hashed as sent
    (a ``{`` inside a string only costs the shortcut)."""
    brace = element.find(b"{", start + 2, end)
    while brace >= 0:
        if element[brace - 2:brace] != b"},":
            return True
        brace = element.find(b"{", brace + 1, end)
    return False


def latest_stamp(stamps: list[bytes | bytearray]) -> datetime | None:
    """The latest of the stamps :func:`wire_hash` blanked in a record: its observation time.

    None where it blanked none (another shape, an escaped stamp): the bytes, stamps included, are
    then those of the stored row they match, whose observation time is exact.

    :raises ValueError: a stamp that is not an ISO 8601 timestamp.
    """
    latest: datetime | None = None
    for raw in stamps:
        observed = parse_timestamp(raw.decode("utf-8"))  # cached: a result shares a few stamps
        if latest is None or observed > latest:
            latest = observed
    return latest


class WireRecord(dict[str, Any]):
    """A record decoded from the wire's JSON text (a plain dict otherwise).

    ``from_json = True`` tells the warehouse it holds no NaN/Infinity and only string keys, so it
    may take its orjson fast path. ``wire_hash``: the record's wire hash, when the scanner cut its
    exact bytes (unset for records built any other way: read it with ``getattr(r, "wire_hash", None)``).
    """

    __slots__ = ("wire_hash",)
    wire_hash: str
    from_json = True


class KnownWireHashes(Protocol):
    """The wire hashes a record sink already stores, as a read may match records against them.

    The sink implements it; the read only asks :meth:`match` and hands the answer back inside a
    :class:`KnownRecord`, never looking into it.
    """

    def match(self, wire_hash: str) -> object | None:
        """An opaque handle of the stored row(s) with this wire hash, or None if there is none."""
        ...

    def __len__(self) -> int:
        """How many hashes are stored (a read does not consult an empty set)."""
        ...


class RefusedRecord:
    """A final record refused before the writer (the personal-data policy cannot store it): its ref
    and why, without any of its values. The writer treats it as a record it cannot encode: it
    quarantines it (``invalid_records="quarantine"``) or fails the run with ``reason``."""

    __slots__ = ("reason", "record_ref")

    def __init__(self, record_ref: str | None, reason: str) -> None:
        self.record_ref = record_ref
        self.reason = reason

    def __repr__(self) -> str:
        return f"RefusedRecord({self.record_ref!r})"


class KnownRecord:
    """A record NOT decoded because its wire hash is one the warehouse already stores.

    Only a claim: the warehouse must confirm that the stored row it matched still holds these bytes
    before counting it unchanged (a join on ``record_ref`` and ``wire_hash``, or a table state
    unchanged since ``matched`` was read), and fail the run otherwise (the record's content is not
    here to write).
    """

    __slots__ = ("record_ref", "wire_hash", "matched", "handle", "observed_at")

    def __init__(
        self, record_ref: str, wire_hash: str, matched: KnownWireHashes | None = None, handle: object = None,
        observed_at: datetime | None = None,
    ) -> None:
        self.record_ref = record_ref
        self.wire_hash = wire_hash
        #: The :class:`KnownWireHashes` it was matched in, and the opaque handle its ``match`` gave.
        self.matched = matched
        self.handle = handle
        #: Its own latest provenance stamp (:func:`latest_stamp`; the wire hash leaves stamps out, so
        #: the stored row's may be older): a duplicate ``record_ref`` is resolved by it. None: the
        #: stored row's.
        self.observed_at = observed_at

    def __repr__(self) -> str:
        return f"KnownRecord({self.record_ref!r}, {self.wire_hash[:12]}...)"


def check_record(raw: Any, index: int, where: str) -> WireRecord:
    """The structural check of one wire record: the fields the warehouse relies on.

    A non-empty string ``record_ref`` and a non-empty ``sources`` list whose entries each carry an
    ``observed_at`` string (the warehouse's own mapping checks types and timestamps in full while
    it encodes). A :class:`KnownRecord` passes as it is: its bytes are those of a stored record.

    :raises BosResultError: saying which record (``index``, at ``where``) is wrong, and how.
    """
    if type(raw) is KnownRecord:
        return raw  # type: ignore[return-value]
    if not isinstance(raw, dict):
        raise BosResultError(f"Record {index} at {where} is not an object.")
    ref = raw.get("record_ref")
    if not isinstance(ref, str) or not ref:
        raise BosResultError(f"Record {index} at {where} has no record_ref.")
    sources = raw.get("sources")
    if not isinstance(sources, list) or not sources:
        raise BosResultError(f"Record {index} ({ref[:80]!r}) at {where} has no sources (a non-empty list is required).")
    for entry in sources:
        if not isinstance(entry, dict) or not isinstance(entry.get("observed_at"), str):
            raise BosResultError(
                f"Record {index} ({ref[:80]!r}) at {where} has a provenance entry without observed_at."
            )
    return raw if type(raw) is WireRecord else WireRecord(raw)


# --- what run_sync needs from a read --------------------------------------------------------------


class ReadObservations(Protocol):
    """The read's provisional per-source observations (page notifications), for the audit row."""

    provisional_records: int
    pages: int
    stream_resumptions: int

    def summary(self) -> list[dict[str, Any]]: ...


class StreamingRead(Protocol):
    """A final result whose records stream from the still-open response (``McpSession``'s
    ``StreamingFinalResult``).

    ``records`` is consumed once; ``completeness``, ``is_error``, ``metadata``, ``context``,
    ``warnings``, ``contradictions``, ``source_errors`` and ``result_count`` are readable once it
    is exhausted. ``contradictions``: the warnings that forbid trusting the result as complete.
    """

    observations: ReadObservations

    @property
    def records(self) -> Iterator[Any]: ...

    def use_known_wire_hashes(self, known: KnownWireHashes) -> bool:
        """Let records whose wire hash ``known`` matches through undecoded; False if it cannot."""
        ...

    @property
    def known_records(self) -> int: ...

    @property
    def complete(self) -> bool: ...

    # End-of-frame fields (declared as attributes: the mcp side defers them until the frame ends).
    completeness: str
    is_error: bool
    metadata: Any
    context: Any
    warnings: list[str]
    contradictions: list[str]

    @property
    def source_errors(self) -> list[Any]: ...

    @property
    def result_count(self) -> int | None: ...

    def close(self) -> None: ...

    def __enter__(self) -> Any: ...

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None,
    ) -> Any: ...


class FederatedRead(Protocol):
    """``McpSession.federated_read`` (or ``BosHook``'s), as run_sync calls it.

    The keyword options are the ones run_sync passes on (its own ``read_options``); a read must
    accept each of them, so an implementation that drops one fails the type check.
    """

    def __call__(
        self,
        tool_name: str,
        arguments: dict[str, Any],
        *,
        stream_records: bool,
        on_context: Callable[[str], None] | None = ...,
        context_handle: str | None = ...,
        via: str = ...,
        stream: bool = ...,
        on_progress: Callable[[Any], None] | None = ...,
        deadline_s: float | None = ...,
    ) -> Any:
        """A :class:`StreamingRead` when ``stream_records`` is True; ``on_context`` is called once
        with the context the read runs in, as soon as it is known."""
        ...


# --- what run_sync needs from a record sink ---------------------------------------------------------


class RunInfo(Protocol):
    """The identity of one sync run (``warehouse.SyncRunInfo``); the read's context is noted on it."""

    run_id: str
    context_handle: str | None


class WriteCounts(Protocol):
    """What a run did to the records table (``warehouse.UpsertCounts``)."""

    inserted: int
    updated: int
    unchanged: int
    skipped_stale: int
    duplicates: int
    rejected: int
    retired: int
    superseded: int
    #: Rows a complete full read would have retired, kept current by ``max_retire_fraction``.
    retire_withheld: int
    #: Records of a partial read under refs a complete read merged away (not revived).
    withheld: int


#: ``WriteOptions.invalid_records`` (and the operator's option of that name).
INVALID_RECORDS_MODES = ("fail", "quarantine")


def check_invalid_records(mode: Any) -> str:
    """``mode`` if it is ``"fail"`` or ``"quarantine"``; else :class:`BosConfigurationError`."""
    if not isinstance(mode, str) or mode not in INVALID_RECORDS_MODES:
        raise BosConfigurationError(
            f"invalid_records must be one of {INVALID_RECORDS_MODES}, not {str(mode)[:40]!r}."
        )
    return mode


#: ``ReconcileOptions.sync_mode`` and ``.deletions`` (and the operator's options of those names).
SYNC_MODES = ("incremental", "full")
DELETIONS_MODES = ("soft", "hard")
#: What a complete full read does when its retirements pass ``max_retire_fraction``.
RETIRE_GUARD_ACTIONS = ("fail", "ask")


@dataclass(frozen=True, slots=True)
class ReconcileOptions:
    """How a run reconciles the table with what the read returned (see docs/sync-modes.md).

    ``sync_mode``: ``"incremental"`` (upserts; supersession only) or ``"full"`` (the read returns
    every record of its scope: a complete one retires the scope's rows it did not return).
    ``scope``: the scope's name when the read's arguments change from run to run (default: the
    BOS resource, context, tool and arguments). ``resource``: the BOS resource the scope names.
    ``deletions``: ``"soft"`` (``_bos_deleted_at`` set) or ``"hard"`` (rows deleted).
    ``max_retire_fraction``: a complete full read that would retire more than this fraction of its
    scope's current rows retires nothing and is audited ``partial`` (None: no guard).
    ``on_retire_guard``: ``"fail"`` (that) or ``"ask"``: the run stays ``complete`` and holds those
    retirements in ``<table>_pending_retirements`` for a person to approve or reject.
    ``history``: keep every version in ``<table>_history``. ``adopt_unscoped_rows``: a full read
    may also retire rows written before scopes existed by runs of the same read (same connection,
    context, tool and, without ``scope``, arguments hash in their audit row).
    """

    sync_mode: str = "incremental"
    scope: str | None = None
    resource: str | None = None
    deletions: str = "soft"
    max_retire_fraction: float | None = 0.5
    history: bool = False
    adopt_unscoped_rows: bool = False
    on_retire_guard: str = "fail"


def check_reconcile(
    *, sync_mode: Any = "incremental", scope: Any = None, deletions: Any = "soft", max_retire_fraction: Any = 0.5,
    history: Any = False, adopt_unscoped_rows: Any = False, resource: str | None = None,
    on_retire_guard: Any = "fail",
) -> ReconcileOptions:
    """The :class:`ReconcileOptions` of these values; :class:`BosConfigurationError` saying what to fix."""
    if not isinstance(sync_mode, str) or sync_mode not in SYNC_MODES:
        raise BosConfigurationError(f"sync_mode must be one of {SYNC_MODES}, not {str(sync_mode)[:40]!r}.")
    if not isinstance(deletions, str) or deletions not in DELETIONS_MODES:
        raise BosConfigurationError(f"deletions must be one of {DELETIONS_MODES}, not {str(deletions)[:40]!r}.")
    if scope is not None and (not isinstance(scope, str) or not scope.strip() or len(scope) > 200):
        raise BosConfigurationError(
            "scope must be a non-empty name of at most 200 characters (e.g. 'people-nightly'), or None "
            "for the read's own scope (BOS resource, context, tool, arguments)."
        )
    if max_retire_fraction is not None and (
        isinstance(max_retire_fraction, bool) or not isinstance(max_retire_fraction, int | float)
        or not 0 <= max_retire_fraction <= 1
    ):
        raise BosConfigurationError(
            f"max_retire_fraction must be a number from 0 to 1 (or None to turn the guard off), "
            f"not {str(max_retire_fraction)[:40]!r}."
        )
    if not isinstance(on_retire_guard, str) or on_retire_guard not in RETIRE_GUARD_ACTIONS:
        raise BosConfigurationError(
            f"on_retire_guard must be one of {RETIRE_GUARD_ACTIONS}, not {str(on_retire_guard)[:40]!r}: 'fail' "
            "retires nothing past max_retire_fraction and audits the run partial; 'ask' holds those "
            "retirements for a person to approve (operators/retirement_approval.py)."
        )
    for name, value in (("history", history), ("adopt_unscoped_rows", adopt_unscoped_rows)):
        if not isinstance(value, bool):
            raise BosConfigurationError(f"{name} must be True or False, not {str(value)[:40]!r}.")
    return ReconcileOptions(
        sync_mode=sync_mode, scope=scope, resource=resource, deletions=deletions,
        max_retire_fraction=None if max_retire_fraction is None else float(max_retire_fraction),
        history=history, adopt_unscoped_rows=adopt_unscoped_rows, on_retire_guard=on_retire_guard,
    )


@dataclass(frozen=True, slots=True)
class WriteOptions:
    """How one run is written (the per-call options of :meth:`RecordSink.write_run`).

    ``audit``: the audit row's fields (``status``, ``completeness``, ``result_count``,
    ``source_errors``, ``source_summary``, ``provisional_records``, ``provisional_pages``), or a
    callable returning them once every record is consumed (a streamed final frame's fields exist
    only then); it runs inside the run's transaction, so raising there rolls everything back.
    ``known``: the sink's own :meth:`RecordSink.known_wire_hashes` the read matched its
    :class:`KnownRecord` claims against. ``default_observed_at``: a record's observation time when
    none of its sources carries one (the read's ``metadata.observed_at``). ``invalid_records``:
    ``"fail"`` (a record the table cannot store rolls the run back) or ``"quarantine"`` (it goes
    to the rejects table ``<table>_rejects`` and the run is ``partial``). The audit fields may
    also carry ``observed_at``, the read's observation time (``metadata.observed_at``): a full read
    never retires a row observed after it.
    """

    audit: Mapping[str, Any] | Callable[[], Mapping[str, Any]]
    known: KnownWireHashes | None = None
    default_observed_at: str | datetime | None = None
    invalid_records: str = "fail"
    #: Retire, supersede and history (:class:`ReconcileOptions`; the default: incremental, no history).
    reconcile: ReconcileOptions = ReconcileOptions()
    #: The personal-data policy the run's records were written under (None: none); the table
    #: remembers it and refuses another (:mod:`airflow_provider_bos.pii`).
    pii: PolicyFingerprint | None = None
    #: Columns of the records table whose coverage (how many of the run's rows have a value) the audit
    #: row records besides ``display_name``, ``email`` and ``phone`` (see warehouse/run/coverage.py).
    coverage_columns: tuple[str, ...] = ()

    #: Chosen ``attributes`` paths kept as typed columns of the records table (None: none); see
    #: :mod:`airflow_provider_bos.warehouse.tables.attribute_columns`.
    attribute_columns: AttributeColumns | None = None

    @property
    def promoted_columns(self) -> tuple[str, ...]:
        """The promoted columns' names (e.g. for per-column counts of the run's rows)."""
        return self.attribute_columns.names if self.attribute_columns is not None else ()


class RecordSink(Protocol):
    """Where a sync's records and audit row land (``WarehouseWriter``)."""

    def require_pii_policy(self, fingerprint: PolicyFingerprint | None) -> None:
        """Raise :class:`~airflow_provider_bos.pii.PiiPolicyMismatch`, writing nothing, when the table
        was written under another personal-data policy or key than ``fingerprint`` (None: the run has
        no policy; a table with rows and no stored policy counts as written without one, an empty one
        adopts the run's). :func:`airflow_provider_bos.sync.run_sync` calls it before the read."""
        ...

    def known_wire_hashes(self) -> KnownWireHashes:
        """The wire hashes already stored (read on a thread while the read starts)."""
        ...

    def write_run(self, run: Any, records: Iterator[Any], options: WriteOptions) -> WriteCounts:
        """Land ``records`` and one audit row in one transaction; return the counts.

        ``records`` may raise :class:`~airflow_provider_bos.exceptions.BosFinalFrameRestarted`
        (a resumed stream sends the final frame again): the sink discards, inside the same
        transaction, every record it took, and goes on with the exception's ``records``.
        """
        ...

    def record_failure(
        self, run: Any, *, error: str, source_summary: list[Any] | None = None, provisional_records: int = 0,
        provisional_pages: int = 0,
    ) -> None:
        """Write a ``failed`` audit row in its own small transaction."""
        ...
