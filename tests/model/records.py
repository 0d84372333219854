"""People and days: the population a BOS read federates, and Hypothesis strategies for how it changes.

The contract (source-results-v1, section 3) promises little: a record has a ``record_ref``, optional
nullable ``display_name``, ``email``, ``phone``, ``lifecycle`` and ``identity_match``, an
``attributes`` object and a non-empty ``sources`` array; where it names no type any JSON value may
come, extra keys may come, and no order is promised. So the content drawn here is everything that
allows: strings with RTL marks, emoji, combining accents and long text; ``lifecycle`` and
``identity_match`` of any JSON type (integers beyond 64 bits, tiny and negative floats, nested
objects and lists); attribute keys that are empty, spaced or non-ASCII; provenance entries with
extra keys (a ``label``, a nested ``link`` object, which may hold an ``observed_at`` of its own).

Every personal string carries a marker, ``pii`` + a field tag + a number (``piiE12`` in an email),
so a check can look for raw values of the fields a personal-data policy hashes or drops:

====  ======================================
tag   field
====  ======================================
N     display_name
E     email
P     phone
L     lifecycle
I     identity_match
A     attributes (values, never keys)
X     sources[].external_id
S     an entry's extra keys (label, link)
====  ======================================

:class:`World` is BOS's side: people (atoms, each with its provenance entries) grouped into the
records BOS currently returns (a merge groups atoms under a new ref, a split ungroups them), the
people who left, and what each kind of read returns on a day. Events and days are plain frozen
dataclasses, so a failing example prints as explicit, replayable steps.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import strategies as st

#: (source_type, source_identity) of each source. crm-eu and crm-us share a source_type, so an
#: erasure by ``crm:<id>`` matches either.
SOURCES: tuple[tuple[str, str], ...] = (("crm", "crm-eu"), ("hr", "hr-main"), ("crm", "crm-us"))
#: How many seconds each source's stamps lag the read's own observation time.
SOURCE_LAG_S = (0, 1, 3)
#: Day 0; day d is read at BASE + d days: long past, so no read time is later than the run that
#: writes it (a retire is stamped with the read's time only up to the run's own).
BASE = datetime(2021, 3, 1, 12, 0, 0, tzinfo=UTC)
#: The contract's source error codes (a failing source's).
ERROR_CODES = ("source_timeout", "source_unavailable", "rate_limited")


class _Missing:
    """A key the record (or entry) does not carry at all."""

    _instance: _Missing | None = None

    def __new__(cls) -> _Missing:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "MISSING"

    def __deepcopy__(self, memo: dict[int, Any]) -> _Missing:
        return self


MISSING: Any = _Missing()

CONTENT_FIELDS = ("display_name", "email", "phone", "lifecycle", "identity_match", "attributes")
ENTRY_FIELDS = ("record_type", "capabilities", "version", "label", "link")


def read_time(day: int) -> datetime:
    return BASE + timedelta(days=day)


def stamp(day: int, source: int, style: str = "Z") -> str:
    """A provenance entry's ``observed_at`` on ``day`` for ``source`` (ISO 8601, UTC)."""
    moment = read_time(day) - timedelta(seconds=SOURCE_LAG_S[source])
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    return text + ("Z" if style == "Z" else "+00:00")


# --- content -----------------------------------------------------------------------------------

#: Pieces around a marker: whitespace, bidi controls, emoji, letters that normalise or case-fold,
#: JSON-significant characters, digits that NFKC maps (or does not map) to 0-9, long text.
PIECES = ("", " ", "\u200f", "\u202e", "\U0001f469\u200d\U0001f4bb", "Stra\u00dfe", "\u0130", "e\u0301",
          "\t", "\u00a0", '"', "\\", "}]", "\n", "\u0661\u0662", "\u00b2", "\uff11\uff12", "\U0001f600",
          '"observed_at":"')
#: Long text, built where it is drawn (a literal would make every strategy's repr as long).
LONG = st.builds(lambda: "x" * 300)
PIECE = st.one_of(st.sampled_from(PIECES), LONG)
#: Object keys: empty, spaced, non-ASCII, canonically equivalent pairs, names of record fields.
KEYS = st.sampled_from(["", " ", "state", "a b", "\u043a\u043b\u044e\u0447", "\u00e9", "e\u0301",
                        "observed_at", "sources", "\U0001f4a1", "x.y", "record_ref", "null", "0", "Z"])
