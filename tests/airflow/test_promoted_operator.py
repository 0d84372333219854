"""attribute_columns on the operator: checked when the DAG is parsed, not templated, handed to the writer."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_bos.exceptions import BosConfigurationError
from airflow_provider_bos.operators.federated_read import BosFederatedReadOperator
from airflow_provider_bos.warehouse.tables.attribute_columns import check_attribute_columns
from airflow_provider_bos.wire import WriteOptions

pytestmark = pytest.mark.airflow


def operator(**kwargs: Any) -> BosFederatedReadOperator:
    return BosFederatedReadOperator(task_id="sync", tool_name="people.search", destination_conn_id="bos_warehouse",
                                    **kwargs)


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"attribute_columns": {"email": "attributes.mail"}}, "own column names"),
    ({"attribute_columns": {"fte": {"path": "employment.fte", "type": "number"}}}, "must start with 'attributes.'"),
    ({"attribute_columns": {"fte": {"path": "attributes.employment.fte", "type": "decimal"}}}, "type must be one of"),
    ({"attribute_columns": {"dept": "attributes.department"}, "attribute_type_errors": "skip"},
     "attribute_type_errors must be one of"),
    ({"attribute_columns": {"salary": "attributes.pay.salary"}, "pii_policy": {"attributes.pay": "drop"}},
     "policy drops"),
])
def test_a_wrong_mapping_fails_when_the_dag_is_parsed(kwargs: dict[str, Any], says: str) -> None:
    with pytest.raises(BosConfigurationError, match=says):
        operator(**kwargs)


def test_a_wrong_mapping_is_a_dag_import_error(tmp_path) -> None:
    from tests.airflow_names import DagBag

    dag_file = tmp_path / "bad_columns.py"
    dag_file.write_text(
        "from datetime import datetime\nfrom airflow.sdk import DAG\n"
        "from airflow_provider_bos.operators.federated_read import BosFederatedReadOperator\n"
        "with DAG('bad_columns', schedule=None, start_date=datetime(2026, 1, 1)):\n"
        "    BosFederatedReadOperator(task_id='s', tool_name='people.search', destination_conn_id='w',\n"
        "                             attribute_columns={'_bos_x': 'attributes.x'})\n")
    bag = DagBag(dag_folder=str(dag_file))
    [error] = bag.import_errors.values()
    assert "starts with _bos_" in error


def test_the_mapping_is_not_templated_and_its_names_reach_the_write_options() -> None:
    assert not {"attribute_columns", "attribute_type_errors"} & set(BosFederatedReadOperator.template_fields)
    task = operator(attribute_columns={"department": "attributes.department"})
    assert task.attribute_columns == {"department": "attributes.department"}
    columns = check_attribute_columns({"department": "attributes.department",
                                       "fte": {"path": "attributes.employment.fte", "type": "number"}})
    assert WriteOptions(audit={}, attribute_columns=columns).promoted_columns == ("department", "fte")
    assert WriteOptions(audit={}).promoted_columns == ()
