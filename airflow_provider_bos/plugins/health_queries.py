"""What the sync-health page reads of one destination: its audit table, aggregated in SQL, per window.

Everything is SQLAlchemy Core over the audit table's own definition (``warehouse.audit_table``), every
value bound, every aggregate computed by the destination database and bounded by the window (days
of UTC calendar time ending today). Python receives at most one row per day, per status, per
distinct source-error list, or per run when a window holds at most :data:`MAX_RUN_POINTS` runs.

Days are bucketed by a ``CASE`` over the window's bound day boundaries (no date function differs
between databases, no session time zone is involved). Only the audit table is read, and of the
records table only ``COUNT(*)`` of its current and retired rows: the page never selects a record value.

Rows the maintenance commands write (``airflow-provider-bos erase`` and ``pii-apply``, tool names
starting :data:`MAINTENANCE_TOOL_PREFIX`) are not sync runs and are left out.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from airflow_provider_bos.warehouse import audit_table, dialect_for, validate_identifier, validate_schema

__all__ = [
    "COUNT_SERIES",
    "MAINTENANCE_TOOL_PREFIX",
    "MAX_RUN_POINTS",
    "RECENT_RUNS",
    "RUN_STATUSES",
    "WINDOWS",
    "AuditMissing",
    "AuditTarget",
    "HealthReader",
    "RunFilter",
    "TableHealth",
    "Window",
    "scrub_notes",
]

#: The windows the page offers, in days.
WINDOWS = (7, 30, 90)
#: A window with at most this many runs is charted per run; with more, per day.
MAX_RUN_POINTS = 90
#: How many of the window's newest runs the page lists.
RECENT_RUNS = 30
#: The counts charted per run (the audit row's columns of the same names).
COUNT_SERIES = ("inserted", "updated", "unchanged", "retired", "superseded", "withheld", "rejected")
RUN_STATUSES = ("complete", "partial", "failed")
#: Audit rows of the maintenance commands (erase, pii-apply): not sync runs.
MAINTENANCE_TOOL_PREFIX = "airflow-provider-bos "
# Audit columns an audit table made by an early release may lack (see docs/warehouse.md).
_ADDED = ("rejected", "retired", "superseded", "withheld", "coverage")
_COVERED = ("display_name", "email", "phone")
_MAX_SOURCE_LABEL = 200
_MAX_CODE = 64
# At most this many distinct source-error lists are decoded per window (each is one GROUP BY row).
_MAX_ERROR_GROUPS = 2000


class AuditMissing(Exception):
    """The audit table does not exist (no sync has written it yet)."""


def _utc(value: Any) -> datetime | None:
    """A timestamp as an aware UTC datetime (drivers hand back naive UTC, aware, or text)."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return None
    if not isinstance(value, datetime):
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _json(value: Any) -> Any:
    """A JSON column's value: decoded where the driver gives text, else as the driver decoded it."""
    if isinstance(value, bytes | bytearray):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


