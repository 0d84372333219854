"""The direct load: an EMPTY target is loaded into the table itself as the records arrive, by COPY on
PostgreSQL (psycopg 3) and by ``executemany`` of INSERT ... VALUES on MySQL/MariaDB (and PostgreSQL
without COPY). SQLite stages and merges every run (its direct load was measured slower).

Whatever path a run takes, a user relies on the same outcome: the counts and the stored rows are
exactly what staging + dedupe + merge gives (here: a writer with the direct load off), and any error
leaves the table and the audit table as they were. Later copies of a record_ref (and Bloom filter
false positives) go through staging and the guarded merge. Every test runs on every dialect except
the COPY-specific ones and the lock-watching concurrency test (PostgreSQL's ``pg_locks``); on
SQLite the rollback and claim tests run on its staged path.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from whhelpers import T0, T1, T2, dump, make_record, reflect, rows_by_ref, run_info, statements, write

from airflow_provider_bos.exceptions import BosIncompleteStreamError, BosWarehouseError
from airflow_provider_bos.models import FederatedRecord
from airflow_provider_bos.warehouse import AuditReader, UpsertCounts, WarehouseWriter
from airflow_provider_bos.warehouse.run import file_load, loads
from airflow_provider_bos.wire import KnownRecord, WireRecord

RUN_COLUMNS = ("_bos_synced_at", "_bos_run_id")  # differ between any two runs
TIMEOUT_S = 30.0  # bound on every wait of the concurrency test (never a sleep standing in for sync)
COPY_ONLY = "PostgreSQL's COPY (psycopg 3); the other dialects' direct load is executemany, tested alongside"
NOT_DIRECT = {
    "sqlite": "SQLite loads no table directly: executemany into the keyed table was measured slower than staging",
}


@pytest.fixture(autouse=True)
def small_file_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """DuckDB's staged file is loaded every 64 lines here, so these results span several blocks."""
    monkeypatch.setattr(file_load, "FILE_BLOCK_ROWS", 64)

# --- helpers -------------------------------------------------------------------------------------


def stored(engine: sa.Engine, table: str) -> list[tuple[str, ...]]:
    """dump() without the per-run columns: what two runs of the same records must agree on."""
    columns = [c.name for c in reflect(engine, table).columns]
    keep = [i for i, name in enumerate(columns) if name not in RUN_COLUMNS]
    return [tuple(row[i] for i in keep) for row in dump(engine, table)]


def copies_into(copies: list[str], table: str) -> list[str]:
    """The COPY statements (seen by the psycopg spy) that load ``table`` itself."""
    pattern = re.compile(rf'^\s*COPY\s+(\S+\.)?"?{re.escape(table)}"?\s*\(', re.IGNORECASE)
    return [sql for sql in copies if pattern.match(sql)]


def inserts_values_into(seen: list[str], table: str) -> list[str]:
    """SQLAlchemy-executed ``INSERT INTO table (...) VALUES`` statements (the executemany direct load)."""
    pattern = re.compile(rf"^\s*INSERT\s+INTO\s+(\S+\.)?[`\"]?{re.escape(table)}[`\"]?\s*\([^)]*\)\s*VALUES",
                         re.IGNORECASE)
    return [sql for sql in seen if pattern.match(sql)]


def file_loads_into(seen: list[str], table: str) -> list[str]:
    """``INSERT INTO table (...) SELECT ... FROM read_json(...)`` statements (DuckDB's staged file)."""
    pattern = re.compile(rf"^\s*INSERT\s+INTO\s+(\S+\.)?[`\"]?{re.escape(table)}[`\"]?\s*\([^)]*\)\s*SELECT\b.*"
                         r"\bread_json\(", re.IGNORECASE | re.DOTALL)
    return [sql for sql in seen if pattern.match(sql)]


def staged_inserts(seen: list[str]) -> list[str]:
    """Rows staged by executemany (INSERT INTO a run's staging table)."""
    return [sql for sql in seen if re.match(r"^\s*INSERT\s+INTO\s+(\S+\.)?[`\"]?_?bos_stage", sql, re.IGNORECASE)]


