"""The Admin -> BOS page and the token stores Connections name: the page is no file writer, schema
writer or port scanner for whoever may create Connections.

A user who may create Connections can make a ``sqlite`` Connection (host: any path) or a ``postgres``
one (any host and port) and point a ``bos`` Connection's ``token_store_conn_id`` at it. The page
opens such a store only when the operator listed its id in ``[bos] token_store_conn_ids``; even
then it opens it read-only (no file, directory, chmod or table), dials its database only where
``[bos] allowed_hosts`` allows and for a few seconds, and shows no driver error text.
Also here: what the page logs of a request, and its "Connected" notice.
"""

from __future__ import annotations

import html as html_lib
import logging
import os
import re
import sqlite3
import stat
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from localtcp import closed_port, tcp_listener
from pagefixtures import (
    API_SECRET_KEY,
    ORIGIN,
    add_connection,
    csrf_of,
    delete_connections,
)

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(300)]


@pytest.fixture()
def defaults(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Every page setting at its default: test_connection Disabled, no store allowed but the default."""
    for name in ("AIRFLOW__CORE__TEST_CONNECTION", "AIRFLOW__BOS__ALLOWED_HOSTS",
                 "AIRFLOW__BOS__ALLOW_TOKEN_STORE_URLS", "AIRFLOW__BOS__TOKEN_STORE_CONN_IDS"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _row_of(page_html: str, conn_id: str) -> tuple[str, str]:
    """(state, detail) of one Connection's row."""
    match = re.search(rf'<tr data-conn-id="{re.escape(conn_id)}">(.*?)</tr>', page_html, re.DOTALL)
    assert match, page_html[:3000]
    row = match.group(1)
    state = re.search(r'data-state="([^"]*)"', row)
    detail = re.search(r'<div class="detail">(.*?)</div>', row, re.DOTALL)
    return (state.group(1) if state else ""), html_lib.unescape(detail.group(1) if detail else "")


def _bos_with_store(conn_id: str, store_conn_id: str) -> None:
    add_connection(conn_id, conn_type="bos", host="https://bos.example/mcp",
                   extra={"auth_type": "oauth", "client_id": "c1", "token_store_conn_id": store_conn_id})


def _loose_sqlite_file(path: Path) -> None:
    """An existing SQLite database (no tables) readable by the group: what a chmod would tighten."""
    sqlite3.connect(path).close()
    path.write_bytes(path.read_bytes())  # an empty, valid database file
    os.chmod(path, 0o644)


def _tables(path: Path) -> list[str]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        return [row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]


# --- item: the operator's gate ---------------------------------------------------------------------


@pytest.mark.parametrize("allowed_hosts", [None, "127.0.0.1"])
def test_a_store_connection_the_operator_did_not_list_is_never_opened(
    password_page, admin, defaults, tmp_path, allowed_hosts
) -> None:
    if allowed_hosts:
        defaults.setenv("AIRFLOW__BOS__ALLOWED_HOSTS", allowed_hosts)
    new_file = tmp_path / "made" / "by" / "the-page.db"
    existing = tmp_path / "existing.db"
    _loose_sqlite_file(existing)
    with tcp_listener(greeting=b"SSH-2.0-OpenSSH_9.2\r\n") as internal:
        add_connection("evil_new_file", conn_type="sqlite", host=str(new_file))
        add_connection("evil_existing_file", conn_type="sqlite", host=str(existing))
        add_connection("evil_port", conn_type="postgres", host="127.0.0.1", port=internal.port, login="x",
                       schema="x")
        for store in ("evil_new_file", "evil_existing_file", "evil_port"):
            _bos_with_store(f"bos_{store}", store)
        try:
            page_html = password_page.get("/bos/", headers=admin).text
        finally:
            delete_connections("evil_new_file", "evil_existing_file", "evil_port", "bos_evil_new_file",
                               "bos_evil_existing_file", "bos_evil_port")
        assert internal.accepted == 0  # the port was never dialled
    assert not (tmp_path / "made").exists()  # no file, no directory
    assert stat.S_IMODE(existing.stat().st_mode) == 0o644 and _tables(existing) == []  # no chmod, no table
    for store in ("evil_new_file", "evil_existing_file", "evil_port"):
        state, detail = _row_of(page_html, f"bos_{store}")
        assert state == "check failed" and "[bos] token_store_conn_ids" in detail, detail


def test_an_allow_listed_sqlite_store_is_only_read(password_page, admin, defaults, tmp_path) -> None:
    from airflow_provider_bos.auth.token_store import SqlTokenStore
    from airflow_provider_bos.hooks.connections import airflow_fernet_cipher

    defaults.setenv("AIRFLOW__BOS__TOKEN_STORE_CONN_IDS", "ro_missing, ro_empty ro_seeded")
    missing = tmp_path / "missing-dir" / "tokens.db"
    empty = tmp_path / "empty.db"
    _loose_sqlite_file(empty)
    seeded = tmp_path / "seeded.db"
    store = SqlTokenStore(f"sqlite:///{seeded}", cipher=airflow_fernet_cipher())
    store.seed("bos_ro_seeded", client_id="c1", token_endpoint="https://bos.example/token",
               resource="https://bos.example/mcp", scope="mcp:tools offline_access", refresh_token="rt-ro-0001")
    store.dispose()
    os.chmod(seeded, 0o640)
    add_connection("ro_missing", conn_type="sqlite", host=str(missing))
    add_connection("ro_empty", conn_type="sqlite", host=str(empty))
    add_connection("ro_seeded", conn_type="sqlite", host=str(seeded))
    for name in ("ro_missing", "ro_empty", "ro_seeded"):
        _bos_with_store(f"bos_{name}", name)
    try:
        page_html = password_page.get("/bos/", headers=admin).text
    finally:
        delete_connections("ro_missing", "ro_empty", "ro_seeded", "bos_ro_missing", "bos_ro_empty", "bos_ro_seeded")
    assert _row_of(page_html, "bos_ro_missing")[0] == "not connected" and not missing.parent.exists()
    assert _row_of(page_html, "bos_ro_empty")[0] == "not connected" and _tables(empty) == []
    assert stat.S_IMODE(empty.stat().st_mode) == 0o644
    assert _row_of(page_html, "bos_ro_seeded")[0] == "connected"
    assert stat.S_IMODE(seeded.stat().st_mode) == 0o640


def test_a_store_connection_of_another_type_is_not_opened(password_page, admin, defaults, tmp_path) -> None:
    """Only sqlite, postgres and mysql connections are token stores: no other type's hook is built."""
    defaults.setenv("AIRFLOW__BOS__TOKEN_STORE_CONN_IDS", "duck_store")
    duck = tmp_path / "made-by-duckdb.duckdb"
    add_connection("duck_store", conn_type="duckdb", host=str(duck))
    _bos_with_store("bos_duck", "duck_store")
    try:
        state, detail = _row_of(password_page.get("/bos/", headers=admin).text, "bos_duck")
    finally:
        delete_connections("duck_store", "bos_duck")
    assert state == "check failed" and "sqlite, postgres or mysql" in detail and not duck.exists()


# --- item: store databases get the host policy, a short timeout, and no driver text on the page ------


@pytest.mark.parametrize("allowed_hosts", [None, "bos.example"])
def test_an_allow_listed_store_database_is_dialled_only_where_the_host_policy_allows(
    password_page, admin, defaults, allowed_hosts
) -> None:
    defaults.setenv("AIRFLOW__BOS__TOKEN_STORE_CONN_IDS", "pg_store,my_store")
    if allowed_hosts:
        defaults.setenv("AIRFLOW__BOS__ALLOWED_HOSTS", allowed_hosts)
    with tcp_listener(greeting=b"SSH-2.0-OpenSSH_9.2\r\n") as internal:
        add_connection("pg_store", conn_type="postgres", host="127.0.0.1", port=internal.port, login="x", schema="x")
        add_connection("my_store", conn_type="mysql", host="localhost", port=internal.port, login="x", schema="x")
        _bos_with_store("bos_pg", "pg_store")
        _bos_with_store("bos_my", "my_store")
        try:
            page_html = password_page.get("/bos/", headers=admin).text
        finally:
            delete_connections("pg_store", "my_store", "bos_pg", "bos_my")
        assert internal.accepted == 0
    for conn_id in ("bos_pg", "bos_my"):
        state, detail = _row_of(page_html, conn_id)
        assert state == "check failed" and "allowed_hosts" in detail, detail


def test_a_store_database_is_cut_off_quickly_and_what_answers_is_not_told(
    password_page, admin, defaults, caplog
) -> None:
    """An allow-listed store whose host the operator allowed, but where nothing (or something else)
    answers: the view returns within the store's connect timeout, and every failure reads the same."""
    defaults.setenv("AIRFLOW__BOS__TOKEN_STORE_CONN_IDS", "silent_store ssh_store closed_store")
    defaults.setenv("AIRFLOW__BOS__ALLOWED_HOSTS", "127.0.0.1")
    names = ("silent_store", "ssh_store", "closed_store")
    with tcp_listener(greeting=None) as silent, tcp_listener(greeting=b"SSH-2.0-OpenSSH_9.2\r\n") as ssh:
        for name, port in zip(names, (silent.port, ssh.port, closed_port()), strict=True):
            add_connection(name, conn_type="postgres", host="127.0.0.1", port=port, login="x", schema="x")
            _bos_with_store(f"bos_{name}", name)
        try:
            with caplog.at_level(logging.WARNING, logger="airflow_provider_bos.plugins.app"):
                started = time.monotonic()
                page_html = password_page.get("/bos/", headers=admin).text
                elapsed = time.monotonic() - started
        finally:
            delete_connections(*names, *(f"bos_{name}" for name in names))
        assert silent.accepted >= 1 and ssh.accepted >= 1  # allowed: dialled
    assert elapsed < 20, elapsed  # not held until the silent service lets go (40 s)
    details = {_row_of(page_html, f"bos_{name}") for name in names}
    generic = "Token store unreadable: The token store could not be read; the API server's log has the details."
    assert details == {("check failed", generic)}
    rows = page_html.split("<tbody>")[1].split("</tbody>")[0]
    for leak in ("SSH", "refused", "timeout", "OperationalError", "psycopg", "server closed", "127.0.0.1"):
        assert leak not in rows, leak
    logged = " ".join(record.getMessage() for record in caplog.records)
    assert all(f"'bos_{name}'" in logged for name in names) and "OperationalError" in logged


@pytest.fixture(params=[pytest.param("postgres", marks=pytest.mark.postgres),
                        pytest.param("mysql", marks=pytest.mark.mysql)])
def fresh_database(request: pytest.FixtureRequest) -> Any:
    """(connection type, URL) of a database of its own on the local PostgreSQL or MariaDB server."""
    from sqlalchemy.engine import make_url

    server_url = request.getfixturevalue(f"{request.param}_url")
    database = f"bos_ro_{uuid.uuid4().hex[:8]}"
    server = sa.create_engine(server_url, isolation_level="AUTOCOMMIT")
    with server.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {database}")
    try:
        yield request.param, make_url(server_url).set(database=database)
    finally:
        with server.connect() as conn:
            force = " WITH (FORCE)" if request.param == "postgres" else ""
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {database}{force}")
        server.dispose()


def test_a_store_database_is_opened_read_only(password_page, admin, defaults, fresh_database) -> None:
    from airflow_provider_bos.auth.token_store import SqlTokenStore
    from airflow_provider_bos.hooks.connections import airflow_fernet_cipher

    conn_type, url = fresh_database
    defaults.setenv("AIRFLOW__BOS__TOKEN_STORE_CONN_IDS", "db_ro_store")
    defaults.setenv("AIRFLOW__BOS__ALLOWED_HOSTS", "127.0.0.1")
    add_connection("db_ro_store", conn_type=conn_type, host=url.host, port=url.port, login=url.username,
                   password=url.password, schema=url.database)
    _bos_with_store("bos_db_ro", "db_ro_store")
    target = sa.create_engine(url)
    try:
        assert _row_of(password_page.get("/bos/", headers=admin).text, "bos_db_ro")[0] == "not connected"
        assert not sa.inspect(target).has_table("bos_oauth_grants")  # no CREATE TABLE
        store = SqlTokenStore(target, cipher=airflow_fernet_cipher())
        store.seed("bos_db_ro", client_id="c1", token_endpoint="https://bos.example/token",
                   resource="https://bos.example/mcp", scope="mcp:tools offline_access", refresh_token="rt-db-0001")
        assert _row_of(password_page.get("/bos/", headers=admin).text, "bos_db_ro")[0] == "connected"
    finally:
        delete_connections("db_ro_store", "bos_db_ro")
        target.dispose()


@pytest.mark.parametrize("backend", ["postgresql", "mysql"])
def test_a_store_connection_dials_the_checked_address_over_tcp_only(backend: str) -> None:
    """The address the policy checked is the one dialled (no second resolution), and nothing the
    connection says can send it elsewhere (a Unix socket, a libpq service, an option file)."""
    from airflow_provider_bos.exceptions import BosConfigurationError
    from airflow_provider_bos.plugins.outbound import OutboundPolicy
    from airflow_provider_bos.plugins.stores import _pin

    public = OutboundPolicy(resolve=lambda _host, _port: ["8.8.4.4"])  # resolved, never dialled
    params = {"host": "db.example", "port": 5432}
    _pin(backend, params, public)
    assert params == ({"host": "db.example", "port": 5432, "hostaddr": "8.8.4.4"} if backend == "postgresql"
                      else {"host": "8.8.4.4", "port": 5432})
    private = OutboundPolicy(resolve=lambda _host, _port: ["10.0.0.5"])
    with pytest.raises(BosConfigurationError, match="allowed_hosts"):
        _pin(backend, {"host": "db.example"}, private)
    listed = OutboundPolicy.from_setting("db.internal")
    params = {"host": "db.internal"}
    _pin(backend, params, listed)  # an operator's host: used as named (TLS verifies it)
    assert params == {"host": "db.internal"}
    redirecting = ({"hostaddr": "10.0.0.5", "host": "db.internal"}, {"service": "prod", "host": "db.internal"},
                   {"host": "/var/run/postgresql"}, {}) if backend == "postgresql" else (
                   {"unix_socket": "/run/mysqld/mysqld.sock", "host": "db.internal"},
                   {"read_default_file": "/etc/mysql/my.cnf", "host": "db.internal"})
    for cparams in redirecting:
        with pytest.raises(BosConfigurationError):
            _pin(backend, dict(cparams), listed)


def test_the_page_opens_stores_for_writing_only_through_the_same_gate(defaults, tmp_path) -> None:
    """Connect's callback and the probe open the store to write: the same gate and host policy."""
    from airflow_provider_bos.exceptions import BosConfigurationError
    from airflow_provider_bos.plugins.outbound import Deadline, OutboundPolicy
    from airflow_provider_bos.plugins.pending import ConnectTarget
    from airflow_provider_bos.plugins.stores import open_page_store

    new_file = tmp_path / "made" / "tokens.db"
    with tcp_listener(greeting=b"x") as internal:
        add_connection("rw_file", conn_type="sqlite", host=str(new_file))
        add_connection("rw_port", conn_type="postgres", host="127.0.0.1", port=internal.port, login="x", schema="x")
        try:
            for store in ("rw_file", "rw_port"):
                with pytest.raises(BosConfigurationError, match="token_store_conn_ids"):
                    open_page_store(ConnectTarget("bos_rw", "https://bos.example/mcp", store), read_only=False,
                                    policy=OutboundPolicy(), deadline=Deadline())
            defaults.setenv("AIRFLOW__BOS__TOKEN_STORE_CONN_IDS", "rw_port")
            store = open_page_store(ConnectTarget("bos_rw", "https://bos.example/mcp", "rw_port"), read_only=False,
                                    policy=OutboundPolicy(), deadline=Deadline())
            with pytest.raises(BosConfigurationError, match="allowed_hosts"):
                store.ensure_table()
        finally:
            delete_connections("rw_file", "rw_port")
        assert internal.accepted == 0 and not new_file.parent.exists()


# --- item: what the page logs of a request ---------------------------------------------------------


@pytest.mark.parametrize("injected", ["\nFORGED 2026-01-01 INFO admin logged in", "\x1b[2J\x1b[31mFORGED"])
def test_a_resource_url_is_validated_before_it_reaches_a_log_line(
    password_page, admin, defaults, caplog, injected
) -> None:
    add_connection("bos_log_forge", conn_type="bos", host="https://bos.example/mcp" + injected,
                   extra={"auth_type": "oauth", "client_id": "c1"})
    try:
        csrf = csrf_of(password_page.get("/bos/", headers=admin).text)
        with caplog.at_level(logging.DEBUG):
            new = password_page.post("/bos/connect", headers={**admin, **ORIGIN}, data={
                "conn_id": "bos_log_new", "resource_url": "https://bos.example/mcp" + injected, "csrf_token": csrf})
            again = password_page.post("/bos/connections/bos_log_forge/connect", headers={**admin, **ORIGIN},
                                       data={"csrf_token": csrf})
    finally:
        delete_connections("bos_log_forge")
    assert new.status_code == again.status_code == 400 and "absolute http(s) URL" in new.text
    for record in caplog.records:
        message = record.getMessage()
        assert "FORGED" not in message and "\x1b" not in message, message


# --- item: the "Connected" notice --------------------------------------------------------------------


def test_the_connected_notice_shows_only_what_the_callback_signed(password_page, admin, defaults) -> None:
    from airflow_provider_bos.plugins.csrf import notice_token

    add_connection("bos_noticed", conn_type="bos", host="https://bos.example/mcp",
                   extra={"auth_type": "oauth", "client_id": "c1"})
    key = API_SECRET_KEY.encode()
    phishing = "bos_noticed'. Your session expired: sign in again at https://evil.example/login"
    try:
        def notice(**params: str) -> str:
            page_html = password_page.get("/bos/", params=params, headers=admin).text
            found = re.search(r'<div class="notice" role="status">(.*?)</div>', page_html, re.DOTALL)
            return html_lib.unescape(found.group(1)) if found else ""

        assert notice(connected=phishing) == ""
        assert notice(connected=phishing, sig=notice_token("admin", phishing, key=key)) == ""  # no such Connection
        assert notice(connected="bos_noticed") == ""  # unsigned
        assert notice(connected="bos_noticed", sig=notice_token("viewer", "bos_noticed", key=key)) == ""
        assert notice(connected="bos_noticed", sig=notice_token("admin", "bos_other", key=key)) == ""
        expired = notice_token("admin", "bos_noticed", key=key, now=time.time() - 3600)
        assert notice(connected="bos_noticed", sig=expired) == ""
        assert notice(connected="bos_noticed", sig=notice_token("admin", "bos_noticed", key=key)) == (
            "Connected 'bos_noticed': the grant is in the token store."
        )
    finally:
        delete_connections("bos_noticed")
