"""End to end: reference server -> BosFederatedReadOperator in a real dag.test() -> a real database.

Each test runs the test DAG ``bos_test_sync`` (tests/airflow/dags/bos_test_sync.py) against the
reference BOS server over loopback HTTP, into SQLite (the fast tier). What each proves end to end is
the Airflow side: the task and sensor outcome, XCom, the audit row, the table, through the real
operator. The same behaviours' SQL is proven on SQLite, PostgreSQL, MariaDB and DuckDB in
tests/warehouse (test_upsert.py: exact counts, identical re-runs, older observations, rollback;
test_known_records.py: known-record claims on a re-run; test_quarantine.py: fail or quarantine;
test_audit.py: failed and partial audit rows). ``test_identity_merge_lands_exactly_the_final_records``
is this file's smoke on every dialect (the server dialects in the full tier).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa
from afhelpers import audit_rows, every_dialect, table_dump, task_states, xcom_summary

from airflow_provider_bos.testing.federation import LONG_EXTERNAL_ID_REF, plan_read
from airflow_provider_bos.testing.scenario import FaultSpec, large_scenario, load_scenario

pytestmark = pytest.mark.airflow


def final_refs(scenario: Any) -> set[str]:
    read = plan_read(scenario, request_id="expected", context={"context_handle": "x"}, arguments={})
    return {r["record_ref"] for r in read.iter_final_records()}


def provisional_refs(scenario: Any) -> set[str]:
    read = plan_read(scenario, request_id="expected", context={"context_handle": "x"}, arguments={})
    return {rec["record_ref"] for _, note in read.iter_notifications() for rec in note["records"]}


def table_refs(engine: sa.Engine, table: str) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(sa.text(f"SELECT record_ref FROM {table}")).scalars())


@contextmanager
def synced_with_fault(env: dict[str, Any], run_dag: Any, invalid_records: str, **faults: Any) -> Iterator[tuple]:
    """The sync DAG run once against the ``complete`` scenario with ``faults``: ``(scenario, dag_run,
    task states, the run's audit row, the rejects table's name)``; the rejects table dropped after."""
    scenario = load_scenario("complete").model_copy(update={"faults": FaultSpec(**faults)})
    env["server"].set_scenario(scenario)
    rejects = f"{env['table']}_rejects"
    try:
        dag_run = run_dag("bos_test_sync", BOS_TEST_INVALID_RECORDS=invalid_records)
        [audit] = audit_rows(env["engine"], env["table"])
        yield scenario, dag_run, task_states(dag_run), audit, rejects
    finally:
        with env["engine"].begin() as conn:
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {rejects}"))


@every_dialect
def test_identity_merge_lands_exactly_the_final_records(bos_airflow, run_dag) -> None:
    server, engine, table = bos_airflow["server"], bos_airflow["engine"], bos_airflow["table"]
    scenario = load_scenario("identity_merge")
    server.set_scenario(scenario)

    dag_run = run_dag("bos_test_sync")

    assert task_states(dag_run) == {"sync": "success", "check": "success", "downstream": "success"}
    refs = table_refs(engine, table)
    assert refs == final_refs(scenario)
    # The streamed pages carried source-local refs for the same people: none of them may land.
    assert refs.isdisjoint(provisional_refs(scenario))
    [audit] = audit_rows(engine, table)
    assert audit["status"] == "complete"
    assert audit["result_count"] == len(refs)
    assert audit["inserted"] == len(refs)
    assert audit["provisional_records"] > 0
    summary = xcom_summary(dag_run)
    assert summary["status"] == "complete"
    assert summary["inserted"] == len(refs)
    assert "records" not in summary


def test_partial_read_is_upserted_audited_partial_and_stopped_by_the_sensor(bos_airflow, run_dag, tmp_path) -> None:
    server, engine, table = bos_airflow["server"], bos_airflow["engine"], bos_airflow["table"]
    scenario = load_scenario("partial")
    server.set_scenario(scenario)
    marker = tmp_path / "downstream.txt"

    dag_run = run_dag("bos_test_sync", BOS_TEST_MARKER=str(marker))

    states = task_states(dag_run)
    assert states["sync"] == "success"  # partial records are authoritative for what they cover
    assert states["check"] == "failed"  # ... but a partial read never passes silently
    assert not marker.exists()
    assert table_refs(engine, table) == final_refs(scenario)
    [audit] = audit_rows(engine, table)
    assert audit["status"] == "partial"
    errors = audit["source_errors"]
    errors = json.loads(errors) if isinstance(errors, str) else errors
    assert sorted(e["error"]["code"] for e in errors) == ["rate_limited", "source_timeout"]


def test_connection_drop_before_final_leaves_the_table_unchanged_and_audits_failed(bos_airflow, run_dag) -> None:
    server, engine, table = bos_airflow["server"], bos_airflow["engine"], bos_airflow["table"]
    server.set_scenario(load_scenario("complete"))
    assert task_states(run_dag("bos_test_sync"))["sync"] == "success"
    before = table_dump(engine, table)

    dropping = load_scenario("complete").model_copy(update={"revision": 3, "faults": FaultSpec(drop_before_final=True)})
    server.set_scenario(dropping)
    dag_run = run_dag("bos_test_sync")

    assert task_states(dag_run)["sync"] == "failed"
    assert table_dump(engine, table) == before
    audits = audit_rows(engine, table)
    assert [a["status"] for a in audits] == ["complete", "failed"]
    assert "final response" in audits[-1]["error_message"] or "ended" in audits[-1]["error_message"]


def test_second_identical_run_rewrites_zero_rows(bos_airflow, run_dag) -> None:
    server, engine, table = bos_airflow["server"], bos_airflow["engine"], bos_airflow["table"]
    server.set_scenario(load_scenario("complete"))
    first = run_dag("bos_test_sync")
    before = table_dump(engine, table)

    second = run_dag("bos_test_sync")

    assert task_states(second)["sync"] == "success"
    summary = xcom_summary(second)
    assert (summary["inserted"], summary["updated"]) == (0, 0)
    assert summary["unchanged"] == xcom_summary(first)["inserted"]
    assert table_dump(engine, table) == before  # not even _bos_synced_at / _bos_run_id moved


def test_a_rerun_of_a_streamed_read_decodes_no_unchanged_record(bos_airflow, run_dag) -> None:
    """A final frame over the 1 MiB streaming threshold: the second run's records all arrive as
    known claims (records_known), are verified in SQL and written nowhere."""
    server, engine, table = bos_airflow["server"], bos_airflow["engine"], bos_airflow["table"]
    server.set_scenario(large_scenario(2500, sources=2))
    first = run_dag("bos_test_sync")
    assert xcom_summary(first)["records_known"] == 0 and xcom_summary(first)["inserted"] == 2500
    before = table_dump(engine, table)

    second = run_dag("bos_test_sync")

    assert task_states(second)["sync"] == "success"
    summary = xcom_summary(second)
    assert summary["records_known"] == 2500
    assert (summary["inserted"], summary["updated"], summary["unchanged"]) == (0, 0, 2500)
    assert table_dump(engine, table) == before


def test_a_read_answered_in_one_json_body_is_scanned_and_reruns_undecoded(bos_airflow, run_dag) -> None:
    """stream=False, as with a server without the extension: the final result is one application/json
    body over the 1 MiB threshold, scanned as it arrives like a streamed frame (read whole before, it
    held the body and its decoded tree at once), so a re-run decodes no unchanged record either."""
    server, engine, table = bos_airflow["server"], bos_airflow["engine"], bos_airflow["table"]
    server.set_scenario(large_scenario(2500, sources=2))
    first = run_dag("bos_test_sync", BOS_TEST_STREAM="0")
    assert task_states(first)["sync"] == "success"
    assert xcom_summary(first)["inserted"] == 2500 and server.counters.streamed_calls == 0
    before = table_dump(engine, table)

    second = run_dag("bos_test_sync", BOS_TEST_STREAM="0")

    assert task_states(second)["sync"] == "success"
    summary = xcom_summary(second)
    assert summary["records_known"] == 2500
    assert (summary["inserted"], summary["updated"], summary["unchanged"]) == (0, 0, 2500)
    assert table_dump(engine, table) == before
    assert server.counters.streamed_calls == 0


def test_older_observation_never_overwrites_newer_data(bos_airflow, run_dag) -> None:
    server, engine, table = bos_airflow["server"], bos_airflow["engine"], bos_airflow["table"]
    newer = load_scenario("complete").model_copy(update={"observed_at": "2026-10-09T12:00:00Z", "revision": 1})
    server.set_scenario(newer)
    run_dag("bos_test_sync")
    before = table_dump(engine, table)

    older = load_scenario("complete").model_copy(update={"observed_at": "2026-10-01T12:00:00Z", "revision": 2})
    server.set_scenario(older)
    dag_run = run_dag("bos_test_sync")

    summary = xcom_summary(dag_run)
    assert summary["updated"] == 0
    assert summary["skipped_stale"] > 0
    assert table_dump(engine, table) == before


@pytest.mark.parametrize("protocol", ["2025-11-25", "2026-07-28", "auto"])
@pytest.mark.parametrize(("tool", "via"), [("search_people", "direct"), ("people.search", "execute"),
                                           ("people.search", "auto")])
def test_both_protocol_eras_and_both_tool_styles(bos_airflow, run_dag, monkeypatch, protocol, tool, via) -> None:
    server, engine, table = bos_airflow["server"], bos_airflow["engine"], bos_airflow["table"]
    conn = json.loads(__import__("os").environ["AIRFLOW_CONN_BOS_DEFAULT"])
    conn["extra"]["protocol"] = protocol
    monkeypatch.setenv("AIRFLOW_CONN_BOS_DEFAULT", json.dumps(conn))
    scenario = load_scenario("identity_merge")
    server.set_scenario(scenario)

    dag_run = run_dag("bos_test_sync", BOS_TEST_TOOL=tool, BOS_TEST_VIA=via)

    assert task_states(dag_run)["sync"] == "success"
    assert table_refs(engine, table) == final_refs(scenario)
    assert server.counters.streamed_calls >= 1


@pytest.mark.parametrize("invalid_records", ["fail", "quarantine"])
def test_unstorable_records_fail_the_run_or_are_quarantined(bos_airflow, run_dag, invalid_records) -> None:
    engine, table = bos_airflow["engine"], bos_airflow["table"]
    with synced_with_fault(bos_airflow, run_dag, invalid_records, unstorable_final_records=True) as synced:
        scenario, dag_run, states, audit, rejects = synced
        good = {ref for ref in final_refs(scenario) if len(ref) <= 512 and "unstorable" not in ref}
        if invalid_records == "fail":  # today's behaviour: nothing lands, the run is audited failed
            assert states["sync"] == "failed"
            assert audit["status"] == "failed" and "512" in audit["error_message"] and audit["rejected"] is None
            assert not sa.inspect(engine).has_table(table) or table_refs(engine, table) == set()
            assert not sa.inspect(engine).has_table(rejects)
            return
        assert states["sync"] == "success" and states["check"] == "failed"  # lands, but never passes
        assert table_refs(engine, table) == good
        summary = xcom_summary(dag_run)
        assert summary["status"] == "partial" and summary["rejected"] == 2 and summary["inserted"] == len(good)
        assert audit["status"] == "partial"
        assert audit["error_message"].startswith(f"2 record(s) quarantined in {rejects}")
        assert audit["rejected"] == 2  # a number a dashboard can sum, not only a sentence
        with engine.connect() as conn:
            kept = conn.execute(sa.text(f"SELECT record_ref, reason, record FROM {rejects}")).all()
        assert {len(ref) for ref, _, _ in kept} == {len("bos:person:") + 600, len("bos:person:unstorable-shape")}
        assert all(json.loads(bytes(record))["record_ref"] == ref for ref, _, record in kept)


@every_dialect
@pytest.mark.parametrize("invalid_records", ["fail", "quarantine"])
def test_a_provenance_entry_longer_than_its_columns_fails_the_run_or_is_quarantined(bos_airflow, run_dag,
                                                                                    invalid_records) -> None:
    """A source id the provenance table cannot hold (512 characters) is a record the table cannot store,
    on every database alike: it does not roll back the whole run, nor is it cut short."""
    engine, table = bos_airflow["engine"], bos_airflow["table"]
    with synced_with_fault(bos_airflow, run_dag, invalid_records, long_external_id_final_record=True) as synced:
        scenario, _, states, audit, rejects = synced
        good = final_refs(scenario) - {LONG_EXTERNAL_ID_REF}
        if invalid_records == "fail":
            assert states["sync"] == "failed"
            assert audit["status"] == "failed"
            assert "external_id" in audit["error_message"] and "512" in audit["error_message"]
            assert not sa.inspect(engine).has_table(table) or table_refs(engine, table) == set()
            return
        assert states["sync"] == "success" and states["check"] == "failed"  # lands, but never passes
        assert table_refs(engine, table) == good
        assert audit["status"] == "partial" and audit["rejected"] == 1
        with engine.connect() as conn:
            kept = conn.execute(sa.text(f"SELECT record_ref, reason FROM {rejects}")).all()
            entries = set(conn.execute(sa.text(f"SELECT record_ref FROM {table}_sources")).scalars())
        assert [ref for ref, _ in kept] == [LONG_EXTERNAL_ID_REF]
        assert "external_id" in kept[0][1] and "x" * 100 not in kept[0][1]
        assert entries == good


def test_an_argument_rendered_as_a_python_object_is_refused_by_name(bos_airflow, run_dag, capsys) -> None:
    # render_template_as_native_obj=True renders {{ data_interval_start }} to a DateTime, which BOS
    # (JSON) cannot be sent: a typed error naming the argument, before any read or write.
    server, engine, table = bos_airflow["server"], bos_airflow["engine"], bos_airflow["table"]
    server.set_scenario(load_scenario("complete"))
    calls = server.counters.tool_calls
    dag_run = run_dag("bos_test_sync", BOS_TEST_NATIVE="1",
                      BOS_TEST_ARGUMENTS='{"updated_since": "{{ data_interval_start }}"}')
    assert task_states(dag_run)["sync"] == "failed"
    captured = capsys.readouterr()  # the task log (structlog writes it to stdout under dag.test)
    assert "arguments['updated_since'] is a DateTime, not a JSON value" in captured.out + captured.err
    assert not sa.inspect(engine).has_table(table)  # nothing read, nothing written
    assert server.counters.tool_calls == calls


@pytest.mark.parametrize("mode", ["skip", "Quarantine", None])
def test_an_unknown_invalid_records_mode_is_refused_at_parse_time(mode) -> None:
    from airflow_provider_bos.exceptions import BosConfigurationError
    from airflow_provider_bos.operators.federated_read import BosFederatedReadOperator

    with pytest.raises(BosConfigurationError, match="invalid_records must be one of"):
        BosFederatedReadOperator(task_id="t", tool_name="people.search", destination_conn_id="w",
                                 invalid_records=mode)
