"""history=True: every version of every record in <table>_history (SCD2), and erasure of a person."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from airflow_provider_bos.exceptions import BosConfigurationError
from airflow_provider_bos.warehouse import AuditReader
from airflow_provider_bos.warehouse.tables.schema import companion_table_name
from airflow_provider_bos.warehouse.upkeep.erase import ERASE_TOOL_NAME, erase_records
from airflow_provider_bos.wire import ReconcileOptions
from tests.warehouse.test_reconcile import current, day1, day2, person
from tests.warehouse.whhelpers import T2, make_record, reflect, rows_by_ref, run_info, write

HISTORY = ReconcileOptions(sync_mode="full", history=True)


def versions(engine: sa.Engine, table: str) -> list[dict[str, Any]]:
    t = reflect(engine, companion_table_name(table, "history"))
    with engine.connect() as conn:
        rows = conn.execute(sa.select(t).order_by(t.c.record_ref, t.c._bos_valid_from)).all()
    return [dict(r._mapping) for r in rows]


def test_history_keeps_a_version_per_change_and_closes_retired_rows(make_writer, engine) -> None:
    writer = make_writer()
    first = run_info()
    write(writer, day1(), first, reconcile=HISTORY)
    assert len(versions(engine, writer.table)) == 10
    assert all(v["_bos_valid_to"] is None and v["_bos_run_id"] == first.run_id for v in versions(engine, writer.table))
    write(writer, day1(), reconcile=HISTORY)  # unchanged: no version added
    assert len(versions(engine, writer.table)) == 10
    second = run_info()
    write(writer, day2(), second, reconcile=HISTORY)
    by_ref: dict[str, list[dict[str, Any]]] = {}
    for v in versions(engine, writer.table):
        by_ref.setdefault(v["record_ref"], []).append(v)
    renamed = by_ref[make_record(3)["record_ref"]]
    assert [v["display_name"] for v in renamed] == ["Person 3", "Renamed"]
    assert renamed[0]["_bos_valid_to"] == renamed[1]["_bos_valid_from"] and renamed[1]["_bos_valid_to"] is None
    for gone in (1, 2, 10):  # merged away or left: the version is closed, none is open
        assert [v["_bos_valid_to"] is None for v in by_ref[make_record(gone)["record_ref"]]] == [False]
    assert [v["_bos_run_id"] for v in by_ref["m:1-2"]] == [second.run_id]
    # The current versions are exactly the current rows.
    assert {r for r, vs in by_ref.items() if vs[-1]["_bos_valid_to"] is None} == current(engine, writer.table)


def test_history_turned_on_later_starts_from_the_rows_there(make_writer, engine) -> None:
    writer = make_writer()
    write(writer, day1())
    write(writer, [person(i, T2, name="Renamed" if i == 3 else None) if i == 3 else person(i) for i in range(1, 11)],
          reconcile=HISTORY)
    rows = versions(engine, writer.table)
    assert len(rows) == 11  # a first version of each row, and the change of 3
    assert sum(v["_bos_valid_to"] is None for v in rows) == 10


def test_erase_removes_a_person_everywhere_and_audits_without_the_ref(make_writer, engine) -> None:
    writer = make_writer()
    write(writer, day1(), reconcile=HISTORY)
    write(writer, day2(), reconcile=HISTORY)
    ref = make_record(1)["record_ref"]
    erased = erase_records(engine, table=writer.table, audit_table=writer.audit_table, record_refs=[ref, "m:1-2"],
                           conn_id="warehouse")
    # 2 was merged into m:1-2 too (the same person's earlier record): it goes with it.
    two = make_record(2)["record_ref"]
    assert (erased.merged, erased.records, erased.lineage) == (1, 3, 2)  # 1 -> m:1-2, 2 -> m:1-2
    assert erased.history == 3  # 1's and 2's closed versions and m:1-2's open one
    rows = rows_by_ref(engine, writer.table)
    assert not {ref, two, "m:1-2"} & set(rows) and make_record(3)["record_ref"] in rows
    assert all(v["record_ref"] not in (ref, two, "m:1-2") for v in versions(engine, writer.table))
    audit = AuditReader(engine, table=writer.audit_table).get_run(erased.run_id)
    assert (audit["status"], audit["tool_name"], audit["conn_id"]) == ("complete", ERASE_TOOL_NAME, "warehouse")
    assert ref not in str(audit) and "m:1-2" not in str(audit) and "deleted 3 row(s)" in audit["notes"]


def test_erase_refuses_nothing_to_erase(make_writer, engine) -> None:
    writer = make_writer()
    write(writer, day1())
    for refs in ([], [""]):
        with pytest.raises(BosConfigurationError, match="at least one record_ref"):
            erase_records(engine, table=writer.table, audit_table=writer.audit_table, record_refs=refs)
    with pytest.raises(BosConfigurationError, match="no table"):
        erase_records(engine, table=f"{writer.table}_x", audit_table=writer.audit_table, record_refs=["a"])
