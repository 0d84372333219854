"""Leak scan: no token, key, code or verifier ever shows up where a person or a log shipper can read it.

One end-to-end story, as a user lives it:

1. ``airflow-provider-bos connect --auto-follow --no-browser`` (in-process, ``--no-save-connection``)
   against the reference server: discovery, client registration, PKCE sign-in, code exchange.
2. A full sync with that grant through ``dag.test()``, with access tokens that die after two
   requests, so the refresh token rotates several times during the run.
3. A failing sync after the grant is revoked (the exception text and the audit row).
4. A sync with an API key, and a failing one with an unknown API key.

Every secret minted on the way is collected (the PKCE verifier and the auth code by wrapping the
connect functions; every access/refresh token generation by wrapping ``request_token`` and reading
the token store) and then searched for in: captured logs (every logger at DEBUG), stdout/stderr
(the CLI output and the Airflow task log lines), XCom values, rendered template fields, the audit
rows (all columns), the whole Airflow metadata database file, the warehouse file, the token store
file (encrypted at rest: Airflow has a Fernet key here) and exception messages. Finally every
secret must be known to Airflow's secrets masker.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import traceback
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import airflow_provider_bos.auth.connect as connect_mod
import airflow_provider_bos.auth.grants as grants_mod
from airflow_provider_bos.testing.scenario import FaultSpec, Scenario, SourceSpec

pytestmark = pytest.mark.airflow

SCENARIO = Scenario(
    name="leak-scan",
    seed=5,
    shared_people=3,
    sources=[SourceSpec(source_type="crm", source_identity="crm-eu", records=20, page_size=5),
             SourceSpec(source_type="hr", source_identity="hr-main", records=10, page_size=5)],
    # Each access token dies after 2 authorized requests: several rotations within one sync.
    faults=FaultSpec(expire_access_token_after_requests=2),
)


@pytest.fixture(autouse=True)
def fresh_secret_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """This module's tests start with the secret registry a task process starts with: empty. The
    registry is process-wide and forwards at most ``redaction.MAX_SECRETS`` values to Airflow's masker;
    the secrets earlier tests on the same worker minted would otherwise keep these from reaching it.
    (Only here: reset for every test, the masker, which keeps every value, would grow without bound.)"""
    from collections import OrderedDict

    from airflow_provider_bos import redaction

    monkeypatch.setattr(redaction, "_known", OrderedDict())
    monkeypatch.setattr(redaction, "_forwarded", 0)
    monkeypatch.setattr(redaction, "_warned", False)


class SecretCollector:
    """Every secret value minted during the test, by kind."""

    def __init__(self) -> None:
        self.values: dict[str, set[str]] = {}

    def add(self, kind: str, value: str | None) -> None:
        if value:
            self.values.setdefault(kind, set()).add(value)

    def all(self) -> list[tuple[str, str]]:
        return [(kind, v) for kind, vs in self.values.items() for v in vs]

    def find_in(self, where: str, text: str | bytes) -> list[str]:
        hay = text if isinstance(text, bytes) else text.encode("utf-8", "replace")
        return [f"{kind} found in {where}" for kind, v in self.all() if v.encode() in hay]


@pytest.fixture()
def secrets(monkeypatch: pytest.MonkeyPatch) -> SecretCollector:
    collector = SecretCollector()
    real_prepare, real_validate, real_request = (connect_mod.prepare_authorization, connect_mod.validate_callback,
                                                 grants_mod.request_token)

    def prepare(*args: Any, **kwargs: Any) -> Any:
        pending = real_prepare(*args, **kwargs)
        collector.add("pkce-verifier", pending.verifier)
        return pending

    def validate(pending: Any, callback_url: str) -> str:
        code = real_validate(pending, callback_url)
        collector.add("auth-code", code)
        return code

    def request_token(*args: Any, **kwargs: Any) -> Any:
        tokens = real_request(*args, **kwargs)
        collector.add("access-token", tokens.access_token)
        collector.add("refresh-token", tokens.refresh_token)
        return tokens

    monkeypatch.setattr(connect_mod, "prepare_authorization", prepare)
    monkeypatch.setattr(connect_mod, "validate_callback", validate)
    monkeypatch.setattr(grants_mod, "request_token", request_token)
    monkeypatch.setattr(connect_mod, "request_token", request_token, raising=False)
    return collector


@pytest.fixture()
def fernet_key(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A Fernet key in Airflow's config for this test (the token store must encrypt at rest).

    ``airflow.models.crypto.get_fernet`` is cached per process, and whether an earlier test saw an
    airflow.cfg with a key depends on test order: clear the cache on the way in and out.
    """
    from cryptography.fernet import Fernet

    from tests.airflow_names import forget_fernet

    key = Fernet.generate_key().decode()
    monkeypatch.setenv("AIRFLOW__CORE__FERNET_KEY", key)
    forget_fernet()
    yield key
    monkeypatch.undo()
    forget_fernet()


