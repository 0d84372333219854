"""``<table>_sources``: one row per provenance entry, kept in step with the records table on every dialect.

After every scenario the table must mirror the records table exactly: each entry of each row's
``sources`` JSON, in its place, current as its row is. The end-to-end runs through the reference
server are in tests/airflow/test_provenance_e2e.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from airflow_provider_bos.exceptions import BosIncompleteStreamError
from airflow_provider_bos.warehouse import UpsertCounts
from airflow_provider_bos.warehouse.run import file_load, loads
from airflow_provider_bos.warehouse.tables.schema import companion_table_name
from airflow_provider_bos.warehouse.upkeep.erase import erase_records
from airflow_provider_bos.wire import ReconcileOptions
from tests.warehouse.test_reconcile import FULL, day1, day2, person
from tests.warehouse.whhelpers import T1, T2, make_record, reflect, rows_by_ref, statements, write

Entry = tuple[str, int, Any, Any, Any, Any, Any, Any, bool]


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def stored_entries(engine: sa.Engine, table: str) -> set[Entry]:
    t = reflect(engine, companion_table_name(table, "sources"))
    with engine.connect() as conn:
        return {(r.record_ref, int(r.entry_index), r.source_type, r.source_identity, r.external_id, r.record_type,
                 r.version, json.dumps(_json(r.capabilities)), bool(r.is_current))
                for r in conn.execute(sa.select(t))}


def expected_entries(engine: sa.Engine, table: str) -> set[Entry]:
    """What the records table's ``sources`` JSON holds, as the provenance table must hold it."""
    expected = set()
    for ref, row in rows_by_ref(engine, table).items():
        for index, entry in enumerate(_json(row["sources"])):
            version = entry.get("version")
            expected.add((ref, index, entry["source_type"], entry["source_identity"], entry["external_id"],
                          entry["record_type"], None if version is None else str(version),
                          json.dumps(entry["capabilities"]), row["_bos_deleted_at"] is None))
    return expected


def assert_mirrors(engine: sa.Engine, table: str) -> set[Entry]:
    stored = stored_entries(engine, table)
    assert stored == expected_entries(engine, table)
    return stored


def holder(engine: sa.Engine, table: str, source_type: str, external_id: str) -> list[str]:
    """The analyst's question: which current record holds this source's id?"""
    t = reflect(engine, companion_table_name(table, "sources"))
    with engine.connect() as conn:
        return list(conn.execute(sa.select(t.c.record_ref).where(
            t.c.source_type == source_type, t.c.external_id == external_id, t.c.is_current.is_(True))).scalars())


def writes_to(seen: list[str], table: str) -> list[str]:
    name = re.escape(companion_table_name(table, "sources"))
    writing = re.compile(rf"^\s*(INSERT INTO|UPDATE|DELETE FROM)\s+\S*{name}\b", re.IGNORECASE)
    return [s for s in seen if writing.search(s)]


def varied(i: int, observed_at: str = T1) -> dict[str, Any]:
    """A record with two entries of two sources, a numeric and a text version, two capabilities."""
    record = make_record(i, observed_at)
    record["sources"] = [
        {**record["sources"][0], "version": 7, "capabilities": ["read", "write"]},
        {"source_type": "hr", "source_identity": "workday", "external_id": f"E{i}", "record_type": "employee",
         "observed_at": observed_at, "capabilities": [], "version": "v2"},
    ]
    return record


def test_every_entry_of_every_row_is_a_row_in_its_place(make_writer, engine) -> None:
    writer = make_writer()
    assert write(writer, [varied(i) for i in range(1, 6)]) == UpsertCounts(inserted=5)
    stored = assert_mirrors(engine, writer.table)
    assert len(stored) == 10
    ref = make_record(3)["record_ref"]
    assert (ref, 1, "hr", "workday", "E3", "employee", "v2", "[]", True) in stored
    assert (ref, 0, "crm", "crm-eu", "3", "person", "7", '["read", "write"]', True) in stored
    assert holder(engine, writer.table, "hr", "E3") == [ref]


