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
import hashlib
import heapq
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from airflow_provider_bos.testing.scenario import MAX_CONCURRENT_SOURCES, Scenario

__all__ = ["PlannedRead", "plan_read", "build_operation_result"]

_M64 = (1 << 64) - 1
_SALT_BITS = 24
_INDEX_BITS = 40


def _mix(x: int) -> int:
    """splitmix64 finaliser: a bijection on 64-bit ints with good avalanche."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


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
    observed_at_z: str
    observed_at_iso: str
    capabilities: tuple[str, ...]
    versioned: bool

    def shared_pos(self, j: int) -> int:
        return j * self.records // self.shared

    def source_ref(self) -> dict[str, str]:
        return {"source_type": self.source_type, "source_identity": self.source_identity}


# FaultSpec.unstorable_final_records: well-formed on the wire, but no warehouse table can store them.
_UNSTORABLE: tuple[tuple[str, dict[str, Any]], ...] = (
    ("bos:person:" + "x" * 600, {}),  # longer than the key column (512)
    ("bos:person:unstorable-shape", {"display_name": {"given": "Ada", "family": "Lovelace"}}),  # not text
)


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
    ) -> None:
        self.request_id = request_id
        self.context = context
        # The engine delivers the scenario's data whatever the business arguments say (no filter,
        # no limit): tests get exactly the records the scenario describes.
        self.arguments = arguments
        self._seed_key = _mix((scenario.seed & _M64) ^ 0x5EED_B05_F00D)
        self._revision = scenario.revision
        self._sources = _plan_sources(scenario, self._seed_key)
        self._shared_sources = tuple(s for s in self._sources if s.shared)
        self._shared_final = max((s.shared_delivered for s in self._shared_sources), default=0)

        own = sum(s.delivered - s.shared_delivered for s in self._sources)
        self._unstorable = scenario.faults.unstorable_final_records and bool(self._sources)
        self.final_record_count = self._shared_final + own + (len(_UNSTORABLE) if self._unstorable else 0)
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
            "observed_at": scenario.observed_at_datetime.isoformat(),
            "provenance": [
                {**s.source_ref(), "observed_at": s.observed_at_iso} for s in self._sources if s.error is None
            ],
        }
        if failed:
            metadata["source_errors"] = [
                {"source": s.source_ref(), "error": {"code": s.error}} for s in failed
            ]
        contradiction = scenario.faults.final_contradiction
        if contradiction == "error_flag_on_complete":
            metadata["completeness"], self.is_error = "complete", True
        elif contradiction == "hidden_source_errors":
            metadata["completeness"], self.is_error = "complete", False
            metadata.pop("source_errors", None)
        self.final_metadata = metadata

    # --- notifications ------------------------------------------------------------------------

    def iter_notifications(self) -> Iterator[tuple[float, dict]]:
        """``(at_ms, params)`` per notification, in simulated-time order (see module docstring)."""
        events = heapq.merge(*(self._source_events(s) for s in self._sources))
        request_id, context = self.request_id, self.context
        for sequence, (at_ms, _index, _k, source, status, page_index, start, stop) in enumerate(events, 1):
            params: dict[str, Any] = {
                "requestId": request_id,
                "sequence": sequence,
                "pageIndex": page_index,
                "source": source.source_ref(),
                "records": self._page_records(source, start, stop) if status == "page" else [],
                "status": status,
            }
            if status == "error":
                params["error"] = {"code": source.error}
            params["context"] = dict(context)
            yield at_ms, params

    @staticmethod
    def _source_events(s: _SourcePlan) -> Iterator[tuple]:
        # Tuples sort by (time, source index, per-source counter); the counter is unique per
        # source, so heapq.merge never compares the payload.
        for p in range(1, s.pages + 1):
            start = (p - 1) * s.page_size
            yield (s.first_page_ms + (p - 1) * s.page_delay_ms, s.index, p, s, "page", p,
                   start, min(start + s.page_size, s.delivered))
        status = "error" if s.error is not None else "complete"
        yield (s.terminal_ms, s.index, s.pages + 1, s, status, s.pages, 0, 0)

    def _page_records(self, s: _SourcePlan, start: int, stop: int) -> list[dict]:
        """Records at local indexes [start, stop) of source ``s``, under source-local refs."""
        out = []
        seed_key, record = self._seed_key, self._record
        salt_key = s.salt << _INDEX_BITS
        shared, total = s.shared, s.records
        j = -(-start * shared // total) if shared else 0  # first shared person at or after start
        next_shared = j * total // shared if j < shared else -1
        for i in range(start, stop):
            is_shared = i == next_shared
            if is_shared:
                hid = _mix(seed_key ^ j)
                j += 1
                next_shared = j * total // shared if j < shared else -1
            else:
                hid = _mix(seed_key ^ salt_key ^ i)
            ext = f"{s.ext_prefix}{s.ext_base + i}"
            out.append(record(hid, s.ref_prefix + ext, ((s, ext),), is_shared, False))
        return out

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
            j = 0
            next_shared = 0 if shared else -1
            for i in range(s.delivered):
                if i == next_shared:
                    j += 1
                    next_shared = j * total // shared if j < shared else -1
                    continue
                hid = _mix(seed_key ^ salt_key ^ i)
                ext = f"{s.ext_prefix}{s.ext_base + i}"
                yield record(hid, f"bos:person:{hid:016x}", ((s, ext),), False, False)
        if self._unstorable:
            source = self._sources[0]
            for n, (ref, fields) in enumerate(_UNSTORABLE):
                hid = _mix(seed_key ^ (0xBAD << 20) ^ n)
                yield {**record(hid, ref, ((source, f"unstorable-{n}"),), False, False), **fields}

    # --- one record ---------------------------------------------------------------------------

    def _record(
        self, hid: int, ref: str, provs: tuple[tuple[_SourcePlan, str], ...], shared: bool, merged: bool
    ) -> dict:
        """One FederatedRecord dict (``merged``: more than one provenance entry).

        Identity fields (name, email) come from ``hid`` alone; content from ``hid`` and the
        revision: each person's content changes every ``period`` (1..4, from ``hid``) revisions.
        """
        epoch = self._revision // ((hid >> 62) + 1)
        hc = _mix(hid ^ ((epoch + 1) * _REV_KEY & _M64))

        if (hid >> 16) & 7 == 0:
            fam, fam_slug = _EAST_FAMILY[(hid >> 3) & 7]
            giv, giv_slug = _EAST_GIVEN[(hid >> 6) & 7]
            display: str | None = fam + giv
            slug = f"{fam_slug}.{giv_slug}"
        else:
            first, first_slug = _FIRST[hid & 31]
            last, last_slug = _LAST[(hid >> 5) & 31]
            display = f"{first} {last}"
            slug = f"{first_slug}.{last_slug}"
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
        lifecycle = None if h & 7 == 0 else {
            "status": _LIFECYCLE[(h >> 3) & 7],
            "since": f"20{18 + ((h >> 6) & 7)}-{1 + (h >> 9) % 12:02d}-{1 + (h >> 13) % 28:02d}",
        }
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
        version = epoch + 1
        return {
            "record_ref": ref,
            "display_name": display,
            "email": email,
            "phone": phone,
            "lifecycle": lifecycle,
            "sources": [
                {
                    "source_type": s.source_type,
                    "source_identity": s.source_identity,
                    "external_id": ext,
                    "record_type": "person",
                    "observed_at": s.observed_at_z,
                    "capabilities": list(s.capabilities),
                    "version": version if s.versioned else None,
                }
                for s, ext in provs
            ],
            "identity_match": (
                {"method": "email", "confidence": (90 + (hid >> 56) % 10) / 100} if merged else None
            ),
            "attributes": attributes,
        }


def _plan_sources(scenario: Scenario, seed_key: int) -> tuple[_SourcePlan, ...]:
    base_dt = scenario.observed_at_datetime
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
        pages = spec.delivered_pages
        if spec.error is not None:
            terminal = first + pages * spec.page_delay_ms
        else:
            terminal = first + max(pages - 1, 0) * spec.page_delay_ms
        heapq.heappush(slots, terminal)
        shared = scenario.shared_people if spec.records else 0
        delivered = spec.delivered_records
        observed = base_dt - timedelta(seconds=(_mix(seed_key ^ pair_hash) % 90))
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
                error=spec.error,
                shared_delivered=min(shared, -(-delivered * shared // spec.records)) if shared else 0,
                first_page_ms=first,
                page_delay_ms=spec.page_delay_ms,
                terminal_ms=terminal,
                observed_at_z=observed.isoformat().replace("+00:00", "Z"),
                observed_at_iso=observed.isoformat(),
                capabilities=("read", "write") if pair_hash & 1 else ("read",),
                versioned=pair_hash & 2 == 0,
            )
        )
    return tuple(plans)


def plan_read(scenario: Scenario, *, request_id: str | int, context: dict, arguments: dict) -> PlannedRead:
    """Plan one federated read of ``scenario`` for the JSON-RPC request ``request_id``.

    ``context`` is the public context dict copied into every notification; ``arguments`` are the
    operation's business arguments (recorded, not applied).
    """
    return PlannedRead(scenario, request_id=request_id, context=context, arguments=arguments)


def build_operation_result(read: PlannedRead) -> dict:
    """The materialised operation result ``{"result": [records...], "metadata": {...}}``."""
    return {"result": list(read.iter_final_records()), "metadata": copy.deepcopy(read.final_metadata)}
