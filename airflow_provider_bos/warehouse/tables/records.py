"""Record -> row mapping: canonical JSON, the record hash, and the record's observation time.

A record is a :class:`~airflow_provider_bos.models.FederatedRecord` or a plain dict with the same
fields. The row holds every stored content field as canonical JSON text, ``sources`` as received.

The *content hash* (``_bos_record_hash``) decides whether a record changed. It is the SHA-256 of the
canonical JSON object of the content fields with ``sources`` taken as content, not as observation:
each provenance entry without its ``observed_at`` (BOS stamps every entry with the read's time, so
an unchanged person arrives re-stamped on every read), the entries sorted by their canonical JSON
(BOS merges by its identity rules and promises no order). Everything else is content: a provenance
``version``, ``capabilities`` (as listed), ``identity_match`` with its ``confidence``. Two records
have the same hash if and only if they hold the same content, however their observations moved.

One check, two encoders:

- :func:`_checked` is the one check of a record about to be stored (its key, its observation time,
  its text fields), raising :class:`BosWarehouseError` saying what is wrong;
- :func:`record_to_row` encodes any record with the stdlib (the canonical authority);
- the orjson encoder takes a dict whose class sets ``from_json = True`` (the MCP scanner's
  records: decoded from JSON text, so no NaN/Infinity and only string keys), byte-identical to the
  stdlib's, in the two forms the loads need: the whole document in one call
  (:func:`json_document_values`, document staging) or column by column
  (:func:`json_column_values`, the direct load and column staging). Where its output could
  differ (a tiny float, a str subclass, a value orjson refuses) it answers None and the record
  takes :func:`record_to_row`. :func:`document_values`, :func:`column_values` and
  :func:`row_values` make that choice for any record: the loads' encoders.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from hashlib import sha256
from typing import Any

import orjson
import sqlalchemy as sa

from airflow_provider_bos.exceptions import BosWarehouseError
from airflow_provider_bos.json_numbers import NumberBeyondDouble, may_be_respelt, numbers_by_value
from airflow_provider_bos.timestamps import parse_timestamp
from airflow_provider_bos.warehouse.tables.schema import RECORD_COLUMNS
from airflow_provider_bos.warehouse.tables.stored_json import JsonColumns
from airflow_provider_bos.wire import RefusedRecord

__all__ = [
    "CONTENT_COLUMNS",
    "CONTENT_FIELDS",
    "MAX_RECORD_REF_LENGTH",
    "RecordRow",
    "canonical_json",
    "column_values",
    "document_values",
    "hash_arguments",
    "json_column_values",
    "json_document_values",
    "parse_timestamp",
    "record_to_row",
    "row_fields",
    "row_values",
    "stored_json_columns",
    "stored_record",
]

MAX_RECORD_REF_LENGTH = 512
# The text columns of a provenance entry's row in ``<table>_sources`` (its VARCHAR(512) columns).
MAX_ENTRY_TEXT_LENGTH = 512
_ENTRY_TEXT_FIELDS = ("source_type", "source_identity", "external_id", "record_type", "version")
# An entry's values stored as long as BOS sent them (any other JSON value is rendered by the database).
_AS_SENT = (str, int, bool)
# The content fields in the records table's column order (its columns minus our _bos_ ones).
CONTENT_COLUMNS = tuple(c for c in RECORD_COLUMNS if not c.startswith("_bos_"))
# The content fields, in canonical (sorted) key order.
CONTENT_FIELDS = (
    "attributes",
    "display_name",
    "email",
    "identity_match",
    "lifecycle",
    "phone",
    "record_ref",
    "sources",
)
#: The content fields stored as JSON (a driver may hand them back as text).
JSON_CONTENT_FIELDS = ("lifecycle", "identity_match", "attributes", "sources")


def stored_record(row: Mapping[Any, Any], json_columns: JsonColumns) -> dict[str, Any]:
    """A stored row's content as the record that was stored (``json_columns``: how its table hands
    back its JSON columns, :func:`stored_json_columns`)."""
    return json_columns.row(row, CONTENT_FIELDS)


def stored_json_columns(table: sa.Table) -> JsonColumns:
    """How ``table`` (the records table or its history) hands back its JSON content columns."""
    return JsonColumns(table, JSON_CONTENT_FIELDS)


def _not_json(value: Any) -> Any:
    """What the encoders say of a value JSON cannot hold (``default``)."""
    if isinstance(value, NumberBeyondDouble):
        raise TypeError("a number beyond a 64-bit float's range, which no destination stores exactly")
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


_ENCODER = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False, check_circular=False,
    default=_not_json,
)
_encode_str = json.encoder.encode_basestring  # C accelerated; keeps non-ASCII characters


def _make_fast_encoder() -> Any:
    # json.dumps builds a new C encoder on every call; records are many and small, so build it once.
    # Same arguments JSONEncoder.iterencode passes; output is identical to _ENCODER.encode.
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    try:
        encoder = make(None, _ENCODER.default, _encode_str, None, ":", ",", True, False, False)
        probe = {"b": [1.5, None, True, "é"], "a": {}}
        if "".join(encoder(probe, 0)) != _ENCODER.encode(probe):
            return None
        return encoder
    except Exception:  # noqa: BLE001 - another CPython's signature: fall back to the stdlib path
        return None


_FAST_ENCODER = _make_fast_encoder()


def canonical_json(value: Any) -> str:
    """Canonical JSON text: sorted keys, no whitespace, UTF-8 characters kept, NaN refused, numbers
    spelt by value (:mod:`airflow_provider_bos.json_numbers`: ``1e+16`` as ``10000000000000000``)."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return _encode_str(value)
    text = _encoded(value)
    if ("e+" in text or "-0.0" in text) and may_be_respelt(text):
        return _encoded(numbers_by_value(value))
    return text