def test_the_current_record_holding_an_entry_is_an_index_lookup(make_writer, engine) -> None:
    """The analyst's question is answered from the entry index, as each database's planner shows it."""
    writer = make_writer()
    write(writer, [varied(i) for i in range(1, 6)])
    sources = companion_table_name(writer.table, "sources")
    dialect = engine.dialect.name
    if dialect in ("duckdb", "snowflake"):
        pytest.skip(f"{dialect}'s table has no entry index (docs/warehouse.md: it prunes by statistics)")
    [index] = [i["name"] for i in sa.inspect(engine).get_indexes(sources) if "external_id" in i["column_names"]]
    question = (f"SELECT record_ref FROM {sources} WHERE source_type = 'hr' AND source_identity = 'workday' "
                "AND external_id = 'E3' AND is_current")
    with engine.connect() as conn:
        if dialect == "postgresql":
            conn.exec_driver_sql("SET enable_seqscan = off")  # five rows: asked whether it can, not whether it pays
        explain = "EXPLAIN QUERY PLAN " if dialect == "sqlite" else "EXPLAIN "
        rows = conn.exec_driver_sql(explain + question).mappings().all()
        # MySQL's possible_keys names an index it could use; its `key` column the one it does.
        plan = (" ".join(str(row["key"]) for row in rows) if dialect == "mysql" else
                " ".join(str(value) for row in rows for value in row.values()))
        assert conn.exec_driver_sql(question).scalars().all() == [make_record(3)["record_ref"]]
    assert index in plan, plan


def test_a_re_stamped_read_writes_no_entry(make_writer, engine) -> None:
    """BOS stamps every entry's observed_at with the read's time: the same people read again later
    change no entry (observation times stay out of the table)."""
    writer = make_writer()
    write(writer, [varied(i) for i in range(1, 6)])
    before = assert_mirrors(engine, writer.table)
    with statements(engine) as seen:
        counts = write(writer, [varied(i, T2) for i in range(1, 6)], observed_at=T2)
    assert (counts.inserted, counts.updated, counts.unchanged) == (0, 0, 5)
    assert writes_to(seen, writer.table) == []
    assert stored_entries(engine, writer.table) == before


def test_a_changed_record_gets_its_entries_anew(make_writer, engine) -> None:
    writer = make_writer()
    write(writer, [varied(i) for i in range(1, 6)])
    changed = varied(2, T2)
    changed["sources"].append({**changed["sources"][1], "external_id": "E2-second", "version": None})
    counts = write(writer, [varied(1, T2), changed, *(varied(i, T2) for i in range(3, 6))])
    assert (counts.updated, counts.unchanged) == (1, 4)
    stored = assert_mirrors(engine, writer.table)
    assert len(stored) == 11
    assert holder(engine, writer.table, "hr", "E2-second") == [make_record(2)["record_ref"]]


def test_a_run_that_changes_one_record_leaves_the_others_entries_in_place(make_writer, engine) -> None:
    """No churn: in a read where one person changed and the rest came re-stamped, only that person's
    entries are written; every other entry row stays the row it was (a column the writer does not
    know, set on every row beforehand, survives on theirs)."""
    writer = make_writer()
    write(writer, [varied(i) for i in range(1, 6)])
    sources = companion_table_name(writer.table, "sources")
    with engine.begin() as conn:
        conn.exec_driver_sql(f"ALTER TABLE {sources} ADD COLUMN marker INTEGER")
        conn.exec_driver_sql(f"UPDATE {sources} SET marker = 1")
    changed = varied(2, T2)
    changed["display_name"] = "Renamed"

    counts = write(writer, [varied(1, T2), changed, *(varied(i, T2) for i in range(3, 6))], observed_at=T2)

    assert (counts.updated, counts.unchanged) == (1, 4)
    with engine.connect() as conn:
        marked = conn.exec_driver_sql(f"SELECT record_ref, marker FROM {sources}").all()
    two = make_record(2)["record_ref"]
    assert sorted(ref for ref, marker in marked if marker is None) == [two, two]  # written anew
    assert len([ref for ref, marker in marked if marker == 1]) == 8
    assert_mirrors(engine, writer.table)


