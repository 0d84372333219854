"""The federation engine of the reference server: what a federated read streams, and its final result.

Pure Python, no I/O. :func:`plan_read` turns a :class:`~airflow_provider_bos.testing.scenario.Scenario`
into a :class:`PlannedRead`, which yields the ``notifications/bos/source_result`` params in
simulated-time order and then the authoritative, identity-merged final records. Both are
generators built on arithmetic, not stored lists: memory stays O(one page) whatever the record
count, and the same scenario always yields the same values.

Identities. Every person has a 64-bit id ``hid = mix(seed_key ^ key)`` where ``key`` is the shared
person's number ``j`` or ``(source_salt << 40) | local_index``; ``mix`` (the splitmix64
finaliser) is a bijection, so ids, and the canonical refs ``bos:person:<hid as 16 hex>``
made from them, never collide. Shared person ``j`` sits at local index ``j * records // shared``
of every non-empty source, so which sources delivered it is arithmetic too.

Ordering rules (documented for clients and tests):
- notifications are sorted by simulated time; ties go to the source listed first in the
  scenario, then to that source's earlier notification; ``sequence`` is 1..N in that order;
- a source's pages have ``pageIndex`` 1..n; its one terminal notification carries the last
  delivered page's index (``0`` if none): ``complete``, or ``error`` with ``records: []``;
- final records: shared people (by ``j``, if at least one source delivered them), then each
  source's own people in scenario order and delivery order.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import heapq
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import islice
from typing import Any

from airflow_provider_bos.testing import whole_values as whole
from airflow_provider_bos.testing.days import DayState, Joiner, resolve_day, seed_key_of
from airflow_provider_bos.testing.days import mix as _mix
from airflow_provider_bos.testing.scenario import MAX_CONCURRENT_SOURCES, Scenario, load_scenario

__all__ = [
    "LONG_EXTERNAL_ID_REF",
    "DayChangeRefs",
    "ExpectedFinal",
    "ExpectedRecord",
    "PlannedRead",
    "build_operation_result",
    "day_changes",
    "expected_final",
    "plan_read",
    "unstamped",
]

_M64 = (1 << 64) - 1
_SALT_BITS = 24
_INDEX_BITS = 40


def _stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


# --- deterministic data tables ----------------------------------------------------------------
# (display, ascii slug for the email). 32 entries each so a 5-bit field indexes them.

_FIRST = (
    ("Zoë", "zoe"), ("José", "jose"), ("Søren", "soren"), ("Łukasz", "lukasz"),
    ("Özlem", "ozlem"), ("Anaïs", "anais"), ("Björn", "bjorn"), ("Chloé", "chloe"),
    ("Dário", "dario"), ("Eléonore", "eleonore"), ("François", "francois"), ("Grzegorz", "grzegorz"),
    ("Hélène", "helene"), ("Ingrid", "ingrid"), ("Jürgen", "jurgen"), ("Kateřina", "katerina"),
    ("Liam", "liam"), ("Maëlle", "maelle"), ("Nuño", "nuno"), ("Oğuz", "oguz"),
    ("Pål", "pal"), ("Renée", "renee"), ("Siobhán", "siobhan"), ("Tomás", "tomas"),
    ("Ελένη", "eleni"), ("Дмитрий", "dmitry"), ("Wojciech", "wojciech"), ("Ximena", "ximena"),
    ("Yusuf", "yusuf"), ("Zdeněk", "zdenek"), ("Mary-Kate", "mary-kate"), ("Amélie", "amelie"),
)
_LAST = (
    ("Ångström", "angstrom"), ("Núñez", "nunez"), ("Müller", "muller"), ("Dvořák", "dvorak"),
    ("Ólafsdóttir", "olafsdottir"), ("Nguyễn", "nguyen"), ("Kowalczyk", "kowalczyk"),
    ("Øvergård", "overgard"), ("Şahin", "sahin"), ("García Márquez", "garcia.marquez"),
    ("O'Brien", "obrien"), ("van der Berg", "vanderberg"), ("Lefèvre", "lefevre"),
    ("Παπαδοπούλου", "papadopoulou"), ("Jørgensen", "jorgensen"), ("Schäfer", "schafer"),
    ("Żółkiewski", "zolkiewski"), ("Gonçalves", "goncalves"), ("Ibáñez", "ibanez"), ("Čapek", "capek"),
    ("Nowak", "nowak"), ("Häkkinen", "hakkinen"), ("Smith", "smith"), ("Dubois", "dubois"),
    ("Rossi", "rossi"), ("Fernández", "fernandez"), ("Иванова", "ivanova"),
    ("Ó Súilleabháin", "osuilleabhain"),
    ("Björklund", "bjorklund"), ("Eriksson", "eriksson"), ("Al-Hashimi", "al-hashimi"), ("Mbeki", "mbeki"),
)
# Family-name-first scripts: display is family + given without a space.
_EAST_FAMILY = (("李", "li"), ("王", "wang"), ("张", "zhang"), ("陈", "chen"),
                ("佐藤", "sato"), ("鈴木", "suzuki"), ("김", "kim"), ("박", "park"))
_EAST_GIVEN = (("雷", "lei"), ("芳", "fang"), ("伟", "wei"), ("秀英", "xiuying"),
               ("花子", "hanako"), ("太郎", "taro"), ("민준", "minjun"), ("서연", "seoyeon"))
_DOMAINS = ("example.com", "example.org", "example.net", "corp.example")
_DEPARTMENTS = ("Engineering", "Finance", "Human Resources", "Legal & Compliance",
                "Research & Development", "Sales — EMEA", "Customer Success", "Operations")
_TITLES = ("Software Engineer", "Senior Accountant", "HR Business Partner", "Counsel",
           "Data Scientist", "Account Executive", "Support Specialist", "Site Reliability Engineer")
_SITES = (("Zürich", "CH"), ("São Paulo", "BR"), ("München", "DE"), ("Kraków", "PL"),
          ("東京", "JP"), ("New York", "US"), ("Montréal", "CA"), ("Reykjavík", "IS"))
_GROUPS = ("all-staff", "vpn-users", "github:org-members", "finance-readers",
           "on-call", "Ärzte & Pflege", "building-7/floor-2", "mentors")
_EMPLOYMENT = ("full_time", "full_time", "part_time", "contractor")
_FTE = (1.0, 1.0, 0.8, 0.5)
_LIFECYCLE = ("active", "active", "active", "active", "onboarding", "on_leave", "suspended", "terminated")
_NICKNAME = 'The "Boss" \\ ✨\nsecond line'
_REV_KEY = 0x9E3779B97F4A7C15

@dataclass(frozen=True, slots=True)
class _SourcePlan:
    """Everything about one source that the generators need, computed once at plan time."""

    index: int
    source_type: str
    source_identity: str
    salt: int
    ext_prefix: str  # external_id = ext_prefix + str(ext_base + local_index)
    ext_base: int
    ref_prefix: str  # provisional record_ref prefix
    records: int  # R: the source's records (shared people included)
    shared: int  # S: shared people inside those records (0 for an empty source)
    page_size: int
    delivered: int
    pages: int
    error: str | None
    shared_delivered: int  # shared people j < shared_delivered were delivered by this source
    first_page_ms: float
    page_delay_ms: float
    terminal_ms: float
    observed_at_iso: str
    stamps_z: tuple[str, ...]  # provenance observed_at of a record last changed on day d: [d - 1]
    capabilities: tuple[str, ...]
    versioned: bool
    # The day's changes (see testing/days.py); all empty on day 1.
    left: tuple[int, ...]  # sorted base indices whose people left: not in the pages any more
    joiners: tuple[Joiner, ...]  # after the base records in the pages
    merged_away: frozenset[int]  # base indices whose final record is a merged one
    bumps: dict[int, int]
    stamp_days: dict[int, int]
    cutoff: int  # base indices below it were delivered (the left ones aside)
    joiners_delivered: int
    name_hids: dict[int, int]  # base index -> the id whose name it carries (a later merge's twin)

    def ext(self, i: int) -> str:
        return f"{self.ext_prefix}{self.ext_base + i}"

    def joiner_ext(self, joiner: Joiner) -> str:
        return f"{self.ext_prefix}{self.ext_base + self.records + joiner.number}"

    def shared_pos(self, j: int) -> int:
        return j * self.records // self.shared

    def source_ref(self) -> dict[str, str]:
        return {"source_type": self.source_type, "source_identity": self.source_identity}


# FaultSpec.unstorable_final_records: well-formed on the wire, but no warehouse table can store them.
_UNSTORABLE: tuple[tuple[str, dict[str, Any]], ...] = (
    ("bos:person:" + "x" * 600, {}),  # longer than the key column (512)
    ("bos:person:unstorable-shape", {"display_name": {"given": "Ada", "family": "Lovelace"}}),  # not text
)


#: The record of ``FaultSpec.long_external_id_final_record``: its one provenance entry's external_id
#: is 600 characters, longer than the provenance table's columns (512).
LONG_EXTERNAL_ID_REF = "bos:person:long-external-id"


class PlannedRead:
    """One planned federated read; iterate it as often as you like, it yields the same values.

    ``final_metadata`` is the final result's ``metadata`` (treat it as read-only; use
    :func:`build_operation_result` for a private copy); ``is_error`` is True iff it is partial
    (unless the scenario's ``faults.final_contradiction`` makes the result contradict itself).
    """

    def __init__(
        self,
        scenario: Scenario,
        *,
        request_id: str | int,
        context: dict,
        arguments: dict,
        day: int = 1,
        read_index: int = 0,
    ) -> None:
        self.request_id = request_id
        self.context = context
        # The engine delivers the scenario's data whatever the business arguments say (no filter,
        # no limit): tests get exactly the records the scenario describes.
        self.arguments = arguments
        self.day = scenario.check_day(day)
        self._seed_key = seed_key_of(scenario)
        self._revision = scenario.revision
        state = resolve_day(scenario, self.day)
        #: Every record stamped with this read's observation (the contract's example), not its last change.
        self._stamp_reads = scenario.provenance_stamps == "read"
        #: Fields every record sends as null (a source that stopped filling them).
        self._emptied = frozenset(scenario.emptied_fields)
        #: Values of every JSON type and shape the contract admits (Scenario.record_values).
        self._whole = scenario.record_values == "whole_contract"
        if self._stamp_reads and read_index:
            observed = (*state.observed_at[:-1], state.observed_at[-1] + timedelta(minutes=read_index))
            state = dataclasses.replace(state, observed_at=observed)
        self._sources = _plan_sources(scenario, self._seed_key, state)
        self._merged = tuple(
            (m, tuple((self._sources[si], i) for si, i in m.parts)) for m in state.merged
        )
        self._shared_sources = tuple(s for s in self._sources if s.shared)
        self._shared_final = max((s.shared_delivered for s in self._shared_sources), default=0)

        own = sum(
            s.cutoff - s.shared_delivered - _below(s.left, s.cutoff) - _below(s.merged_away, s.cutoff)
            + s.joiners_delivered
            for s in self._sources
        )
        merged = sum(1 for _, parts in self._merged if any(i < s.cutoff for s, i in parts))
        self._unstorable = scenario.faults.unstorable_final_records and bool(self._sources)
        self._long_external_id = scenario.faults.long_external_id_final_record and bool(self._sources)
        self._error_message = scenario.faults.source_error_message
        self._final_code = scenario.faults.final_source_error_code
        self.final_record_count = (
            self._shared_final + own + merged + (len(_UNSTORABLE) if self._unstorable else 0)
            + (1 if self._long_external_id else 0)
        )
        self.notification_count = sum(s.pages + 1 for s in self._sources)
        self.provisional_record_count = sum(s.delivered for s in self._sources)
        failed = [s for s in self._sources if s.error is not None]
        completeness = "partial" if failed else "complete"
        self.is_error = completeness == "partial"
        metadata: dict[str, Any] = {
            "retrieval_mode": "live_provider",
            "cache_baseline_applied": False,
            "source_delta_applied": False,
            "completeness": completeness,
            "result_count": self.final_record_count,
            "observed_at": state.observed_at[-1].isoformat(),
            "provenance": [
                {**s.source_ref(), "observed_at": s.observed_at_iso} for s in self._sources if s.error is None
            ],
        }
        if failed:
            metadata["source_errors"] = [{"source": s.source_ref(), "error": self._error(s, final=True)}
                                         for s in failed]
        contradiction = scenario.faults.final_contradiction
        if contradiction == "error_flag_on_complete":
            metadata["completeness"], self.is_error = "complete", True
        elif contradiction == "hidden_source_errors":
            metadata["completeness"], self.is_error = "complete", False
            metadata.pop("source_errors", None)
        elif contradiction == "result_count_mismatch":
            metadata["result_count"] += 1
        self._unfinished = contradiction == "unfinished_source" and bool(self._sources)
        if self._unfinished:
            self.notification_count -= 1
        self.final_metadata = metadata

    # --- notifications ------------------------------------------------------------------------

    def iter_notifications(self) -> Iterator[tuple[float, dict]]:
        """``(at_ms, params)`` per notification, in simulated-time order (see module docstring)."""
        events = heapq.merge(*(self._source_events(s) for s in self._sources))
        if self._unfinished:  # FaultSpec.final_contradiction: the first source never finishes
            events = (e for e in events if e[3].index != 0 or e[4] == "page")
        request_id, context = self.request_id, self.context
        for sequence, (at_ms, _index, _k, source, status, page_index, records) in enumerate(events, 1):
            params: dict[str, Any] = {
                "requestId": request_id,
                "sequence": sequence,
                "pageIndex": page_index,
                "source": source.source_ref(),
                "records": records,
                "status": status,
            }
            if status == "error":
                params["error"] = self._error(source)
            params["context"] = dict(context)
            yield at_ms, params

    def _error(self, s: _SourcePlan, *, final: bool = False) -> dict[str, str | None]:
        """A failing source's ``error`` object (see ``FaultSpec.source_error_message`` and
        ``final_source_error_code``)."""
        code = self._final_code if final and self._final_code is not None else s.error
        error: dict[str, str | None] = {"code": code}
        if self._error_message is not None:
            error["message"] = self._error_message
        return error

    def _source_events(self, s: _SourcePlan) -> Iterator[tuple]:
        # Tuples sort by (time, source index, per-source counter); the counter is unique per
        # source, so heapq.merge never compares the payload. A page's records are made when
        # heapq.merge asks for the event: one page per source in memory at a time.
        local = self._local_records(s)
        for p in range(1, s.pages + 1):
            start = (p - 1) * s.page_size
            records = list(islice(local, min(s.page_size, s.delivered - start)))
            yield (s.first_page_ms + (p - 1) * s.page_delay_ms, s.index, p, s, "page", p, records)
        status = "error" if s.error is not None else "complete"
        yield (s.terminal_ms, s.index, s.pages + 1, s, status, s.pages, [])

    def _local_records(self, s: _SourcePlan) -> Iterator[dict]:
        """The source's records of the day in page order, under source-local refs.

        The base records (those whose people left aside), then the day's joiners.
        """
        seed_key, record = self._seed_key, self._record
        salt_key = s.salt << _INDEX_BITS
        shared, total = s.shared, s.records
        bumps, stamps, names = s.bumps, s.stamp_days, s.name_hids or None
        left = iter(s.left)
        next_left = next(left, -1)
        j = 0
        next_shared = 0 if shared else -1
        for i in range(total):
            is_shared = i == next_shared
            if is_shared:
                hid = _mix(seed_key ^ j)
                j += 1
                next_shared = j * total // shared if j < shared else -1
            elif i == next_left:
                next_left = next(left, -1)
                continue
            else:
                hid = _mix(seed_key ^ salt_key ^ i)
            ext = s.ext(i)
            yield record(hid, s.ref_prefix + ext, ((s, ext),), is_shared, False, bumps.get(i, 0), stamps.get(i, 1),
                         names.get(i) if names else None)
        for joiner in s.joiners:
            ext = s.joiner_ext(joiner)
            yield record(_mix(seed_key ^ joiner.key), s.ref_prefix + ext, ((s, ext),), False, False, 0, joiner.day)

    # --- final result -------------------------------------------------------------------------

    def iter_final_records(self) -> Iterator[dict]:
        """The authoritative, identity-merged records, canonical refs, deterministic order."""
        seed_key, record = self._seed_key, self._record
        holders = self._shared_sources
        for j in range(self._shared_final):
            hid = _mix(seed_key ^ j)
            provs = tuple(
                (s, f"{s.ext_prefix}{s.ext_base + s.shared_pos(j)}")
                for s in holders
                if j < s.shared_delivered
            )
            yield record(hid, f"bos:person:{hid:016x}", provs, True, len(provs) > 1)
        for s in self._sources:
            salt_key = s.salt << _INDEX_BITS
            shared, total = s.shared, s.records
            gone, bumps, stamps, names = set(s.left) | s.merged_away, s.bumps, s.stamp_days, s.name_hids or None
            j = 0
            next_shared = 0 if shared else -1
            for i in range(s.cutoff):
                if i == next_shared:
                    j += 1
                    next_shared = j * total // shared if j < shared else -1
                    continue
                if gone and i in gone:
                    continue
                hid = _mix(seed_key ^ salt_key ^ i)
                yield record(hid, f"bos:person:{hid:016x}", ((s, s.ext(i)),), False, False,
                             bumps.get(i, 0), stamps.get(i, 1), names.get(i) if names else None)
            for joiner in s.joiners[: s.joiners_delivered]:
                hid = _mix(seed_key ^ joiner.key)
                yield record(hid, f"bos:person:{hid:016x}", ((s, s.joiner_ext(joiner)),), False, False, 0,
                             joiner.day)
        for m, parts in self._merged:
            provs = tuple((s, s.ext(i)) for s, i in parts if i < s.cutoff)
            if not provs:
                continue
            first, i = parts[0]  # the merged record is the first part's person under a new ref
            hid = _mix(seed_key ^ (first.salt << _INDEX_BITS) ^ i)
            ref_hid = _mix(seed_key ^ m.key)
            yield record(hid, f"bos:person:{ref_hid:016x}", provs, True, len(provs) > 1,
                         first.bumps.get(i, 0), m.day, first.name_hids.get(i))
        if self._unstorable:
            source = self._sources[0]
            for n, (ref, fields) in enumerate(_UNSTORABLE):
                hid = _mix(seed_key ^ (0xBAD << 20) ^ n)
                yield {**record(hid, ref, ((source, f"unstorable-{n}"),), False, False), **fields}
        if self._long_external_id:
            hid = _mix(seed_key ^ (0x10E << 20))
            yield record(hid, LONG_EXTERNAL_ID_REF, ((self._sources[0], "x" * 600),), False, False)

    # --- one record ---------------------------------------------------------------------------

    def _record(
        self, hid: int, ref: str, provs: tuple[tuple[_SourcePlan, str], ...], shared: bool, merged: bool,
        bump: int = 0, stamp_day: int = 1, name_hid: int | None = None,
    ) -> dict:
        """One FederatedRecord dict (``merged``: more than one provenance entry).

        Identity fields (name, email) come from ``hid`` alone (the name and the email's local part
        from ``name_hid`` when given: a later merge's twin); content from ``hid`` and the
        revision: each person's content changes every ``period`` (1..4, from ``hid``) revisions,
        and once more per ``bump`` (a day's ``change``). Provenance ``observed_at`` is the
        source's observation on ``stamp_day``, the day the record last changed. Whole-contract
        values follow the same split, so an unchanged person keeps them byte for byte.
        """
        epoch = self._revision // ((hid >> 62) + 1) + bump
        hc = _mix(hid ^ ((epoch + 1) * _REV_KEY & _M64))

        nh = hid if name_hid is None else name_hid
        if (nh >> 16) & 7 == 0:
            fam, fam_slug = _EAST_FAMILY[(nh >> 3) & 7]
            giv, giv_slug = _EAST_GIVEN[(nh >> 6) & 7]
            display: str | None = fam + giv
            slug = f"{fam_slug}.{giv_slug}"
        else:
            first, first_slug = _FIRST[nh & 31]
            last, last_slug = _LAST[(nh >> 5) & 31]
            display = f"{first} {last}"
            slug = f"{first_slug}.{last_slug}"
        if self._whole and _mix(nh ^ whole.WHOLE_KEY) & 3 == 0:  # 1 in 4 with an empty, emoji or RTL name
            display, whole_slug = whole.WHOLE_NAMES[(_mix(nh ^ whole.WHOLE_KEY) >> 2) % len(whole.WHOLE_NAMES)]
            slug = whole_slug or slug
        flags = (hid >> 19) & 63
        email: str | None = f"{slug}.{(hid >> 24) & 0xFFFFFF:06x}@{_DOMAINS[(hid >> 48) & 3]}"
        if not shared:
            if flags & 7 == 0:  # 1 in 8 without email (shared people always have one: it matched them)
                email = None
            if flags == 1:  # 1 in 64 without a display name
                display = None
        phone = None
        if hc & 3:
            phone = f"+{1 + (hc >> 2) % 89} {(hc >> 10) % 900 + 100} {(hc >> 20) % 9000000 + 1000000}"
        h = hc >> 32
        status = {
            "status": _LIFECYCLE[(h >> 3) & 7],
            "since": f"20{18 + ((h >> 6) & 7)}-{1 + (h >> 9) % 12:02d}-{1 + (h >> 13) % 28:02d}",
        }
        lifecycle: Any = None if h & 7 == 0 else status
        identity_match: Any = {"method": "email", "confidence": (90 + (hid >> 56) % 10) / 100} if merged else None
        if self._whole:
            # The kind is the person's (from hid) moved on by every change (epoch); the value varies with hc.
            kinds = _mix(hid ^ whole.WHOLE_KEY)
            lifecycle = whole.json_of_kind(whole.JSON_KINDS[(kinds % 6 + epoch) % 6], h >> 3, whole.LIFECYCLE_NUMBERS,
                                      _LIFECYCLE, status)
            match = {"method": whole.MATCH_METHODS[(hid >> 40) & 3], "confidence": (90 + (hid >> 56) % 10) / 100}
            identity_match = whole.json_of_kind(whole.JSON_KINDS[((kinds >> 8) % 6 + epoch) % 6], hc >> 44,
                                           whole.MATCH_NUMBERS, whole.MATCH_METHODS, match)
        if (h >> 18) & 15 == 0:
            attributes: dict[str, Any] = {}
        else:
            site, country = _SITES[(h >> 22) & 7]
            locations: list[dict[str, Any]] = [{"site": site, "country": country, "primary": True}]
            if h & (1 << 25):
                site2, country2 = _SITES[(h >> 26) & 7]
                locations.append({"site": site2, "country": country2, "primary": False})
            kind = (hc >> 2) & 3
            attributes = {
                "department": _DEPARTMENTS[(hc >> 5) & 7],
                "title": _TITLES[(hc >> 8) & 7],
                "employment": {
                    "type": _EMPLOYMENT[kind],
                    "fte": _FTE[kind],
                    "cost_center": f"CC-{1000 + (hc >> 11) % 9000}",
                    "manager_external_id": None if hc & (1 << 24) else f"EMP-{(hc >> 25) % 100000:05d}",
                },
                "locations": locations,
                "groups": [_GROUPS[(hc >> 30) & 7], _GROUPS[(hc >> 27) & 7]]
                if (hc >> 29) & 1
                else [_GROUPS[(hc >> 30) & 7]],
            }
            if (h >> 29) & 31 == 0:
                attributes["nickname"] = _NICKNAME
        if self._whole:
            attributes = whole.whole_attributes(hc, attributes, _TITLES)
        version = epoch + 1
        if self._emptied:
            display, email, phone = (None if name in self._emptied else value for name, value in
                                     (("display_name", display), ("email", email), ("phone", phone)))
            if "attributes.department" in self._emptied and "department" in attributes:
                attributes["department"] = None
        sources = [
            {
                "source_type": s.source_type,
                "source_identity": s.source_identity,
                "external_id": ext,
                "record_type": "person",
                "observed_at": s.stamps_z[-1 if self._stamp_reads else stamp_day - 1],
                "capabilities": list(s.capabilities),
                "version": version if s.versioned else None,
            }
            for s, ext in provs
        ]
        if self._whole:
            for entry, (s, ext) in zip(sources, provs, strict=True):
                entry.update(whole.provenance_extras(s.source_type, s.source_identity, ext))
        return {
            "record_ref": ref,
            "display_name": display,
            "email": email,
            "phone": phone,
            "lifecycle": lifecycle,
            "sources": sources,
            "identity_match": identity_match,
            "attributes": attributes,
        }


def unstamped(record: dict) -> dict:
    """``record`` without its provenance observation stamps: what stays the same between two reads of
    an unchanged person (BOS stamps every provenance entry with the read's time)."""
    return {**record, "sources": [{k: v for k, v in e.items() if k != "observed_at"} for e in record["sources"]]}


def _below(indices: tuple[int, ...] | frozenset[int], bound: int) -> int:
    return sum(1 for i in indices if i < bound)


def _plan_sources(scenario: Scenario, seed_key: int, state: DayState) -> tuple[_SourcePlan, ...]:
    base_dt = state.observed_at[-1]
    salts: set[int] = set()
    slots = [0.0] * min(MAX_CONCURRENT_SOURCES, len(scenario.sources))  # free-at times
    heapq.heapify(slots)
    plans = []
    for index, spec in enumerate(scenario.sources):
        pair_hash = _stable_hash(f"{spec.source_type}\x00{spec.source_identity}")
        salt = pair_hash % ((1 << _SALT_BITS) - 1) + 1  # never 0: salt 0 is the shared people's
        while salt in salts:  # rare; deterministic for the scenario's source order
            salt = salt % ((1 << _SALT_BITS) - 1) + 1
        salts.add(salt)
        # Simulated concurrency: a source starts when one of the advertised slots is free.
        begin = heapq.heappop(slots)
        first = begin + spec.start_delay_ms
        day = state.sources[index]
        base_kept = spec.records - len(day.left)
        records = base_kept + len(day.joiners)  # the source's records on the day
        if day.error is None:
            pages, delivered = -(-records // spec.page_size), records
            terminal = first + max(pages - 1, 0) * spec.page_delay_ms
        else:
            pages = day.error_after_pages
            delivered = min(records, pages * spec.page_size)
            terminal = first + pages * spec.page_delay_ms
        heapq.heappush(slots, terminal)
        shared = scenario.shared_people if spec.records else 0
        if delivered >= base_kept:
            cutoff = spec.records
        else:
            cutoff = delivered
            for gone in day.left:  # the smallest bound with `delivered` kept base indices below it
                if gone >= cutoff:
                    break
                cutoff += 1
        offset = timedelta(seconds=(_mix(seed_key ^ pair_hash) % 90))
        observed = base_dt - offset
        plans.append(
            _SourcePlan(
                index=index,
                source_type=spec.source_type,
                source_identity=spec.source_identity,
                salt=salt,
                ext_prefix=f"{spec.source_type}-",
                ext_base=1_000_000 + (pair_hash >> 40) % 9_000_000,
                ref_prefix=f"bos:person:{spec.source_identity}:",
                records=spec.records,
                shared=shared,
                page_size=spec.page_size,
                delivered=delivered,
                pages=pages,
                error=day.error,
                shared_delivered=min(shared, -(-cutoff * shared // spec.records)) if shared else 0,
                first_page_ms=first,
                page_delay_ms=spec.page_delay_ms,
                terminal_ms=terminal,
                observed_at_iso=observed.isoformat(),
                stamps_z=tuple((at - offset).isoformat().replace("+00:00", "Z") for at in state.observed_at),
                capabilities=("read", "write") if pair_hash & 1 else ("read",),
                versioned=pair_hash & 2 == 0,
                left=day.left,
                joiners=day.joiners,
                merged_away=day.merged_away,
                bumps=dict(day.bumps),
                stamp_days=dict(day.stamp_days),
                cutoff=cutoff,
                joiners_delivered=max(0, delivered - base_kept),
                name_hids={},
            )
        )
    for (s, i), (giver, gi) in state.twins.items():
        plans[s].name_hids[i] = _mix(seed_key ^ (plans[giver].salt << _INDEX_BITS) ^ gi)
    return tuple(plans)


def plan_read(
    scenario: Scenario, *, request_id: str | int, context: dict, arguments: dict, day: int = 1, read_index: int = 0,
) -> PlannedRead:
    """Plan one federated read of ``scenario`` on ``day`` for the JSON-RPC request ``request_id``.

    ``context`` is the public context dict copied into every notification; ``arguments`` are the
    operation's business arguments (recorded, not applied). ``read_index``: the server's how-many-th
    read of this day this is (from 0; with ``provenance_stamps="read"`` it is observed that many
    minutes after the day's ``observed_at``). A day the scenario does not have is a
    :class:`~airflow_provider_bos.exceptions.BosConfigurationError`.
    """
    return PlannedRead(scenario, request_id=request_id, context=context, arguments=arguments, day=day,
                       read_index=read_index)


def build_operation_result(read: PlannedRead) -> dict:
    """The materialised operation result ``{"result": [records...], "metadata": {...}}``."""
    return {"result": list(read.iter_final_records()), "metadata": copy.deepcopy(read.final_metadata)}


# --- what tests expect of a day ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExpectedRecord:
    """One final record: its ref, its provenance keys ``(source_type, source_identity, external_id)``
    in wire order, and the whole wire record."""

    record_ref: str
    provenance: tuple[tuple[str, str, str], ...]
    record: dict


@dataclass(frozen=True, slots=True)
class ExpectedFinal:
    """The final result the reference server returns for a scenario's day."""

    day: int
    completeness: str
    observed_at: datetime
    records: tuple[ExpectedRecord, ...]

    @property
    def refs(self) -> frozenset[str]:
        return frozenset(r.record_ref for r in self.records)

    def by_ref(self) -> dict[str, ExpectedRecord]:
        return {r.record_ref: r for r in self.records}


@dataclass(frozen=True, slots=True)
class DayChangeRefs:
    """What a day changed against the day before, as final ``record_ref`` s (day 1: nothing).

    ``merged``: new ref -> the two refs it replaced (first source's first); ``split``: the
    merged ref that is gone -> the two refs its people have again; ``left``: refs no longer
    returned; ``joined``: new people's refs; ``changed``: refs whose content changed.
    """

    day: int
    left: tuple[str, ...]
    joined: tuple[str, ...]
    merged: dict[str, tuple[str, str]]
    split: dict[str, tuple[str, str]]
    changed: tuple[str, ...]


def expected_final(
    scenario: Scenario | str, day: int = 1, *, arguments: dict | None = None
) -> ExpectedFinal:
    """The final records of ``scenario`` (an object or a builtin name / JSON path) on ``day``.

    What the server returns for that day, whatever the tool and context (``arguments`` are
    recorded, not applied, by the engine), so tests compute expected sets instead of hard-coding
    them. Same scenario and day, same result.
    """
    chosen = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    read = plan_read(chosen, request_id="expected", context={}, arguments=dict(arguments or {}), day=day)
    records = tuple(
        ExpectedRecord(
            record_ref=r["record_ref"],
            provenance=tuple((e["source_type"], e["source_identity"], e["external_id"]) for e in r["sources"]),
            record=r,
        )
        for r in read.iter_final_records()
    )
    return ExpectedFinal(day=read.day, completeness=read.final_metadata["completeness"],
                         observed_at=datetime.fromisoformat(read.final_metadata["observed_at"]), records=records)


def day_changes(scenario: Scenario | str, day: int) -> DayChangeRefs:
    """What ``day`` of ``scenario`` changed, by ref (see :class:`DayChangeRefs`)."""
    chosen = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    chosen.check_day(day)
    seed_key = seed_key_of(chosen)
    sources = _plan_sources(chosen, seed_key, resolve_day(chosen, 1))
    changes = resolve_day(chosen, day).changes

    def own(person: tuple[int, int]) -> str:
        s, i = person
        return f"bos:person:{_mix(seed_key ^ (sources[s].salt << _INDEX_BITS) ^ i):016x}"

    def pair(parts: tuple[tuple[int, int], tuple[int, int]]) -> tuple[str, str]:
        return own(parts[0]), own(parts[1])

    return DayChangeRefs(
        day=day,
        left=tuple(own(p) for p in changes.left),
        joined=tuple(f"bos:person:{_mix(seed_key ^ j.key):016x}" for _, j in changes.joined),
        merged={f"bos:person:{_mix(seed_key ^ m.key):016x}": pair(m.parts) for m in changes.merged},
        split={f"bos:person:{_mix(seed_key ^ m.key):016x}": pair(m.parts) for m in changes.split},
        changed=tuple(own(p) for p in changes.changed),
    )
