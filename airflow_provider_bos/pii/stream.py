"""A run's final records as a personal-data policy stores them, with keyed wire hashes.

The run side of a policy (:func:`airflow_provider_bos.sync.run_sync` applies it between the read
and the writer, so nothing raw reaches staging files, tables, audit notes or rejects):

* every record is replaced by ``plan.apply(record)`` (:class:`~.plan.PiiPlan`);
* its wire hash (the SHA-256 of its exact JSON bytes, :func:`~airflow_provider_bos.wire.wire_hash`)
  is stored **keyed** (:meth:`~.keyed_hash.PiiKey.wire_hash_hex`: BLAKE2b-256 of the raw wire hash's
  hex under a key derived from the policy's key), lowercase hex. A plain digest of the raw bytes
  would let anyone reading the table confirm a guessed email or phone by hashing candidate
  records; under the key it reveals nothing. The stored hashes still work as the
  shortcut they are: the read matches each record's raw wire hash *keyed first*
  (:class:`KeyedWireHashes`), so an unchanged record of a re-run is still not decoded, and its
  :class:`~airflow_provider_bos.wire.KnownRecord` claim carries the keyed hash and the writer's
  own stored set, as the writer verifies it.
* a policy that only drops needs no key. Given one (the key connection is configured), its wire
  hashes are keyed as above, and the key stays out of the table's policy: a key only ever makes
  unchanged records skippable. Without one it stores no wire hash at all (a keyless digest of the
  raw record would confirm guesses of what was dropped), and its re-runs decode every record (and
  still rewrite none that did not change).

A run without a policy (``None``, or a policy that keeps everything) never gets here: its records
and hashes are the read's own, untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, cast

from airflow_provider_bos.exceptions import BosConfigurationError, BosFinalFrameRestarted, BosResultError
from airflow_provider_bos.pii.fingerprint import PolicyFingerprint
from airflow_provider_bos.pii.keyed_hash import PiiKey
from airflow_provider_bos.pii.policy import PiiPolicy
from airflow_provider_bos.wire import KnownRecord, KnownWireHashes, RefusedRecord, WireRecord

__all__ = ["KeyedMatch", "KeyedWireHashes", "PolicyRun"]


def _unhashable(record: dict[str, Any], exc: BosConfigurationError) -> RefusedRecord:
    """A record the policy cannot store, as the writer refuses it (its ref and field, never a value):
    quarantined or failing the run, as ``invalid_records`` says."""
    ref = record.get("record_ref")
    shown = repr(ref[:80]) if isinstance(ref, str) else "without a record_ref"
    return RefusedRecord(ref if isinstance(ref, str) else None,
                         f"Record {shown} cannot be stored under the personal-data policy: {exc}")


class KeyedMatch:
    """What :meth:`KeyedWireHashes.match` hands the read for a stored record: the stored (keyed) wire
    hash that matched, which the claim carries, and the stored set's own handle."""

    __slots__ = ("keyed_wire_hash", "handle")

    def __init__(self, keyed_wire_hash: str, handle: object) -> None:
        self.keyed_wire_hash = keyed_wire_hash
        self.handle = handle


def _hmac_wire_hash(key: PiiKey) -> Callable[[str], str]:
    """The keyed wire hash of tables written before :meth:`PiiKey.wire_hash_hex`: HMAC-SHA-256."""
    digest_hex = key.digest_hex
    return lambda raw_wire_hash: digest_hex(raw_wire_hash.encode("ascii"))


class KeyedWireHashes:
    """The writer's stored (keyed) wire hashes as a read matches raw ones: each keyed, then looked up.

    The :class:`~airflow_provider_bos.wire.KnownWireHashes` given to the read; ``stored`` is the
    writer's own set, which :meth:`PolicyRun.stored_records` puts back on each claim. A table written
    before the wire hashes were keyed with BLAKE2b holds HMAC-SHA-256 ones: a raw hash is looked up in
    both forms, the one that matched last first, so that table's unchanged records are still not
    decoded (their rows keep the form they hold; a row written anew takes the current one).
    """

    __slots__ = ("stored", "_forms")

    def __init__(self, stored: KnownWireHashes, key: PiiKey) -> None:
        self.stored = stored
        self._forms = [key.wire_hash_hex, _hmac_wire_hash(key)]

    def match(self, wire_hash: str) -> KeyedMatch | None:
        forms = self._forms
        for keyed_form in forms:
            keyed = keyed_form(wire_hash)
            handle = self.stored.match(keyed)
            if handle is not None:
                if keyed_form is not forms[0]:
                    forms.reverse()  # the table's rows are likely all of this form: it goes first now
                return KeyedMatch(keyed, handle)
        return None

    def __len__(self) -> int:
        return len(self.stored)

    def __repr__(self) -> str:
        return f"KeyedWireHashes({len(self.stored)} stored)"


