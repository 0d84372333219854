"""The ``bos/source-results/v1`` notifications of a read: validation and per-source progress.

:class:`SourceResultsTracker` checks every ``notifications/bos/source_result`` against the
contract (§4-§5) and keeps per-source progress. Pages are provisional observations, never data;
the authoritative final result is :mod:`.final_result`'s.

Source names are the server's: the tracker keeps at most :data:`MAX_TRACKED_SOURCES` sources,
whose names total at most :data:`MAX_TRACKED_SOURCE_CHARS` characters, so a server inventing
sources cannot grow the task's memory or the audit row's ``source_summary`` without bound.
Notifications of sources beyond the bound are still checked one by one and counted (one
``"untracked"`` entry closes the summary), but their per-source story cannot be followed, so such
a read cannot be checked as complete (:mod:`.final_result` makes it a contradiction: ``partial``).
Names shown in messages and logs go through :func:`source_label` (escaped, cut).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from airflow_provider_bos.exceptions import BosStreamValidationError
from airflow_provider_bos.mcp.jsonrpc import same_id
from airflow_provider_bos.mcp.page_records import PageRecords
from airflow_provider_bos.models import SOURCE_ERROR_CODES, BosContext, SourceErrorInfo, SourceRef
from airflow_provider_bos.redaction import printable

__all__ = [
    "MAX_TRACKED_SOURCES",
    "MAX_TRACKED_SOURCE_CHARS",
    "UNTRACKED_STATUS",
    "SourceNotification",
    "SourceProgress",
    "SourceResultsTracker",
    "SourceStats",
    "ToolStyle",
    "describe_validation_error",
    "source_label",
]

ToolStyle = Literal["execute", "direct"]
_STATUSES = ("page", "complete", "error")

#: Sources one read tracks in detail; later sources are counted, not tracked.
MAX_TRACKED_SOURCES = 1_000
#: Characters of ``source_type`` + ``source_identity`` the tracked sources may total.
MAX_TRACKED_SOURCE_CHARS = 256 * 1024
#: The ``status`` of the summary entry that counts the untracked sources' notifications.
UNTRACKED_STATUS = "untracked"
_LABEL_CHARS = 200


def source_label(source_type: str, source_identity: str) -> str:
    """``type/identity`` of a server-named source, safe for a log line or a message.

    Control and format characters are escaped (no forged log lines, no terminal escapes), secrets
    redacted, and the label cut to 200 characters.
    """
    return printable(f"{source_type}/{source_identity}", limit=_LABEL_CHARS)


_CODE_SHAPED = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def _code_for_message(code: object) -> str:
    """A rejected error code as a message shows it: named when it looks like a code (a newer server's
    code is worth seeing), described otherwise (a server's text there may quote a person)."""
    if isinstance(code, str) and _CODE_SHAPED.fullmatch(code):
        return repr(code)
    return f"(a {type(code).__name__} that is not a code)"


def _violation(rule: str, message: str) -> BosStreamValidationError:
    err = BosStreamValidationError(
        f"bos/source-results/v1 notification broke the contract [{rule}]: {message}", rule=rule
    )
    return err


# --- notifications -----------------------------------------------------------------------------


@dataclass
class SourceStats:
    """Provisional progress of one source (``source_type``, ``source_identity``) in a read."""

    source: SourceRef
    pages: int = 0
    records: int = 0
    status: str = "running"  # "running" | "complete" | "error"
    error_code: str | None = None
    last_page_index: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "source_type": self.source.source_type,
            "source_identity": self.source.source_identity,
            "pages": self.pages,
            "records": self.records,
            "status": self.status,
            "error_code": self.error_code,
            "last_page_index": self.last_page_index,
        }


