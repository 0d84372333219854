"""run_sync under a personal-data policy, against a read that matches wire hashes as the MCP scanner
does and a sink that records what it was given: the policy is checked before the read, records and
wire hashes are stored keyed, claims carry what the writer verifies, and no policy changes nothing."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_provider_bos.exceptions import BosFinalFrameRestarted
from airflow_provider_bos.mcp.final_frame import known_record
from airflow_provider_bos.pii import PiiKey, PiiPolicy, PiiPolicyMismatch, PolicyFingerprint, hash_value
from airflow_provider_bos.pii.stream import KeyedMatch, KeyedWireHashes, PolicyRun
from airflow_provider_bos.sync import run_sync
from airflow_provider_bos.wire import KnownRecord, RefusedRecord, WireRecord, WriteOptions, wire_hash
from tests.pii.conftest import KEY_TEXT, hmac_wire_hash, reference_wire_hash

POLICY = {"email": "hash", "phone": "hash", "attributes.employment.*": "drop", "sources[].external_id": "hash"}
RAW = ("Zoe.Martin@Example.org", "+49 30 1234-56", "CC-4711", "WD-00042", "zoe.b@example.net", "+1 555 0100")


def person(n: int, email: str, phone: str, cost_center: str = "CC-4711") -> dict[str, Any]:
    return {
        "record_ref": f"bos:person:{n}", "display_name": f"Person {n}", "email": email, "phone": phone,
        "lifecycle": {"status": "active"},
        "sources": [{"source_type": "hr", "source_identity": "hr-main", "external_id": f"WD-0004{n}",
                     "record_type": "person", "observed_at": "2026-10-08T12:00:00Z", "capabilities": ["read"]}],
        "identity_match": None,
        "attributes": {"department": "Research", "employment": {"cost_center": cost_center, "grade": 7}},
    }


PEOPLE = [person(2, RAW[0], RAW[1]), person(3, RAW[4], RAW[5])]


class _Stored:
    """A sink's stored wire hashes (a KnownWireHashes whose handle is the stored hash itself)."""

    def __init__(self, hashes: set[str]) -> None:
        self.hashes = hashes

    def match(self, wire_hash: str) -> object | None:
        return wire_hash if wire_hash in self.hashes else None

    def __len__(self) -> int:
        return len(self.hashes)


class _Read:
    """A streamed final result cut as FinalFrameScanner cuts it: each record's exact bytes hashed, and
    matched against the known hashes it was given (a claim instead of a decoded record)."""

    def __init__(self, records: list[dict[str, Any]], restart_after: int | None = None) -> None:
        self._pieces = [json.dumps(r, separators=(",", ":")).encode() for r in records]
        self.known: Any = None
        self.calls = 0
        self.known_records = 0
        self.handed: list[Any] = []
        self._restart_after = restart_after
        self.observations = SimpleNamespace(provisional_records=0, pages=0, stream_resumptions=0, summary=list)
        self.completeness, self.is_error, self.metadata, self.context = "complete", False, None, None
        self.warnings: list[str] = []
        self.contradictions: list[str] = []
        self.source_errors: list[Any] = []
        self.result_count = len(records)

    def __call__(self, tool_name: str, arguments: dict[str, Any], **_: Any) -> _Read:
        self.calls += 1
        return self

    def use_known_wire_hashes(self, known: Any) -> bool:
        self.known = known
        return True

    def _cut(self) -> Iterator[Any]:
        for piece in self._pieces:
            raw = wire_hash(piece)
            handle = self.known.match(raw) if self.known else None
            claim = known_record(piece, raw, self.known, handle) if handle is not None else None
            if claim is not None:  # the claim the scanner hands out
                self.known_records += 1
                yield claim
                continue
            record = WireRecord(json.loads(piece))
            record.wire_hash = raw
            self.handed.append(record)
            yield record

    @property
    def records(self) -> Iterator[Any]:
        if self._restart_after is None:
            return self._cut()

        def cut_then_restart() -> Iterator[Any]:
            cut = self._cut()
            for _ in range(self._restart_after or 0):
                yield next(cut)
            raise BosFinalFrameRestarted(self._cut())

        return cut_then_restart()

    def close(self) -> None:
        pass

    def __enter__(self) -> _Read:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class _Sink:
    """A RecordSink keeping the table's policy and wire hashes as a WarehouseWriter does (in memory)."""

    def __init__(self) -> None:
        self.stored = _Stored(set())
        self.policy: str | None = None
        self.has_rows = False
        self.written: list[Any] = []
        self.options: WriteOptions | None = None
        self.failures: list[str] = []
        self.required: list[PolicyFingerprint | None] = []

    def require_pii_policy(self, fingerprint: PolicyFingerprint | None) -> None:
        self.required.append(fingerprint)
        if not self.has_rows:
            return  # an empty table adopts the run's policy
        if fingerprint is not None:
            fingerprint.require_same(self.policy, table="people")
        elif self.policy is not None:
            raise PiiPolicyMismatch("people", ["the table has a policy, this run none"])

    def known_wire_hashes(self) -> _Stored:
        return self.stored

    def write_run(self, run: Any, records: Iterator[Any], options: WriteOptions) -> Any:
        self.options = options
        while True:
            try:
                self.written = list(records)
                break
            except BosFinalFrameRestarted as restart:
                records = restart.records
        self.stored = _Stored({r.wire_hash for r in self.written if getattr(r, "wire_hash", None)})
        self.policy = options.pii.text if options.pii is not None else None
        self.has_rows = True
        return SimpleNamespace(inserted=len(self.written), updated=0, unchanged=0, skipped_stale=0, duplicates=0,
                               rejected=0, retired=0, superseded=0, retire_withheld=0, withheld=0)

    def record_failure(self, run: Any, *, error: str, **_: Any) -> None:
        self.failures.append(error)