def _metadata_rows(dag_run: Any) -> tuple[list[Any], list[Any]]:
    """XCom values and rendered template fields of one DAG run."""
    from airflow.models.renderedtifields import RenderedTaskInstanceFields
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        xcoms = [row.value for row in session.scalars(
            sa.select(XComModel).where(XComModel.dag_id == dag_run.dag_id, XComModel.run_id == dag_run.run_id))]
        rendered = [row.rendered_fields for row in session.scalars(
            sa.select(RenderedTaskInstanceFields).where(RenderedTaskInstanceFields.dag_id == dag_run.dag_id,
                                                        RenderedTaskInstanceFields.run_id == dag_run.run_id))]
    return xcoms, rendered


def _run_dag(dags_folder: Path, dag_id: str, filename: str, monkeypatch: pytest.MonkeyPatch, **env: str) -> Any:
    """dag.test() of a DAG file in the session dags folder (tests/airflow/dags is copied there)."""
    from tests.airflow_names import DagBag

    with monkeypatch.context() as m:
        for key, value in env.items():
            m.setenv(key, value)
        bag = DagBag(dag_folder=str(dags_folder / filename))
        assert not bag.import_errors, bag.import_errors
        return bag.get_dag(dag_id).test()


def _task_states(dag_run: Any) -> dict[str, str]:
    return {ti.task_id: str(getattr(ti.state, "value", ti.state)) for ti in dag_run.get_task_instances()}


def _files_bytes(*paths: Path) -> bytes:
    out = b""
    for base in paths:
        for candidate in [base, base.with_name(base.name + "-wal"), base.with_name(base.name + "-journal")]:
            if candidate.is_file():
                out += candidate.read_bytes()
    return out


