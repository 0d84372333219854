"""The ``airflow-provider-bos`` command against the reference server (auto-consent)."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urljoin

import httpx
import pytest
from cryptography.fernet import Fernet
from sqlalchemy.engine import make_url

from airflow_provider_bos import cli
from airflow_provider_bos.auth.grants import OAuthGrantAuth
from airflow_provider_bos.auth.token_store import SqlTokenStore

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    },
}


def run(argv: list[str], stdin: io.TextIOBase | None = None) -> tuple[int, str]:
    out = io.StringIO()
    code = cli.main(argv, stdout=out, stdin=stdin or io.StringIO(""))
    return code, out.getvalue()


def connection_json(output: str) -> dict:
    line = next(line for line in output.splitlines() if line.strip().startswith('{"conn_type"'))
    return json.loads(line.strip())


def works(bos_server, store: SqlTokenStore, doc: dict, refresh_token: str | None = None) -> bool:
    auth = OAuthGrantAuth(
        store,
        "bos_default",
        token_endpoint=store.load("bos_default").token_endpoint,
        client_id=doc["extra"]["client_id"],
        resource=doc["host"],
        seed_refresh_token=refresh_token,
    )
    with httpx.Client(auth=auth, headers={"Accept": "application/json, text/event-stream"}) as client:
        return client.post(bos_server.mcp_url, json=INIT).status_code == 200


@pytest.fixture(autouse=True)
def _no_airflow_fernet_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether AIRFLOW_HOME has a Fernet key depends on which tests ran before (``airflow db
    migrate`` writes one into airflow.cfg); tests that are not about encryption run without one."""
    monkeypatch.setattr(cli, "airflow_fernet_cipher", lambda: None)


@pytest.fixture()
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'tokens.db'}"


def test_connect_with_the_loopback_listener(bos_server, store_url: str) -> None:
    code, output = run(
        [
            "connect",
            "--conn-id",
            "bos_default",
            "--resource",
            bos_server.mcp_url,
            "--token-store-url",
            store_url,
            "--auto-follow",
            "--timeout",
            "30",
        ]
    )
    assert code == 0, output
    store = SqlTokenStore(store_url)
    row = store.load("bos_default")
    assert row is not None and row.generation == 1 and row.resource == bos_server.mcp_url
    assert row.refresh_token not in output and row.access_token not in output
    assert re.search(r"/authorize\?response_type=code&client_id=", output)
    doc = connection_json(output)
    assert doc == {
        "conn_type": "bos",
        "host": bos_server.mcp_url,
        "password": "***",
        "extra": {
            "auth_type": "oauth",
            "client_id": row.client_id,
            "protocol": "auto",
            "scopes": "mcp:tools offline_access",
            "token_store_url": store_url,
        },
    }
    assert "export AIRFLOW_CONN_BOS_DEFAULT=" in output
    add = next(line for line in output.splitlines() if "airflow connections add" in line)
    args = shlex.split(add)
    assert args[:4] == ["airflow", "connections", "add", "bos_default"] and json.loads(args[5]) == doc
    assert works(bos_server, store, doc)
    store.dispose()


def test_show_secrets_prints_the_refresh_token_for_the_connection(bos_server, store_url: str) -> None:
    code, output = run(
        [
            "connect",
            "--resource",
            bos_server.mcp_url,
            "--token-store-url",
            store_url,
            "--auto-follow",
            "--show-secrets",
        ]
    )
    assert code == 0, output
    store = SqlTokenStore(store_url)
    doc = connection_json(output)
    assert doc["password"] == store.load("bos_default").refresh_token
    # A worker reading this Connection finds the row seeded from exactly this token: no re-seed.
    assert works(bos_server, store, doc, refresh_token=doc["password"])
    assert store.load("bos_default").generation == 1
    store.dispose()


class PastingStdin(io.StringIO):
    """A user who opens the printed URL in a browser and pastes where it landed."""

    def __init__(self, out: io.StringIO, redirect: str) -> None:
        super().__init__()
        self.out, self.redirect = out, redirect

    def readline(self, *args) -> str:  # type: ignore[override]
        url = re.search(r"^\s+(http\S+/authorize\?\S+)$", self.out.getvalue(), re.MULTILINE).group(1)
        with httpx.Client() as browser:
            while not url.startswith(self.redirect):
                url = urljoin(url, browser.get(url).headers["location"])
        return url + "\n"


def test_paste_mode_with_a_registered_client(bos_server, store_url: str) -> None:
    redirect = "https://airflow.example.com/bos/callback"
    client_id = bos_server.register_client([redirect])
    out = io.StringIO()
    code = cli.main(
        [
            "connect",
            "--conn-id",
            "bos_paste",
            "--resource",
            bos_server.mcp_url,
            "--client-id",
            client_id,
            "--redirect-uri",
            redirect,
            "--no-browser",
            "--token-store-url",
            store_url,
        ],
        stdout=out,
        stdin=PastingStdin(out, redirect),
    )
    assert code == 0, out.getvalue()
    assert "paste the full URL" in out.getvalue()
    assert connection_json(out.getvalue())["extra"]["client_id"] == client_id
    store = SqlTokenStore(store_url)
    assert store.load("bos_paste").client_id == client_id
    store.dispose()


