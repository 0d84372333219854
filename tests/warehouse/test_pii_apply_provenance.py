"""pii-apply and ``<table>_sources``: the provenance entries follow the rewritten ``sources``, and an erasure
by external id finds the person through them afterwards, on every dialect."""

from __future__ import annotations

import sqlalchemy as sa

from airflow_provider_bos.pii import PiiPolicy, lookup_hash
from airflow_provider_bos.warehouse.tables.schema import companion_table_name
from airflow_provider_bos.warehouse.upkeep.erase import erase_records
from airflow_provider_bos.warehouse.upkeep.pii_apply import apply_stricter_policy
from tests.warehouse.pii_helpers import HISTORY, KEY, person, write_under


def entries(engine: sa.Engine, table: str) -> list[tuple]:
    with engine.connect() as conn:
        return sorted(tuple(row) for row in conn.exec_driver_sql(
            f"SELECT record_ref, entry_index, source_type, source_identity, external_id, is_current "
            f"FROM {companion_table_name(table, 'sources')}"))


def apply(engine, writer, rules: dict[str, str]):
    return apply_stricter_policy(engine, table=writer.table, audit_table=writer.audit_table,
                                 policy=PiiPolicy.parse(rules), key=KEY)


def test_hashed_ids_are_the_provenance_tables_and_find_the_person(make_writer, engine) -> None:
    writer = make_writer()
    write_under(writer, None, [person(i) for i in range(1, 4)], reconcile=HISTORY)
    before = entries(engine, writer.table)

    apply(engine, writer, {"email": "hash"})  # the sources stay as they were: so do their entries
    assert entries(engine, writer.table) == before

    apply(engine, writer, {"email": "hash", "sources[].external_id": "hash"})
    after = entries(engine, writer.table)
    hashed = lookup_hash(KEY, "sources[].external_id", "ext-2")
    assert [e[4] for e in after] == [lookup_hash(KEY, "sources[].external_id", f"ext-{i}") for i in range(1, 4)]
    assert [e[:4] + e[5:] for e in after] == [e[:4] + e[5:] for e in before]

    erased = erase_records(engine, table=writer.table, audit_table=writer.audit_table, key=KEY,
                           external_ids=["crm-eu:ext-2"])
    assert (erased.found, erased.records, erased.history) == (1, 1, 1)
    assert hashed not in {e[4] for e in entries(engine, writer.table)}
