"""docs/analytics.md's queries, as written, against tables a DAG wrote through the reference server.

Day 1 and day 2 of ``people_over_time`` (merges, leavers) land through dag.test() with
``department`` promoted; each documented query then runs on the database, its table names replaced
by the test's, and its answer is compared with what the records table's JSON says.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from afhelpers import every_dialect, task_states

from airflow_provider_bos.testing.federation import day_changes
from airflow_provider_bos.warehouse.tables.schema import companion_table_name

pytestmark = pytest.mark.airflow

DOC = Path(__file__).resolve().parents[2] / "docs" / "analytics.md"
DOC_TABLE = "bos_people_daily"
SETTINGS = {"BOS_TEST_SYNC_MODE": "full",
            "BOS_TEST_ATTRIBUTE_COLUMNS": json.dumps({"department": "attributes.department"})}


def documented_queries() -> dict[str, str]:
    """Each ``<!-- analyst-query: NAME -->`` of the page and the SQL block after it."""
    text = DOC.read_text(encoding="utf-8")
    return dict(re.findall(r"<!-- analyst-query: ([\w-]+) -->\s*```sql\n(.*?)```", text, re.DOTALL))


def ask(env: dict[str, Any], sql: str, **replace: str) -> list[tuple[Any, ...]]:
    # Longest names first: the companion tables' names start with the records table's.
    for suffix in ("sources", "lineage"):
        sql = sql.replace(f"{DOC_TABLE}_{suffix}", companion_table_name(env["table"], suffix))
    sql = sql.replace(DOC_TABLE, env["table"])
    for old, new in replace.items():
        sql = sql.replace(old, new)
    with env["engine"].connect() as conn:
        return [tuple(row) for row in conn.execute(sa.text(sql))]


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def people(env: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Current rows: ref -> display_name, attributes and entries, from the stored JSON."""
    with env["engine"].connect() as conn:
        rows = conn.execute(sa.text(f"SELECT record_ref, display_name, attributes, sources FROM {env['table']} "
                                    "WHERE _bos_deleted_at IS NULL")).all()
    return {ref: {"name": name, "attributes": _json(attributes), "sources": _json(sources)}
            for ref, name, attributes, sources in rows}


def test_every_question_of_the_page_has_its_query() -> None:
    assert set(documented_queries()) == {"holder", "per-department", "crm-not-hr", "per-source", "merged"}


def test_the_demo_prints_the_answer_of_the_pages_query_as_written_there() -> None:
    from airflow_provider_bos.demo import CRM_NOT_HR_QUERY

    assert CRM_NOT_HR_QUERY.split() == documented_queries()["crm-not-hr"].split()


@every_dialect
def test_the_documented_queries_answer_on_every_database(days, run_dag) -> None:
    queries = documented_queries()
    for day in (1, 2):
        days["server"].set_day(day)
        run = run_dag("bos_test_days", "bos_test_days.py", **SETTINGS)
        assert task_states(run)["sync"] == "success"
    current = people(days)

    # Which BOS person is HR employee X? (an id of the table's own data)
    ref, person = next((r, p) for r, p in sorted(current.items())
                       if any(e["source_type"] == "hr" for e in p["sources"]))
    hr = next(e for e in person["sources"] if e["source_type"] == "hr")
    answer = ask(days, queries["holder"], **{"'hr-main'": f"'{hr['source_identity']}'",
                                             "'hr-1000042'": f"'{hr['external_id']}'"})
    assert answer == [(ref, person["name"])]

    departments = Counter(p["attributes"].get("department") for p in current.values())
    assert {(d, int(n)) for d, n in ask(days, queries["per-department"])} == set(departments.items())

    def has(p: dict[str, Any], kind: str) -> bool:
        return any(e["source_type"] == kind for e in p["sources"])

    crm_only = sorted((r, p["name"]) for r, p in current.items() if has(p, "crm") and not has(p, "hr"))
    assert crm_only and ask(days, queries["crm-not-hr"]) == crm_only

    per_source = Counter((e["source_type"], e["source_identity"]) for p in current.values()
                         for e in {(x["source_type"], x["source_identity"]): x for x in p["sources"]}.values())
    assert {(t, i, int(n)) for t, i, n in ask(days, queries["per-source"])} == {
        (t, i, n) for (t, i), n in per_source.items()}

    merged = {(old, new) for new, olds in day_changes("people_over_time", 2).merged.items() for old in olds}
    assert {(old, new) for old, new, _ in ask(days, queries["merged"])} == merged
