"""The model of the tables: what the writer's tables must hold after each step, from the docs' rules.

Written from docs/sync-modes.md, docs/warehouse.md and docs/personal-data.md alone. It imports nothing
of ``airflow_provider_bos`` (no canonical JSON, no content hash, no policy plan, no wire hash): it is
the oracle the writer is held to, so sharing code with the writer would only prove the writer agrees
with itself.

What it keeps, per step:

* the records table: one :class:`Row` per record ever written and not erased (content as stored
  under the personal-data policy, the observation time of the read that last changed it, retired and
  superseded state, the run that last wrote or retired it, the wire hash);
* ``<table>_history`` (``history=True``): one :class:`Version` per write, the last one open while the
  row is current;
* ``<table>_lineage``: (superseded ref, successor ref, run) triples;
* ``<table>_sources``: derived from the rows (one entry per provenance entry, ``is_current`` as its row);
* the audit rows (:class:`RunRow`): the counts each run must report.

Rules (the docs' words in the comments where they decide something):

* a change is a change of content: everything but each entry's ``observed_at`` and the entries' order;
* an unchanged record is not rewritten (nor its history, nor its wire hash, unless it had none);
* a complete result supersedes a current row it does not return whose every entry it holds (smallest
  successor ref in ``_bos_superseded_by``, every successor in the lineage), in both modes; a partial
  one supersedes nothing;
* a complete full read retires the current rows of its scope it did not return, unless that is more
  than ``max_retire_fraction`` of them (then nothing, and the run is partial);
* a retired row that comes back is current again (updated); a partial read does not revive a row a
  complete read superseded while its successor is current (``withheld``);
* erasure deletes the refs named or found by email, phone or external id, and every ref merged into
  them (transitively), from every table;
* ``pii-apply`` rewrites stored rows as a run under the stricter policy would have stored them.
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import json
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

TEXT_FIELDS = ("display_name", "email", "phone")
JSON_FIELDS = ("lifecycle", "identity_match", "attributes")
CONTENT_FIELDS = TEXT_FIELDS + JSON_FIELDS
#: The provenance entry's keys the contract names; any other key is an extra ("sources[].*").
ENTRY_NAMED = ("source_type", "source_identity", "external_id", "record_type", "observed_at", "capabilities",
               "version")
COUNT_NAMES = ("inserted", "updated", "unchanged", "skipped_stale", "duplicates", "rejected", "retired",
               "superseded", "retire_withheld", "withheld")
#: The policy fields this model knows (docs/personal-data.md; the last four are the default rule and
#: the rules for lifecycle, identity_match and an entry's unnamed keys).
POLICY_FIELDS = ("display_name", "email", "phone", "attributes", "sources[].external_id", "lifecycle",
                 "identity_match", "sources[].*")


class ModelLimit(Exception):
    """A step the model does not decide (the docs leave it open): the example is not a valid one."""


class Refused(Exception):
    """The model says the call must be refused (e.g. an erasure by a dropped field)."""


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def record_observed_at(record: Mapping[str, Any]) -> datetime:
    """When a record was observed: the newest of its entries' stamps."""
    return max(parse_time(e["observed_at"]) for e in record["sources"])


