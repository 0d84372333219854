"""Erasing a person BOS merged into another record erases that record too: a ref found (or named) brings
in the records it was merged into, transitively; a split is not followed without a decision.

Day 1 stores ``a1`` with the person's old email; day 2 BOS merges ``a1`` into ``b7`` (a new email, the
CRM and HR entries). An erasure by the old email finds ``a1`` only; without following the lineage
forward it deleted ``a1`` and the lineage row ``a1 -> b7`` and left ``b7``, the person's current
record, with nothing left saying it was theirs. Every dialect (the ``writer``/``engine`` fixtures);
the same tests run on Snowflake from test_snowflake_erase.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from airflow_provider_bos.exceptions import BosConfigurationError
from airflow_provider_bos.warehouse import AuditReader, WarehouseWriter
from airflow_provider_bos.warehouse.tables.schema import companion_table_name
from airflow_provider_bos.warehouse.upkeep.erase import erase_records
from airflow_provider_bos.wire import ReconcileOptions
from tests.warehouse.whhelpers import T0, T1, T2, make_record, run_info, write

FULL = ReconcileOptions(sync_mode="full", history=True)
A1, B7, B8, C9, H1 = (f"bos:person:{n}" for n in ("a1", "b7", "b8", "c9", "h1"))
OLD, NEW, BOB = "alice.old@erase.example", "alice.new@erase.example", "bob.b8@erase.example"
ALICE = "Alice Mergedova"
CRM = {"source_type": "crm", "source_identity": "crm-eu", "external_id": "crm-alice"}
HR = {"source_type": "hr", "source_identity": "hr-de", "external_id": "hr-alice"}
BOBS = {"source_type": "crm", "source_identity": "crm-eu", "external_id": "crm-bob"}


def record(ref: str, observed_at: str, email: str, *entries: dict[str, str], name: str = ALICE) -> dict[str, Any]:
    made = make_record(ref, observed_at, name=name, email=email)
    made["sources"] = [{**made["sources"][0], **e, "observed_at": observed_at} for e in entries]
    return made


def others(observed_at: str) -> list[dict[str, Any]]:
    """People no merge touches (so a full read's guard against mass retirement never holds back)."""
    return [make_record(i, observed_at) for i in range(1, 6)]


def day(writer: WarehouseWriter, observed_at: str, *records: dict[str, Any]) -> None:
    write(writer, [*records, *others(observed_at)], run_info(), reconcile=FULL)


def merged_on_day_2(writer: WarehouseWriter) -> None:
    day(writer, T0, record(A1, T0, OLD, CRM))
    day(writer, T1, record(B7, T1, NEW, CRM, HR))  # a1 -> b7


def split_on_day_2(writer: WarehouseWriter) -> None:
    """a1 held Alice's and Bob's CRM records (a wrong match); day 2 BOS splits them into b7 and b8."""
    day(writer, T0, record(A1, T0, OLD, CRM, BOBS))
    day(writer, T1, record(B7, T1, NEW, CRM), record(B8, T1, BOB, BOBS, name="Bob Split"))


def erase(engine: sa.Engine, writer: WarehouseWriter, **kwargs: Any):
    return erase_records(engine, table=writer.table, audit_table=writer.audit_table, **kwargs)


def tables_text(engine: sa.Engine, writer: WarehouseWriter) -> dict[str, str]:
    names = [writer.table, *(companion_table_name(writer.table, k) for k in ("history", "sources", "lineage"))]
    with engine.connect() as conn:
        return {name: repr(conn.exec_driver_sql(f"SELECT * FROM {name}").all()) for name in names}


def refs(engine: sa.Engine, writer: WarehouseWriter) -> set[str]:
    with engine.connect() as conn:
        return set(conn.exec_driver_sql(f"SELECT record_ref FROM {writer.table}").scalars())


def lineage(engine: sa.Engine, writer: WarehouseWriter) -> set[tuple[str, str]]:
    with engine.connect() as conn:
        return {tuple(r) for r in conn.exec_driver_sql(
            f"SELECT record_ref, successor_ref FROM {companion_table_name(writer.table, 'lineage')}")}


def test_erasing_by_an_old_email_erases_the_record_the_person_was_merged_into(writer, engine) -> None:
    merged_on_day_2(writer)
    assert lineage(engine, writer) == {(A1, B7)}

    erased = erase(engine, writer, emails=[OLD])

    assert refs(engine, writer) == {make_record(i)["record_ref"] for i in range(1, 6)}
    for table, text in tables_text(engine, writer).items():
        assert not [v for v in (A1, B7, OLD, NEW, ALICE, "crm-alice", "hr-alice") if v in text], table
    assert (erased.found, erased.successors, erased.successor_refs, erased.left) == (1, 1, [B7], [])
    assert (erased.records, erased.lineage) == (2, 1)
    audit = AuditReader(engine, table=writer.audit_table).get_run(erased.run_id)
    assert B7 not in str(audit) and A1 not in str(audit) and "merged into" in audit["notes"]


def test_the_records_merged_into_are_followed_transitively(writer, engine) -> None:
    """a1 -> b7 -> c9: the person's current record is two merges on."""
    merged_on_day_2(writer)
    day(writer, T2, record(C9, T2, NEW, CRM, HR))  # b7 -> c9
    assert lineage(engine, writer) == {(A1, B7), (B7, C9)}

    erased = erase(engine, writer, emails=[OLD])

    assert {A1, B7, C9}.isdisjoint(refs(engine, writer)) and lineage(engine, writer) == set()
    assert (erased.found, erased.successor_refs, erased.records) == (1, [B7, C9], 3)


def test_the_other_records_merged_into_the_successor_go_with_it(writer, engine) -> None:
    """b7 also took in h1 (the person's HR record): once b7 is erased as theirs, so is h1, as any record
    merged into an erased one."""
    day(writer, T0, record(A1, T0, OLD, CRM), record(H1, T0, NEW, HR))
    day(writer, T1, record(B7, T1, NEW, CRM, HR))

    erased = erase(engine, writer, emails=[OLD])

    assert {A1, B7, H1}.isdisjoint(refs(engine, writer)) and lineage(engine, writer) == set()
    assert (erased.found, erased.successors, erased.merged, erased.records) == (1, 1, 1, 3)


def test_a_named_ref_brings_in_its_successor_too(writer, engine) -> None:
    merged_on_day_2(writer)
    erased = erase(engine, writer, record_refs=[A1])
    assert B7 not in refs(engine, writer)
    assert (erased.successor_refs, erased.records) == ([B7], 2)


def test_a_successor_named_to_keep_stays_and_is_named_in_the_output(writer, engine) -> None:
    merged_on_day_2(writer)
    erased = erase(engine, writer, emails=[OLD], keep_successors=[B7])
    assert (erased.records, erased.successors) == (1, 0)
    assert [entry["record_ref"] for entry in erased.left] == [B7] and "kept" in erased.left[0]["reason"]
    assert B7 in refs(engine, writer) and A1 not in refs(engine, writer)
    assert lineage(engine, writer) == set()  # the row named the erased ref


def test_a_split_is_not_followed_without_a_decision_and_nothing_is_erased(writer, engine) -> None:
    """a1 held two people: which of b7 and b8 is the person asking is not known. The erasure refuses,
    names both, and leaves everything as it was (the lineage too)."""
    split_on_day_2(writer)
    before = tables_text(engine, writer)

    with pytest.raises(BosConfigurationError) as refused:
        erase(engine, writer, emails=[OLD])

    message = str(refused.value)
    assert B7 in message and B8 in message and "--keep-successor" in message and "--record-ref" in message
    assert "nothing was erased" in message.lower()
    assert tables_text(engine, writer) == before


def test_a_split_decided_by_naming_the_persons_record_leaves_the_other_and_says_so(writer, engine) -> None:
    split_on_day_2(writer)

    erased = erase(engine, writer, emails=[OLD], record_refs=[B7])

    assert (erased.found, erased.records, erased.successors) == (1, 2, 0)
    assert [entry["record_ref"] for entry in erased.left] == [B8] and "split" in erased.left[0]["reason"]
    assert refs(engine, writer) & {A1, B7, B8} == {B8}
    texts = tables_text(engine, writer)
    assert not [t for t, text in texts.items() if A1 in text or B7 in text or OLD in text]
    assert BOB in texts[writer.table]


def test_a_split_decided_by_keeping_both_successors_erases_only_the_found_record(writer, engine) -> None:
    split_on_day_2(writer)
    erased = erase(engine, writer, emails=[OLD], keep_successors=[B7, B8])
    assert erased.records == 1 and sorted(e["record_ref"] for e in erased.left) == [B7, B8]
    assert all("kept" in e["reason"] for e in erased.left)
    assert refs(engine, writer) & {A1, B7, B8} == {B7, B8} and lineage(engine, writer) == set()


def test_erasing_one_successor_of_a_split_takes_the_split_record_and_names_the_other(writer, engine) -> None:
    """From the successor's side the split is decided: b7 is the person, b8 was split off from them."""
    split_on_day_2(writer)
    erased = erase(engine, writer, record_refs=[B7])
    assert (erased.merged, erased.records) == (1, 2)
    assert [entry["record_ref"] for entry in erased.left] == [B8] and "split" in erased.left[0]["reason"]
    assert refs(engine, writer) & {A1, B7, B8} == {B8}


def test_a_ref_both_to_erase_and_to_keep_is_refused(writer, engine) -> None:
    merged_on_day_2(writer)
    before = tables_text(engine, writer)
    with pytest.raises(BosConfigurationError, match="both"):
        erase(engine, writer, emails=[OLD], record_refs=[B7], keep_successors=[B7])
    assert tables_text(engine, writer) == before
