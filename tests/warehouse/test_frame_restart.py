"""A final frame restarted by stream resumption: what was loaded from the cut frame never merges.

The records iterator raises ``BosFinalFrameRestarted`` midway (the stream was resumed and the
server sends the final frame again from its start); the writer rolls back to its savepoint,
inside the run's one transaction, and lands exactly the records of the restarted frame. Every
dialect (``warehouse_url``), the direct load of an empty PostgreSQL table and staging alike, with
batches small enough that rows of the cut frame were already sent before the cut.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from whhelpers import dump, make_record, run_info, write

import tests.warehouse.test_provenance_table as provenance
from airflow_provider_bos.exceptions import BosFinalFrameRestarted, BosIncompleteStreamError
from airflow_provider_bos.warehouse import AuditReader
from airflow_provider_bos.wire import WireRecord, WriteOptions

COMPLETE = {"completeness": "complete", "status": "complete", "result_count": None, "source_errors": [],
            "source_summary": [], "provisional_records": 0, "provisional_pages": 0}


def _cut(records: list[dict[str, Any]], then: Iterator[Any]) -> Iterator[Any]:
    """The records of a frame cut after ``records``; iterating ``then`` is the frame sent again."""
    yield from (WireRecord(r) for r in records)
    raise BosFinalFrameRestarted(then)


def names(engine: Any, table: str) -> dict[str, str]:
    with engine.connect() as conn:
        return dict(conn.exec_driver_sql(f"SELECT record_ref, display_name FROM {table}").all())


@pytest.mark.parametrize("seeded", [False, True], ids=["empty-table", "table-with-rows"])
def test_a_restarted_frame_lands_exactly_its_own_records(make_writer, engine, seeded: bool) -> None:
    writer = make_writer(batch_size=100)  # executemany dialects send 30 batches of the cut frame
    if seeded:
        write(writer, [make_record(i, name="seeded") for i in range(0, 4000, 2)])
    # 3000 records of the cut frame (more than one 2048-line COPY block) that the final does not have.
    cut = [make_record(i, name="from the cut frame") for i in range(3000)]
    final = [make_record(i, name="final") for i in range(1000, 3500)]

    counts = writer.write_run(run_info(), _cut(cut, iter(WireRecord(r) for r in final)), WriteOptions(audit=COMPLETE))

    assert names(engine, writer.table) == {
        **({f"bos:person:{i:06d}": "seeded" for i in range(0, 4000, 2)} if seeded else {}),
        **{r["record_ref"]: "final" for r in final},
    }
    seeded_in_final = len(range(1000, 3500, 2)) if seeded else 0
    assert counts.inserted == len(final) - seeded_in_final and counts.updated == seeded_in_final
    assert counts.received == len(final)
    # Every stored row has its entries, and no entry of the cut frame's rows is left.
    assert len(provenance.assert_mirrors(engine, writer.table)) == len(names(engine, writer.table))


def test_a_frame_restarted_twice_lands_the_last_one(make_writer, engine) -> None:
    writer = make_writer(batch_size=50)
    first = [make_record(i, name="first cut") for i in range(700)]
    second = [make_record(i, name="second cut") for i in range(300, 900)]
    final = [make_record(i, name="final") for i in range(500, 600)]
    records = _cut(first, _cut(second, iter(WireRecord(r) for r in final)))

    counts = writer.write_run(run_info(), records, WriteOptions(audit=COMPLETE))

    assert names(engine, writer.table) == {r["record_ref"]: "final" for r in final}
    assert counts.inserted == 100


def test_a_failure_after_a_restart_still_leaves_everything_untouched(make_writer, engine) -> None:
    writer = make_writer(batch_size=100)
    write(writer, [make_record(i, name="before") for i in range(10)])
    before, entries = dump(engine, writer.table), provenance.stored_entries(engine, writer.table)

    def broken_again() -> Iterator[Any]:
        yield from (WireRecord(make_record(i, name="restarted")) for i in range(500))
        raise BosIncompleteStreamError("the resumed stream ended inside the final response too")

    with pytest.raises(BosIncompleteStreamError):
        writer.write_run(run_info(), _cut([make_record(i, name="cut") for i in range(500)], broken_again()),
                         WriteOptions(audit=COMPLETE))
    assert dump(engine, writer.table) == before
    assert provenance.stored_entries(engine, writer.table) == entries


def test_records_quarantined_from_the_cut_frame_are_forgotten(make_writer, engine) -> None:
    writer = make_writer(batch_size=100)
    unstorable = make_record("bos:person:" + "x" * 600)  # longer than a record_ref may be
    final = [make_record(i, name="final") for i in range(50)]
    run = run_info()

    counts = writer.write_run(run, _cut([make_record(1), unstorable], iter(WireRecord(r) for r in final)),
                              WriteOptions(audit=COMPLETE, invalid_records="quarantine"))

    assert counts.rejected == 0 and counts.inserted == 50
    assert AuditReader(engine, table=writer.audit_table).get_run(run.run_id)["status"] == "complete"
    assert names(engine, writer.table) == {r["record_ref"]: "final" for r in final}