@dataclass(frozen=True)
class Window:
    """The last ``days`` UTC calendar days, today included."""

    days: int
    now: datetime

    def __post_init__(self) -> None:
        if self.days < 1:
            raise ValueError("a window is at least one day")

    @property
    def since(self) -> datetime:
        today = self.now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        return today - timedelta(days=self.days - 1)

    def boundaries(self) -> list[datetime]:
        """The start of each day of the window, and the end of the last."""
        return [self.since + timedelta(days=i) for i in range(self.days + 1)]

    def labels(self) -> list[str]:
        return [day.date().isoformat() for day in self.boundaries()[:-1]]

    def bucket_of(self, moment: datetime) -> int:
        """The day index of ``moment`` (the same rule as the SQL ``CASE``)."""
        index = int((moment.astimezone(UTC) - self.since) // timedelta(days=1))
        return min(max(index, 0), self.days - 1)


@dataclass(frozen=True)
class RunFilter:
    """Which runs a reader may see: those of ``dag_ids`` (None: every run), and runs with no DAG id
    when ``without_dag``."""

    dag_ids: frozenset[str] | None = None
    without_dag: bool = True

    @classmethod
    def everything(cls) -> RunFilter:
        return cls(None, True)

    def sees_nothing(self) -> bool:
        return self.dag_ids is not None and not self.dag_ids and not self.without_dag


@dataclass(frozen=True)
class AuditTarget:
    """One destination table and the audit table its runs are recorded in (same schema)."""

    table: str
    audit_table: str = "bos_sync_runs"
    schema: str | None = None

    @property
    def recorded_as(self) -> str:
        """The audit row's ``destination_table``: ``schema.table`` or ``table``, as the writer records it."""
        return f"{self.schema}.{self.table}" if self.schema else self.table


@dataclass
class TableHealth:
    """What the page shows of one destination in one window (JSON-able through :meth:`as_json`)."""

    window: Window
    latest: dict[str, Any] | None = None
    latest_by_dag: dict[str, dict[str, Any]] = field(default_factory=dict)
    runs_in_window: int = 0
    recent: list[dict[str, Any]] = field(default_factory=list)
    timeline: list[dict[str, Any]] = field(default_factory=list)
    counts_mode: str = "run"
    counts: list[dict[str, Any]] = field(default_factory=list)
    coverage_mode: str = "run"
    coverage_columns: list[str] = field(default_factory=list)
    coverage: list[dict[str, Any]] = field(default_factory=list)
    sources: list[dict[str, Any]] = field(default_factory=list)
    runs_with_source_errors: int = 0
    rows: dict[str, int | None] | None = None
    rows_error: str | None = None
    missing_columns: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        def stamp(value: Any) -> Any:
            return value.isoformat() if isinstance(value, datetime) else value

        def clean(item: Any) -> Any:
            if isinstance(item, dict):
                return {k: clean(stamp(v)) for k, v in item.items()}
            if isinstance(item, list):
                return [clean(stamp(v)) for v in item]
            return stamp(item)

        return clean({
            "window": {"days": self.window.days, "since": self.window.since, "until": self.window.now},
            "latest": self.latest,
            "latest_by_dag": self.latest_by_dag,
            "runs_in_window": self.runs_in_window,
            "recent": self.recent,
            "timeline": self.timeline,
            "counts": {"mode": self.counts_mode, "series": list(COUNT_SERIES), "points": self.counts},
            "coverage": {"mode": self.coverage_mode, "columns": self.coverage_columns, "points": self.coverage},
            "sources": {"runs_with_source_errors": self.runs_with_source_errors, "failures": self.sources},
            "rows": self.rows,
            "rows_error": self.rows_error,
            "missing_columns": self.missing_columns,
        })


# Notes and errors (notes, error_message) may quote what a run refused: a quoted literal of 8+ characters (which may
# be the start of a record_ref, or a value a driver quotes), a key's value as PostgreSQL words it
# ("Key (email)=(...)"), an email address, a phone-like run of digits. The page shows none of them.
_QUOTED = re.compile(r"'(?:[^'\\\n]|\\.){8,}'|\"(?:[^\"\\\n]|\\.){8,}\"")
_KEY_VALUE = re.compile(r"\)=\((?:[^()]|\([^()]*\))*\)")
_EMAIL = re.compile(r"[^\s@'\"<>()\[\]{},;:]+@[^\s@'\"<>()\[\]{},;:]+")
_DIGITS = re.compile(r"\+?\d[\d ()./-]{6,}\d")
_RUN_ID_OR_TIME = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"
                             r"|\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?")


def scrub_notes(text: str | None) -> str | None:
    """An audit note as the page shows it: quoted literals, key values, email addresses and phone-like
    numbers replaced by placeholders (run ids and timestamps are kept); counts, codes and table names stay."""
    if text is None:
        return None
    kept: list[str] = []

    def keep(match: re.Match[str]) -> str:
        kept.append(match.group(0))
        return f"\x00{len(kept) - 1}\x00"

    text = _RUN_ID_OR_TIME.sub(keep, text)
    text = _QUOTED.sub("[quoted text]", text)
    text = _KEY_VALUE.sub(")=([value])", text)
    text = _EMAIL.sub("[address]", text)
    text = _DIGITS.sub("[number]", text)
    return re.sub(r"\x00(\d+)\x00", lambda m: kept[int(m.group(1))], text)


