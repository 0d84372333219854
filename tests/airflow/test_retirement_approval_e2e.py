"""A person approves or rejects a mass retirement through Airflow's Human-in-the-loop API, end to end.

The reference server's ``mass_leave`` scenario loses 130 of its 230 people on day 2 (57 %, over
``max_retire_fraction=0.5``). A real ``dag.test()`` of ``bos_test_retirement_approval`` runs the full
read (``on_retire_guard="ask"``), which holds those retirements; the approval task then waits in
``awaiting_input`` and ``dag.test()`` keeps the run alive until a response arrives from outside.
The response is given as a person gives it: through the Core API that ``airflow api-server`` serves
(``PATCH .../hitlDetails``, signed in as a user), built in this process on the same metadata
database, from a thread that first waits for the question to appear.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from afhelpers import audit_rows, task_states, xcom_summary

from airflow_provider_bos.testing.federation import expected_final
from airflow_provider_bos.testing.scenario import load_scenario
from airflow_provider_bos.warehouse.tables.schema import companion_table_name
from tests.ui.pagefixtures import bearer, build_page

pytestmark = pytest.mark.airflow

DAG_ID = "bos_test_retirement_approval"
DAG_FILE = "bos_test_retirement_approval.py"
ASK, DECIDE = "retirement_approval.ask", "retirement_approval.decide"
DECISION_TOOL = "airflow-provider-bos retirement decision"


class Responder(threading.Thread):
    """Answers the first open question of ``DAG_ID`` through the Core API, as a signed-in user would."""

    def __init__(self, client: Any, answer: str, timeout_s: float = 120.0,
                 before_answer: Callable[[], None] | None = None, dag_id: str = DAG_ID) -> None:
        super().__init__(daemon=True)
        self.client, self.answer, self.timeout_s, self.dag_id = client, answer, timeout_s, dag_id
        self.before_answer = before_answer
        self.headers = bearer(client, "admin")
        self.question: dict[str, Any] | None = None
        self.response: tuple[int, Any] | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            deadline = time.monotonic() + self.timeout_s
            failed: BaseException | None = None
            while self.question is None:
                try:
                    listed = self.client.get("/api/v2/dags/~/dagRuns/~/hitlDetails", headers=self.headers,
                                             params={"dag_id": self.dag_id})
                    listed.raise_for_status()
                    waiting = [q for q in listed.json()["hitl_details"] if not q["response_received"]]
                except Exception as exc:  # noqa: BLE001 - the next poll asks again, as the page's next refresh
                    failed, waiting = exc, []  # would (the run's writes can hold the SQLite metadata database)
                if waiting:
                    self.question = waiting[0]
                elif time.monotonic() > deadline:
                    raise AssertionError(f"no question of {self.dag_id} within {self.timeout_s} s"
                                         + (f"; the last poll failed: {failed!r}" if failed else ""))
                else:
                    time.sleep(0.5)  # polling for the task to ask, as the Required Actions page does
            if self.before_answer is not None:
                self.before_answer()
            ti = self.question["task_instance"]
            answered = self.client.patch(
                f"/api/v2/dags/{self.dag_id}/dagRuns/{ti['dag_run_id']}/taskInstances/{ti['task_id']}/"
                f"{ti['map_index']}/hitlDetails",
                headers=self.headers, json={"chosen_options": [self.answer]})
            self.response = (answered.status_code, answered.json())
        except Exception as exc:  # noqa: BLE001 - re-raised in the test thread (run_day)
            self.error = exc


@pytest.fixture()
def mass_leave(bos_airflow_audit: dict[str, Any], tmp_path) -> Iterator[dict[str, Any]]:
    env = bos_airflow_audit
    env["server"].set_scenario(load_scenario("mass_leave"))
    with build_page(tmp_path, all_admins=False) as client:
        env["client"] = client
        yield env
    with env["engine"].begin() as conn:
        for suffix in ("lineage", "history", "sources", "pending_retirements"):
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {companion_table_name(env['table'], suffix)}"))


def current(env: dict[str, Any]) -> set[str]:
    with env["engine"].connect() as conn:
        return set(conn.execute(sa.text(
            f"SELECT record_ref FROM {env['table']} WHERE _bos_deleted_at IS NULL")).scalars())


def run_day(env: dict[str, Any], run_dag: Any, day: int, answer: str | None = None,
            before_answer: Callable[[], None] | None = None) -> tuple[Any, Responder | None]:
    env["server"].set_day(day)
    responder = Responder(env["client"], answer, before_answer=before_answer) if answer else None
    if responder is not None:
        responder.start()
    dag_run = run_dag(DAG_ID, DAG_FILE)
    if responder is not None:
        responder.join(timeout=30)
        assert responder.error is None, responder.error
    return dag_run, responder


def decision_notes(env: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in audit_rows(env["engine"], env["table"], env["audit"]) if r["tool_name"] == DECISION_TOOL]


def note(row: dict[str, Any]) -> str:
    return " ".join(filter(None, (row.get("notes"), row.get("error_message"))))


@pytest.mark.parametrize("warehouse_url", ["sqlite", "postgres"], indirect=True)
@pytest.mark.parametrize("answer", ["Approve", "Reject"])
def test_a_person_decides_a_mass_retirement_through_airflows_hitl_api(mass_leave, run_dag, answer) -> None:
    env = mass_leave
    day1, day2 = expected_final("mass_leave", 1), expected_final("mass_leave", 2)
    dag_run, _ = run_day(env, run_dag, 1)
    assert task_states(dag_run) == {"sync": "success", ASK: "skipped", DECIDE: "skipped"}  # nothing held
    assert current(env) == day1.refs

    dag_run, responder = run_day(env, run_dag, 2, answer)
    assert task_states(dag_run) == {"sync": "success", ASK: "success", DECIDE: "success"}
    held = xcom_summary(dag_run)["pending_retirements"]
    assert (held["held"], held["scope_rows"], held["share"]) == (130, 230, round(130 / 230, 4))
    assert held["per_source"] == {"crm-eu": 90, "hr-main": 40}
    assert set(held["sample_refs"]) <= day1.refs - day2.refs and len(held["sample_refs"]) == 10

    # What the person saw: the count, the share, per source, refs; no value of any person.
    question = responder.question
    assert question is not None and responder.response[0] == 200, responder.response
    body = question["body"]
    assert "**130**" in body and "**230**" in body and "57%" in body
    assert "| crm-eu | 90 |" in body and "| hr-main | 40 |" in body
    assert all(ref in body for ref in held["sample_refs"])
    for record in day1.records:
        for field in ("display_name", "email", "phone"):
            value = record.record.get(field)
            assert not value or str(value) not in body, field
    assert question["subject"] == f"Retire 130 of 230 rows of {env['table']}?"

    decision = xcom_summary(dag_run, DECIDE)
    [row] = decision_notes(env)
    if answer == "Approve":
        assert (decision["outcome"], decision["retired"]) == ("applied", 130)
        assert current(env) == day2.refs
        assert row["retired"] == 130 and "Approved" in note(row)
    else:
        assert (decision["outcome"], decision["retired"]) == ("rejected", 0)
        assert current(env) == day1.refs
        assert row["retired"] == 0 and "Rejected" in note(row)
    assert "'admin'" in note(row)  # who decided
    sync_row = next(r for r in audit_rows(env["engine"], env["table"], env["audit"]) if r["run_id"] == held["run_id"])
    assert sync_row["status"] == "complete" and sync_row["retired"] == 0


@pytest.mark.parametrize("warehouse_url", ["sqlite"], indirect=True)
def test_an_approval_after_a_newer_read_retires_nothing_and_says_why(mass_leave, run_dag) -> None:
    """While the question is open another read writes the table (an empty incremental one); the
    approval given after it applies nothing, and the decision names that newer run."""
    from airflow_provider_bos.warehouse import SyncRunInfo, WarehouseWriter, WriteOptions

    env = mass_leave
    newer = SyncRunInfo(dag_id="another_dag", task_id="hourly", conn_id="bos_default", tool_name="people.search")

    def newer_read() -> None:
        writer = WarehouseWriter(env["engine"], table=env["table"], audit_table=env["audit"])
        writer.write_run(newer, [], WriteOptions(audit={"status": "complete", "completeness": "complete",
                                                        "result_count": 0}))

    run_day(env, run_dag, 1)
    dag_run, _ = run_day(env, run_dag, 2, "Approve", before_answer=newer_read)
    assert task_states(dag_run) == {"sync": "success", ASK: "success", DECIDE: "success"}
    decision = xcom_summary(dag_run, DECIDE)
    assert (decision["outcome"], decision["retired"], decision["newer_run_id"]) == ("overtaken", 0, newer.run_id)
    assert current(env) == expected_final("mass_leave", 1).refs
    [row] = decision_notes(env)
    assert "Not applied" in note(row) and newer.run_id in note(row)


def test_a_wrong_guard_action_fails_the_dag_at_parse_time() -> None:
    from airflow_provider_bos.exceptions import BosConfigurationError
    from airflow_provider_bos.operators.federated_read import BosFederatedReadOperator

    with pytest.raises(BosConfigurationError, match="on_retire_guard must be one of"):
        BosFederatedReadOperator(task_id="sync", tool_name="people.search", destination_conn_id="w",
                                 sync_mode="full", on_retire_guard="approve")


def test_the_approval_needs_a_read_that_asks() -> None:
    from airflow.sdk import DAG

    from airflow_provider_bos.exceptions import BosConfigurationError
    from airflow_provider_bos.operators.federated_read import BosFederatedReadOperator
    from airflow_provider_bos.operators.retirement_approval import retirement_approval

    with DAG("bos_approval_shape", schedule=None), pytest.raises(BosConfigurationError, match="on_retire_guard='ask'"):
        sync = BosFederatedReadOperator(task_id="sync", tool_name="people.search", destination_conn_id="w",
                                        sync_mode="full")
        retirement_approval(sync)


def test_the_question_shows_refs_and_source_names_as_plain_text() -> None:
    """A ref or source name from BOS cannot put a link or an image into the page a person decides on."""
    from airflow_provider_bos.operators.retirement_approval import held_body

    held = {"run_id": "r1", "table": "people", "schema": None, "read_at": "2026-12-02T06:00:00+00:00",
            "held": 2, "scope_rows": 3, "share": 0.6667, "max_retire_fraction": 0.5,
            "per_source": {"[crm](https://evil.example)": 2},
            "sample_refs": ["bos:person:1", "x`](javascript:alert(1))![i](https://evil.example/p.png)"]}
    body = held_body(held)
    assert "](" not in body and "![" not in body and "javascript:alert(1)" not in body
    assert "`bos:person:1`" in body and "**67%**" in body


@pytest.mark.parametrize("warehouse_url", ["sqlite"], indirect=True)
def test_the_example_dag_asks_before_a_mass_retirement(mass_leave, run_dag) -> None:
    """dags/bos_sync_people_approved.py as shipped: day 2 of mass_leave asks, and Approve retires."""
    env, table = mass_leave, "bos_people_approved"
    engine = env["engine"]
    prefix = "retirement_approval."
    try:
        for day, answer in ((1, None), (2, "Approve")):
            env["server"].set_day(day)
            responder = Responder(env["client"], answer, dag_id="bos_sync_people_approved") if answer else None
            if responder is not None:
                responder.start()
            dag_run = run_dag("bos_sync_people_approved", "bos_sync_people_approved.py")
            if responder is not None:
                responder.join(timeout=30)
                assert responder.error is None and responder.response[0] == 200, responder.response
            asked = "success" if answer else "skipped"
            assert task_states(dag_run) == {"sync_people": "success", f"{prefix}ask": asked,
                                            f"{prefix}decide": asked}
        with engine.connect() as conn:
            kept = set(conn.execute(sa.text(f"SELECT record_ref FROM {table} WHERE _bos_deleted_at IS NULL")).scalars())
        assert kept == expected_final("mass_leave", 2).refs
    finally:
        with engine.begin() as conn:
            companions = ("lineage", "sources", "pending_retirements")
            for name in (table, *(companion_table_name(table, s) for s in companions), "bos_sync_runs"):
                conn.execute(sa.text(f"DROP TABLE IF EXISTS {name}"))