def writes_to(seen: list[str], table: str) -> list[str]:
    """SQLAlchemy-executed statements that modify ``table`` (INSERT INTO / UPDATE; not its audit table)."""
    name = re.escape(table)
    pattern = re.compile(rf"^\s*(INSERT\s+INTO|UPDATE)\s+(\S+\.)?[`\"]?{name}[`\"]?[\s(]", re.IGNORECASE)
    return [sql for sql in seen if pattern.match(sql)]


def wire(record: dict[str, Any], wire_hash: str | None = None) -> WireRecord:
    """The record as the scanner hands it out (``from_json``), with a wire hash of its content."""
    out = WireRecord(record)
    out.wire_hash = wire_hash or hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()
    return out


def as_kind(record: dict[str, Any], kind: str) -> Any:
    """The same record as a plain dict, a WireRecord (no wire hash) or a FederatedRecord model."""
    if kind == "wire":
        return WireRecord(record)
    if kind == "model":
        return FederatedRecord.model_validate(record)
    return record


def expected_counts(records: list[dict[str, Any]]) -> UpsertCounts:
    """The counts of any load of ``records`` into an empty table."""
    distinct = len({r["record_ref"] for r in records})
    return UpsertCounts(inserted=distinct, duplicates=len(records) - distinct)


def winners(records: list[dict[str, Any]]) -> dict[str, str | None]:
    """record_ref -> display_name of the copy that must be stored: latest observed_at, ties to the last."""
    best: dict[str, tuple[str, int, str | None]] = {}
    for index, record in enumerate(records):
        observed = max(s["observed_at"] for s in record["sources"])  # all stamps share one format
        key = (observed, index, record.get("display_name"))
        best[record["record_ref"]] = max(best.get(record["record_ref"], key), key)
    return {ref: name for ref, (_, _, name) in best.items()}


def clear(engine: sa.Engine, *writers: WarehouseWriter) -> None:
    """Empty the writers' tables (creating them first if needed)."""
    for writer in writers:
        writer.ensure_tables()
    with engine.begin() as conn:
        for writer in writers:
            conn.exec_driver_sql(f"DELETE FROM {writer.table}")


def audit_row(engine: sa.Engine, writer: WarehouseWriter, run_id: str) -> dict[str, Any] | None:
    return AuditReader(engine, table=writer.audit_table).get_run(run_id)


def wait_until(condition: Callable[[], bool], what: str, *, unless: Future | None = None) -> None:
    """Poll ``condition`` until true; fail after TIMEOUT_S, or at once if ``unless`` finished first."""
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        if unless is not None and unless.done():
            unless.result()  # its exception, if it failed
            pytest.fail(f"finished before {what}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting until {what}")
        time.sleep(0.01)


