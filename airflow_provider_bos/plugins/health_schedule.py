"""Is a destination on time? Its writing DAG's schedule against the DAG's latest run of the table.

- **Error**: the DAG's latest run of the table failed.
- **Delayed**: a scheduled run was due after the latest run started (the first run time the DAG's
  timetable gives after it) and has not been recorded within the grace time: the smaller of
  ``[bos] health_grace_minutes`` (default 60) and half the schedule's period. A paused DAG says so.
  A DAG that has run the table never is Delayed once its first run was due.
- **On time**: otherwise (the next run is not due yet, or the timetable schedules no more runs).
- **Not scheduled**: the DAG has no time-based schedule (manual, asset-triggered): nothing is due.
- **No runs**: nothing recorded yet, and nothing due.

Only the timetable's own ``next_dagrun_info`` is asked, from the latest run on, a few steps at most.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

__all__ = ["DELAYED", "ERROR", "NOT_SCHEDULED", "NO_RUNS", "ON_TIME", "Punctuality", "grace", "punctuality", "worst"]

log = logging.getLogger(__name__)

ON_TIME = "On time"
DELAYED = "Delayed"
ERROR = "Error"
NOT_SCHEDULED = "Not scheduled"
NO_RUNS = "No runs"
#: How bad each state is (the worst of a table's writers is the table's).
SEVERITY = {ERROR: 4, DELAYED: 3, NO_RUNS: 1, ON_TIME: 2, NOT_SCHEDULED: 0}
_STEPS = 64


@dataclass(frozen=True)
class Punctuality:
    state: str
    detail: str
    due_at: datetime | None = None

    def as_json(self) -> dict[str, Any]:
        return {"state": self.state, "detail": self.detail,
                "due_at": self.due_at.isoformat() if self.due_at else None}


def grace() -> timedelta:
    """``[bos] health_grace_minutes`` (default 60): how late a run may land before it is Delayed."""
    from airflow.configuration import conf

    try:
        minutes = float(conf.get("bos", "health_grace_minutes", fallback="60") or 60)
    except ValueError:
        minutes = 60.0
    return timedelta(minutes=max(0.0, minutes))


def _runs_after(timetable: Any, earliest: datetime, end: datetime | None) -> list[datetime]:
    """The timetable's run times from ``earliest`` on (at most :data:`_STEPS`), as it schedules them."""
    import pendulum
    from airflow.timetables.base import TimeRestriction

    restriction = TimeRestriction(pendulum.instance(earliest), pendulum.instance(end) if end else None, True)
    times: list[datetime] = []
    last = None
    for _ in range(_STEPS):
        info = timetable.next_dagrun_info(last_automated_data_interval=last, restriction=restriction)
        if info is None:
            break
        times.append(info.run_after)
        last = info.data_interval
    return times


def _next_due(timetable: Any, after: datetime, start: datetime | None, end: datetime | None,
              ) -> tuple[datetime | None, timedelta | None]:
    """The first run time the timetable gives after ``after``, and the schedule's period there."""
    ahead = _runs_after(timetable, max(after, start) if start else after, end)[:2]
    period = ahead[1] - ahead[0] if len(ahead) == 2 and ahead[1] > ahead[0] else None
    earliest = after - 2 * period if period else after
    if start and earliest < start:
        earliest = start
    for moment in _runs_after(timetable, earliest, end):
        if moment > after:
            return moment, period
    return None, period


def punctuality(
    *,
    timetable: Any,
    latest: dict[str, Any] | None,
    now: datetime,
    start_date: datetime | None = None,
    end_date: datetime | None = None,
    is_paused: bool = False,
    max_grace: timedelta = timedelta(minutes=60),
) -> Punctuality:
    """The state of one DAG's runs of one table (``latest``: its newest audit row, or None)."""
    if latest is not None and latest.get("status") == "failed":
        return Punctuality(ERROR, "The latest run failed.")
    if timetable is None or not getattr(timetable, "periodic", False) or not getattr(timetable, "can_be_scheduled",
                                                                                     True):
        return Punctuality(NOT_SCHEDULED if latest else NO_RUNS, "The DAG has no time-based schedule.")
    paused = " The DAG is paused." if is_paused else ""
    try:
        if latest is None:
            first = _runs_after(timetable, start_date or now, end_date)[:2]
            if not first:
                return Punctuality(NO_RUNS, "No run recorded, and none is scheduled.")
            period = first[1] - first[0] if len(first) == 2 else None
            allowed = min(max_grace, period / 2) if period else max_grace
            if now > first[0] + allowed:
                return Punctuality(DELAYED, f"No run recorded; the first was due at {first[0]:%Y-%m-%d %H:%M} UTC."
                                   + paused, first[0])
            return Punctuality(NO_RUNS, "No run recorded yet.", first[0])
        started = latest.get("started_at") or latest.get("finished_at")
        if started is None:
            return Punctuality(NOT_SCHEDULED, "The latest run has no start time.")
        due, period = _next_due(timetable, started, start_date, end_date)
    except Exception:  # a timetable that fails here is shown as unknown; the log says why
        log.warning("BOS sync health: the timetable %r could not be evaluated.", timetable, exc_info=True)
        return Punctuality(NOT_SCHEDULED, "The DAG's schedule could not be evaluated.")
    if due is None:
        return Punctuality(ON_TIME, "No further run is scheduled.")
    allowed = min(max_grace, period / 2) if period else max_grace
    if now > due + allowed:
        return Punctuality(DELAYED, f"A run was due at {due:%Y-%m-%d %H:%M} UTC and has not been recorded."
                           + paused, due)
    return Punctuality(ON_TIME, f"Next run due at {due:%Y-%m-%d %H:%M} UTC.", due)


def worst(states: list[Punctuality]) -> Punctuality | None:
    return max(states, key=lambda p: SEVERITY.get(p.state, 0)) if states else None
