"""End to end, every value the contract allows: the reference server's ``whole_contract`` days -> the
operator in dag.test() -> a database.

Its records carry what the contract admits where it names no type: ``lifecycle`` and
``identity_match`` of every JSON type, changing type from day to day; attributes with integers
beyond 64 bits, subnormal floats, deep nesting, empty and non-ASCII keys; provenance entries with
keys beyond the named ones; empty, emoji and right-to-left names. Over four days (merges, a split,
leavers, joiners, a partial day) every run lands, each stored value reads back (as JSON text, in
SQL) as the server sent it, only changed people count as changed, and under ``{"*": "hash"}`` no
value of any field is stored, staged or logged raw.

SQLite in the fast tier; PostgreSQL, MariaDB and DuckDB in the full tier.
"""

from __future__ import annotations

import json
import logging
from decimal import Decimal
from typing import Any

import pytest
from afhelpers import every_dialect, task_states, xcom_summary
from test_personal_data_e2e import every_table, leaks, pii  # noqa: F401 - pii: a fixture

from airflow_provider_bos.testing.federation import expected_final, unstamped
from airflow_provider_bos.testing.scenario import load_scenario

pytestmark = [pytest.mark.airflow]

SCENARIO = "whole_contract"
RUN = {"BOS_TEST_SYNC_MODE": "full", "BOS_TEST_HISTORY": "1", "BOS_TEST_PII_POLICY": "null"}
CONTENT = ("display_name", "email", "phone", "lifecycle", "identity_match", "attributes", "sources")
JSON_CONTENT = ("lifecycle", "identity_match", "attributes", "sources")
_AS_TEXT = {"sqlite": "{}", "postgresql": "CAST({} AS TEXT)", "mysql": "{}", "duckdb": "CAST({} AS VARCHAR)"}


@pytest.fixture()
def whole(pii: dict[str, Any]) -> dict[str, Any]:  # noqa: F811 - the imported fixture
    pii["server"].set_scenario(load_scenario(SCENARIO))
    return pii


def run_day(env: dict[str, Any], run_dag: Any, day: int, **settings: str) -> Any:
    env["server"].set_day(day)
    return run_dag("bos_test_days", "bos_test_days.py", **{**RUN, **settings})


def json_value(value: Any) -> Any:
    """``value`` with every number as its decimal value: JSON has one number type, and a database may
    spell a number otherwise than it came (PostgreSQL's jsonb writes 1e16 as 10000000000000000)."""
    if isinstance(value, dict):
        return {k: json_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_value(v) for v in value]
    if isinstance(value, float):
        return Decimal(repr(value))
    if isinstance(value, int) and not isinstance(value, bool):
        return Decimal(value)
    return value


def content(record: dict[str, Any]) -> dict[str, Any]:
    """A record's content as compared: its observation stamps left out, numbers as decimal values."""
    return json_value({name: record.get(name) for name in CONTENT} | {"sources": unstamped(record)["sources"]})


def stored_current(env: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The current rows, their JSON columns read as JSON text in SQL and decoded once here."""
    engine = env["engine"]
    as_text = _AS_TEXT[engine.dialect.name]
    columns = ", ".join(as_text.format(c) if c in JSON_CONTENT else c for c in ("record_ref", *CONTENT))
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(
            f"SELECT {columns} FROM {env['table']} WHERE _bos_deleted_at IS NULL").all()
    stored = {}
    for row in rows:
        values = dict(zip(("record_ref", *CONTENT), row, strict=True))
        for name in JSON_CONTENT:
            values[name] = None if values[name] is None else json.loads(values[name])
        stored[values["record_ref"]] = values
    return stored


@every_dialect
def test_four_days_of_every_value_the_contract_allows_land_as_sent(whole, run_dag) -> None:
    before: dict[str, dict[str, Any]] = {}  # every ref stored so far, with its last content
    current: set[str] = set()
    for day in (1, 2, 3, 4):
        dag_run = run_day(whole, run_dag, day)
        assert task_states(dag_run)["sync"] == "success", f"day {day}"
        expected = {r.record_ref: r.record for r in expected_final(SCENARIO, day).records}
        stored = stored_current(whole)
        if day < 4:  # a complete full read: exactly the read's records are current
            assert set(stored) == set(expected), f"day {day}"
        for ref, record in expected.items():
            assert content(stored[ref]) == content(record), f"day {day}: {ref}"
        # Updated: a current person whose content changed, or a retired one back (a merge split back).
        changed = {ref for ref, record in expected.items()
                   if ref in current and content(before[ref]) != content(record)}
        back = {ref for ref in expected if ref in before and ref not in current}
        summary = xcom_summary(dag_run)
        assert summary["updated"] == len(changed | back), f"day {day}"
        assert summary["inserted"] == len(set(expected) - set(before)), f"day {day}"
        before = {**before, **expected}
        current = set(expected) if day < 4 else current | set(expected)
    kinds = {type(stored_current(whole)[ref]["lifecycle"]).__name__ for ref in expected}
    assert {"str", "dict", "NoneType"} <= kinds


def raw_strings(records: list[dict[str, Any]]) -> set[str]:
    """Every text value a record carries that the strict policy hashes, long enough to search for: the
    names, emails, phones, lifecycles, identity matches, attribute values and provenance extras."""
    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)
        elif isinstance(value, str) and len(value) >= 8:  # shorter words (a method, "manual") occur by nature
            found.add(value)

    named = {"source_type", "source_identity", "record_type", "observed_at", "capabilities", "version"}
    for record in records:
        for name in ("display_name", "email", "phone", "lifecycle", "identity_match", "attributes"):
            walk(record.get(name))
        for entry in record["sources"]:
            walk({k: v for k, v in entry.items() if k not in named})
    # What the policy leaves by design (object keys, the entries' named fields) is not searched for.
    left = {str(v) for r in records for e in r["sources"] for k, v in e.items() if k in named}
    return found - left - _keys(records)


def _keys(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in _keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _keys(v)}
    return set()


@every_dialect
def test_under_star_hash_nothing_any_field_carries_is_stored_staged_or_logged_raw(whole, run_dag, caplog,
                                                                                   capsys) -> None:
    strict = {"BOS_TEST_PII_POLICY": json.dumps({"*": "hash"}), "BOS_TEST_PII_KEY_CONN": "bos_pii_key"}
    records = [r.record for day in (1, 2) for r in expected_final(SCENARIO, day).records]
    raw = raw_strings(records)
    assert len(raw) > 100
    with caplog.at_level(logging.DEBUG):
        for day in (1, 2):
            assert task_states(run_day(whole, run_dag, day, **strict))["sync"] == "success"
    log = caplog.text + "".join(capsys.readouterr())
    assert "personal-data policy" in log  # the task's own log is what was searched
    assert not leaks(every_table(whole), raw)
    assert not leaks(whole["observed"].texts(), raw)
    assert not leaks([log], raw)
