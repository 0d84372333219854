"""Wire hashes: the scanner cuts every final record's exact bytes, hashes them, and lets known ones
through undecoded (as KnownRecord claims) when given the warehouse's stored hashes.

The cuts are guessed at ``}`` + separator + first key and confirmed by a parse, so the data below
is built to fool the guess: nested objects whose first key is ``record_ref`` inside arrays (the
separator appears inside a record), the separator inside strings, other spacing, other key orders.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_bos.mcp.final_frame import FinalFrameScanner, KnownRecord, WireRecord, check_record
from airflow_provider_bos.warehouse.run.claims import WireHashSet
from airflow_provider_bos.wire import wire_hash

RID = "rid-1"
META = {"contract_version": "bos-identity-mcp/v2", "result_count": 0}

text = st.lists(st.sampled_from([*'ab"\\},{ré\n\t\u2028', "record_ref", '},{"record_ref"']),
                max_size=8).map("".join)
ref = st.text(alphabet=st.sampled_from(list("abcXYZ-_/é\"\\")), min_size=1, max_size=8)
nested = st.fixed_dictionaries({"record_ref": ref}, optional={"n": st.integers(-5, 5), "s": text})


@st.composite
def records(draw: Any) -> list[dict[str, Any]]:
    refs = draw(st.lists(ref, min_size=0, max_size=6, unique=True))
    out = []
    for r in refs:
        record: dict[str, Any] = {
            "record_ref": r,
            "sources": [{"source_type": "hr", "observed_at": "2026-10-01T00:00:00Z", "note": draw(text)}],
            "attributes": {"links": draw(st.lists(nested, max_size=3)), "name": draw(text)},
        }
        if draw(st.booleans()):  # another key first: such a record can never be a KnownRecord
            record = {"display_name": draw(text), **record}
        out.append(record)
    return out


def frame(recs: list[dict[str, Any]], separators: tuple[str, str]) -> tuple[bytes, list[bytes]]:
    """A direct-style final frame whose records array is written element by element, and each element's bytes."""
    elements = [json.dumps(r, separators=separators, ensure_ascii=False).encode() for r in recs]
    item_sep, _key_sep = separators
    structured = (b'{"result":[' + item_sep.encode().join(elements) + b'],"metadata":' + json.dumps(META).encode()
                  + b"}")
    text_json = json.dumps(structured.decode())
    data = (b'{"jsonrpc":"2.0","id":"' + RID.encode() + b'","result":{"content":[{"type":"text","text":'
            + text_json.encode() + b'}],"structuredContent":' + structured + b',"isError":false}}')
    return data, elements


def scan(data: bytes, chunk: int, known: WireHashSet | None = None) -> tuple[list[Any], FinalFrameScanner]:
    scanner = FinalFrameScanner(tool_style="direct", known=known)
    out: list[Any] = []
    for pos in range(0, len(data), chunk):
        out += scanner.feed(data[pos : pos + chunk])
    out += scanner.flush()
    scanner.finish()
    return out, scanner


def sha(data: bytes) -> str:
    """The wire hash the scanner must give an element (provenance stamps blanked)."""
    return wire_hash(data)


def _restamped(record: dict[str, Any], stamp: str) -> dict[str, Any]:
    return {**record, "sources": [{**e, "observed_at": stamp} for e in record["sources"]]}


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(recs=records(), stamp=st.sampled_from(["2026-10-02T00:00:00Z", "2027-01-01T12:30:00+00:00"]),
       compact=st.booleans())
def test_the_wire_hash_leaves_out_provenance_stamps_and_nothing_else(recs: list[dict[str, Any]], stamp: str,
                                                                    compact: bool) -> None:
    separators = (",", ":") if compact else (", ", ": ")
    for record in recs:
        raw = json.dumps(record, separators=separators, ensure_ascii=False).encode()
        moved = json.dumps(_restamped(record, stamp), separators=separators, ensure_ascii=False).encode()
        # Content is never masked: another attribute value, another hash.
        other = json.dumps({**record, "attributes": {**record["attributes"], "name": "changed"}},
                           separators=separators, ensure_ascii=False).encode()
        assert (wire_hash(other) == wire_hash(raw)) == (other == raw)
        # A re-stamped record of the contract's compact shape hashes alike (a note holding "}]", "{" or
        # "sources" may only cost the shortcut).
        note = record["sources"][0]["note"]
        plain_note = "}]" not in note and "{" not in note
        if compact and plain_note and "sources" not in json.dumps(record["attributes"]) + note:
            assert wire_hash(moved) == wire_hash(raw)


def test_an_attribute_called_observed_at_is_content() -> None:
    record = {"record_ref": "r", "sources": [{"source_type": "hr", "observed_at": "2026-10-01T00:00:00Z"}],
              "attributes": {"badge": {"observed_at": "2026-01-01"}}}
    changed = {**record, "attributes": {"badge": {"observed_at": "2026-02-02"}}}
    assert wire_hash(json.dumps(record).encode()) != wire_hash(json.dumps(changed).encode())
    assert wire_hash(json.dumps(record, separators=(",", ":")).encode()) != hashlib.sha256(
        json.dumps(record, separators=(",", ":")).encode()).hexdigest()


