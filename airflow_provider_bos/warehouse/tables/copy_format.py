"""COPY text-format encoders (PostgreSQL): document-staged rows and the target's written columns.

Text format: one line per row, tab-separated, ``\\N`` for NULL, and backslash, tab, newline and
carriage return escaped. Built here, in blocks, because per-row ``write_row()`` of eleven columns
was a third of the client's staging time.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any

import orjson

__all__ = ["TargetCopyLines", "copy_document_lines"]


_COPY_SPECIAL = re.compile(rb"[\\\t\n\r]")


def _copy_text(value: bytes) -> bytes:
    """A value in COPY text format: backslash, tab, newline and carriage return escaped."""
    if _COPY_SPECIAL.search(value) is None:
        return value
    return value.replace(b"\\", b"\\\\").replace(b"\t", b"\\t").replace(b"\n", b"\\n").replace(b"\r", b"\\r")


def _stamp(stamps: dict[datetime, bytes], observed: datetime) -> bytes:
    """``observed`` as COPY text, remembered in ``stamps`` (a result shares a few thousand at most)."""
    stamp = observed.isoformat().encode("ascii")
    if len(stamps) < 4096:
        stamps[observed] = stamp
    return stamp


def copy_document_lines(rows: Iterable[tuple[Any, ...]]) -> Iterator[bytes]:
    """COPY text-format lines of document-staged rows (:data:`DOCUMENT_STAGE_COLUMNS` order).

    The document is JSON from a serialiser: it never holds a raw tab, newline or carriage return
    (JSON escapes them), so only its backslashes need doubling. A known row (no document) has
    ``\\N`` (NULL) for the document and hash, and its claim's own stamp (or NULL) for observed_at.
    """
    stamps: dict[datetime, bytes] = {}
    for ref, document, observed, record_hash, wire_hash, seq in rows:
        wire = b"\\N" if wire_hash is None else wire_hash.encode("ascii")
        if document is None:
            stamp = _NULL if observed is None else stamps.get(observed) or _stamp(stamps, observed)
            yield b"%b\t\\N\t%b\t\\N\t%b\t%d\n" % (_copy_text(ref.encode("utf-8")), stamp, wire, seq)
            continue
        stamp = stamps.get(observed) or _stamp(stamps, observed)
        if b"\\" in document:
            document = document.replace(b"\\", b"\\\\")  # noqa: PLW2901 - the escaped copy is the one written
        yield b"%b\t%b\t%b\t%b\t%b\t%d\n" % (
            _copy_text(ref.encode("utf-8")), document, stamp, record_hash.encode("ascii"), wire, seq,
        )


_NULL = b"\\N"


def _copy_str(value: str | None) -> bytes:
    return _NULL if value is None else _copy_text(value.encode("utf-8"))


def _copy_json(value: bytes) -> bytes:
    # Serialised JSON never holds a raw tab, newline or carriage return: only backslashes double.
    if value == b"null":
        return _NULL
    return value.replace(b"\\", b"\\\\") if b"\\" in value else value


def _copy_json_str(value: bytes) -> bytes:
    """A JSON string (or null) as a COPY text value."""
    if value == b"null":
        return _NULL
    if b"\\" not in value:  # no escape: its text is what is between the quotes (see TargetCopyLines)
        return value[1:-1]
    return _copy_text(orjson.loads(value).encode("utf-8"))


class TargetCopyLines:
    """COPY text lines of the target's written columns, for one run (see ``copy_target``).

    :meth:`line` takes what :func:`~airflow_provider_bos.warehouse.tables.records.json_column_values`
    gives: the content columns as canonical JSON bytes, and the document they make up. JSON never
    holds a raw tab, newline or carriage return, and a JSON string without a backslash is its text
    between the quotes: so a record whose document has no backslash (nearly all) needs no escaping
    at all, and its strings are sliced, not decoded. ``_bos_synced_at`` and ``_bos_run_id`` are the
    run's.
    """

    def __init__(self, *, synced_at: datetime, run_id: str, wire_hash: bool) -> None:
        self._run = b"%b\t%b" % (synced_at.isoformat().encode("ascii"), _copy_str(run_id))
        self._wire_hash = wire_hash
        self._stamps: dict[datetime, bytes] = {}

    def line(
        self, parts: tuple[bytes, ...], document: bytes, observed: datetime, record_hash: str, wire_hash: str | None,
    ) -> bytes:
        stamp = self._stamps.get(observed) or _stamp(self._stamps, observed)
        ref, display_name, email, phone, lifecycle, identity, attributes, sources = parts
        if b"\\" in document:  # some value has an escape: each one is checked
            fields: tuple[bytes, ...] = (
                _copy_json_str(ref), _copy_json_str(display_name), _copy_json_str(email), _copy_json_str(phone),
                _copy_json(lifecycle), _copy_json(identity), _copy_json(attributes), _copy_json(sources),
            )
        else:
            fields = (
                ref[1:-1],
                _NULL if display_name == b"null" else display_name[1:-1],
                _NULL if email == b"null" else email[1:-1],
                _NULL if phone == b"null" else phone[1:-1],
                _NULL if lifecycle == b"null" else lifecycle,
                _NULL if identity == b"null" else identity,
                attributes,
                sources,
            )
        # Joined, not %-formatted: twelve %b cost a third more per record.
        if not self._wire_hash:
            return b"\t".join((*fields, stamp, self._run, record_hash.encode("ascii"))) + b"\n"
        wire = _NULL if wire_hash is None else wire_hash.encode("ascii")
        return b"\t".join((*fields, stamp, self._run, record_hash.encode("ascii"), wire + b"\n"))

