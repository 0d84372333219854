"""Finding the record_refs an erasure request names by a value: an email, a phone number, an external id.

A request names a person by what they know, not by a ref. :func:`find_refs` looks through the records
table and its history (an old email is only there) for every row holding the value, as the table
stores it under its personal-data policy (``<table>_policy``):

* a field the policy **hashes**: the value's keyed hash (the recipe of :mod:`airflow_provider_bos.pii`,
  with the table's key), compared with what is stored;
* a field it **keeps**: the value normalised as the recipe normalises it (an email case-folded and
  trimmed, a phone number reduced to its digits and a leading ``+``), compared with each stored value
  normalised alike (in Python: SQL has no case-folding or Unicode normalisation to match it); an
  external id is not normalised at all: it is compared exactly as given, a text only with a text
  (``'4711 '`` is not ``'4711'``, nor is the number 4711);
* a field it **drops**: nothing is stored to find it by, so the request is refused.

An external id ``SOURCE:ID`` matches a provenance entry whose ``source_identity`` is SOURCE and whose
``external_id`` is ID, both exactly; one of :attr:`Finders.typed_external_ids` (``TYPE:ID``, asked for
explicitly) an entry of any source whose ``source_type`` is TYPE. Runs on request, under the erasure's
lock. A hashed email or phone is found by equality in SQL. An external id, kept or hashed, is found by
the database (:mod:`.entry_search`: the records through ``<table>_sources`` and its entry index, the
history by one pass over its ``sources``), and only the candidates' stored entries are read back and
compared here, exactly as above. Only a request naming a kept email or phone reads every row once, in
batches.

:func:`find_quarantined` looks through ``<table>_rejects`` too: a run without a policy keeps each
quarantined record whole (raw, whatever the table's policy became), so a person BOS only ever sent in a
shape the table refused is found there by their raw values, whatever that shape. A record cut at the
size limit is read up to the cut: its top-level fields that are whole, and the whole entries of its
``sources`` (a record cut inside its ``attributes``, which come first, is found by its ref only).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from airflow_provider_bos.exceptions import BosConfigurationError
from airflow_provider_bos.pii import PiiKey, PolicyFingerprint, lookup_hash, normalise
from airflow_provider_bos.pii.fields import EXTERNAL_ID
from airflow_provider_bos.pii.keyed_hash import RECIPE_VERSION
from airflow_provider_bos.warehouse.dialects import WarehouseDialect
from airflow_provider_bos.warehouse.run.transaction import execute
from airflow_provider_bos.warehouse.tables.policy_store import effective_action
from airflow_provider_bos.warehouse.tables.stored_json import JsonColumns
from airflow_provider_bos.warehouse.upkeep.entry_search import (
    EntryProbe,
    provenance_candidates,
    versions_candidates,
)
from airflow_provider_bos.warehouse.upkeep.scan import rows_in_batches

__all__ = ["Finders", "KeySource", "Quarantined", "find_quarantined", "find_refs", "refs_in", "reject_row_id"]

#: The key, or how to get it (read only when the table's policy hashes a field a finder names).
KeySource = PiiKey | Callable[[], PiiKey] | None
# Bound values per look-up of hashed values (SQLite before 3.32 allows 999).
_VALUES_PER_QUERY = 500
# Quarantined records (up to 64 KiB each) held at a time while the rejects table is read.
_REJECTS_PER_FETCH = 100
_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\n\r]*")


@dataclass(frozen=True)
class Finders:
    """The values a request names, as given (raw)."""

    emails: tuple[str, ...] = ()
    phones: tuple[str, ...] = ()
    #: (source_identity, id): an entry of that one source.
    external_ids: tuple[tuple[str, str], ...] = ()
    #: (source_type, id): an entry of any source of that type (asked for explicitly).
    typed_external_ids: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, emails: Iterable[str], phones: Iterable[str], external_ids: Iterable[str],
              typed_external_ids: Iterable[str] = ()) -> Finders:
        """:raises BosConfigurationError: an empty value, a phone number without a digit, or an external
        id not of the form SOURCE:ID (TYPE:ID). Both parts of an external id are taken exactly as given."""
        emails, phones = tuple(emails), tuple(phones)
        for kind, values in (("email", emails), ("phone", phones)):
            if any(not isinstance(v, str) or not v.strip() for v in values):
                raise BosConfigurationError(f"Each {kind} to erase by must be a non-empty text.")
        if any(not normalise("phone", v).lstrip("+") for v in phones):
            # Its normal form would be empty, as is that of every stored phone without a digit: it
            # would find all of them.
            raise BosConfigurationError("Each phone number to erase by must hold a digit; one given holds none.")
        return cls(emails, phones, _id_pairs(external_ids, "SOURCE:ID (a source_identity, a colon, the id)",
                                             "crm-eu:4711"),
                   _id_pairs(typed_external_ids, "TYPE:ID (a source_type, a colon, the id)", "crm:4711"))

    def __bool__(self) -> bool:
        return bool(self.emails or self.phones or self.external_ids or self.typed_external_ids)

    def ids_by_source(self) -> list[tuple[tuple[str, str], list[str]]]:
        """The external ids, grouped by the entry key and value they name: ``("source_identity", SOURCE)``
        for :attr:`external_ids`, ``("source_type", TYPE)`` for :attr:`typed_external_ids`."""
        by_source: dict[tuple[str, str], list[str]] = {}
        for column, pairs in (("source_identity", self.external_ids), ("source_type", self.typed_external_ids)):
            for source, ident in pairs:
                by_source.setdefault((column, source), []).append(ident)
        return list(by_source.items())


def _id_pairs(given: Iterable[str], form: str, example: str) -> tuple[tuple[str, str], ...]:
    """``(source, id)`` of each ``SOURCE:ID``, both parts exactly as given (an id is any text: ``'4711 '``
    is another id than ``'4711'``). SOURCE ends at the first colon or, written as a JSON string
    (``"crm:eu":4711``), at its closing quote: a source holding a colon (any text may be a source's
    name), or beginning with a quote, is named that way."""
    pairs = []
    for text in given:
        source, ident = _split_id(text) if isinstance(text, str) else ("", "")
        if not source or not ident:
            raise BosConfigurationError(
                f"An external id to erase by is written {form}, e.g. {example}, or with SOURCE as a JSON string "
                f"when it holds a colon or begins with a quote (\"crm:eu\":4711); {str(text)[:80]!r} is not.")
        pairs.append((source, ident))
    return tuple(pairs)


def _split_id(text: str) -> tuple[str, str]:
    """``(SOURCE, ID)`` of one ``SOURCE:ID``; empty parts where it is not of that form."""
    if text.startswith('"'):
        try:
            source, end = _DECODER.raw_decode(text)
        except ValueError:
            return "", ""
        if not isinstance(source, str) or text[end:end + 1] != ":":
            return "", ""
        return source, text[end + 1:]
    source, colon, ident = text.partition(":")
    return (source, ident) if colon else ("", "")


class _Wanted:
    """The stored forms a finder's values take under the table's policy, and the test of a stored value."""

    def __init__(self, field: str, values: Iterable[str], action: str, key: Callable[[], PiiKey]) -> None:
        self.hashed = action == "hash"
        self.field = field
        self.forms = ({lookup_hash(key(), field, v) for v in values} if self.hashed
                      else {normalise(field, v) for v in values})
        # An external id kept is compared exactly as given: no trimming, no Unicode normalisation ('4711 '
        # and '4711' are two people's ids), and only with a text (the number 4711 is not the text '4711').
        self.exact = field == EXTERNAL_ID and not self.hashed
        if self.exact:
            self.forms = set(values)

    def holds(self, stored: Any) -> bool:
        if self.exact or self.hashed:  # a hash is a text; so is an id compared exactly
            return isinstance(stored, str) and stored in self.forms
        if stored is None or not isinstance(stored, str | int | float):
            return False
        return normalise(self.field, stored) in self.forms


def _action(stored: PolicyFingerprint | None, field: str, option: str) -> str:
    action = effective_action(dict(stored.rules), field) if stored is not None else "keep"
    if action == "drop":
        raise BosConfigurationError(
            f"The table's personal-data policy drops {field}: it is not stored, so no record can be found by "
            f"it. Erase by --record-ref, or by --external-id SOURCE:ID ({option} cannot find anyone)."
        )
    return action


def _key_reader(key: KeySource, stored: PolicyFingerprint | None) -> Callable[[], PiiKey]:
    cache: list[PiiKey] = []

    def read() -> PiiKey:
        if not cache:
            if stored is not None and stored.recipe != RECIPE_VERSION:
                raise BosConfigurationError(
                    f"The table's hashes follow recipe version {stored.recipe}, this release's version "
                    f"{RECIPE_VERSION}: nobody could be found by a hashed value. Erase by --record-ref, and "
                    "replace the table with a full re-read into a new one.")
            found = key() if callable(key) else key
            if found is None:
                raise BosConfigurationError(
                    "The table's personal-data policy hashes a field named to erase by: give its key "
                    "(--key-conn-id: the Airflow connection whose password holds it).")
            if stored is not None and stored.key_id and found.key_id != stored.key_id:
                raise BosConfigurationError(
                    f"The key given (key id {found.key_id}) is not the one the table's hashes were made with "
                    f"(key id {stored.key_id}): nobody could be found with it. Give the table's key.")
            cache.append(found)
        return cache[0]

    return read


def find_refs(conn: sa.Connection, records: sa.Table, versions: Iterable[sa.Table], finders: Finders,
              stored: PolicyFingerprint | None, key: KeySource, dialect: WarehouseDialect, *,
              provenance: sa.Table | None = None) -> set[str]:
    """The record_refs of every row of ``records`` and ``versions`` (its history) a finder matches.

    ``provenance``: the records table's ``<table>_sources``, through whose entry index the records
    that hold an external id are found (:mod:`.entry_search`); without it, or while it is empty
    beside a filled records table (a table stored before it, not yet synced since), the records'
    ``sources`` are searched as a version table's are."""
    read_key = _key_reader(key, stored)
    top = [_Wanted(field, values, _action(stored, field, f"--{field}"), read_key)
           for field, values in (("email", finders.emails), ("phone", finders.phones)) if values]
    external: dict[tuple[str, str], _Wanted] = {}
    if finders.external_ids or finders.typed_external_ids:
        action = _action(stored, EXTERNAL_ID, "--external-id" if finders.external_ids else "--external-id-of-type")
        external = {source: _Wanted(EXTERNAL_ID, ids, action, read_key) for source, ids in finders.ids_by_source()}
    tables = [records, *versions]
    found: set[str] = set()
    for table in tables:
        for wanted in top:
            if wanted.hashed:
                found.update(_hashed_refs(conn, table, wanted))
    if external:
        found.update(_external_refs(conn, dialect, records, tables[1:], provenance, external))
    kept = [w for w in top if not w.hashed]
    if kept:
        found.update(_scanned_refs(conn, tables, kept))
    return found