def entry_key(entry: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """A provenance entry's identity: (source_type, source_identity, external_id)."""
    return (entry.get("source_type"), entry.get("source_identity"), entry.get("external_id"))


def content_key(stored: Mapping[str, Any]) -> str:
    """The content of a stored record: every field, each entry without ``observed_at``, in no order."""
    entries = sorted(canonical({k: v for k, v in e.items() if k != "observed_at"}) for e in stored["sources"])
    return canonical({**{name: stored[name] for name in CONTENT_FIELDS}, "sources": entries})


# --- personal data ----------------------------------------------------------------------------------

EXTERNAL_ID = "sources[].external_id"


def normalise(field_name: str, value: Any, recipe: int = 2) -> str:
    """The text a value is hashed as ("" for a string that normalises to nothing).

    Recipe 1 (docs/personal-data.md, "The hash recipe"): email NFC, trimmed, case-folded; phone NFKC,
    trimmed, only the digits 0-9 and a leading "+"; anything else NFC and trimmed; a number or boolean
    its JSON text. Recipe 2 (the recipe text of airflow_provider_bos/pii/keyed_hash.py): the same,
    but a phone keeps every script's decimal digits (as 0-9) and is "" without one, an external id
    is taken exactly, and a number is spelt by value (:func:`by_value`).
    """
    if isinstance(value, bool | int | float):
        return json.dumps(value if recipe == 1 else by_value(value))
    if field_name == "email":
        return unicodedata.normalize("NFC", value).strip().casefold()
    if field_name == "phone":
        text = unicodedata.normalize("NFKC", value).strip()
        if recipe == 1:
            return ("+" if text.startswith("+") else "") + "".join(c for c in text if c in "0123456789")
        digits = "".join(str(unicodedata.decimal(c)) for c in text if c.isdecimal())
        return ("+" + digits if text.startswith("+") else digits) if digits else ""
    if field_name == EXTERNAL_ID and recipe == 2:
        return value
    return unicodedata.normalize("NFC", value).strip()


def by_value(number: Any) -> Any:
    """docs/personal-data.md: recipe 2 spells a number by value, as every engine hands it back
    (``1e+16`` as ``10000000000000000``, ``-0.0`` as ``0.0``)."""
    if isinstance(number, float) and (number == 0 or "e+" in repr(number)):
        return int(Decimal(repr(number))) if number else 0.0
    return number


def _path_key(key: str) -> str:
    return key.replace("\\", "\\\\").replace(".", "\\.").replace("\0", "\\0")


class Key:
    """The personal-data key, and everything the docs derive from it (``recipe``: the hash recipe)."""

    def __init__(self, text: str, recipe: int = 2) -> None:
        self._secret = text.strip().encode()
        self.recipe = recipe

    def _mac(self, message: bytes) -> bytes:
        return hmac.new(self._secret, message, hashlib.sha256).digest()

    def hash(self, field_name: str, value: Any, path: tuple[str, ...] = ()) -> str | None:
        """The stored hash of one string, number or boolean of ``field_name`` (``path``: an attribute's
        keys below ``attributes``); None where recipe 2 stores a blank as null."""
        text = normalise(field_name, value, self.recipe)
        if self.recipe == 1:
            return self._mac(text.encode()).hex()
        if isinstance(value, str) and not text and field_name != EXTERNAL_ID:
            return None
        domain = ".".join(("attributes", *map(_path_key, path))) if field_name == "attributes" else field_name
        kind = "boolean" if isinstance(value, bool) else "number" if isinstance(value, int | float) else "string"
        return self._mac(b"\0".join((b"bos-pii/2", domain.encode(), kind.encode(), text.encode()))).hex()

    @property
    def key_id(self) -> str:
        return self._mac(b"bos-pii-key-id").hex()[:16]

    def wire(self, raw_wire_hash: str | None) -> str | None:
        """A wire hash as a policy stores it: BLAKE2b-256 of its hex, keyed with HMAC(key, "bos-pii-wire-hash")."""
        if raw_wire_hash is None:
            return None
        return hashlib.blake2b(raw_wire_hash.encode(), key=self._mac(b"bos-pii-wire-hash"), digest_size=32).hexdigest()


class Policy:
    """A personal-data policy over the fields this model uses (``None`` rules: no policy)."""

    def __init__(self, rules: Mapping[str, str] | None = None) -> None:
        self.rules = dict(rules or {})

    def __repr__(self) -> str:
        return f"Policy({self.rules!r})"

    def action(self, name: str) -> str:
        if name in self.rules:
            return self.rules[name]
        if name == "attributes" and "attributes.*" in self.rules:
            return self.rules["attributes.*"]
        return self.rules.get("*", "keep")

    @property
    def empty(self) -> bool:
        return all(self.action(name) == "keep" for name in POLICY_FIELDS)

    @property
    def hashes(self) -> bool:
        return any(self.action(name) == "hash" for name in POLICY_FIELDS)

    def fingerprint(self, key: Key) -> dict[str, Any]:
        """docs/personal-data.md: canonical rules, recipe 1, the key id (null when nothing is hashed)."""
        rules = {name: self.action(name) for name in POLICY_FIELDS if self.action(name) != "keep"}
        return {"key_id": key.key_id if self.hashes else None, "recipe": key.recipe, "rules": rules}

    def loosens(self, new: Policy) -> list[str]:
        """The fields ``new`` would store looser than this policy (hash/drop -> keep, drop -> hash)."""
        order = {"keep": 0, "hash": 1, "drop": 2}
        return [name for name in POLICY_FIELDS if order[new.action(name)] < order[self.action(name)]]

    def delta(self, new: Policy) -> Policy:
        """What rows stored under this policy need to be stored as under ``new``: hash what was kept and
        is hashed now, drop what is dropped now and was not; a hashed value is not hashed again."""
        rules = {}
        for name in POLICY_FIELDS:
            before, after = self.action(name), new.action(name)
            if (before, after) == ("keep", "hash"):
                rules[name] = "hash"
            elif after == "drop" and before != "drop":
                rules[name] = "drop"
            else:
                rules[name] = "keep"
        return Policy(rules)


def _hash_tree(key: Key, name: str, value: Any, path: tuple[str, ...] = ()) -> Any:
    """docs: the same structure, every string, number and boolean replaced by its hash; keys, empty
    objects and lists stay; null is never hashed. Lists are looked through (the path is the keys')."""
    if value is None:
        return None
    if isinstance(value, dict):
        return {k: _hash_tree(key, name, v, (*path, k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_hash_tree(key, name, v, path) for v in value]
    return key.hash(name, value, path)


def apply_policy(record: Mapping[str, Any], policy: Policy, key: Key) -> dict[str, Any]:
    """The record as stored: its six content fields (absent = null) and its sources, under ``policy``."""
    stored: dict[str, Any] = {}
    for name in CONTENT_FIELDS:
        value = copy.deepcopy(record.get(name, {} if name == "attributes" else None))
        action = policy.action(name)
        if action == "drop":
            value = {} if name == "attributes" else None
        elif action == "hash" and value is not None:
            value = key.hash(name, value) if name in TEXT_FIELDS else _hash_tree(key, name, value)
        stored[name] = value
    sources = []
    for original in record["sources"]:
        entry = copy.deepcopy(dict(original))
        if policy.action("sources[].external_id") == "hash":
            entry["external_id"] = key.hash(EXTERNAL_ID, entry["external_id"])
        extra = policy.action("sources[].*")
        for name in [k for k in entry if k not in ENTRY_NAMED]:
            if extra == "drop":
                del entry[name]
            elif extra == "hash":
                entry[name] = _hash_tree(key, "sources[].*", entry[name])
        sources.append(entry)
    stored["sources"] = sources
    return stored


# --- the tables -------------------------------------------------------------------------------------

@dataclass
class Row:
    """A row of the records table."""

    ref: str
    stored: dict[str, Any]
    observed_at: datetime
    run_id: str
    wire_hash: str | None
    raw_wire_hash: str | None  # the read's own, unkeyed (what pii-apply keys)
    deleted_at: datetime | None = None
    superseded_by: str | None = None

    @property
    def current(self) -> bool:
        return self.deleted_at is None

    @property
    def key(self) -> str:
        return content_key(self.stored)


@dataclass
class Version:
    """A version of ``<table>_history``."""

    stored: dict[str, Any]
    observed_at: datetime
    run_id: str
    open: bool = True
    #: Closed by the next write of the row (its end is the next version's start), not by a retire.
    replaced: bool = False

    @property
    def key(self) -> str:
        return content_key(self.stored)


@dataclass
class RunRow:
    """An audit row as the model expects it."""

    run_id: str
    kind: str  # "sync", "erase" or "pii-apply"
    status: str = "complete"
    completeness: str | None = None
    result_count: int | None = None
    counts: dict[str, int] = field(default_factory=dict)
    confirmed_at: datetime | None = None
    coverage: dict[str, Any] | None = None
    notes: tuple[str, ...] = ()
    source_errors: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Erased:
    """What an erasure must report."""

    found: int = 0
    merged: int = 0
    successors: int = 0
    records: int = 0
    history: int = 0
    lineage: int = 0
    sources: int = 0
    rejects: int = 0


@dataclass
class Applied:
    """What a pii-apply must report."""

    records: int = 0
    history: int = 0
    wire_hashes: int = 0


class TablesModel:
    """Every table of one records table, as the docs say the writer leaves it."""

    def __init__(self, *, key: Key, policy: Policy | None = None, history: bool = True,
                 deletions: str = "soft", max_retire_fraction: float | None = 0.5) -> None:
        self.key = key
        self.policy = policy or Policy()
        self.history_on = history
        self.deletions = deletions
        self.max_retire_fraction = max_retire_fraction
        self.rows: dict[str, Row] = {}
        self.history: dict[str, list[Version]] = {}
        self.lineage: list[tuple[str, str, str]] = []
        self.runs: dict[str, RunRow] = {}
        #: Refs erased and not written since: they must appear in no table.
        self.erased: set[str] = set()
        #: What the last step did to rows: written or retired (every column may change), or only
        #: given a wire hash; None: every row may have changed (pii-apply).
        self.touched: set[str] | None = set()
        self.wire_only: set[str] = set()

    # --- a sync run --------------------------------------------------------------------------------

    def stored_wire_hash(self, raw: str | None) -> str | None:
        """A written row's wire hash: the read's own, keyed under a policy (the run has the key)."""
        return raw if self.policy.empty else self.key.wire(raw)

    def _close(self, ref: str, *, replaced: bool = False) -> None:
        for version in self.history.get(ref, []):
            if version.open:
                version.open, version.replaced = False, replaced

    def _write(self, ref: str, stored: dict[str, Any], observed_at: datetime, run_id: str, raw: str | None) -> None:
        previous = self.rows.get(ref)
        if previous is not None and observed_at < previous.observed_at:
            raise ModelLimit("a record observed earlier than its row (the steps only move forward)")
        self.rows[ref] = Row(ref, stored, observed_at, run_id, self.stored_wire_hash(raw), raw)
        if self.history_on:
            self._close(ref, replaced=True)
            self.history.setdefault(ref, []).append(Version(copy.deepcopy(stored), observed_at, run_id))
        self.erased.discard(ref)
        assert self.touched is not None
        self.touched.add(ref)

    def _retire(self, row: Row, read_at: datetime, run_id: str, successor: str | None) -> None:
        row.deleted_at = read_at
        row.superseded_by = successor
        row.run_id = run_id
        self._close(row.ref)
        assert self.touched is not None
        self.touched.add(row.ref)
        if self.deletions == "hard":
            del self.rows[row.ref]

    def sync(self, records: list[dict[str, Any]], wire_hashes: list[str | None], *, run_id: str, mode: str,
             complete: bool, read_at: datetime, source_errors: Iterable[dict[str, Any]] = ()) -> dict[str, int]:
        """One run's records (as the read sent them, raw): the counts it must report."""
        self.touched, self.wire_only = set(), set()
        counts = dict.fromkeys(COUNT_NAMES, 0)
        # Duplicate refs: the latest observed_at wins, then the last occurrence.
        winners: dict[str, tuple[dict[str, Any], str | None, datetime]] = {}
        for record, raw in zip(records, wire_hashes, strict=True):
            ref, seen = record["record_ref"], record_observed_at(record)
            if ref in winners:
                counts["duplicates"] += 1
                if seen < winners[ref][2]:
                    continue
            winners[ref] = (record, raw, seen)
        returned: set[str] = set()
        for ref, (record, raw, seen) in winners.items():
            stored = apply_policy(record, self.policy, self.key)
            row = self.rows.get(ref)
            if row is None:
                counts["inserted"] += 1
                self._write(ref, stored, seen, run_id, raw)
            elif row.current:
                if row.key == content_key(stored):
                    counts["unchanged"] += 1
                    if row.wire_hash is None and raw is not None:  # "the only column that run writes in them"
                        row.wire_hash, row.raw_wire_hash = self.stored_wire_hash(raw), raw
                        self.wire_only.add(ref)
                else:
                    counts["updated"] += 1
                    self._write(ref, stored, seen, run_id, raw)
            elif (not complete and row.superseded_by is not None and row.superseded_by in self.rows
                  and self.rows[row.superseded_by].current):
                counts["withheld"] += 1  # "a partial read revives nothing merged away"
                continue
            else:
                counts["updated"] += 1  # "a retired record that comes back is current again"
                self._write(ref, stored, seen, run_id, raw)
            returned.add(ref)
        if complete:
            holders: dict[tuple[Any, Any, Any], set[str]] = {}
            for ref in returned:
                for entry in self.rows[ref].stored["sources"]:
                    holders.setdefault(entry_key(entry), set()).add(ref)
            for row in sorted(self.rows.values(), key=lambda r: r.ref):
                if not row.current or row.ref in returned:
                    continue
                keys = [entry_key(e) for e in row.stored["sources"]]
                if keys and all(k in holders for k in keys):
                    successors = sorted(set().union(*(holders[k] for k in keys)))
                    self.lineage.extend((row.ref, s, run_id) for s in successors)
                    self._retire(row, read_at, run_id, successors[0])
                    counts["superseded"] += 1
        status = "complete" if complete else "partial"
        notes: list[str] = []
        if mode == "full" and complete:
            gone = [row for row in self.rows.values() if row.current and row.ref not in returned]
            # "more than that fraction of its scope's current rows": the rows it returned (current now)
            # and the ones it did not return, after the merge and the supersession.
            scope = sum(1 for row in self.rows.values() if row.current)
            fraction = self.max_retire_fraction
            if gone and fraction is not None and len(gone) > fraction * scope:
                counts["retire_withheld"] = len(gone)
                status = "partial"
                notes.append(f"max_retire_fraction={fraction:g}")
            else:
                for row in gone:
                    self._retire(row, read_at, run_id, None)
                    counts["retired"] += 1
        elif mode == "full":
            notes.append("Nothing was retired")
        covered = [self.rows[ref] for ref in returned if ref in self.rows and self.rows[ref].current]
        coverage = {"records": len(covered), "columns": {
            name: sum(1 for row in covered if row.stored[name] not in (None, ""))
            for name in TEXT_FIELDS if self.policy.action(name) != "drop"}}
        self.runs[run_id] = RunRow(
            run_id, "sync", status=status, completeness="complete" if complete else "partial",
            result_count=len(records), counts=dict(counts),
            # "a complete full read's read time (null on every other run)": one the guard made partial
            # is no complete run.
            confirmed_at=read_at if mode == "full" and status == "complete" else None,
            coverage=coverage, notes=tuple(notes),
            source_errors=list(source_errors))
        return counts

    # --- erasure ------------------------------------------------------------------------------------

    def _stored_versions(self) -> list[tuple[str, dict[str, Any]]]:
        found = [(ref, row.stored) for ref, row in self.rows.items()]
        found += [(ref, v.stored) for ref, versions in self.history.items() for v in versions]
        return found

    def find(self, *, emails: Iterable[str] = (), phones: Iterable[str] = (), external_ids: Iterable[str] = (),
             external_ids_of_type: Iterable[str] = ()) -> set[str]:
        """The refs whose row or any history version holds one of the values (docs/personal-data.md,
        "Erasure": hashed fields compared as hashes, kept ones normalised as the recipe does). An
        external id ``SOURCE:ID`` is an entry of the source_identity SOURCE, ``TYPE:ID`` (of type) one
        of any source of that source_type; the id is taken exactly."""
        stored = self._stored_versions()
        recipe = self.key.recipe
        found: set[str] = set()
        for name, values in (("email", list(emails)), ("phone", list(phones))):
            if not values:
                continue
            action = self.policy.action(name)
            if action == "drop":
                raise Refused(f"{name} is dropped: not stored")
            for value in values:
                if name == "phone" and not normalise("phone", value, recipe).lstrip("+"):
                    raise Refused("a phone number must hold a digit")
                for ref, record in stored:
                    held = record[name]
                    if not isinstance(held, str):
                        continue
                    if action == "hash":
                        if held == self.key.hash(name, value):
                            found.add(ref)
                    elif normalise(name, held, recipe) == normalise(name, value, recipe):
                        found.add(ref)
        hashed = self.policy.action(EXTERNAL_ID) == "hash"
        for column, values in (("source_identity", external_ids), ("source_type", external_ids_of_type)):
            for value in values:
                source, _, external_id = value.partition(":")
                wanted = self.key.hash(EXTERNAL_ID, external_id) if hashed else external_id
                for ref, record in stored:
                    if any(e[column] == source and e["external_id"] == wanted for e in record["sources"]):
                        found.add(ref)
        return found

    def successors(self, ref: str) -> set[str]:
        """The records ``ref`` was merged or split into, as the lineage and its row say."""
        found = {s for r, s, _ in self.lineage if r == ref}
        row = self.rows.get(ref)
        if row is not None and row.superseded_by is not None:
            found.add(row.superseded_by)
        return found

    def erase(self, *, refs: Iterable[str] = (), emails: Iterable[str] = (), phones: Iterable[str] = (),
              external_ids: Iterable[str] = (), external_ids_of_type: Iterable[str] = (),
              keep_successors: Iterable[str] = (), run_id: str) -> Erased:
        """An erasure: the refs named or found, the same people's records through the lineage both ways
        (back: every record merged into an erased one; forward: the one record an erased one was merged
        into, when that is its only successor). A split is not followed: when one of its records is
        erased the others are left; when none is, the erasure is :class:`Refused` (nothing changes)
        until the others are named to keep."""
        named, keep = set(refs), set(keep_successors)
        found = self.find(emails=emails, phones=phones, external_ids=external_ids,
                          external_ids_of_type=external_ids_of_type)
        gone = named | found
        merged: set[str] = set()
        later: set[str] = set()
        while True:
            back = {row.ref for row in self.rows.values() if row.superseded_by in gone}
            back |= {pred for pred, successor, _ in self.lineage if successor in gone}
            back -= gone
            forward = set()
            for ref in gone | back:
                successors = self.successors(ref)
                if len(successors) == 1 and not successors & (gone | back | keep):
                    forward |= successors
            if not back and not forward:
                break
            merged |= back
            later |= forward - back
            gone |= back | forward
        if keep & gone:
            raise Refused(f"refs both to keep and to erase: {sorted(keep & gone)}")
        undecided = [sorted(self.successors(ref)) for ref in sorted(gone)
                     if len(self.successors(ref)) > 1 and not self.successors(ref) & gone
                     and self.successors(ref) - gone - keep]
        if undecided:
            error = Refused(f"splits to decide: {undecided}")
            error.keep = sorted({s for group in undecided for s in group})  # type: ignore[attr-defined]
            raise error
        self.touched, self.wire_only = set(), set()
        result = Erased(found=len(found), merged=len(merged), successors=len(later))
        for ref in sorted(gone):
            row = self.rows.pop(ref, None)
            if row is not None:
                result.records += 1
                result.sources += len(row.stored["sources"])
            result.history += len(self.history.pop(ref, []))
        kept = [t for t in self.lineage if t[0] not in gone and t[1] not in gone]
        result.lineage = len(self.lineage) - len(kept)
        self.lineage = kept
        self.erased |= gone
        self.runs[run_id] = RunRow(run_id, "erase", result_count=len(gone))
        return result

    # --- pii-apply -----------------------------------------------------------------------------------

    def pii_apply(self, rules: Mapping[str, str], *, run_id: str) -> Applied:
        """A stricter policy applied to the stored rows (docs/personal-data.md, "Re-applying a stricter
        policy"). A looser one is :class:`Refused`."""
        new = Policy(rules)
        looser = self.policy.loosens(new)
        if looser:
            raise Refused(f"looser for {looser}")
        applied = Applied()
        if canonical(new.fingerprint(self.key)) == canonical(self.policy.fingerprint(self.key)) or (
                self.policy.empty and new.empty):
            self.touched, self.wire_only = set(), set()
            return applied
        self.touched, self.wire_only = None, set()
        delta = self.policy.delta(new)
        for row in self.rows.values():
            rewritten = apply_policy(row.stored, delta, self.key)
            if content_key(rewritten) != row.key:
                applied.records += 1
            row.stored = rewritten
            if row.wire_hash is not None:
                applied.wire_hashes += 1
                # Raw wire hashes (no policy before) are keyed; a policy's own are cleared.
                row.wire_hash = self.key.wire(row.raw_wire_hash) if self.policy.empty else None
        for versions in self.history.values():
            for version in versions:
                rewritten = apply_policy(version.stored, delta, self.key)
                if content_key(rewritten) != version.key:
                    applied.history += 1
                version.stored = rewritten
        self.policy = new
        self.runs[run_id] = RunRow(run_id, "pii-apply", result_count=applied.records)
        return applied

    def last_confirmed(self) -> dict[str, datetime]:
        """docs/sync-modes.md, "When was a person last confirmed?": each current row's later of its
        ``_bos_observed_at`` and the newest ``confirmed_at`` of its scope (one scope here)."""
        confirmed = [run.confirmed_at for run in self.runs.values() if run.confirmed_at is not None]
        newest = max(confirmed, default=None)
        return {ref: max(row.observed_at, newest) if newest is not None else row.observed_at
                for ref, row in self.rows.items() if row.current}

    # --- derived tables ------------------------------------------------------------------------------

    def provenance(self) -> set[tuple[Any, ...]]:
        """``<table>_sources``: (ref, entry_index, source_type, source_identity, external_id, record_type,
        version as text, capabilities as canonical JSON, is_current)."""
        entries = set()
        for ref, row in self.rows.items():
            for index, e in enumerate(row.stored["sources"]):
                version = e.get("version")
                entries.add((ref, index, e["source_type"], e["source_identity"], e["external_id"], e["record_type"],
                             None if version is None else str(version), canonical(e["capabilities"]), row.current))
        return entries
