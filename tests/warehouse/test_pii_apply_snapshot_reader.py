"""pii-apply on PostgreSQL reads its rounds on a second connection that imports the transaction's
snapshot (:mod:`airflow_provider_bos.warehouse.upkeep.snapshot_reader`), while the transaction
updates: what that connection sees, where it comes from, and what happens when it is refused."""

from __future__ import annotations

import logging
import threading
import time
import uuid

import pytest
import sqlalchemy as sa

import airflow_provider_bos.warehouse.upkeep.policy_rewrite as policy_rewrite
from airflow_provider_bos.exceptions import BosWarehouseError
from airflow_provider_bos.warehouse.dialects import dialect_for
from airflow_provider_bos.warehouse.dialects.upkeep_sql import import_snapshot, update_from_staged
from airflow_provider_bos.warehouse.tables.schema import companion_table_name
from airflow_provider_bos.warehouse.upkeep.pii_apply import apply_stricter_policy
from airflow_provider_bos.warehouse.upkeep.snapshot_reader import exported_snapshot, reader_on_snapshot
from airflow_provider_bos.warehouse.writer import WarehouseWriter
from tests.warehouse.pii_helpers import HISTORY, KEY, STRICT, person, write_under
from tests.warehouse.whhelpers import reflect


@pytest.fixture()
def application_name() -> str:
    return f"bos-test-{uuid.uuid4().hex[:10]}"


@pytest.fixture()
def pg_engine(postgres_url: str, application_name: str):
    # One pooled connection, as the tests' writers have: the reader must not wait for the caller's pool.
    engine = sa.create_engine(postgres_url, pool_size=1, max_overflow=0, pool_timeout=2,
                              connect_args={"application_name": application_name})
    try:
        yield engine
    finally:
        engine.dispose()


@pytest.mark.parametrize("isolation", ["READ COMMITTED", "AUTOCOMMIT"], ids=["engine-default", "engine-autocommit"])
def test_the_reader_sees_the_tables_as_the_transaction_saw_them_when_it_was_opened(postgres_url, unique_table,
                                                                                   isolation) -> None:
    # Whatever the engine's isolation level, the reader imports the snapshot (it needs REPEATABLE READ).
    engine = sa.create_engine(postgres_url, pool_size=1, max_overflow=0, pool_timeout=2, isolation_level=isolation)
    other = sa.create_engine(postgres_url, poolclass=sa.pool.NullPool)
    with other.begin() as conn:
        conn.exec_driver_sql(f"CREATE TABLE {unique_table} (k TEXT PRIMARY KEY, v TEXT)")
        conn.exec_driver_sql(f"INSERT INTO {unique_table} VALUES ('a', 'before')")
    dialect = dialect_for(engine)
    try:
        with engine.connect().execution_options(isolation_level="READ COMMITTED") as conn, conn.begin():
            snapshot = exported_snapshot(conn, dialect)
            with reader_on_snapshot(engine, dialect, snapshot, tables=[(unique_table, None)]) as reader:
                conn.exec_driver_sql(f"UPDATE {unique_table} SET v = 'after' WHERE k = 'a'")  # the transaction's write
                with other.begin() as committed:  # another's, committed after the export
                    committed.exec_driver_sql(f"INSERT INTO {unique_table} VALUES ('b', 'committed later')")
                seen = reader.exec_driver_sql(f"SELECT k, v FROM {unique_table} ORDER BY k").all()
                with pytest.raises(sa.exc.InternalError, match="read-only transaction"):
                    reader.exec_driver_sql(f"DELETE FROM {unique_table}")
            assert conn.exec_driver_sql(f"SELECT v FROM {unique_table} WHERE k = 'a'").scalar_one() == "after"
        assert [tuple(row) for row in seen] == [("a", "before")]
    finally:
        with other.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {unique_table}")
        other.dispose()
        engine.dispose()


def test_the_reader_is_a_connection_of_its_own_made_as_the_engines_and_closed_after(pg_engine, people,
                                                                                      application_name) -> None:
    count = sa.text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :app")
    dialect = dialect_for(pg_engine)
    with pg_engine.connect() as conn, conn.begin():  # the pool's one connection, held
        with reader_on_snapshot(pg_engine, dialect, exported_snapshot(conn, dialect),
                                tables=[(people.table, None)]) as reader:
            # The engine's connect arguments (here its application name) reach the reader's connection.
            assert reader.execute(count, {"app": application_name}).scalar_one() == 2
            driver = reader.connection.driver_connection
        assert driver is not None and driver.closed