def test_an_observed_at_nested_in_a_provenance_entry_is_content() -> None:
    """Only an entry's own ``observed_at`` is BOS's stamp: one inside an extra key's object or array (any
    JSON value may come there), in any entry, is content, and a change to it changes the hash."""
    plain = {"source_type": "crm", "observed_at": "2026-10-01T00:00:00Z", "capabilities": ["read"]}
    for extra in ({"meta": {"observed_at": "2020-01-01T00:00:00Z"}},
                  {"meta": [{"observed_at": "2020-01-01T00:00:00Z"}]},
                  {"meta": [1, {"observed_at": "2020-01-01T00:00:00Z"}]},
                  {"meta": [{}, {"observed_at": "2020-01-01T00:00:00Z"}]}):
        for sources in ([{**plain, **extra}], [plain, {**plain, **extra}]):
            record = {"record_ref": "r", "sources": sources, "attributes": {}}
            changed = json.loads(json.dumps(record).replace("2020-01-01T00:00:00Z", "2021-06-06T06:06:06Z"))
            compact = [json.dumps(r, separators=(",", ":")).encode() for r in (record, changed)]
            assert wire_hash(compact[0]) != wire_hash(compact[1]), (extra, len(sources))


def test_a_key_only_ending_in_observed_at_is_content() -> None:
    """An extra key ``x"observed_at`` (its quote escaped) is no stamp: a change to its value changes
    the hash, and it is not taken for the record's observation time."""
    def record(value: str) -> bytes:
        entry = {"source_type": "crm", "observed_at": "2026-10-01T00:00:00Z", 'x"observed_at': value}
        return json.dumps({"record_ref": "r", "sources": [entry], "attributes": {}}, separators=(",", ":")).encode()

    stamps: list[Any] = []
    assert wire_hash(record("2020-01-01T00:00:00Z"), stamps) != wire_hash(record("2021-06-06T06:06:06Z"))
    assert b"2020-01-01T00:00:00Z" not in stamps


def test_a_sources_key_written_with_escapes_is_hashed_as_sent() -> None:
    """A record naming its ``sources`` with ``\\u`` escapes, while an attribute holds a ``"sources"``
    of its own: the one the byte search finds is content, so the record is hashed as sent."""
    def record(value: str) -> bytes:
        return (b'{"record_ref":"r","attributes":{"sources":[{"observed_at":"' + value.encode() + b'"}]},'
                b'"sourc\\u0065s":[{"source_type":"crm","observed_at":"2026-10-01T00:00:00Z"}]}')

    assert json.loads(record("x"))["sources"][0]["source_type"] == "crm"
    assert wire_hash(record("2020-01-01T00:00:00Z")) != wire_hash(record("2021-06-06T06:06:06Z"))


SEPARATORS = st.sampled_from([(",", ":"), (", ", ": "), (",\n ", ":")])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recs=records(), separators=SEPARATORS, chunk=st.integers(1, 400))
def test_every_record_carries_the_hash_of_its_exact_bytes(recs: list[dict[str, Any]], separators: Any,
                                                           chunk: int) -> None:
    data, elements = frame(recs, separators)
    out, scanner = scan(data, chunk)
    assert out == recs
    assert all(type(r) is WireRecord for r in out)
    assert [r.wire_hash for r in out] == [sha(e) for e in elements]
    assert scanner.known_records == 0


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recs=records(), separators=SEPARATORS, chunk=st.integers(1, 400), data=st.data())
def test_known_records_come_through_undecoded_in_order(recs: list[dict[str, Any]], separators: Any, chunk: int,
                                                      data: Any) -> None:
    raw, elements = frame(recs, separators)
    stored = [data.draw(st.booleans()) for _ in recs]
    known = WireHashSet(sha(e) for e, keep in zip(elements, stored, strict=True) if keep)
    out, scanner = scan(raw, chunk, known)

    assert len(out) == len(recs)
    claims = 0
    for got, want, element, keep in zip(out, recs, elements, stored, strict=True):
        # Only a stored record whose record_ref comes first, compact, can be claimed without decoding.
        claimable = keep and element.startswith(b'{"record_ref":"')
        if claimable:
            assert type(got) is KnownRecord
            assert (got.record_ref, got.wire_hash) == (want["record_ref"], sha(element))
            # It names the stored hash it matched, for the warehouse to confirm without staging it.
            assert got.matched is known and known.prefixes[got.handle] == int(sha(element)[:16], 16)
            assert check_record(got, 0, "x") is got
            claims += 1
        else:
            assert type(got) is WireRecord and got == want and got.wire_hash == sha(element)
    assert scanner.known_records == claims


def test_the_first_records_and_the_last_one_are_hashed_in_one_chunk_and_in_bytes() -> None:
    recs = [{"record_ref": f"p{i}", "sources": [{"observed_at": "2026-10-01T00:00:00Z"}]} for i in range(5)]
    data, elements = frame(recs, (",", ":"))
    for chunk in (1, 7, len(data)):
        out, _ = scan(data, chunk)
        assert [r.wire_hash for r in out] == [sha(e) for e in elements]