_NO_NUL = st.characters(exclude_characters="\x00", exclude_categories=("Cs",))


def marked(tag: str) -> st.SearchStrategy[str]:
    """A personal string: ``pii<tag><n>`` between two pieces."""
    return st.builds(lambda pre, n, post: f"{pre}pii{tag}{n}{post}", PIECE, st.integers(0, 999), PIECE)


def loose_text(tag: str) -> st.SearchStrategy[str]:
    """A string that may carry no marker at all (empty, blank, emoji only, long, anything)."""
    return st.one_of(marked(tag), st.sampled_from(["", " ", "\U0001f469\u200d\U0001f4bb", "\u200f"]),
                     st.builds(lambda: "y" * 700), st.text(_NO_NUL, max_size=6))


BIG_INTS = (2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64 + 1, 10**30 + 7, -(10**25) - 3)
ODD_FLOATS = (5e-324, -1e-310, 1e-300, -2.5e-8, 0.1, -0.0, 1e16, 1.5e300, -123.456)


def json_scalars(tag: str) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.none(), st.booleans(), st.integers(-5, 5), st.sampled_from(BIG_INTS), st.integers(),
        st.sampled_from(ODD_FLOATS), st.floats(allow_nan=False, allow_infinity=False), marked(tag), loose_text(tag),
    )


def json_values(tag: str) -> st.SearchStrategy[Any]:
    """Any JSON value: scalars, lists, objects, nested (NaN and Infinity are not JSON)."""
    return st.recursive(json_scalars(tag),
                        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
                        max_leaves=5)


def attributes() -> st.SearchStrategy[dict[str, Any]]:
    shaped = st.builds(lambda email, n: {"contacts": [{"email": email, "rank": n}, {}], "empty": {}, "none": [],
                                         "deep": {"a": {"b": {"c": {"d": [[], {}]}}}}},
                       marked("A"), st.integers())
    return st.one_of(st.just({}), st.dictionaries(KEYS, json_values("A"), max_size=3), shaped)


def emails() -> st.SearchStrategy[str]:
    return st.builds(lambda pre, n, domain, post: f"{pre}piiE{n}@{domain}{post}",
                     st.sampled_from(["", " ", "\t", "Stra\u00dfe.", "\u0130"]), st.integers(0, 999),
                     st.sampled_from(["Example.ORG", "example.org", "stra\u00dfe.de"]),
                     st.sampled_from(["", " ", "\n"]))


def phones() -> st.SearchStrategy[str]:
    # A "+" only ever first: where else it stands is not something the recipe decides.
    return st.builds(lambda plus, digits, n, post: f"{plus}{digits} piiP{n}{post}",
                     st.sampled_from(["", "+", " +"]),
                     st.sampled_from(["49 (30) 12-34", "\uff14\uff19 30", "0049\u00b2", "\u0661\u0662 7", "5"]),
                     st.integers(0, 999), st.sampled_from(["", " ", "-56"]))


def optional(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A nullable field of the contract: absent, null or a value."""
    return st.one_of(st.just(MISSING), st.none(), strategy)


FIELD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "display_name": optional(loose_text("N")),
    "email": optional(st.one_of(st.just(""), emails())),
    "phone": optional(st.one_of(st.just(""), phones())),
    "lifecycle": optional(json_values("L")),
    "identity_match": optional(json_values("I")),
    "attributes": attributes(),
}


@dataclass(frozen=True)
class Content:
    """A record's content (``MISSING``: the key is not sent)."""

    display_name: Any = None
    email: Any = None
    phone: Any = None
    lifecycle: Any = None
    identity_match: Any = None
    attributes: Any = field(default_factory=dict)


def contents() -> st.SearchStrategy[Content]:
    return st.builds(Content, **FIELD_VALUES)


# --- provenance ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class EntrySpec:
    """A provenance entry as drawn (its stamp is the day's)."""

    source: int
    external_id: str
    record_type: str = "person"
    capabilities: tuple[str, ...] = ("read",)
    version: Any = MISSING
    label: Any = MISSING
    link: Any = MISSING


ENTRY_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "record_type": st.sampled_from(["person", "Person", "employee"]),
    "capabilities": st.lists(st.sampled_from(["read", "write", "erase"]), unique=True, max_size=3).map(tuple),
    "version": st.one_of(st.just(MISSING), st.none(), st.sampled_from(["v1", "2"]), st.integers(0, 5)),
    "label": st.one_of(st.just(MISSING), marked("S")),
    # A nested object may hold its own "observed_at": content, not BOS's stamp of the entry.
    "link": st.one_of(st.just(MISSING), st.fixed_dictionaries(
        {"href": marked("S"), "meta": json_values("S")},
        optional={"observed_at": st.sampled_from(["2020-01-01T00:00:00Z", "2021-06-06T06:06:06Z"])})),
}