def _encoded(value: Any) -> str:
    if _FAST_ENCODER is not None and isinstance(value, dict | list):
        return "".join(_FAST_ENCODER(value, 0))
    return _ENCODER.encode(value)


def hash_arguments(arguments: Mapping[str, Any] | None) -> str:
    """SHA-256 hex of the canonical JSON of a read's arguments (for the audit table)."""
    return hashlib.sha256(canonical_json(dict(arguments or {})).encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class RecordRow:
    """One record as stored: JSON fields as canonical JSON text (``None`` for JSON null)."""

    record_ref: str
    display_name: str | None
    email: str | None
    phone: str | None
    lifecycle: str | None
    identity_match: str | None
    attributes: str
    sources: str
    observed_at: datetime  # aware, UTC
    record_hash: str

    @classmethod
    def from_columns(cls, data: Mapping[str, Any], values: tuple[Any, ...]) -> RecordRow:
        """The row of a wire record from its :func:`json_column_values`."""
        return cls(*row_fields(data, values))

    def column_values(self) -> tuple[Any, ...]:
        """:func:`json_column_values`'s tuple for this row (what the direct load's COPY lines take)."""
        parts = (
            _encode_str(self.record_ref).encode("utf-8"),
            _json_str(self.display_name).encode("utf-8"),
            _json_str(self.email).encode("utf-8"),
            _json_str(self.phone).encode("utf-8"),
            (self.lifecycle or "null").encode("utf-8"),
            (self.identity_match or "null").encode("utf-8"),
            self.attributes.encode("utf-8"),
            self.sources.encode("utf-8"),
        )
        return self.record_ref, parts, self.observed_at, self.record_hash, self.document.encode("utf-8")

    @property
    def document(self) -> str:
        """The stored document: the canonical JSON object of the content fields (sorted keys), ``sources``
        as received (the content hash takes them unstamped and sorted)."""
        return _document_text(
            self.attributes, self.display_name, self.email, self.identity_match or "null",
            self.lifecycle or "null", self.phone, self.record_ref, self.sources,
        )


def _document_text(
    attributes: str, display_name: str | None, email: str | None, identity_match: str, lifecycle: str,
    phone: str | None, ref: str, sources: str,
) -> str:
    # The canonical JSON object of CONTENT_FIELDS, assembled from already-canonical parts in sorted
    # key order: byte-identical to canonical_json({field: value, ...}) without serialising twice.
    return (
        f'{{"attributes":{attributes},"display_name":{_json_str(display_name)},'
        f'"email":{_json_str(email)},"identity_match":{identity_match},"lifecycle":{lifecycle},'
        f'"phone":{_json_str(phone)},"record_ref":{_encode_str(ref)},"sources":{sources}}}'
    )


class UnstorableRecord(BosWarehouseError):
    """A record the table cannot store, refused with a message that quotes one of its values;
    ``without_values`` says the same without it (what a quarantined record's reason is under a
    personal-data policy, see :mod:`.rejects`)."""

    def __init__(self, message: str, *, without_values: str) -> None:
        super().__init__(message)
        self.without_values = without_values


def _as_dict(record: Any) -> Mapping[str, Any]:
    if isinstance(record, Mapping):
        return record
    if type(record) is RefusedRecord:  # refused before the writer: its reason quotes no value
        raise UnstorableRecord(record.reason, without_values=record.reason)
    dump = getattr(record, "model_dump", None)
    if dump is None:
        raise BosWarehouseError(
            f"Cannot store a {type(record).__name__}: records must be FederatedRecord objects or dicts."
        )
    # Only the stored fields: mode="json" turns nested models into plain JSON values.
    fields: Mapping[str, Any] = dump(mode="json", include=set(CONTENT_FIELDS))
    return fields


def _json_str(value: str | None) -> str:
    return "null" if value is None else _encode_str(value)


_TS_CACHE: dict[str, datetime] = {}
# orjson's float text differs from repr() only for 0 < |x| < 1e-4 ("1e-05" vs "0.00001" or "1e-5"):
# such output holds "0.0000" or a digit followed by "e-"; those records take the general path, as do
# those with a number canonical_json spells by value (json_numbers.may_be_respelt).


# The hashed document: CONTENT_FIELDS in sorted order, each value canonical JSON (joined: bytes
# %-formatting of eight values cost ~1 us per record, a third more than a join).
_DOC_KEYS = tuple(b'%s"%s":' % (b"{" if i == 0 else b",", name.encode()) for i, name in enumerate(CONTENT_FIELDS))


_STAMP = "observed_at"


def _unstamped(entry: Any) -> Any:
    """A provenance entry without its observation stamp (anything else as it is)."""
    if type(entry) is dict or isinstance(entry, Mapping):
        return {k: v for k, v in entry.items() if k != _STAMP}
    return entry


def _content_sources_json(sources: Any) -> bytes | None:
    """``sources`` as the content hash takes it (orjson): unstamped entries in sorted canonical order;
    None where orjson declines (the caller takes the general path)."""
    dumps, opt = orjson.dumps, orjson.OPT_SORT_KEYS
    try:
        entries = sorted(dumps(_unstamped(e), option=opt) for e in sources)
    except TypeError:
        return None
    return b"[" + b",".join(entries) + b"]"


def _content_sources_text(sources: Any) -> str:
    """:func:`_content_sources_json` with the stdlib encoder (the canonical authority)."""
    if not isinstance(sources, list):
        return canonical_json(sources)
    entries = sorted(canonical_json(_unstamped(e)).encode("utf-8") for e in sources)
    return "[" + ",".join(e.decode("utf-8") for e in entries) + "]"


def _checked(data: Mapping[str, Any], default_observed_at: str | datetime | None) -> tuple[str, datetime, bool]:
    """``(record_ref, observed_at, plain)`` of a record about to be stored: THE check of its shape.

    ``observed_at`` is the latest ``sources[].observed_at`` (UTC), or ``default_observed_at`` when
    no source carries one. ``plain``: the key and text fields are exactly ``str`` and ``sources``
    exactly a list (a subclass could serialise differently: the orjson encoder then declines).
    Exact-type tests first: this runs once per record on the fast paths.

    :raises BosWarehouseError: missing/oversized ``record_ref``, ``sources`` not a list, an
        unparseable timestamp, no observation time at all, a text field that is not a string.
    """
    get = data.get
    ref = get("record_ref")
    if (type(ref) is not str and not isinstance(ref, str)) or not ref:
        raise BosWarehouseError("A record has no record_ref (a non-empty string is required).")
    if len(ref) > MAX_RECORD_REF_LENGTH:
        raise BosWarehouseError(
            f"A record_ref is {len(ref)} characters long; the warehouse key holds at most "
            f"{MAX_RECORD_REF_LENGTH}. First characters: {ref[:60]!r}"
        )
    sources = get("sources")
    if type(sources) is not list and not isinstance(sources, list):
        raise BosWarehouseError(f"Record {ref!r}: 'sources' must be a list.")
    observed: datetime | None = None
    cache = _TS_CACHE
    for entry in sources:
        stamp = entry.get("observed_at") if type(entry) is dict or isinstance(entry, Mapping) else None
        if stamp is None:
            continue
        parsed = cache.get(stamp) if type(stamp) is str else None
        if parsed is None:
            try:
                parsed = parse_timestamp(stamp)
            except ValueError:
                raise UnstorableRecord(
                    f"Record {ref!r}: sources[].observed_at {str(stamp)[:40]!r} is not an ISO 8601 timestamp.",
                    without_values=f"Record {ref!r}: a sources[].observed_at is not an ISO 8601 timestamp.",
                ) from None
            if type(stamp) is str and len(cache) < 4096:
                cache[stamp] = parsed
        if observed is None or parsed > observed:
            observed = parsed
    if observed is None:
        if default_observed_at is None:
            raise BosWarehouseError(
                f"Record {ref!r} has no sources[].observed_at and the read gave no observed_at to fall back on."
            )
        observed = parse_timestamp(default_observed_at)
    display_name, email, phone = get("display_name"), get("email"), get("phone")
    plain = (
        type(ref) is str and type(sources) is list and (display_name is None or type(display_name) is str)
        and (email is None or type(email) is str) and (phone is None or type(phone) is str)
    )
    if not plain:
        for name, value in (("display_name", display_name), ("email", email), ("phone", phone)):
            if value is not None and not isinstance(value, str):
                raise BosWarehouseError(f"Record {ref!r}: field {name!r} must be a string or null.")
    return ref, observed, plain


def _check_entry_texts(ref: str, sources: Any, serialised_length: int) -> None:
    """Refuse a record whose provenance entry holds a text longer than the provenance table's columns,
    as any record the table cannot store (``invalid_records``), instead of failing the run's write.

    A string is stored as it is; any other value as the database renders its JSON, which may be longer
    than the compact JSON BOS sent: PostgreSQL writes a space after every comma and colon and every
    number without an exponent. So such a value's widest rendering is measured, the same on every
    destination. ``serialised_length``: of ``sources`` as JSON text; no string, integer or boolean
    in it is longer as stored."""
    short = serialised_length <= MAX_ENTRY_TEXT_LENGTH
    for index, entry in enumerate(sources):
        if type(entry) is not dict and not isinstance(entry, Mapping):  # the exact type first: once per entry
            continue
        get = entry.get
        for name in _ENTRY_TEXT_FIELDS:
            value = get(name)
            if value is None or (short and type(value) in _AS_SENT):
                continue
            length = len(value) if isinstance(value, str) else _rendered_length(value)
            if length > MAX_ENTRY_TEXT_LENGTH:
                shown = "" if isinstance(value, str) else " as the database writes its JSON"
                message = (
                    f"Record {ref!r}: sources[{index}].{name} is {length} characters long{shown}; the provenance "
                    f"table holds at most {MAX_ENTRY_TEXT_LENGTH}. Ask BOS why a source's {name} is that long; "
                    "meanwhile invalid_records='quarantine' keeps the record in the rejects table and stores the "
                    "others."
                )
                raise UnstorableRecord(message, without_values=message)


def _rendered_length(value: Any) -> int:
    """The length of ``value``'s JSON as the widest database renders it (", " and ": " between items,
    numbers positional); past :data:`MAX_ENTRY_TEXT_LENGTH` it stops counting."""
    length, pending = 0, [value]
    while pending and length <= MAX_ENTRY_TEXT_LENGTH:
        item = pending.pop()
        if isinstance(item, str):
            length += len(json.dumps(item, ensure_ascii=False))
        elif item is None or item is True:
            length += 4
        elif item is False:
            length += 5
        elif isinstance(item, int):
            # more digits than a column holds: not written out (str() refuses past 4,300 digits)
            length += len(str(item)) if item.bit_length() < 2048 else MAX_ENTRY_TEXT_LENGTH + 1
        elif isinstance(item, float):
            length += len(format(Decimal(repr(item)), "f"))
        elif isinstance(item, Mapping):
            length += 4 * len(item) if item else 2  # braces, ": " per key, ", " between
            pending.extend(map(str, item.keys()))
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            length += 2 * len(item) if item else 2  # brackets, ", " between
            pending.extend(item)
        else:
            length += len(canonical_json(item))
    return length


def _tiny_float(document: bytes) -> bool:
    """True if ``document`` may hold a float orjson formats differently from the stdlib encoder."""
    if b"0.0000" in document:
        return True
    i = document.find(b"e-")
    while i > 0:
        if 0x30 <= document[i - 1] <= 0x39:
            return True  # "1e-07" (orjson) vs "1e-7"
        i = document.find(b"e-", i + 2)
    return False


def json_document_values(data: Mapping[str, Any], default_observed_at: datetime | None) -> tuple[Any, ...] | None:
    """``(record_ref, document, observed_at, record_hash)`` of a JSON-decoded record, via orjson.

    ``document`` is :attr:`RecordRow.document` as UTF-8 bytes, serialised in ONE call (the
    column-per-value form costs eight); the database derives the columns from it (PostgreSQL's
    document staging). ``None`` means "take the general path" (:func:`record_to_row`).

    :raises BosWarehouseError: the record fails :func:`_checked`.
    """
    ref, observed, plain = _checked(data, default_observed_at)
    if not plain:
        return None
    head = {name: data.get(name) for name in CONTENT_FIELDS[:-1]}
    if head["attributes"] is None:
        head["attributes"] = {}
    sources = data.get("sources")
    dumps, opt = orjson.dumps, orjson.OPT_SORT_KEYS
    try:
        head_json = dumps(head, option=opt)[:-1]  # without its closing brace: "sources" sorts last
        sources_json = dumps(sources, option=opt)
    except TypeError:  # out-of-range int, lone surrogate, non-string key, non-JSON value
        return None
    _check_entry_texts(ref, sources, len(sources_json))
    content_sources = _content_sources_json(sources)
    if content_sources is None:
        return None
    document = b"".join((head_json, b',"sources":', sources_json, b"}"))
    if _tiny_float(document) or may_be_respelt(document):
        return None
    hashed = b"".join((head_json, b',"sources":', content_sources, b"}"))
    return ref, document, observed, sha256(hashed).hexdigest()


def json_column_values(data: Mapping[str, Any], default_observed_at: datetime | None) -> tuple[Any, ...] | None:
    """A JSON-decoded record's stored columns as canonical JSON bytes, via orjson.

    ``(record_ref, parts, observed_at, record_hash, document)``; ``parts`` holds the
    :data:`CONTENT_COLUMNS` values as canonical JSON (``b"null"`` for null), ``document`` the hashed
    text assembled from them. ``None`` means "take the general path" (:meth:`RecordRow.column_values`
    of :func:`record_to_row` gives the same for any record).

    :raises BosWarehouseError: the record fails :func:`_checked`.
    """
    ref, observed, plain = _checked(data, default_observed_at)
    if not plain:
        return None
    get = data.get
    attributes = get("attributes")
    if attributes is None:
        attributes = {}
    dumps, opt = orjson.dumps, orjson.OPT_SORT_KEYS
    try:
        parts = (
            dumps(ref), dumps(get("display_name")), dumps(get("email")), dumps(get("phone")),
            dumps(get("lifecycle"), option=opt), dumps(get("identity_match"), option=opt),
            dumps(attributes, option=opt), dumps(get("sources"), option=opt),
        )
    except TypeError:  # out-of-range int, lone surrogate, non-JSON value
        return None
    _check_entry_texts(ref, get("sources"), len(parts[7]))
    content_sources = _content_sources_json(get("sources"))
    if content_sources is None:
        return None
    ref_json, display_name, email, phone, lifecycle, identity_match, attributes_json, sources = parts
    k = _DOC_KEYS
    head = b"".join((
        k[0], attributes_json, k[1], display_name, k[2], email, k[3], identity_match, k[4], lifecycle, k[5], phone,
        k[6], ref_json, k[7],
    ))
    document = b"".join((head, sources, b"}"))
    if _tiny_float(document) or may_be_respelt(document):
        return None
    return ref, parts, observed, sha256(b"".join((head, content_sources, b"}"))).hexdigest(), document


def row_fields(data: Mapping[str, Any], values: tuple[Any, ...]) -> tuple[Any, ...]:
    """:class:`RecordRow`'s fields, as a tuple, from a record's :func:`json_column_values` (the
    JSON columns as text; no dataclass built: column staging takes the tuple)."""
    ref, parts, observed, record_hash, _ = values
    get = data.get
    lifecycle, identity_match = parts[4], parts[5]
    return (
        ref,
        get("display_name"),
        get("email"),
        get("phone"),
        None if lifecycle == b"null" else lifecycle.decode(),
        None if identity_match == b"null" else identity_match.decode(),
        parts[6].decode(),
        parts[7].decode(),
        observed,
        record_hash,
    )


def document_values(record: Any, default_observed_at: datetime | None) -> tuple[Any, ...]:
    """:func:`json_document_values`'s tuple for any record (document staging's encoder)."""
    if getattr(record, "from_json", False):
        values = json_document_values(record, default_observed_at)
        if values is not None:
            return values
    row = record_to_row(record, default_observed_at=default_observed_at)
    return row.record_ref, row.document.encode("utf-8"), row.observed_at, row.record_hash


def column_values(record: Any, default_observed_at: datetime | None) -> tuple[Any, ...]:
    """:func:`json_column_values`'s tuple for any record (the direct load's and the staged file's encoder)."""
    if getattr(record, "from_json", False):
        values = json_column_values(record, default_observed_at)
        if values is not None:
            return values
    return record_to_row(record, default_observed_at=default_observed_at).column_values()


def row_values(record: Any, default_observed_at: datetime | None) -> tuple[Any, ...]:
    """:class:`RecordRow`'s fields of any record, as :func:`row_fields` gives them (column staging's encoder)."""
    if getattr(record, "from_json", False):
        values = json_column_values(record, default_observed_at)
        if values is not None:
            return row_fields(record, values)
    row = record_to_row(record, default_observed_at=default_observed_at)
    return (row.record_ref, row.display_name, row.email, row.phone, row.lifecycle, row.identity_match,
            row.attributes, row.sources, row.observed_at, row.record_hash)


def record_to_row(record: Any, *, default_observed_at: datetime | None = None, stored: bool = False) -> RecordRow:
    """Map one record to its stored row.

    ``observed_at`` is the latest ``sources[].observed_at`` (UTC); when no source carries one, it is
    ``default_observed_at`` (the read's ``metadata.observed_at``). ``stored``: the record is a row the
    table holds already (rewritten in place): what only a read's records are refused for, a
    provenance entry longer than its columns, is not checked again.

    :raises BosWarehouseError: missing/oversized ``record_ref``, unparseable timestamps, values that
        are not JSON, or no observation time at all.
    """
    if getattr(record, "from_json", False) and isinstance(record, dict):
        values = json_column_values(record, default_observed_at)
        if values is not None:
            return RecordRow.from_columns(record, values)
    data = _as_dict(record)
    ref, observed, _ = _checked(data, default_observed_at)
    attributes = data.get("attributes")
    if attributes is None:
        attributes = {}
    display_name, email, phone = data.get("display_name"), data.get("email"), data.get("phone")
    try:
        lifecycle = canonical_json(data.get("lifecycle"))
        identity_match = canonical_json(data.get("identity_match"))
        attributes_text = canonical_json(attributes)
        sources_text = canonical_json(data.get("sources"))
        hashed_sources = _content_sources_text(data.get("sources"))
    except RecursionError:  # a record handed over in Python may nest any depth
        message = f"Record {ref!r} holds a value nested too deep to store (the encoder follows about 1,000 levels)."
        raise UnstorableRecord(message, without_values=message) from None
    except (TypeError, ValueError) as exc:
        raise UnstorableRecord(f"Record {ref!r} holds a value that is not JSON: {exc}",
                               without_values=f"Record {ref!r} holds a value that is not JSON "
                                              f"({type(exc).__name__}).") from None
    if not stored:
        _check_entry_texts(ref, data.get("sources"), len(sources_text))
    hashed = _document_text(
        attributes_text, display_name, email, identity_match, lifecycle, phone, ref, hashed_sources
    )
    record_hash = hashlib.sha256(hashed.encode("utf-8")).hexdigest()

    return RecordRow(
        record_ref=ref,
        display_name=display_name,
        email=email,
        phone=phone,
        lifecycle=None if lifecycle == "null" else lifecycle,
        identity_match=None if identity_match == "null" else identity_match,
        attributes=attributes_text,
        sources=sources_text,
        observed_at=observed,
        record_hash=record_hash,
    )