def _source_failures(rows: Iterable[tuple[Any, int]]) -> tuple[list[dict[str, Any]], int]:
    """Per source: in how many runs it failed, and with which codes (from grouped source_errors)."""
    runs: Counter[tuple[str, str]] = Counter()
    codes: dict[tuple[str, str], Counter[str]] = {}
    with_errors = 0
    for value, count in rows:
        errors = _json(value)
        if not isinstance(errors, list) or not errors:
            continue
        with_errors += count
        seen: set[tuple[str, str]] = set()
        for entry in errors:
            if not isinstance(entry, Mapping):
                continue
            source: Mapping[str, Any] = entry["source"] if isinstance(entry.get("source"), Mapping) else {}
            error: Mapping[str, Any] = entry["error"] if isinstance(entry.get("error"), Mapping) else {}
            key = (str(source.get("source_type") or "?")[:_MAX_SOURCE_LABEL],
                   str(source.get("source_identity") or "?")[:_MAX_SOURCE_LABEL])
            code = str(error.get("code") or "unknown")[:_MAX_CODE]
            codes.setdefault(key, Counter())[code] += count
            if key not in seen:
                seen.add(key)
                runs[key] += count
    failures = [
        {"source_type": key[0], "source_identity": key[1], "runs_failed": runs[key],
         "codes": dict(codes[key].most_common())}
        for key in sorted(runs, key=lambda k: (-runs[k], k))
    ]
    return failures, with_errors