def external_ids() -> st.SearchStrategy[str]:
    return st.builds(lambda pre, n: f"{pre}piiX{n}", st.sampled_from(["", "a:", "\u00fc-", "ID "]), st.integers(0, 40))


def entry_specs() -> st.SearchStrategy[tuple[EntrySpec, ...]]:
    entry = st.builds(EntrySpec, source=st.integers(0, len(SOURCES) - 1), external_id=external_ids(), **ENTRY_VALUES)
    return st.lists(entry, min_size=1, max_size=3, unique_by=lambda e: e.source).map(tuple)


# --- events and days -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Join:
    """A new person (an atom of their own)."""

    content: Content
    entries: tuple[EntrySpec, ...]


@dataclass(frozen=True)
class Change:
    """A content field of a current record changes (``who``: any integer, taken modulo the records)."""

    who: int
    field: str
    value: Any


@dataclass(frozen=True)
class ChangeEntry:
    """A field of one provenance entry of a current record changes (content too)."""

    who: int
    entry: int
    field: str
    value: Any


@dataclass(frozen=True)
class Reorder:
    """A current record's entries come in another order (no content change)."""

    who: int
    by: int


@dataclass(frozen=True)
class Leave:
    who: int


@dataclass(frozen=True)
class Return:
    """Someone who left is back (with new content, or as they left)."""

    who: int
    content: Content | None = None


@dataclass(frozen=True)
class Merge:
    """BOS merges two current records into one under a new ref, carrying both records' entries."""

    a: int
    b: int
    content: Content


@dataclass(frozen=True)
class Split:
    """A merged record comes apart into its people: under their old refs (``back``) or new ones."""

    who: int
    back: bool = True


Event = Join | Change | ChangeEntry | Reorder | Leave | Return | Merge | Split


@dataclass(frozen=True)
class Full:
    """A complete full read: every current record; with ``outage`` none at all, still said complete
    (what the guard against mass deletion is for)."""

    outage: bool = False


@dataclass(frozen=True)
class Partial:
    """One source fails: its entries are missing, merged people come apart into the surviving
    fragments under their old refs; completeness ``partial``. ``mode``: the read's sync_mode."""

    failing: int
    code: str = "source_timeout"
    mode: str = "full"


@dataclass(frozen=True)
class Incremental:
    """A complete incremental ("changed since") read: the records ``returned`` marks (cycled)."""

    returned: tuple[bool, ...] = ()


Read = Full | Partial | Incremental


@dataclass(frozen=True)
class Day:
    """One day: what happens at BOS, then one read. ``rotate`` moves the result's order (no order is
    promised); ``duplicate`` sends one record twice, the later copy changed; ``style`` spells the
    stamps' UTC offset."""

    events: tuple[Event, ...] = ()
    read: Read = Full()
    rotate: int = 0
    duplicate: Change | None = None
    style: str = "Z"


def changes() -> st.SearchStrategy[Change]:
    return st.sampled_from(CONTENT_FIELDS).flatmap(
        lambda name: st.builds(Change, who=st.integers(0, 9), field=st.just(name), value=FIELD_VALUES[name]))


def entry_changes() -> st.SearchStrategy[ChangeEntry]:
    return st.sampled_from(ENTRY_FIELDS).flatmap(
        lambda name: st.builds(ChangeEntry, who=st.integers(0, 9), entry=st.integers(0, 3), field=st.just(name),
                               value=ENTRY_VALUES[name]))