def test_the_store_is_encrypted_with_airflows_fernet_key(bos_server, store_url: str, monkeypatch) -> None:
    fernet = Fernet(Fernet.generate_key())
    monkeypatch.setattr(cli, "airflow_fernet_cipher", lambda: fernet)
    code, output = run(
        ["connect", "--resource", bos_server.mcp_url, "--token-store-url", store_url, "--auto-follow"]
    )
    assert code == 0 and "encrypted with Airflow Fernet key" in output
    raw = SqlTokenStore(store_url).raw_row("bos_default")
    assert raw["refresh_token"].startswith("enc:v2:")
    assert SqlTokenStore(store_url, cipher=fernet).load("bos_default").refresh_token


def test_token_store_show_prints_status_without_secrets(bos_server, store_url: str) -> None:
    assert (
        run(["connect", "--resource", bos_server.mcp_url, "--token-store-url", store_url, "--auto-follow"])[0]
        == 0
    )
    code, output = run(["token-store", "show", "--conn-id", "bos_default", "--token-store-url", store_url])
    assert code == 0
    status = json.loads(output)
    assert status["generation"] == 1 and status["access_token_valid"] is True and status["has_refresh_token"]
    row = SqlTokenStore(store_url).load("bos_default")
    assert row.refresh_token not in output and row.access_token not in output
    assert run(["token-store", "show", "--conn-id", "other", "--token-store-url", store_url])[0] == 1


def test_discovery_failure_exits_1_with_the_rule(capsys, store_url: str) -> None:
    code, _output = run(
        ["connect", "--resource", "http://bos.example/mcp", "--auto-follow", "--token-store-url", store_url]
    )
    assert code == 1
    assert "https-required" in capsys.readouterr().err


def test_default_store_lives_under_airflow_home(bos_server, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "af"))
    code, output = run(["connect", "--resource", bos_server.mcp_url, "--auto-follow"])
    assert code == 0, output
    assert "token_store_url" not in connection_json(output)["extra"]
    assert (tmp_path / "af" / "bos_token_store.db").stat().st_mode & 0o777 == 0o600


@pytest.fixture()
def saved_conn_id(airflow_db: Path) -> Iterator[str]:
    """A Connection id the test saves into the metadata DB, removed after: later tests list and read it."""
    from airflow.models.connection import Connection
    from airflow.utils.session import create_session
    from sqlalchemy import delete

    conn_id = f"bos_cli_{int(time.time() * 1000)}"
    yield conn_id
    with create_session() as session:
        session.execute(delete(Connection).where(Connection.conn_id == conn_id))


@pytest.mark.airflow
def test_save_connection_writes_the_airflow_connection(saved_conn_id: str, bos_server, store_url: str) -> None:
    conn_id = saved_conn_id
    code, output = run(
        [
            "connect",
            "--conn-id",
            conn_id,
            "--resource",
            bos_server.mcp_url,
            "--token-store-url",
            store_url,
            "--auto-follow",
            "--save-connection",
        ]
    )
    assert code == 0, output
    from airflow.models.connection import Connection

    conn = Connection.get_connection_from_secrets(conn_id)
    store = SqlTokenStore(store_url)
    assert conn.conn_type == "bos" and conn.host == bos_server.mcp_url
    # The store holds the grant; the Connection holds no secret (the same as the Admin -> BOS page).
    assert conn.password is None and store.load(conn_id).refresh_token not in output
    assert conn.extra_dejson["token_store_url"] == store_url


    # A reconnect (a revoked grant, a new client) updates the Connection in place: what the user
    # set on it since (a description, the context to read, timeouts) is kept.
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        row = session.scalars(select(Connection).where(Connection.conn_id == conn_id)).one()
        row.description = "HR people, nightly"
        # As Airflow stores bos://http://127.0.0.1:<port>/mcp/... : the path in schema, the port apart.
        url = make_url(bos_server.mcp_url)
        row.host, row.port, row.schema = f"http://{url.host}", url.port, url.database
        row.extra = json.dumps({**row.extra_dejson, "context_handle": "ctx_acme_itsm_sandbox", "timeout": 90,
                                "token_store_conn_id": "store_used_before"})
    code, output = run(["connect", "--conn-id", conn_id, "--resource", bos_server.mcp_url,
                        "--token-store-url", store_url, "--auto-follow", "--save-connection"])
    assert code == 0, output
    conn = Connection.get_connection_from_secrets(conn_id)
    assert conn.description == "HR people, nightly" and conn.password is None
    from airflow_provider_bos.hooks.bos import resource_url_of

    assert (conn.host, conn.schema, conn.port) == (bos_server.mcp_url, None, None)  # no path added twice
    assert resource_url_of(conn) == bos_server.mcp_url
    assert (conn.extra_dejson["context_handle"], conn.extra_dejson["timeout"]) == ("ctx_acme_itsm_sandbox", 90)
    assert conn.extra_dejson["token_store_url"] == store_url and conn.extra_dejson["client_id"]
    # The grant went to the store this sign-in named: an older store setting would send tasks elsewhere.
    assert "token_store_conn_id" not in conn.extra_dejson


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_token_store_in_an_airflow_sql_connection(
    bos_server, tmp_path: Path, monkeypatch, request, backend: str
) -> None:
    if backend == "sqlite":
        path = tmp_path / "shared-tokens.db"
        monkeypatch.setenv("AIRFLOW_CONN_BOS_TOKENS", json.dumps({"conn_type": "sqlite", "host": str(path)}))
        direct_url = f"sqlite:///{path}"
    else:
        direct_url = request.getfixturevalue("postgres_url")
        u = make_url(direct_url)
        monkeypatch.setenv(
            "AIRFLOW_CONN_BOS_TOKENS",
            json.dumps(
                {
                    "conn_type": "postgres",
                    "host": u.host,
                    "port": u.port,
                    "login": u.username,
                    "schema": u.database,
                }
            ),
        )
    conn_id = f"bos_conn_{backend}_{int(time.time() * 1000)}"
    code, output = run(
        [
            "connect",
            "--conn-id",
            conn_id,
            "--resource",
            bos_server.mcp_url,
            "--token-store-conn-id",
            "bos_tokens",
            "--auto-follow",
        ]
    )
    assert code == 0, output
    assert connection_json(output)["extra"]["token_store_conn_id"] == "bos_tokens"
    store = SqlTokenStore(direct_url)
    try:
        assert store.load(conn_id).generation == 1
    finally:
        store.delete(conn_id)
        store.dispose()


