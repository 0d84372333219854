"""An erasure by external id finds the records through ``<table>_sources`` (its entry index) and the
history by one pass of the database, then compares each candidate's stored entries exactly: nobody is
read into the process but the candidates, and the result is the one a read of every row gives.

Every dialect (sqlite, postgres, mysql, duckdb). The exact comparisons themselves (a trailing space, a
number stored, a source_identity in another case) are test_erase_exact_ids.py's.
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from airflow_provider_bos.pii import PiiPolicy
from airflow_provider_bos.warehouse import WarehouseWriter
from airflow_provider_bos.warehouse.tables.schema import companion_table_name
from airflow_provider_bos.warehouse.upkeep import entry_search, erase_finders
from airflow_provider_bos.warehouse.upkeep.erase import erase_records
from airflow_provider_bos.wire import ReconcileOptions
from tests.warehouse.pii_helpers import KEY, write_under
from tests.warehouse.whhelpers import T2, make_record

HASHED = PiiPolicy.parse({"sources[].external_id": "hash"})
HISTORY = ReconcileOptions(history=True)


def holder(n: int, *ids: Any, source_identity: str = "crm-eu", **fields: Any) -> dict[str, Any]:
    """Person ``n`` with one entry of ``source_identity`` per id."""
    made = make_record(n, **fields)
    made["sources"] = [{**made["sources"][0], "source_identity": source_identity, "external_id": ident}
                       for ident in ids]
    return made


def ref(n: int) -> str:
    return make_record(n)["record_ref"]


def refs(engine: sa.Engine, writer: WarehouseWriter) -> set[str]:
    with engine.connect() as conn:
        return set(conn.exec_driver_sql(f"SELECT record_ref FROM {writer.table}").scalars())


def erase(engine: sa.Engine, writer: WarehouseWriter, **finders: Any):
    return erase_records(engine, table=writer.table, audit_table=writer.audit_table, key=KEY, **finders)


def people_whose_ids_changed(writer: WarehouseWriter, policy: PiiPolicy | None) -> None:
    """1..12 with the id c-<n> each (3 holds a second entry, 4 the number 40); on day 2, 2's id
    became c-2-new, so c-2 is only in its history."""
    plan = policy.plan(KEY) if policy is not None else None
    people = [holder(n, f"c-{n}") for n in range(1, 13)]
    people[2] = holder(3, "c-3", "c-3b")
    people[3] = holder(4, "c-4", 40)
    write_under(writer, plan, people, reconcile=HISTORY)
    write_under(writer, plan, [people[0], holder(2, "c-2-new", observed_at=T2), *people[2:]], reconcile=HISTORY)


@pytest.fixture()
def no_full_read(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Fails the test if any table is read row by row; records which tables were searched by a pass
    of the database (the provenance table's index spares the records table that pass)."""
    passes: list[str] = []

    def no_scan(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("every row was read to find an external id")

    real = entry_search.versions_candidates

    def counted(conn, d, table, probes):
        passes.append(table.name)
        return real(conn, d, table, probes)

    monkeypatch.setattr(erase_finders, "rows_in_batches", no_scan)
    monkeypatch.setattr(erase_finders, "versions_candidates", counted)
    return passes


@pytest.mark.parametrize("policy", [None, HASHED], ids=["kept", "hashed"])
def test_an_external_id_is_found_through_the_provenance_table_and_one_pass_over_the_history(
        make_writer, engine, policy, no_full_read) -> None:
    writer = make_writer()
    people_whose_ids_changed(writer, policy)

    erased = erase(engine, writer, external_ids=["crm-eu:c-2", "crm-eu:c-3b"])

    assert (erased.found, erased.records, erased.history) == (2, 2, 3)  # 2 has two versions; its old id is in one
    assert refs(engine, writer) == {ref(n) for n in range(1, 13)} - {ref(2), ref(3)}
    assert no_full_read == [companion_table_name(writer.table, "history")]


@pytest.mark.parametrize("policy", [None, HASHED], ids=["kept", "hashed"])
def test_many_ids_in_one_request_are_found_exactly(make_writer, engine, policy, no_full_read) -> None:
    """More ids than are tested one by one: the history's entries expanded and compared with the list."""
    writer = make_writer()
    people_whose_ids_changed(writer, policy)
    asked = [f"crm-eu:c-{n}" for n in (1, 2, 5, 6, 7, 8, 9)] + ["crm-eu:40", "crm-eu:c-2-new ", "crm-us:c-10"]

    erased = erase(engine, writer, external_ids=asked)

    # 4's number 40 is not the text '40' (kept: compared exactly; hashed: no hash of it was asked
    # for either way), 'c-2-new ' is not 'c-2-new', crm-us is another source.
    assert erased.found == 7
    assert refs(engine, writer) == {ref(n) for n in (3, 4, 10, 11, 12)}


def test_a_provenance_table_left_empty_beside_stored_records_is_not_trusted(make_writer, engine) -> None:
    """A table stored before its provenance table was kept gets an empty one (the next run fills it):
    its records are searched themselves meanwhile."""
    writer = make_writer()
    people_whose_ids_changed(writer, None)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DELETE FROM {companion_table_name(writer.table, 'sources')}")

    erased = erase(engine, writer, external_ids=["crm-eu:c-3b", "crm-eu:c-5"])

    assert erased.found == 2 and refs(engine, writer) == {ref(n) for n in range(1, 13)} - {ref(3), ref(5)}