def _chunks(values: set[str]) -> list[list[str]]:
    ordered = sorted(values)
    return [ordered[i : i + _VALUES_PER_QUERY] for i in range(0, len(ordered), _VALUES_PER_QUERY)]


def refs_in(conn: sa.Connection, table: sa.Table, column: str, values: set[str]) -> set[str]:
    """The refs of the rows of ``table`` whose ``column`` is one of ``values`` (bound, in batches).

    Compared again in Python: a collation that ignores trailing spaces (MySQL/MariaDB) also matches
    ``'r:7 '`` for ``'r:7'``, another person's value."""
    matched = table.c[column]
    select = sa.select(table.c.record_ref, matched).distinct()
    return {ref for chunk in _chunks(values) for ref, value in conn.execute(select.where(matched.in_(chunk)))
            if value in values}


def _hashed_refs(conn: sa.Connection, table: sa.Table, wanted: _Wanted) -> set[str]:
    """The refs of the rows of ``table`` whose (hashed) ``wanted.field`` is one of its forms."""
    return refs_in(conn, table, wanted.field, wanted.forms)


def _external_refs(conn: sa.Connection, d: WarehouseDialect, records: sa.Table, versions: list[sa.Table],
                   provenance: sa.Table | None, external: dict[tuple[str, str], _Wanted]) -> set[str]:
    """The refs of the rows holding an entry of a wanted source whose external id (kept: exactly as
    given; hashed: its keyed hash) a finder holds. The database names candidates (:mod:`.entry_search`:
    the provenance table's index for the records table, one pass over each version table); each
    candidate's stored ``sources`` are then compared here, exactly as a full read would."""
    probes = [EntryProbe(by, source, tuple(wanted.forms)) for (by, source), wanted in external.items()]
    found: set[str] = set()
    searched = [records, *versions]
    if provenance is not None and _complete(conn, d, records, provenance):
        found |= _holding(conn, records, provenance_candidates(conn, d, provenance, probes), external)
        searched = versions
    for table in searched:
        found |= _holding(conn, table, versions_candidates(conn, d, table, probes), external)
    return found


