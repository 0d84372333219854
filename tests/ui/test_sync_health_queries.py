"""The sync-health page's aggregation SQL, against audit rows the real WarehouseWriter wrote.

One destination synced over four days (a partial day whose source timed out and whose ``email``
went empty, a failed run, a full read that retired rows), a second destination and a maintenance
row in the same audit table (never counted), on every dialect (SQLite and DuckDB here, PostgreSQL and
MariaDB when their servers run). Each chart's data points are checked against what the runs did.
The writer stamps a run with the time it ran; the test moves each run's ``started_at`` and
``finished_at`` to its day afterwards (the only write the test makes to the audit table).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from airflow_provider_bos.plugins import health_queries
from airflow_provider_bos.plugins.health_queries import (
    AuditMissing,
    AuditTarget,
    HealthReader,
    RunFilter,
    Window,
    scrub_notes,
)
from airflow_provider_bos.warehouse import WarehouseWriter, audit_table, dialect_for
from airflow_provider_bos.wire import ReconcileOptions
from tests.warehouse.whhelpers import make_record, run_info, write

NOW = datetime.now(UTC).replace(microsecond=0)
TODAY = NOW.replace(hour=0, minute=0, second=0)
TIMEOUT = [{"source": {"source_type": "hr", "source_identity": "hr-main"}, "error": {"code": "source_timeout"}}]
FULL = ReconcileOptions(sync_mode="full", max_retire_fraction=None)


def people(refs: range, *, email: bool = True) -> list[dict[str, Any]]:
    return [make_record(i, email=f"p{i}@example.com" if email else None) for i in refs]


def at(days_ago: int, hour: int) -> datetime:
    """``hour`` o'clock UTC, ``days_ago`` days before today (today: never later than now)."""
    moment = TODAY - timedelta(days=days_ago) + timedelta(hours=hour)
    return max(TODAY, min(moment, NOW - timedelta(seconds=1))) if days_ago == 0 else moment


def move(engine: sa.Engine, audit: str, run_id: str, finished: datetime, took: timedelta) -> None:
    """Put a run on its day: its started_at and finished_at (bound through the columns' types)."""
    t = audit_table(sa.MetaData(), dialect_for(engine).name, audit)

    def bound(moment: datetime) -> datetime:
        return moment.replace(tzinfo=None) if engine.dialect.name == "mysql" else moment

    with engine.begin() as conn:
        conn.execute(t.update().where(t.c.run_id == run_id).values(started_at=bound(finished - took),
                                                                   finished_at=bound(finished)))


@pytest.fixture()
def engine(warehouse_url: str) -> Iterator[sa.Engine]:
    eng = sa.create_engine(warehouse_url)
    try:
        yield eng
    finally:
        eng.dispose()


@pytest.fixture()
def synced(engine: sa.Engine, unique_table: str) -> Iterator[dict[str, Any]]:
    """Four days of runs of ``<table>`` (dag_a) and one of ``<table>_b`` (dag_b), audited in ``<table>_runs``."""
    audit = f"{unique_table}_runs"
    writer = WarehouseWriter(engine, table=unique_table, audit_table=audit)
    other = WarehouseWriter(engine, table=f"{unique_table}_b", audit_table=audit)
    runs: list[dict[str, Any]] = []

    def run(when: datetime, took_s: int, records: list[dict[str, Any]] | None = None, *, dag: str = "dag_a",
            into: WarehouseWriter = writer, failed: str | None = None, **audit_fields: Any) -> None:
        info = run_info(dag_id=dag, task_id="sync", airflow_run_id=f"scheduled__{when.isoformat()}")
        if failed is not None:
            into.record_failure(info, error=failed)
            counts = None
        else:
            counts = write(into, records or [], info, **audit_fields)
        move(engine, audit, info.run_id, when, timedelta(seconds=took_s))
        runs.append({"run_id": info.run_id, "finished_at": when, "dag": dag, "counts": counts,
                     "table": into.table, "status": "failed" if failed else audit_fields.get("status", "complete")})

    run(at(3, 6), 40, people(range(10)))                                  # 10 inserted
    run(at(2, 6), 30, people(range(12)))                                  # 2 inserted, 10 unchanged
    run(at(2, 7), 5, people(range(8)), reconcile=FULL)                    # full read: 4 retired
    run(at(1, 6), 20, people(range(8), email=False), status="partial",    # a partial day, email gone
        completeness="partial", source_errors=TIMEOUT,
        error_message="hr-main timed out; record 'bos:person:000003' ann@example.com +49 30 1234567 was late",
        notes="Re-hashed 8 rows once; 'bos:person:000005' bob@example.org kept.")
    run(at(1, 9), 3, failed="the final result never arrived (stream dropped)")
    run(at(0, 6), 25, people(range(8), email=False), dag="dag_b")         # today, by another DAG
    run(at(1, 8), 9, people(range(3)), into=other)                        # another destination, same audit table
    t = audit_table(sa.MetaData(), dialect_for(engine).name, audit)
    with engine.begin() as conn:  # a maintenance row (an erasure): not a sync run
        stamp = at(0, 5).replace(tzinfo=None) if engine.dialect.name == "mysql" else at(0, 5)
        conn.execute(t.insert().values(run_id="erase-1", tool_name="airflow-provider-bos erase", status="complete",
                                       finished_at=stamp, destination_table=unique_table))
    yield {"audit": audit, "table": unique_table, "runs": runs, "engine": engine}
    with engine.begin() as conn:
        for name in (unique_table, f"{unique_table}_b", audit, f"{unique_table}_sources", f"{unique_table}_b_sources"):
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {name}")