def test_no_secret_leaks_anywhere(bos_server, airflow_db, fernet_key, secrets, tmp_path, monkeypatch,
                                  caplog, capfd) -> None:
    from airflow_provider_bos.auth import SqlTokenStore
    from airflow_provider_bos.cli import main as cli_main
    from airflow_provider_bos.hooks.bos import BosHook
    from airflow_provider_bos.hooks.connections import airflow_fernet_cipher

    caplog.set_level(logging.DEBUG)  # every logger, including httpx/httpcore wire logs
    server = bos_server
    server.set_scenario(SCENARIO)
    store_file = tmp_path / "tokens.db"
    store_url = f"sqlite:///{store_file}"
    warehouse = tmp_path / "warehouse.db"
    table, audit = f"t_{uuid.uuid4().hex[:10]}", f"a_{uuid.uuid4().hex[:10]}"
    problems: list[str] = []
    texts: dict[str, str] = {}

    # 1. connect ------------------------------------------------------------------------------------
    out = io.StringIO()
    status = cli_main(["connect", "--conn-id", "bos_default", "--resource", server.mcp_url, "--auto-follow",
                       "--no-browser", "--no-save-connection", "--token-store-url", store_url, "--timeout", "30"],
                      stdout=out)
    texts["connect CLI output"] = out.getvalue()
    assert status == 0, out.getvalue()
    assert {"pkce-verifier", "auth-code", "access-token", "refresh-token"} <= set(secrets.values)
    assert '"password":"***"' in out.getvalue()  # the Connection it prints hides the refresh token
    [connected_refresh] = secrets.values["refresh-token"]
    client_id = json.loads(out.getvalue().split("usable as AIRFLOW_CONN_BOS_DEFAULT):", 1)[1].split("\n\n")[1]
                           .strip())["extra"]["client_id"]

    # 2. a full sync with rotations -------------------------------------------------------------------
    conn = {"conn_type": "bos", "host": server.mcp_url, "password": connected_refresh,
            "extra": {"auth_type": "oauth", "client_id": client_id, "token_store_url": store_url}}
    monkeypatch.setenv("AIRFLOW_CONN_BOS_DEFAULT", json.dumps(conn))
    monkeypatch.setenv("AIRFLOW_CONN_BOS_WAREHOUSE", json.dumps({"conn_type": "sqlite", "host": str(warehouse)}))
    monkeypatch.setenv("BOS_TEST_TABLE", table)
    monkeypatch.setenv("BOS_TEST_AUDIT_TABLE", audit)
    ok_run = _run_dag(airflow_db, "bos_test_faults", "bos_test_faults.py", monkeypatch)
    assert _task_states(ok_run) == {"sync": "success"}
    assert server.counters.refreshes >= 2  # the refresh token really rotated during the run
    store = SqlTokenStore(store_url, cipher=airflow_fernet_cipher())
    grant = store.load("bos_default")
    assert grant is not None and grant.generation >= 3
    secrets.add("access-token", grant.access_token)
    secrets.add("refresh-token", grant.refresh_token)
    assert len(secrets.values["refresh-token"]) >= 3

    # 3. the grant is revoked: a failing sync -----------------------------------------------------------
    server.revoke_grant_of(grant.refresh_token)
    # The stored access token has expired too: the client must present the revoked refresh token.
    store.save(dataclasses.replace(grant, expires_at=0.0))
    failed_run = _run_dag(airflow_db, "bos_test_faults", "bos_test_faults.py", monkeypatch)
    assert _task_states(failed_run) == {"sync": "failed"}
    with pytest.raises(Exception) as excinfo:  # the same failure, as a TaskFlow user would see it
        with BosHook("bos_default") as hook:
            hook.federated_read("people.search", {})
    assert "airflow-provider-bos connect" in str(excinfo.value)
    texts["revoked: exception"] = "".join(traceback.format_exception(excinfo.value)) + repr(excinfo.value)

    # 4. API keys: one that works, one the server does not know ---------------------------------------
    api_key = server.create_api_key()
    secrets.add("api-key", api_key)
    unknown_key = f"bosk_leakcheck_{uuid.uuid4().hex}"
    secrets.add("api-key", unknown_key)
    for conn_id, key in (("bos_apikey", api_key), ("bos_badkey", unknown_key)):
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(
            {"conn_type": "bos", "host": server.mcp_url, "password": key, "extra": {"auth_type": "api_key"}}))
    key_run = _run_dag(airflow_db, "bos_test_faults", "bos_test_faults.py", monkeypatch, BOS_TEST_CONN_ID="bos_apikey")
    assert _task_states(key_run) == {"sync": "success"}
    bad_key_run = _run_dag(airflow_db, "bos_test_faults", "bos_test_faults.py", monkeypatch,
                           BOS_TEST_CONN_ID="bos_badkey")
    assert _task_states(bad_key_run) == {"sync": "failed"}
    with pytest.raises(Exception) as key_exc:
        with BosHook("bos_badkey") as hook:
            hook.federated_read("people.search", {})
    texts["bad api key: exception"] = "".join(traceback.format_exception(key_exc.value)) + repr(key_exc.value)

    # --- scan ---------------------------------------------------------------------------------------
    captured = capfd.readouterr()
    texts["stdout (CLI, task logs)"] = captured.out
    texts["stderr"] = captured.err
    texts["log records"] = "\n".join(
        f"{r.name} {r.getMessage()} {r.exc_text or ''} {r.args!r}" for r in caplog.records)
    for dag_run in (ok_run, failed_run, key_run, bad_key_run):
        xcoms, rendered = _metadata_rows(dag_run)
        texts[f"XCom of {dag_run.run_id}"] = json.dumps(xcoms, default=str)
        texts[f"rendered fields of {dag_run.run_id}"] = json.dumps(rendered, default=str)
    engine = sa.create_engine(f"sqlite:///{warehouse}")
    with engine.connect() as c:
        audit_rows = [dict(r) for r in c.execute(sa.text(f"SELECT * FROM {audit}")).mappings()]
    engine.dispose()
    assert [r["status"] for r in audit_rows] == ["complete", "failed", "complete", "failed"]
    assert "airflow-provider-bos connect" in audit_rows[1]["error_message"]
    texts["audit rows"] = json.dumps(audit_rows, default=str)
    for name, text in texts.items():
        problems += secrets.find_in(name, text)
    home = airflow_db.parent
    problems += secrets.find_in("the Airflow metadata database file", _files_bytes(home / "airflow.db"))
    problems += secrets.find_in("Airflow log files", b"".join(
        p.read_bytes() for p in (home / "logs").rglob("*") if p.is_file()) if (home / "logs").is_dir() else b"")
    problems += secrets.find_in("the warehouse database file", _files_bytes(warehouse))
    assert store.encrypted
    problems += secrets.find_in("the token store file (must be encrypted at rest)", _files_bytes(store_file))
    store.dispose()

    assert not problems, sorted(set(problems))
    # The scan looked at what it should have: the task logs and the CLI output were captured.
    assert "BOS progress" in texts["stdout (CLI, task logs)"] + texts["log records"]
    assert "Connected 'bos_default'" in texts["connect CLI output"]

    # --- every secret is registered with Airflow's masker ---------------------------------------------
    from airflow.sdk.log import redact

    unmasked = [kind for kind, value in secrets.all() if redact(f"<{value}>") != "<***>"]
    assert not unmasked, sorted(set(unmasked))