def _complete(conn: sa.Connection, d: WarehouseDialect, records: sa.Table, provenance: sa.Table) -> bool:
    """Whether ``provenance`` holds the records' entries: every record has one, so an empty provenance
    table beside a filled records table is one made before it was kept (the next run fills it)."""
    probe = d.probe_empty
    if execute(conn, probe(d.table_ref(provenance.name, provenance.schema))).first() is not None:
        return True
    return execute(conn, probe(d.table_ref(records.name, records.schema))).first() is None


def _holding(conn: sa.Connection, table: sa.Table, candidates: set[str],
             external: Mapping[tuple[str, str], _Wanted]) -> set[str]:
    """The refs among ``candidates`` one of whose rows in ``table`` holds a wanted entry (its stored
    ``sources`` decoded and compared as :func:`_entries_hold` compares them)."""
    json_columns = JsonColumns(table, ["sources"])
    select = sa.select(table.c.record_ref, table.c.sources)
    return {ref for chunk in _chunks(candidates)
            for ref, sources in conn.execute(select.where(table.c.record_ref.in_(chunk)))
            if _entries_hold(json_columns.value("sources", sources), external)}


def _scanned_refs(conn: sa.Connection, tables: list[sa.Table], top: list[_Wanted]) -> set[str]:
    """The refs of the rows a kept email or phone matches: every row read once, in batches, and
    compared in Python (after the recipe's normalisation, which SQL does not have)."""
    columns = [w.field for w in top]
    found: set[str] = set()
    for table in tables:
        key_columns = ("record_ref", "_bos_valid_from") if "_bos_valid_from" in table.c else ("record_ref",)
        for rows in rows_in_batches(conn, table, columns, key=key_columns):
            for row in rows:
                if any(w.holds(row[w.field]) for w in top):
                    found.add(row["record_ref"])
    return found