class PolicyRun:
    """One run's personal-data policy, bound to its key: the fingerprint the table must hold, the
    matcher the read gets, and the records as they are stored.

    ``key`` may be ``None`` only for a policy that hashes nothing (:attr:`PiiPolicy.needs_key`);
    such a policy given a key uses it for the wire hashes alone.
    """

    def __init__(self, policy: PiiPolicy, key: PiiKey | None) -> None:
        self.policy = policy
        self.plan = policy.plan(key)
        #: What the table remembers (recipe, rules, and the key's id when a field is hashed); never the key.
        self.fingerprint: PolicyFingerprint = self.plan.fingerprint
        self._key = key

    @classmethod
    def of(cls, policy: PiiPolicy, key: PiiKey | None) -> PolicyRun | None:
        """The run of ``policy`` with ``key``; ``None`` for a policy that keeps everything (the run
        then has no policy: its records and wire hashes are the read's own)."""
        return None if policy.is_empty else cls(policy, key)

    def __repr__(self) -> str:
        return f"PolicyRun({self.fingerprint.text})"

    def rule_report(self) -> str:
        """What each rule did to the records this run decoded (a count per rule, never a value), and the
        rules that met no value: a rule naming a path the records do not have changes nothing."""
        plan = self.plan
        done = {"hash": "hashed", "drop": "dropped", "keep": "kept"}
        counts = ", ".join(f"{rule} {done[plan.policy_rules[rule]]} in {n}" for rule, n in sorted(plan.matched.items()))
        unmatched = sorted(rule for rule, n in plan.matched.items() if not n)
        note = f"Personal-data policy over the {plan.records} record(s) decoded: {counts}."
        if unmatched and plan.records:
            note += (f" Rule(s) that met no value: {', '.join(unmatched)} (a path the records do not have: check "
                     "its spelling).")
        return note

    def known_wire_hashes(self, stored: KnownWireHashes) -> KeyedWireHashes | None:
        """The matcher for the read: ``stored`` keyed (``None`` without a key: no wire hashes are stored)."""
        return KeyedWireHashes(stored, self._key) if self._key is not None else None

    def stored_records(self, records: Iterator[Any], matcher: KeyedWireHashes | None) -> Iterator[Any]:
        """``records`` as the policy stores them (``matcher``: the one the read matched claims in).

        A restarted final frame (:class:`BosFinalFrameRestarted`) is passed on with its records
        transformed too, so the writer's retry sees the same stored form.
        """
        # The per-record loop of a policy run: flat, with locals, one generator, on purpose.
        apply = self.plan.apply
        keyed_wire_hash = self._key.wire_hash_hex if self._key is not None else None
        wire_record, known_record = WireRecord, KnownRecord
        try:
            for record in records:
                kind = type(record)
                if kind is wire_record:
                    try:
                        stored: Any = apply(record, into=wire_record)
                    except BosConfigurationError as exc:  # an object or list where a hashed value goes
                        yield _unhashable(record, exc)
                        continue
                    if keyed_wire_hash is not None:
                        raw = getattr(record, "wire_hash", None)
                        if raw is not None:
                            stored.wire_hash = keyed_wire_hash(raw)
                    yield stored
                elif kind is known_record:
                    if matcher is None or record.matched is not matcher:
                        # Only claims matched in this run's keyed matcher can be verified by the writer.
                        raise BosResultError(
                            "A record came through as already stored without the personal-data policy's "
                            "keyed wire hashes; the run is stopped (nothing is written)."
                        )
                    matched = cast(KeyedMatch, record.handle)  # what this run's matcher gave the read
                    yield known_record(record.record_ref, matched.keyed_wire_hash, matcher.stored, matched.handle,
                                       record.observed_at)
                elif isinstance(record, dict):
                    try:
                        plain = apply(record)  # a record built another way: no wire hash to key
                    except BosConfigurationError as exc:
                        yield _unhashable(record, exc)
                    else:
                        yield plain
                else:
                    yield record  # not a record: the writer's check says what is wrong with it
        except BosFinalFrameRestarted as restart:
            raise BosFinalFrameRestarted(self.stored_records(restart.records, matcher),
                                         observations=restart.observations) from None
