"""A change is a change of content: re-stamped observations rewrite nothing, partial reads revive nothing
merged away, and an older read leaves alone what a newer complete read confirmed.

BOS stamps every provenance ``observed_at`` with the read's time (the contract's own example), and
promises no order of ``sources``: these tests send what the contract allows, not what the reference
server happens to send. Synthetic records through :class:`WarehouseWriter` on every dialect; the
end-to-end runs through the reference server are in tests/airflow/test_content_changes_e2e.py.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import orjson
import sqlalchemy as sa

from airflow_provider_bos.warehouse.run.rehash import _stamped_hash
from airflow_provider_bos.warehouse.tables.records import (
    json_column_values,
    json_document_values,
    record_to_row,
)
from airflow_provider_bos.warehouse.tables.schema import companion_table_name
from airflow_provider_bos.wire import ReconcileOptions, WireRecord, wire_hash
from tests.warehouse.test_reconcile import audit_of, current, person
from tests.warehouse.whhelpers import T1, T2, make_record, reflect, rows_by_ref, run_info, statements, write

FULL_HISTORY = ReconcileOptions(sync_mode="full", history=True)
T3 = "2026-10-10T12:00:00Z"
T4 = "2026-10-11T12:00:00Z"


def restamped(record: dict[str, Any], at: str, *, reverse: bool = False) -> dict[str, Any]:
    """``record`` as a later read of BOS sends it: every provenance entry stamped ``at``."""
    sources = [{**entry, "observed_at": at} for entry in record["sources"]]
    return {**record, "sources": sources[::-1] if reverse else sources}


def history_count(engine: sa.Engine, table: str) -> int:
    t = reflect(engine, companion_table_name(table, "history"))
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one())


def pair(i: int, observed_at: str = T1, **fields: Any) -> dict[str, Any]:
    """A person known to two sources (so that the order of ``sources`` can change)."""
    return person(i, observed_at, keys=[i, 1000 + i], **fields)


# --- the hash ------------------------------------------------------------------------------------


def test_the_content_hash_leaves_out_observation_stamps_and_the_order_of_sources() -> None:
    record = pair(1)
    moved = restamped(record, T3, reverse=True)
    assert record_to_row(moved).record_hash == record_to_row(record).record_hash
    # Everything else in a provenance entry is content: version, capabilities, ids.
    for field, value in (("version", 7), ("capabilities", ["read", "write"]), ("external_id", "x"),
                         ("record_type", "account")):
        changed = json.loads(json.dumps(record))
        changed["sources"][0][field] = value
        assert record_to_row(changed).record_hash != record_to_row(record).record_hash, field
    changed = {**record, "identity_match": {"method": "email", "confidence": 0.91}}
    assert record_to_row(changed).record_hash != record_to_row(record).record_hash
    # An attribute named observed_at is content, not a stamp.
    a = make_record(2, attributes={"badge": {"observed_at": T1}})
    b = make_record(2, attributes={"badge": {"observed_at": T2}})
    assert record_to_row(a).record_hash != record_to_row(b).record_hash


def test_the_content_hash_is_sha256_of_the_documented_canonical_document() -> None:
    record = pair(3, attributes={"z": 1, "a": [1, 2]})
    masked = sorted(
        json.dumps({k: v for k, v in e.items() if k != "observed_at"}, sort_keys=True, separators=(",", ":"),
                   ensure_ascii=False)
        for e in record["sources"]
    )
    content = {k: record[k] for k in ("attributes", "display_name", "email", "identity_match", "lifecycle",
                                      "phone", "record_ref")}
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    document = text[:-1] + ',"sources":[' + ",".join(masked) + "]}"
    assert record_to_row(record).record_hash == hashlib.sha256(document.encode()).hexdigest()


def test_every_encoder_gives_the_same_content_hash() -> None:
    record = WireRecord(restamped(pair(4, name="Zoë 😀"), T2, reverse=True))
    by_row = record_to_row(dict(record)).record_hash
    columns = json_column_values(record, None)
    document = json_document_values(record, None)
    assert columns is not None and document is not None
    assert columns[3] == document[3] == by_row


# --- the table -------------------------------------------------------------------------------------


def test_a_read_that_only_moved_observations_rewrites_nothing_and_adds_no_version(make_writer, engine) -> None:
    writer = make_writer()
    day1 = [pair(i) for i in range(1, 21)]
    first = run_info()
    write(writer, day1, first, reconcile=FULL_HISTORY)
    before = rows_by_ref(engine, writer.table)
    versions = history_count(engine, writer.table)
    counts = write(writer, [restamped(r, T2, reverse=i % 2 == 0) for i, r in enumerate(day1)],
                   reconcile=FULL_HISTORY, observed_at=T2)
    assert (counts.inserted, counts.updated, counts.unchanged) == (0, 0, 20)
    assert rows_by_ref(engine, writer.table) == before  # not one byte rewritten, _bos_synced_at included
    assert history_count(engine, writer.table) == versions
    # A real change among re-stamped neighbours is one update and one version.
    day3 = [restamped(r, T3) for r in day1]
    day3[4] = {**day3[4], "display_name": "Renamed"}
    counts = write(writer, day3, reconcile=FULL_HISTORY, observed_at=T3)
    assert (counts.updated, counts.unchanged) == (1, 19)
    assert history_count(engine, writer.table) == versions + 1
    row = rows_by_ref(engine, writer.table)[day1[4]["record_ref"]]
    assert row["display_name"] == "Renamed" and row["_bos_run_id"] != first.run_id


def test_a_complete_full_read_confirms_its_scope_in_the_audit_row(make_writer, engine) -> None:
    writer = make_writer()
    day1 = [pair(i) for i in range(1, 6)]
    write(writer, day1, reconcile=FULL_HISTORY, observed_at=T1)
    second = run_info()
    write(writer, [restamped(r, T2) for r in day1], second, reconcile=FULL_HISTORY, observed_at=T2)
    audit = audit_of(engine, writer, second)
    assert audit["confirmed_at"] is not None and audit["confirmed_at"].isoformat().startswith("2026-10-09T12:00")
    partial = run_info()
    write(writer, [restamped(r, T3) for r in day1], partial, reconcile=FULL_HISTORY, observed_at=T3,
          status="partial", completeness="partial")
    assert audit_of(engine, writer, partial)["confirmed_at"] is None  # a partial read confirms nothing
    confirmed = writer.last_confirmed()
    assert set(confirmed) == {r["record_ref"] for r in day1}
    assert {at.isoformat()[:16] for at in confirmed.values()} == {"2026-10-09T12:00"}


def test_a_partial_read_revives_nothing_a_complete_read_merged_away(make_writer, engine) -> None:
    writer = make_writer()
    write(writer, [person(i) for i in range(1, 6)], reconcile=FULL_HISTORY, observed_at=T1)
    # Day 2 (complete): 1 and 2 are one person now; 5 left.
    merged = person(0, T2, keys=[1, 2], ref="m:1-2")
    write(writer, [merged, *(person(i, T2) for i in (3, 4))], reconcile=FULL_HISTORY, observed_at=T2)
    assert current(engine, writer.table) == {"m:1-2", *(make_record(i)["record_ref"] for i in (3, 4))}
    # Day 3 (partial): one source is down, so BOS returns the surviving fragments under the old refs;
    # 5 is back (a leaver who returns is a real return, even in a partial read).
    partial = run_info()
    counts = write(writer, [person(1, T3), person(3, T3), person(5, T3)], partial, reconcile=FULL_HISTORY,
                   observed_at=T3, status="partial", completeness="partial")
    assert counts.withheld == 1
    assert current(engine, writer.table) == {"m:1-2", *(make_record(i)["record_ref"] for i in (3, 4, 5))}
    row = rows_by_ref(engine, writer.table)[make_record(1)["record_ref"]]
    assert row["_bos_deleted_at"] is not None and row["_bos_superseded_by"] == "m:1-2"
    audit = audit_of(engine, writer, partial)
    assert audit["withheld"] == 1 and "merged away" in audit["notes"]
    # Once the successor itself is gone, the old ref may come back.
    write(writer, [person(1, T4), person(2, T4), person(3, T4), person(4, T4)], reconcile=FULL_HISTORY,
          observed_at=T4)
    assert make_record(1)["record_ref"] in current(engine, writer.table)


def test_an_older_read_changes_nothing_a_newer_complete_read_confirmed(make_writer, engine) -> None:
    writer = make_writer()
    day1 = [person(i) for i in range(1, 6)]
    write(writer, day1, reconcile=FULL_HISTORY, observed_at=T1)
    # Day 3 (complete, newer): everyone unchanged, re-stamped; nothing rewritten, everything confirmed.
    write(writer, [restamped(r, T3) for r in day1], reconcile=FULL_HISTORY, observed_at=T3)
    before = rows_by_ref(engine, writer.table)
    # A late backfill of day 2 (older than day 3): 1 renamed, 2 and 3 merged, 4 and 5 gone.
    backfill = run_info()
    counts = write(writer, [person(1, T2, name="Old name"), person(0, T2, keys=[2, 3], ref="m:2-3")], backfill,
                   reconcile=FULL_HISTORY, observed_at=T2)
    # The newer read is the authority on its scope: no update, no merged newcomer, nothing retired.
    assert (counts.inserted, counts.updated, counts.retired, counts.superseded) == (0, 0, 0, 0)
    assert counts.skipped_stale == 2
    after = rows_by_ref(engine, writer.table)
    assert {ref: after[ref] for ref in before} == before


def test_a_full_read_takes_into_its_scope_the_unchanged_rows_another_scope_wrote(make_writer, engine) -> None:
    writer = make_writer()
    people = [person(i) for i in range(1, 6)]
    # An incremental read (its own scope) wrote them first; the nightly full read returns them unchanged.
    write(writer, people, run_info(arguments_hash="1" * 64), observed_at=T1)
    write(writer, [restamped(r, T2) for r in people], reconcile=FULL_HISTORY, observed_at=T2)
    versions = history_count(engine, writer.table)
    # The next full read does not return 5: it left, and the full read's scope holds its row.
    counts = write(writer, [restamped(r, T3) for r in people[:4]], reconcile=FULL_HISTORY, observed_at=T3)
    assert counts.retired == 1
    assert current(engine, writer.table) == {r["record_ref"] for r in people[:4]}
    assert history_count(engine, writer.table) == versions  # the one closed version, none added


def test_a_full_read_that_wrote_every_record_it_returned_takes_no_row_into_its_scope(make_writer, engine) -> None:
    """Another scope's rows the read did not return stay that scope's; with nothing returned unchanged
    there is nothing to take (no statement gives any row this run's id after the merge)."""
    writer = make_writer()
    theirs = [person(i) for i in range(1, 4)]
    write(writer, theirs, run_info(arguments_hash="1" * 64), observed_at=T1)
    with statements(engine) as seen:
        counts = write(writer, [person(i) for i in range(4, 7)], reconcile=FULL_HISTORY, observed_at=T2)
    assert (counts.inserted, counts.retired, counts.superseded) == (3, 0, 0)
    taking = re.compile(rf"^\s*UPDATE\s+\S*{re.escape(writer.table)}\s+SET\s+\S*_bos_run_id\b", re.IGNORECASE)
    assert [s for s in seen if taking.search(s)] == []
    before = rows_by_ref(engine, writer.table)
    # The other scope's next full read still retires its own leaver: its rows stayed its own.
    counts = write(writer, [restamped(r, T3) for r in theirs[:2]], run_info(arguments_hash="1" * 64),
                   reconcile=ReconcileOptions(sync_mode="full", max_retire_fraction=None), observed_at=T3)
    assert counts.retired == 1
    assert {ref for ref in before if ref not in current(engine, writer.table)} == {theirs[2]["record_ref"]}


def test_a_table_hashed_with_its_stamps_is_re_hashed_once_and_gains_no_version(make_writer, engine) -> None:
    """A table written before the content hash left out observation stamps: the first run re-hashes
    every row (a one-time rewrite, noted in the audit row), changes no content and adds no version;
    the rows take the read's wire hashes, so the next re-run can skip them undecoded."""
    writer = make_writer()
    day1 = [pair(i) for i in range(1, 11)]
    write(writer, day1, reconcile=FULL_HISTORY, observed_at=T1)
    records = reflect(engine, writer.table)
    with engine.begin() as conn:  # the hashes an earlier release stored: stamps and order included
        for record in day1:
            conn.execute(records.update().where(records.c.record_ref == record["record_ref"])
                         .values(_bos_record_hash=_stamped_hash(record)))
    versions = history_count(engine, writer.table)
    restamp = []
    for record in day1:
        element = orjson.dumps(restamped(record, T2))
        copy = WireRecord(orjson.loads(element))
        copy.wire_hash = wire_hash(element)
        restamp.append(copy)
    upgrade = run_info()
    counts = write(writer, restamp, upgrade, reconcile=FULL_HISTORY, observed_at=T2)
    assert (counts.inserted, counts.updated, counts.unchanged) == (0, 0, 10)
    assert history_count(engine, writer.table) == versions
    assert "Re-hashed 10 rows once" in audit_of(engine, writer, upgrade)["notes"]
    rows = rows_by_ref(engine, writer.table)
    for copy in restamp:
        row = rows[copy["record_ref"]]
        assert row["_bos_record_hash"] == record_to_row(dict(copy)).record_hash
        assert row["_bos_wire_hash"] == copy.wire_hash
    # Once is once: the next run re-hashes nothing and rewrites nothing.
    again = run_info()
    write(writer, [restamped(r, T3) for r in day1], again, reconcile=FULL_HISTORY, observed_at=T3)
    assert "Re-hashed" not in (audit_of(engine, writer, again)["notes"] or "")
    assert rows_by_ref(engine, writer.table) == rows
