"""Scenarios: what the reference server's federated read delivers, as data.

A :class:`Scenario` is plain JSON (see ``testing/scenarios/*.json`` for the builtins; copy one
to start your own) validated by pydantic with unknown fields forbidden, so a typo in a scenario
file fails loudly instead of being ignored. :func:`load_scenario` loads a builtin by name or a
JSON file by path and turns every problem into a
:class:`~airflow_provider_bos.exceptions.BosConfigurationError`.

What each field means for the stream is decided by :mod:`airflow_provider_bos.testing.federation`;
the rules are summarised on the models below.
"""

from __future__ import annotations

import json
import math
import os
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from airflow_provider_bos.exceptions import BosConfigurationError
from airflow_provider_bos.models import BosContext, SourceErrorCode
from airflow_provider_bos.testing.days import DayPlanError, resolve_day

__all__ = [
    "BUILTIN_SCENARIOS",
    "DEFAULT_CONTEXTS",
    "MAX_CONCURRENT_SOURCES",
    "MAX_PAGE_SIZE",
    "MAX_SOURCE_RECORDS",
    "ChangeSpec",
    "DaySpec",
    "FailSpec",
    "FaultSpec",
    "JoinSpec",
    "LeaveSpec",
    "MergeSpec",
    "Scenario",
    "SourceSpec",
    "large_scenario",
    "load_scenario",
]

MAX_PAGE_SIZE = 100  # the server advertises pageSize 100
MAX_CONCURRENT_SOURCES = 8  # the server advertises maxConcurrentSources 8
MAX_SOURCE_RECORDS = 1 << 40  # record identities pack the local index into 40 bits
MAX_DAYS = 1 << 15  # identities of joiners and merged records pack the day into 16 bits
MAX_DAY_CHANGES = 1 << 20  # ... and their number within the day into 20 bits

DEFAULT_CONTEXTS: tuple[dict[str, Any], ...] = (
    {
        "context_handle": "ctx_acme_people_prod",
        "organization_name": "Acme Corporation",
        "application_name": "People Directory",
        "installation_name": "Production",
        "role_label": "HR Analyst",
        "is_default": True,
    },
    {
        "context_handle": "ctx_acme_itsm_sandbox",
        "organization_name": "Acme Corporation",
        "application_name": "IT Service Desk",
        "installation_name": "Sandbox Zürich",
        "role_label": "Read-only Auditor",
        "is_default": False,
    },
)


class _Strict(BaseModel):
    # Unknown keys are errors: a misspelt fault or field must not silently do nothing.
    model_config = ConfigDict(extra="forbid", validate_default=True)


class SourceSpec(_Strict):
    """One source of the federated read.

    Delivery: the source's ``records`` are delivered in pages of ``page_size`` (the last page may
    be short), ``pageIndex`` 1..n, then one ``complete`` whose ``pageIndex`` is the last page's
    (``0`` with ``records: []`` for an empty source).

    Errors: with ``error`` set, ``records`` is what the source *would* hold; it delivers only its
    first ``error_after_pages`` pages (``min(records, error_after_pages * page_size)`` records)
    and then one ``error`` notification with ``records: []`` whose ``pageIndex`` is the number of
    pages delivered before it (``0`` when it failed before its first page). Records it delivered
    are kept in the final result. ``error_after_pages`` may not exceed the pages ``records``
    fill, and needs ``error``.

    Time (simulated, milliseconds after the source starts): page p arrives at
    ``start_delay_ms + (p - 1) * page_delay_ms``; ``complete`` comes right after the last page
    (at ``start_delay_ms`` for an empty source); ``error`` comes at
    ``start_delay_ms + error_after_pages * page_delay_ms``, where the next page would have been.
    """

    source_type: str = Field(default="crm", min_length=1)
    source_identity: str = Field(min_length=1)
    records: int = Field(default=10, ge=0, lt=MAX_SOURCE_RECORDS)
    page_size: int = Field(default=MAX_PAGE_SIZE, ge=1, le=MAX_PAGE_SIZE)
    page_delay_ms: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    start_delay_ms: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    error: SourceErrorCode | None = None
    error_after_pages: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _check_error(self) -> SourceSpec:
        if self.error is None:
            if self.error_after_pages:
                raise ValueError(
                    "error_after_pages is set but error is not; set error to a source error code"
                )
            return self
        available = math.ceil(self.records / self.page_size)
        if self.error_after_pages > available:
            raise ValueError(
                f"error_after_pages={self.error_after_pages} exceeds the {available} page(s) that "
                f"records={self.records} fill at page_size={self.page_size}; "
                "raise records or lower error_after_pages"
            )
        return self

    @property
    def pair(self) -> tuple[str, str]:
        """The complete source pair ``(source_type, source_identity)``."""
        return (self.source_type, self.source_identity)

    @property
    def delivered_records(self) -> int:
        """Records this source delivers (all of them, or the pages before its error)."""
        if self.error is None:
            return self.records
        return min(self.records, self.error_after_pages * self.page_size)

    @property
    def delivered_pages(self) -> int:
        """Page notifications this source emits before its terminal one."""
        if self.error is None:
            return math.ceil(self.records / self.page_size)
        return self.error_after_pages