class _Run:
    run_id = "r-1"
    context_handle: str | None = None


def sync(read: _Read, sink: _Sink, pii: PolicyRun | None) -> Any:
    return run_sync(read, sink, _Run(), tool_name="people.search", arguments={}, pii=pii)


def policy_run(key: PiiKey | None, policy: dict[str, str] | None = None) -> PolicyRun | None:
    return PolicyRun.of(PiiPolicy.parse(policy or POLICY), key)


def keyed(raw_hash: str) -> str:
    return reference_wire_hash(KEY_TEXT, raw_hash)


def test_without_a_policy_the_reads_records_and_hashes_go_to_the_writer_as_they_are() -> None:
    read, sink = _Read(PEOPLE), _Sink()
    stored = sink.stored
    sync(read, sink, None)
    assert [id(r) for r in sink.written] == [id(r) for r in read.handed]  # the same objects, untouched
    assert [r.wire_hash for r in sink.written] == [wire_hash(p) for p in read._pieces]
    assert sink.required == [None] and sink.options is not None and sink.options.pii is None
    assert read.known is stored  # the writer's own hashes, not a keyed matcher


def test_an_empty_policy_is_no_policy() -> None:
    assert PolicyRun.of(PiiPolicy.parse({"email": "keep"}), None) is None


def test_a_policy_run_stores_hashes_and_drops_with_keyed_wire_hashes(key: PiiKey) -> None:
    read, sink = _Read(PEOPLE), _Sink()
    pii = policy_run(key)
    sync(read, sink, pii)
    assert pii is not None and sink.required == [pii.fingerprint]
    assert sink.options is not None and sink.options.pii == pii.fingerprint
    first, _ = sink.written
    assert type(first) is WireRecord
    assert first["email"] == hash_value(key, "email", RAW[0]) and first["phone"] == hash_value(key, "phone", RAW[1])
    assert first["attributes"] == {"department": "Research"}
    assert first["sources"][0]["external_id"] == hash_value(key, "sources[].external_id", "WD-00042")
    assert first["record_ref"] == "bos:person:2" and first["display_name"] == "Person 2"
    assert [r.wire_hash for r in sink.written] == [keyed(wire_hash(p)) for p in read._pieces]
    text = repr(sink.written) + repr(sink.options)
    assert not [raw for raw in RAW if raw in text]


def test_an_unchanged_re_run_matches_through_the_key_and_claims_carry_what_the_writer_verifies(key: PiiKey) -> None:
    sink = _Sink()
    sync(_Read(PEOPLE), sink, policy_run(key))
    stored = sink.stored
    again = _Read(PEOPLE)
    sync(again, sink, policy_run(key))
    assert isinstance(again.known, KeyedWireHashes) and again.known.stored is stored
    assert again.known_records == 2  # nothing decoded
    assert all(type(r) is KnownRecord for r in sink.written)
    assert [r.wire_hash for r in sink.written] == [keyed(wire_hash(p)) for p in again._pieces]
    assert all(r.matched is stored for r in sink.written)  # the set the writer gave: it verifies these
    assert sink.options is not None and sink.options.known is stored


def test_a_record_changed_only_in_a_dropped_field_is_decoded_but_stored_alike(key: PiiKey) -> None:
    sink = _Sink()
    sync(_Read(PEOPLE), sink, policy_run(key))
    before = [dict(r) for r in sink.written]
    changed = _Read([person(2, RAW[0], RAW[1], cost_center="CC-9999"), PEOPLE[1]])
    sync(changed, sink, policy_run(key))
    assert changed.known_records == 1
    assert dict(sink.written[0]) == before[0]  # what is stored did not change: the writer's content hash agrees


