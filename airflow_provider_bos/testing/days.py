"""The population of a scenario on one of its days: who left, joined, was merged, split or changed.

Pure arithmetic over the scenario, no I/O: :func:`resolve_day` replays the :class:`DaySpec` list
from day 2 up to the asked day and returns a :class:`DayState` that holds only the *changes*
(a few sets and lists, never the population), so the federation engine still generates every
untouched person from its identity key and memory stays O(changes) at any record count.

People are named by where they sit in the base scenario: ``(source index, base index)`` for a
source's own people (the only ones days pick; shared people never change), and by an identity
key for joiners and merged records. Those keys live in the shared people's key space above
bit 39 (:func:`new_key`), where no base identity can be, so ``mix(seed_key ^ key)`` never
collides with a base person's id.

Merged pairs are one person seen twice: from day 1 on, the second part's records carry the first
part's name (not its email, which is why the two were not matched before), so a merge in a demo
joins two records of the same name. A person merged more than once is named after the first merge.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

__all__ = [
    "DayChanges",
    "DayPlan",
    "DayPlanError",
    "DayState",
    "Joiner",
    "Merged",
    "PlannedScenario",
    "SourceDay",
    "mix",
    "new_key",
    "resolve_day",
    "seed_key_of",
]

_M64 = (1 << 64) - 1
_KEY_BIT = 1 << 39
_KIND_JOIN, _KIND_MERGE = 1, 2
_WALK = {"leave": 1, "merge-a": 2, "merge-b": 3, "change": 4}


class DayPlanError(ValueError):
    """A day of the scenario cannot happen (unknown source, not enough people to pick from...)."""


# What this module reads of a scenario. Protocols, not imports of :mod:`.scenario`'s models: the
# scenario's validator resolves every day through this module.


class _PlannedSource(Protocol):
    """A source of the scenario (:class:`~.scenario.SourceSpec`)."""

    @property
    def source_identity(self) -> str: ...
    @property
    def records(self) -> int: ...
    @property
    def page_size(self) -> int: ...
    @property
    def error(self) -> str | None: ...
    @property
    def error_after_pages(self) -> int: ...


class _PlannedCount(Protocol):
    """``count`` people of ``source`` join, leave or change (:class:`~.scenario.JoinSpec` and its kin)."""

    @property
    def source(self) -> str: ...
    @property
    def count(self) -> int: ...


class _PlannedMerge(Protocol):
    """``count`` pairs of people of two sources merged (:class:`~.scenario.MergeSpec`)."""

    @property
    def sources(self) -> tuple[str, str]: ...
    @property
    def count(self) -> int: ...


class _PlannedFailure(Protocol):
    """``source`` fails on the day (:class:`~.scenario.FailSpec`)."""

    @property
    def source(self) -> str: ...
    @property
    def error(self) -> str: ...
    @property
    def error_after_pages(self) -> int: ...


class DayPlan(Protocol):
    """One day after day 1, as changes to the day before (:class:`~.scenario.DaySpec`)."""

    @property
    def day(self) -> int: ...
    @property
    def join(self) -> Sequence[_PlannedCount]: ...
    @property
    def leave(self) -> Sequence[_PlannedCount]: ...
    @property
    def merge(self) -> Sequence[_PlannedMerge]: ...
    @property
    def split(self) -> int: ...
    @property
    def change(self) -> Sequence[_PlannedCount]: ...
    @property
    def fail(self) -> Sequence[_PlannedFailure]: ...


class PlannedScenario(Protocol):
    """The scenario's day 1 and its later days (:class:`~.scenario.Scenario`)."""

    @property
    def seed(self) -> int: ...
    @property
    def shared_people(self) -> int: ...
    @property
    def sources(self) -> Sequence[_PlannedSource]: ...
    @property
    def days(self) -> Sequence[DayPlan]: ...

    def day_observed_at(self) -> list[datetime]: ...


def mix(x: int) -> int:
    """splitmix64 finaliser: a bijection on 64-bit ints with good avalanche."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def seed_key_of(scenario: PlannedScenario) -> int:
    """The key every identity of the scenario is mixed with."""
    return mix((scenario.seed & _M64) ^ 0x5EED_B05_F00D)


def new_key(day: int, kind: int, number: int) -> int:
    """The identity key of the ``number``-th joiner or merged record (``kind``) made on ``day``."""
    return _KEY_BIT | (kind << 36) | (day << 20) | number


@dataclass(frozen=True, slots=True)
class Joiner:
    """A person who joined a source: ``number`` counts the source's joiners (0 first)."""

    key: int
    number: int
    day: int


@dataclass(frozen=True, slots=True)
class Merged:
    """One merged record: its ref's identity key, the day it was made, its two people.

    ``parts`` are ``(source index, base index)``; the first part's person gives the record its
    name, email and content.
    """

    key: int
    day: int
    parts: tuple[tuple[int, int], tuple[int, int]]


