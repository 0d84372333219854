"""Fault matrix, end to end: reference server fault -> BosFederatedReadOperator in dag.test() -> database.

Every case asserts the three things a user relies on: the task outcome, the records table (exactly
the final records, or byte-for-byte unchanged) and the audit row (status and a typed reason).
The DAG is ``bos_test_faults`` (tests/airflow/dags/bos_test_faults.py): one read task, no sensor.
Each test gets its own records table AND its own audit table, so tests on the shared PostgreSQL and
MariaDB servers cannot see each other's rows.

Records without ``record_ref`` and duplicate ``record_ref``s cannot be produced by a scenario; they
are tested through ``McpSession.federated_read`` + ``WarehouseWriter`` over ``httpx.MockTransport``.

The DAG runs are on SQLite (the fast tier): a fault of the stream, the HTTP status, OAuth or the final
response fails the read before anything is written, whatever the database. What the database does
with them is proven on every dialect in tests/warehouse: rollback of a failed merge and of a stream
failing midway (test_upsert.py, test_streaming_write.py, test_direct_load.py), a restarted final
frame landing exactly its own records (test_frame_restart.py), failed audit rows (test_audit.py).
This file's dialect smoke, on PostgreSQL and MariaDB too (full tier), is the cut and resumed final
frame: it streams several MiB into the table (the direct load on PostgreSQL) and restarts it.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from afhelpers import every_dialect, table_dump, task_states, xcom_summary
from bos_fault_helpers import BASE, audits, final_records, final_refs, scenario, seed_table, table_refs

from airflow_provider_bos.auth import SqlTokenStore
from airflow_provider_bos.exceptions import BosError, BosResultError
from airflow_provider_bos.mcp import McpSession, RetryPolicy
from airflow_provider_bos.testing.scenario import FaultSpec, Scenario, large_scenario
from airflow_provider_bos.warehouse import AuditReader, SyncRunInfo, WarehouseWriter
from airflow_provider_bos.wire import WriteOptions
from tests.fake_bos import CRM, URL, FakeBos

pytestmark = pytest.mark.airflow

DAG_ID, DAG_FILE = "bos_test_faults", "bos_test_faults.py"

all_three = pytest.mark.parametrize(
    "warehouse_url",
    ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres), pytest.param("mysql", marks=pytest.mark.mysql)],
    indirect=True,
)


def run_faults(run_dag: Any, **env: str) -> Any:
    return run_dag(DAG_ID, DAG_FILE, **env)


def assert_failed_untouched(env: dict[str, Any], dag_run: Any, before: list[tuple], *, error_type: type[BaseException],
                            mentions: tuple[str, ...] = ()) -> dict[str, Any]:
    """Task failed, table byte-for-byte unchanged, exactly one new audit row: failed, typed reason."""
    assert task_states(dag_run) == {"sync": "failed"}
    assert table_dump(env["engine"], env["table"]) == before
    rows = [a for a in audits(env["engine"], env["audit"]) if a["dag_id"] == DAG_ID]
    assert len(rows) == 1, rows
    row = rows[0]
    assert row["status"] == "failed"
    assert row["airflow_run_id"] == dag_run.run_id
    assert (row["inserted"] or 0) == 0 and (row["updated"] or 0) == 0
    message = row["error_message"] or ""
    error_name = message.split(":", 1)[0]
    # The audit row names the typed error: the class itself or a subclass of the expected one.
    assert error_name.startswith("Bos"), message
    assert _is_subclass_named(error_name, error_type), message
    for needle in mentions:
        assert needle.lower() in message.lower(), message
    return row


def _is_subclass_named(name: str, base: type[BaseException]) -> bool:
    stack = [base]
    while stack:
        cls = stack.pop()
        if cls.__name__ == name:
            return True
        stack.extend(cls.__subclasses__())
    return False


def assert_landed(env: dict[str, Any], dag_run: Any, sc: Scenario) -> dict[str, Any]:
    assert task_states(dag_run) == {"sync": "success"}
    assert table_refs(env["engine"], env["table"]) == final_refs(sc)
    rows = [a for a in audits(env["engine"], env["audit"]) if a["dag_id"] == DAG_ID]
    assert [r["status"] for r in rows] == ["complete"]
    assert rows[0]["result_count"] == len(final_refs(sc))
    return rows[0]


# --- the stream ends without a usable final response ------------------------------------------------


def test_drop_after_some_notifications_changes_nothing(bos_airflow_audit, run_dag) -> None:
    from airflow_provider_bos.exceptions import BosIncompleteStreamError

    before = seed_table(bos_airflow_audit)
    bos_airflow_audit["server"].set_scenario(scenario(drop_after_notifications=3))

    dag_run = run_faults(run_dag)

    row = assert_failed_untouched(bos_airflow_audit, dag_run, before, error_type=BosIncompleteStreamError)
    # The progress seen before the drop is kept in the audit row (3 notifications were delivered).
    assert row["provisional_pages"] == 3


def test_reset_in_the_middle_of_the_final_frame_changes_nothing(bos_airflow_audit, run_dag) -> None:
    from airflow_provider_bos.exceptions import BosIncompleteStreamError

    before = seed_table(bos_airflow_audit)
    bos_airflow_audit["server"].set_scenario(scenario(drop_mid_final=True))

    dag_run = run_faults(run_dag)

    assert_failed_untouched(bos_airflow_audit, dag_run, before, error_type=BosIncompleteStreamError)


def use_era(monkeypatch: pytest.MonkeyPatch, era: str) -> None:
    """Point the BOS connection at one MCP era (stream resumption exists in the 2025-11-25 session era)."""
    conn = json.loads(os.environ["AIRFLOW_CONN_BOS_DEFAULT"])
    conn["extra"]["protocol"] = era
    monkeypatch.setenv("AIRFLOW_CONN_BOS_DEFAULT", json.dumps(conn))


@all_three
def test_a_final_frame_cut_among_its_records_is_resumed_and_lands_exactly_once(
        bos_airflow_audit, run_dag, monkeypatch) -> None:
    use_era(monkeypatch, "2025-11-25")
    server = bos_airflow_audit["server"]
    # A final frame of several MiB streams into the warehouse as it arrives (batches of 100 rows, the
    # direct load on PostgreSQL); the POST response ends 1 MB into structuredContent, after hundreds
    # of records went in, and the client resumes: the frame comes again from its start.
    sc = large_scenario(3000, sources=2)
    sc.faults = FaultSpec(close_mid_records_bytes=1_000_000, sse_retry_ms=10)
    server.set_scenario(sc)

    dag_run = run_faults(run_dag, BOS_TEST_BATCH_SIZE="100")

    row = assert_landed(bos_airflow_audit, dag_run, sc)
    assert server.counters.resumed_streams == 1 and server.counters.streamed_calls == 1
    summary = xcom_summary(dag_run)
    assert summary["stream_resumptions"] == 1
    assert summary["inserted"] == row["inserted"] == len(final_refs(sc)) and summary["duplicates"] == 0
    # Exactly the final records' content, each once.
    with bos_airflow_audit["engine"].connect() as conn:
        names = dict(conn.execute(sa.text(f"SELECT record_ref, display_name FROM {bos_airflow_audit['table']}")).all())
    assert names == {r["record_ref"]: r["display_name"] for r in final_records(sc)}


def test_a_cut_final_frame_the_server_cannot_resume_changes_nothing(bos_airflow_audit, run_dag, monkeypatch) -> None:
    from airflow_provider_bos.exceptions import BosIncompleteStreamError

    use_era(monkeypatch, "2025-11-25")
    before = seed_table(bos_airflow_audit)
    bos_airflow_audit["server"].set_scenario(scenario(revision=2, close_mid_records_bytes=3000, resumable=False))

    dag_run = run_faults(run_dag, BOS_TEST_BATCH_SIZE="5")

    assert_failed_untouched(bos_airflow_audit, dag_run, before, error_type=BosIncompleteStreamError,
                            mentions=("no confirmed result", "cannot be resumed"))


def test_keepalive_only_stall_hits_the_deadline_and_cancels_the_call(bos_airflow_audit, run_dag) -> None:
    from airflow_provider_bos.exceptions import BosDeadlineExceeded

    server = bos_airflow_audit["server"]
    before = seed_table(bos_airflow_audit)
    server.set_scenario(scenario(stall=True, keepalive_interval_ms=100))

    dag_run = run_faults(run_dag, BOS_TEST_DEADLINE_S="3")

    assert_failed_untouched(bos_airflow_audit, dag_run, before, error_type=BosDeadlineExceeded, mentions=("deadline",))
    # The client closed the stream: the server saw the call cancelled (not completed).
    assert server.wait_for_cancelled_calls(1, timeout=10)
    assert server.counters.completed_streams == 0


def test_a_deadline_shorter_than_a_silent_server_fails_by_the_deadline_and_writes_nothing(
        bos_airflow_audit, run_dag) -> None:
    from airflow_provider_bos.exceptions import BosDeadlineExceeded

    server = bos_airflow_audit["server"]
    before = seed_table(bos_airflow_audit)
    # Silent (no keepalive) for 8 s before the final: longer than the 3 s read_deadline, shorter than
    # the stream idle timeout (300 s), so only the deadline can end the read.
    server.set_scenario(scenario(final_delay_ms=8000, keepalive_interval_ms=None))

    dag_run = run_faults(run_dag, BOS_TEST_DEADLINE_S="3")

    assert_failed_untouched(bos_airflow_audit, dag_run, before, error_type=BosDeadlineExceeded,
                            mentions=("deadline",))
    assert server.counters.completed_streams == 0


# --- HTTP statuses -------------------------------------------------------------------------------


@pytest.fixture()
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """The session's default retry policy (the hook passes none) with millisecond back-off: the same
    attempts, the same exhaustion and error, without seconds of real jittered sleeps (dag.test() runs
    the task in this process). A ``Retry-After`` the server sends is still waited as sent. The back-off
    itself is tested in tests/mcp."""
    from airflow_provider_bos.mcp import session

    monkeypatch.setattr(session, "RetryPolicy",
                        functools.partial(session.RetryPolicy, backoff_base_s=0.001, backoff_max_s=0.01))



@pytest.mark.parametrize("faults", [{"http_429": 2, "retry_after_s": 1}, {"http_503": 2}], ids=["429", "503"])
def test_retryable_status_then_success(bos_airflow_audit, run_dag, faults, fast_backoff) -> None:
    server = bos_airflow_audit["server"]
    sc = scenario(**faults)
    server.set_scenario(sc)

    dag_run = run_faults(run_dag)

    row = assert_landed(bos_airflow_audit, dag_run, sc)
    assert row["inserted"] == len(final_refs(sc))
    # The two refused attempts plus the successful one reached the server's tools/call handler.
    assert server.counters.completed_streams == 1


def test_retries_exhausted_is_a_clear_failure(bos_airflow_audit, run_dag, fast_backoff) -> None:
    from airflow_provider_bos.exceptions import BosRetryableHttpError

    before = seed_table(bos_airflow_audit)
    bos_airflow_audit["server"].set_scenario(scenario(http_503=1000))

    dag_run = run_faults(run_dag)

    assert_failed_untouched(bos_airflow_audit, dag_run, before, error_type=BosRetryableHttpError, mentions=("503",))
    assert bos_airflow_audit["server"].counters.completed_streams == 0


# --- OAuth ---------------------------------------------------------------------------------------


def seed_token_store(env: dict[str, Any], *, expires_in: float) -> SqlTokenStore:
    """Install the minted grant WITH its access token in the connection's token store, as the connect
    CLI leaves it, so a run needs no refresh unless the access token stops being usable."""
    from airflow_provider_bos.hooks.connections import airflow_fernet_cipher

    server, grant = env["server"], env["grant"]
    store = SqlTokenStore(f"sqlite:///{env['tmp'] / 'tokens.db'}", cipher=airflow_fernet_cipher())
    store.seed("bos_default", client_id=grant["client_id"], token_endpoint=server.base_url + "/token",
               resource=server.mcp_url, scope=grant["scope"], refresh_token=grant["refresh_token"],
               access_token=grant["access_token"], expires_at=time.time() + expires_in)
    return store


def test_access_token_expiring_mid_run_is_refreshed_once_and_the_request_retried(bos_airflow_audit, run_dag) -> None:
    server = bos_airflow_audit["server"]
    seed_token_store(bos_airflow_audit, expires_in=3600)
    # The stored access token is refused after 3 authorized requests (discover, tools/list,
    # bos_get_context): the federated tools/call itself gets the 401, the client refreshes once
    # (rotating the refresh token) and retries it.
    sc = scenario(expire_access_token_after_requests=3)
    server.set_scenario(sc)
    unauthorized_before = server.counters.unauthorized

    dag_run = run_faults(run_dag)

    assert_landed(bos_airflow_audit, dag_run, sc)
    assert server.counters.refreshes == 1
    assert server.counters.unauthorized > unauthorized_before
    assert server.counters.completed_streams == 1
    assert server.counters.refresh_reuse_detected == 0 and server.counters.grants_revoked == 0


def test_expired_stored_access_token_is_refreshed_exactly_once(bos_airflow_audit, run_dag) -> None:
    server = bos_airflow_audit["server"]
    # The stored access token expired since the last run: the client refreshes once before using
    # it, and uses the new (1 h) token for the whole run.
    store = seed_token_store(bos_airflow_audit, expires_in=-1)
    generation = store.load("bos_default").generation  # type: ignore[union-attr]
    sc = scenario()
    server.set_scenario(sc)

    dag_run = run_faults(run_dag)

    assert_landed(bos_airflow_audit, dag_run, sc)
    assert server.counters.refreshes == 1
    grant = store.load("bos_default")
    assert grant is not None and grant.generation == generation + 1
    assert grant.refresh_token != bos_airflow_audit["grant"]["refresh_token"]  # the rotated token was committed


def test_revoked_refresh_token_fails_with_the_reconnect_command(bos_airflow_audit, run_dag) -> None:
    from airflow_provider_bos.exceptions import BosReconnectRequired

    server = bos_airflow_audit["server"]
    before = seed_table(bos_airflow_audit)
    server.set_scenario(scenario())
    server.revoke_grant_of(bos_airflow_audit["grant"]["refresh_token"])

    dag_run = run_faults(run_dag)

    assert_failed_untouched(bos_airflow_audit, dag_run, before, error_type=BosReconnectRequired,
                            mentions=("airflow-provider-bos connect", "--conn-id bos_default"))
    assert server.counters.tool_calls == 0


# --- the database fails in the middle of the upsert --------------------------------------------------


def test_database_error_in_the_upsert_rolls_everything_back(bos_airflow_audit, run_dag) -> None:
    engine, table = bos_airflow_audit["engine"], bos_airflow_audit["table"]
    sc = scenario(revision=1)
    records = final_records(sc)
    # Old state: every record but a few, at revision 0. The new read updates some of them AND
    # inserts the missing ones; the table rejects one of the inserts (a constraint the user added).
    old = [r for r in final_records(BASE) if r["record_ref"] not in {x["record_ref"] for x in records[-3:]}]
    before = seed_table(bos_airflow_audit, old)
    rejected = records[-1]["record_ref"]
    assert "'" not in rejected
    dialect = engine.dialect.name
    with engine.begin() as conn:
        if dialect == "sqlite":
            conn.exec_driver_sql(
                f"CREATE TRIGGER {table}_reject BEFORE INSERT ON {table} WHEN NEW.record_ref = '{rejected}' "
                "BEGIN SELECT RAISE(ABORT, 'bos test: record rejected'); END"
            )
        else:
            conn.exec_driver_sql(
                f"ALTER TABLE {table} ADD CONSTRAINT {table}_reject CHECK (record_ref <> '{rejected}')"
            )
    server = bos_airflow_audit["server"]
    server.set_scenario(sc)

    dag_run = run_faults(run_dag)

    from airflow_provider_bos.exceptions import BosWarehouseError

    row = assert_failed_untouched(bos_airflow_audit, dag_run, before, error_type=BosWarehouseError,
                                  mentions=("rolled back",))
    assert server.counters.completed_streams == 1  # the read itself succeeded
    assert row["status"] == "failed"


# --- the final response is wrong -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("faults", "error_name", "mentions"),
    [
        ({"final_id_override": "someone-else"}, "BosProtocolError", ("id",)),
        ({"final_error": {"code": -32603, "message": "federation exploded"}}, "BosJsonRpcError",
         ("-32603", "federation exploded")),
        ({"malformed_final": True}, "BosResultError", ("result",)),
    ],
    ids=["other-id", "jsonrpc-error", "malformed"],
)
def test_bad_final_response_is_a_typed_failure(bos_airflow_audit, run_dag, faults, error_name, mentions) -> None:
    import airflow_provider_bos.exceptions as errors

    before = seed_table(bos_airflow_audit)
    bos_airflow_audit["server"].set_scenario(scenario(**faults))

    dag_run = run_faults(run_dag)

    assert_failed_untouched(bos_airflow_audit, dag_run, before, error_type=getattr(errors, error_name),
                            mentions=mentions)


@every_dialect
def test_a_final_source_error_code_outside_the_contract_fails_and_is_quoted_nowhere(bos_airflow_audit, run_dag,
                                                                                    caplog, capsys) -> None:
    """A page's error code outside the contract's five already failed the read; the final's does too
    (it is the authority the audit row would keep), and its text, which may name a person, is not kept."""
    code = "account locked: alice@example.com"
    hr_fails = [source.model_copy(update={"error": "source_timeout", "error_after_pages": 1})
                if source.source_type == "hr" else source for source in BASE.sources]
    sc = BASE.model_copy(update={"sources": hr_fails, "faults": FaultSpec(final_source_error_code=code)})
    before = seed_table(bos_airflow_audit)
    bos_airflow_audit["server"].set_scenario(sc)

    with caplog.at_level(logging.DEBUG):
        dag_run = run_faults(run_dag)

    row = assert_failed_untouched(bos_airflow_audit, dag_run, before, error_type=BosResultError,
                                  mentions=("source_errors", "source_timeout"))
    log = caplog.text + "".join(capsys.readouterr())
    assert "alice@example.com" not in json.dumps(row, default=str)
    assert "alice@example.com" not in log
    assert "BosResultError" in log  # the log searched is the task's: it holds the failure


# --- records without record_ref, duplicate record_refs (session level, MockTransport) -----------------



def _record(ref: str | None, *, observed_at: str, name: str) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "display_name": name, "email": None, "phone": None, "lifecycle": None, "identity_match": None,
        "attributes": {"n": name},
        "sources": [{**CRM, "external_id": name, "record_type": "person", "observed_at": observed_at,
                     "capabilities": ["read"], "version": None}],
    }
    if ref is not None:
        rec["record_ref"] = ref
    return rec


def _read_and_write(final: list[dict[str, Any]], engine: sa.Engine, table: str, audit: str) -> Any:
    """What the operator does, minus Airflow: federated_read, then write_run of the final records."""
    session = McpSession(URL, http_client=httpx.Client(transport=httpx.MockTransport(FakeBos(final))),
                         era="2025-11-25", retry=RetryPolicy(attempts=1, max_total_s=5, backoff_base_s=0,
                                                             backoff_max_s=0))
    writer = WarehouseWriter(engine, table=table, audit_table=audit)
    writer.ensure_tables()
    run = SyncRunInfo(run_id=str(uuid.uuid4()), dag_id="d", task_id="t", airflow_run_id="r", conn_id="bos_default",
                      context_handle=None, tool_name="search_people", arguments_hash="h",
                      started_at=datetime.now(UTC))
    with session:
        try:
            result = session.federated_read("search_people", {"query": "x"}, via="direct")
            audit = {"completeness": result.completeness, "status": "complete", "result_count": result.result_count,
                     "source_errors": [], "source_summary": result.observations.summary(),
                     "provisional_records": result.observations.provisional_records,
                     "provisional_pages": result.observations.pages}
            counts = writer.write_run(run, result.records,
                                      WriteOptions(audit=audit, default_observed_at=result.metadata.observed_at))
        except BosError as exc:
            writer.record_failure(run, error=f"{type(exc).__name__}: {exc}")
            raise
    return run, counts


@all_three
def test_record_without_record_ref_is_a_typed_error_and_nothing_is_written(warehouse_url, unique_table) -> None:
    engine = sa.create_engine(warehouse_url)
    audit = f"a_{uuid.uuid4().hex[:12]}"
    try:
        good = [_record(f"bos:person:{i}", observed_at="2026-10-08T12:00:00Z", name=f"p{i}") for i in range(5)]
        _read_and_write(good, engine, unique_table, audit)
        before = table_dump(engine, unique_table)
        bad = [_record(f"bos:person:{i}", observed_at="2026-10-09T12:00:00Z", name=f"q{i}") for i in range(5)]
        bad.insert(3, _record(None, observed_at="2026-10-09T12:00:00Z", name="no-ref"))

        with pytest.raises(BosResultError, match="record_ref"):
            _read_and_write(bad, engine, unique_table, audit)

        assert table_dump(engine, unique_table) == before
        statuses = [a["status"] for a in audits(engine, audit)]
        assert statuses == ["complete", "failed"]
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {unique_table}"))
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {audit}"))
        engine.dispose()


@all_three
def test_duplicate_record_refs_are_counted_and_the_latest_observation_wins(warehouse_url, unique_table) -> None:
    engine = sa.create_engine(warehouse_url)
    audit = f"a_{uuid.uuid4().hex[:12]}"
    try:
        final = [
            _record("bos:person:a", observed_at="2026-10-08T12:00:00Z", name="a-old"),
            _record("bos:person:b", observed_at="2026-10-08T12:00:00Z", name="b-first"),
            _record("bos:person:a", observed_at="2026-10-09T12:00:00Z", name="a-new"),  # later observation
            _record("bos:person:a", observed_at="2026-10-07T12:00:00Z", name="a-oldest"),  # last, but older
            _record("bos:person:b", observed_at="2026-10-08T12:00:00Z", name="b-last"),  # same time: last wins
            _record("bos:person:c", observed_at="2026-10-08T12:00:00Z", name="c"),
        ]
        run, counts = _read_and_write(final, engine, unique_table, audit)

        assert (counts.inserted, counts.duplicates) == (3, 3)
        with engine.connect() as conn:
            names = dict(conn.execute(sa.text(f"SELECT record_ref, display_name FROM {unique_table}")).all())
        assert names == {"bos:person:a": "a-new", "bos:person:b": "b-last", "bos:person:c": "c"}
        row = AuditReader(engine, audit_table=audit).get_run(run.run_id)
        assert row is not None and row["status"] == "complete" and row["duplicates"] == 3
        # Deterministic: the same result again changes nothing.
        _, again = _read_and_write(final, engine, unique_table, audit)
        assert (again.inserted, again.updated, again.unchanged, again.duplicates) == (0, 0, 3, 3)
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {unique_table}"))
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {audit}"))
        engine.dispose()
