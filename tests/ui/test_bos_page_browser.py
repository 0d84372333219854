"""The Admin -> BOS page in a real API server, driven by headless Chromium.

Connect through the reference server's sign-in, see "connected", check the contexts, run the
``bos_sync_people`` DAG with that Connection, revoke the grant and see "reconnect needed", reconnect.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import sqlalchemy as sa
from pagefixtures import API_SECRET_KEY

from airflow_provider_bos.auth.token_store import SqlTokenStore, default_token_store_url
from airflow_provider_bos.hooks.connections import airflow_fernet_cipher
from airflow_provider_bos.plugins.csrf import csrf_token

# An api-server start takes a minute or more on a busy machine; the fixture setup counts too.
pytestmark = [pytest.mark.airflow, pytest.mark.slow, pytest.mark.timeout(900)]

CONN_ID = "bos_default"  # the connection bos_sync_people uses


def _state(frame_or_page, conn_id: str) -> str:
    return frame_or_page.locator(f'tr[data-conn-id="{conn_id}"] .state').inner_text(timeout=60_000)


def _delete_connection(conn_id: str) -> None:
    from airflow.models.connection import Connection
    from airflow.utils.session import create_session

    with create_session() as session:
        session.execute(sa.delete(Connection).where(Connection.conn_id == conn_id))


@pytest.fixture()
def clean_bos_default(monkeypatch) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_BOS_DEFAULT", raising=False)
    _delete_connection(CONN_ID)
    yield
    _delete_connection(CONN_ID)
    store = SqlTokenStore(default_token_store_url())
    store.delete(CONN_ID)
    store.dispose()


def test_connect_check_sync_revoke_and_reconnect_in_the_browser(
    api_server,
    reference_server,
    browser_as,
    artifacts: Path,
    airflow_db: Path,
    tmp_path: Path,
    monkeypatch,
    clean_bos_default,
) -> None:
    page = browser_as("admin")
    callbacks: list[str] = []
    page.on(
        "request", lambda request: callbacks.append(request.url) if "/bos/callback" in request.url else None
    )

    # Admin -> BOS in the Airflow UI opens the plugin's page (in its own tab: the sign-in is top-level).
    page.goto(f"{api_server.base_url}/")
    page.get_by_role("button", name="Admin").click(timeout=120_000)
    entry = page.get_by_role("menuitem", name="BOS")
    entry.wait_for(timeout=30_000)
    page.screenshot(path=str(artifacts / "01-admin-menu.png"))
    assert entry.locator("xpath=descendant-or-self::a").first.get_attribute("href") == "/bos/"

    page.goto(f"{api_server.base_url}/bos/")
    page.screenshot(path=str(artifacts / "02-bos-page.png"))

    # Connect a new connection: the browser goes to the reference server's sign-in and back.
    page.locator("#conn_id").fill(CONN_ID)
    page.locator("#resource_url").fill(reference_server.mcp_url)
    page.locator('button[data-action="connect-new"]').click()
    page.wait_for_url(re.compile(r"/bos/\?connected=bos_default&sig=\d+\.[\w-]+$"), timeout=60_000)
    assert _state(page, CONN_ID) == "connected"
    assert "Connected 'bos_default'" in page.locator(".notice").inner_text()  # the callback signed it
    page.screenshot(path=str(artifacts / "03-connected.png"))

    # Check: discovery + bos_get_context shows the contexts the grant can read.
    page.locator(f'tr[data-conn-id="{CONN_ID}"] button[data-action="check"]').click()
    page.locator("h1", has_text="2 authorized context(s)").wait_for(timeout=60_000)
    assert page.locator("tr[data-context]").count() == 2
    page.screenshot(path=str(artifacts / "04-check-contexts.png"))

    # The Connection holds no secret; the token store holds the grant.
    from airflow.models.connection import Connection
    from airflow.utils.session import create_session

    with create_session() as session:
        conn = session.scalars(sa.select(Connection).where(Connection.conn_id == CONN_ID)).one()
        assert (conn.conn_type, conn.host, conn.password) == ("bos", reference_server.mcp_url, None)
        assert conn.extra_dejson["auth_type"] == "oauth" and conn.extra_dejson["client_id"]
    store = SqlTokenStore(default_token_store_url(), cipher=airflow_fernet_cipher())
    grant = store.load(CONN_ID)
    assert grant is not None and grant.refresh_token
    assert grant.refresh_token not in page.content()

    # bos_sync_people runs with the Connection the page created.
    from tests.airflow.conftest import load_dag

    warehouse = f"sqlite:///{tmp_path / 'warehouse.db'}"
    monkeypatch.setenv(
        "AIRFLOW_CONN_BOS_WAREHOUSE", f'{{"conn_type": "sqlite", "host": "{tmp_path / "warehouse.db"}"}}'
    )
    dag_run = load_dag(airflow_db, "bos_sync_people.py", "bos_sync_people").test()
    states = {ti.task_id: str(getattr(ti.state, "value", ti.state)) for ti in dag_run.get_task_instances()}
    assert states == {
        "sync_people": "success",
        "check_completeness": "success",
        "summarize_people": "success",
    }
    engine = sa.create_engine(warehouse)
    with engine.connect() as db:
        assert db.execute(sa.text("SELECT COUNT(*) FROM bos_people")).scalar_one() == 350
    engine.dispose()

    # BOS revokes the grant: the page says so.
    current = store.load(CONN_ID)
    assert current is not None and current.refresh_token
    reference_server.revoke_grant_of(current.refresh_token)
    page.goto(f"{api_server.base_url}/bos/")
    assert _state(page, CONN_ID) == "reconnect needed"
    page.screenshot(path=str(artifacts / "05-reconnect-needed.png"))

    # Reconnect: a new grant, a higher generation, connected again.
    before = store.load(CONN_ID)
    page.locator(f'tr[data-conn-id="{CONN_ID}"] button[data-action="connect"]').click()
    page.wait_for_url(re.compile(r"/bos/\?connected=bos_default&sig=\d+\.[\w-]+$"), timeout=60_000)
    assert _state(page, CONN_ID) == "connected"
    after = store.load(CONN_ID)
    assert after is not None and before is not None and after.generation > before.generation
    assert after.refresh_token != before.refresh_token
    page.screenshot(path=str(artifacts / "06-reconnected.png"))
    store.dispose()

    # Connect and reconnect are logged, without a secret.
    log = api_server.log()
    assert log.count("BOS connect finished for 'bos_default'") == 2
    codes = [parse_qs(urlsplit(url).query)["code"][0] for url in callbacks]
    assert len(codes) == 2
    for secret in (before.refresh_token, after.refresh_token, after.access_token, *codes):
        assert secret and secret not in log


def test_a_user_without_connection_edit_rights_gets_403(api_server, browser_as, artifacts: Path) -> None:
    page = browser_as("viewer")
    response = page.goto(f"{api_server.base_url}/bos/")
    assert response is not None and response.status == 403
    assert "edit Connections" in page.content()
    page.screenshot(path=str(artifacts / "viewer-403.png"))


def _connect_over_http(api_server, reference_server, conn_id: str) -> None:
    """The page's Connect as a browser performs it, with httpx: form post, sign-in, callback."""
    import httpx

    cookies = {"_token": api_server.token("admin")}
    with httpx.Client(base_url=api_server.base_url, cookies=cookies) as airflow_ui, httpx.Client() as browser:
        page = airflow_ui.get("/bos/")
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', page.text).group(1)
        response = airflow_ui.post(
            "/bos/connect",
            headers={"Origin": api_server.base_url},
            data={"csrf_token": csrf, "conn_id": conn_id, "resource_url": reference_server.mcp_url},
        )
        assert response.status_code == 303, response.text
        location = response.headers["location"]
        while not location.startswith(api_server.base_url):
            location = httpx.URL(location).join(browser.get(location).headers["location"]).__str__()
        done = airflow_ui.get(location.removeprefix(api_server.base_url))
        assert done.status_code == 303, done.text
        assert re.fullmatch(rf"/bos/\?connected={re.escape(conn_id)}&sig=\d+\.[\w-]+", done.headers["location"])