def test_a_mismatched_policy_fails_before_the_read(key: PiiKey, other_key: PiiKey) -> None:
    sink = _Sink()
    sync(_Read(PEOPLE), sink, policy_run(key))
    for pii in (policy_run(other_key), policy_run(key, {**POLICY, "display_name": "hash"}), None):
        read = _Read(PEOPLE)
        with pytest.raises(PiiPolicyMismatch) as caught:
            sync(read, sink, pii)
        assert read.calls == 0, "the read was started"
        assert sink.failures[-1].startswith("PiiPolicyMismatch: Table people")
        assert KEY_TEXT not in str(caught.value)


def test_a_policy_that_only_drops_stores_no_wire_hash_and_asks_no_key() -> None:
    read, sink = _Read(PEOPLE), _Sink()
    sync(read, sink, policy_run(None, {"email": "drop", "attributes.employment": "drop"}))
    assert read.known is None  # no matching: there are no hashes to match against
    assert all(not hasattr(r, "wire_hash") for r in sink.written)
    assert sink.written[0]["email"] is None and "employment" not in sink.written[0]["attributes"]


def test_a_restarted_final_frame_is_stored_under_the_policy_too(key: PiiKey) -> None:
    read, sink = _Read(PEOPLE, restart_after=1), _Sink()
    sync(read, sink, policy_run(key))
    assert [r["email"] for r in sink.written] == [hash_value(key, "email", RAW[0]), hash_value(key, "email", RAW[4])]


def test_the_keyed_matcher_hands_the_stored_hash_that_matched_to_the_claim(key: PiiKey) -> None:
    stored = _Stored({keyed("ab" * 32)})
    matcher = KeyedWireHashes(stored, key)
    matched = matcher.match("ab" * 32)
    assert isinstance(matched, KeyedMatch) and matched.keyed_wire_hash == keyed("ab" * 32)
    assert matched.handle == keyed("ab" * 32)  # the stored set's own handle, for the writer
    assert matcher.match("cd" * 32) is None and len(matcher) == 1
    assert KEY_TEXT not in repr(matcher) + repr(PolicyRun(PiiPolicy.parse(POLICY), key))


def test_the_keyed_matcher_also_matches_wire_hashes_keyed_with_hmac(key: PiiKey) -> None:
    stored = _Stored({keyed("ab" * 32), hmac_wire_hash(KEY_TEXT, "cd" * 32), hmac_wire_hash(KEY_TEXT, "ef" * 32)})
    matcher = KeyedWireHashes(stored, key)
    for raw in ("cd" * 32, "ef" * 32):  # the earlier form, then (tried first now) again
        found = matcher.match(raw)
        assert found is not None and found.keyed_wire_hash == hmac_wire_hash(KEY_TEXT, raw)
    found = matcher.match("ab" * 32)
    assert found is not None and found.keyed_wire_hash == keyed("ab" * 32)
    assert matcher.match("12" * 32) is None


def test_a_re_run_of_a_table_with_hmac_keyed_wire_hashes_decodes_only_what_changed(key: PiiKey) -> None:
    sink = _Sink()
    sync(_Read(PEOPLE), sink, policy_run(key))
    # The table as the HMAC-SHA-256 form left it: each stored wire hash keyed that way.
    earlier = [hmac_wire_hash(KEY_TEXT, wire_hash(p)) for p in _Read(PEOPLE)._pieces]
    sink.stored = _Stored(set(earlier))
    changed = _Read([PEOPLE[0], person(3, RAW[4], "+1 555 0199")])
    sync(changed, sink, policy_run(key))
    assert changed.known_records == 1 and [r["record_ref"] for r in changed.handed] == ["bos:person:3"]
    claim, decoded = sink.written
    assert type(claim) is KnownRecord and claim.wire_hash == earlier[0]  # the form the writer verifies
    assert decoded.wire_hash == keyed(wire_hash(changed._pieces[1]))  # a row written anew: the current form


def test_a_record_the_policy_cannot_hash_reaches_the_writer_refused_naming_its_ref_not_its_value(
        key: PiiKey) -> None:
    """The writer refuses it as a record it cannot store: quarantined or failing the run, as
    ``invalid_records`` says (tests/warehouse/test_pii_policy.py); no value of it goes on."""
    odd = {**person(4, RAW[0], RAW[1]), "display_name": {"given": "Ada", "family": "Lovelace"}}
    sink = _Sink()
    sync(_Read([PEOPLE[0], odd]), sink, policy_run(key, {**POLICY, "display_name": "hash"}))
    [refused] = [r for r in sink.written if isinstance(r, RefusedRecord)]
    assert refused.record_ref == "bos:person:4"
    assert re.fullmatch(r"Record 'bos:person:4' cannot be stored .* dict in display_name.*", refused.reason)
    assert "Lovelace" not in refused.reason and "Lovelace" not in repr(refused)
    assert len(sink.written) == 2