class FaultSpec(_Strict):
    """Transport faults the reference server injects (the federation plan is unaffected).

    At most one of the stream-ending faults (``drop_after_notifications``, ``drop_before_final``,
    ``drop_mid_final``, ``stall``, ``close_after_events``, ``close_mid_final_bytes``,
    ``close_mid_records_bytes``) and at most
    one of ``final_error`` / ``malformed_final``.

    Streams and resumption (2025-11-25 session era, negotiated streams only; the stateless
    2026-07-28 era has no resumption, as in the MCP SDK: no ids, GET answers 405):

    - ``resumable`` (default on): every response stream opens with a priming event (``id``, empty
      ``data``, ``retry: sse_retry_ms``) and every ``message`` event carries an ``id``; GET with
      ``Last-Event-ID`` resumes the stream: the events after that id are sent again, then the
      rest as they come due, up to the final response (taken again from its start if it was cut).
      Off: no priming, no ids, and every GET on the MCP endpoint answers 405.
    - ``keepalive_interval_ms``: a ``: keepalive`` comment whenever the stream would otherwise be
      idle that long; ``null``: none at all (a silent server).
    - ``final_delay_ms``: the final response comes this long (simulated time, scaled like source
      delays) after the last notification: the time a server needs to assemble it.
    - ``close_after_events`` / ``close_mid_final_bytes``: the server ends the POST response
      cleanly (EOF, the request goes on) after that many source notifications / after that many
      bytes of the final event (its field lines included); the client must resume. They apply
      to the POST only: a resumed stream runs to the end. ``drop_*`` instead reset the
      connection.
    - ``close_mid_records_bytes``: as ``close_mid_final_bytes``, counted from the start of the
      final's ``structuredContent`` (after the long ``content`` text): the cut falls among the
      records, after a client streaming them has handed some out.
    - ``final_contradiction``: the final result contradicts itself (server input, not transport):
      ``"error_flag_on_complete"`` sends ``isError: true`` with ``completeness: "complete"``;
      ``"hidden_source_errors"`` claims ``complete`` with no ``source_errors`` although the
      stream showed sources ending in error (use it with a scenario whose sources fail);
      ``"result_count_mismatch"`` claims one record more in ``result_count`` than the result holds;
      ``"unfinished_source"`` never sends the first source's terminal notification, and the final
      result still claims ``complete``.
    - ``final_context_handle``: a ``bos_execute`` result names this context (its
      ``structuredContent.context`` and ``_meta["bos/context"]``) instead of the one the read asked for.
    - ``unstorable_final_records``: the final result ends with two records that are well-formed
      on the wire but that no warehouse table can store (a 600-character ``record_ref``, a
      ``display_name`` that is an object); ``result_count`` counts them.
    - ``source_error_message``: every failing source's ``error`` object (on its terminal page and in
      the final's ``source_errors``) also carries ``message`` with this text, a field the contract
      allows beside ``code``: a server's own words, which may quote anything.
    - ``long_external_id_final_record``: the final result ends with one more record (its ref
      ``LONG_EXTERNAL_ID_REF``), whose one provenance entry's ``external_id`` is 600 characters:
      longer than the provenance table's columns (512); ``result_count`` counts it.
    - ``final_source_error_code``: the final's ``source_errors`` give every failing source this
      code instead of the one its terminal page carried (any text: the contract's five or not).
    """

    drop_after_notifications: int | None = Field(default=None, ge=0)
    drop_before_final: bool = False
    drop_mid_final: bool = False
    stall: bool = False
    close_after_events: int | None = Field(default=None, ge=0)
    close_mid_final_bytes: int | None = Field(default=None, ge=0)
    close_mid_records_bytes: int | None = Field(default=None, ge=0)
    resumable: bool = True
    sse_retry_ms: int = Field(default=500, ge=0)
    final_delay_ms: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    keepalive_interval_ms: float | None = Field(default=200.0, gt=0.0, allow_inf_nan=False)
    http_429: int = Field(default=0, ge=0)
    retry_after_s: float = Field(default=1.0, ge=0.0, allow_inf_nan=False)
    http_503: int = Field(default=0, ge=0)
    expire_access_token_after_requests: int | None = Field(default=None, ge=0)
    wire_mode: bool = False
    final_error: dict | None = None
    final_id_override: str | int | None = None
    final_context_handle: str | None = None
    malformed_final: bool = False
    unstorable_final_records: bool = False
    source_error_message: str | None = None
    final_source_error_code: str | None = None
    long_external_id_final_record: bool = False
    final_contradiction: Literal[
        "error_flag_on_complete", "hidden_source_errors", "result_count_mismatch", "unfinished_source"
    ] | None = None

    @field_validator("final_error")
    @classmethod
    def _check_final_error(cls, value: dict | None) -> dict | None:
        if value is None:
            return value
        if not isinstance(value.get("code"), int) or isinstance(value.get("code"), bool):
            raise ValueError('final_error must be a JSON-RPC error object with an integer "code"')
        if not isinstance(value.get("message"), str):
            raise ValueError('final_error must be a JSON-RPC error object with a string "message"')
        return value

    @model_validator(mode="after")
    def _check_exclusive(self) -> FaultSpec:
        enders = [
            name
            for name, on in (
                ("drop_after_notifications", self.drop_after_notifications is not None),
                ("drop_before_final", self.drop_before_final),
                ("drop_mid_final", self.drop_mid_final),
                ("stall", self.stall),
                ("close_after_events", self.close_after_events is not None),
                ("close_mid_final_bytes", self.close_mid_final_bytes is not None),
                ("close_mid_records_bytes", self.close_mid_records_bytes is not None),
            )
            if on
        ]
        if len(enders) > 1:
            raise ValueError(f"choose one stream-ending fault, not {', '.join(enders)}")
        if self.final_error is not None and self.malformed_final:
            raise ValueError("choose final_error or malformed_final, not both")
        return self