def _entries_hold(sources: Any, wanted: Mapping[tuple[str, str], _Wanted]) -> bool:
    """``sources`` (any shape) holds an entry of a wanted source (by its source_identity, or by its
    source_type where that was asked for: the keys of ``wanted``) whose external_id that finder holds."""
    for entry in sources if isinstance(sources, list) else ():
        if not isinstance(entry, dict):
            continue
        for column in ("source_identity", "source_type"):
            source = entry.get(column)
            finder = wanted.get((column, source)) if isinstance(source, str) else None
            if finder is not None and finder.holds(entry.get("external_id")):
                return True
    return False


@dataclass
class Quarantined:
    """The rows of ``<table>_rejects`` a request matches: their refs, and the rows quarantined without one."""

    refs: set[str]
    #: (run_id, the dialect's ``reject_row_id_sql`` value) of each matched row without a ref to erase it by.
    unnamed: list[tuple[str, Any]]


def find_quarantined(conn: sa.Connection, d: WarehouseDialect, rejects: sa.Table, finders: Finders) -> Quarantined:
    """The rows of ``rejects`` whose kept record holds a value a finder names (compared raw and normalised,
    an external id exactly: a record is quarantined whole only by a run without a policy)."""
    raw = _raw_forms(finders)
    top = [w for w in raw if not isinstance(w, _SourceWanted)]
    external = {w.source: w for w in raw if isinstance(w, _SourceWanted)}
    found = Quarantined(set(), [])
    empty = sa.bindparam("empty", b"", type_=rejects.c.record.type)
    query = (sa.select(rejects.c.run_id, rejects.c.record_ref, rejects.c.record, rejects.c.truncated,
                       reject_row_id(d))
             .where(rejects.c.record != empty).execution_options(yield_per=_REJECTS_PER_FETCH))
    for run_id, ref, record, truncated, row_key in conn.execute(query):
        data = bytes(record)
        if not _fields_hold(_cut_record(data) if truncated else _record(data), top, external):
            continue
        if ref is not None:
            found.refs.add(ref)
        else:
            found.unnamed.append((run_id, row_key))
    return found


