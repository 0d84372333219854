"""The sync-health page in Airflow's own API app (in this process, ``pagefixtures.build_page``).

Serialized DAGs in Airflow's metadata DB (a DAG file synced as the DAG processor would) write two
tables of one SQLite warehouse; a third is only listed in ``[bos] health_destinations``; a fourth is
listed on a connection that does not exist. The audit rows are the real WarehouseWriter's. The auth
manager is SimpleAuthManager, with ``is_authorized_dag`` refusing chosen DAGs to ``viewer``, as a
custom auth manager granting per DAG would.

What it proves: where the page finds the tables (DAG reads, a templated read found in its audit rows,
the setting), who sees which table and run (403/404 for the rest), that no record value ever leaves
(names and emails of the synced records are searched for in every answer), and the page's headers.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from healthhelpers import EMAIL, conn_json, move_run, sync_dag_file, values_in
from pagefixtures import bearer

from airflow_provider_bos.plugins.health_discovery import parse_dag, parse_destinations
from airflow_provider_bos.plugins.health_schedule import DELAYED, ERROR, NOT_SCHEDULED, ON_TIME, punctuality
from airflow_provider_bos.warehouse import WarehouseWriter
from tests.warehouse.whhelpers import make_record, run_info, write

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(300)]

WH = "health_unit_wh"
DAGS = """
from datetime import UTC, datetime

from airflow.sdk import DAG

from airflow_provider_bos.operators.federated_read import BosFederatedReadOperator
from airflow_provider_bos.sensors.completeness import BosCompletenessSensor


for dag_id, table in (("health_unit_a", "health_unit_x"), ("health_unit_b", "health_unit_y"),
                      ("health_unit_t", "health_unit_{{ 'tt' }}")):
    with DAG(dag_id=dag_id, schedule="@daily", start_date=datetime(2026, 1, 1, tzinfo=UTC), catchup=False,
             tags=["bos-test"]):
        sync = BosFederatedReadOperator(task_id="sync", tool_name="people.search", destination_conn_id="health_unit_wh",
                                        destination_table=table)
        sync >> BosCompletenessSensor(task_id="check", destination_conn_id="health_unit_wh", sync_task_id="sync",
                                      min_coverage={"email": 0.9})
"""
# The records' values: none of them may ever appear in an answer of the page.
NAMES = [f"Quixote Zebedee {i}" for i in range(12)]
EMAILS = [f"zq{i}@health-unit.example" for i in range(12)]


def people(refs: range, *, email: bool = True) -> list[dict[str, Any]]:
    return [make_record(i, name=NAMES[i], email=EMAILS[i] if email else None, phone=f"+49 30 555 {i:04d}")
            for i in refs]


@pytest.fixture(scope="module")
def health(airflow_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The DAGs synced, the warehouse written, the settings and connection set for this module."""
    folder = tmp_path_factory.mktemp("health-unit")
    warehouse = folder / "warehouse.db"
    engine = sa.create_engine(f"sqlite:///{warehouse}")
    now = datetime.now(UTC)
    runs: dict[str, list[str]] = {}

    def run(table: str, dag: str | None, records: list[dict[str, Any]], when: datetime, **audit: Any) -> str:
        writer = WarehouseWriter(engine, table=table)
        info = run_info(dag_id=dag, task_id="sync" if dag else None,
                        airflow_run_id=f"scheduled__{when:%Y-%m-%dT%H:%M:%S}+00:00" if dag else None)
        write(writer, records, info, **audit)
        move_run(engine, "bos_sync_runs", info.run_id, when, timedelta(seconds=12))
        runs.setdefault(table, []).append(info.run_id)
        return info.run_id

    run("health_unit_x", "health_unit_a", people(range(10)), now - timedelta(days=1, hours=2))
    run("health_unit_x", "health_unit_a", people(range(12), email=False), now - timedelta(minutes=30),
        status="partial", completeness="partial",
        source_errors=[{"source": {"source_type": "hr", "source_identity": "hr-main"},
                        "error": {"code": "source_timeout"}}],
        # What drivers and the writer say: a quoted value (MariaDB), a key's value (PostgreSQL's DETAIL), an address.
        error_message=f"late: Duplicate entry {NAMES[4]!r} for key; Key (email)=({EMAILS[5]}) exists; {EMAILS[3]}")
    run("health_unit_x", "health_unit_b", people(range(12)), now - timedelta(days=2))  # B's run into A's table
    run("health_unit_x", None, people(range(12)), now - timedelta(days=2, hours=1))     # a script, no DAG
    run("health_unit_y", "health_unit_b", people(range(5)), now - timedelta(days=3))    # B: days ago: Delayed
    run("health_unit_tt", "health_unit_t", people(range(4)), now - timedelta(hours=3))  # the templated read's table
    run("health_unit_z", None, people(range(6)), now - timedelta(hours=5))              # listed only
    engine.dispose()
    dags = sync_dag_file(airflow_db, "bos_health_unit_dags.py", DAGS)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(f"AIRFLOW_CONN_{WH.upper()}", conn_json(warehouse))
        patch.setenv("AIRFLOW__BOS__HEALTH_DESTINATIONS",
                     f"{WH}:health_unit_z, health_unit_missing_conn:health_unit_q:bos_sync_runs, bad entry::x")
        yield {"runs": runs, "warehouse": warehouse, "now": now}
    dags.unlink()