def reader(synced: dict[str, Any], table: str | None = None) -> HealthReader:
    return HealthReader(synced["engine"], AuditTarget(table or synced["table"], synced["audit"]))


def mine(synced: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in synced["runs"] if r["table"] == synced["table"]]


def test_the_timeline_counts_runs_per_day_and_status(synced) -> None:
    health = reader(synced).read(Window(7, NOW), RunFilter.everything())
    days = {d["day"]: (d["complete"], d["partial"], d["failed"]) for d in health.timeline}
    assert list(days) == [(TODAY - timedelta(days=6 - i)).date().isoformat() for i in range(7)]
    expected = dict.fromkeys(days, (0, 0, 0))
    for r in mine(synced):
        day = r["finished_at"].date().isoformat()
        c, p, f = expected[day]
        expected[day] = (c + (r["status"] == "complete"), p + (r["status"] == "partial"), f + (r["status"] == "failed"))
    assert days == expected
    assert days[at(1, 6).date().isoformat()] == (0, 1, 1)  # the partial day, and its failed run
    assert health.runs_in_window == len(mine(synced)) == 6  # not the other table's run, not the erasure


def test_counts_per_run_are_the_writers_counts(synced) -> None:
    health = reader(synced).read(Window(7, NOW), RunFilter.everything())
    assert health.counts_mode == "run"
    by_run = {p["run_id"]: p for p in health.counts}
    assert list(by_run) == [r["run_id"] for r in sorted(mine(synced), key=lambda r: r["finished_at"])]
    for r in mine(synced):
        point = by_run[r["run_id"]]
        assert point["status"] == r["status"] and point["finished_at"] == r["finished_at"]
        if r["counts"] is None:  # the failed run wrote nothing and counted nothing
            assert all(point[c] is None for c in ("inserted", "updated", "unchanged", "retired"))
            continue
        for series in ("inserted", "updated", "unchanged", "retired", "superseded", "withheld", "rejected"):
            assert point[series] == getattr(r["counts"], series), series
    first, second, full = (by_run[r["run_id"]] for r in mine(synced)[:3])
    assert (first["inserted"], second["inserted"], second["unchanged"], full["retired"]) == (10, 2, 10, 4)


def test_coverage_per_run_shows_the_field_going_empty(synced) -> None:
    health = reader(synced).read(Window(7, NOW), RunFilter.everything())
    assert health.coverage_mode == "run"
    assert health.coverage_columns == ["display_name", "email", "phone"]
    points = [(p["status"], p["records"], p["columns"]["email"]) for p in health.coverage]
    # The failed run records no coverage; the partial day's and today's runs have no email at all.
    assert points == [("complete", 10, 10), ("complete", 12, 12), ("complete", 8, 8), ("partial", 8, 0),
                      ("complete", 8, 0)]


def test_sources_say_which_failed_and_with_which_code(synced) -> None:
    health = reader(synced).read(Window(7, NOW), RunFilter.everything())
    assert health.sources == [{"source_type": "hr", "source_identity": "hr-main", "runs_failed": 1,
                               "codes": {"source_timeout": 1}}]
    assert health.runs_with_source_errors == 1


def test_latest_run_rows_and_recent_runs(synced) -> None:
    health = reader(synced).read(Window(7, NOW), RunFilter.everything(), writer_dags=["dag_a", "dag_b"])
    newest = max(mine(synced), key=lambda r: r["finished_at"])
    assert health.latest is not None and health.latest["run_id"] == newest["run_id"]
    assert health.latest["dag_id"] == "dag_b" and health.latest["duration_s"] == 25
    assert health.latest["airflow_run_id"].startswith("scheduled__")
    assert health.latest_by_dag["dag_a"]["status"] == "failed"
    assert [r["run_id"] for r in health.recent] == [r["run_id"] for r in sorted(
        mine(synced), key=lambda r: r["finished_at"], reverse=True)]
    assert health.rows == {"total": 12, "current": 8, "retired": 4, "superseded": 0}


