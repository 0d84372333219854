"""The Admin -> BOS page against a hostile visitor, a hostile endpoint and a curious page user.

Airflow's own API app runs in this process (``pagefixtures.build_page``) with the plugin; the
endpoints the page is pointed at are real HTTP servers on loopback ports (``localhttp``) or the
shipped reference server.
"""

from __future__ import annotations

import secrets
from typing import Any
from urllib.parse import parse_qsl

import pytest
from localhttp import answer, drip_headers, local_server
from pagefixtures import (
    API_SECRET_KEY,
    ORIGIN,
    add_connection,
    bearer,
    build_page,
    csrf_of,
    delete_connections,
)

from airflow_provider_bos.airflow_compat import airflow_version

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(300)]


@pytest.fixture()
def deny(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``deny({("PUT", "bos_b")})``: the auth manager refuses these (method, conn_id) pairs, as a
    custom auth manager granting per connection id would."""

    def install(refused: set[tuple[str, str]]) -> None:
        from airflow.api_fastapi.app import get_auth_manager

        manager = get_auth_manager()
        allowed = manager.is_authorized_connection

        def is_authorized_connection(*, method: str, user: Any, details: Any = None) -> bool:
            conn_id = getattr(details, "conn_id", None)
            return (method, conn_id) not in refused and allowed(method=method, user=user, details=details)

        monkeypatch.setattr(manager, "is_authorized_connection", is_authorized_connection)

    return install


def _masker_patterns() -> set[str]:
    from airflow._shared.secrets_masker import _secrets_masker

    return set(_secrets_masker().patterns)


# --- a visitor cannot fill the secrets masker, and the callback's query stays out of the log ------


def test_callbacks_that_match_no_pending_sign_in_register_no_secret(password_page, admin) -> None:
    from airflow_provider_bos import redaction

    before = (_masker_patterns(), redaction.known_secret_count())
    for i in range(100):
        code = f"visitor{i:03d}" + secrets.token_urlsafe(4500)  # ~6 KB each
        params = {"code": code, "state": "forged", "iss": "https://x.example"}
        anonymous = password_page.get("/bos/callback", params=params, follow_redirects=False)
        assert anonymous.status_code == 303 and code not in anonymous.headers["location"]
        signed_in = password_page.get("/bos/callback", params=params, headers=admin, follow_redirects=False)
        assert signed_in.status_code == 400 and "no pending sign-in" in signed_in.text
    assert (_masker_patterns(), redaction.known_secret_count()) == before


@pytest.mark.skipif(airflow_version() < (3, 2), reason="Airflow 3.1 has no http.access log; its access log is "
                    "uvicorn's, outside the app (docs/security.md says what to do there)")
def test_the_access_log_line_of_a_callback_carries_no_query_value(password_page, admin) -> None:
    from structlog.testing import capture_logs

    code = "LEAKCODE-" + secrets.token_urlsafe(24)
    with capture_logs() as events:
        password_page.get("/bos/callback", params={"code": code, "state": "s1"}, follow_redirects=False)
        password_page.get("/bos/callback", params={"code": code, "state": "s2"}, headers=admin)
    lines = [e for e in events if e.get("event") == "request finished" and e.get("path") == "/bos/callback"]
    assert len(lines) == 2
    for line in lines:
        assert [(name, value) for name, value in parse_qsl(line["query"])] == [("code", "***"), ("state", "***")]
    assert code not in repr(events)


# --- headers --------------------------------------------------------------------------------------


def test_every_response_forbids_framing_and_carries_a_strict_csp(password_page, admin) -> None:
    viewer = bearer(password_page, "viewer")
    for response in (
        password_page.get("/bos/", headers=admin),
        password_page.get("/bos/", headers=viewer),  # 403 page
        password_page.get("/bos/", follow_redirects=False),  # 303 to the login
    ):
        assert response.headers["x-frame-options"] == "DENY"
        policy = response.headers["content-security-policy"]
        assert "default-src 'none'" in policy and "frame-ancestors 'none'" in policy
        assert "unsafe-inline" not in policy and "script-src" not in policy


# --- CSRF without a session cookie -----------------------------------------------------------------


@pytest.mark.skipif(airflow_version() < (3, 2), reason="Airflow 3.1's all-admins mode gives no user to a request "
                    "without the UI's token cookie: the page sends it to the login")
def test_connect_works_in_all_admins_mode_without_a_cookie(
    airflow_db, tmp_path, bos_server, monkeypatch
) -> None:
    monkeypatch.setenv("AIRFLOW__BOS__ALLOWED_HOSTS", "127.0.0.1")
    with build_page(tmp_path, all_admins=True) as page:
        html = page.get("/bos/").text
        form = {"conn_id": "bos_all_admins", "resource_url": bos_server.mcp_url, "csrf_token": csrf_of(html)}
        started = page.post("/bos/connect", data=form, headers=ORIGIN, follow_redirects=False)
        assert started.status_code == 303, started.text
        assert started.headers["location"].startswith(bos_server.issuer)
        # A token for another identity does not fit.
        from airflow_provider_bos.plugins.csrf import csrf_token

        forged = {**form, "csrf_token": csrf_token("viewer", key=API_SECRET_KEY.encode())}
        assert page.post("/bos/connect", data=forged, headers=ORIGIN).status_code == 403


# --- per connection id -----------------------------------------------------------------------------


def test_the_index_lists_and_probes_only_connections_the_user_may_edit(
    password_page, admin, deny, bos_server, monkeypatch
) -> None:
    monkeypatch.setenv("AIRFLOW__CORE__TEST_CONNECTION", "Enabled")
    monkeypatch.setenv("AIRFLOW__BOS__ALLOWED_HOSTS", "127.0.0.1")
    key = bos_server.create_api_key()
    for conn_id in ("bos_mine", "bos_theirs"):
        add_connection(conn_id, conn_type="bos", host=bos_server.mcp_url, password=key,
                       extra={"auth_type": "api_key"})
    deny({("PUT", "bos_theirs")})
    try:
        html = password_page.get("/bos/", headers=admin).text
        assert 'data-conn-id="bos_mine"' in html and "bos_theirs" not in html
        csrf = {"csrf_token": csrf_of(html)}
        for action in ("check", "connect"):
            refused = password_page.post(f"/bos/connections/bos_theirs/{action}", data=csrf,
                                         headers={**admin, **ORIGIN}, follow_redirects=False)
            assert refused.status_code == 403, (action, refused.text)
        checked = password_page.post("/bos/connections/bos_mine/check", data=csrf, headers={**admin, **ORIGIN})
        assert checked.status_code == 200 and "ctx_acme_people_prod" in checked.text
    finally:
        delete_connections("bos_mine", "bos_theirs")


# --- [core] test_connection ------------------------------------------------------------------------


def _seed_grant(server: Any, conn_id: str) -> None:
    from airflow_provider_bos.auth.token_store import SqlTokenStore, default_token_store_url
    from airflow_provider_bos.hooks.connections import airflow_fernet_cipher

    grant = server.mint_grant()
    store = SqlTokenStore(default_token_store_url(), cipher=airflow_fernet_cipher())
    store.seed(conn_id, client_id=grant["client_id"], token_endpoint=f"{server.base_url}/token",
               resource=server.mcp_url, scope="mcp:tools offline_access",
               refresh_token=grant["refresh_token"], force=True)
    store.dispose()
    add_connection(conn_id, conn_type="bos", host=server.mcp_url,
                   extra={"auth_type": "oauth", "client_id": grant["client_id"]})


def _requests_seen(server: Any) -> int:
    return sum(server.counters.snapshot().values())


@pytest.mark.parametrize("mode", ["Disabled", "Hidden", None])
def test_probe_and_check_follow_airflows_test_connection_setting(
    password_page, admin, bos_server, monkeypatch, mode
) -> None:
    monkeypatch.setenv("AIRFLOW__BOS__ALLOWED_HOSTS", "127.0.0.1")
    if mode is None:
        monkeypatch.delenv("AIRFLOW__CORE__TEST_CONNECTION", raising=False)  # Airflow's default: Disabled
    else:
        monkeypatch.setenv("AIRFLOW__CORE__TEST_CONNECTION", mode)
    _seed_grant(bos_server, "bos_unprobed")
    try:
        before = _requests_seen(bos_server)
        html = password_page.get("/bos/", headers=admin).text
        assert 'data-state="connected"' in html and "test_connection" in html
        assert _requests_seen(bos_server) == before  # nothing was sent to the endpoint
        if mode == "Hidden":
            assert 'data-action="check"' not in html
        else:
            assert 'data-action="check" disabled' in html
        refused = password_page.post("/bos/connections/bos_unprobed/check", data={"csrf_token": csrf_of(html)},
                                     headers={**admin, **ORIGIN})
        assert refused.status_code == 403 and "disabled in Airflow configuration" in refused.text
        assert _requests_seen(bos_server) == before
    finally:
        delete_connections("bos_unprobed")


# --- where the page's requests may go, and what it shows of their answers -------------------------


def _api_key_connection(conn_id: str, url: str) -> None:
    add_connection(conn_id, conn_type="bos", host=url, password="bos_key_" + "k" * 40,
                   extra={"auth_type": "api_key"})


def _check(page: Any, headers: dict[str, str], conn_id: str) -> Any:
    csrf = csrf_of(page.get("/bos/", headers=headers).text)
    return page.post(f"/bos/connections/{conn_id}/check", data={"csrf_token": csrf}, headers={**headers, **ORIGIN})


def test_check_does_not_reach_loopback_unless_allow_listed(password_page, admin, monkeypatch) -> None:
    monkeypatch.setenv("AIRFLOW__CORE__TEST_CONNECTION", "Enabled")
    monkeypatch.delenv("AIRFLOW__BOS__ALLOWED_HOSTS", raising=False)
    with local_server(answer(200, b"internal admin console")) as server:
        _api_key_connection("bos_ssrf", server.base_url + "/mcp")
        try:
            response = _check(password_page, admin, "bos_ssrf")
        finally:
            delete_connections("bos_ssrf")
    assert response.status_code == 400 and "allowed_hosts" in response.text
    assert server.requests == []


def test_an_unverified_endpoint_sees_no_key_and_its_answer_is_not_shown(password_page, admin, monkeypatch) -> None:
    monkeypatch.setenv("AIRFLOW__CORE__TEST_CONNECTION", "Enabled")
    monkeypatch.setenv("AIRFLOW__BOS__ALLOWED_HOSTS", "127.0.0.1")
    body = b'{"jsonrpc":"2.0","id":1,"result":{"internal":"SECRET-BODY-4711"}}'
    with local_server(answer(200, body, {"Content-Type": "application/json"})) as server:
        _api_key_connection("bos_unverified", server.base_url + "/mcp")
        try:
            response = _check(password_page, admin, "bos_unverified")
        finally:
            delete_connections("bos_unverified")
    assert response.status_code in (400, 502) and "SECRET-BODY" not in response.text
    assert server.requests and all("authorization" not in headers for _m, _p, headers in server.requests)


def test_connect_does_not_echo_a_redirect_target(password_page, admin, monkeypatch) -> None:
    monkeypatch.setenv("AIRFLOW__BOS__ALLOWED_HOSTS", "127.0.0.1")
    moved = answer(302, headers={"Location": "http://169.254.169.254/latest/meta-data/iam/credentials"})
    with local_server(moved) as server:
        csrf = csrf_of(password_page.get("/bos/", headers=admin).text)
        form = {"conn_id": "bos_redirected", "resource_url": server.base_url + "/mcp", "csrf_token": csrf}
        response = password_page.post("/bos/connect", data=form, headers={**admin, **ORIGIN})
    assert response.status_code == 400 and "302" in response.text
    assert "169.254" not in response.text and "meta-data" not in response.text


@pytest.mark.parametrize("url", ["https://10.0.0.1/mcp", "https://169.254.169.254/mcp", "https://[fd00::1]/mcp"])
def test_connect_refuses_private_and_link_local_hosts(password_page, admin, monkeypatch, url) -> None:
    monkeypatch.delenv("AIRFLOW__BOS__ALLOWED_HOSTS", raising=False)
    csrf = csrf_of(password_page.get("/bos/", headers=admin).text)
    form = {"conn_id": "bos_private", "resource_url": url, "csrf_token": csrf}
    response = password_page.post("/bos/connect", data=form, headers={**admin, **ORIGIN})
    assert response.status_code == 400 and "allowed_hosts" in response.text


def test_a_dripping_endpoint_gets_the_page_deadline(password_page, admin, monkeypatch) -> None:
    from airflow_provider_bos.plugins import outbound

    monkeypatch.setenv("AIRFLOW__CORE__TEST_CONNECTION", "Enabled")
    monkeypatch.setenv("AIRFLOW__BOS__ALLOWED_HOSTS", "127.0.0.1")
    monkeypatch.setattr(outbound, "PAGE_DEADLINE_S", 2.0)
    with local_server(drip_headers(0.2)) as server:
        _api_key_connection("bos_drip", server.base_url + "/mcp")
        try:
            response = _check(password_page, admin, "bos_drip")
        finally:
            delete_connections("bos_drip")
    assert response.status_code == 502 and "DeadlineExceeded" in response.text


# --- token stores ---------------------------------------------------------------------------------


def test_url_form_token_stores_are_not_opened_on_the_api_server(
    password_page, admin, tmp_path, monkeypatch
) -> None:
    created = tmp_path / "chosen-by-the-editor.db"
    add_connection("bos_url_store", conn_type="bos", host="https://bos.example/mcp",
                   extra={"auth_type": "oauth", "client_id": "c1", "token_store_url": f"sqlite:///{created}"})
    try:
        html = password_page.get("/bos/", headers=admin).text
        assert "allow_token_store_urls" in html and not created.exists()

        monkeypatch.setenv("AIRFLOW__BOS__ALLOW_TOKEN_STORE_URLS", "True")
        html = password_page.get("/bos/", headers=admin).text
        # The operator allowed it: opened, but read-only (a missing file is "not connected", not created).
        assert "allow_token_store_urls" not in html and 'data-state="not connected"' in html
        assert not created.exists()
    finally:
        delete_connections("bos_url_store")


def test_connect_refuses_a_token_store_connection_the_user_may_not_read(
    password_page, admin, deny, monkeypatch
) -> None:
    monkeypatch.setenv("AIRFLOW__BOS__ALLOWED_HOSTS", "127.0.0.1")
    monkeypatch.setenv("AIRFLOW__BOS__TOKEN_STORE_CONN_IDS", "finance_db")  # the operator allows it ...
    deny({("GET", "finance_db")})  # ... but this user may not read it
    with local_server(answer(401)) as server:
        csrf = csrf_of(password_page.get("/bos/", headers=admin).text)
        form = {"conn_id": "bos_store_theft", "resource_url": server.base_url + "/mcp",
                "token_store_conn_id": "finance_db", "csrf_token": csrf}
        response = password_page.post("/bos/connect", data=form, headers={**admin, **ORIGIN})
    assert response.status_code == 400 and "finance_db" in response.text and "may not use" in response.text
    assert server.requests == []  # refused before discovery began