def _without_client(extra: dict) -> dict:
    return {k: v for k, v in extra.items() if k != "client_id"}


def test_the_cli_and_the_page_produce_the_same_grant_row_and_connection(api_server, reference_server) -> None:
    from airflow.models.connection import Connection
    from airflow.utils.session import create_session

    from airflow_provider_bos.cli import main as cli

    ui_id, cli_id = "bos_twin_ui", "bos_twin_cli"
    _connect_over_http(api_server, reference_server, ui_id)
    assert (
        cli(
            [
                "connect",
                "--conn-id",
                cli_id,
                "--resource",
                reference_server.mcp_url,
                "--auto-follow",
                "--save-connection",
            ]
        )
        == 0
    )

    store = SqlTokenStore(default_token_store_url())
    rows = {key: store.raw_row(key) for key in (ui_id, cli_id)}
    with create_session() as session:
        conns = {
            c.conn_id: c
            for c in session.scalars(sa.select(Connection).where(Connection.conn_id.in_([ui_id, cli_id])))
        }
        session.expunge_all()
    try:
        per_sign_in = {
            "key",
            "client_id",
            "access_token",
            "refresh_token",
            "expires_at",
            "updated_at",
            "seed_fingerprint",
            "consumed_seeds",
        }
        same = {k: v for k, v in rows[ui_id].items() if k not in per_sign_in}
        assert same == {k: v for k, v in rows[cli_id].items() if k not in per_sign_in}
        assert same["generation"] == 1 and same["resource"] == reference_server.mcp_url
        # Both rows hold their tokens the same way (Fernet-encrypted or raw, by the same key).
        assert rows[ui_id]["refresh_token"].split(":")[0] == rows[cli_id]["refresh_token"].split(":")[0]

        ui, cli_conn = conns[ui_id], conns[cli_id]
        assert (
            (ui.conn_type, ui.host)
            == (cli_conn.conn_type, cli_conn.host)
            == ("bos", reference_server.mcp_url)
        )
        assert _without_client(ui.extra_dejson) == _without_client(cli_conn.extra_dejson)
        assert ui.extra_dejson["client_id"] == rows[ui_id]["client_id"]
        assert cli_conn.extra_dejson["client_id"] == rows[cli_id]["client_id"]
        # Neither copies a secret into the Connection: the token store is the source of truth.
        assert ui.password is None and cli_conn.password is None
    finally:
        with create_session() as session:
            session.execute(sa.delete(Connection).where(Connection.conn_id.in_([ui_id, cli_id])))
        for key in (ui_id, cli_id):
            store.delete(key)
        store.dispose()