def test_retired_and_superseded_rows_keep_their_entries_not_current(make_writer, engine) -> None:
    writer = make_writer()
    write(writer, day1(), reconcile=FULL)
    counts = write(writer, day2(), reconcile=FULL)
    assert (counts.superseded, counts.retired) == (2, 1)
    stored = assert_mirrors(engine, writer.table)
    one = make_record(1)["record_ref"]
    assert (one, 0, "crm", "crm-eu", "1", "person", None, '["read"]', False) in stored
    # The merged record holds both ids now: each finds it, and only it.
    assert holder(engine, writer.table, "crm", "1") == holder(engine, writer.table, "crm", "2") == ["m:1-2"]
    assert holder(engine, writer.table, "crm", "10") == []  # the leaver is retired


def test_supersession_reads_the_provenance_table_not_the_json(make_writer, engine) -> None:
    """Which stored row holds an entry is what <table>_sources says: one index look-up, not a search
    of every row's JSON. Seen by making the table disagree with the JSON: 1's entry deleted, and 10's
    (a leaver's) changed to 3's id, the JSON of both untouched."""
    writer = make_writer()
    write(writer, day1(), reconcile=FULL)
    one, three, ten = (make_record(i)["record_ref"] for i in (1, 3, 10))
    sources = companion_table_name(writer.table, "sources")
    with engine.begin() as conn:
        conn.execute(sa.text(f"DELETE FROM {sources} WHERE record_ref = :ref"), {"ref": one})
        conn.execute(sa.text(f"UPDATE {sources} SET external_id = '3' WHERE record_ref = :ref"), {"ref": ten})

    counts = write(writer, day2(), reconcile=FULL)

    rows = rows_by_ref(engine, writer.table)
    assert (counts.superseded, counts.retired) == (2, 1)
    assert rows[make_record(2)["record_ref"]]["_bos_superseded_by"] == "m:1-2"
    assert rows[ten]["_bos_superseded_by"] == three  # as the table says, not the JSON
    assert rows[one]["_bos_superseded_by"] is None and rows[one]["_bos_deleted_at"] is not None


def test_hard_deletions_delete_the_entries(make_writer, engine) -> None:
    writer = make_writer()
    hard = ReconcileOptions(sync_mode="full", deletions="hard")
    write(writer, day1(), reconcile=hard)
    write(writer, day2(), reconcile=hard)
    stored = assert_mirrors(engine, writer.table)
    assert {e[0] for e in stored} == set(rows_by_ref(engine, writer.table))
    assert make_record(10)["record_ref"] not in {e[0] for e in stored}


def test_a_retired_record_that_comes_back_is_current_again(make_writer, engine) -> None:
    writer = make_writer()
    write(writer, [person(1), person(2)], reconcile=FULL)
    write(writer, [person(1)], reconcile=ReconcileOptions(sync_mode="full", max_retire_fraction=None))
    assert holder(engine, writer.table, "crm", "2") == []
    write(writer, [person(1), person(2)], reconcile=FULL)
    assert_mirrors(engine, writer.table)
    assert holder(engine, writer.table, "crm", "2") == [make_record(2)["record_ref"]]


def test_a_table_stored_before_it_gets_it_built_from_the_json_and_supersedes_through_it(
        make_writer, engine) -> None:
    writer = make_writer()
    write(writer, day1(), reconcile=FULL)
    with engine.begin() as conn:  # as a table stored before the provenance table existed
        conn.exec_driver_sql(f"DROP TABLE {companion_table_name(writer.table, 'sources')}")
    later = make_writer(table=writer.table, audit_table=writer.audit_table)
    counts = write(later, day2(), reconcile=FULL)
    # 3-9 came re-stamped (unchanged, not rewritten): their entries are the ones built from the JSON.
    assert (counts.unchanged, counts.superseded, counts.retired) == (6, 2, 1)
    assert_mirrors(engine, writer.table)
    assert holder(engine, writer.table, "crm", "5") == [make_record(5)["record_ref"]]


def test_erasure_deletes_the_entries(make_writer, engine) -> None:
    writer = make_writer()
    write(writer, [varied(i) for i in range(1, 4)])
    ref = make_record(2)["record_ref"]
    erased = erase_records(engine, table=writer.table, audit_table=writer.audit_table, record_refs=[ref])
    assert erased.sources == 2
    stored = assert_mirrors(engine, writer.table)
    assert ref not in {e[0] for e in stored} and len(stored) == 4


