"""The merge the classification picks: plain insert into an empty table, no merge when nothing changed.

Whatever statements run, the table and the counts must be what the general upsert gives.
"""

from __future__ import annotations

import re

from whhelpers import T1, T2, dump, make_record, statements, write

from airflow_provider_bos.warehouse import UpsertCounts
from airflow_provider_bos.warehouse.run import loads
from airflow_provider_bos.warehouse.tables.records import record_to_row


def writes_to(seen: list[str], table: str) -> list[str]:
    """Statements that modify ``table`` itself (INSERT INTO / UPDATE of it; not its audit table)."""
    pattern = re.compile(rf"^\s*(INSERT\s+INTO|UPDATE)\s+(\S+\.)?[`\"]?{re.escape(table)}[`\"]?[\s(]", re.IGNORECASE)
    return [sql for sql in seen if pattern.match(sql)]


def test_unchanged_rerun_runs_no_merge_and_rewrites_nothing(writer, engine, unique_table):
    records = [make_record(i) for i in range(30)]
    write(writer, records)
    before = dump(engine, unique_table)
    with statements(engine) as seen:
        counts = write(writer, records)
    assert counts == UpsertCounts(unchanged=30)
    assert writes_to(seen, unique_table) == []
    assert dump(engine, unique_table) == before


def test_first_run_into_an_empty_table_lands_every_row_exactly(writer, engine, unique_table):
    records = [make_record(i, attributes={"n": i, "deep": {"b": [1, 2.5, None], "a": "é\\\t"}}) for i in range(25)]
    counts = write(writer, records)
    assert counts == UpsertCounts(inserted=25)
    stored = {r[0]: r for r in dump(engine, unique_table)}
    assert len(stored) == 25
    # The stored hash is the record's canonical hash, whichever staging form the dialect chose.
    for record in records:
        assert repr(record_to_row(record).record_hash) in stored[repr(record["record_ref"])]


def test_empty_table_with_duplicates_keeps_the_latest_copy(writer, engine, unique_table):
    records = [make_record(1, T1, name="old"), make_record(2), make_record(1, T2, name="new")]
    assert write(writer, records) == UpsertCounts(inserted=2, duplicates=1)
    rows = {r[0]: r for r in dump(engine, unique_table)}
    assert repr("new") in rows[repr("bos:person:000001")]


def test_mixed_run_after_the_first_uses_the_guarded_merge(writer, engine, unique_table):
    write(writer, [make_record(i) for i in range(10)])
    second = (
        [make_record(i) for i in range(4)]  # unchanged
        + [make_record(i, T2, name=f"renamed {i}") for i in range(4, 7)]  # updated
        + [make_record(i, "2026-10-01T00:00:00Z", name="stale") for i in range(7, 10)]  # stale: skipped
        + [make_record(i) for i in range(10, 13)]  # new
    )
    assert write(writer, second) == UpsertCounts(inserted=3, updated=3, unchanged=4, skipped_stale=3)
    rows = {r[0]: r for r in dump(engine, unique_table)}
    assert len(rows) == 13
    assert repr("renamed 5") in rows[repr("bos:person:000005")]
    assert repr("stale") not in rows[repr("bos:person:000008")]


def counts_distinct(seen: list[str]) -> list[str]:
    # The supersede step's copy of the run's keys (MySQL, into the work table <stage>_k) and its
    # candidates from the provenance table (<stage>_c) are not counts of the run's keys.
    return [sql for sql in seen if re.search(r"SELECT\s+DISTINCT|COUNT\s*\(\s*DISTINCT", sql, re.IGNORECASE)
            and not re.search(r"INSERT INTO \S*_[kc]\W", sql)]


def test_a_run_whose_keys_are_all_distinct_does_not_count_them_in_sql(writer, engine, unique_table):
    """The writer's filter of seen keys proves there is nothing to dedupe: one scan of staging fewer."""
    write(writer, [make_record(i) for i in range(20)])
    with statements(engine) as seen:
        counts = write(writer, [make_record(i, T2, name="renamed") for i in range(15)] + [make_record(30)])
    assert counts == UpsertCounts(inserted=1, updated=15)
    assert counts_distinct(seen) == []


def looks_up_suspects(seen: list[str]) -> list[str]:
    # The merge's DELETE of records whose rows a newer read retired is not a look-up of suspects.
    return [sql for sql in seen if re.search(r"WHERE\s+\S*record_ref\S*\s+IN\s*\(", sql, re.IGNORECASE)
            and not sql.lstrip().upper().startswith("DELETE")]


def test_false_positives_of_the_filter_are_looked_up_not_counted(writer, engine, unique_table, monkeypatch):
    """8 bits for 12 keys: most keys find their bit set; looking those up proves them distinct."""
    write(writer, [make_record(i) for i in range(5)])
    monkeypatch.setattr(loads.SeenKeys, "BITS", 8)
    with statements(engine) as seen:
        counts = write(writer, [make_record(i, T2, name=f"n{i}") for i in range(12)])
    assert counts == UpsertCounts(inserted=7, updated=5)
    assert looks_up_suspects(seen) != []
    assert counts_distinct(seen) == []
    assert len(dump(engine, unique_table)) == 12


def test_a_true_repeat_among_false_positives_is_deduped_in_sql(writer, engine, unique_table, monkeypatch):
    write(writer, [make_record(i) for i in range(5)])
    monkeypatch.setattr(loads.SeenKeys, "BITS", 8)
    run = [make_record(i, T2, name=f"n{i}") for i in range(12)]
    run.insert(7, make_record(3, T2, name="later copy"))  # a repeat hidden among the false positives
    with statements(engine) as seen:
        counts = write(writer, run)
    assert counts == UpsertCounts(inserted=7, updated=5, duplicates=1)
    assert counts_distinct(seen) != []
    assert repr("later copy") in {r[0]: r for r in dump(engine, unique_table)}[repr("bos:person:000003")]


def test_too_many_suspects_to_look_up_fall_back_to_counting(writer, engine, unique_table, monkeypatch):
    monkeypatch.setattr(loads.SeenKeys, "BITS", 8)
    monkeypatch.setattr(loads.SeenKeys, "SUSPECTS_LIMIT", 2)
    with statements(engine) as seen:
        counts = write(writer, [make_record(i) for i in range(12)])
    assert counts == UpsertCounts(inserted=12)
    assert looks_up_suspects(seen) == []
    assert counts_distinct(seen) != []


def test_a_repeated_key_is_deduped_keeping_the_last_copy(writer, engine, unique_table):
    write(writer, [make_record(i) for i in range(5)])
    with statements(engine) as seen:
        counts = write(writer, [make_record(1, T2, name="a"), make_record(1, T2, name="b")])
    assert counts == UpsertCounts(updated=1, duplicates=1)
    assert counts_distinct(seen) != []
    assert repr("b") in {r[0]: r for r in dump(engine, unique_table)}[repr("bos:person:000001")]