def test_state_changing_requests_need_the_pages_csrf_token(api_server, reference_server) -> None:
    import httpx

    with httpx.Client(base_url=api_server.base_url, cookies={"_token": api_server.token("admin")}) as client:
        form = {"conn_id": "bos_csrf", "resource_url": reference_server.mcp_url}
        forged = client.post("/bos/connect", data=form)
        assert forged.status_code == 403 and "CSRF" in forged.text
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/bos/").text).group(1)
        cross_site = client.post(
            "/bos/connect", data={**form, "csrf_token": csrf}, headers={"Origin": "https://evil.example"}
        )
        assert cross_site.status_code == 403 and "another site" in cross_site.text
        other_users_token = csrf_token("viewer", key=API_SECRET_KEY.encode())
        assert client.post("/bos/connect", data={**form, "csrf_token": other_users_token}).status_code == 403
        # The token outlives the session credential: a re-issued JWT of the same user still posts.
        client.cookies.set("_token", api_server.token("admin"))
        started = client.post(
            "/bos/connect", data={**form, "csrf_token": csrf}, headers={"Origin": api_server.base_url}
        )
        assert started.status_code == 303 and started.headers["location"].startswith(reference_server.issuer)


def test_a_viewer_cannot_connect_or_check_either(api_server) -> None:
    import httpx

    headers = {"Authorization": f"Bearer {api_server.token('viewer')}"}
    with httpx.Client(base_url=api_server.base_url, headers=headers) as client:
        assert client.get("/bos/").status_code == 403
        assert client.post("/bos/connections/bos_default/check").status_code == 403
        code = "LEAKCODE-" + "x7Qz" * 8  # refused before the handler runs: still never logged in clear
        assert client.get("/bos/callback", params={"state": "s", "code": code, "iss": "i"}).status_code == 403
    # The access log line is written after the response: wait for it, then look.
    deadline = time.monotonic() + 30
    while "path=/bos/callback" not in api_server.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "path=/bos/callback" in api_server.log() and code not in api_server.log()


