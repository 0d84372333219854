"""What the operator hands to the rest of Airflow: the asset event and the OpenLineage facets."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa
from afhelpers import task_states
from outlet_events import OutletEvents

from airflow_provider_bos.operators.federated_read import BosFederatedReadOperator
from airflow_provider_bos.testing.scenario import load_scenario

pytestmark = [pytest.mark.airflow, pytest.mark.parametrize("warehouse_url", ["sqlite"], indirect=True)]


def test_asset_event_for_the_destination_table_carries_counts(bos_airflow, run_dag) -> None:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    bos_airflow["server"].set_scenario(load_scenario("complete"))
    dag_run = run_dag("bos_test_sync")
    assert task_states(dag_run)["sync"] == "success"

    with create_session() as session:
        events = session.execute(
            sa.select(AssetModel.uri, AssetEvent.extra)
            .join(AssetEvent, AssetEvent.asset_id == AssetModel.id)
            .where(AssetEvent.source_run_id == dag_run.run_id, AssetEvent.source_task_id == "sync")
        ).all()
    [(uri, extra)] = events
    database = sa.engine.make_url(bos_airflow["url"]).database
    assert uri.startswith("sqlite://") and uri.endswith(f"{database.lstrip('/')}/{bos_airflow['table']}")
    assert extra["completeness"] == "complete"
    assert extra["inserted"] == 350 and extra["result_count"] == 350


def test_openlineage_facets_name_the_bos_read_and_the_table(bos_airflow) -> None:
    bos_airflow["server"].set_scenario(load_scenario("identity_merge"))
    operator = BosFederatedReadOperator(
        task_id="sync", tool_name="people.search", destination_conn_id="bos_warehouse",
        destination_table=bos_airflow["table"],
    )
    xcoms: dict[str, Any] = {}
    ti = SimpleNamespace(dag_id="d", task_id="sync", run_id="r1",
                         xcom_push=lambda key, value: xcoms.__setitem__(key, value))  # noqa: PLW0108 - called with keywords
    outlet_events = OutletEvents()

    summary = operator.execute({"ti": ti, "outlet_events": outlet_events})

    assert xcoms["bos_run_id"] == summary["run_id"]
    json.dumps(summary)  # XCom-serialisable, and small: no records in it
    assert set(summary) >= {"run_id", "status", "completeness", "inserted", "source_errors"}
    lineage = operator.get_openlineage_facets_on_complete(None)
    [bos_input] = lineage.inputs
    assert bos_input.namespace == bos_airflow["server"].mcp_url
    assert bos_input.name.endswith("/people.search")
    [output] = lineage.outputs
    assert output.name == bos_airflow["table"]
    columns = {f.name for f in output.facets["schema"].fields}
    assert {"record_ref", "sources", "_bos_record_hash"} <= columns
    assert output.outputFacets["outputStatistics"].rowCount == summary["inserted"] == 60


def test_openlineage_facets_mark_what_the_policy_did_to_each_column_promoted_ones_too(
        bos_airflow, monkeypatch) -> None:
    """Run for real under a policy with promoted columns: the facet lists every column the table has,
    each promoted one with its type and path, and says which hold hashes and which are always NULL."""
    from airflow_provider_bos.assets.pii_lineage import HASHED

    monkeypatch.setenv("AIRFLOW_CONN_BOS_PII_KEY_LINEAGE",
                       json.dumps({"conn_type": "generic", "password": "zj8EtA5vtMr7W1doBvQNzdau7sOcoLJ80dmQ5TMhOKM"}))
    bos_airflow["server"].set_scenario(load_scenario("identity_merge"))
    operator = BosFederatedReadOperator(
        task_id="sync", tool_name="people.search", destination_conn_id="bos_warehouse",
        destination_table=bos_airflow["table"], pii_key_conn_id="bos_pii_key_lineage",
        pii_policy={"email": "hash", "phone": "drop", "attributes.title": "hash"},
        attribute_columns={"department": "attributes.department", "title": "attributes.title",
                           "fte": {"path": "attributes.employment.fte", "type": "number"}},
    )
    ti = SimpleNamespace(dag_id="d", task_id="sync", run_id="r1", xcom_push=lambda key, value: None)
    operator.execute({"ti": ti, "outlet_events": OutletEvents()})

    [output] = operator.get_openlineage_facets_on_complete(None).outputs
    fields = {f.name: f for f in output.facets["schema"].fields}
    assert set(fields) == {c["name"] for c in sa.inspect(bos_airflow["engine"]).get_columns(bos_airflow["table"])}
    assert fields["email"].description == HASHED and fields["phone"].description.startswith("dropped")
    assert fields["title"].description == f"promoted from attributes.title: {HASHED}"
    assert fields["department"].description == "promoted from attributes.department"
    assert fields["fte"].type in ("FLOAT", "REAL") and fields["department"].type == "TEXT"
    with bos_airflow["engine"].connect() as conn:
        titles = conn.execute(sa.text(f"SELECT title FROM {bos_airflow['table']}")).scalars().all()
    held = [t for t in titles if t is not None]
    assert held and all(len(t) == 64 for t in held)  # the column the facet calls hashed holds hashes
