"""BosHook as a TaskFlow user calls it: connection parsing, test_connection, discovery calls, reads."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from airflow_provider_bos.exceptions import BosConfigurationError
from airflow_provider_bos.hooks.bos import BosConnectionConfig, BosHook
from airflow_provider_bos.testing.scenario import large_scenario, load_scenario


@pytest.fixture()
def bos_conn(bos_server, tmp_path, monkeypatch):
    """``bos_default`` pointing at the reference server with a freshly minted grant."""
    grant = bos_server.mint_grant()
    monkeypatch.setenv("AIRFLOW_CONN_BOS_DEFAULT", json.dumps({
        "conn_type": "bos", "host": bos_server.mcp_url, "password": grant["refresh_token"],
        "extra": {"client_id": grant["client_id"], "token_store_url": f"sqlite:///{tmp_path / 'tokens.db'}"},
    }))
    return grant


def _conn(**fields):
    base = {"conn_id": "c", "host": "https://bos.example/mcp/apps/bos/platform", "schema": None, "port": None,
            "password": "refresh-token-value", "extra_dejson": {"client_id": "client-1"}}
    base.update(fields)
    return SimpleNamespace(**base)


def test_connection_config_reads_the_form_fields_and_hides_the_secret() -> None:
    cfg = BosConnectionConfig.from_connection(_conn(extra_dejson={
        "extra__bos__client_id": "client-1", "extra__bos__protocol": "2026-07-28", "context_handle": "ctx"}))
    assert (cfg.client_id, cfg.protocol, cfg.context_handle, cfg.auth_type) == (
        "client-1", "2026-07-28", "ctx", "oauth")
    assert "refresh-token-value" not in repr(cfg)


def test_the_stream_idle_timeout_defaults_to_300s_and_reaches_the_session(bos_server, bos_conn, monkeypatch) -> None:
    assert BosConnectionConfig.from_connection(_conn()).stream_idle_timeout == 300.0
    cfg = BosConnectionConfig.from_connection(_conn(extra_dejson={
        "client_id": "client-1", "extra__bos__stream_idle_timeout": "45", "timeout": 10}))
    assert (cfg.timeout, cfg.stream_idle_timeout) == (10.0, 45.0)
    conn = json.loads(__import__("os").environ["AIRFLOW_CONN_BOS_DEFAULT"])
    conn["extra"]["stream_idle_timeout"] = 45
    monkeypatch.setenv("AIRFLOW_CONN_BOS_DEFAULT", json.dumps(conn))
    with BosHook() as hook:
        assert hook.get_conn().stream_idle_timeout == 45.0


def test_the_largest_event_field_reaches_the_session_and_no_read_result_is_held_whole(
        bos_server, bos_conn, monkeypatch) -> None:
    """``max_event_mib`` reaches the session; a read's result is scanned record by record whether the
    caller streams its records or holds them (stream_records=False), so a result larger than the
    field passes both ways: only one event, record or value of it may not exceed the field."""
    assert BosConnectionConfig.from_connection(_conn()).max_event_bytes == 512 * 1024 * 1024
    assert BosConnectionConfig.from_connection(_conn(extra_dejson={
        "client_id": "c", "extra__bos__max_event_mib": "1.5"})).max_event_bytes == 1536 * 1024
    bos_server.set_scenario(large_scenario(4_000, sources=2))  # a ~5 MB final answer
    conn = json.loads(__import__("os").environ["AIRFLOW_CONN_BOS_DEFAULT"])
    conn["extra"]["max_event_mib"] = 1
    monkeypatch.setenv("AIRFLOW_CONN_BOS_DEFAULT", json.dumps(conn))
    with BosHook() as hook:
        assert hook.get_conn().max_event_bytes == 1024 * 1024
        held = hook.federated_read("people.search", {})
        assert len(held.records) == 4_000 and held.completeness == "complete"
    with BosHook() as hook:
        streamed = hook.federated_read("people.search", {}, stream_records=True)
        assert sum(1 for _ in streamed.records) == 4_000 and streamed.completeness == "complete"


@pytest.mark.parametrize(("fields", "message"), [
    ({"extra_dejson": {"client_id": "x", "stream_idle_timeout": "0"}}, "Stream idle timeout"),
    ({"extra_dejson": {"client_id": "x", "stream_idle_timeout": "soon"}}, "Stream idle timeout"),
    ({"extra_dejson": {"client_id": "x", "max_event_mib": "0"}}, "Largest event"),
    ({"extra_dejson": {"client_id": "x", "max_event_mib": "lots"}}, "Largest event"),
    ({"extra_dejson": {"client_id": "x", "max_event_mib": True}}, "Largest event"),
    ({"extra_dejson": {"client_id": "x", "max_event_mib": 536870912}}, "Largest event"),  # bytes typed in
    ({"extra_dejson": {"client_id": "x", "timeout": "abc"}}, "HTTP timeout"),
    ({"extra_dejson": {"client_id": "x", "timeout": 0}}, "HTTP timeout"),  # was silently 30
    ({"extra_dejson": {"client_id": "x", "timeout": "nan"}}, "HTTP timeout"),
    ({"password": "bos_key one", "extra_dejson": {"auth_type": "api_key"}}, "whitespace or control characters"),
    ({"host": ""}, "MCP resource URL"),
    ({"password": "", "extra_dejson": {"auth_type": "api_key"}}, "API key"),
    ({"extra_dejson": {}}, "client_id"),
    ({"extra_dejson": {"client_id": "x", "auth_type": "basic"}}, "auth_type"),
    ({"extra_dejson": {"client_id": "x", "protocol": "2024-01-01"}}, "protocol"),
])
def test_misconfigured_connections_say_what_to_fix(fields, message) -> None:
    with pytest.raises(BosConfigurationError, match=message):
        BosConnectionConfig.from_connection(_conn(**fields))


def test_test_connection_reports_the_authorized_contexts(bos_server, bos_conn) -> None:
    ok, message = BosHook().test_connection()
    assert ok, message
    assert "2 authorized context(s)" in message and "(default)" in message


def test_test_connection_reports_a_revoked_grant_with_the_reconnect_command(bos_server, bos_conn) -> None:
    bos_server.revoke_grant_of(bos_conn["refresh_token"])
    ok, message = BosHook().test_connection()
    assert not ok
    assert "airflow-provider-bos connect --conn-id bos_default" in message
    assert bos_conn["refresh_token"] not in message


def test_discovery_calls_a_taskflow_user_makes(bos_server, bos_conn) -> None:
    with BosHook() as hook:
        contexts = hook.list_contexts()
        default = hook.resolve_context_handle()
        assert default == next(c.context_handle for c in contexts if c.is_default)
        catalog = hook.list_context_tools()
        assert "people.search" in {op["name"] for op in catalog["operations"]}
        resource = hook.read_resource(catalog["resources"][0]["uri"])
        assert resource["contents"][0]["text"]
        assert "search_people" in {t["name"] for t in hook.list_tools()}


def test_federated_read_hands_progress_to_the_callback_and_returns_the_final_result(bos_server, bos_conn) -> None:
    bos_server.set_scenario(load_scenario("identity_merge"))
    seen = []
    with BosHook() as hook:
        result = hook.federated_read("people.search", {}, on_progress=seen.append)
        records = list(result.records)
    assert seen and all(p.notification.status in {"page", "complete", "error"} for p in seen)
    assert result.completeness == "complete"
    assert len(records) == result.result_count == 60


def test_pasted_values_lose_their_edge_whitespace() -> None:
    cfg = BosConnectionConfig.from_connection(_conn(password=" refresh-token-value\n", extra_dejson={
        "client_id": "client-1 ", "auth_type": " OAuth", "protocol": "AUTO", "context_handle": "ctx_a\n"}))
    assert (cfg.secret, cfg.client_id, cfg.auth_type, cfg.protocol, cfg.context_handle) == (
        "refresh-token-value", "client-1", "oauth", "auto", "ctx_a")


def test_the_uri_form_of_a_connection_keeps_the_path() -> None:
    from airflow.models.connection import Connection

    from airflow_provider_bos.plugins.connections import target_of

    conn = Connection(conn_id="c", uri="bos://dfsm.ai/mcp/apps/bos/platform?client_id=c1")
    assert BosConnectionConfig.from_connection(conn).resource_url == "https://dfsm.ai/mcp/apps/bos/platform"
    assert target_of(conn).resource_url == "https://dfsm.ai/mcp/apps/bos/platform"  # the Admin page reads it alike
    local = Connection(conn_id="c", uri="bos://http://127.0.0.1:8765/mcp/apps/bos/platform?client_id=c1")
    assert BosConnectionConfig.from_connection(local).resource_url == "http://127.0.0.1:8765/mcp/apps/bos/platform"
    assert BosConnectionConfig.from_connection(_conn(host="bos.local", schema="http", port=8080)).resource_url == (
        "http://bos.local:8080")


def test_api_key_connections_read_without_refreshing(bos_server, monkeypatch, caplog) -> None:
    key = bos_server.create_api_key()
    # Pasted with its line break (kubectl create secret --from-file keeps one): it still works, and
    # the key never reaches a log or an error (httpx would quote the bad header, key and all).
    monkeypatch.setenv("AIRFLOW_CONN_BOS_KEYED", json.dumps({
        "conn_type": "bos", "host": bos_server.mcp_url, "password": key + "\n", "extra": {"auth_type": "api_key"}}))
    with caplog.at_level("DEBUG"):
        ok, message = BosHook("bos_keyed").test_connection()
    assert ok, message
    assert key not in caplog.text and key not in message
    monkeypatch.setenv("AIRFLOW_CONN_BOS_KEYED", json.dumps({
        "conn_type": "bos", "host": bos_server.mcp_url, "password": key, "extra": {"auth_type": "api_key"}}))
    ok, message = BosHook("bos_keyed").test_connection()
    assert ok, message
    assert bos_server.counters.refreshes == 0


def test_test_connection_reports_a_missing_token_store_connection(bos_server, bos_conn, monkeypatch) -> None:
    conn = json.loads(__import__("os").environ["AIRFLOW_CONN_BOS_DEFAULT"])
    conn["extra"] = {"client_id": conn["extra"]["client_id"], "token_store_conn_id": "no_such_store"}
    monkeypatch.setenv("AIRFLOW_CONN_BOS_DEFAULT", json.dumps(conn))
    ok, message = BosHook().test_connection()  # an answer for the UI's Test button, not an exception
    assert not ok and "'no_such_store' does not exist" in message


def test_the_token_store_is_refused_on_duckdb(tmp_path, monkeypatch) -> None:
    db_path = tmp_path / "warehouse.duckdb"
    monkeypatch.setenv("AIRFLOW_CONN_BOS_DUCK_TOKENS", json.dumps({"conn_type": "duckdb", "host": str(db_path)}))
    monkeypatch.setenv("AIRFLOW_CONN_BOS_DUCK", json.dumps({
        "conn_type": "bos", "host": "https://bos.invalid/mcp", "password": "refresh-token",
        "extra": {"auth_type": "oauth", "client_id": "c", "token_store_conn_id": "bos_duck_tokens"},
    }))
    with pytest.raises(BosConfigurationError, match="token store cannot be a DuckDB database"):
        BosHook("bos_duck")._token_store()
    assert not db_path.exists()  # refused before the file was opened
