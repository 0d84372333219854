"""Killing a sync: ``on_kill`` cancels the call on the server; SIGKILL mid-upsert leaves no mix.

(a) ``BosFederatedReadOperator.on_kill`` from another thread (what Airflow does when a task is
    marked failed or times out) closes the stream: the server sees the call cancelled, ``execute``
    raises, nothing is written and the audit row says ``failed``.
(b) The task process is SIGKILLed while its upsert is blocked half-way through the merge on
    PostgreSQL (a row it must update is locked by the test): the table is exactly the old state and
    no audit row claims the run landed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from afhelpers import table_dump
from bos_fault_helpers import BASE, audits, final_records, seed_table

from airflow_provider_bos.exceptions import BosIncompleteStreamError
from airflow_provider_bos.operators.federated_read import BosFederatedReadOperator
from airflow_provider_bos.testing.federation import plan_read
from airflow_provider_bos.testing.scenario import FaultSpec, Scenario, SourceSpec

pytestmark = pytest.mark.airflow

HERE = Path(__file__).resolve().parent

STALL = Scenario(
    name="stall",
    seed=11,
    sources=[SourceSpec(source_type="crm", source_identity="crm-eu", records=30, page_size=10)],
    faults=FaultSpec(stall=True, keepalive_interval_ms=100),
)


class _FakeTI:
    """The part of a TaskInstance the operator touches."""

    def __init__(self) -> None:
        self.dag_id, self.task_id, self.run_id = "bos_on_kill", "sync", f"manual__{uuid.uuid4().hex[:8]}"
        self.xcom: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcom[key] = value


# --- (a) on_kill -------------------------------------------------------------------------------------


@pytest.mark.parametrize("warehouse_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)],
                         indirect=True)
def test_on_kill_closes_the_stream_and_the_server_sees_the_call_cancelled(bos_airflow_audit) -> None:
    server, engine, table = bos_airflow_audit["server"], bos_airflow_audit["engine"], bos_airflow_audit["table"]
    before = seed_table(bos_airflow_audit)
    server.set_scenario(STALL)
    operator = BosFederatedReadOperator(
        task_id="sync", tool_name="people.search", destination_conn_id="bos_warehouse",
        destination_table=table, audit_table=bos_airflow_audit["audit"],
    )  # the default 30 min deadline: only on_kill can end this read
    ti = _FakeTI()
    outcome: dict[str, BaseException | Any] = {}

    def run() -> None:
        try:
            outcome["result"] = operator.execute({"ti": ti, "outlet_events": {}})  # type: ignore[arg-type]
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            outcome["error"] = exc

    worker = threading.Thread(target=run, name="bos-on-kill-execute", daemon=True)
    worker.start()
    # The server is streaming keepalives for this call: the read is in flight.
    assert server.counters.wait_until("streamed_calls", 1, timeout=30), "the read never started"

    operator.on_kill()

    worker.join(timeout=30)
    assert not worker.is_alive(), "execute did not return after on_kill"
    assert server.wait_for_cancelled_calls(1, timeout=10)
    assert server.counters.completed_streams == 0
    assert "result" not in outcome
    error = outcome["error"]
    assert isinstance(error, BosIncompleteStreamError), repr(error)
    assert table_dump(engine, table) == before
    rows = [a for a in audits(engine, bos_airflow_audit["audit"]) if a["dag_id"] == ti.dag_id]
    assert [(r["status"], r["run_id"]) for r in rows] == [("failed", ti.xcom["bos_run_id"])]
    assert rows[0]["error_message"].startswith(type(error).__name__)


def test_on_kill_before_any_read_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_bos.operators import federated_read

    hooks_made: list[Any] = []
    monkeypatch.setattr(federated_read, "BosHook", lambda *args, **kwargs: hooks_made.append(args))
    operator = BosFederatedReadOperator(task_id="sync", tool_name="people.search", destination_conn_id="w")

    assert operator.on_kill() is None  # Airflow may call it at any time, e.g. while the task is still starting
    operator.on_kill()  # ... and more than once

    # Nothing was cancelled and nothing was opened to cancel it: no hook (no sign-in, no HTTP client).
    assert hooks_made == []
    assert operator._hook is None


# --- (b) SIGKILL during the upsert on PostgreSQL -----------------------------------------------------


def _changed_refs(old: Scenario, new: Scenario) -> list[str]:
    """record_refs whose content differs between two revisions (the merge must UPDATE them)."""
    def by_ref(sc: Scenario) -> dict[str, dict]:
        read = plan_read(sc, request_id="x", context={"context_handle": "x"}, arguments={})
        return {r["record_ref"]: r for r in read.iter_final_records()}

    a, b = by_ref(old), by_ref(new)
    return sorted(ref for ref in a.keys() & b.keys() if a[ref] != b[ref])


def _wait_for(condition: Any, *, timeout: float, what: str, proc: subprocess.Popen | None = None) -> Any:
    """Poll a real condition (a database state), bounded; fail with ``what`` on timeout."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            pytest.fail(f"the task process exited ({proc.returncode}) before {what}:\n{out[-4000:]}")
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