def test_a_conn_id_with_a_slash_or_a_hash_can_be_checked(api_server, reference_server) -> None:
    # Airflow allows "/" and "#" in a conn_id; the page listed such Connections with Check and
    # Connect links that answered 404.
    import html
    import json
    from urllib.parse import quote

    import httpx
    from airflow.models.connection import Connection
    from airflow.utils.session import create_session

    ids = ["bos/prod_page", "bos#eu_page"]
    with create_session() as session:
        for conn_id in ids:
            session.add(Connection(conn_id=conn_id, conn_type="bos", host=reference_server.mcp_url,
                                   password=reference_server.create_api_key(),
                                   extra=json.dumps({"auth_type": "api_key"})))
    try:
        with httpx.Client(base_url=api_server.base_url, cookies={"_token": api_server.token("admin")}) as client:
            page = client.get("/bos/").text
            csrf = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
            for conn_id in ids:
                path = html.escape(quote(conn_id, safe=""))
                action = re.search(rf'action="([^"]*connections/{re.escape(path)}/check)"', page).group(1)
                checked = client.post(html.unescape(action), data={"csrf_token": csrf},
                                      headers={"Origin": api_server.base_url})
                assert checked.status_code == 200, checked.text
                assert "ctx_acme_people_prod" in checked.text  # the contexts BOS answered for that Connection
    finally:
        # Their passwords are encrypted with this module's key: left behind, they break any later reader.
        for conn_id in ids:
            _delete_connection(conn_id)


def _forget(conn_id: str) -> None:
    _delete_connection(conn_id)
    store = SqlTokenStore(default_token_store_url())
    store.delete(conn_id)
    store.dispose()


def _connect_and_check_in(page, base_url: str, reference_server, conn_id: str, artifacts: Path) -> None:
    page.goto(f"{base_url}/bos/")
    page.locator("#conn_id").fill(conn_id)
    page.locator("#resource_url").fill(reference_server.mcp_url)
    page.locator('button[data-action="connect-new"]').click()
    page.wait_for_url(re.compile(rf"/bos/\?connected={conn_id}&sig=\d+\.[\w-]+$"), timeout=60_000)
    assert _state(page, conn_id) == "connected"
    page.screenshot(path=str(artifacts / "connected.png"))
    page.locator(f'tr[data-conn-id="{conn_id}"] button[data-action="check"]').click()
    page.locator("h1", has_text="2 authorized context(s)").wait_for(timeout=60_000)


def test_connect_in_all_admins_mode_without_a_session_cookie(
    all_admins_api_server, reference_server, chromium, artifacts: Path
) -> None:
    conn_id = "bos_all_admins_browser"
    context = chromium.new_context(viewport={"width": 1400, "height": 900})
    try:
        _connect_and_check_in(context.new_page(), all_admins_api_server.base_url, reference_server, conn_id,
                              artifacts)
        assert "_token" not in {cookie["name"] for cookie in context.cookies()}  # no session cookie
    finally:
        context.close()
        _forget(conn_id)


def test_connect_after_a_password_login_in_the_browser(
    api_server, reference_server, chromium, artifacts: Path
) -> None:
    conn_id = "bos_password_browser"
    context = chromium.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    try:
        page.goto(f"{api_server.base_url}/bos/")  # not signed in: Airflow's login page
        page.locator("input[type=password]").wait_for(timeout=120_000)
        page.locator("input:not([type=password])").first.fill("admin")
        page.locator("input[type=password]").fill("admin")
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(re.compile(r"/bos/$"), timeout=60_000)
        assert "_token" in {cookie["name"] for cookie in context.cookies()}
        _connect_and_check_in(page, api_server.base_url, reference_server, conn_id, artifacts)
    finally:
        context.close()
        _forget(conn_id)