class HealthReader:
    """Reads one destination's health from its database (``engine``), for a :class:`RunFilter`."""

    def __init__(self, engine: sa.Engine, target: AuditTarget) -> None:
        self.engine = engine
        self.dialect = dialect_for(engine)
        self.target = target
        self.schema = validate_schema(target.schema, self.dialect.name)
        self.table_name = validate_identifier(target.table, kind="destination table")
        self.audit = audit_table(
            sa.MetaData(), self.dialect.name, validate_identifier(target.audit_table, kind="audit table"),
            self.schema,
        )
        self._present: set[str] | None = None

    # --- the table as stored ----------------------------------------------------------------------

    def present_columns(self) -> set[str]:
        """The audit columns the stored table has (an early release's table lacks some); raises
        :class:`AuditMissing` when there is no audit table."""
        if self._present is not None:
            return self._present
        t = self.audit
        every = set(t.c.keys())
        try:
            with self.engine.connect() as conn:
                conn.execute(sa.select(*t.c).where(sa.false()).limit(1)).all()
            self._present = every
            return every
        except sa.exc.SQLAlchemyError:
            pass
        try:
            with self.engine.connect() as conn:
                conn.execute(sa.select(t.c.run_id).where(sa.false()).limit(1)).all()
        except sa.exc.SQLAlchemyError as exc:
            raise AuditMissing(self.audit.name) from exc
        present = every - set(_ADDED)
        for column in _ADDED:
            try:
                with self.engine.connect() as conn:
                    conn.execute(sa.select(t.c[column]).where(sa.false()).limit(1)).all()
                present.add(column)
            except sa.exc.SQLAlchemyError:
                continue
        self._present = present
        return present

    def _col(self, name: str) -> sa.ColumnElement[Any]:
        """A column of the audit table, or a NULL of its type where the stored table lacks it."""
        column = self.audit.c[name]
        return column if name in self.present_columns() else sa.null().cast(column.type)

    def _since(self, moment: datetime) -> datetime:
        moment = moment.astimezone(UTC)
        return moment.replace(tzinfo=None) if self.dialect.name == "mysql" else moment  # DATETIME holds naive UTC

    def _runs(self, runs: RunFilter) -> list[sa.ColumnElement[bool]]:
        """The conditions every query shares: this destination's sync runs that ``runs`` lets through."""
        t = self.audit
        conditions: list[sa.ColumnElement[bool]] = [
            t.c.destination_table == self.target.recorded_as,
            sa.or_(t.c.tool_name.is_(None), sa.not_(t.c.tool_name.startswith(MAINTENANCE_TOOL_PREFIX,
                                                                               autoescape=True))),
        ]
        if runs.dag_ids is not None:
            allowed: list[sa.ColumnElement[bool]] = []
            if runs.dag_ids:
                allowed.append(t.c.dag_id.in_(sorted(runs.dag_ids)))
            if runs.without_dag:
                allowed.append(t.c.dag_id.is_(None))
            conditions.append(sa.or_(*allowed) if allowed else sa.false())
        elif not runs.without_dag:
            conditions.append(t.c.dag_id.is_not(None))
        return conditions

    def _bucket(self, window: Window) -> sa.ColumnElement[int]:
        """The run's day in ``window`` (0 = its first day): nested CASEs over the bound day boundaries,
        halving the days at each level (7 comparisons a row for 90 days, not 89)."""
        t = self.audit
        starts = window.boundaries()

        def days(first: int, last: int) -> sa.ColumnElement[int]:
            if first == last:
                return sa.literal(first, sa.Integer)
            middle = (first + last + 1) // 2  # the upper half starts that day
            return sa.case((t.c.finished_at < self._since(starts[middle]), days(first, middle - 1)),
                           else_=days(middle, last))

        return days(0, window.days - 1)

    # --- reads ------------------------------------------------------------------------------------

    def dag_ids(self) -> set[str | None]:
        """Every DAG id this destination's sync runs were recorded with (None: runs outside a DAG)."""
        t = self.audit
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(t.c.dag_id).where(*self._runs(RunFilter.everything())).distinct())
            return {row[0] for row in rows}

    def _run_ref(self, row: sa.Row[Any] | None) -> dict[str, Any] | None:
        if row is None:
            return None
        started, finished = _utc(row.started_at), _utc(row.finished_at)
        return {
            "run_id": row.run_id, "status": row.status, "started_at": started, "finished_at": finished,
            "duration_s": (finished - started).total_seconds() if started and finished else None,
            "dag_id": row.dag_id, "task_id": row.task_id, "airflow_run_id": row.airflow_run_id,
        }

    def _ref_columns(self) -> list[sa.ColumnElement[Any]]:
        t = self.audit
        return [t.c.run_id, t.c.status, t.c.started_at, t.c.finished_at, t.c.dag_id, t.c.task_id, t.c.airflow_run_id]

    def read(self, window: Window, runs: RunFilter, *, writer_dags: Sequence[str] = (), full: bool = True,
             ) -> TableHealth:
        """The health of the destination in ``window`` for a reader who sees ``runs``: the latest runs
        and the timeline, and with ``full`` the counts, coverage, sources, recent runs and row counts."""
        health = TableHealth(window=window)
        self.present_columns()
        health.missing_columns = sorted(set(self.audit.c.keys()) - self.present_columns())
        if not runs.sees_nothing():
            with self.engine.connect() as conn:
                self._read_runs(conn, health, window, runs, writer_dags, full)
        if full:
            health.rows, health.rows_error = self.row_counts()
        return health

    def _read_runs(self, conn: sa.Connection, health: TableHealth, window: Window, runs: RunFilter,
                   writer_dags: Sequence[str], full: bool) -> None:
        t = self.audit
        shared = self._runs(runs)
        newest = (t.c.finished_at.desc(), t.c.run_id.desc())
        health.latest = self._run_ref(conn.execute(
            sa.select(*self._ref_columns()).where(*shared).order_by(*newest).limit(1)).first())
        for dag_id in writer_dags:
            if runs.dag_ids is not None and dag_id not in runs.dag_ids:
                continue
            ref = self._run_ref(conn.execute(
                sa.select(*self._ref_columns()).where(*shared, t.c.dag_id == dag_id).order_by(*newest).limit(1)
            ).first())
            if ref is not None:
                health.latest_by_dag[dag_id] = ref

        in_window = [*shared, t.c.finished_at >= self._since(window.since)]
        bucket = self._bucket(window)
        labels = window.labels()

        # Timeline: runs per day and status.
        days = sa.select(bucket.label("bucket"), t.c.status.label("status")).where(*in_window).subquery()
        per_day: dict[int, Counter[str]] = {}
        for day, status, count in conn.execute(
            sa.select(days.c.bucket, days.c.status, sa.func.count()).group_by(days.c.bucket, days.c.status)
        ):
            per_day.setdefault(int(day), Counter())[str(status)] += int(count)
        health.timeline = [{"day": label, **{s: per_day.get(i, Counter())[s] for s in RUN_STATUSES}}
                           for i, label in enumerate(labels)]
        health.runs_in_window = sum(sum(c.values()) for c in per_day.values())
        if not full:
            return
        health.recent = [ref for ref in (self._run_ref(row) for row in conn.execute(
            sa.select(*self._ref_columns()).where(*in_window).order_by(*newest).limit(RECENT_RUNS))) if ref]

        per_run = health.runs_in_window <= MAX_RUN_POINTS
        self._read_counts(conn, health, in_window, bucket, labels, per_run)
        self._read_coverage(conn, health, in_window, bucket, labels, per_run)

        # Sources: identical source-error lists grouped by the database, decoded once each.
        errors = sa.cast(t.c.source_errors, sa.Text)
        failing = sa.select(errors.label("errors")).where(
            *in_window, t.c.status.in_(("partial", "failed")), t.c.source_errors.is_not(None)).subquery()
        grouped = conn.execute(
            sa.select(failing.c.errors, sa.func.count()).group_by(failing.c.errors).limit(_MAX_ERROR_GROUPS))
        health.sources, health.runs_with_source_errors = _source_failures(
            (value, int(count)) for value, count in grouped)

    def _read_counts(self, conn: sa.Connection, health: TableHealth, in_window: list[sa.ColumnElement[bool]],
                     bucket: sa.ColumnElement[int], labels: list[str], per_run: bool) -> None:
        t = self.audit
        if per_run:
            health.counts_mode = "run"
            rows = conn.execute(
                sa.select(t.c.run_id, t.c.finished_at, t.c.status, t.c.dag_id,
                          *(self._col(c).label(c) for c in COUNT_SERIES))
                .where(*in_window).order_by(t.c.finished_at, t.c.run_id))
            health.counts = [
                {"run_id": r.run_id, "finished_at": _utc(r.finished_at), "status": r.status,
                 "day": labels[health.window.bucket_of(_utc(r.finished_at) or health.window.since)],
                 **{c: _int(getattr(r, c)) for c in COUNT_SERIES}}
                for r in rows
            ]
            return
        health.counts_mode = "day"
        values = sa.select(bucket.label("bucket"),
                           *(sa.func.coalesce(self._col(c), 0).label(c) for c in COUNT_SERIES)).where(*in_window)
        inner = values.subquery()
        sums = {int(row[0]): row for row in conn.execute(
            sa.select(inner.c.bucket, sa.func.count(), *(sa.func.sum(inner.c[c]) for c in COUNT_SERIES))
            .group_by(inner.c.bucket))}
        health.counts = [
            {"day": label, "runs": int(sums[i][1]) if i in sums else 0,
             **{c: (int(sums[i][2 + k] or 0) if i in sums else 0) for k, c in enumerate(COUNT_SERIES)}}
            for i, label in enumerate(labels)
        ]

    def _read_coverage(self, conn: sa.Connection, health: TableHealth, in_window: list[sa.ColumnElement[bool]],
                       bucket: sa.ColumnElement[int], labels: list[str], per_run: bool) -> None:
        if "coverage" not in self.present_columns():
            return
        t = self.audit
        counted = [*in_window, t.c.coverage.is_not(None), t.c.status.in_(("complete", "partial"))]
        query = sa.select(t.c.run_id, t.c.finished_at, t.c.status, t.c.coverage).where(*counted)
        if per_run:
            health.coverage_mode = "run"
        else:  # per day: the day's last run with coverage (one row per day, chosen by the database)
            health.coverage_mode = "day"
            stamps = sa.select(bucket.label("bucket"), t.c.finished_at.label("finished_at")).where(*counted).subquery()
            last = sa.select(sa.func.max(stamps.c.finished_at)).group_by(stamps.c.bucket)
            query = query.where(t.c.finished_at.in_(last))  # IN, not a join: no index on finished_at alone
        points: dict[str, dict[str, Any]] = {}
        columns: dict[str, None] = {}
        for row in conn.execute(query.order_by(t.c.finished_at, t.c.run_id)):
            coverage = _json(row.coverage)
            if not isinstance(coverage, Mapping) or not isinstance(coverage.get("columns"), Mapping):
                continue
            finished = _utc(row.finished_at) or health.window.since
            label = labels[health.window.bucket_of(finished)]
            filled = {str(k)[:64]: _int(v) for k, v in coverage["columns"].items() if isinstance(v, int | float)}
            columns.update(dict.fromkeys(filled))
            key = label if not per_run else str(row.run_id)
            points[key] = {"run_id": row.run_id, "finished_at": finished, "status": row.status, "day": label,
                           "records": _int(coverage.get("records")) if isinstance(coverage.get("records"), int | float)
                           else None, "columns": filled}
        # The writer's order (display_name, email, phone, then the rest); JSONB keeps its own key order.
        health.coverage_columns = sorted(columns, key=lambda c: (_COVERED.index(c) if c in _COVERED else 3, c))
        health.coverage = list(points.values())

    def row_counts(self) -> tuple[dict[str, int | None] | None, str | None]:
        """``COUNT(*)`` of the records table's current, retired and superseded rows (no value is read)."""
        records = sa.table(self.table_name, sa.column("_bos_deleted_at"), sa.column("_bos_superseded_by"),
                           schema=self.schema)
        lifecycle = sa.select(
            sa.func.count(),
            sa.func.sum(sa.case((records.c._bos_deleted_at.is_(None), 1), else_=0)),
            sa.func.sum(sa.case((records.c._bos_superseded_by.is_not(None), 1), else_=0)),
        ).select_from(records)
        try:
            with self.engine.connect() as conn:
                total, current, superseded = conn.execute(lifecycle).one()
            total = int(total or 0)
            return {"total": total, "current": int(current or 0), "retired": total - int(current or 0),
                    "superseded": int(superseded or 0)}, None
        except sa.exc.SQLAlchemyError:
            pass
        try:  # a table made before the lifecycle columns: every row is current
            with self.engine.connect() as conn:
                total = int(conn.execute(sa.select(sa.func.count()).select_from(records)).scalar_one() or 0)
            return {"total": total, "current": total, "retired": None, "superseded": None}, None
        except sa.exc.SQLAlchemyError as exc:
            return None, f"the records table could not be counted ({type(exc).__name__})"

    def run(self, run_id: str, runs: RunFilter) -> dict[str, Any] | None:
        """One run's audit row (counts, coverage, source codes, scrubbed notes), if ``runs`` lets it through."""
        if runs.sees_nothing():
            return None
        t = self.audit
        names = [c.name for c in t.c if c.name not in ("source_summary", "arguments_hash", "scope")]
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(*(self._col(c).label(c) for c in names)).where(*self._runs(runs), t.c.run_id == run_id)
            ).first()
        if row is None:
            return None
        data = dict(row._mapping)
        for column in ("started_at", "finished_at", "confirmed_at"):
            data[column] = _utc(data.get(column))
        started, finished = data["started_at"], data["finished_at"]
        data["duration_s"] = (finished - started).total_seconds() if started and finished else None
        for column in ("result_count", "provisional_records", "provisional_pages", "skipped_stale", "duplicates",
                       *COUNT_SERIES):
            data[column] = _int(data.get(column))
        coverage = _json(data.get("coverage"))
        data["coverage"] = coverage if isinstance(coverage, Mapping) else None
        failures, _ = _source_failures([(data.get("source_errors"), 1)])
        data["source_errors"] = [
            {"source_type": f["source_type"], "source_identity": f["source_identity"], "code": code}
            for f in failures for code in f["codes"]
        ]
        data["error_message"] = scrub_notes(data.get("error_message"))
        data["notes"] = scrub_notes(data.get("notes"))
        return data
