"""The completeness verdict on one audit row of ``bos_sync_runs`` — pure logic, no Airflow.

Fail closed: only a run whose status is ``complete`` and whose result count reaches
``min_records`` passes; anything unknown is a failure. What the server named (sources, the
context, error text) is escaped in the message: it is logged and sent to notifiers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow_provider_bos.exceptions import BosConfigurationError
from airflow_provider_bos.mcp.source_results import source_label
from airflow_provider_bos.redaction import printable

PASS = "pass"  # noqa: S105 - a verdict name, not a password
PARTIAL = "partial"   # partial or failed read
TOO_FEW = "too_few_records"
STALE = "stale"
UNKNOWN = "unknown_status"
TOO_MANY_RETIRED = "too_many_retired"
# A column name as the warehouse validates it (warehouse/tables/identifiers.py; not imported: DAG files parse this).
_COLUMN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
LOW_COVERAGE = "low_coverage"  # a watched column had a value in too few of the run's records
NO_COVERAGE = "no_coverage"  # min_coverage names a column the run's coverage does not hold: fails always


@dataclass(frozen=True)
class Verdict:
    outcome: str
    message: str
    run: dict[str, Any] | None = None
    failing_sources: list[tuple[str, str]] = field(default_factory=list)
    #: ``(column, ratio, min_coverage)`` of each watched column below its threshold (``low_coverage``).
    low_coverage: list[tuple[str, float, float]] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.outcome == PASS


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def failing_sources(run: dict[str, Any]) -> list[tuple[str, str]]:
    """``(source_type/source_identity, error code)`` for each source error in the run."""
    out = []
    for entry in run.get("source_errors") or []:
        src = entry.get("source") or {}
        name = source_label(str(src.get("source_type", "?")), str(src.get("source_identity", "?")))
        code = printable(str((entry.get("error") or {}).get("code", "unknown")), limit=80)
        out.append((name, code))
    return out


def judge(
    run: dict[str, Any],
    *,
    min_records: int = 1,
    max_age: timedelta | None = None,
    now: datetime | None = None,
    max_retired: int | None = None,
    min_coverage: Mapping[str, float] | None = None,
) -> Verdict:
    """Judge one audit row (``min_coverage``: checked by :func:`check_min_coverage` beforehand); the
    run's notes (information, never a reason to fail) close the message."""
    verdict = _judge(run, min_records=min_records, max_age=max_age, now=now, max_retired=max_retired,
                     min_coverage=min_coverage)
    notes = run.get("notes")
    return replace(verdict, message=f"{verdict.message} Notes: {printable(str(notes))}") if notes else verdict


def _judge(
    run: dict[str, Any],
    *,
    min_records: int,
    max_age: timedelta | None,
    now: datetime | None,
    max_retired: int | None,
    min_coverage: Mapping[str, float] | None,
) -> Verdict:
    context = printable(str(run.get("context_handle")), limit=200)
    ref = f"BOS sync run {run.get('run_id')} ({run.get('tool_name')} in context {context})"
    status = run.get("status")
    if max_age is not None and run.get("finished_at") is not None:
        age = _aware(now or datetime.now(UTC)) - _aware(run["finished_at"])
        if age > max_age:
            return Verdict(STALE, f"{ref} finished {age} ago, older than max_age {max_age}: the data is stale.", run)
    if status in {"partial", "failed"}:
        sources = failing_sources(run)
        detail = "; ".join(f"{name}: {code}" for name, code in sources) or "no source errors recorded"
        # A failed run's message is its error; a partial run's is a note (what it held back, and why).
        label = "Error" if status == "failed" else "Note"
        reason = f" {label}: {printable(str(run['error_message']))}" if run.get("error_message") else ""
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
    if min_coverage and count:  # a run of no records: min_records alone governs
        verdict = _coverage_verdict(run, ref, min_coverage)
        if verdict is not None:
            return verdict
    return Verdict(PASS, f"{ref} is complete with {count} record(s).{_coverage_checked(run, min_coverage)}", run)