def test_a_secret_is_redacted_before_an_excerpt_is_cut() -> None:
    """A token cut in half by truncation is no longer recognisable to the secrets masker."""
    from airflow_provider_bos.exceptions import excerpt
    from airflow_provider_bos.redaction import register_secret

    token = "rt_" + uuid.uuid4().hex * 2
    register_secret(token)
    for cut in range(150, 200, 7):
        body = ("x" * cut + token + " tail").encode()
        shown = excerpt(body, 200)
        assert token[:8] not in shown, cut


@pytest.mark.parametrize("filler", [" ", "\u3000"])  # U+3000 is whitespace of three UTF-8 bytes
@pytest.mark.parametrize("as_bytes", [True, False])
def test_a_secret_across_the_excerpt_scan_window_is_redacted(as_bytes: bool, filler: str) -> None:
    """A body whose secret straddles the scan window's end, after a long run of whitespace (collapsed
    into one space, so the part inside the window would land in the shown excerpt)."""
    from airflow_provider_bos.exceptions import _EXCERPT_SCAN_BYTES, excerpt
    from airflow_provider_bos.redaction import register_secret

    token = "rt_" + uuid.uuid4().hex * 2
    register_secret(token)
    for inside in (4, 10, len(token) - 1):
        text = filler * (_EXCERPT_SCAN_BYTES - inside) + token + " tail"
        shown = excerpt(text.encode() if as_bytes else text, 200)
        assert token[:inside] not in shown, inside
        assert "***" in shown, inside


def test_a_secret_in_a_long_audit_error_message_is_redacted_before_the_cut() -> None:
    """The audit row's error_message is cut to its column size: a token across the cut is redacted
    whole, not stored as a prefix the masker no longer recognises."""
    from airflow_provider_bos.redaction import register_secret
    from airflow_provider_bos.warehouse.run.audit import ERROR_MESSAGE_MAX, truncate_error

    token = "at_" + uuid.uuid4().hex * 2
    register_secret(token)
    for inside in (4, 12, len(token) - 1):
        message = "BOS refused: " + "x" * (ERROR_MESSAGE_MAX - 14 - inside) + token + " and more"
        stored = truncate_error(message)
        assert stored is not None and len(stored) <= ERROR_MESSAGE_MAX
        assert token[:inside] not in stored, inside
    assert truncate_error(f"refused {token}") == "refused ***"


def test_server_text_in_errors_has_control_characters_escaped() -> None:
    from airflow_provider_bos.auth.discovery import validate_metadata_url
    from airflow_provider_bos.exceptions import BosDiscoveryError, excerpt

    hostile = "evil\x1b[2J\x1b]0;owned\x07\r\nINFO forged log line\u202e\x00"
    shown = excerpt(hostile)
    assert not any(not ch.isprintable() for ch in shown) and "\\x1b" in shown
    with pytest.raises(BosDiscoveryError) as caught:
        validate_metadata_url("http://bos.example/" + hostile, what="resource_metadata")
    assert not any(not ch.isprintable() for ch in str(caught.value))