class _SourceCount(_Strict):
    source: str = Field(min_length=1, description="the source's source_identity")
    count: int = Field(ge=1, lt=MAX_DAY_CHANGES)


class JoinSpec(_SourceCount):
    """``count`` new people join ``source`` (appended to its records, new canonical refs)."""


class LeaveSpec(_SourceCount):
    """``count`` of ``source``'s own people leave: their source records and final records are gone."""


class ChangeSpec(_SourceCount):
    """``count`` of ``source``'s own people change content (phone, lifecycle, attributes, version).

    With ``record_values: "whole_contract"`` their ``lifecycle`` and ``identity_match`` also change JSON type.
    """


class MergeSpec(_Strict):
    """``count`` people seen as separate records in two sources are matched from this day on.

    Each pair (one own person of ``sources[0]``, one of ``sources[1]``) becomes ONE final record
    with a new canonical ``record_ref``, both provenance entries and an ``identity_match``; its
    name, email and content are the ``sources[0]`` person's. The two source records stay in the
    pages: a merge changes the final result, not the sources.
    """

    sources: tuple[str, str]
    count: int = Field(ge=1, lt=MAX_DAY_CHANGES)

    @model_validator(mode="after")
    def _check_distinct(self) -> MergeSpec:
        if self.sources[0] == self.sources[1]:
            raise ValueError(f"a merge needs two different sources, not {self.sources[0]!r} twice")
        return self