def test_a_records_table_emptied_by_hand_leaves_no_entry_behind(make_writer, engine) -> None:
    """Rows deleted by hand leave their entries; the next run into the emptied table keeps none of
    them (on every dialect, whether or not it loads an empty table directly), and a run into an
    empty table clears no entry ref by ref."""
    writer = make_writer()
    write(writer, [varied(i) for i in range(1, 4)])
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DELETE FROM {writer.table}")
    with statements(engine) as seen:
        assert write(writer, [varied(4)]) == UpsertCounts(inserted=1)
    stored = assert_mirrors(engine, writer.table)
    assert {e[0] for e in stored} == {make_record(4)["record_ref"]}
    assert holder(engine, writer.table, "hr", "E1") == []
    deletes = [s for s in writes_to(seen, writer.table) if re.match(r"\s*DELETE\b", s, re.IGNORECASE)]
    assert deletes and not [s for s in deletes if re.search(r"\bWHERE\b", s, re.IGNORECASE)]


def _load_in_small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A direct load sends its rows in blocks and stages possible repeats every few (COPY on
    PostgreSQL, files on DuckDB): blocks of a handful make a small load cross several of both."""
    monkeypatch.setattr(loads, "_COPY_BLOCK", 2)
    monkeypatch.setattr(loads, "_PENDING_LIMIT", 2)
    monkeypatch.setattr(file_load, "FILE_BLOCK_ROWS", 3)
    monkeypatch.setattr(file_load, "_WRITE_ROWS", 2)


def test_a_first_load_with_later_copies_of_its_records_mirrors_the_stored_rows(
        make_writer, engine, monkeypatch) -> None:
    """A first load whose read repeats record_refs with newer content stores the later copies' entries
    (merged after the load) and nothing of the copies they replaced."""
    _load_in_small_blocks(monkeypatch)
    writer = make_writer()
    first = [varied(i) for i in range(1, 15)]
    later = []
    for i in (2, 7, 13):  # a later, newer copy of three records: its second entry moved to another id
        copy = varied(i, T2)
        copy["sources"][1] = {**copy["sources"][1], "external_id": f"E{i}-moved"}
        later.append(copy)
    counts = write(writer, [*first[:8], later[0], *first[8:], *later[1:]])
    assert (counts.inserted, counts.duplicates) == (14, 3)
    stored = assert_mirrors(engine, writer.table)
    assert len(stored) == 28
    for i in (2, 7, 13):
        ref = make_record(i)["record_ref"]
        assert holder(engine, writer.table, "hr", f"E{i}-moved") == [ref]
        assert holder(engine, writer.table, "hr", f"E{i}") == []
    assert holder(engine, writer.table, "hr", "E5") == [make_record(5)["record_ref"]]


def test_a_first_load_that_fails_midway_leaves_the_provenance_table_as_it_was(
        make_writer, engine, monkeypatch) -> None:
    """A read that breaks after rows were loaded rolls back the provenance table with them: the
    entries of rows deleted by hand are still there, and no entry of the failed run is."""
    _load_in_small_blocks(monkeypatch)
    writer = make_writer()
    write(writer, [varied(i) for i in range(1, 4)])
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DELETE FROM {writer.table}")
    before = entry_ids(engine, writer.table)
    assert len(before) == 6

    def breaking() -> Iterator[dict[str, Any]]:
        yield from (varied(i) for i in range(10, 30))
        raise BosIncompleteStreamError("the stream ended inside the final response")

    with pytest.raises(BosIncompleteStreamError):
        write(writer, breaking())
    assert rows_by_ref(engine, writer.table) == {}
    assert entry_ids(engine, writer.table) == before


def entry_ids(engine: sa.Engine, table: str) -> set[tuple[str, str]]:
    """(record_ref, external_id) of every entry, whether its row exists or not, in plain SQL."""
    with engine.connect() as conn:
        return {(ref, external_id) for ref, external_id in conn.exec_driver_sql(
            f"SELECT record_ref, external_id FROM {companion_table_name(table, 'sources')}")}
