"""End to end, a personal-data policy: the reference server -> the operator in dag.test() -> a database.

The policy hashes ``email``, ``phone`` and ``sources[].external_id`` and drops the
``attributes.employment`` subtree. After a run, every table of it (records, history, lineage,
audit, rejects, the stored policy), every staged file (DuckDB stages NDJSON files: each is read
when the statement loading it is built, the moment it is complete), every row of the run's
temporary tables (read just before the run drops them), every record the writer was
handed, the XCom summary and the task log are searched for the raw values of those fields as the
server sent them: none may appear. Then change detection sees what is stored (a change only in a
dropped field is no change; one in a hashed field is), and a run under another key or policy fails
before its read reaches the server.

Each behaviour runs on every dialect: SQLite in the fast tier, PostgreSQL, MariaDB and DuckDB in
the full tier. They need the warehouse side of the policy (``WarehouseWriter.require_pii_policy``
and the ``<table>_policy`` table).
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from afhelpers import audit_rows, every_dialect, table_dump, task_states, xcom_summary

from airflow_provider_bos.cli import main
from airflow_provider_bos.pii import PiiKey, hash_value, lookup_hash
from airflow_provider_bos.testing.federation import PlannedRead, expected_final
from airflow_provider_bos.testing.scenario import load_scenario
from airflow_provider_bos.warehouse import WarehouseWriter
from airflow_provider_bos.warehouse.dialects.duckdb import DuckDbDialect
from airflow_provider_bos.warehouse.run.transaction import RunTransaction
from airflow_provider_bos.warehouse.tables.schema import companion_table_name

pytestmark = [
    pytest.mark.airflow,
]

SCENARIO = "people_over_time"
KEY_TEXT = "7qEKW9h2_ASudFLFY3zOPEe0pTmFtIs2bz_apisWglQ"
OTHER_KEY_TEXT = "iq3AQN3QwEDela6375xoWgwkg8vy8gWwoMCGZZ-wTs8"
POLICY = {"email": "hash", "phone": "hash", "attributes.employment.*": "drop", "sources[].external_id": "hash"}
RUN = {"BOS_TEST_SYNC_MODE": "full", "BOS_TEST_HISTORY": "1", "BOS_TEST_PII_POLICY": json.dumps(POLICY)}
COMPANIONS = ("history", "lineage", "sources", "rejects", "policy")


def raw_values(records: Any) -> set[str]:
    """The values of the hashed and dropped fields as the server sends them (strings only: a
    number such as an FTE of 1.0 is not a person's)."""
    found: set[str] = set()
    for record in records:
        found.update(v for v in (record.get("email"), record.get("phone")) if v)
        found.update(entry["external_id"] for entry in record["sources"])
        employment = (record.get("attributes") or {}).get("employment") or {}
        found.update(v for k, v in employment.items() if isinstance(v, str) and k != "type")
    return found


class Observed:
    """What left the task on the way to the database, beyond the tables: the staged files, as each
    is loaded, and every record the writer was handed."""

    def __init__(self) -> None:
        self.staged: list[bytes] = []
        self.handed: list[str] = []
        #: Every row of every temporary table a run made, read just before the run drops them.
        self.temporary: dict[str, list[str]] = {}

    def texts(self) -> Iterator[str]:
        yield from (piece.decode("utf-8", "replace") for piece in self.staged)
        yield from self.handed
        for rows in self.temporary.values():
            yield from rows


@pytest.fixture()
def pii(days: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """``days`` with the key connections, the staging directory in ``tmp_path``, the observers, and
    ``edits`` (record_ref -> a function changing what the server sends for it)."""
    for conn_id, text in (("BOS_PII_KEY", KEY_TEXT), ("BOS_PII_KEY_OTHER", OTHER_KEY_TEXT)):
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id}", json.dumps({"conn_type": "generic", "password": text}))
    monkeypatch.setenv("BOS_STAGE_DIR", str(tmp_path / "stage"))
    observed = Observed()

    def capturing(build: Callable[..., Any]) -> Callable[..., Any]:
        def build_and_capture(self: Any, table: str, schema: str | None, path: str, **kwargs: Any) -> Any:
            observed.staged.append(Path(path).read_bytes())  # complete: its load runs next
            return build(self, table, schema, path, **kwargs)
        return build_and_capture

    monkeypatch.setattr(DuckDbDialect, "load_file", capturing(DuckDbDialect.load_file))
    monkeypatch.setattr(DuckDbDialect, "load_file_target", capturing(DuckDbDialect.load_file_target))
    write_run = WarehouseWriter.write_run

    def handed(self: Any, run: Any, records: Any, options: Any) -> Any:
        def seen(source: Any) -> Iterator[Any]:
            for record in source:
                observed.handed.append(repr(record) if not isinstance(record, dict) else json.dumps(record))
                yield record
        return write_run(self, run, seen(records), options)

    monkeypatch.setattr(WarehouseWriter, "write_run", handed)
    drop_staging = RunTransaction.drop_staging

    def read_then_drop(self: Any) -> None:
        for name in sorted(self._created):
            rows = self.conn.exec_driver_sql(f"SELECT * FROM {self.dialect.stage_ref(name, self.schema)}")
            observed.temporary.setdefault(name, []).extend(repr(tuple(row)) for row in rows)
        drop_staging(self)

    monkeypatch.setattr(RunTransaction, "drop_staging", read_then_drop)
    edits: dict[str, Callable[[dict[str, Any]], None]] = {}
    final_records = PlannedRead.iter_final_records

    def edited(self: Any) -> Iterator[dict]:
        for record in final_records(self):
            edit = edits.get(record["record_ref"])
            if edit is not None:
                edit(record)
            yield record

    monkeypatch.setattr(PlannedRead, "iter_final_records", edited)
    env = {**days, "observed": observed, "edits": edits, "key": PiiKey.from_text(KEY_TEXT, source="the test")}
    yield env
    with env["engine"].begin() as conn:
        for suffix in COMPANIONS:
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {companion_table_name(env['table'], suffix)}"))


def run(env: dict[str, Any], run_dag: Any, **settings: str) -> Any:
    return run_dag("bos_test_days", "bos_test_days.py", **{**RUN, **settings})


def every_table(env: dict[str, Any]) -> list[str]:
    """Every row of every table the runs wrote, as text: the records table, its companions, and
    the audit rows of this table."""
    engine, table = env["engine"], env["table"]
    texts = [repr(row) for row in audit_rows(engine, table, env["audit"])]
    names = [table] + [companion_table_name(table, suffix) for suffix in COMPANIONS]
    inspector = sa.inspect(engine)
    for name in names:
        if inspector.has_table(name):
            with engine.connect() as conn:
                texts.extend(repr(tuple(row)) for row in conn.execute(sa.text(f"SELECT * FROM {name}")))
    return texts


def leaks(texts: Any, raw: set[str]) -> set[str]:
    blob = "\n".join(texts)
    return {value for value in raw if value in blob}


def versions(env: dict[str, Any]) -> int:
    with env["engine"].connect() as conn:
        return int(conn.execute(sa.text(
            f"SELECT COUNT(*) FROM {companion_table_name(env['table'], 'history')}")).scalar_one())


def stored(env: dict[str, Any], ref: str) -> dict[str, Any]:
    with env["engine"].connect() as conn:
        row = conn.execute(sa.text(f"SELECT email, phone, attributes, sources FROM {env['table']} "
                                   "WHERE record_ref = :ref"), {"ref": ref}).mappings().one()
    return {k: json.loads(v) if isinstance(v, str) and k in ("attributes", "sources") else v for k, v in row.items()}


@every_dialect
def test_nothing_raw_of_a_hashed_or_dropped_field_is_stored_staged_handed_logged_or_returned(
    pii, run_dag, caplog, capsys,
) -> None:
    expected = expected_final(SCENARIO, 1).records
    raw = raw_values(r.record for r in expected)
    assert len(raw) > 500  # emails, phones, external ids, cost centres, manager ids of 230 people
    with caplog.at_level(logging.DEBUG):
        first = run(pii, run_dag)
        again = run(pii, run_dag)  # unchanged: matched through the keyed wire hashes
    assert task_states(first) == task_states(again) == {"sync": "success", "check": "success"}
    summary, second = xcom_summary(first), xcom_summary(again)
    assert summary["inserted"] == 230 and (second["updated"], second["unchanged"]) == (0, 230)

    log = caplog.text + "".join(capsys.readouterr())
    assert "personal-data policy" in log and "inserted=230" in log  # the task's own log is what was searched
    assert not leaks(every_table(pii), raw)
    assert not leaks(pii["observed"].texts(), raw)
    assert not leaks([json.dumps(summary), json.dumps(second)], raw)
    assert not leaks([log], raw)
    assert KEY_TEXT not in log and not leaks(every_table(pii), {KEY_TEXT})
    if pii["url"].startswith("duckdb"):
        assert pii["observed"].staged, "DuckDB stages files: the test must have seen them"

    # What is stored is the policy's form: hashes under the key, the subtree gone, the rest kept.
    person = next(r.record for r in expected if r.record["email"] and r.record["phone"]
                  and (r.record["attributes"] or {}).get("employment"))
    row = stored(pii, person["record_ref"])
    key = pii["key"]
    assert row["email"] == hash_value(key, "email", person["email"])
    assert row["phone"] == hash_value(key, "phone", person["phone"])
    assert "employment" not in row["attributes"]
    assert row["attributes"]["department"] == person["attributes"]["department"]
    assert [e["external_id"] for e in row["sources"]] == [
        hash_value(key, "sources[].external_id", e["external_id"]) for e in person["sources"]]

    # The next day's run writes the people who joined or changed through its temporary tables, which
    # are read just before the run drops them: their rows hold the stored form, never a raw value.
    observed = pii["observed"]
    observed.temporary.clear()
    pii["server"].set_day(2)
    later = [r.record for r in expected_final(SCENARIO, 2).records]
    with caplog.at_level(logging.DEBUG):
        assert task_states(run(pii, run_dag))["sync"] == "success"
    temporary = [row for rows in observed.temporary.values() for row in rows]
    stored_emails = {hash_value(key, "email", p["email"]) for p in later if p["email"]}
    assert leaks(temporary, stored_emails), "the temporary tables held the records written (and were read)"
    assert not leaks(temporary, raw | raw_values(later))
    assert not leaks(every_table(pii), raw_values(later))


@every_dialect
@pytest.mark.parametrize("action", ["hash", "drop"])
def test_a_display_name_and_an_attribute_path_are_hashed_or_dropped_like_any_field(
    pii, run_dag, caplog, capsys, action,
) -> None:
    policy = {"display_name": action, "attributes.title": action}
    expected = [r.record for r in expected_final(SCENARIO, 1).records]
    raw = {p["display_name"] for p in expected if p["display_name"]}
    raw |= {p["attributes"]["title"] for p in expected if (p["attributes"] or {}).get("title")}
    assert len(raw) > 100
    with caplog.at_level(logging.DEBUG):
        dag_run = run(pii, run_dag, BOS_TEST_PII_POLICY=json.dumps(policy))
    assert task_states(dag_run) == {"sync": "success", "check": "success"}

    log = caplog.text + "".join(capsys.readouterr())
    assert "personal-data policy" in log
    assert not leaks([*every_table(pii), *pii["observed"].texts(), json.dumps(xcom_summary(dag_run)), log], raw)
    person = next(p for p in expected if p["display_name"] and (p["attributes"] or {}).get("title"))
    with pii["engine"].connect() as conn:
        name, attributes = conn.execute(sa.text(f"SELECT display_name, attributes FROM {pii['table']} "
                                                "WHERE record_ref = :ref"), {"ref": person["record_ref"]}).one()
    attributes = json.loads(attributes) if isinstance(attributes, str) else attributes
    if action == "hash":  # analysts join on these: the lookup hash of what BOS sent
        assert name == lookup_hash(pii["key"], "display_name", person["display_name"])
        assert attributes["title"] == lookup_hash(pii["key"], "attributes.title", person["attributes"]["title"])
    else:
        assert name is None and "title" not in attributes
    assert attributes["department"] == person["attributes"]["department"]  # the rest is kept


@every_dialect
def test_change_detection_sees_what_is_stored(pii, run_dag) -> None:
    assert task_states(run(pii, run_dag))["sync"] == "success"
    person = next(r.record for r in expected_final(SCENARIO, 1).records
                  if r.record["phone"] and (r.record["attributes"] or {}).get("employment"))
    ref = person["record_ref"]
    before, history = table_dump(pii["engine"], pii["table"]), versions(pii)

    # Only the dropped subtree changed: nothing to store differently, so nothing is written.
    pii["edits"][ref] = lambda r: r["attributes"]["employment"].update(cost_center="CC-CHANGED-0001")
    dropped_only = xcom_summary(run(pii, run_dag))
    assert (dropped_only["updated"], dropped_only["unchanged"]) == (0, 230)
    assert table_dump(pii["engine"], pii["table"]) == before and versions(pii) == history

    # A hashed field changed: the row is rewritten and a version added.
    pii["edits"][ref] = lambda r: r.update(phone="+99 123 4567890")
    hashed = xcom_summary(run(pii, run_dag))
    assert (hashed["updated"], hashed["unchanged"]) == (1, 229)
    assert versions(pii) == history + 1
    assert stored(pii, ref)["phone"] == hash_value(pii["key"], "phone", "+99 123 4567890")


@every_dialect
@pytest.mark.parametrize("other", [
    {"BOS_TEST_PII_KEY_CONN": "bos_pii_key_other"},
    {"BOS_TEST_PII_POLICY": json.dumps({**POLICY, "display_name": "hash"})},
    {"BOS_TEST_PII_POLICY": "null"},
], ids=["another-key", "another-policy", "no-policy"])
def test_a_run_under_another_key_or_policy_fails_before_its_read(pii, run_dag, other: dict[str, str]) -> None:
    assert task_states(run(pii, run_dag))["sync"] == "success"
    before, rows = pii["server"].counters.snapshot(), table_dump(pii["engine"], pii["table"])
    refused = run(pii, run_dag, **other)
    assert task_states(refused)["sync"] == "failed"
    after = pii["server"].counters.snapshot()
    assert after["tool_calls"] == before["tool_calls"], "the read reached the server"
    assert table_dump(pii["engine"], pii["table"]) == rows
    failed = audit_rows(pii["engine"], pii["table"], pii["audit"])[-1]
    assert failed["status"] == "failed"
    assert "another personal-data policy or key" in failed["error_message"]
    assert "Nothing was read" in failed["error_message"] and KEY_TEXT not in failed["error_message"]


@every_dialect
def test_quarantined_records_are_stored_under_the_policy_too(pii, run_dag, caplog, capsys) -> None:
    """Two final records no table can store (a record_ref too long, a display_name that is an object):
    quarantined in ``<table>_rejects``, which holds nothing raw of a hashed or dropped field either."""
    scenario = unstorable_scenario(pii)
    raw = raw_values(r.record for r in expected_final(scenario, 1).records)
    with caplog.at_level(logging.DEBUG):
        dag_run = run(pii, run_dag, BOS_TEST_INVALID_RECORDS="quarantine")
    assert task_states(dag_run)["sync"] == "success"  # partial: the sensor then stops the DAG
    summary = xcom_summary(dag_run)
    assert (summary["inserted"], summary["rejected"]) == (230, 2)
    assert sa.inspect(pii["engine"]).has_table(companion_table_name(pii["table"], "rejects"))
    log = caplog.text + "".join(capsys.readouterr())
    assert not leaks([*every_table(pii), *pii["observed"].texts(), json.dumps(summary), log], raw)


@every_dialect
def test_a_source_errors_own_words_are_not_stored_logged_or_returned(pii, run_dag, caplog, capsys) -> None:
    """The contract's source error is a source and an ``error.code``; a server may add its own words
    beside the code, which can quote a person. The audit row keeps the contract's fields only, so
    nothing a policy hashes reaches the audit table (where no policy applies), and no text there
    outlives an erasure."""
    day = 4  # hr-main fails after its first page
    person = next(r.record for r in expected_final(SCENARIO, day).records if r.record["email"])
    said = f"upstream refused {person['email']} ({person['record_ref']})"
    scenario = load_scenario(SCENARIO)
    pii["server"].set_scenario(scenario.model_copy(update={"faults": scenario.faults.model_copy(
        update={"source_error_message": said})}), day=day)
    with caplog.at_level(logging.DEBUG):
        dag_run = run(pii, run_dag)
    assert task_states(dag_run)["sync"] == "success"  # partial: the sensor then stops the DAG
    [audit] = audit_rows(pii["engine"], pii["table"], pii["audit"])
    errors = audit["source_errors"]
    assert (json.loads(errors) if isinstance(errors, str) else errors) == [
        {"source": {"source_type": "hr", "source_identity": "hr-main"}, "error": {"code": "source_timeout"}}]
    log = caplog.text + "".join(capsys.readouterr())
    assert not leaks([*every_table(pii), json.dumps(xcom_summary(dag_run)), log], {person["email"], said})


def unstorable_scenario(env: dict[str, Any]) -> Any:
    """The scenario whose final result ends with two records no table can store (see the test above)."""
    scenario = load_scenario(SCENARIO)
    scenario = scenario.model_copy(update={"faults": scenario.faults.model_copy(
        update={"unstorable_final_records": True})})
    env["server"].set_scenario(scenario)
    return scenario


def command(env: dict[str, Any], *args: str) -> tuple[int, dict[str, Any] | None]:
    """``airflow-provider-bos <args>`` in this process, on the run's warehouse connection and audit
    table; returns the exit code and the JSON it printed. The test's engine is disposed first: the
    command's own process holds no other connection (DuckDB rewrites its file to reclaim space)."""
    env["engine"].dispose()
    out = io.StringIO()
    code = main([args[0], "--conn-id", "bos_warehouse", "--table", env["table"], "--audit-table", env["audit"],
                 *args[1:]], stdout=out)
    return code, json.loads(out.getvalue()) if out.getvalue() else None


def history_dump(env: dict[str, Any]) -> list[tuple]:
    return table_dump(env["engine"], companion_table_name(env["table"], "history"))


def entry_refs(env: dict[str, Any]) -> set[str]:
    with env["engine"].connect() as conn:
        return set(conn.execute(sa.text(f"SELECT record_ref FROM {env['table']}_sources")).scalars())


@every_dialect
def test_erase_by_the_raw_email_phone_and_external_id_a_request_names(pii, run_dag) -> None:
    """After a run under the policy the table holds only hashes; a request names a person by what
    BOS sent (an email, a phone, ``SOURCE:ID``): exactly those people go from the table and history."""
    assert task_states(run(pii, run_dag)) == {"sync": "success", "check": "success"}
    people = [r.record for r in expected_final(SCENARIO, 1).records]
    by_email = next(p for p in people if p["email"])
    by_phone = next(p for p in people if p["phone"] and p["record_ref"] != by_email["record_ref"])
    by_source = next(p for p in people if p["record_ref"] not in (by_email["record_ref"], by_phone["record_ref"]))
    source = by_source["sources"][0]
    gone = {by_email["record_ref"], by_phone["record_ref"], by_source["record_ref"]}
    # Each value is this one person's: the scenario gives no two people the same email, phone or id.
    assert sum(p["email"] == by_email["email"] for p in people) == 1
    assert sum(p["phone"] == by_phone["phone"] for p in people) == 1
    assert sum(e["external_id"] == source["external_id"] for p in people for e in p["sources"]) == 1
    records, history = table_dump(pii["engine"], pii["table"]), history_dump(pii)
    assert [row[0] for row in records] == [row[0] for row in history] == sorted(p["record_ref"] for p in people)

    code, erased = command(pii, "erase", "--email", by_email["email"], "--phone", by_phone["phone"],
                           "--external-id", f"{source['source_identity']}:{source['external_id']}",
                           "--key-conn-id", "bos_pii_key")
    assert code == 0 and erased is not None
    assert (erased["found"], erased["records"], erased["history"], erased["lineage"]) == (3, 3, 3, 0)
    assert table_dump(pii["engine"], pii["table"]) == [row for row in records if row[0] not in gone]
    assert history_dump(pii) == [row for row in history if row[0] not in gone]
    assert entry_refs(pii) == {row[0] for row in records} - gone  # their provenance entries went too

    # The same request again: nobody holds that email any more; nothing is deleted.
    after = table_dump(pii["engine"], pii["table"]), history_dump(pii)
    code, again = command(pii, "erase", "--email", by_email["email"], "--key-conn-id", "bos_pii_key")
    assert code == 0 and again is not None
    assert (again["found"], again["records"], again["history"]) == (0, 0, 0)
    assert (table_dump(pii["engine"], pii["table"]), history_dump(pii)) == after


def quarantined(env: dict[str, Any]) -> list[tuple]:
    return table_dump(env["engine"], companion_table_name(env["table"], "rejects"))


@every_dialect
def test_records_quarantined_without_a_policy_are_erased_by_value_and_keep_a_policy_out(pii, run_dag) -> None:
    """A run without a policy quarantines two records whole: a request naming one by its external id
    erases it from the rejects table (its ref was never stored anywhere else). While the other is left,
    an emptied table refuses a policy run before its read; after ``pii-apply`` the run adopts the policy."""
    scenario = unstorable_scenario(pii)
    unstorable = [r.record for r in expected_final(scenario, 1).records][-2:]
    plain = run(pii, run_dag, BOS_TEST_PII_POLICY="null", BOS_TEST_INVALID_RECORDS="quarantine")
    assert xcom_summary(plain)["rejected"] == 2 and len(quarantined(pii)) == 2
    named = unstorable[1]["sources"][0]
    code, erased = command(pii, "erase", "--external-id", f"{named['source_identity']}:{named['external_id']}")
    assert code == 0 and erased is not None
    assert (erased["found"], erased["records"], erased["rejects"]) == (1, 0, 1)
    assert [row for row in quarantined(pii) if unstorable[1]["record_ref"] in row] == []
    assert len(quarantined(pii)) == 1

    with pii["engine"].begin() as conn:  # emptied: the records and their history gone, one raw reject left
        for name in (pii["table"], companion_table_name(pii["table"], "history")):
            conn.execute(sa.text(f"DELETE FROM {name}"))
    before = pii["server"].counters.snapshot()
    refused = run(pii, run_dag)
    assert task_states(refused)["sync"] == "failed"
    assert pii["server"].counters.snapshot()["tool_calls"] == before["tool_calls"], "the read reached the server"
    assert "pii-apply" in audit_rows(pii["engine"], pii["table"], pii["audit"])[-1]["error_message"]

    code, applied = command(pii, "pii-apply", "--policy", json.dumps(POLICY), "--key-conn-id", "bos_pii_key")
    assert code == 0 and applied is not None and applied["rejects"] == 1
    under = run(pii, run_dag, BOS_TEST_INVALID_RECORDS="quarantine")
    assert xcom_summary(under)["inserted"] == 230
    assert not leaks(every_table(pii), raw_values(unstorable))


@every_dialect
def test_pii_apply_brings_a_table_synced_without_a_policy_under_it(pii, run_dag) -> None:
    """A table synced without a policy holds the raw values; ``pii-apply`` with the policy and its key
    leaves none in any table, and the next run under the policy passes the policy check and
    rewrites no unchanged person (the same day: nobody changed)."""
    people = [r.record for r in expected_final(SCENARIO, 1).records]
    raw = raw_values(people)
    person = next(p for p in people if p["email"] and p["phone"] and (p["attributes"] or {}).get("employment"))
    plain = run(pii, run_dag, BOS_TEST_PII_POLICY="null")
    assert task_states(plain) == {"sync": "success", "check": "success"}
    assert xcom_summary(plain)["inserted"] == 230
    theirs = raw_values([person])
    assert len(theirs) >= 4 and leaks(every_table(pii), theirs) == theirs  # stored raw, to begin with

    code, applied = command(pii, "pii-apply", "--policy", json.dumps(POLICY), "--key-conn-id", "bos_pii_key")
    assert code == 0 and applied is not None
    assert (applied["records"], applied["history"]) == (230, 230)
    assert not leaks(every_table(pii), raw)
    row, key = stored(pii, person["record_ref"]), pii["key"]
    assert (row["email"], row["phone"]) == (hash_value(key, "email", person["email"]),
                                            hash_value(key, "phone", person["phone"]))
    assert "employment" not in row["attributes"]
    assert [e["external_id"] for e in row["sources"]] == [
        hash_value(key, "sources[].external_id", e["external_id"]) for e in person["sources"]]
    records, history = table_dump(pii["engine"], pii["table"]), history_dump(pii)

    under = run(pii, run_dag)  # the same day under the policy: nobody changed
    assert task_states(under) == {"sync": "success", "check": "success"}
    summary = xcom_summary(under)
    assert (summary["inserted"], summary["updated"], summary["unchanged"]) == (0, 0, 230)
    audit = audit_rows(pii["engine"], pii["table"], pii["audit"])[-1]
    assert (audit["status"], audit["inserted"] or 0, audit["updated"] or 0) == ("complete", 0, 0)
    assert table_dump(pii["engine"], pii["table"]) == records and history_dump(pii) == history
    assert not leaks(every_table(pii), raw)


DROP_ONLY = {"phone": "drop", "attributes.employment.*": "drop"}


def without_wire_hashes(env: dict[str, Any], rows: list[tuple]) -> list[tuple]:
    """``rows`` (a ``table_dump`` of the records table) without the wire hash column."""
    with env["engine"].connect() as conn:  # the order of table_dump's SELECT *
        names = list(conn.execute(sa.text(f"SELECT * FROM {env['table']} WHERE 1 = 0")).keys())
    skip = names.index("_bos_wire_hash")
    return [row[:skip] + row[skip + 1:] for row in rows]


def wire_hashes(env: dict[str, Any]) -> list[Any]:
    with env["engine"].connect() as conn:
        return [h for (h,) in conn.execute(sa.text(f"SELECT _bos_wire_hash FROM {env['table']}"))]


@every_dialect
def test_a_policy_that_only_drops_skips_unchanged_records_when_a_key_is_configured(pii, run_dag,
                                                                                  monkeypatch) -> None:
    """No key is needed to drop, and without one no wire hash is stored (a plain digest of the raw
    record would confirm guesses of what was dropped), so each re-run decodes every record. With the
    key connection configured, the wire hashes are stored keyed and an unchanged re-run skips every
    record undecoded, as under a hashing policy; the key is no part of the table's policy, so adding
    it later needs no re-read."""
    from airflow_provider_bos.testing.scenario import large_scenario

    pii["server"].set_scenario(large_scenario(2500, sources=2))  # a final frame the read streams
    settings = {"BOS_TEST_PII_POLICY": json.dumps(DROP_ONLY)}
    monkeypatch.delenv("AIRFLOW_CONN_BOS_PII_KEY")
    assert xcom_summary(run(pii, run_dag, **settings))["inserted"] == 2500
    keyless = xcom_summary(run(pii, run_dag, **settings))
    assert (keyless["records_known"], keyless["unchanged"], keyless["updated"]) == (0, 2500, 0)
    assert set(wire_hashes(pii)) == {None}

    monkeypatch.setenv("AIRFLOW_CONN_BOS_PII_KEY", json.dumps({"conn_type": "generic", "password": KEY_TEXT}))
    rows, history = table_dump(pii["engine"], pii["table"]), versions(pii)
    keyed = xcom_summary(run(pii, run_dag, **settings))  # decodes once more, and stores the keyed hashes
    assert (keyed["records_known"], keyed["updated"], keyed["unchanged"]) == (0, 0, 2500)
    assert None not in set(wire_hashes(pii)) and versions(pii) == history
    assert without_wire_hashes(pii, rows) == without_wire_hashes(pii, table_dump(pii["engine"], pii["table"]))
    rows = table_dump(pii["engine"], pii["table"])
    again = xcom_summary(run(pii, run_dag, **settings))
    assert (again["records_known"], again["unchanged"], again["updated"]) == (2500, 2500, 0)
    assert table_dump(pii["engine"], pii["table"]) == rows and versions(pii) == history