def test_a_frame_scanned_from_memory_is_hashed_too() -> None:
    """flush() hands out the records only the end of the frame completes (the last one at least)."""
    recs = [{"record_ref": "only", "sources": [{"observed_at": "2026-10-01T00:00:00Z"}]}]
    data, elements = frame(recs, (",", ":"))
    scanner = FinalFrameScanner(tool_style="direct")
    first = scanner.feed(data)
    rest = scanner.flush()
    assert [r.wire_hash for r in first + rest] == [sha(elements[0])]
    assert scanner.flush() == []
    scanner.finish()


def test_wire_hash_set_membership() -> None:
    hashes = [sha(str(i).encode()) for i in range(1000)]
    known = WireHashSet([*hashes[:500], "not-hex", None])  # type: ignore[list-item]
    assert len(known) == 500
    assert all(h in known for h in hashes[:500])
    assert not any(h in known for h in hashes[500:])
    assert "zz" not in known and 42 not in known
    assert hashes[0] not in WireHashSet()
    # The form PostgreSQL hands over: every 16-digit prefix, sorted, in one string.
    aggregated = WireHashSet.from_sorted_prefix_text("".join(sorted(h[:16] for h in hashes[:500])))
    assert list(aggregated.prefixes) == list(known.prefixes) and list(aggregated.buckets) == list(known.buckets)
    assert all(h in aggregated for h in hashes[:500]) and not any(h in aggregated for h in hashes[500:])
    assert len(WireHashSet.from_sorted_prefix_text(None)) == 0
    assert [known.position(h) for h in hashes[:3]] == [list(known.prefixes).index(int(h[:16], 16)) for h in hashes[:3]]
    assert known.position(hashes[600]) == -1 and known.position("zz") == -1
    assert known.unique and WireHashSet().unique
    assert not WireHashSet([hashes[0], hashes[0][:16] + "0" * 48]).unique  # two stored rows, one prefix


class _CountingHashes(WireHashSet):
    """A WireHashSet that counts how often the read asks it."""

    asked = 0

    def match(self, wire_hash: str) -> int | None:
        type(self).asked += 1
        return super().match(wire_hash)


def test_an_empty_set_of_stored_hashes_is_not_asked_and_a_stored_one_is() -> None:
    # A first sync (no stored wire hash) must not pay a lookup per record that cannot hit.
    recs = [{"record_ref": f"p{i}", "sources": [{"observed_at": "2026-10-01T00:00:00Z"}]} for i in range(50)]
    data, elements = frame(recs, (",", ":"))
    _CountingHashes.asked = 0
    out, scanner = scan(data, 64, _CountingHashes())
    assert out == recs and all(type(r) is WireRecord for r in out)
    assert _CountingHashes.asked == 0
    # The same read against one stored record asks for every record, and claims that one.
    out, scanner = scan(data, 64, _CountingHashes([sha(elements[7])]))
    assert _CountingHashes.asked == len(recs)
    assert scanner.known_records == 1 and type(out[7]) is KnownRecord


def test_a_claim_carries_its_own_latest_stamp() -> None:
    """The wire hash leaves stamps out, so a claim matched by a record stored days ago may carry newer
    stamps: duplicates of one record_ref are resolved by them, so the claim hands them over, the
    latest of its entries' (offsets taken into account)."""
    stored = {"record_ref": "p1", "sources": [
        {"source_type": "hr", "observed_at": "2026-10-01T00:00:00Z"},
        {"source_type": "crm", "observed_at": "2026-10-01T00:00:00Z"}]}
    today = {"record_ref": "p1", "sources": [
        {"source_type": "hr", "observed_at": "2026-10-03T01:00:00+02:00"},  # 23:00 UTC on the 2nd
        {"source_type": "crm", "observed_at": "2026-10-02T23:30:00Z"}]}
    known = WireHashSet([sha(json.dumps(stored, separators=(",", ":")).encode())])
    data, _ = frame([today], (",", ":"))

    (claim,), _ = scan(data, 9, known)

    assert type(claim) is KnownRecord
    assert claim.observed_at == datetime(2026, 10, 2, 23, 30, tzinfo=UTC)


def test_a_claim_whose_stamp_is_no_timestamp_is_decoded_instead() -> None:
    """Its bytes match a stored record but for a stamp the writer would refuse: it comes through
    decoded, so the writer refuses it as it refuses any such record (not counted unchanged)."""
    stored = {"record_ref": "p1", "sources": [{"source_type": "hr", "observed_at": "2026-10-01T00:00:00Z"}]}
    bad = {"record_ref": "p1", "sources": [{"source_type": "hr", "observed_at": "yesterday"}]}
    known = WireHashSet([sha(json.dumps(stored, separators=(",", ":")).encode())])
    data, elements = frame([bad], (",", ":"))
    assert sha(elements[0]) in known

    (record,), _ = scan(data, 64, known)

    assert type(record) is WireRecord and record == bad
