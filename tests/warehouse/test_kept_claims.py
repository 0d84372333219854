"""Claims kept out of staging (PostgreSQL with COPY, DuckDB): an unchanged re-run confirms its claims at once.

When the writer is given the wire hashes the read matched its KnownRecord claims against
(``write_run(..., WriteOptions(known=...))``), the claims are not staged: the table's state token, read with the
hashes and again under the lock, shows that no stored row changed since. A user relies on the same
outcome as when every claim is staged and joined (``known`` not given): the same counts, the same
stored rows, and the same refusal of a claim whose row changed under the run.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from whhelpers import T0, T1, T2, dump, make_record, reflect, rows_by_ref, statements, write

from airflow_provider_bos.exceptions import BosWarehouseError
from airflow_provider_bos.warehouse import UpsertCounts, WarehouseWriter
from airflow_provider_bos.warehouse.run import loads
from airflow_provider_bos.warehouse.run.claims import WireHashSet
from airflow_provider_bos.wire import KnownRecord, WireRecord

RUN_COLUMNS = ("_bos_synced_at", "_bos_run_id")  # differ between any two runs


@pytest.fixture(params=[pytest.param("postgres", marks=pytest.mark.postgres), "duckdb"])
def warehouse_url(request: pytest.FixtureRequest) -> str:
    """The dialects with a table state token (PostgreSQL with COPY, DuckDB's staged file)."""
    return request.getfixturevalue(f"{request.param}_url")


def wire(record: dict[str, Any]) -> WireRecord:
    out = WireRecord(record)
    out.wire_hash = hashlib.sha256(json.dumps(record, separators=(",", ":")).encode()).hexdigest()
    return out


def claim(record: WireRecord, known: WireHashSet | None = None) -> KnownRecord:
    """A claim as the scanner makes it: matched in ``known`` (or unmatched: always staged)."""
    if known is None:
        return KnownRecord(record["record_ref"], record.wire_hash)
    position = known.position(record.wire_hash)
    assert position >= 0, "only a stored record can be claimed"
    return KnownRecord(record["record_ref"], record.wire_hash, known, position)


def stored(engine: sa.Engine, table: str) -> list[tuple[str, ...]]:
    columns = [c.name for c in reflect(engine, table).columns]
    keep = [i for i, name in enumerate(columns) if name not in RUN_COLUMNS]
    return [tuple(row[i] for i in keep) for row in dump(engine, table)]


def joins(seen: list[str]) -> list[str]:
    # The catalog's own queries (is there a policy table?) join its tables, not ours.
    return [sql for sql in seen if re.search(r"\bJOIN\b", sql, re.IGNORECASE) and "pg_catalog." not in sql]


def states(seen: list[str]) -> list[str]:
    return [sql for sql in seen if re.search(r"HASHTEXTEXTENDED|SUM\(CAST\(HASH\(", sql)]  # PostgreSQL | DuckDB


def test_an_unchanged_rerun_confirms_its_claims_without_a_join(make_writer, engine) -> None:
    writer = make_writer()
    records = [wire(make_record(i)) for i in range(50)]
    write(writer, records)
    before = dump(engine, writer.table)
    known = writer.known_wire_hashes()
    assert known.state == (50, known.state[1], 50)  # hashed rows, their sum, current rows

    with statements(engine) as seen:
        counts = write(writer, [claim(r, known) for r in records], known=known)

    assert counts == UpsertCounts(unchanged=50)
    assert dump(engine, writer.table) == before
    assert states(seen) != []  # confirmed by the table's state token ...
    assert joins(seen) == []  # ... not by joining staged claims to the table


def test_changed_and_new_records_beside_kept_claims_are_merged(make_writer, engine) -> None:
    writer = make_writer()
    records = [wire(make_record(i)) for i in range(10)]
    write(writer, records)
    known = writer.known_wire_hashes()
    changed = [wire(make_record(i, T2, name=f"Renamed {i}")) for i in (3, 4)]
    stale = wire(make_record(6, T0, name="Stale"))
    older_copy = wire(make_record(5, T0, name="Older copy"))  # loses to its claimed (stored) copy
    new = wire(make_record(42))

    skip = {r["record_ref"] for r in [*changed, stale]}
    batch = [claim(r, known) for r in records if r["record_ref"] not in skip]
    counts = write(writer, [*batch[:4], *changed, stale, older_copy, new, *batch[4:]], known=known)

    assert counts == UpsertCounts(inserted=1, updated=2, unchanged=7, skipped_stale=1, duplicates=1)
    rows = rows_by_ref(engine, writer.table)
    assert [rows[r["record_ref"]]["display_name"] for r in changed] == ["Renamed 3", "Renamed 4"]
    assert rows[stale["record_ref"]]["display_name"] == "Person 6"
    assert rows[older_copy["record_ref"]]["display_name"] == "Person 5"
    assert len(rows) == 11


@pytest.mark.parametrize("bad", ["changed under us", "deleted under us"])
def test_a_claimed_row_changed_after_the_hashes_were_read_fails_the_run(make_writer, engine, bad: str) -> None:
    writer = make_writer()
    records = [wire(make_record(i)) for i in range(5)]
    write(writer, records)
    known = writer.known_wire_hashes()
    target = records[1]["record_ref"]
    with engine.begin() as conn:  # another writer, between our read of the hashes and our write
        if bad == "changed under us":
            conn.execute(sa.text(f"UPDATE {writer.table} SET _bos_wire_hash = :h WHERE record_ref = :r"),
                         {"h": "f" * 64, "r": target})
        else:
            conn.execute(sa.text(f"DELETE FROM {writer.table} WHERE record_ref = :r"), {"r": target})
    before = dump(engine, writer.table)

    with pytest.raises(BosWarehouseError, match="another writer changed or deleted") as info:
        write(writer, [*(claim(r, known) for r in records), wire(make_record(9))], known=known)

    assert "1 records" in str(info.value)
    assert dump(engine, writer.table) == before  # the new record 9 did not land either


@pytest.mark.parametrize("other", ["an unclaimed row changed", "a row added"])
def test_another_writers_unrelated_change_only_costs_the_join(make_writer, engine, other: str) -> None:
    writer = make_writer()
    records = [wire(make_record(i)) for i in range(6)]
    write(writer, records)
    known = writer.known_wire_hashes()
    if other == "a row added":
        write(make_writer(), [wire(make_record(77))])  # the same table, through another writer
    else:
        with engine.begin() as conn:
            conn.execute(sa.text(f"UPDATE {writer.table} SET _bos_wire_hash = :h WHERE record_ref = :r"),
                         {"h": "e" * 64, "r": records[5]["record_ref"]})

    with statements(engine) as seen:
        counts = write(writer, [claim(r, known) for r in records[:5]], known=known)

    assert counts == UpsertCounts(unchanged=5)
    assert joins(seen) != []  # the state token moved: the claims were staged from their rows and joined


def test_a_claim_matched_in_another_set_is_staged_and_joined(make_writer, engine) -> None:
    writer = make_writer()
    records = [wire(make_record(i)) for i in range(4)]
    write(writer, records)
    known, other = writer.known_wire_hashes(), writer.known_wire_hashes()

    with statements(engine) as seen:
        counts = write(writer, [claim(r, other) for r in records], known=known)

    assert counts == UpsertCounts(unchanged=4)
    assert joins(seen) != []


# --- the same outcome as staged claims, whatever the mix ------------------------------------------

STORED = 8
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("claim"), st.integers(0, STORED - 1)),
        st.tuples(st.just("changed"), st.integers(0, STORED - 1), st.sampled_from([T0, T1, T2]), st.integers(0, 2)),
        st.tuples(st.just("new"), st.integers(0, 3)),
    ),
    max_size=20,
)