class FailSpec(_Strict):
    """``source`` fails on this day only, like :attr:`SourceSpec.error` (the read is ``partial``)."""

    source: str = Field(min_length=1)
    error: SourceErrorCode
    error_after_pages: int = Field(default=0, ge=0)


class DaySpec(_Strict):
    """One day after day 1 of the scenario's population, described as changes to the day before.

    Applied in this order: ``leave``, ``split``, ``merge``, ``join``, ``change``. Who leaves,
    merges or changes is chosen deterministically (a seeded walk over the source's own people,
    i.e. not the ``shared_people``) among people not merged, not gone and not already chosen that
    day. ``split`` undoes the oldest ``split`` merges still in effect: the merged record is gone
    and its two people come back under the refs they had before. ``fail`` is this day's source
    failures only (the base sources' ``error`` fields are day 1's).
    """

    day: int = Field(ge=2, le=MAX_DAYS)
    observed_at: str | None = None  # default: a day after the day before
    join: list[JoinSpec] = Field(default_factory=list)
    leave: list[LeaveSpec] = Field(default_factory=list)
    merge: list[MergeSpec] = Field(default_factory=list)
    split: int = Field(default=0, ge=0, lt=MAX_DAY_CHANGES)
    change: list[ChangeSpec] = Field(default_factory=list)
    fail: list[FailSpec] = Field(default_factory=list)

    @field_validator("observed_at")
    @classmethod
    def _check_observed_at(cls, value: str | None) -> str | None:
        return None if value is None else _check_timestamp(value)