@pytest.mark.postgres
@pytest.mark.parametrize("warehouse_url", ["postgres"], indirect=True)
def test_sigkill_during_the_upsert_leaves_the_old_table_and_no_success_audit(bos_airflow_audit, airflow_db) -> None:
    server, engine = bos_airflow_audit["server"], bos_airflow_audit["engine"]
    table, audit = bos_airflow_audit["table"], bos_airflow_audit["audit"]
    old = BASE.model_copy(update={"revision": 0})
    new = BASE.model_copy(update={"revision": 1})
    # Old state: revision 0 minus a few records; the killed run would update some and insert those.
    new_refs = [r["record_ref"] for r in final_records(new)]
    before = seed_table(bos_airflow_audit, [r for r in final_records(old) if r["record_ref"] not in new_refs[-3:]])
    changed = [ref for ref in _changed_refs(old, new) if ref not in new_refs[-3:]]
    assert changed, "the scenario revision must change some records"
    victim = changed[-1]
    server.set_scenario(new)

    blocker = engine.connect()
    proc: subprocess.Popen | None = None
    try:
        # Hold the row lock of a record the merge must update: its INSERT ... ON CONFLICT DO UPDATE
        # then waits in the middle of the merge, inside the writer's one transaction.
        blocker.execute(sa.text(f"SELECT record_ref FROM {table} WHERE record_ref = :r FOR UPDATE"), {"r": victim})
        blocker_pid = blocker.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()

        proc = subprocess.Popen(
            [sys.executable, str(HERE / "bos_kill_runner.py"), str(airflow_db), "bos_test_faults.py",
             "bos_test_faults"],
            env={**os.environ, "BOS_TEST_TABLE": table, "BOS_TEST_AUDIT_TABLE": audit},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )

        def writer_waiting() -> int | None:
            with engine.connect() as conn:
                return conn.execute(sa.text(
                    "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND :blocker = ANY(pg_blocking_pids(pid)) AND query ILIKE :q"
                ), {"blocker": blocker_pid, "q": f"%{table}%"}).scalar()

        writer_pid = _wait_for(writer_waiting, timeout=90, what="the writer's merge to wait on the row lock",
                               proc=proc)

        os.killpg(proc.pid, signal.SIGKILL)  # the task process and anything it started
        proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL
    finally:
        blocker.rollback()  # release the row: the orphaned merge may now finish its statement...
        blocker.close()
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)

    def writer_gone() -> bool:
        with engine.connect() as conn:
            return conn.execute(sa.text("SELECT count(*) FROM pg_stat_activity WHERE pid = :p"),
                                {"p": writer_pid}).scalar_one() == 0

    # ... but its client is gone, so no COMMIT can ever come: PostgreSQL rolls the transaction back.
    _wait_for(writer_gone, timeout=60, what="the killed writer's backend to end")
    assert table_dump(engine, table) == before
    rows = [a for a in audits(engine, audit) if a["dag_id"] == "bos_test_faults"]
    assert not [r for r in rows if r["status"] in ("complete", "partial")], rows
    # The task never finished: the read itself did (the server completed the stream).
    assert server.counters.completed_streams == 1