def test_a_malformed_snapshot_id_is_refused_before_it_reaches_sql() -> None:
    dialect = dialect_for(sa.create_engine("postgresql+psycopg://u@localhost/db"))
    assert [s.sql for s in import_snapshot(dialect, "00000003-0000001B-1")][-1] == \
        "SET TRANSACTION SNAPSHOT '00000003-0000001B-1'"
    with pytest.raises(ValueError, match="not a snapshot id"):
        import_snapshot(dialect, "1'; DROP TABLE t; --")


def test_the_first_rounds_update_is_bounded_below_like_every_other_round() -> None:
    """On a table without statistics PostgreSQL takes a range open below for a third of the table, and
    planned the first round's update of the versions as a scan of the staged rows for each version
    (3.2 s of a 50,000-row pii-apply's 6.3 s): that round is bounded below by ``>= ''`` (every text is),
    the history and the records table alike, so every round is planned through the key's index."""
    dialect = dialect_for(sa.create_engine("postgresql+psycopg://u@localhost/db"))

    def update(within: tuple[str | None, str | None]) -> tuple[str, tuple[object, ...]]:
        statement = update_from_staged(dialect, "people_history", None, "staged", key=("record_ref", "_bos_valid_from"),
                                       columns=("email",), json_columns=(), within=within, alike_in="people")
        return statement.sql, tuple(statement.params)

    sql, params = update((None, "ref-5"))
    assert "t.record_ref >= %s" in sql and "m.record_ref >= %s" in sql
    assert params == ("", "", "ref-5", "ref-5")
    sql, params = update(("ref-5", "ref-9"))
    assert ">=" not in sql and params == ("ref-5", "ref-5", "ref-9", "ref-9")
    sql, params = update(("ref-9", None))  # the versions after the last row's ref
    assert params == ("ref-9", "ref-9") and "<=" not in sql
    assert update((None, None))[1] == ()  # one round: the whole table


def test_pii_apply_reads_on_its_own_connection_when_a_second_one_is_refused(postgres_url, unique_table,
                                                                             caplog) -> None:
    # A role allowed one connection: the transaction's. pii-apply still rewrites everything.
    role = f"bos_one_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(postgres_url, poolclass=sa.pool.NullPool, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 1")
        conn.exec_driver_sql(f"GRANT CREATE ON SCHEMA public TO {role}")
    engine = sa.create_engine(sa.make_url(postgres_url).set(username=role), pool_size=1, max_overflow=0)
    try:
        writer = WarehouseWriter(engine, table=unique_table, audit_table=f"{unique_table}_runs")
        write_under(writer, None, [person(i) for i in range(1, 6)], reconcile=HISTORY)
        with caplog.at_level(logging.WARNING, logger="airflow_provider_bos.warehouse.upkeep.policy_rewrite"):
            applied = apply_stricter_policy(engine, table=unique_table, audit_table=f"{unique_table}_runs",
                                            policy=STRICT, key=KEY)
        assert (applied.records, applied.history) == (5, 5)
        assert "was refused" in caplog.text and "too many connections" in caplog.text
        for name in (unique_table, companion_table_name(unique_table, "history")):
            table = reflect(engine, name)
            with engine.connect() as conn:
                emails = conn.execute(sa.select(table.c.email)).scalars().all()
            assert len(emails) == 5 and not any("@" in (email or "") for email in emails)
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP OWNED BY {role}")
            conn.exec_driver_sql(f"DROP ROLE {role}")
        admin.dispose()


def _people(engine: sa.Engine, table: str, count: int = 5) -> WarehouseWriter:
    writer = WarehouseWriter(engine, table=table, audit_table=f"{table}_runs")
    write_under(writer, None, [person(i) for i in range(1, count + 1)], reconcile=HISTORY)
    return writer


def _stored(engine: sa.Engine, table: str) -> list[tuple[object, ...]]:
    found = []
    for name in (table, companion_table_name(table, "history")):
        t = reflect(engine, name)
        with engine.connect() as conn:
            found += sorted(tuple(row) for row in conn.execute(sa.select(t.c.record_ref, t.c.email, t.c.phone)))
    return found