def test_a_window_of_many_runs_is_charted_per_day_in_sql(synced, monkeypatch) -> None:
    monkeypatch.setattr(health_queries, "MAX_RUN_POINTS", 3)
    health = reader(synced).read(Window(7, NOW), RunFilter.everything())
    assert health.counts_mode == health.coverage_mode == "day"
    by_day = {p["day"]: p for p in health.counts}
    assert len(by_day) == 7
    for day, point in by_day.items():
        runs = [r for r in mine(synced) if r["finished_at"].date().isoformat() == day]
        assert point["runs"] == len(runs)
        for series in ("inserted", "updated", "unchanged", "retired", "superseded", "withheld", "rejected"):
            # A failed run's counts are null: they add nothing.
            assert point[series] == sum(getattr(r["counts"], series) for r in runs if r["counts"]), (day, series)
    two_days_ago = by_day[at(2, 6).date().isoformat()]
    assert (two_days_ago["inserted"], two_days_ago["unchanged"], two_days_ago["retired"]) == (2, 18, 4)
    assert by_day[at(1, 6).date().isoformat()]["runs"] == 2
    coverage = {p["day"]: (p["records"], p["columns"]["email"]) for p in health.coverage}
    # Per day: the day's last run with coverage.
    assert coverage == {at(3, 6).date().isoformat(): (10, 10), at(2, 7).date().isoformat(): (8, 8),
                        at(1, 6).date().isoformat(): (8, 0), at(0, 6).date().isoformat(): (8, 0)}


def test_the_window_bounds_every_aggregate(synced) -> None:
    health = reader(synced).read(Window(2, NOW), RunFilter.everything())  # yesterday and today
    assert health.runs_in_window == 3
    assert [p["status"] for p in health.counts] == ["partial", "failed", "complete"]
    assert health.latest is not None  # the latest run is the latest, whatever the window


def test_a_reader_sees_only_the_dags_it_may(synced) -> None:
    only_a = reader(synced).read(Window(7, NOW), RunFilter(frozenset({"dag_a"}), without_dag=False))
    assert only_a.runs_in_window == 5 and only_a.latest is not None and only_a.latest["dag_id"] == "dag_a"
    nothing = reader(synced).read(Window(7, NOW), RunFilter(frozenset(), without_dag=False))
    assert nothing.runs_in_window == 0 and nothing.latest is None and nothing.timeline == []
    assert reader(synced).dag_ids() == {"dag_a", "dag_b"}
    run_b = next(r for r in mine(synced) if r["dag"] == "dag_b")["run_id"]
    assert reader(synced).run(run_b, RunFilter(frozenset({"dag_a"}), without_dag=False)) is None
    assert reader(synced).run(run_b, RunFilter.everything())["dag_id"] == "dag_b"


def test_one_run_in_detail_carries_codes_and_scrubbed_notes(synced) -> None:
    partial = next(r for r in mine(synced) if r["status"] == "partial")
    run = reader(synced).run(partial["run_id"], RunFilter.everything())
    assert run is not None
    assert run["source_errors"] == [{"source_type": "hr", "source_identity": "hr-main", "code": "source_timeout"}]
    assert run["coverage"] == {"records": 8, "columns": {"display_name": 8, "email": 0, "phone": 0}}
    assert run["updated"] == 8 and run["duration_s"] == 20
    notes = run["error_message"]
    assert notes.startswith("hr-main timed out; record [quoted text] [address] [number] was late")
    assert "example.com" not in json.dumps(run, default=str) and "bos:person" not in notes
    # The run's information notes, apart from its error, scrubbed alike.
    assert run["notes"] == "Re-hashed 8 rows once; [quoted text] [address] kept."
    assert "example.org" not in json.dumps(run, default=str)


def test_the_other_destination_is_its_own(synced) -> None:
    health = reader(synced, f"{synced['table']}_b").read(Window(7, NOW), RunFilter.everything())
    assert health.runs_in_window == 1 and health.rows == {"total": 3, "current": 3, "retired": 0, "superseded": 0}


def test_no_audit_table_is_reported_as_such(engine, unique_table) -> None:
    with pytest.raises(AuditMissing):
        HealthReader(engine, AuditTarget(unique_table, f"{unique_table}_nothing")).read(
            Window(7, NOW), RunFilter.everything())


def test_notes_keep_run_ids_times_and_counts() -> None:
    text = ("Run 0b6f1d2e-8f5c-4c3e-9a51-3b1e2f7d9c10 at 2026-12-01T06:00:00+00:00: 3 record(s) quarantined "
            "in t_rejects: reasons <record_ref> too long; '" + "x" * 20 + "' from jo@example.org, +1 (555) 010-9999")
    assert scrub_notes(text) == (
        "Run 0b6f1d2e-8f5c-4c3e-9a51-3b1e2f7d9c10 at 2026-12-01T06:00:00+00:00: 3 record(s) quarantined in "
        "t_rejects: reasons <record_ref> too long; [quoted text] from [address], [number]")