def _coverage_checked(run: dict[str, Any], min_coverage: Mapping[str, float] | None) -> str:
    """What a passing run's coverage was against each ``min_coverage`` share (empty without one)."""
    coverage = run.get("coverage")
    if not min_coverage or not isinstance(coverage, Mapping) or not coverage.get("records"):
        return ""
    records, columns = coverage["records"], coverage.get("columns") or {}
    checked = "; ".join(f"{c} {columns[c]}/{records} ({columns[c] / records:.1%}, min_coverage {share * 100:g}%)"
                        for c, share in min_coverage.items() if isinstance(columns.get(c), int))
    return f" Coverage checked: {checked}." if checked else ""


def check_min_coverage(min_coverage: object) -> dict[str, float] | None:
    """``min_coverage`` as the sensor keeps it: column name -> the least share of a complete run's
    records with a value in it, each in (0, 1]; None: not checked."""
    if min_coverage is None:
        return None
    if not isinstance(min_coverage, Mapping) or not min_coverage:
        raise BosConfigurationError(
            'min_coverage must be a mapping of column name to a share from 0 to 1, e.g. {"email": 0.9}, '
            f"or None; not {printable(repr(min_coverage), limit=80)}."
        )
    checked: dict[str, float] = {}
    for column, share in min_coverage.items():
        if not isinstance(column, str) or _COLUMN_NAME.fullmatch(column) is None:
            raise BosConfigurationError(
                f"min_coverage names {printable(repr(column), limit=80)}, which is no column name (letters, "
                "digits and underscores, e.g. 'email' or a promoted attribute's column)."
            )
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1:
            raise BosConfigurationError(
                f"min_coverage[{column!r}] must be a share above 0 and at most 1 (0.9: nine in ten records "
                f"have a value), not {printable(repr(share), limit=40)}."
            )
        checked[column] = float(share)
    return checked


def _coverage_verdict(run: dict[str, Any], ref: str, min_coverage: Mapping[str, float]) -> Verdict | None:
    """``low_coverage`` when a watched column had a value in too few of the run's records; ``no_coverage``
    when the run's coverage does not hold one (it must not pass unchecked); None when all reach theirs."""
    coverage = run.get("coverage")
    records = coverage.get("records") if isinstance(coverage, Mapping) else None
    columns = coverage.get("columns") if isinstance(coverage, Mapping) else None
    if not isinstance(records, int) or not isinstance(columns, Mapping):
        return Verdict(NO_COVERAGE, (
            f"{ref} records no coverage, so min_coverage cannot be checked: the run was written before the "
            "audit table had a coverage column, or by an older provider. Let the next sync (this provider "
            "version adds the column) write a run to judge, or remove min_coverage."
        ), run)
    absent = sorted(c for c in min_coverage if not isinstance(columns.get(c), int))
    if absent:
        counted = ", ".join(printable(str(c), limit=64) for c in columns)
        return Verdict(NO_COVERAGE, (
            f"{ref} counted no coverage of {', '.join(absent)} (it counts {counted or 'no column'}), so "
            "min_coverage cannot be checked: promote the attribute with the operator's attribute_columns "
            "(promoted columns are counted; with run_sync, name any column in coverage_columns), or remove it "
            "from min_coverage (a field the personal-data policy drops is never counted)."
        ), run)
    if records <= 0:
        return None
    low = [(c, columns[c] / records, share) for c, share in min_coverage.items() if columns[c] / records < share]
    if not low:
        return None
    detail = "; ".join(f"{c} had a value in {columns[c]} of {records} record(s) ({ratio:.1%}), below "
                       f"min_coverage {share * 100:g}%" for c, ratio, share in low)
    return Verdict(LOW_COVERAGE, f"{ref} is complete, but {detail}: a field may have gone empty at a source.",
                   run, low_coverage=low)