def relation_locks(engine: sa.Engine, table: str) -> list[tuple[str, bool]]:
    """(mode, granted) of every lock on ``table`` (from a connection of its own)."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT mode, granted FROM pg_locks WHERE locktype = 'relation' "
                    "AND relation = to_regclass(CAST(:t AS text))"),
            {"t": table},
        ).all()
    return [(mode, granted) for mode, granted in rows]


# Values COPY text format or the fast JSON slicing could get wrong.
HOSTILE_TEXT = [
    "back\\slash", "tab\there", "new\nline", "carriage\rreturn", 'double "quotes"', "\\N", "\\", "\\\\N",
    "trailing\\", "\\t not a tab", "all \\\t\n\r\" at once", "", "Zoë Ünïcødé ß 中文", "astral 𝄞 😀 𓀀",
]


def hostile_records() -> list[Any]:
    """Hostile text in every text and JSON column, JSON null / missing / "null", floats, all record types."""
    records: list[Any] = []
    for n, text in enumerate(HOSTILE_TEXT):
        record = make_record(
            f"bos:hostile:{n}:{text}", T1, name=text, email=text, phone=text,
            lifecycle={"state": text, text: [text]}, identity_match={"note": text, "score": 0.25},
            attributes={text: text, "f": 1.5, "neg": -0.0, "big": 1e21,
                        "n": [1, 2.5, None, True, {"deep": text}]},
        )
        record["sources"][0]["external_id"] = text
        records.append([record, wire(record), FederatedRecord.model_validate(record)][n % 3])
    # JSON null vs missing vs the string "null", rotated over the five nullable columns.
    nullable = ("display_name", "email", "phone", "lifecycle", "identity_match")
    for n, kind in itertools.product(range(3), ("dict", "wire", "model")):
        record = make_record(f"bos:nulls:{n}:{kind}", T2)
        for k, field in enumerate(nullable):
            variant = (n + k) % 3
            if variant == 0:
                record[field] = None
            elif variant == 1:
                del record[field]
            else:
                record[field] = "null"
        records.append(wire(record) if kind == "wire" else as_kind(record, kind))
    # Floats, tiny ones included (1e-7 and 2.5e-5 take the general mapping path, not orjson's).
    for kind in ("dict", "wire", "model"):
        record = make_record(
            f"bos:floats:{kind}", T0,
            attributes={"tiny": 1e-7, "small": 2.5e-5, "x": 0.1, "deep": {"l": [1e-7, 3.0]}},
            identity_match={"score": 1e-7}, lifecycle={"since": 0.00001},
        )
        records.append(wire(record) if kind == "wire" else as_kind(record, kind))
    # Later copies of two hostile record_refs: these go through staging and the merge.
    later = make_record(f"bos:hostile:1:{HOSTILE_TEXT[1]}", T2, name="later \\N\t\"copy\" 😀")
    records += [later, wire(make_record(f"bos:hostile:5:{HOSTILE_TEXT[5]}", T0, name="stale copy"))]
    return records


# --- fixtures ------------------------------------------------------------------------------------


@pytest.fixture()
def copies(engine: sa.Engine, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every COPY statement sent through psycopg (COPY bypasses SQLAlchemy's statement events)."""
    seen: list[str] = []
    if engine.dialect.name != "postgresql":
        return seen
    psycopg = pytest.importorskip("psycopg")
    original = psycopg.Cursor.copy

    def spy(self, statement, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(statement if isinstance(statement, str) else statement.as_string(self))
        return original(self, statement, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "copy", spy)
    return seen


def uses_copy(engine: sa.Engine) -> bool:
    return engine.dialect.name == "postgresql"


@pytest.fixture()
def direct(make_writer: Callable[..., WarehouseWriter], engine: sa.Engine) -> WarehouseWriter:
    """A writer that loads an empty table directly (COPY on PostgreSQL, executemany elsewhere)."""
    writer = make_writer()
    if not writer.dialect.capabilities.direct_load:
        pytest.skip(NOT_DIRECT[engine.dialect.name])
    assert writer.dialect.capabilities.uses_copy == uses_copy(engine), \
        "psycopg 3 gives COPY, and COPY gives the direct load"
    return writer


@pytest.fixture()
def copy_direct(direct: WarehouseWriter) -> WarehouseWriter:
    if not direct.dialect.capabilities.uses_copy:
        pytest.skip(COPY_ONLY)
    return direct


@pytest.fixture()
def reference(
    make_writer: Callable[..., WarehouseWriter], unique_table: str, engine: sa.Engine, direct: WarehouseWriter,
) -> WarehouseWriter:
    """The same destination staged by executemany and merged: the behaviour the direct load must match."""
    options = {"use_copy": False} if uses_copy(engine) else {}
    writer = make_writer(table=f"{unique_table}_ref", audit_table=f"{unique_table}_ref_runs", **options)
    writer.ensure_tables()
    # SQLite, MySQL: the same writer with the direct load off
    writer.dialect.capabilities = replace(writer.dialect.capabilities, direct_load=False)
    return writer


def loaded_directly(writer: WarehouseWriter, copies: list[str], seen: list[str]) -> bool:
    """True if the run seen (``copies``: COPY statements, ``seen``: the others) loaded the table itself."""
    if writer.dialect.capabilities.uses_copy:
        return bool(copies_into(copies, writer.table))
    if writer.staging_method == "staged_file":
        return bool(file_loads_into(seen, writer.table))
    return bool(inserts_values_into(seen, writer.table))


def assert_same_as_reference(
    engine: sa.Engine, direct: WarehouseWriter, reference: WarehouseWriter, records: list[Any],
    copies: list[str],
) -> UpsertCounts:
    """Both writers load ``records`` into empty tables: same counts (returned), same rows."""
    del copies[:]
    with statements(engine) as seen:
        counts = write(direct, records)
    # (executemany sends nothing for no records; COPY is started anyway)
    assert loaded_directly(direct, copies, seen) or not records, "the direct load did not run"
    with statements(engine) as seen:
        assert write(reference, records) == counts
    assert not inserts_values_into(seen, reference.table), "the reference must stage and merge"
    assert stored(engine, direct.table) == stored(engine, reference.table)
    return counts


# --- 1. the direct load is what happens ------------------------------------------------------------


def test_an_empty_table_is_loaded_by_copy_into_the_table_itself(copy_direct, engine, copies):
    """A first run COPYs straight into the table: no staging, no INSERT ... SELECT into it."""
    direct = copy_direct
    with statements(engine) as seen:
        counts = write(direct, [make_record(i) for i in range(20)])
    assert counts == UpsertCounts(inserted=20)
    assert len(copies_into(copies, direct.table)) == 1
    assert copies_into(copies, direct.table)[0].rstrip().endswith("FROM STDIN")
    assert len(copies) == 1  # nothing was staged
    assert writes_to(seen, direct.table) == []
    assert len(dump(engine, direct.table)) == 20


def test_an_empty_table_is_loaded_by_inserts_into_the_table_itself(make_writer, engine):
    """Without COPY, a first run inserts batches straight into the table: nothing staged, no merge
    (MySQL/MariaDB, PostgreSQL with COPY off; SQLite stages)."""
    direct = make_writer(batch_size=7, **({"use_copy": False} if uses_copy(engine) else {}))
    with statements(engine) as seen:
        counts = write(direct, [make_record(i) for i in range(20)])
    assert counts == UpsertCounts(inserted=20)
    if not direct.dialect.capabilities.direct_load:  # measured slower there: SQLite stages even an empty table
        assert inserts_values_into(seen, direct.table) == [] and staged_inserts(seen)
        return
    if direct.staging_method == "staged_file":  # DuckDB: the staged file, read into the table itself
        assert len(file_loads_into(seen, direct.table)) == 1
        assert writes_to(seen, direct.table) == file_loads_into(seen, direct.table)
        assert staged_inserts(seen) == []
        assert len(dump(engine, direct.table)) == 20
        return
    # 20 records in batches of 7: three executemany calls, every write to the table one of them.
    assert len(inserts_values_into(seen, direct.table)) == 3
    assert writes_to(seen, direct.table) == inserts_values_into(seen, direct.table)
    assert staged_inserts(seen) == []
    assert len(dump(engine, direct.table)) == 20


def test_without_copy_hostile_values_land_exactly_as_the_staged_path_lands_them(
    make_writer, reference, engine, copies,
):
    """PostgreSQL without COPY loads an empty table by executemany too: the same rows as staging."""
    if not uses_copy(engine):
        pytest.skip("the other dialects' direct load is executemany already (the test above)")
    direct = make_writer(use_copy=False, batch_size=3)
    assert direct.dialect.capabilities.direct_load and not direct.dialect.capabilities.uses_copy
    records = hostile_records()
    assert_same_as_reference(engine, direct, reference, records, copies)
    assert copies == []


def test_a_table_with_rows_is_staged_and_merged(direct, engine, copies):
    """Once the table has rows, a run stages and merges (nothing loaded into the table itself)."""
    write(direct, [make_record(i) for i in range(10)])
    del copies[:]
    with statements(engine) as seen:
        counts = write(direct, [make_record(i, T2, name=f"renamed {i}") for i in range(5, 15)])
    assert counts == UpsertCounts(inserted=5, updated=5)
    if uses_copy(engine):
        assert copies and copies_into(copies, direct.table) == []  # COPY went to staging
    else:
        assert staged_inserts(seen) and inserts_values_into(seen, direct.table) == []
    assert writes_to(seen, direct.table)  # the merge
    assert rows_by_ref(engine, direct.table)["bos:person:000007"]["display_name"] == "renamed 7"


def test_hostile_values_land_exactly_as_the_staged_path_lands_them(direct, reference, engine, copies):
    """Escapes, nulls, non-ASCII, floats and every record type are stored byte for byte as by executemany."""
    records = hostile_records()
    counts = assert_same_as_reference(engine, direct, reference, records, copies)
    distinct = len({r["record_ref"] if isinstance(r, dict) else r.record_ref for r in records})
    assert counts == UpsertCounts(inserted=distinct, duplicates=len(records) - distinct)
    rows = rows_by_ref(engine, direct.table)
    assert rows[f"bos:hostile:1:{HOSTILE_TEXT[1]}"]["display_name"] == "later \\N\t\"copy\" 😀"
    assert rows[f"bos:hostile:5:{HOSTILE_TEXT[5]}"]["display_name"] == HOSTILE_TEXT[5]  # the stale copy lost
    assert rows["bos:hostile:5:\\N"]["email"] == "\\N"  # text, not NULL
    assert rows["bos:hostile:11:"]["display_name"] == ""  # empty, not NULL
    assert {rows[f"bos:nulls:0:{kind}"]["email"] for kind in ("dict", "wire", "model")} == {None}  # missing
    assert {rows[f"bos:nulls:1:{kind}"]["email"] for kind in ("dict", "wire", "model")} == {"null"}


def test_a_later_identical_copy_stores_the_wire_hash_the_staged_path_stores(
    direct, reference, engine, copies,
):
    """Same content twice with different wire bytes: the stored wire hash is the winning copy's."""
    records = [wire(make_record(1), "a" * 64), wire(make_record(1), "b" * 64)]
    assert_same_as_reference(engine, direct, reference, records, copies)


# --- 2.-4. duplicates and false positives: same counts, same table ------------------------------------

REFS = ["bos:person:000001", "bos:person:000002", "bos:person:000003", 'bos:odd\t\\N"ref😀']
NAMES = [None, "Ann", "Bob", "tab\tback\\slash", "\\N", "Zoë 😀"]


@st.composite
def results(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[Any]]:
    """(the records as dicts, the same records as handed to the writer: dicts, WireRecords or models)."""
    records = draw(st.lists(
        st.builds(
            lambda ref, observed, name, attributes: make_record(
                ref, observed, display_name=name, attributes=attributes,
            ),
            st.sampled_from(REFS), st.sampled_from([T0, T1, T2]), st.sampled_from(NAMES),
            st.sampled_from([{}, {"x": 1}, {"x": 1e-7}]),
        ),
        max_size=25,
    ))
    size = len(records)
    kinds = draw(st.lists(st.sampled_from(["dict", "wire", "model"]), min_size=size, max_size=size))
    return records, [as_kind(r, k) for r, k in zip(records, kinds, strict=True)]


def check_random_result(engine, direct, reference, copies, result) -> None:
    records, given_records = result
    clear(engine, direct, reference)
    counts = assert_same_as_reference(engine, direct, reference, given_records, copies)
    assert counts == expected_counts(records)
    names = {ref: row["display_name"] for ref, row in rows_by_ref(engine, direct.table).items()}
    assert names == winners(records)


# 40 generated results (marker ``repeats``): on SQLite in the fast tier, on every dialect in the full
# tier; the example-based tests of this file prove each dialect's direct load in the fast tier.
@pytest.mark.repeats
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(result=results())
def test_random_results_with_duplicates_load_like_the_staged_path(direct, reference, engine, copies, result):
    """Any mix of duplicates: inserted = distinct record_refs, the rest duplicates, the latest copy stored."""
    check_random_result(engine, direct, reference, copies, result)


def test_duplicates_beyond_the_in_memory_batch_load_like_the_staged_path(make_writer, reference, engine, copies,
                                                                         monkeypatch):
    """Many later copies (several staging rounds, the table's COPY paused and resumed) change nothing."""
    monkeypatch.setattr(loads, "_PENDING_LIMIT", 2)
    monkeypatch.setattr(file_load, "FILE_BLOCK_ROWS", 2)  # DuckDB: its files loaded every 2 lines
    direct = make_writer(batch_size=2)  # executemany: staged every 2 later copies
    records = [make_record(k % 5, [T0, T1, T2][k * 7 % 3], name=f"copy {k}") for k in range(40)]
    with statements(engine) as seen:
        counts = assert_same_as_reference(engine, direct, reference, records, copies)
    assert counts == UpsertCounts(inserted=5, duplicates=35)
    if uses_copy(engine):
        assert len(copies_into(copies, direct.table)) > 5  # the COPY was paused for staging, again and again
    else:
        assert len(staged_inserts(seen)) > 5  # many staging rounds
    names = {ref: row["display_name"] for ref, row in rows_by_ref(engine, direct.table).items()}
    assert names == winners(records)


@pytest.mark.parametrize("records", [
    pytest.param([make_record(i) for i in range(12)], id="no-duplicates"),
    pytest.param([make_record(k % 20, [T2, T0, T1][k % 3], name=f"copy {k}") for k in range(50)],
                 id="duplicates"),
])
def test_bloom_false_positives_only_take_the_staged_path(
    direct, reference, engine, copies, monkeypatch, records,
):
    """A record_ref wrongly reported "seen" is staged and merged, and still counts as inserted."""
    # An 8-bit filter: of more than 8 distinct record_refs, some first occurrences must hit a set bit.
    monkeypatch.setattr(loads.SeenKeys, "BITS", 8)
    assert len({r["record_ref"] for r in records}) > 8
    with statements(engine) as seen:
        counts = assert_same_as_reference(engine, direct, reference, records, copies)
    assert counts == expected_counts(records)
    if uses_copy(engine):
        assert len(copies) > len(copies_into(copies, direct.table))  # first occurrences went to staging too
    else:
        assert staged_inserts(seen)  # first occurrences went to staging too
    names = {ref: row["display_name"] for ref, row in rows_by_ref(engine, direct.table).items()}
    assert names == winners(records)


# --- 5.-6. errors roll everything back (every dialect; on PostgreSQL, during the direct load) ----------


def failing_stream(bad: Callable[[], Any]) -> Iterator[Any]:
    """Over 2048 records (a COPY block is sent) and later copies (a staging round), then ``bad()``."""
    for i in range(2100):
        yield make_record(i)
        if i % 500 == 0:
            yield make_record(i, T2, name="later copy")
    yield bad()
    yield make_record(9999)


def assert_nothing_written(engine, writer, copies, run_id, seen: list[str]) -> None:
    if writer.dialect.capabilities.direct_load:
        assert loaded_directly(writer, copies, seen), "the failure was meant to hit the direct load"
    assert dump(engine, writer.table) == []
    assert audit_row(engine, writer, run_id) is None


def test_a_stream_failing_midway_rolls_back_the_direct_load(make_writer, engine, copies, monkeypatch):
    """The records iterator raising leaves an empty table and no audit row; the next run loads normally."""
    monkeypatch.setattr(loads, "_PENDING_LIMIT", 2)

    def cut() -> Any:
        raise BosIncompleteStreamError("the stream ended inside the final frame")

    run = run_info()
    writer = make_writer(batch_size=500)  # executemany: several batches are in the table when it fails
    with statements(engine) as seen, pytest.raises(BosIncompleteStreamError, match="final frame"):
        write(writer, failing_stream(cut), run)
    assert_nothing_written(engine, writer, copies, run.run_id, seen)
    assert write(writer, [make_record(i) for i in range(10)]) == UpsertCounts(inserted=10)
    assert len(dump(engine, writer.table)) == 10


def _no_record_ref() -> dict[str, Any]:
    record = make_record(5000)
    del record["record_ref"]
    return record


def _no_observed_at() -> dict[str, Any]:
    record = make_record(5000)
    del record["sources"][0]["observed_at"]
    return record


@pytest.mark.parametrize("kind", ["dict", "wire"])
@pytest.mark.parametrize(("bad", "message"), [
    pytest.param(_no_record_ref, "no record_ref", id="no-record_ref"),
    pytest.param(_no_observed_at, "no sources\\[\\].observed_at", id="no-observed_at"),
])
def test_a_bad_record_midway_rolls_back_the_direct_load(
    make_writer, engine, copies, monkeypatch, bad, message, kind,
):
    """A record that cannot be mapped fails the run with its reason; nothing is written."""
    monkeypatch.setattr(loads, "_PENDING_LIMIT", 2)
    writer = make_writer(batch_size=500)
    run = run_info()
    with statements(engine) as seen, pytest.raises(BosWarehouseError, match=message):
        write(writer, failing_stream(lambda: as_kind(bad(), kind)), run)
    assert_nothing_written(engine, writer, copies, run.run_id, seen)
    assert write(writer, [make_record(i) for i in range(3)]) == UpsertCounts(inserted=3)


def test_a_known_record_claim_on_an_empty_table_fails_the_run(make_writer, engine, copies, monkeypatch):
    """A KnownRecord for a row that no longer exists cannot be written: the run fails, asking for a re-run."""
    monkeypatch.setattr(file_load, "FILE_BLOCK_ROWS", 2)  # DuckDB: rows are in the table when the claim comes
    writer = make_writer(batch_size=2)
    claim = KnownRecord("bos:person:000777", "f" * 64)
    records = [make_record(i) for i in range(5)] + [claim, make_record(6)]
    run = run_info()
    with statements(engine) as seen, pytest.raises(BosWarehouseError, match="Re-run the task"):
        write(writer, iter(records), run)
    assert_nothing_written(engine, writer, copies, run.run_id, seen)


def test_a_value_the_database_refuses_during_copy_is_a_warehouse_error(copy_direct, engine, copies):
    """PostgreSQL text cannot hold NUL: the COPY's own error arrives as BosWarehouseError, no row data in it."""
    run = run_info()
    records = [make_record(i) for i in range(3)] + [make_record(3, name="secret\x00name")]
    with statements(engine) as seen, pytest.raises(BosWarehouseError, match="rolled back") as caught:
        write(copy_direct, records, run)
    assert "secret" not in str(caught.value)
    assert_nothing_written(engine, copy_direct, copies, run.run_id, seen)


# --- 7. a concurrent writer waits, then takes the staged path -------------------------------------------


def test_a_second_writer_waits_for_the_direct_load_then_finds_the_rows(copy_direct, engine, copies):
    """Two runs into one empty table: the first loads it, the second (same records) finds them unchanged."""
    direct = copy_direct
    records = [make_record(i) for i in range(20)]
    other = sa.create_engine(engine.url)  # the second writer's own connections, and one to watch pg_locks
    paused, release = threading.Event(), threading.Event()

    def first_stream() -> Iterator[dict[str, Any]]:
        for k, record in enumerate(records):
            if k == 3:  # mid-stream, the table's COPY open and the lock held
                paused.set()
                if not release.wait(TIMEOUT_S):
                    raise RuntimeError("the test never released the first writer")
            yield record

    try:
        second = WarehouseWriter(other, table=direct.table, audit_table=direct.audit_table,
                                 lock_timeout_s=TIMEOUT_S)
        direct.ensure_tables()
        second.ensure_tables()
        with ThreadPoolExecutor(max_workers=2) as pool:
            try:
                first_run = pool.submit(write, direct, first_stream())
                wait_until(paused.is_set, "the first writer is mid-stream", unless=first_run)
                # the lock was taken before the stream
                assert ("ShareRowExclusiveLock", True) in relation_locks(other, direct.table)
                second_run = pool.submit(write, second, records)
                wait_until(lambda: ("ShareRowExclusiveLock", False) in relation_locks(other, direct.table),
                           "the second writer waits for the lock", unless=second_run)
            finally:
                release.set()
            first_counts, second_counts = first_run.result(TIMEOUT_S), second_run.result(TIMEOUT_S)
    finally:
        other.dispose()

    assert first_counts == UpsertCounts(inserted=20)
    assert second_counts == UpsertCounts(unchanged=20)
    assert len(copies_into(copies, direct.table)) == 1  # the second staged: it saw the rows under the lock
    rows = rows_by_ref(engine, direct.table)
    assert len(rows) == 20
    assert len({row["_bos_run_id"] for row in rows.values()}) == 1  # all the first run's
