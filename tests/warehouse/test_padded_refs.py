"""Refs, and a source's ids, that differ only in trailing spaces are two people, on every destination.

MySQL/MariaDB compare text under a ``PAD SPACE`` collation, where ``"r:7 "`` equals ``"r:7"``: there a
ref ending in a space would be stored as another person's key (its upsert rewrote that person's row),
so such a record is refused like any record the table cannot store, and an erasure of one ref never
reaches the other's rows or quarantined records. Supersession compares provenance entries exactly:
a source's id ``"4711 "`` is not its id ``"4711"``.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from whhelpers import T2, make_record, rows_by_ref, write

from airflow_provider_bos.exceptions import BosWarehouseError
from airflow_provider_bos.warehouse import WarehouseWriter
from airflow_provider_bos.warehouse.tables.schema import companion_table_name
from airflow_provider_bos.warehouse.upkeep.erase import erase_records
from airflow_provider_bos.wire import ReconcileOptions

ALICE, BOB = "r:7", "r:7 "


def pads_keys(writer: WarehouseWriter) -> bool:
    return writer.dialect.capabilities.keys_ignore_trailing_spaces


def quarantined(engine: sa.Engine, table: str) -> list[str]:
    rejects = companion_table_name(table, "rejects")
    if not sa.inspect(engine).has_table(rejects):
        return []
    with engine.connect() as conn:
        return sorted(conn.execute(sa.text(f"SELECT record_ref FROM {rejects}")).scalars())


def names(engine: sa.Engine, table: str) -> dict[str, str]:
    return {ref: row["display_name"] for ref, row in rows_by_ref(engine, table).items()}


def test_a_ref_with_a_trailing_space_never_rewrites_another_persons_row(engine, writer) -> None:
    write(writer, [make_record(ALICE, name="Alice")])
    counts = write(writer, [make_record(ALICE, name="Alice"), make_record(BOB, name="Bob")],
                   invalid_records="quarantine")
    if pads_keys(writer):
        assert (counts.unchanged, counts.rejected) == (1, 1)
        assert names(engine, writer.table) == {ALICE: "Alice"}
        assert quarantined(engine, writer.table) == [BOB]
    else:
        assert (counts.unchanged, counts.inserted, counts.rejected) == (1, 1, 0)
        assert names(engine, writer.table) == {ALICE: "Alice", BOB: "Bob"}


def test_without_quarantine_the_run_fails_saying_why_and_writes_nothing(engine, writer) -> None:
    if not pads_keys(writer):
        pytest.skip("only MySQL/MariaDB compare keys ignoring trailing spaces")
    write(writer, [make_record(ALICE, name="Alice")])
    with pytest.raises(BosWarehouseError, match="ends in a space") as raised:
        write(writer, [make_record(BOB, name="Bob")])
    assert "PAD SPACE" in str(raised.value)
    assert names(engine, writer.table) == {ALICE: "Alice"}


@pytest.mark.parametrize("erased", [ALICE, BOB])
def test_erasing_one_of_the_two_keeps_the_other(engine, writer, erased: str) -> None:
    write(writer, [make_record(ALICE, name="Alice"), make_record(BOB, name="Bob")], invalid_records="quarantine")
    kept = BOB if erased == ALICE else ALICE
    erase_records(engine, table=writer.table, audit_table=writer.audit_table, record_refs=[erased])
    held = set(names(engine, writer.table)) | set(quarantined(engine, writer.table))
    assert held == {kept}


def holding(ref: str, external_id: str, observed_at: str = "2026-10-08T12:00:00Z") -> dict:
    """A record whose one provenance entry is (crm, crm-eu, ``external_id``)."""
    record = make_record(ref, observed_at)
    record["sources"][0]["external_id"] = external_id
    return record


def test_an_id_that_differs_only_in_trailing_spaces_is_another_entry(engine, writer) -> None:
    """A leaver is retired, not merged into a newcomer whose entry has the same id but for a space:
    a merge would tie two people together (an erasure of the one would erase the other)."""
    full = ReconcileOptions(sync_mode="full")
    write(writer, [holding("p:leaver", "4711"), make_record(1)], reconcile=full)
    counts = write(writer, [holding("p:newcomer", "4711 ", T2), make_record(1, T2)], reconcile=full)
    assert (counts.inserted, counts.retired, counts.superseded) == (1, 1, 0)
    leaver = rows_by_ref(engine, writer.table)["p:leaver"]
    assert leaver["_bos_deleted_at"] is not None and leaver["_bos_superseded_by"] is None


@pytest.mark.parametrize("other", ["p:a-other", "p:z-other"])
def test_a_merge_beside_an_id_that_differs_only_in_trailing_spaces_is_still_a_merge(engine, writer, other) -> None:
    """The person holding ``4711 `` is merged into a newcomer holding the same ``4711 ``, while another
    person holds ``4711``: the merge is found whichever spelling the entry index meets first (the
    index orders equal entries by ref, so the other person's ref sorts first, then last)."""
    full = ReconcileOptions(sync_mode="full")
    write(writer, [holding("p:m-merged", "4711 "), holding(other, "4711")], reconcile=full)
    counts = write(writer, [holding(other, "4711", T2), holding("p:s-successor", "4711 ", T2)], reconcile=full)
    assert (counts.inserted, counts.superseded) == (1, 1)
    rows = rows_by_ref(engine, writer.table)
    assert rows["p:m-merged"]["_bos_superseded_by"] == "p:s-successor"
    assert rows[other]["_bos_deleted_at"] is None


def test_rows_an_earlier_release_stored_under_a_padded_ref_are_erased_exactly(engine, writer) -> None:
    """Before refs ending in a space were refused, one was stored under its own key when no row held
    the key without it. Erasing it deletes its row; erasing the plain ref keeps it and its merged rows."""
    if not pads_keys(writer):
        pytest.skip("only MySQL/MariaDB compare keys ignoring trailing spaces")
    write(writer, [make_record("r:padded"), make_record(ALICE, name="Alice"), make_record("r:merged")])
    with engine.begin() as conn:  # as an earlier release could store them
        conn.exec_driver_sql(f"UPDATE {writer.table} SET record_ref = 'r:8 ' WHERE record_ref = 'r:padded'")
        conn.exec_driver_sql(f"UPDATE {writer.table} SET _bos_superseded_by = 'r:8 ', "
                             f"_bos_deleted_at = _bos_observed_at WHERE record_ref = 'r:merged'")
    erased = erase_records(engine, table=writer.table, audit_table=writer.audit_table, record_refs=["r:8"])
    assert (erased.records, erased.merged) == (0, 0)
    assert set(names(engine, writer.table)) == {"r:8 ", ALICE, "r:merged"}
    erased = erase_records(engine, table=writer.table, audit_table=writer.audit_table, record_refs=["r:8 "])
    assert (erased.records, erased.merged) == (2, 1)
    assert set(names(engine, writer.table)) == {ALICE}
