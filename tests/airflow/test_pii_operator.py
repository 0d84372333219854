"""The operator's personal-data parameters: checked at DAG parse, the key read only when the policy
hashes (and then known to Airflow's secrets masker), and the OpenLineage schema facet saying which
columns are hashed or dropped."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa

from airflow_provider_bos.exceptions import BosConfigurationError
from airflow_provider_bos.operators.federated_read import BosFederatedReadOperator
from airflow_provider_bos.pii import PiiPolicy

pytestmark = pytest.mark.airflow

KEY_TEXT = "QW7S1KsDYPdmOPuGq5JmRqJpFVofWAZr-1JhXYuabGU"
POLICY = {"email": "hash", "phone": "drop", "attributes.employment.*": "drop", "sources[].external_id": "hash"}


def operator(**kwargs: Any) -> BosFederatedReadOperator:
    return BosFederatedReadOperator(task_id="sync", tool_name="people.search", destination_conn_id="bos_warehouse",
                                    **kwargs)


@pytest.mark.parametrize(("policy", "says"), [
    ({"emial": "hash"}, "Did you mean 'email'"),
    ({"email": "encrypt"}, "is not one of"),
    ({"record_ref": "hash"}, "record_ref is the table's key"),
    ({"sources[].external_id": "drop"}, "kept or hashed, not dropped"),
    (["email"], "must be a mapping"),
])
def test_a_wrong_policy_fails_when_the_dag_is_parsed(policy: Any, says: str) -> None:
    with pytest.raises(BosConfigurationError, match=says):
        operator(pii_policy=policy)


def test_a_wrong_policy_is_a_dag_import_error(tmp_path) -> None:
    from tests.airflow_names import DagBag

    dag_file = tmp_path / "bad_policy.py"
    dag_file.write_text(
        "from datetime import datetime\nfrom airflow.sdk import DAG\n"
        "from airflow_provider_bos.operators.federated_read import BosFederatedReadOperator\n"
        "with DAG('bad_policy', schedule=None, start_date=datetime(2026, 1, 1)):\n"
        "    BosFederatedReadOperator(task_id='s', tool_name='people.search', destination_conn_id='w',\n"
        "                             pii_policy={'emial': 'hash'})\n")
    bag = DagBag(dag_folder=str(dag_file))
    [error] = bag.import_errors.values()
    assert "Did you mean 'email'" in error


def test_the_policy_and_its_key_connection_are_not_templated() -> None:
    # The table refuses a run under another policy than it was written with: a policy rendered per
    # run could only fail at run time, and the key's connection is a fixed name (the key is never in the DAG).
    assert not {"pii_policy", "pii_key_conn_id"} & set(BosFederatedReadOperator.template_fields)


def test_the_operator_shows_the_canonical_policy() -> None:
    assert operator(pii_policy={"attributes.employment.*": "drop", "email": "hash"}).pii_policy == {
        "attributes.employment": "drop", "email": "hash"}
    assert operator().pii_policy == {}


def test_no_policy_reads_no_key_and_has_no_policy_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_BOS_PII_KEY", raising=False)
    assert operator()._policy_run() is None
    assert operator(pii_policy={"email": "keep"})._policy_run() is None


def test_a_policy_that_only_drops_needs_no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_BOS_PII_KEY", raising=False)
    run = operator(pii_policy={"phone": "drop", "attributes.employment": "drop"})._policy_run()
    assert run is not None and run.fingerprint.key_id is None


def test_a_hashing_policy_reads_its_key_from_the_connection_and_masks_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.log import redact

    monkeypatch.setenv("AIRFLOW_CONN_BOS_PII_KEY_TEST", json.dumps({"conn_type": "generic", "password": KEY_TEXT}))
    run = operator(pii_policy=POLICY, pii_key_conn_id="bos_pii_key_test")._policy_run()
    assert run is not None and run.fingerprint.key_id
    assert redact(f"<{KEY_TEXT}>") == "<***>"
    assert KEY_TEXT not in repr(run) + run.fingerprint.text


def test_a_missing_key_fails_the_task_before_any_table_or_read(bos_airflow, monkeypatch) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_BOS_NO_KEY_HERE", raising=False)
    before = bos_airflow["server"].counters.snapshot()
    sync = operator(pii_policy=POLICY, pii_key_conn_id="bos_no_key_here", destination_table=bos_airflow["table"])
    ti = SimpleNamespace(dag_id="d", task_id="sync", run_id="r1", xcom_push=lambda key, value: None)
    with pytest.raises(BosConfigurationError, match=r"'bos_no_key_here'.*does not exist"):
        sync.execute({"ti": ti, "outlet_events": {}})
    assert not sa.inspect(bos_airflow["engine"]).has_table(bos_airflow["table"])
    assert bos_airflow["server"].counters.snapshot() == before


def test_the_lineage_schema_facet_marks_hashed_and_dropped_columns() -> None:
    from airflow_provider_bos.assets.pii_lineage import HASHED, policy_column_descriptions

    described = policy_column_descriptions(PiiPolicy.parse(POLICY))
    assert described["email"] == HASHED
    assert described["phone"].startswith("dropped")
    assert described["sources"] == f"sources[].external_id {HASHED}"
    assert described["attributes"] == "personal-data policy: attributes.employment dropped"
    assert "display_name" not in described and policy_column_descriptions(PiiPolicy()) == {}


def test_the_operators_lineage_output_carries_the_descriptions() -> None:
    sync = operator(pii_policy=POLICY, destination_table="people")
    sync._lineage = {"engine_url": sa.engine.make_url("sqlite:////tmp/w.db"), "resource_url": "https://bos.example/mcp",
                     "context_handle": None, "summary": {"inserted": 1, "updated": 0, "retired": 0, "superseded": 0}}
    [output] = sync.get_openlineage_facets_on_complete(None).outputs
    fields = {f.name: f.description for f in output.facets["schema"].fields}
    assert fields["email"].startswith("hashed") and fields["phone"].startswith("dropped")
    assert fields["record_ref"] is None and fields["display_name"] is None