def test_console_script_encrypts_with_the_configured_airflow_fernet_key(bos_server, store_url: str) -> None:
    key = Fernet.generate_key()
    env = {**os.environ, "AIRFLOW__CORE__FERNET_KEY": key.decode()}
    script = Path(sys.executable).with_name("airflow-provider-bos")
    proc = subprocess.run(
        [
            str(script),
            "connect",
            "--resource",
            bos_server.mcp_url,
            "--token-store-url",
            store_url,
            "--auto-follow",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "encrypted with Airflow Fernet key" in proc.stdout
    raw = SqlTokenStore(store_url).raw_row("bos_default")
    assert raw["refresh_token"].startswith("enc:v2:") and raw["access_token"].startswith("enc:v2:")
    row = SqlTokenStore(store_url, cipher=Fernet(key)).load("bos_default")
    assert row.refresh_token not in proc.stdout + proc.stderr


@pytest.mark.parametrize("paste", [False, True])
def test_auto_follow_never_logs_the_callback_url_with_its_code(
    bos_server, store_url: str, caplog, monkeypatch, paste: bool
) -> None:
    """The test-only --auto-follow flag must not make httpx log the code (it does at INFO)."""
    argv = ["connect", "--resource", bos_server.mcp_url, "--token-store-url", store_url, "--auto-follow"]
    stdin = None
    if paste:
        redirect = "https://airflow.example.com/bos/callback"
        argv += ["--client-id", bos_server.register_client([redirect]), "--redirect-uri", redirect]
    with caplog.at_level(logging.DEBUG):
        code, output = run(argv, stdin)
    assert code == 0, output
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "callback" not in logged or "code=" not in logged
    assert "bos_code_" not in logged


def test_paste_mode_needs_an_https_redirect_uri(bos_server, store_url: str) -> None:
    for redirect in ("http://airflow.example.com/cb", "http://127.0.0.1:8080/cb", "https://u:p@x.example/cb",
                     "not a url"):
        code, _ = run(["connect", "--resource", bos_server.mcp_url, "--token-store-url", store_url,
                       "--redirect-uri", redirect, "--no-browser"])
        assert code == 1, redirect
    assert bos_server.counters.unauthorized == 0  # refused before discovery began


def test_connect_says_what_to_do_about_a_busy_port_and_a_trailing_slash(bos_server, store_url: str, capsys) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, _ = run(["connect", "--resource", bos_server.mcp_url, "--token-store-url", store_url,
                       "--no-browser", "--port", str(port)])
    error = capsys.readouterr().err
    assert code == 1 and "Traceback" not in error  # a BosError, said in one line
    assert f"Cannot listen for the OAuth callback on 127.0.0.1:{port}" in error and "--port" in error

    code, _ = run(["connect", "--resource", bos_server.mcp_url + "/", "--token-store-url", store_url,
                   "--auto-follow"])
    error = capsys.readouterr().err
    assert code == 1 and "got 307 (a redirect to" in error and "trailing slash" in error