class Scenario(_Strict):
    """A complete description of the reference server's federated reads.

    - ``seed`` fixes every identity and value; the same scenario always streams the same bytes.
    - ``revision`` changes record *content* (phone, lifecycle, attributes, provenance ``version``)
      for a deterministic subset of people per step, never identities (``record_ref``,
      ``external_id``, names, emails).
    - ``observed_at`` (ISO 8601 with a timezone) is the read's ``metadata.observed_at``; each
      source stamps its provenance a few seconds earlier, never later.
    - ``shared_people`` people are present in every non-empty source (spread evenly over its
      records, so they count towards its ``records``). Pages carry them under source-local refs
      ``bos:person:<source_identity>:<external_id>``; the final result merges each into ONE
      record with a canonical ``bos:person:<id>`` ref and one provenance entry per source that
      delivered it. Every final ref is canonical, so provisional refs never equal final refs.
    - ``contexts``: the public contexts the server offers (default :data:`DEFAULT_CONTEXTS`);
      exactly one must have ``is_default: true``.
    - At most :data:`MAX_CONCURRENT_SOURCES` sources run at once (simulated); later sources
      start when an earlier one finishes.
    - ``days``: later days of the same population (:class:`DaySpec`; ``days[0]`` is day 2, and
      so on); the scenario's own fields are day 1. Each day's ``observed_at`` is later than the
      day before's. Faults apply on every day. Serve a day with ``BosReferenceServer(day=n)``.
    - ``provenance_stamps``: ``"read"`` (the default, as the contract's own example does) stamps
      every provenance ``observed_at`` with the read's observation, and each read re-stamps: the
      server's n-th read of a day (from 0) is observed n minutes after the day's ``observed_at``,
      so an unchanged person arrives with new stamps on every read. ``"last_change"`` stamps a
      record with the day it last changed (joined, merged, split back or changed) and every read of
      a day alike, so a record nobody touched streams the same bytes every day.
    - ``emptied_fields``: fields (``display_name``, ``email``, ``phone``, ``attributes.department``)
      every record sends as null, as when a source silently stops filling one (its coverage drops to 0).
    - ``record_values``: ``"narrow"`` (the default) sends the usual shapes (``lifecycle`` an object
      or null, ``identity_match`` an object on merged records, plain attributes). ``"whole_contract"``
      sends everything the contract admits where it names no type: ``lifecycle`` and
      ``identity_match`` of every JSON type (string, number, boolean, array, object, null) across
      people; attributes with integers beyond 64 bits, subnormal and negative floats, nesting 12
      deep, empty and non-ASCII keys, empty objects and lists, lists of objects; provenance entries
      with keys beyond the named seven (``label``, a nested ``link``); some display names empty,
      emoji or right-to-left. A ``change`` moves that person's ``lifecycle`` and ``identity_match``
      to another JSON type; nothing else does, so an unchanged person's record keeps its bytes
      (bar the provenance ``observed_at``).
    """

    name: str = "custom"
    seed: int = 0
    observed_at: str = "2026-10-08T12:00:00Z"
    revision: int = Field(default=0, ge=0)
    shared_people: int = Field(default=0, ge=0)
    sources: list[SourceSpec] = Field(min_length=1)
    faults: FaultSpec = Field(default_factory=FaultSpec)
    contexts: list[dict] | None = None
    days: list[DaySpec] = Field(default_factory=list)
    provenance_stamps: Literal["read", "last_change"] = "read"
    emptied_fields: list[Literal["display_name", "email", "phone", "attributes.department"]] = Field(
        default_factory=list)
    record_values: Literal["narrow", "whole_contract"] = "narrow"

    @field_validator("observed_at")
    @classmethod
    def _check_observed_at(cls, value: str) -> str:
        return _check_timestamp(value)

    @field_validator("contexts")
    @classmethod
    def _check_contexts(cls, value: list[dict] | None) -> list[dict] | None:
        if value is None:
            return value
        if not value:
            raise ValueError("contexts must list at least one context (or be omitted for the defaults)")
        handles: set[str] = set()
        for i, ctx in enumerate(value):
            try:
                model = BosContext.model_validate(ctx)
            except ValidationError as exc:
                raise ValueError(f"contexts[{i}] is not a public BOS context: {_summarise(exc)}") from None
            if model.context_handle in handles:
                raise ValueError(f"contexts[{i}] repeats context_handle {model.context_handle!r}")
            handles.add(model.context_handle)
        defaults = sum(1 for ctx in value if ctx.get("is_default") is True)
        if defaults != 1:
            raise ValueError(f"exactly one context must have is_default true (found {defaults})")
        return value

    @model_validator(mode="after")
    def _check_sources(self) -> Scenario:
        seen: set[tuple[str, str]] = set()
        for spec in self.sources:
            if spec.pair in seen:
                raise ValueError(f"source pair {spec.source_type}/{spec.source_identity} appears twice")
            seen.add(spec.pair)
        if self.shared_people:
            holders = [s for s in self.sources if s.records > 0]
            if not holders:
                raise ValueError("shared_people needs at least one source with records > 0")
            smallest = min(holders, key=lambda s: s.records)
            if self.shared_people > smallest.records:
                raise ValueError(
                    f"shared_people={self.shared_people} exceeds the {smallest.records} records of "
                    f"{smallest.source_type}/{smallest.source_identity}; shared people are part of every "
                    "non-empty source's records"
                )
        if self.days:
            self._check_days()
        return self

    def _check_days(self) -> None:
        for i, spec in enumerate(self.days):
            if spec.day != i + 2:
                raise ValueError(f"days[{i}] is day {spec.day}; days are listed in order from day 2 "
                                 f"(days[{i}] must be day {i + 2})")
        stamps = self.day_observed_at()
        for i in range(1, len(stamps)):
            if stamps[i] <= stamps[i - 1]:
                raise ValueError(f"day {i + 1}'s observed_at {stamps[i].isoformat()} is not later than "
                                 f"day {i}'s ({stamps[i - 1].isoformat()})")
        try:
            resolve_day(self, self.day_count)  # every day on the way is checked too
        except DayPlanError as exc:
            raise ValueError(str(exc)) from None

    @property
    def observed_at_datetime(self) -> datetime:
        """``observed_at`` as an aware UTC datetime."""
        return datetime.fromisoformat(self.observed_at).astimezone(UTC)

    @property
    def day_count(self) -> int:
        """How many days the scenario has (1 without ``days``)."""
        return 1 + len(self.days)

    def check_day(self, day: object) -> int:
        """``day`` if the scenario has it; else :class:`BosConfigurationError` naming the valid days."""
        if isinstance(day, bool) or not isinstance(day, int) or not 1 <= day <= self.day_count:
            have = "only day 1" if self.day_count == 1 else f"days 1 to {self.day_count}"
            raise BosConfigurationError(
                f"Scenario {self.name!r} has {have}; day {day!r} does not exist. "
                "Pick one of those days, or add days to the scenario (its 'days' list)."
            )
        return day

    def day_observed_at(self) -> list[datetime]:
        """Every day's read ``observed_at`` (aware UTC), day 1 first."""
        stamps = [self.observed_at_datetime]
        for spec in self.days:
            if spec.observed_at is None:
                stamps.append(stamps[-1] + timedelta(days=1))
            else:
                stamps.append(datetime.fromisoformat(spec.observed_at).astimezone(UTC))
        return stamps

    def resolved_contexts(self) -> list[dict]:
        """The public contexts to offer: ``contexts`` or fresh copies of :data:`DEFAULT_CONTEXTS`."""
        chosen = self.contexts if self.contexts is not None else DEFAULT_CONTEXTS
        return [dict(ctx) for ctx in chosen]


