"""Known records: rows stored with a wire hash, and the next run's undecoded KnownRecord claims.

Every dialect (``warehouse_url``), PostgreSQL both with COPY (document staging) and executemany.
A claim is counted unchanged only once SQL has matched it to the stored row's wire hash; a claim
that does not match fails the run with nothing written (the record's content was never decoded).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from whhelpers import T0, T1, T2, dump, make_record, rows_by_ref, write

from airflow_provider_bos.exceptions import BosWarehouseError
from airflow_provider_bos.warehouse import UpsertCounts, WarehouseWriter
from airflow_provider_bos.wire import KnownRecord, WireRecord


def wire(record: dict[str, Any]) -> WireRecord:
    """The record as the scanner hands it out: decoded, with the hash of its wire bytes."""
    out = WireRecord(record)
    out.wire_hash = hashlib.sha256(json.dumps(record, separators=(",", ":")).encode()).hexdigest()
    return out


def claim(record: WireRecord) -> KnownRecord:
    return KnownRecord(record["record_ref"], record.wire_hash)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres),
                        pytest.param("postgres-executemany", marks=pytest.mark.postgres),
                        pytest.param("mysql", marks=pytest.mark.mysql)])
def destination(request: pytest.FixtureRequest) -> tuple[str, bool]:
    """(URL, use_copy): every dialect, and PostgreSQL's two staging paths."""
    name, _, path = request.param.partition("-")
    return request.getfixturevalue(f"{name}_url"), path != "executemany"


@pytest.fixture()
def warehouse_url(destination: tuple[str, bool]) -> str:
    return destination[0]


@pytest.fixture()
def writer(make_writer: Callable[..., WarehouseWriter], destination: tuple[str, bool]) -> WarehouseWriter:
    return make_writer(use_copy=destination[1])


def audit_statuses(engine: sa.Engine, writer: WarehouseWriter) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(sa.text(f"SELECT status FROM {writer.audit_table} ORDER BY finished_at")).scalars())


def test_written_rows_keep_their_wire_hash_and_the_next_run_knows_them(writer, engine) -> None:
    records = [wire(make_record(i)) for i in range(5)]
    assert len(writer.known_wire_hashes()) == 0  # an empty (new) table
    write(writer, records)
    stored = {ref: row["_bos_wire_hash"] for ref, row in rows_by_ref(engine, writer.table).items()}
    assert stored == {r["record_ref"]: r.wire_hash for r in records}
    known = writer.known_wire_hashes()
    assert len(known) == 5 and all(r.wire_hash in known for r in records)


def test_claims_that_match_count_unchanged_and_write_nothing(writer, engine) -> None:
    records = [wire(make_record(i)) for i in range(5)]
    write(writer, records)
    before = dump(engine, writer.table)

    counts = write(writer, [claim(r) for r in records])

    assert counts == UpsertCounts(inserted=0, updated=0, unchanged=5, skipped_stale=0, duplicates=0)
    assert dump(engine, writer.table) == before  # not even _bos_synced_at / _bos_run_id moved
    assert audit_statuses(engine, writer) == ["complete", "complete"]


def test_claims_and_decoded_records_mix(writer, engine) -> None:
    records = [wire(make_record(i)) for i in range(5)]
    write(writer, records)
    changed = [wire(make_record(i, T2, name=f"Renamed {i}")) for i in (3, 4)]

    counts = write(writer, [claim(r) for r in records[:3]] + changed)

    assert counts == UpsertCounts(inserted=0, updated=2, unchanged=3, skipped_stale=0, duplicates=0)
    rows = rows_by_ref(engine, writer.table)
    assert [rows[r["record_ref"]]["display_name"] for r in changed] == ["Renamed 3", "Renamed 4"]
    assert {ref: row["_bos_wire_hash"] for ref, row in rows.items()} == {
        r["record_ref"]: r.wire_hash for r in records[:3] + changed
    }


@pytest.mark.parametrize("bad", ["changed under us", "deleted under us", "never stored"])
def test_a_claim_the_table_does_not_confirm_fails_the_run_and_writes_nothing(writer, engine, bad: str) -> None:
    records = [wire(make_record(i)) for i in range(3)]
    write(writer, records)
    target = records[1]["record_ref"]
    with engine.begin() as conn:  # another writer, between our read of the hashes and our write
        if bad == "changed under us":
            conn.execute(sa.text(f"UPDATE {writer.table} SET _bos_wire_hash = :h WHERE record_ref = :r"),
                         {"h": "f" * 64, "r": target})
        elif bad == "deleted under us":
            conn.execute(sa.text(f"DELETE FROM {writer.table} WHERE record_ref = :r"), {"r": target})
    before = dump(engine, writer.table)
    claims = [claim(r) for r in records]
    if bad == "never stored":
        claims[1] = KnownRecord("bos:person:nobody", records[1].wire_hash)
    fresh = wire(make_record(9))

    with pytest.raises(BosWarehouseError, match="another writer changed or deleted") as info:
        write(writer, [*claims, fresh])

    assert "1 records" in str(info.value)
    assert dump(engine, writer.table) == before  # the new record 9 did not land either
    assert audit_statuses(engine, writer) == ["complete"]


@pytest.mark.parametrize(
    ("other_observed", "other_after_claim", "expect_updated"),
    [
        (T2, False, True),  # newer content wins, wherever it comes
        (T0, True, False),  # older content loses to the stored (claimed) one
        (T1, True, True),  # same observed_at: the last occurrence wins ...
        (T1, False, False),  # ... which here is the claim
    ],
)
def test_a_claim_and_a_decoded_duplicate_pick_the_same_winner_as_two_decoded_copies(
    writer, engine, other_observed: str, other_after_claim: bool, expect_updated: bool
) -> None:
    stored = wire(make_record(1, T1))
    write(writer, [stored])
    other = wire(make_record(1, other_observed, name="Other"))
    batch = [claim(stored), other] if other_after_claim else [other, claim(stored)]

    counts = write(writer, batch)

    assert counts.duplicates == 1
    assert (counts.updated, counts.unchanged) == ((1, 0) if expect_updated else (0, 1))
    name = rows_by_ref(engine, writer.table)[stored["record_ref"]]["display_name"]
    assert name == ("Other" if expect_updated else "Person 1")


def test_a_table_without_the_wire_hash_column_syncs_as_before(make_writer, engine) -> None:
    first = make_writer()
    first.ensure_tables()
    with engine.begin() as conn:
        conn.exec_driver_sql(f"ALTER TABLE {first.table} DROP COLUMN _bos_wire_hash")
    writer = make_writer()  # a writer that meets the older table

    records = [wire(make_record(i)) for i in range(3)]
    assert write(writer, records).inserted == 3
    assert write(writer, records).unchanged == 3
    assert len(writer.known_wire_hashes()) == 0  # nothing to know: re-runs decode every record
    assert "_bos_wire_hash" not in rows_by_ref(engine, writer.table)[records[0]["record_ref"]]
    with pytest.raises(BosWarehouseError, match="another writer"):  # a claim cannot be verified
        write(writer, [claim(records[0])])
