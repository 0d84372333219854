"""The sync-health page in a real ``airflow api-server``, driven by headless Chromium.

Two tables synced over several days by two scheduled DAGs from the reference server's
``people_over_time`` scenario, with real ``dag.test()`` runs: ``health_people`` on days 1-4, whose
``email`` goes empty from day 3 (the scenario's ``emptied_fields``) and whose day 4 is partial
(``hr-main`` times out); ``health_teams`` on days 1-3, last synced two days ago. Each run is moved to
its day after it ran (the writer stamps the time it ran). A destination on a connection that does not
exist is listed in ``[bos] health_destinations``.

Checked in the browser against the audit rows: every chart's data points, the latest run and its
link to the task instance's log in the Airflow UI, On time / Delayed, a run's detail on click; that
no name, email, phone, record_ref or external id of the reference server's records is in any page
or JSON answer; light and dark screenshots (into $BOS_UI_ARTIFACTS, else the test's tmp dir).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from healthhelpers import EMAIL, audit_rows, conn_json, move_run, values_in

from tests.airflow.conftest import load_dag

pytestmark = [pytest.mark.airflow, pytest.mark.slow, pytest.mark.timeout(1200)]

DAG_FILE = "bos_health_browser_dags.py"
DAGS = """
from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG

from airflow_provider_bos.operators.federated_read import BosFederatedReadOperator
from airflow_provider_bos.sensors.completeness import BosCompletenessSensor


with DAG(dag_id="bos_health_people", schedule="@daily", start_date=datetime(2026, 1, 1, tzinfo=UTC),
         catchup=False, tags=["bos-test"]):
    BosFederatedReadOperator(
        task_id="sync", tool_name="people.search", destination_conn_id="bos_health_wh",
        destination_table="health_people", read_deadline=timedelta(seconds=60),
    ) >> BosCompletenessSensor(task_id="check", destination_conn_id="bos_health_wh", sync_task_id="sync",
                        on_partial="alert", min_records=0, min_coverage={"email": 0.9}, poke_interval=1, timeout=30)

with DAG(dag_id="bos_health_teams", schedule="@daily", start_date=datetime(2026, 1, 1, tzinfo=UTC),
         catchup=False, tags=["bos-test"]):
    BosFederatedReadOperator(
        task_id="sync", tool_name="people.search", destination_conn_id="bos_health_wh",
        destination_table="health_teams", read_deadline=timedelta(seconds=60),
    )