# 60 generated mixes (marker ``repeats``): in the full tier only, as this file's dialects are the
# server ones and DuckDB; each dialect's SQL for kept claims is proven in the fast tier by the
# example-based tests above.
@pytest.mark.repeats
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, few_bits=st.booleans())
def test_kept_claims_land_exactly_as_staged_claims(
    make_writer: Callable[..., WarehouseWriter], engine: sa.Engine, unique_table: str, ops: list[Any],
    few_bits: bool, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Claims, changed copies (newer, same time, older) and new records, repeats of any of them:
    kept claims (``known`` given) and staged claims land the same rows and the same counts. With
    ``few_bits`` the key filter has 8 bits, so nearly every key is a suspect to be looked up."""
    kept_writer = make_writer(table=f"{unique_table}_k", audit_table=f"{unique_table}_kr")
    staged_writer = make_writer(table=f"{unique_table}_s", audit_table=f"{unique_table}_sr")
    records = [wire(make_record(i)) for i in range(STORED)]
    for w in (kept_writer, staged_writer):
        w.ensure_tables()
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DELETE FROM {w.table}")
        write(w, records)
    known = kept_writer.known_wire_hashes()

    def batch(matched: WireHashSet | None) -> list[Any]:
        out: list[Any] = []
        for op in ops:
            if op[0] == "claim":
                out.append(claim(records[op[1]], matched))
            elif op[0] == "changed":
                out.append(wire(make_record(op[1], op[2], name=f"v{op[3]}")))
            else:
                out.append(wire(make_record(100 + op[1])))
        return out

    with monkeypatch.context() as patch:
        if few_bits:
            patch.setattr(loads.SeenKeys, "BITS", 8)
        kept_counts = write(kept_writer, batch(known), known=known)
        staged_counts = write(staged_writer, batch(None))

    assert kept_counts == staged_counts
    assert stored(engine, kept_writer.table) == stored(engine, staged_writer.table)


def claims_staged(seen: list[str]) -> list[str]:
    """The statements staging kept claims from the stored rows they matched (``stage_claims``)."""
    return [sql for sql in seen if re.search(r"INSERT INTO \S+ \(\S*record_ref\S*, \S*_bos_wire_hash\S*, "
                                             r"\S*_bos_seq", sql)]


@pytest.mark.parametrize("mode", ["full", "incremental"])
def test_a_full_rerun_with_kept_claims_retires_and_supersedes_as_a_staged_one(make_writer, engine, unique_table,
                                                                              mode) -> None:
    """Day 2 keeps most people byte-identical (claims), changes one, merges two and loses one: with
    the claims kept out of staging, the run finds what it did not return without staging them, and
    lands the same rows and counts as the run whose claims are staged."""
    from airflow_provider_bos.wire import ReconcileOptions

    options = ReconcileOptions(sync_mode=mode)
    kept_writer = make_writer(table=f"{unique_table}_k", audit_table=f"{unique_table}_kr")
    staged_writer = make_writer(table=f"{unique_table}_s", audit_table=f"{unique_table}_sr")
    day1 = [wire(make_record(i)) for i in range(20)]
    merged = make_record("m:1-2", T2)
    merged["sources"] = [{**make_record(i)["sources"][0]} for i in (1, 2)]
    assert len({json.dumps(s, sort_keys=True) for s in merged["sources"]}) == 2, "two distinct provenance entries"
    for w in (kept_writer, staged_writer):
        write(w, day1, reconcile=options)
    known = kept_writer.known_wire_hashes()

    def day2(matched: WireHashSet | None) -> list[Any]:
        same = [claim(r, matched) for r in day1 if r["record_ref"] not in {day1[i]["record_ref"] for i in (1, 2, 5, 9)}]
        return [*same, wire(make_record(5, T2, name="Renamed")), wire(merged)]

    with statements(engine) as seen:
        kept_counts = write(kept_writer, day2(known), known=known, reconcile=options)
    staged_counts = write(staged_writer, day2(None), reconcile=options)

    assert kept_counts == staged_counts
    assert (kept_counts.superseded, kept_counts.retired) == (2, 1 if mode == "full" else 0)
    def lifecycle(table: str) -> dict[str, tuple[bool, Any, Any]]:  # retired?, successor, content hash
        return {ref: (row["_bos_deleted_at"] is None, row["_bos_superseded_by"], row["_bos_record_hash"])
                for ref, row in rows_by_ref(engine, table).items()}

    assert lifecycle(kept_writer.table) == lifecycle(staged_writer.table)
    assert len(lifecycle(kept_writer.table)) == 21
    assert claims_staged(seen) == []  # the 16 claims were never staged


def test_a_full_rerun_with_few_claims_stages_them_and_retires_the_same(make_writer, engine, unique_table) -> None:
    """Most records changed, few kept as claims: the claims (the fewer prefixes) are staged instead
    of listing the many unclaimed ones; the outcome is the same."""
    from airflow_provider_bos.wire import ReconcileOptions

    full = ReconcileOptions(sync_mode="full")
    writer = make_writer()
    day1 = [wire(make_record(i)) for i in range(20)]
    write(writer, day1, reconcile=full)
    known = writer.known_wire_hashes()
    batch = [claim(r, known) for r in day1[:3]] + [wire(make_record(i, T2, name="New")) for i in range(3, 19)]
    with statements(engine) as seen:
        counts = write(writer, batch, known=known, reconcile=full)
    assert (counts.unchanged, counts.updated, counts.retired) == (3, 16, 1)
    assert claims_staged(seen) != []
    assert rows_by_ref(engine, writer.table)[day1[19]["record_ref"]]["_bos_deleted_at"] is not None


@pytest.mark.parametrize("mode", ["full", "incremental"])
def test_a_row_whose_entries_an_unchanged_claim_holds_is_superseded_by_it(make_writer, engine, unique_table,
                                                                         mode) -> None:
    """A row left current beside the merged record that also holds its entry (as a partial or an
    incremental read can leave it) is superseded by that record when a complete re-run returns the
    merged record unchanged (a kept claim, never staged) and not the row."""
    from airflow_provider_bos.wire import ReconcileOptions

    options = ReconcileOptions(sync_mode=mode)
    kept_writer = make_writer(table=f"{unique_table}_k", audit_table=f"{unique_table}_kr")
    staged_writer = make_writer(table=f"{unique_table}_s", audit_table=f"{unique_table}_sr")
    merged = make_record("m:1-2")
    merged["sources"] = [{**make_record(i)["sources"][0]} for i in (1, 2)]
    day1 = [wire(make_record(i)) for i in range(1, 8)] + [wire(merged)]  # 1 and m:1-2 share an entry
    for w in (kept_writer, staged_writer):
        write(w, day1, reconcile=options)
    known = kept_writer.known_wire_hashes()

    def day2(matched: WireHashSet | None) -> list[Any]:
        return [claim(r, matched) for r in day1 if r["record_ref"] != day1[0]["record_ref"]]

    kept_counts = write(kept_writer, day2(known), known=known, reconcile=options)
    staged_counts = write(staged_writer, day2(None), reconcile=options)

    assert kept_counts == staged_counts
    assert (kept_counts.superseded, kept_counts.retired, kept_counts.written) == (1, 0, 0)
    for w in (kept_writer, staged_writer):
        row = rows_by_ref(engine, w.table)[day1[0]["record_ref"]]
        assert row["_bos_deleted_at"] is not None and row["_bos_superseded_by"] == "m:1-2"