def reject_row_id(d: WarehouseDialect) -> sa.ColumnClause[Any]:
    """The identity the database computes for a row of the rejects table (see ``reject_row_id_sql``)."""
    return sa.literal_column(d.reject_row_id_sql.format(record=d.quote("record")))


class _SourceWanted(_Wanted):
    def __init__(self, source: tuple[str, str], values: Iterable[str]) -> None:
        super().__init__(EXTERNAL_ID, values, "keep", _no_key)
        self.source = source


def _no_key() -> PiiKey:
    raise AssertionError("a kept value needs no key")


def _raw_forms(finders: Finders) -> list[_Wanted]:
    wanted: list[_Wanted] = [_Wanted(field, values, "keep", _no_key)
                             for field, values in (("email", finders.emails), ("phone", finders.phones)) if values]
    return wanted + [_SourceWanted(source, ids) for source, ids in finders.ids_by_source()]


def _record(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:  # not JSON (see rejects.record_bytes): nothing to compare
        return None


def _cut_record(data: bytes) -> dict[str, Any]:
    """The top-level fields of a record cut short that are whole before the cut, ``sources`` with its
    whole entries. Its keys are sorted (:func:`~.rejects.record_bytes`), so ``attributes`` comes first:
    a cut inside it leaves nothing else to find the record by."""
    text = data.decode("utf-8", "ignore")  # the cut may split a character
    fields: dict[str, Any] = {}
    at = _after_space(text, 0)
    if not text.startswith("{", at):
        return fields
    at += 1
    while True:
        try:
            key, at = _DECODER.raw_decode(text, _after_space(text, at))
        except ValueError:
            return fields
        at = _after_space(text, at)
        if not isinstance(key, str) or not text.startswith(":", at):
            return fields
        at = _after_space(text, at + 1)
        if key == "sources" and text.startswith("[", at):
            fields[key], end = _whole_entries(text, at + 1)
            if end is None:
                return fields
            at = end
        else:
            try:
                fields[key], at = _DECODER.raw_decode(text, at)
            except ValueError:
                return fields
        at = _after_space(text, at)
        if not text.startswith(",", at):
            return fields
        at += 1


def _whole_entries(text: str, at: int) -> tuple[list[Any], int | None]:
    """The whole elements of a JSON list starting at ``at`` (after its ``[``), and where the list ends
    (None: it was cut)."""
    entries: list[Any] = []
    while True:
        at = _after_space(text, at)
        if text.startswith("]", at):
            return entries, at + 1
        try:
            entry, at = _DECODER.raw_decode(text, at)
        except ValueError:
            return entries, None
        entries.append(entry)
        at = _after_space(text, at)
        if text.startswith(",", at):
            at += 1
        elif not text.startswith("]", at):
            return entries, None


def _after_space(text: str, at: int) -> int:
    return _SPACE.match(text, at).end()  # type: ignore[union-attr]  # matches the empty string too


def _fields_hold(record: Any, top: list[_Wanted], external: dict[tuple[str, str], _SourceWanted]) -> bool:
    """A quarantined record, of whatever shape it was refused for, holds a value a finder names."""
    if not isinstance(record, dict):
        return False
    return any(w.holds(record.get(w.field)) for w in top) or (
        bool(external) and _entries_hold(record.get("sources"), external))