def events() -> st.SearchStrategy[Event]:
    who = st.integers(0, 9)
    merge = st.builds(Merge, a=who, b=who, content=contents())
    split = st.builds(Split, who=who, back=st.booleans())
    return st.one_of(  # merges and splits twice as likely: they need people to act on
        st.builds(Join, content=contents(), entries=entry_specs()),
        changes(),
        entry_changes(),
        st.builds(Reorder, who=who, by=st.integers(1, 2)),
        st.builds(Leave, who=who),
        st.builds(Return, who=who, content=st.one_of(st.none(), contents())),
        merge, split, merge, split,
    )


def reads(kind: str) -> st.SearchStrategy[Read]:
    if kind == "full":
        return st.builds(Full, outage=st.sampled_from([False, False, False, True]))
    if kind == "partial":
        return st.builds(Partial, failing=st.integers(0, len(SOURCES) - 1), code=st.sampled_from(ERROR_CODES),
                         mode=st.sampled_from(["full", "incremental"]))
    return st.builds(Incremental, returned=st.lists(st.booleans(), max_size=4).map(tuple))


def days(kind: str) -> st.SearchStrategy[Day]:
    """A day of a read of ``kind`` (``full``, ``partial``, ``incremental``; ``merge``: a full read
    after a merge or a split, then anything else)."""
    happenings = st.lists(events(), max_size=4)
    if kind == "merge":
        who = st.integers(0, 9)
        first = st.one_of(st.builds(Merge, a=who, b=who, content=contents()),
                          st.builds(Split, who=who, back=st.booleans()))
        happenings = st.tuples(first, st.lists(events(), max_size=3)).map(lambda t: [t[0], *t[1]])
        kind = "full"
    return st.builds(Day, events=happenings.map(tuple), read=reads(kind),
                     rotate=st.integers(0, 3), duplicate=st.one_of(st.none(), st.none(), changes()),
                     style=st.sampled_from(["Z", "+00:00"]))


def populations() -> st.SearchStrategy[tuple[Join, ...]]:
    """The people of day 1: a handful."""
    return st.lists(st.builds(Join, content=contents(), entries=entry_specs()), min_size=2, max_size=5).map(tuple)


# --- the world ------------------------------------------------------------------------------------

@dataclass
class _Entry:
    source: int
    external_id: str
    fields: dict[str, Any]  # record_type, capabilities, version, label, link (MISSING: not sent)


@dataclass
class _Atom:
    n: int
    ref: str  # the ref of the last record that was this person alone
    entries: list[_Entry]
    content: Content  # this person's content when alone (what a split or a fragment brings back)


@dataclass
class _Group:
    ref: str
    atoms: list[int]
    content: Content
    rotation: int = 0


