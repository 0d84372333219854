"""The completeness verdict on one audit row of ``bos_sync_runs`` — pure logic, no Airflow.

Fail closed: only a run whose status is ``complete`` and whose result count reaches
``min_records`` passes; anything unknown is a failure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

PASS = "pass"
PARTIAL = "partial"   # partial or failed read
TOO_FEW = "too_few_records"
STALE = "stale"
UNKNOWN = "unknown_status"
TOO_MANY_RETIRED = "too_many_retired"


@dataclass(frozen=True)
class Verdict:
    outcome: str
    message: str
    run: dict[str, Any] | None = None
    failing_sources: list[tuple[str, str]] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.outcome == PASS


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def failing_sources(run: dict[str, Any]) -> list[tuple[str, str]]:
    """``(source_type/source_identity, error code)`` for each source error in the run."""
    out = []
    for entry in run.get("source_errors") or []:
        src = entry.get("source") or {}
        name = f"{src.get('source_type', '?')}/{src.get('source_identity', '?')}"
        out.append((name, (entry.get("error") or {}).get("code", "unknown")))
    return out


def judge(
    run: dict[str, Any],
    *,
    min_records: int = 1,
    max_age: timedelta | None = None,
    now: datetime | None = None,
    max_retired: int | None = None,
) -> Verdict:
    """Judge one audit row."""
    ref = f"BOS sync run {run.get('run_id')} ({run.get('tool_name')} in context {run.get('context_handle')})"
    status = run.get("status")
    if max_age is not None and run.get("finished_at") is not None:
        age = _aware(now or datetime.now(timezone.utc)) - _aware(run["finished_at"])
        if age > max_age:
            return Verdict(STALE, f"{ref} finished {age} ago, older than max_age {max_age}: the data is stale.", run)
    if status in {"partial", "failed"}:
        sources = failing_sources(run)
        detail = "; ".join(f"{name}: {code}" for name, code in sources) or "no source errors recorded"
        reason = f" Error: {run['error_message']}" if run.get("error_message") else ""
        return Verdict(PARTIAL, f"{ref} is {status}. Failing sources: {detail}.{reason}", run, sources)
    if status != "complete":
        return Verdict(UNKNOWN, f"{ref} has unknown status {status!r}; failing closed.", run)
    count = run.get("result_count") or 0
    if max_retired is not None:
        retired, superseded = run.get("retired") or 0, run.get("superseded") or 0
        if retired + superseded > max_retired:
            return Verdict(
                TOO_MANY_RETIRED,
                f"{ref} retired {retired} and superseded {superseded} row(s), more than max_retired={max_retired}.",
                run,
            )
    if count < min_records:
        return Verdict(TOO_FEW, f"{ref} returned {count} record(s), fewer than min_records={min_records}.", run)
    return Verdict(PASS, f"{ref} is complete with {count} record(s).", run)