class SourceNotification(BaseModel):
    """One validated ``notifications/bos/source_result`` (the contract's field names).

    Like :class:`~airflow_provider_bos.models.SourceResultParams`, except that ``records`` holds the
    page's wire records as plain dicts: provisional records are progress, never data, so they get
    the same light structural check as the final records (a non-empty ``record_ref``, a non-empty
    ``sources`` list whose entries carry ``observed_at``) and are not built into models. Built
    without re-validation (:meth:`SourceResultsTracker.observe` has checked every field).
    """

    model_config = ConfigDict(extra="allow")

    requestId: str | int
    sequence: int
    pageIndex: int
    source: SourceRef
    records: list[dict[str, Any]]
    status: str
    error: SourceErrorInfo | None = None
    context: BosContext | None = None


_NOTIFICATION_FIELDS = frozenset(SourceNotification.model_fields)


def _check_page_record(raw: Any) -> str | None:
    """Why a page record breaks the contract's record shape, or None (the final records' check)."""
    if type(raw) is not dict:
        return "is not an object"
    ref = raw.get("record_ref")
    if type(ref) is not str or not ref:
        return "has no record_ref"
    sources = raw.get("sources")
    if type(sources) is not list or not sources:
        return "has no sources (a non-empty list is required)"
    for entry in sources:
        if type(entry) is not dict or type(entry.get("observed_at")) is not str:
            return "has a provenance entry without observed_at"
    return None


class SourceProgress:
    """What ``on_progress`` receives for each notification: the page and a snapshot of its source.

    ``page_records`` is the number of records the notification carried. ``notification`` is built
    on first access: a page decoded by the fast path (:mod:`.page_records`) decodes its records
    only then, so a callback that only counts never pays for them.
    """

    __slots__ = ("_build", "_notification", "page_records", "sequence", "stats", "tracked")

    def __init__(
        self,
        notification: SourceNotification | None = None,
        *,
        stats: SourceStats,
        sequence: int,
        page_records: int | None = None,
        build: Callable[[], SourceNotification] | None = None,
        tracked: bool = True,
    ) -> None:
        if (notification is None) == (build is None):
            raise TypeError("SourceProgress needs a notification or a way to build one, not both.")
        self._notification = notification
        self._build = build
        self.stats = stats  # a copy: later pages do not change it
        self.sequence = sequence
        #: False for a source beyond the tracker's bound: ``stats`` then covers this notification only.
        self.tracked = tracked
        if page_records is None:
            assert notification is not None
            page_records = len(notification.records)
        self.page_records = page_records

    @property
    def notification(self) -> SourceNotification:
        if self._notification is None:
            assert self._build is not None
            self._notification, self._build = self._build(), None
        return self._notification

    def __repr__(self) -> str:
        return f"SourceProgress(sequence={self.sequence}, page_records={self.page_records}, stats={self.stats!r})"