def _check_timestamp(value: str) -> str:
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"observed_at {value!r} is not an ISO 8601 timestamp") from None
    if parsed.tzinfo is None:
        raise ValueError(f"observed_at {value!r} needs a timezone, e.g. 2026-10-08T12:00:00Z")
    return value


def _summarise(exc: ValidationError) -> str:
    """One line per problem, ``location: message`` (no input echo; scenario files can be long)."""
    parts = []
    for err in exc.errors(include_input=False, include_url=False):
        loc = ".".join(str(p) for p in err["loc"]) or "<root>"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


def _load_builtins() -> dict[str, Scenario]:
    builtins: dict[str, Scenario] = {}
    folder = resources.files("airflow_provider_bos.testing") / "scenarios"
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".json"):
            continue
        scenario = Scenario.model_validate_json(entry.read_text(encoding="utf-8"))
        stem = entry.name[: -len(".json")]
        if scenario.name != stem:  # keeps file names and names in sync for users copying them
            raise RuntimeError(f"builtin scenario file {entry.name} is named {scenario.name!r}")
        builtins[stem] = scenario
    return builtins


BUILTIN_SCENARIOS: dict[str, Scenario] = _load_builtins()


def load_scenario(name_or_path: str | os.PathLike[str]) -> Scenario:
    """A builtin scenario by name (a fresh copy), or a scenario JSON file by path.

    Raises :class:`BosConfigurationError` for an unknown name, an unreadable file, bad JSON or
    a scenario that does not validate (the message lists each problem by field path).
    """
    key = os.fspath(name_or_path)
    if key in BUILTIN_SCENARIOS:
        return BUILTIN_SCENARIOS[key].model_copy(deep=True)
    path = Path(key)
    if not path.is_file():
        raise BosConfigurationError(
            f"Unknown scenario {key!r}: not a builtin ({', '.join(sorted(BUILTIN_SCENARIOS))}) "
            "and not an existing JSON file."
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BosConfigurationError(f"Cannot read scenario file {path}: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BosConfigurationError(
            f"Scenario file {path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})."
        ) from None
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise BosConfigurationError(f"Scenario file {path} is invalid: {_summarise(exc)}") from None


def large_scenario(
    total_records: int = 100_000,
    *,
    sources: int = 2,
    shared_people: int = 0,
    seed: int = 0,
    revision: int = 0,
    page_size: int = MAX_PAGE_SIZE,
) -> Scenario:
    """A big all-complete read (e.g. 1,000,000 records for benchmarks), records split over sources.

    With ``shared_people == 0`` the final result holds exactly ``total_records`` records.
    """
    if sources < 1 or total_records < 0:
        raise BosConfigurationError("large_scenario needs sources >= 1 and total_records >= 0")
    base, extra = divmod(total_records, sources)
    kinds = ("crm", "hr", "directory", "erp")
    specs = [
        SourceSpec(
            source_type=kinds[i % len(kinds)],
            source_identity=f"{kinds[i % len(kinds)]}-{i + 1}",
            records=base + (1 if i < extra else 0),
            page_size=page_size,
        )
        for i in range(sources)
    ]
    try:
        return Scenario(
            name=f"large-{total_records}",
            seed=seed,
            revision=revision,
            shared_people=shared_people,
            sources=specs,
        )
    except ValidationError as exc:
        raise BosConfigurationError(f"large_scenario arguments are invalid: {_summarise(exc)}") from None
