"""pii-apply reads a table and its history a round at a time (a batch of refs and their versions), and on
PostgreSQL applies one round's updates while it changes the next: rounds of any size rewrite every row
exactly as one round does, and a failure in a round's update rolls everything back (every dialect)."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import orjson
import pytest
import sqlalchemy as sa

import airflow_provider_bos.warehouse.upkeep.policy_rewrite as policy_rewrite
from airflow_provider_bos.exceptions import BosWarehouseError
from airflow_provider_bos.warehouse.tables.records import JSON_CONTENT_FIELDS
from airflow_provider_bos.warehouse.tables.schema import companion_table_name
from airflow_provider_bos.warehouse.upkeep.pii_apply import apply_stricter_policy
from tests.warehouse.pii_helpers import HISTORY, KEY, STRICT, person, write_under
from tests.warehouse.whhelpers import T2, reflect

#: What pii-apply rewrites in a row, beside the row's key.
REWRITTEN = ("display_name", "email", "phone", "lifecycle", "identity_match", "attributes", "sources",
             "_bos_record_hash")
#: The ref whose row is deleted from the records table: its versions are left alone in the history.
VERSIONS_ONLY = 7


def write_days(writer) -> None:
    """Twelve people, four of them changed a day later (two versions each), one of whom then has only
    versions (its row deleted from the records table, in the middle of the refs' order)."""
    write_under(writer, None, [person(i) for i in range(1, 13)], reconcile=HISTORY)
    write_under(writer, None, [person(i, observed_at=T2, email=f"changed{i}@example.com") for i in (2, 5, 7, 11)],
                reconcile=HISTORY)
    records = reflect(writer.engine, writer.table)
    with writer.engine.begin() as conn:
        conn.execute(sa.delete(records).where(records.c.record_ref == person(VERSIONS_ONLY)["record_ref"]))


def rewritten(engine: sa.Engine, table: str) -> dict[str, list[tuple[Any, ...]]]:
    """Each row's rewritten columns (wire hash too where the table has it), sorted, per table (a version's
    valid-from left out: it is the time each table was written)."""
    found = {}
    for name in (table, companion_table_name(table, "history")):
        t = reflect(engine, name)
        columns = [c for c in (*REWRITTEN, "_bos_wire_hash") if c in t.c]
        with engine.connect() as conn:
            rows = conn.execute(sa.select(t.c.record_ref, *(t.c[c] for c in columns))).all()
        found[name.removeprefix(table)] = sorted(repr(tuple(row)) for row in rows)
    return found


def apply(engine: sa.Engine, writer) -> Any:
    return apply_stricter_policy(engine, table=writer.table, audit_table=writer.audit_table, policy=STRICT, key=KEY)


@pytest.mark.parametrize(("batch", "first_batch"), [(1, 1), (2, 2), (5, 5), (3, 1), (5, 2)])
def test_rounds_of_any_size_rewrite_what_one_round_does(make_writer, engine, unique_table, monkeypatch,
                                                        batch, first_batch) -> None:
    one_round = make_writer()
    in_rounds = make_writer(table=f"{unique_table}_r", audit_table=f"{unique_table}_r_runs")
    for writer in (one_round, in_rounds):
        write_days(writer)
    before = rewritten(engine, in_rounds.table)
    assert rewritten(engine, one_round.table) == before

    whole = apply(engine, one_round)
    monkeypatch.setattr(policy_rewrite, "BATCH", batch)
    monkeypatch.setattr(policy_rewrite, "FIRST_BATCH", first_batch)  # where rounds are read by key ranges
    read = policy_rewrite.rows_in_batches
    rounds_read: list[int] = []  # the records table's rows of each round read by key ranges

    def counted(conn, table, *args, **kwargs):
        for rows in read(conn, table, *args, **kwargs):
            if table.name == in_rounds.table:
                rounds_read.append(len(rows))
            yield rows

    monkeypatch.setattr(policy_rewrite, "rows_in_batches", counted)
    rounds = apply(engine, in_rounds)

    assert (rounds.records, rounds.history) == (whole.records, whole.history) == (11, 16)
    if engine.dialect.name != "duckdb":  # DuckDB cuts its rounds from one ordered pass
        assert rounds_read[0] == first_batch and set(rounds_read[1:-1]) <= {batch} and sum(rounds_read) == 11
    after = rewritten(engine, in_rounds.table)
    assert after == rewritten(engine, one_round.table)
    assert after != before
    history = reflect(engine, companion_table_name(in_rounds.table, "history"))
    with engine.connect() as conn:
        emails = set(conn.execute(sa.select(history.c.email)).scalars())
    assert not any("@" in (email or "") for email in emails)  # every version's email hashed, none left raw


@pytest.mark.parametrize("warehouse_url", ["duckdb"], indirect=True)
@pytest.mark.parametrize("file_rows", [1, 3])
def test_duckdb_applies_its_staged_rows_a_file_of_at_most_file_rows_at_a_time(make_writer, engine, unique_table,
                                                                              monkeypatch, file_rows) -> None:
    """One UPDATE over every rewritten row of a large table runs DuckDB out of its memory limit: the
    rows go back in files of at most ``FILE_ROWS``, each its own UPDATE, and rewrite every row and
    version (alike or not) exactly as one file does."""
    one_file = make_writer()
    in_files = make_writer(table=f"{unique_table}_f", audit_table=f"{unique_table}_f_runs")
    for writer in (one_file, in_files):
        write_days(writer)
    whole = apply(engine, one_file)

    staged: list[int] = []
    lines_of = policy_rewrite._FileUpdates._apply

    def counted(self, kind, file) -> None:
        staged.append(sum(1 for _ in file.path.open("rb")))
        lines_of(self, kind, file)

    monkeypatch.setattr(policy_rewrite, "FILE_ROWS", file_rows)
    monkeypatch.setattr(policy_rewrite, "BATCH", 2)  # a file filled over several rounds
    monkeypatch.setattr(policy_rewrite._FileUpdates, "_apply", counted)
    in_pieces = apply(engine, in_files)

    assert (in_pieces.records, in_pieces.history) == (whole.records, whole.history) == (11, 16)
    assert rewritten(engine, in_files.table) == rewritten(engine, one_file.table)
    # the 11 rows and the 5 versions unlike a row (the other 11 follow their row in the database)
    assert sum(staged) == 11 + 5 and max(staged) == file_rows and len(staged) > 2


@pytest.mark.parametrize("warehouse_url", ["duckdb"], indirect=True)
def test_duckdb_leaves_a_column_no_row_changed_as_stored(make_writer, engine) -> None:
    """DuckDB holds what an open transaction's UPDATE sets in memory until the commit: a column the
    policy changes in no row (here ``lifecycle``) is not set again, and keeps its stored text."""
    writer = make_writer()
    write_under(writer, None, [person(i) for i in range(1, 5)], reconcile=HISTORY)
    records = reflect(engine, writer.table)
    spelled = '{ "state" :  "active" }'  # the same value as the writer's text, spelled otherwise
    with engine.begin() as conn:
        conn.execute(sa.update(records).where(records.c.record_ref == person(2)["record_ref"])
                     .values(lifecycle=sa.cast(sa.bindparam("l", spelled, type_=sa.Text()), records.c.lifecycle.type)))
        before = dict(conn.execute(sa.select(records.c.record_ref, sa.cast(records.c.lifecycle, sa.Text()))).all())

    assert apply(engine, writer).records == 4
    with engine.connect() as conn:
        after = dict(conn.execute(sa.select(records.c.record_ref, sa.cast(records.c.lifecycle, sa.Text()))).all())
        emails = list(conn.execute(sa.select(records.c.email)).scalars())
    assert after == before and before[person(2)["record_ref"]] == spelled
    assert not any("@" in email for email in emails)  # the columns the policy changes were set


def test_values_that_text_formats_escape_go_back_unchanged(make_writer, engine) -> None:
    """A kept value holding what a text COPY or a JSON line escapes (tab, newline, backslash, ``\\N``,
    a quote, a character beyond ASCII) comes back from the rewrite as it was, in the records table and
    its history; the values the policy changes are changed."""
    writer = make_writer()
    kept = 'a\tb\nc\\d \\N "q" \u00e9\u4e2d \\'
    write_under(writer, None, [person(i, attributes={"dept": kept, "private": {"home": f"Street\t{i}"}})
                               for i in (1, 2)], reconcile=HISTORY)
    assert apply(engine, writer).records == 2
    for name in (writer.table, companion_table_name(writer.table, "history")):
        t = reflect(engine, name)
        with engine.connect() as conn:
            stored = conn.execute(sa.select(t.c.attributes, t.c.email)).all()
        attributes = [orjson.loads(a) if isinstance(a, str) else a for a, _ in stored]
        assert [a["dept"] for a in attributes] == [kept, kept], name
        assert not any("private" in a for a in attributes)  # dropped by the policy
        assert not any("@" in email for _, email in stored), name


def test_a_failed_round_update_rolls_every_round_back(make_writer, engine, monkeypatch) -> None:
    writer = make_writer()
    write_days(writer)
    before = rewritten(engine, writer.table)
    applied: list[tuple[Any, Any]] = []
    apply_staged = policy_rewrite._apply_staged

    def lost_connection_at_the_third_round(targets, fields, within) -> None:
        applied.append(within)
        if len(applied) == 3:
            raise sa.exc.OperationalError("UPDATE ...", {}, Exception("server closed the connection"))
        apply_staged(targets, fields, within)

    monkeypatch.setattr(policy_rewrite, "BATCH", 2)
    monkeypatch.setattr(policy_rewrite, "_apply_staged", lost_connection_at_the_third_round)
    with pytest.raises(BosWarehouseError, match="rolled back"):
        apply(engine, writer)
    assert len(applied) == 3
    assert rewritten(engine, writer.table) == before

    monkeypatch.setattr(policy_rewrite, "_apply_staged", apply_staged)
    assert apply(engine, writer).records == 11


def earlier_version(engine: sa.Engine, history: sa.Table, ref: str, **changed: str) -> None:
    """Add a version of ``ref`` a day before its only one, stored as that one is but for ``changed``
    (a JSON column's value as its JSON text). Copied by the database, so every other value keeps its
    stored form: a NULL stays NULL (not JSON null), a JSON text keeps its spelling."""
    json_type = history.c.sources.type if engine.dialect.name != "sqlite" else None  # SQLite keeps the text
    with engine.begin() as conn:
        valid_from = conn.execute(sa.select(history.c._bos_valid_from).where(history.c.record_ref == ref)).scalar_one()

        def value(column: sa.Column[Any]) -> Any:
            if column.name == "_bos_valid_from":
                return sa.bindparam(None, valid_from - timedelta(days=1), type_=column.type)
            if column.name not in changed:
                return column
            bound = sa.bindparam(None, changed[column.name], type_=sa.Text())
            return sa.cast(bound, json_type) if column.name in JSON_CONTENT_FIELDS and json_type is not None else bound

        copied = sa.select(*(value(c) for c in history.c)).where(history.c.record_ref == ref)
        conn.execute(sa.insert(history).from_select([c.name for c in history.c], copied))


def test_a_version_is_given_its_rows_new_values_only_when_it_stores_the_rows_content(make_writer, engine,
                                                                                     monkeypatch) -> None:
    """A version that stores its ref's row's content takes that row's new values (on PostgreSQL and
    DuckDB from what is staged for the row, never read here); one that differs, even only in a value
    its content hash and observation time do not show, is rewritten from its own content."""
    writer = make_writer()
    write_under(writer, None, [person(i) for i in range(1, 4)], reconcile=HISTORY)
    history = reflect(engine, companion_table_name(writer.table, "history"))
    ref = person(2)["record_ref"]
    sources = person(2)["sources"]
    sources[0]["external_id"] = "ext-earlier"
    earlier_version(engine, history, ref, phone="+49 30 55555", sources=orjson.dumps(sources).decode())
    transformed: list[tuple[str, Any]] = []
    batch = policy_rewrite._Rewrite.batch

    def counted(self, target, rows, memo):
        transformed.extend((target.table.name, row["record_ref"]) for row in rows)
        return batch(self, target, rows, memo)

    monkeypatch.setattr(policy_rewrite._Rewrite, "batch", counted)
    applied = apply(engine, writer)

    assert (applied.records, applied.history) == (3, 4)
    plan = STRICT.plan(KEY)
    expected_earlier = plan.apply({"phone": "+49 30 55555", "sources": sources})
    records = reflect(engine, writer.table)
    with engine.connect() as conn:
        versions = conn.execute(sa.select(history).where(history.c.record_ref == ref)
                                .order_by(history.c._bos_valid_from)).all()
        row = conn.execute(sa.select(records).where(records.c.record_ref == ref)).one()
    stored_earlier, stored_current = versions
    assert stored_earlier.phone == expected_earlier["phone"] != row.phone
    assert "ext-earlier" not in repr(stored_earlier.sources)
    assert repr(stored_earlier.sources) != repr(row.sources)
    assert [stored_current.phone, repr(stored_current.sources), stored_current._bos_record_hash] == [
        row.phone, repr(row.sources), row._bos_record_hash]
    versions_read = [r for name, r in transformed if name == history.name]
    if engine.dialect.name in ("postgresql", "duckdb"):
        assert versions_read == [ref]  # only the version unlike its row
    else:
        assert sorted(versions_read) == sorted([person(i)["record_ref"] for i in range(1, 4)] + [ref])


def test_versions_counted_while_the_next_round_is_changed_are_all_counted(make_writer, engine, monkeypatch) -> None:
    """On PostgreSQL a round's updates run while the next round is changed here: the versions the
    database updates and the versions changed here are both counted, whichever lands first. Forced:
    each round's update of the versions alike is under way while the next round's versions are
    changed here, and returns only after that."""
    writer = make_writer()
    write_under(writer, None, [person(i) for i in range(1, 7)], reconcile=HISTORY)
    write_under(writer, None, [person(i, observed_at=T2, email=f"changed{i}@example.com") for i in range(1, 7)],
                reconcile=HISTORY)
    turn = threading.Condition()
    version_batches, alike_updates = [0], [0]  # versions changed here; updates of versions alike begun
    batch, execute = policy_rewrite._Rewrite.batch, policy_rewrite.execute
    history = companion_table_name(writer.table, "history")
    on_worker = engine.dialect.name == "postgresql"  # elsewhere the updates run after every round is read

    def counted_batch(self, target, rows, memo):
        if target.table.name != history:
            return batch(self, target, rows, memo)
        with turn:  # from the second round on: while the update of the round before is under way
            assert not on_worker or turn.wait_for(lambda: alike_updates[0] >= version_batches[0], timeout=60)
        changed = batch(self, target, rows, memo)
        with turn:
            version_batches[0] += 1
            turn.notify_all()
        return changed

    def waiting_execute(conn, statement):
        alike = (statement.sql.startswith(f"UPDATE {engine.dialect.identifier_preparer.quote(history)}")
                 and " JOIN " in statement.sql)
        if alike and threading.current_thread() is not threading.main_thread() and alike_updates[0] < 2:
            with turn:  # rounds 1 and 2: returns once the next round's versions are changed here
                alike_updates[0] += 1
                turn.notify_all()
                assert turn.wait_for(lambda: version_batches[0] > alike_updates[0], timeout=60)
        return execute(conn, statement)

    monkeypatch.setattr(policy_rewrite._Rewrite, "batch", counted_batch)
    monkeypatch.setattr(policy_rewrite, "execute", waiting_execute)
    monkeypatch.setattr(policy_rewrite, "BATCH", 2)
    applied = apply(engine, writer)

    assert (applied.records, applied.history) == (6, 12)
    assert alike_updates[0] == (2 if on_worker else 0)  # the interleaving above did happen


def _two_sources(i: int) -> list[dict[str, Any]]:
    entry = person(i)["sources"][0]
    return [entry, {**entry, "source_type": "hr", "source_identity": "hr-de", "external_id": f"hr-{i}"}]


def _versions_read(monkeypatch, history: str) -> list[str]:
    """The refs of the versions of ``history`` that pii-apply reads and changes here, as it goes."""
    read: list[str] = []
    batch = policy_rewrite._Rewrite.batch

    def counted(self, target, rows, memo):
        read.extend(row["record_ref"] for row in rows if target.table.name == history)
        return batch(self, target, rows, memo)

    monkeypatch.setattr(policy_rewrite._Rewrite, "batch", counted)
    return read


def test_a_version_in_another_order_of_sources_is_rewritten_from_its_own(make_writer, engine, monkeypatch) -> None:
    """The content hash leaves the order of ``sources`` out: a version whose entries come in another
    order than its row's has the row's hash, but is its own content, rewritten in its own order."""
    writer = make_writer()
    write_under(writer, None, [person(i, sources=_two_sources(i)) for i in (1, 2)], reconcile=HISTORY)
    history = reflect(engine, companion_table_name(writer.table, "history"))
    ref = person(2)["record_ref"]
    with engine.connect() as conn:
        stored = conn.execute(sa.select(history.c.sources).where(history.c.record_ref == ref)).scalar_one()
    reordered = (orjson.loads(stored) if isinstance(stored, str) else stored)[::-1]
    earlier_version(engine, history, ref, sources=orjson.dumps(reordered).decode())
    read = _versions_read(monkeypatch, history.name)
    applied = apply(engine, writer)

    assert (applied.records, applied.history) == (2, 3)
    with engine.connect() as conn:
        earlier, latest = conn.execute(sa.select(history.c.sources, history.c._bos_record_hash)
                                       .where(history.c.record_ref == ref).order_by(history.c._bos_valid_from)).all()

    def types(sources: Any) -> list[str]:
        return [e["source_type"] for e in (orjson.loads(sources) if isinstance(sources, str) else sources)]

    assert types(earlier.sources) == [e["source_type"] for e in reordered] == types(latest.sources)[::-1]
    assert earlier._bos_record_hash == latest._bos_record_hash  # the same content, in another order
    assert "hr-2" not in repr(earlier.sources)  # its ids hashed all the same
    assert read.count(ref) == (1 if engine.dialect.name in ("postgresql", "duckdb") else 2)


def test_a_version_alike_a_row_the_policy_leaves_alone_is_neither_read_nor_counted(make_writer, engine,
                                                                                   monkeypatch) -> None:
    writer = make_writer()
    write_under(writer, None, [person(1), person(2, email=None)], reconcile=HISTORY)
    history = reflect(engine, companion_table_name(writer.table, "history"))
    unchanged = person(2)["record_ref"]
    with engine.connect() as conn:
        before = conn.execute(sa.select(history).where(history.c.record_ref == unchanged)).one()
    read = _versions_read(monkeypatch, history.name)
    applied = apply_stricter_policy(engine, table=writer.table, audit_table=writer.audit_table,
                                    policy={"email": "hash"}, key=KEY)

    assert (applied.records, applied.history) == (1, 1)
    with engine.connect() as conn:
        assert conn.execute(sa.select(history).where(history.c.record_ref == unchanged)).one() == before
    assert read == ([] if engine.dialect.name in ("postgresql", "duckdb") else [person(1)["record_ref"], unchanged])