@dataclass(frozen=True, slots=True)
class SourceDay:
    """One source on the day: its changes against the base scenario, and the day's failure."""

    left: tuple[int, ...] = ()  # sorted base indices of people who left
    joiners: tuple[Joiner, ...] = ()
    merged_away: frozenset[int] = frozenset()  # base indices inside a merged record
    bumps: Mapping[int, int] = field(default_factory=dict)  # base index -> content changes so far
    stamp_days: Mapping[int, int] = field(default_factory=dict)  # base index -> day it last changed
    error: str | None = None
    error_after_pages: int = 0


@dataclass(frozen=True, slots=True)
class DayChanges:
    """What the day itself changed (day 1: nothing). People as in :class:`DayState`."""

    left: tuple[tuple[int, int], ...] = ()
    joined: tuple[tuple[int, Joiner], ...] = ()
    merged: tuple[Merged, ...] = ()
    split: tuple[Merged, ...] = ()
    changed: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class DayState:
    day: int
    observed_at: tuple[datetime, ...]  # every day's read observed_at up to this day, day 1 first
    sources: tuple[SourceDay, ...]
    merged: tuple[Merged, ...]  # in effect on the day, oldest first
    changes: DayChanges
    twins: Mapping[tuple[int, int], tuple[int, int]] = field(default_factory=dict)  # person -> name giver