class World:
    """BOS's side: the people, who is merged with whom, who left; what a read returns on a day."""

    def __init__(self) -> None:
        self.atoms: dict[int, _Atom] = {}
        self.current: list[_Group] = []
        self.gone: list[_Group] = []
        self._taken: set[tuple[int, str]] = set()
        self._next = {"atom": 1, "merge": 1, "split": 1}

    def _counter(self, name: str) -> int:
        value = self._next[name]
        self._next[name] = value + 1
        return value

    def entries(self, group: _Group) -> list[_Entry]:
        entries = [e for n in group.atoms for e in self.atoms[n].entries]
        if not entries:
            return entries
        k = group.rotation % len(entries)
        return entries[k:] + entries[:k]

    def apply(self, event: Event) -> None:
        if isinstance(event, Join):
            n = self._counter("atom")
            entries = []
            for spec in event.entries:
                external_id = spec.external_id
                while (spec.source, external_id) in self._taken:  # ids are distinct per source
                    external_id += "~"
                self._taken.add((spec.source, external_id))
                entries.append(_Entry(spec.source, external_id, {name: getattr(spec, name) for name in ENTRY_FIELDS}))
            atom = _Atom(n, f"bos:person:{n}", entries, event.content)
            self.atoms[n] = atom
            self.current.append(_Group(atom.ref, [n], event.content))
        elif isinstance(event, Change):
            if self.current:
                group = self.current[event.who % len(self.current)]
                group.content = replace(group.content, **{event.field: copy.deepcopy(event.value)})
                self._remember(group)
        elif isinstance(event, ChangeEntry):
            if self.current:
                entries = self.entries(self.current[event.who % len(self.current)])
                entries[event.entry % len(entries)].fields[event.field] = copy.deepcopy(event.value)
        elif isinstance(event, Reorder):
            if self.current:
                self.current[event.who % len(self.current)].rotation += event.by
        elif isinstance(event, Leave):
            if self.current:
                self.gone.append(self.current.pop(event.who % len(self.current)))
        elif isinstance(event, Return):
            if self.gone:
                group = self.gone.pop(event.who % len(self.gone))
                if event.content is not None:
                    group.content = event.content
                    self._remember(group)
                self.current.append(group)
        elif isinstance(event, Merge):
            if len(self.current) >= 2:
                i = event.a % len(self.current)
                j = event.b % len(self.current)
                if i == j:
                    j = (i + 1) % len(self.current)
                first, second = self.current[i], self.current[j]
                merged = _Group(f"bos:person:m{self._counter('merge')}", first.atoms + second.atoms, event.content)
                self.current = [g for k, g in enumerate(self.current) if k not in (i, j)] + [merged]
        elif isinstance(event, Split):
            merged = [g for g in self.current if len(g.atoms) > 1]
            if merged:
                group = merged[event.who % len(merged)]
                self.current.remove(group)
                for n in group.atoms:
                    atom = self.atoms[n]
                    atom.ref = f"bos:person:{n}" if event.back else f"bos:person:s{self._counter('split')}"
                    self.current.append(_Group(atom.ref, [n], atom.content))

    def _remember(self, group: _Group) -> None:
        if len(group.atoms) == 1:
            self.atoms[group.atoms[0]].content = group.content

    def _record(self, ref: str, content: Content, entries: list[_Entry], day: int, style: str) -> dict[str, Any]:
        record: dict[str, Any] = {"record_ref": ref}
        for name in CONTENT_FIELDS:
            value = getattr(content, name)
            if value is not MISSING:
                record[name] = copy.deepcopy(value)
        sources = []
        for e in entries:
            source_type, source_identity = SOURCES[e.source]
            entry: dict[str, Any] = {"source_type": source_type, "source_identity": source_identity,
                                     "external_id": e.external_id, "record_type": e.fields["record_type"],
                                     "observed_at": stamp(day, e.source, style),
                                     "capabilities": list(e.fields["capabilities"])}
            for name in ("version", "label", "link"):
                if e.fields[name] is not MISSING:
                    entry[name] = copy.deepcopy(e.fields[name])
            sources.append(entry)
        record["sources"] = sources
        return record

    def read(self, day: Day, number: int) -> list[dict[str, Any]]:
        """The final records of ``day``'s read (day ``number``), after its events."""
        records: list[dict[str, Any]] = []
        read = day.read
        if isinstance(read, Full):
            chosen = [] if read.outage else self.current
            records = [self._record(g.ref, g.content, self.entries(g), number, day.style) for g in chosen]
        elif isinstance(read, Incremental):
            marks = read.returned
            records = [self._record(g.ref, g.content, self.entries(g), number, day.style)
                       for k, g in enumerate(self.current) if marks and marks[k % len(marks)]]
        else:
            for group in self.current:
                entries = self.entries(group)
                surviving = [e for e in entries if e.source != read.failing]
                if not surviving:
                    continue
                if len(group.atoms) > 1 and len(surviving) < len(entries):
                    for n in group.atoms:  # fragments, under the people's old refs
                        atom = self.atoms[n]
                        kept = [e for e in atom.entries if e.source != read.failing]
                        if kept:
                            records.append(self._record(atom.ref, atom.content, kept, number, day.style))
                else:
                    records.append(self._record(group.ref, group.content, surviving, number, day.style))
        if records and day.rotate:
            k = day.rotate % len(records)
            records = records[k:] + records[:k]
        if records and day.duplicate is not None:
            twin = copy.deepcopy(records[day.duplicate.who % len(records)])
            if day.duplicate.value is MISSING:
                twin.pop(day.duplicate.field, None)
            else:
                twin[day.duplicate.field] = copy.deepcopy(day.duplicate.value)
            records.append(twin)
        return records

    def all_entries(self) -> list[tuple[str, str, str]]:
        """(source_type, source_identity, external_id) of every person's entries, current or gone."""
        return [(*SOURCES[e.source], e.external_id) for a in self.atoms.values() for e in a.entries]