@pytest.fixture()
def people(pg_engine, unique_table):
    writer = _people(pg_engine, unique_table)
    yield writer
    pg_engine.dispose()
    with pg_engine.begin() as conn:
        for suffix in ("", "_runs", "_history", "_lineage", "_sources", "_columns", "_rejects", "_policy"):
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {unique_table}{suffix}")


def _apply(writer: WarehouseWriter):
    return apply_stricter_policy(writer.engine, table=writer.table, audit_table=writer.audit_table,
                                 policy=STRICT, key=KEY)


def test_pii_apply_reads_its_rounds_on_a_connection_beside_its_transactions(people, monkeypatch, caplog) -> None:
    exporting, reading = [], []
    export, rounds = policy_rewrite.exported_snapshot, policy_rewrite._rounds_by_key
    # Each records the driver's connection it was given: the transaction's, the reads'.
    monkeypatch.setattr(policy_rewrite, "exported_snapshot",
                        lambda conn, d: exporting.append(conn.connection.driver_connection) or export(conn, d))
    monkeypatch.setattr(policy_rewrite, "_rounds_by_key",
                        lambda conn, *args: reading.append(conn.connection.driver_connection) or rounds(conn, *args))
    with caplog.at_level(logging.WARNING, logger="airflow_provider_bos.warehouse.upkeep.policy_rewrite"):
        applied = _apply(people)
    assert (applied.records, applied.history) == (5, 5)
    assert len(exporting) == len(reading) == 1 and reading[0] is not exporting[0]
    assert "was refused" not in caplog.text


def test_a_read_that_fails_beside_the_transaction_rolls_every_round_back(people, pg_engine, monkeypatch) -> None:
    before = _stored(pg_engine, people.table)
    batches = policy_rewrite.rows_in_batches
    calls = []

    def lost_connection_at_the_third_read(*args, **kwargs):
        calls.append(threading.current_thread().name)
        if len(calls) == 3:
            raise sa.exc.OperationalError("SELECT ...", {}, Exception("server closed the connection"))
        yield from batches(*args, **kwargs)

    monkeypatch.setattr(policy_rewrite, "BATCH", 1)
    monkeypatch.setattr(policy_rewrite, "rows_in_batches", lost_connection_at_the_third_read)
    with pytest.raises(BosWarehouseError, match="rolled back"):
        _apply(people)
    assert len(calls) == 3 and calls[-1].startswith("bos-pii-read")
    assert _stored(pg_engine, people.table) == before


def test_a_lock_request_queued_on_the_table_makes_pii_apply_read_on_its_own_connection(people, postgres_url,
                                                                                         monkeypatch, caplog) -> None:
    # An ALTER TABLE issued while pii-apply holds the writers' lock waits for it; a reader queued behind
    # that request would wait too, and pii-apply for the reader: the reader takes its locks at once or not.
    other = sa.create_engine(postgres_url, poolclass=sa.pool.NullPool)
    altered: list[BaseException | None] = []

    def alter() -> None:
        try:
            with other.begin() as conn:
                conn.exec_driver_sql("SET LOCAL lock_timeout = '60s'")
                conn.exec_driver_sql(f"ALTER TABLE {people.table} ADD COLUMN note TEXT")
            altered.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            altered.append(exc)

    waiting = sa.text("SELECT count(*) FROM pg_locks WHERE relation = CAST(:t AS regclass) AND NOT granted")
    export = policy_rewrite.exported_snapshot
    alterer = threading.Thread(target=alter)

    def export_once_an_alter_waits(conn, dialect):
        alterer.start()
        deadline = time.monotonic() + 30
        with other.connect() as probe:
            while not probe.execute(waiting, {"t": people.table}).scalar_one():
                assert time.monotonic() < deadline, "the ALTER TABLE never queued for its lock"
                probe.rollback()
        return export(conn, dialect)

    monkeypatch.setattr(policy_rewrite, "exported_snapshot", export_once_an_alter_waits)
    try:
        with caplog.at_level(logging.WARNING, logger="airflow_provider_bos.warehouse.upkeep.policy_rewrite"):
            applied = _apply(people)
        alterer.join(timeout=60)
        assert (applied.records, applied.history) == (5, 5)
        assert "was refused" in caplog.text and "could not obtain lock" in caplog.text
        assert altered == [None]  # it ran once pii-apply had committed
    finally:
        other.dispose()