@pytest.fixture()
def deny(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``deny("viewer", {"health_unit_b"})``: the auth manager refuses these DAGs to that user."""

    def install(user_name: str, refused: set[str]) -> None:
        from airflow.api_fastapi.app import get_auth_manager

        manager = get_auth_manager()
        allowed = manager.is_authorized_dag

        def is_authorized_dag(*, method: str, user: Any, access_entity: Any = None, details: Any = None) -> bool:
            if user.get_name() == user_name and getattr(details, "id", None) in refused:
                return False
            return allowed(method=method, user=user, access_entity=access_entity, details=details)

        monkeypatch.setattr(manager, "is_authorized_dag", is_authorized_dag)

    return install


def overview(client: Any, headers: dict[str, str], window: int = 7) -> dict[str, dict[str, Any]]:
    response = client.get(f"/bos/health/api?window={window}", headers=headers)
    assert response.status_code == 200, response.text
    return {d["table"]: d for d in response.json()["destinations"] if d["table"].startswith("health_unit_")}


def every_answer(client: Any, headers: dict[str, str]) -> list[str]:
    """Every page and JSON answer the page gives this user: overview, tables, runs, in each window."""
    texts = []
    for window in (7, 30, 90):
        texts += [client.get(f"/bos/health/?window={window}", headers=headers).text,
                  client.get(f"/bos/health/api?window={window}", headers=headers).text]
    for table in overview(client, headers).values():
        key = table["key"]
        texts += [client.get(f"/bos/health/tables/{key}", headers=headers).text,
                  client.get(f"/bos/health/api/tables/{key}", headers=headers).text]
        detail = client.get(f"/bos/health/api/tables/{key}", headers=headers).json()
        for run in (detail["health"] or {}).get("recent", []):
            texts += [client.get(f"/bos/health/tables/{key}/runs/{run['run_id']}", headers=headers).text,
                      client.get(f"/bos/health/api/tables/{key}/runs/{run['run_id']}", headers=headers).text]
    return texts


def test_an_admin_sees_every_table_from_the_dags_and_the_setting(password_page, admin, health) -> None:
    tables = overview(password_page, admin)
    assert set(tables) == {"health_unit_x", "health_unit_y", "health_unit_tt", "health_unit_z", "health_unit_q"}
    x = tables["health_unit_x"]
    assert x["conn_id"] == WH and x["audit_table"] == "bos_sync_runs" and not x["configured"]
    assert {(w["dag_id"], w["task_id"]) for w in x["writers"]} == {("health_unit_a", "sync")}
    assert x["thresholds"] == {"email": 0.9}  # the sensor's min_coverage, serialized as a template field
    assert tables["health_unit_tt"]["writers"] == [{"dag_id": "health_unit_t", "task_id": "sync"}]  # from its rows
    assert tables["health_unit_z"]["configured"] and tables["health_unit_z"]["writers"] == []
    assert tables["health_unit_z"]["health"]["runs_in_window"] == 1
    # A destination that cannot be reached is shown as such; the page still answers.
    assert tables["health_unit_q"]["health"] is None and "does not exist" in tables["health_unit_q"]["error"]
    # An admin sees every run: A's, B's and the script's.
    assert x["health"]["runs_in_window"] == 4
    assert x["health"]["latest"]["status"] == "partial" and x["health"]["latest"]["dag_id"] == "health_unit_a"


def test_the_schedule_says_on_time_delayed_or_error(password_page, admin, health) -> None:
    tables = overview(password_page, admin)
    assert tables["health_unit_x"]["per_dag"]["health_unit_a"]["state"] == ON_TIME
    assert tables["health_unit_y"]["state"]["state"] == DELAYED  # @daily, last run three days ago
    assert "paused" in tables["health_unit_y"]["state"]["detail"]  # a DAG the processor stored paused
    assert tables["health_unit_z"]["state"] is None  # no DAG writes it


def test_the_table_page_draws_each_chart_from_the_audit_rows(password_page, admin, health) -> None:
    key = overview(password_page, admin)["health_unit_x"]["key"]
    data = password_page.get(f"/bos/health/api/tables/{key}?window=7", headers=admin).json()["health"]
    assert data["counts"]["mode"] == "run" and len(data["counts"]["points"]) == 4
    # In time order: the script's run (12 unchanged), B's (12 updated: emails back), A's two.
    assert [p["inserted"] for p in data["counts"]["points"]] == [0, 0, 10, 2]
    assert [(p["records"], p["columns"]["email"]) for p in data["coverage"]["points"]] == [
        (12, 12), (12, 12), (10, 10), (12, 0)]
    assert data["sources"]["failures"] == [{"source_type": "hr", "source_identity": "hr-main", "runs_failed": 1,
                                            "codes": {"source_timeout": 1}}]
    assert data["rows"] == {"total": 12, "current": 12, "retired": 0, "superseded": 0}
    page = password_page.get(f"/bos/health/tables/{key}?window=7", headers=admin)
    assert page.status_code == 200
    html = page.text
    assert len(re.findall(r'<g class="day"', html)) == 7
    assert html.count('class="point cov-') == 4 * 3  # display_name, email, phone at each of 4 runs
    assert 'class="threshold cov-1" ' in html and 'data-threshold="0.9"' in html  # email's min_coverage
    assert re.search(r'data-source="hr/hr-main" data-runs-failed="1"', html)
    latest = data["latest"]
    assert (f'/dags/health_unit_a/runs/{latest["airflow_run_id"].replace(":", "%3A").replace("+", "%2B")}'
            "/tasks/sync") in html


def test_the_headers_forbid_framing_and_script(password_page, admin, health) -> None:
    for path in ("/bos/health/", "/bos/health/api"):
        response = password_page.get(path, headers=admin)
        assert response.headers["cache-control"] == "no-store"
        assert response.headers["x-frame-options"] == "DENY"
    policy = password_page.get("/bos/health/", headers=admin).headers["content-security-policy"]
    assert "default-src 'none'" in policy and "frame-ancestors 'none'" in policy and "script-src" not in policy
    assert "<script" not in password_page.get("/bos/health/", headers=admin).text
    assert password_page.get("/bos/health/?window=8", headers=admin).status_code == 400


def test_signing_in_is_required(password_page, health) -> None:
    response = password_page.get("/bos/health/", follow_redirects=False)
    assert response.status_code == 303 and "/login" in response.headers["location"]
    forged = password_page.get("/bos/health/api", headers={"Authorization": "Bearer nonsense"},
                               follow_redirects=False)
    assert forged.status_code == 403 and "health_unit_" not in forged.text  # Airflow's answer to a bad token


def test_a_user_who_may_not_read_a_dag_sees_nothing_of_its_table(password_page, admin, health, deny) -> None:
    keys = {name: t["key"] for name, t in overview(password_page, admin).items()}
    run_of_b = health["runs"]["health_unit_y"][0]
    b_run_in_x = health["runs"]["health_unit_x"][2]
    script_run_in_x = health["runs"]["health_unit_x"][3]
    deny("viewer", {"health_unit_b"})
    viewer = bearer(password_page, "viewer")

    tables = overview(password_page, viewer)
    # health_unit_y: only B writes it; health_unit_z/_q: listed only (the viewer may not edit their Connection).
    assert set(tables) == {"health_unit_x", "health_unit_tt"}
    for table in ("health_unit_y", "health_unit_z", "health_unit_q"):
        for path in (f"/bos/health/tables/{keys[table]}", f"/bos/health/api/tables/{keys[table]}"):
            refused = password_page.get(path, headers=viewer)
            assert refused.status_code == 404, (table, refused.text)
            assert table not in refused.text
    assert password_page.get(f"/bos/health/api/tables/{keys['health_unit_y']}/runs/{run_of_b}",
                             headers=viewer).status_code == 404
    html = password_page.get("/bos/health/?window=90", headers=viewer).text
    assert "health_unit_y" not in html and "health_unit_z" not in html and "health_unit_b" not in html

    # In the table it may see, the viewer sees A's runs only: not B's, not the script's.
    x = password_page.get(f"/bos/health/api/tables/{keys['health_unit_x']}", headers=viewer).json()
    assert x["health"]["runs_in_window"] == 2
    assert {p["run_id"] for p in x["health"]["counts"]["points"]} == set(health["runs"]["health_unit_x"][:2])
    assert "health_unit_b" not in str(x)
    for hidden in (b_run_in_x, script_run_in_x):
        assert password_page.get(f"/bos/health/api/tables/{keys['health_unit_x']}/runs/{hidden}",
                                 headers=viewer).status_code == 404
        assert password_page.get(f"/bos/health/api/tables/{keys['health_unit_x']}/runs/{hidden}",
                                 headers=admin).status_code == 200


def test_a_user_who_may_read_no_dag_sees_no_table(password_page, health, deny) -> None:
    deny("viewer", {"health_unit_a", "health_unit_b", "health_unit_t"})
    viewer = bearer(password_page, "viewer")
    assert overview(password_page, viewer) == {}
    assert "health_unit_" not in password_page.get("/bos/health/", headers=viewer).text


def test_no_record_value_leaves_the_page(password_page, admin, health) -> None:
    texts = every_answer(password_page, admin)
    assert len(texts) > 20
    joined = "\n".join(texts)
    assert values_in(joined, NAMES + EMAILS) == []
    assert [e for e in EMAIL.findall(joined) if e.endswith("health-unit.example")] == []
    assert "+49 30 555" not in joined
    # The partial run's note quoted an email and a name: shown without them.
    key = overview(password_page, admin)["health_unit_x"]["key"]
    partial = health["runs"]["health_unit_x"][1]
    note = password_page.get(f"/bos/health/api/tables/{key}/runs/{partial}", headers=admin).json()["error_message"]
    assert note == "late: Duplicate entry [quoted text] for key; Key (email)=([value]) exists; [address]"


# --- discovery and schedule, without a server ------------------------------------------------------


def test_a_mapped_read_lists_its_literal_tables_and_a_templated_one_none() -> None:
    data = {"dag": {"dag_id": "m", "tasks": [
        {"__type": "operator", "__var": {
            "task_type": "BosFederatedReadOperator", "task_id": "read", "_is_mapped": True,
            "partial_kwargs": {"destination_conn_id": "wh", "audit_table": "runs"},
            "expand_input": {"type": "dict-of-lists", "value": {"destination_table": ["t1", "t2", "{{ bad }}"]}}}},
        {"__type": "operator", "__var": {
            "task_type": "BosFederatedReadOperator", "task_id": "templated", "destination_table": "{{ params.t }}",
            "outlets": [{"__type": "asset_alias", "__var": {"name": "bos:wh::{{ params.t }}"}}]}},
        {"__type": "operator", "__var": {"task_type": "BosFederatedReadOperator", "task_id": "custom_outlets",
                                         "destination_table": "t3"}},
    ]}}
    info = parse_dag(data)
    reads = {r.task_id: r for r in info.reads}
    assert (reads["read"].conn_id, reads["read"].tables, reads["read"].audit_table) == ("wh", ("t1", "t2"), "runs")
    assert (reads["templated"].conn_id, reads["templated"].tables) == ("wh", ())
    assert info.unlocatable == ("custom_outlets",)


def test_the_setting_is_parsed_and_a_bad_entry_skipped() -> None:
    assert parse_destinations("wh:t, wh2:s.t2:runs\nbad wh3:x:y:z") == [
        ("wh", None, "t", "bos_sync_runs"), ("wh2", "s", "t2", "runs")]


def test_punctuality_follows_the_timetable() -> None:
    from airflow.timetables.trigger import CronTriggerTimetable

    daily = CronTriggerTimetable("0 6 * * *", timezone="UTC")
    now = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)

    def state(started: datetime, status: str = "complete", **kwargs: Any) -> str:
        latest = {"started_at": started, "finished_at": started + timedelta(minutes=1), "status": status}
        return punctuality(timetable=daily, latest=latest, now=now, **kwargs).state

    assert state(datetime(2026, 12, 6, 6, 0, 5, tzinfo=UTC)) == ON_TIME  # today's run
    assert state(datetime(2026, 12, 5, 6, 0, 5, tzinfo=UTC)) == DELAYED  # today's 06:00 run missing
    assert state(datetime(2026, 12, 6, 6, 0, 5, tzinfo=UTC), "failed") == ERROR
    early = datetime(2026, 12, 6, 6, 20, tzinfo=UTC)  # 06:00 due; yesterday's run; within the grace
    assert punctuality(timetable=daily, now=early, latest={"started_at": datetime(2026, 12, 5, 6, 1, tzinfo=UTC),
                                                           "status": "complete"}).state == ON_TIME
    assert punctuality(timetable=None, latest={"started_at": now, "status": "complete"}, now=now).state == NOT_SCHEDULED


def test_the_plugin_adds_the_page_beside_admin_bos() -> None:
    from airflow_provider_bos.plugins.plugin import BosUiPlugin

    bos, health = BosUiPlugin.external_views
    assert (bos["name"], bos["href"]) == ("BOS", "/bos/")
    assert (health["name"], health["href"], health["category"]) == ("Sync health", "/bos/health/", "admin")
    assert "url_route" not in health  # its own tab, never framed (the page forbids framing)