class _Population:
    """The mutable replay of the days (one per :func:`resolve_day` call)."""

    def __init__(self, scenario: PlannedScenario) -> None:
        self.scenario = scenario
        self.seed_key = seed_key_of(scenario)
        n = len(scenario.sources)
        self.left: list[set[int]] = [set() for _ in range(n)]
        self.joiners: list[list[Joiner]] = [[] for _ in range(n)]
        self.in_merge: list[set[int]] = [set() for _ in range(n)]
        self.bumps: list[dict[int, int]] = [{} for _ in range(n)]
        self.stamps: list[dict[int, int]] = [{} for _ in range(n)]
        self.merged: list[Merged] = []
        self.twins: dict[tuple[int, int], tuple[int, int]] = {}  # over ALL days: the first merge's
        self.index: dict[str, list[int]] = {}
        for i, spec in enumerate(scenario.sources):
            self.index.setdefault(spec.source_identity, []).append(i)

    def source(self, day: int, where: str, name: str) -> int:
        found = self.index.get(name, [])
        if len(found) != 1:
            known = ", ".join(sorted(self.index))
            why = "is not a source of the scenario" if not found else "names more than one source"
            raise DayPlanError(f"day {day} {where}: {name!r} {why} (sources: {known})")
        return found[0]

    def is_shared(self, s: int, i: int) -> bool:
        records = self.scenario.sources[s].records
        shared = self.scenario.shared_people if records else 0
        if not shared:
            return False
        j = -(-i * shared // records)
        return j < shared and j * records // shared == i

    def walk(self, day: int, kind: str, s: int, count: int, blocked: set[int], where: str) -> list[int]:
        """``count`` own people of source ``s`` not in ``blocked``, in a seeded, day-specific order."""
        records = self.scenario.sources[s].records
        h = mix(self.seed_key ^ mix((day << 32) | (_WALK[kind] << 24) | s))
        picks: list[int] = []
        if records:
            start, step = h % records, 1 + (h >> 24) % records
            while math.gcd(step, records) != 1:
                step = step % records + 1
            for t in range(records):  # step is coprime with records: every index exactly once
                i = (start + t * step) % records
                if i in blocked or self.is_shared(s, i):
                    continue
                picks.append(i)
                if len(picks) == count:
                    return picks
        name = self.scenario.sources[s].source_identity
        raise DayPlanError(f"day {day} {where}: source {name!r} has only {len(picks)} own people left to pick "
                           f"(not shared, not gone, not merged, not chosen that day); {count} asked")

    def apply(self, spec: DayPlan, keep: bool) -> DayChanges:
        day = spec.day
        picked: list[set[int]] = [set() for _ in self.left]
        left: list[tuple[int, int]] = []
        changed: list[tuple[int, int]] = []
        joined: list[tuple[int, Joiner]] = []
        made: list[Merged] = []

        def blocked(s: int) -> set[int]:
            return self.left[s] | self.in_merge[s] | picked[s]

        for n, leave in enumerate(spec.leave):
            s = self.source(day, f"leave[{n}]", leave.source)
            for i in self.walk(day, "leave", s, leave.count, blocked(s), f"leave[{n}]"):
                self.left[s].add(i)
                picked[s].add(i)
                left.append((s, i))
        if spec.split > len(self.merged):
            raise DayPlanError(f"day {day} split: {spec.split} merged record(s) to split, but only "
                               f"{len(self.merged)} are merged on the day before")
        undone, self.merged = self.merged[: spec.split], self.merged[spec.split:]
        for m in undone:
            for s, i in m.parts:
                self.in_merge[s].discard(i)
                self.stamps[s][i] = day
                picked[s].add(i)
        number = 0
        for n, merge in enumerate(spec.merge):
            a = self.source(day, f"merge[{n}]", merge.sources[0])
            b = self.source(day, f"merge[{n}]", merge.sources[1])
            if a == b:
                raise DayPlanError(f"day {day} merge[{n}]: both names are the same source")
            firsts = self.walk(day, "merge-a", a, merge.count, blocked(a), f"merge[{n}]")
            picked[a].update(firsts)
            seconds = self.walk(day, "merge-b", b, merge.count, blocked(b), f"merge[{n}]")
            picked[b].update(seconds)
            for ia, ib in zip(firsts, seconds, strict=True):
                m = Merged(key=new_key(day, _KIND_MERGE, number), day=day, parts=((a, ia), (b, ib)))
                number += 1
                self.in_merge[a].add(ia)
                self.in_merge[b].add(ib)
                self.twins.setdefault((b, ib), self.twins.get((a, ia), (a, ia)))
                self.merged.append(m)
                made.append(m)
        number = 0
        for n, join in enumerate(spec.join):
            s = self.source(day, f"join[{n}]", join.source)
            for _ in range(join.count):
                joiner = Joiner(key=new_key(day, _KIND_JOIN, number), number=len(self.joiners[s]), day=day)
                number += 1
                self.joiners[s].append(joiner)
                joined.append((s, joiner))
        for n, change in enumerate(spec.change):
            s = self.source(day, f"change[{n}]", change.source)
            for i in self.walk(day, "change", s, change.count, blocked(s), f"change[{n}]"):
                self.bumps[s][i] = self.bumps[s].get(i, 0) + 1
                self.stamps[s][i] = day
                picked[s].add(i)
                changed.append((s, i))
        if number >= (1 << 20) or len(made) >= (1 << 20):
            raise DayPlanError(f"day {day}: at most {(1 << 20) - 1} joiners and merges per day")
        failing: set[int] = set()
        for n, fail in enumerate(spec.fail):
            s = self.source(day, f"fail[{n}]", fail.source)
            if s in failing:
                raise DayPlanError(f"day {day} fail[{n}]: source {fail.source!r} fails twice")
            failing.add(s)
            source = self.scenario.sources[s]
            pages = math.ceil(self.records_on_day(s) / source.page_size)
            if fail.error_after_pages > pages:
                raise DayPlanError(f"day {day} fail[{n}]: error_after_pages={fail.error_after_pages} exceeds the "
                                   f"{pages} page(s) source {fail.source!r} fills that day")
        if not keep:
            return DayChanges()
        return DayChanges(left=tuple(left), joined=tuple(joined), merged=tuple(made), split=tuple(undone),
                          changed=tuple(changed))

    def records_on_day(self, s: int) -> int:
        return self.scenario.sources[s].records - len(self.left[s]) + len(self.joiners[s])


def resolve_day(scenario: PlannedScenario, day: int) -> DayState:
    """The population of ``scenario`` on ``day`` (1 = the base scenario).

    :raises DayPlanError: a day up to ``day`` cannot happen (the scenario validator turns it into
        a validation error, so a loaded scenario always resolves).
    """
    if scenario.days and scenario.shared_people >= _KEY_BIT:
        raise DayPlanError(f"a scenario with days takes fewer than {_KEY_BIT} shared_people")
    population = _Population(scenario)
    state = _snapshot(scenario, population, 1, DayChanges()) if day == 1 else None
    for spec in scenario.days:  # every day: later merges name their people from day 1 on
        changes = population.apply(spec, keep=spec.day == day)
        if spec.day == day:
            state = _snapshot(scenario, population, day, changes)
    assert state is not None, "Scenario.check_day admits only days the scenario has"
    return DayState(day=state.day, observed_at=state.observed_at, sources=state.sources, merged=state.merged,
                    changes=state.changes, twins=dict(population.twins))


def _snapshot(scenario: PlannedScenario, population: _Population, day: int, changes: DayChanges) -> DayState:
    if day == 1:
        errors = {i: (spec.error, spec.error_after_pages) for i, spec in enumerate(scenario.sources)}
    else:
        today = scenario.days[day - 2]
        errors = {population.index[f.source][0]: (f.error, f.error_after_pages) for f in today.fail}
    sources = tuple(
        SourceDay(
            left=tuple(sorted(population.left[s])),
            joiners=tuple(population.joiners[s]),
            merged_away=frozenset(population.in_merge[s]),
            bumps=dict(population.bumps[s]),
            stamp_days=dict(population.stamps[s]),
            error=errors.get(s, (None, 0))[0],
            error_after_pages=errors.get(s, (None, 0))[1],
        )
        for s in range(len(scenario.sources))
    )
    stamps = tuple(scenario.day_observed_at()[:day])
    return DayState(day=day, observed_at=stamps, sources=sources, merged=tuple(population.merged),
                    changes=changes)