class SourceResultsTracker:
    """Validates a read's source notifications in wire order and keeps per-source statistics.

    Every contract rule that fails raises :class:`BosStreamValidationError` whose ``rule``
    attribute names it: ``shape``, ``request-id``, ``sequence``, ``status``, ``source``,
    ``after-terminal``, ``page-index``, ``terminal-page-index``, ``error-code``,
    ``error-without-status``, ``error-records``, ``records``. A source beyond the bound (see the
    module docstring) gets every rule but the per-source ones (``after-terminal``, and
    ``page-index`` / ``terminal-page-index`` continuity).
    """

    def __init__(self, request_id: str | int) -> None:
        self.request_id = request_id
        self.sources: dict[tuple[str, str], SourceStats] = {}
        self.notifications = 0
        self.provisional_records = 0
        self.pages = 0
        self.last_sequence: int | None = None
        #: Times the response stream dropped and was resumed (GET + Last-Event-ID).
        self.stream_resumptions = 0
        #: Notifications a resumed stream sent again, skipped (never counted twice).
        self.replays_skipped = 0
        #: Notifications (pages, records) of sources beyond the bound, and why the bound was hit.
        self.untracked_notifications = 0
        self.untracked_pages = 0
        self.untracked_records = 0
        self.untracked_reason: str | None = None
        self._tracked_chars = 0

    def _admit(self, key: tuple[str, str]) -> bool:
        """Whether a new source may be tracked. Once one is refused no later one is admitted, so a
        source never turns from untracked into tracked halfway through its pages."""
        if self.untracked_reason is not None:
            return False
        chars = len(key[0]) + len(key[1])
        if len(self.sources) >= MAX_TRACKED_SOURCES:
            self.untracked_reason = f"more than {MAX_TRACKED_SOURCES} sources"
        elif self._tracked_chars + chars > MAX_TRACKED_SOURCE_CHARS:
            self.untracked_reason = f"more than {MAX_TRACKED_SOURCE_CHARS} characters of source names"
        else:
            self._tracked_chars += chars
            return True
        return False

    def observe(self, params: Any) -> SourceProgress:
        """Validate one notification's ``params``; update and return the source's progress."""
        if not isinstance(params, Mapping):
            raise _violation("shape", "params is not an object.")
        request_id: Any = params.get("requestId")  # wire JSON, checked here
        if not same_id(request_id, self.request_id):
            raise _violation(
                "request-id", f"requestId {request_id!r} is not this call's id {self.request_id!r}."
            )
        sequence = params.get("sequence")
        if not isinstance(sequence, int) or isinstance(sequence, bool):
            raise _violation("sequence", f"sequence {sequence!r} is not an integer.")
        if self.last_sequence is not None and sequence <= self.last_sequence:
            raise _violation(
                "sequence", f"sequence {sequence} does not increase (previous {self.last_sequence})."
            )
        status = params.get("status")
        if status not in _STATUSES:
            raise _violation("status", f"status {status!r} is not one of page, complete, error.")
        source = params.get("source")
        if (
            not isinstance(source, Mapping)
            or not isinstance(source.get("source_type"), str)
            or not isinstance(source.get("source_identity"), str)
        ):
            raise _violation("source", "source must carry string source_type and source_identity.")
        key = (source["source_type"], source["source_identity"])
        page_index = params.get("pageIndex")
        if not isinstance(page_index, int) or isinstance(page_index, bool):
            raise _violation("page-index", f"pageIndex {page_index!r} is not an integer.")
        records: Any = params.get("records")  # wire JSON, checked below
        # A page from the fast path arrives checked and counted, its records not yet decoded.
        page = records if type(records) is PageRecords else None
        if page is None and not isinstance(records, list):
            raise _violation("records", "records must be an array.")
        error = params.get("error")

        stats = self.sources.get(key)
        tracked = stats is not None or self.untracked_reason is None  # (admitted at commit time)
        where = f"source {source_label(*key)}"
        if stats is not None and stats.status != "running":
            raise _violation("after-terminal", f"{where} sent {status!r} after its terminal {stats.status!r}.")
        last = stats.last_page_index if stats is not None else 0
        if not tracked:  # its earlier pages are unknown: only the bounds of any page index
            if page_index < (1 if status == "page" else 0):
                raise _violation("page-index", f"{where} sent {status!r} with pageIndex {page_index}.")
        elif status == "page":
            if page_index != last + 1:
                raise _violation("page-index", f"{where} sent page {page_index}; expected page {last + 1}.")
        elif page_index != last:
            raise _violation(
                "terminal-page-index",
                f"{where} sent {status!r} with pageIndex {page_index}; its last page was {last}.",
            )
        if status == "error":
            code = error.get("code") if isinstance(error, Mapping) else None
            if not isinstance(code, str) or code not in SOURCE_ERROR_CODES:
                raise _violation(
                    "error-code",
                    f"{where} error code {_code_for_message(code)} is not one of "
                    f"{', '.join(sorted(SOURCE_ERROR_CODES))}.",
                )
            if records:
                raise _violation("error-records", f"{where} sent records with status 'error'.")
        elif error is not None:
            raise _violation("error-without-status", f"{where} sent an error object with status {status!r}.")

        if page is None:
            for index, raw in enumerate(records):
                why = _check_page_record(raw)
                if why is not None:
                    raise _violation("records", f"{where} page record {index} {why}.")
        try:
            # The envelope's small objects are validated now; the page records are never built
            # into models (~2 us each, for records that are only counted).
            source_model = SourceRef.model_validate(source)
            error_model = SourceErrorInfo.model_validate(error) if error is not None else None
            context = params.get("context")
            context_model = BosContext.model_validate(context) if context is not None else None
        except ValidationError as exc:
            raise _violation("shape", describe_validation_error(exc)) from None
        # A newer server's extra fields are kept, as model_validate would.
        extra = {k: v for k, v in params.items() if k not in _NOTIFICATION_FIELDS}

        def build(page_records: list[Any]) -> SourceNotification:
            model = SourceNotification.model_construct(
                requestId=request_id, sequence=sequence, pageIndex=page_index, source=source_model,
                records=page_records, status=status, error=error_model, context=context_model,
            )
            if extra:  # set here: any key may arrive, including model_construct's own parameter names
                model.__pydantic_extra__ = extra
            return model

        # Every check passed: commit the state change.
        if stats is None:
            stats = SourceStats(source=source_model)
            if self._admit(key):
                self.sources[key] = stats
            else:  # counted, not kept: ``stats`` then covers this notification only
                tracked = False
        self.last_sequence = sequence
        self.notifications += 1
        count = len(records)
        stats.records += count
        self.provisional_records += count
        if status == "page":
            stats.pages += 1
            stats.last_page_index = page_index
            self.pages += 1
        else:
            stats.status = status
            if status == "error":
                assert error_model is not None
                stats.error_code = error_model.code
        if not tracked:
            self.untracked_notifications += 1
            self.untracked_pages += status == "page"
            self.untracked_records += count
        snapshot = dataclasses.replace(stats)
        if page is not None:
            return SourceProgress(stats=snapshot, sequence=sequence, page_records=count,
                                  build=lambda: build(page.decode()), tracked=tracked)
        return SourceProgress(build(records), stats=snapshot, sequence=sequence, page_records=count,
                              tracked=tracked)

    # -- views ---------------------------------------------------------------------------------

    @property
    def running_sources(self) -> list[SourceRef]:
        return [s.source for s in self.sources.values() if s.status == "running"]

    @property
    def errored_sources(self) -> dict[tuple[str, str], str]:
        return {k: s.error_code or "" for k, s in self.sources.items() if s.status == "error"}

    def summary(self) -> list[dict[str, Any]]:
        """Per-source statistics as JSON-able dicts, in first-seen order (bounded, see the module).

        When sources went untracked, one last entry of the same shape with ``status``
        ``"untracked"`` counts their pages and records and names the bound in ``source_identity``.
        """
        summary = [s.as_dict() for s in self.sources.values()]
        if self.untracked_notifications:
            summary.append({
                "source_type": "(untracked)",
                "source_identity": f"(sources beyond the first {len(self.sources)}: the stream named "
                                   f"{self.untracked_reason}; at most {MAX_TRACKED_SOURCES} sources and "
                                   f"{MAX_TRACKED_SOURCE_CHARS} characters of names are tracked)",
                "pages": self.untracked_pages,
                "records": self.untracked_records,
                "status": UNTRACKED_STATUS,
                "error_code": None,
                "last_page_index": 0,
            })
        return summary

    def __repr__(self) -> str:
        return (
            f"SourceResultsTracker(request_id={self.request_id!r}, notifications={self.notifications}, "
            f"pages={self.pages}, provisional_records={self.provisional_records}, sources={len(self.sources)})"
        )


def describe_validation_error(exc: ValidationError, limit: int = 3) -> str:
    parts = []
    for err in exc.errors()[:limit]:
        # A location can hold a server's dict key and a message its value: both are escaped.
        loc = printable(".".join(str(p) for p in err["loc"]), limit=200) or "(root)"
        parts.append(f"{loc}: {printable(err['msg'], limit=300)}")
    more = len(exc.errors()) - limit
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")
