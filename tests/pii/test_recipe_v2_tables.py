"""Hash recipe 2 on a real table (SQLite): what the audit row's coverage counts, and what an erasure finds."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from airflow_provider_bos.exceptions import BosConfigurationError
from airflow_provider_bos.pii import PiiKey, PiiPolicy
from airflow_provider_bos.warehouse import AuditReader, WarehouseWriter
from airflow_provider_bos.warehouse.upkeep.erase import erase_records
from tests.warehouse.whhelpers import make_record, rows_by_ref, run_info, write

POLICY = PiiPolicy.parse({"email": "hash", "phone": "hash", "sources[].external_id": "hash"})
ARABIC_INDIC = str.maketrans("0123456789", "\u0660\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668\u0669")
PERSIAN = str.maketrans("0123456789", "\u06f0\u06f1\u06f2\u06f3\u06f4\u06f5\u06f6\u06f7\u06f8\u06f9")
DEVANAGARI = str.maketrans("0123456789", "\u0966\u0967\u0968\u0969\u096a\u096b\u096c\u096d\u096e\u096f")


@pytest.fixture()
def engine(sqlite_url: str) -> Iterator[sa.Engine]:
    eng = sa.create_engine(sqlite_url)
    try:
        yield eng
    finally:
        eng.dispose()


@pytest.fixture()
def writer(engine: sa.Engine) -> WarehouseWriter:
    return WarehouseWriter(engine, table="people", audit_table="people_runs")


def write_under(writer: WarehouseWriter, key: PiiKey, records: list[dict[str, Any]]) -> Any:
    plan = POLICY.plan(key)
    run = run_info()
    write(writer, [plan.apply(r) for r in records], run, pii=plan.fingerprint)
    return run


def test_blank_emails_are_not_counted_as_covered(engine: sa.Engine, writer: WarehouseWriter, key: PiiKey) -> None:
    """On recipe 1 the blank emails were one shared hash: coverage counted 4 of 4 while one person had one."""
    people = [make_record(1), make_record(2, email=""), make_record(3, email="  "), make_record(4, email="\t")]
    run = write_under(writer, key, people)
    coverage = AuditReader(engine, table=writer.audit_table).get_run(run.run_id)["coverage"]
    assert coverage["records"] == 4 and coverage["columns"]["email"] == 1
    stored = rows_by_ref(engine, writer.table)
    assert [stored[p["record_ref"]]["email"] is None for p in people] == [False, True, True, True]


def test_erase_by_a_phone_in_another_script_finds_exactly_its_owner(
        engine: sa.Engine, writer: WarehouseWriter, key: PiiKey) -> None:
    """On recipe 1 the three numbers normalised to '+': one shared hash, and erase --phone found nobody."""
    people = [make_record(1, phone="+20 2 1111".translate(ARABIC_INDIC)),
              make_record(2, phone="+98 21 2222".translate(PERSIAN)),
              make_record(3, phone="+91 11 3333".translate(DEVANAGARI))]
    write_under(writer, key, people)
    assert len({row["phone"] for row in rows_by_ref(engine, writer.table).values()}) == 3
    erased = erase_records(engine, table=writer.table, audit_table=writer.audit_table, key=key,
                           phones=["+98 21 2222"])  # typed in ASCII digits
    assert erased.found == 1
    assert set(rows_by_ref(engine, writer.table)) == {people[0]["record_ref"], people[2]["record_ref"]}
    erased = erase_records(engine, table=writer.table, audit_table=writer.audit_table, key=key,
                           phones=["+20 2 1111".translate(ARABIC_INDIC)])  # typed as stored
    assert erased.found == 1 and set(rows_by_ref(engine, writer.table)) == {people[2]["record_ref"]}


def test_erase_by_an_external_id_finds_that_id_exactly(engine: sa.Engine, writer: WarehouseWriter,
                                                       key: PiiKey) -> None:
    """On recipe 1 '4711', '4711 ' and the number 4711 were one hash: erasing one person's id erased all three."""
    text, spaced, numeric = make_record(1), make_record(2), make_record(3)
    text["sources"][0]["external_id"] = "4711"
    spaced["sources"][0]["external_id"] = "4711 "
    numeric["sources"][0]["external_id"] = 4711
    write_under(writer, key, [text, spaced, numeric])
    assert len({row["sources"] for row in rows_by_ref(engine, writer.table).values()}) == 3
    erased = erase_records(engine, table=writer.table, audit_table=writer.audit_table, key=key,
                           external_ids=["crm-eu:4711"])
    assert erased.found == 1
    assert set(rows_by_ref(engine, writer.table)) == {spaced["record_ref"], numeric["record_ref"]}


def test_erase_by_a_hashed_value_of_a_recipe_1_table_is_refused_not_silently_empty(
        engine: sa.Engine, writer: WarehouseWriter, key: PiiKey) -> None:
    """A table written under recipe 1 holds hashes this release cannot compute: an erasure by a hashed value
    would find nobody, and say "found 0"; it is refused instead. By ref it still works."""
    people = [make_record(1), make_record(2)]
    write_under(writer, key, people)
    with engine.begin() as conn:
        stored = conn.execute(sa.text("SELECT fingerprint FROM people_policy")).scalar_one()
        conn.execute(sa.text("UPDATE people_policy SET fingerprint = :f"),
                     {"f": stored.replace('"recipe":2', '"recipe":1')})
    with pytest.raises(BosConfigurationError, match="recipe version 1, this release's version 2"):
        erase_records(engine, table=writer.table, audit_table=writer.audit_table, key=key, emails=["p1@example.com"])
    assert set(rows_by_ref(engine, writer.table)) == {p["record_ref"] for p in people}
    erased = erase_records(engine, table=writer.table, audit_table=writer.audit_table,
                           record_refs=[people[0]["record_ref"]])
    assert erased.records == 1