"""
COLUMNS = ("inserted", "updated", "unchanged", "retired", "superseded", "withheld", "rejected")


def _decoded(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


@pytest.fixture(scope="module")
def synced(airflow_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Both tables synced by real DAG runs over their days; the connections set for the api-server too."""
    from airflow_provider_bos.testing.scenario import load_scenario
    from airflow_provider_bos.testing.server import BosReferenceServer

    folder = tmp_path_factory.mktemp("health-browser")
    warehouse, empty = folder / "warehouse.db", folder / "other-warehouse.db"
    sa.create_engine(f"sqlite:///{empty}").connect().close()  # the example DAGs' warehouse: no run there
    server = BosReferenceServer(scenario="people_over_time")
    server.start()
    patch = pytest.MonkeyPatch()
    dag_file = airflow_db / DAG_FILE
    try:
        grant = server.mint_grant()
        patch.delenv("AIRFLOW_CONN_BOS_DEFAULT", raising=False)
        patch.setenv("AIRFLOW_CONN_BOS_DEFAULT", json.dumps({
            "conn_type": "bos", "host": server.mcp_url, "password": grant["refresh_token"],
            "extra": {"auth_type": "oauth", "client_id": grant["client_id"], "protocol": "auto",
                      "token_store_url": f"sqlite:///{folder / 'tokens.db'}"}}))
        patch.setenv("AIRFLOW_CONN_BOS_HEALTH_WH", conn_json(warehouse))
        patch.setenv("AIRFLOW_CONN_BOS_WAREHOUSE", conn_json(empty))
        patch.setenv("AIRFLOW__BOS__HEALTH_DESTINATIONS", "bos_health_gone:health_archive")
        dag_file.write_text(DAGS)

        scenario = load_scenario("people_over_time")
        emptied = scenario.model_copy(update={"emptied_fields": ["email"]})
        now = datetime.now(UTC)
        plan = [  # (dag, scenario, day, when the run is to have finished)
            ("bos_health_teams", scenario, 1, now - timedelta(days=4, hours=2)),
            ("bos_health_people", scenario, 1, now - timedelta(days=3, hours=1)),
            ("bos_health_teams", scenario, 2, now - timedelta(days=3, hours=2)),
            ("bos_health_people", scenario, 2, now - timedelta(days=2, hours=1)),
            ("bos_health_teams", scenario, 3, now - timedelta(days=2, hours=2)),
            ("bos_health_people", emptied, 3, now - timedelta(days=1, hours=1)),
            ("bos_health_people", emptied, 4, now - timedelta(minutes=10)),
        ]
        engine = sa.create_engine(f"sqlite:///{warehouse}")
        seen: set[str] = set()
        airflow_runs: dict[str, list[str]] = {}
        for dag_id, chosen, day, when in plan:
            server.set_scenario(chosen, day=day)
            dag_run = load_dag(airflow_db, DAG_FILE, dag_id).test()
            states = {ti.task_id: str(getattr(ti.state, "value", ti.state)) for ti in dag_run.get_task_instances()}
            assert states["sync"] == "success", states
            [row] = [r for r in audit_rows(engine, "bos_sync_runs") if r["run_id"] not in seen]
            seen.add(row["run_id"])
            took = _utc(row["finished_at"]) - _utc(row["started_at"])
            move_run(engine, "bos_sync_runs", row["run_id"], when, took)
            airflow_runs.setdefault(dag_id, []).append(dag_run.run_id)
        rows = audit_rows(engine, "bos_sync_runs")
        with engine.connect() as conn:
            counts = {table: conn.execute(sa.text(
                f"SELECT COUNT(*), SUM(CASE WHEN _bos_deleted_at IS NULL THEN 1 ELSE 0 END) FROM {table}")).one()
                for table in ("health_people", "health_teams")}
        engine.dispose()
        yield {"rows": rows, "counts": counts, "server": server, "scenario": scenario, "now": now,
               "airflow_runs": airflow_runs}
    finally:
        dag_file.unlink(missing_ok=True)
        patch.undo()
        server.stop()


@pytest.fixture(scope="module")
def health_server(synced: dict[str, Any], request: pytest.FixtureRequest) -> Any:
    """The api-server, started after the runs with their connections and settings in its environment."""
    return request.getfixturevalue("api_server")


def record_values(scenario: Any) -> list[str]:
    """Every name, email, phone, record_ref and external id the reference server sent on days 1-4."""
    from airflow_provider_bos.testing.federation import expected_final

    values: set[str] = set()
    for day in (1, 2, 3, 4):
        for expected in expected_final(scenario, day).records:
            record = expected.record
            values.update(str(record[f]) for f in ("display_name", "email", "phone") if record.get(f))
            values.add(expected.record_ref)
            values.update(external_id for _type, _identity, external_id in expected.provenance
                          if len(external_id) >= 4)
    return sorted(values)


def _charts_match_the_audit_rows(page: Any, rows: list[dict[str, Any]]) -> list[dict[str, str]]:
    """A table page's timeline (7 days), counts and coverage, point by point against ``rows`` (its
    audit rows); returns the coverage points."""
    days = {a["data-day"]: a for a in _attrs(page, "svg.timeline g.day")}
    assert len(days) == 7
    for day, attrs in days.items():
        on_day = [r for r in rows if _utc(r["finished_at"]).date().isoformat() == day]
        for status in ("complete", "partial", "failed"):
            assert int(attrs[f"data-{status}"]) == sum(r["status"] == status for r in on_day), (day, status)
    assert sum(int(a[f"data-{s}"]) for a in days.values() for s in ("complete", "partial", "failed")) == len(rows)

    bars = _attrs(page, "svg.counts rect.bar")
    assert len(bars) == len(COLUMNS) * len(rows)
    for bar in bars:
        [row] = [r for r in rows if r["run_id"] == bar["data-run-id"]]
        assert bar["data-value"] == str(row[bar["data-series"]]), bar

    points = _attrs(page, "svg.coverage circle.point")
    assert {p["data-column"] for p in points} == {"display_name", "email", "phone"}
    assert len(points) == 3 * len(rows)
    for point in points:
        [row] = [r for r in rows if r["run_id"] == point["data-run-id"]]
        coverage = _decoded(row["coverage"])
        assert int(point["data-records"]) == coverage["records"]
        assert int(point["data-filled"]) == coverage["columns"][point["data-column"]]
    return points


