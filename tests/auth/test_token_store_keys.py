"""One Connection id never reads or writes another's grant row, whatever the database's collation.

MySQL/MariaDB compare strings case-insensitively by default: on such a key column, whoever creates
Connection ``bos_prod`` would load another team's ``Bos_Prod`` grant, and a Connect of ``bos_prod``
would overwrite it. These run on a real MariaDB (``mysql_url``) and, for the exact-key check that
holds on every dialect, on a SQLite table whose key column is ``COLLATE NOCASE``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from airflow_provider_bos.auth.token_store import SqlTokenStore
from airflow_provider_bos.exceptions import BosTokenStoreError

SEED = dict(client_id="cid", token_endpoint="https://bos.example/token", resource="https://bos.example/mcp",
            scope="mcp:tools offline_access")
VICTIM, ATTACKER = "Bos_Prod", "bos_prod"

# The table as the earlier releases created it on MySQL/MariaDB: the database's default collation.
_OLD_DDL = """CREATE TABLE {table} (
  `key` VARCHAR(250) NOT NULL PRIMARY KEY, client_id VARCHAR(255) NOT NULL, token_endpoint TEXT NOT NULL,
  resource TEXT NOT NULL, scope TEXT NOT NULL, access_token TEXT NULL, refresh_token TEXT NULL,
  expires_at DOUBLE NULL, generation INTEGER NOT NULL, seed_fingerprint VARCHAR(64) NULL,
  updated_at DOUBLE NOT NULL, consumed_seeds TEXT NULL
) {options}"""


def _old_general_ci_table(engine: sa.Engine, table: str) -> None:
    """The table as the earlier releases left it on MariaDB: keys compared case-insensitively."""
    with engine.begin() as conn:
        conn.exec_driver_sql(_OLD_DDL.format(table=table, options="DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci"))


def _victim_row(engine: sa.Engine, table: str) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text(
            f"INSERT INTO {table} (`key`, client_id, token_endpoint, resource, scope, access_token, refresh_token, "
            "expires_at, generation, seed_fingerprint, updated_at) VALUES (:k, 'victim-client', "
            "'https://bos.example/token', 'https://bos.example/mcp', 'mcp:tools', 'raw:at-victim-0001', "
            "'raw:rt-victim-0001', :exp, 7, NULL, :now)"
        ), {"k": VICTIM, "exp": time.time() + 3600, "now": time.time()})


def _rows(engine: sa.Engine, table: str) -> dict[str, tuple[str, int]]:
    with engine.connect() as conn:
        return {row[0]: (row[1], row[2]) for row in conn.execute(
            sa.text(f"SELECT `key`, refresh_token, generation FROM {table}"))}


def _key_collation(engine: sa.Engine, table: str) -> str:
    with engine.connect() as conn:
        return str(conn.execute(sa.text(
            "SELECT COLLATION_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() "
            "AND TABLE_NAME = :t AND COLUMN_NAME = 'key'"), {"t": table}).scalar_one())


@pytest.fixture()
def maria(mysql_url: str) -> Iterator[tuple[sa.Engine, str]]:
    engine = sa.create_engine(mysql_url)
    table = f"grants_{uuid.uuid4().hex[:10]}"
    try:
        yield engine, table
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {table}"))
        engine.dispose()


def _seed(store: SqlTokenStore, key: str, refresh: str):
    return store.seed(key, refresh_token=refresh, access_token="at-" + refresh, force=True, **SEED)


@pytest.mark.mysql
def test_a_new_table_on_mariadb_keeps_keys_that_differ_only_in_case_apart(maria) -> None:
    engine, table = maria
    store = SqlTokenStore(engine, table=table)
    _seed(store, VICTIM, "rt-victim-0001")
    assert _key_collation(engine, table) == "utf8mb4_bin"
    assert store.load(ATTACKER) is None and store.raw_row(ATTACKER) is None
    _seed(store, ATTACKER, "rt-attacker-0001")
    assert store.load(VICTIM).refresh_token == "rt-victim-0001"
    assert store.load(ATTACKER).refresh_token == "rt-attacker-0001"
    assert store.delete(ATTACKER) and store.load(VICTIM) is not None


@pytest.mark.mysql
def test_an_existing_case_insensitive_table_on_mariadb_is_converted(maria) -> None:
    engine, table = maria
    _old_general_ci_table(engine, table)
    _victim_row(engine, table)
    store = SqlTokenStore(engine, table=table)
    assert store.load(ATTACKER) is None  # converted first: the victim's row is not the attacker's
    assert _key_collation(engine, table) == "utf8mb4_bin"
    _seed(store, ATTACKER, "rt-attacker-0001")
    assert _rows(engine, table) == {VICTIM: ("raw:rt-victim-0001", 7), ATTACKER: ("raw:rt-attacker-0001", 1)}


@pytest.fixture()
def limited_user(maria, mysql_url: str) -> Iterator[str]:
    """A MariaDB user who may read and write the table but not ALTER it."""
    engine, table = maria
    user = f"bos_ltd_{uuid.uuid4().hex[:6]}"
    _old_general_ci_table(engine, table)
    with engine.begin() as conn:
        for host in ("%", "localhost"):
            conn.execute(sa.text(f"CREATE USER '{user}'@'{host}' IDENTIFIED BY 'pw-{user}'"))
            conn.execute(sa.text(f"GRANT SELECT, INSERT, UPDATE, DELETE ON test.{table} TO '{user}'@'{host}'"))
    url = make_url(mysql_url).set(username=user, password=f"pw-{user}")
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with engine.begin() as conn:
            for host in ("%", "localhost"):
                conn.execute(sa.text(f"DROP USER IF EXISTS '{user}'@'{host}'"))


@pytest.mark.mysql
def test_a_table_the_store_may_not_alter_is_refused_with_the_statement_to_run(maria, limited_user: str) -> None:
    engine, table = maria
    _victim_row(engine, table)
    store = SqlTokenStore(limited_user, table=table)
    try:
        statement = f"ALTER TABLE `{table}` CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;"
        for attempt in (lambda: store.load(ATTACKER), lambda: _seed(store, ATTACKER, "rt-attacker-0001")):
            with pytest.raises(BosTokenStoreError) as refused:
                attempt()
            assert statement in str(refused.value)
        assert _rows(engine, table) == {VICTIM: ("raw:rt-victim-0001", 7)}  # neither read nor overwritten
        with engine.begin() as conn:  # the admin runs the statement
            conn.exec_driver_sql(statement.rstrip(";"))
        assert SqlTokenStore(limited_user, table=table).load(ATTACKER) is None
    finally:
        store.dispose()


@pytest.mark.mysql
def test_a_read_only_store_on_an_unconverted_table_never_answers_with_another_key(maria) -> None:
    """The Admin -> BOS page opens stores read-only (no ALTER): the exact-key check alone holds there."""
    engine, table = maria
    _old_general_ci_table(engine, table)
    _victim_row(engine, table)
    reader = SqlTokenStore(engine, table=table, read_only=True)
    with pytest.raises(BosTokenStoreError, match="asked for 'bos_prod'"):
        reader.raw_row(ATTACKER)
    assert reader.raw_row(VICTIM)["generation"] == 7
    assert _key_collation(engine, table) == "utf8mb4_general_ci"  # read-only: not altered


def test_on_every_dialect_a_row_of_another_key_is_neither_used_nor_changed(tmp_path: Path) -> None:
    """A SQLite table whose key column is NOCASE stands for any database that answers 'bos_prod'
    with the row of 'Bos_Prod': the store compares the key it got with the key it asked for."""
    url = f"sqlite:///{tmp_path / 'tokens.db'}"
    engine = sa.create_engine(url)
    table = "bos_oauth_grants"
    with engine.begin() as conn:
        conn.exec_driver_sql(_OLD_DDL.format(table=table, options="").replace(
            "`key` VARCHAR(250) NOT NULL", "`key` VARCHAR(250) COLLATE NOCASE NOT NULL"))
    _victim_row(engine, table)
    store = SqlTokenStore(url)
    try:
        with pytest.raises(BosTokenStoreError, match="answered the row 'Bos_Prod' when asked for 'bos_prod'"):
            store.load(ATTACKER)
        with pytest.raises(BosTokenStoreError):
            _seed(store, ATTACKER, "rt-attacker-0001")  # a Connect of bos_prod
        with pytest.raises(BosTokenStoreError):
            store.refresh_locked(ATTACKER, lambda grant: grant)
        with pytest.raises(BosTokenStoreError):
            store.delete(ATTACKER)
        assert _rows(engine, table) == {VICTIM: ("raw:rt-victim-0001", 7)}
        assert store.load(VICTIM).refresh_token == "rt-victim-0001"
    finally:
        store.dispose()
        engine.dispose()
