"""attribute_columns: parsed and checked when the DAG is parsed (no database)."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_bos.exceptions import BosConfigurationError
from airflow_provider_bos.warehouse.tables.attribute_columns import ATTRIBUTE_TYPES, check_attribute_columns


def test_a_mapping_parses_into_typed_columns() -> None:
    columns = check_attribute_columns({
        "department": "attributes.department",
        "fte": {"path": "attributes.employment.fte", "type": "number"},
    })
    assert columns.names == ("department", "fte")
    assert [(c.path, c.json_path, c.type) for c in columns.columns] == [
        ("attributes.department", "$.department", "text"), ("attributes.employment.fte", "$.employment.fte", "number")]
    assert not check_attribute_columns(None) and not check_attribute_columns({})


@pytest.mark.parametrize(("spec", "says"), [
    ({"record_ref": "attributes.x"}, "records table's own column names"),
    ({"_bos_anything": "attributes.x"}, "starts with _bos_"),
    ({"_bos_valid_from": "attributes.x"}, "own column names"),
    ({"bad name": "attributes.x"}, "not a valid column name"),
    ({"dept": "department"}, "must start with 'attributes.'"),
    ({"dept": "attributes."}, "must start with 'attributes.'"),
    ({"dept": "attributes.a-b"}, "letters, digits and underscores"),
    ({"dept": {"path": "attributes.x", "type": "float"}}, "type must be one of"),
    ({"dept": {"path": "attributes.x", "kind": "text"}}, "must be a path such as"),
    ({"dept": 5}, "must be a path such as"),
    ({"Dept": "attributes.a", "dept": "attributes.b"}, "same name"),
])
def test_a_wrong_mapping_is_refused_saying_what_to_fix(spec: Any, says: str) -> None:
    with pytest.raises(BosConfigurationError, match=says):
        check_attribute_columns(spec)


def test_attribute_type_errors_is_checked() -> None:
    assert check_attribute_columns({}, type_errors="null").type_errors == "null"
    with pytest.raises(BosConfigurationError, match="attribute_type_errors must be one of"):
        check_attribute_columns({}, type_errors="ignore")


@pytest.mark.parametrize(("kind", "fits", "misfits"), [
    ("text", ["x", ""], [1, True, 1.5, [], {}]),
    ("integer", [0, -7, 10**18 - 1], [1.0, True, "1", 10**18, 2.5]),
    ("number", [1, 2.5, -0.0], [True, "1.5", [], {}]),
    ("boolean", [True, False], [0, 1, "true"]),
    ("timestamp", ["2024-03-01T09:30:00Z", "2024-03-01 09:30:00.123456+02:00", "2024-03-01T09:30:00"],
     ["2024-02-30T00:00:00Z", "2024-03-01", "yesterday", 1700000000, "2024-03-01T09:30Z"]),
    ("json", [1, "x", [], {"a": None}, False], []),
])
def test_the_python_check_of_each_type(kind: str, fits: list[Any], misfits: list[Any]) -> None:
    assert kind in ATTRIBUTE_TYPES
    column = check_attribute_columns({"c": {"path": "attributes.c", "type": kind}}).columns[0]
    assert [v for v in fits if column.wrong_type(v)] == []
    assert [v for v in misfits if not column.wrong_type(v)] == []
    assert not column.wrong_type(None)  # missing or JSON null: NULL, never an error


@pytest.mark.parametrize(("rules", "spec", "says"), [
    ({"attributes.salary": "drop"}, {"salary": "attributes.salary"}, "policy drops"),
    ({"attributes.employment": "drop"}, {"fte": {"path": "attributes.employment.fte", "type": "number"}},
     "policy drops"),
    ({"attributes.badge": "hash"}, {"badge": {"path": "attributes.badge", "type": "integer"}}, "must be 'text'"),
])
def test_a_personal_data_policy_refuses_promoting_what_it_drops_or_hashes_to_another_type(
        rules: dict[str, str], spec: dict[str, Any], says: str) -> None:
    with pytest.raises(BosConfigurationError, match=says):
        check_attribute_columns(spec).check_policy(rules)


def test_a_hashed_path_may_be_promoted_as_text() -> None:
    check_attribute_columns({"badge": "attributes.badge"}).check_policy({"attributes.badge": "hash"})
