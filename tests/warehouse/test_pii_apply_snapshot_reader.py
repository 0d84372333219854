"""pii-apply on PostgreSQL reads its rounds on a second connection that imports the transaction's
snapshot (:mod:`airflow_provider_bos.warehouse.upkeep.snapshot_reader`), while the transaction
updates: what that connection sees, where it comes from, and what happens when it is refused."""

from __future__ import annotations

import logging
import uuid

import pytest
import sqlalchemy as sa

from airflow_provider_bos.warehouse.dialects import dialect_for
from airflow_provider_bos.warehouse.dialects.upkeep_sql import import_snapshot
from airflow_provider_bos.warehouse.tables.schema import companion_table_name
from airflow_provider_bos.warehouse.upkeep.pii_apply import apply_stricter_policy
from airflow_provider_bos.warehouse.upkeep.snapshot_reader import reader_on_snapshot
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


def test_the_reader_sees_the_tables_as_the_transaction_saw_them_when_it_was_opened(pg_engine, unique_table) -> None:
    with pg_engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE TABLE {unique_table} (k TEXT PRIMARY KEY, v TEXT)")
        conn.exec_driver_sql(f"INSERT INTO {unique_table} VALUES ('a', 'before')")
    other = sa.create_engine(pg_engine.url, poolclass=sa.pool.NullPool)
    try:
        with pg_engine.connect() as conn, conn.begin():
            with reader_on_snapshot(conn, dialect_for(pg_engine)) as reader:
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


def test_the_reader_is_a_connection_of_its_own_made_as_the_engines_and_closed_after(pg_engine,
                                                                                      application_name) -> None:
    app = application_name
    count = sa.text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :app")
    with pg_engine.connect() as conn, conn.begin():  # the pool's one connection, held
        with reader_on_snapshot(conn, dialect_for(pg_engine)) as reader:
            # The engine's connect arguments (here its application name) reach the reader's connection.
            assert reader.execute(count, {"app": app}).scalar_one() == 2
            driver = reader.connection.driver_connection
        assert driver is not None and driver.closed


def test_a_malformed_snapshot_id_is_refused_before_it_reaches_sql() -> None:
    dialect = dialect_for(sa.create_engine("postgresql+psycopg://u@localhost/db"))
    assert [s.sql for s in import_snapshot(dialect, "00000003-0000001B-1")][-1] == \
        "SET TRANSACTION SNAPSHOT '00000003-0000001B-1'"
    with pytest.raises(ValueError, match="not a snapshot id"):
        import_snapshot(dialect, "1'; DROP TABLE t; --")


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
        assert "a second connection was refused" in caplog.text and "too many connections" in caplog.text
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