def _attrs(page: Any, selector: str) -> list[dict[str, str]]:
    return page.eval_on_selector_all(
        selector, "els => els.map(e => Object.fromEntries([...e.attributes].map(a => [a.name, a.value])))")


def test_sync_health_in_the_browser(health_server, synced, browser_as, artifacts: Path) -> None:
    base = health_server.base_url
    page = browser_as("admin")
    page.set_viewport_size({"width": 1280, "height": 900})
    pages: list[str] = []

    # Admin -> Sync health, beside Admin -> BOS.
    page.goto(f"{base}/")
    page.get_by_role("button", name="Admin").click(timeout=120_000)
    entry = page.get_by_role("menuitem", name="Sync health")
    entry.wait_for(timeout=30_000)
    assert entry.locator("xpath=descendant-or-self::a").first.get_attribute("href") == "/bos/health/"
    assert page.get_by_role("menuitem", name="BOS").count() == 1  # the BOS page's entry stays the one "BOS"

    # The overview: both tables, their latest runs and schedule states, and the unreachable one.
    page.goto(f"{base}/bos/health/?window=7")
    pages.append(page.content())
    people_row = page.locator('tr[data-table="health_people"]')
    teams_row = page.locator('tr[data-table="health_teams"]')
    assert people_row.locator("[data-status]").first.get_attribute("data-status") == "partial"
    assert people_row.locator("[data-state]").first.get_attribute("data-state") == "On time"
    assert teams_row.locator("[data-status]").first.get_attribute("data-status") == "complete"
    assert teams_row.locator("[data-state]").first.get_attribute("data-state") == "Delayed"
    gone = page.locator('tr[data-table="health_archive"]')
    assert gone.locator("[data-state]").get_attribute("data-state") == "Unreachable"
    assert "does not exist" in gone.inner_text()
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280  # usable at 1280 px
    page.screenshot(path=str(artifacts / "health-overview-light.png"), full_page=True)
    page.emulate_media(color_scheme="dark")
    page.screenshot(path=str(artifacts / "health-overview-dark.png"), full_page=True)
    page.emulate_media(color_scheme="light")

    # The people table's charts, point by point against its audit rows.
    people_row.locator("a[data-key]").click()
    page.wait_for_url(re.compile(r"/bos/health/tables/\w+\?window=7$"))
    pages.append(page.content())
    rows = [r for r in synced["rows"] if r["destination_table"] == "health_people"]
    assert len(rows) == 4

    points = _charts_match_the_audit_rows(page, rows)
    email = sorted((p for p in points if p["data-column"] == "email"), key=lambda p: p["data-run-id"])
    assert sorted(int(p["data-filled"]) > 0 for p in email) == [False, False, True, True]  # the field went empty
    [threshold] = _attrs(page, "svg.coverage line.threshold")
    assert (threshold["data-column"], threshold["data-threshold"]) == ("email", "0.9")

    [source] = _attrs(page, "table.sources tr.source")
    assert (source["data-source"], source["data-runs-failed"]) == ("hr/hr-main", "1")
    assert page.locator('table.sources [data-code="source_timeout"]').count() == 1

    [bar] = _attrs(page, "svg.rowsbar")
    total, current = synced["counts"]["health_people"]
    assert (int(bar["data-current"]), int(bar["data-retired"])) == (current, total - current)

    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    page.screenshot(path=str(artifacts / "health-table-light.png"), full_page=True)
    page.emulate_media(color_scheme="dark")
    page.screenshot(path=str(artifacts / "health-table-dark.png"), full_page=True)
    page.emulate_media(color_scheme="light")
    table_url = page.url

    # The teams table's charts, point by point against its own audit rows (no threshold, no failure).
    page.goto(f"{base}/bos/health/?window=7")
    page.locator('tr[data-table="health_teams"] a[data-key]').click()
    page.wait_for_url(re.compile(r"/bos/health/tables/\w+\?window=7$"))
    pages.append(page.content())
    teams = [r for r in synced["rows"] if r["destination_table"] == "health_teams"]
    assert len(teams) == 3
    _charts_match_the_audit_rows(page, teams)
    assert _attrs(page, "svg.coverage line.threshold") == []
    assert page.locator("table.sources [data-code]").count() == 0
    [bar] = _attrs(page, "svg.rowsbar")
    total, current = synced["counts"]["health_teams"]
    assert (int(bar["data-current"]), int(bar["data-retired"])) == (current, total - current)
    page.goto(table_url)

    # One run on click: the partial day's email point opens the run in words.
    partial = next(r for r in rows if r["status"] == "partial")
    page.locator(f'svg.coverage a:has(circle[data-column="email"][data-run-id="{partial["run_id"]}"])').click()
    page.wait_for_url(re.compile(rf"/runs/{partial['run_id']}"))
    pages.append(page.content())
    assert "partial" in page.locator("p.run-words").inner_text()
    assert page.locator("table.source-errors .code").inner_text() == "source_timeout"
    page.screenshot(path=str(artifacts / "health-run-light.png"), full_page=True)

    # The latest run links to its task instance (and log) in the Airflow UI.
    log_link = page.locator("a.task-log").first
    href = log_link.get_attribute("href")
    [airflow_run] = [r for r in synced["airflow_runs"]["bos_health_people"] if r == partial["airflow_run_id"]]
    assert href == (f"/dags/bos_health_people/runs/{airflow_run.replace(':', '%3A').replace('+', '%2B')}"
                    "/tasks/sync")
    log_link.click()
    page.wait_for_url(re.compile(r"/dags/bos_health_people/runs/.+/tasks/sync"))
    page.get_by_text("sync", exact=True).first.wait_for(timeout=60_000)
    page.screenshot(path=str(artifacts / "airflow-task-instance.png"))

    # No record value in any page or JSON answer, in any window.
    cookies = {"_token": health_server.token("admin")}
    with httpx.Client(base_url=base, cookies=cookies) as client:
        api = client.get("/bos/health/api?window=90").json()
        keys = [d["key"] for d in api["destinations"]]
        for window in (7, 30, 90):
            pages += [client.get(f"/bos/health/?window={window}").text,
                      client.get(f"/bos/health/api?window={window}").text]
            for key in keys:
                pages += [client.get(f"/bos/health/tables/{key}?window={window}").text,
                          client.get(f"/bos/health/api/tables/{key}?window={window}").text]
        for row in synced["rows"]:
            key = next(d["key"] for d in api["destinations"] if d["table"] == row["destination_table"])
            pages += [client.get(f"/bos/health/tables/{key}/runs/{row['run_id']}").text,
                      client.get(f"/bos/health/api/tables/{key}/runs/{row['run_id']}").text]
        assert client.get(table_url.removeprefix(base)).status_code == 200
    everything = "\n".join(pages)
    assert len(pages) > 40
    values = record_values(synced["scenario"])
    assert len(values) > 500
    assert values_in(everything, values) == []
    assert EMAIL.findall(everything) == []
    for name in ("health-table-light.png", "health-table-dark.png"):
        assert (artifacts / name).stat().st_size < 1024 * 1024
    if os.environ.get("BOS_UPDATE_DOC_SCREENSHOTS"):  # refresh the docs' copies: BOS_UPDATE_DOC_SCREENSHOTS=1
        docs = Path(__file__).resolve().parents[2] / "docs"
        for mode in ("light", "dark"):
            shutil.copy(artifacts / f"health-table-{mode}.png", docs / f"sync-health-{mode}.png")
