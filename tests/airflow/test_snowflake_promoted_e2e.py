"""Promoted attributes end to end on Snowflake: the suite of test_promoted_attributes_e2e.py, and the
check on a promoted column's coverage of test_coverage_e2e.py, their destination a Connection of type
``snowflake`` on the fakesnow server, through SnowflakeHook."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "warehouse"))
import test_coverage_e2e as coverage
import test_promoted_attributes_e2e as suite
from snowflake_destination import *  # noqa: F403 - the fixtures that make Snowflake the destination
from test_promoted_attributes_e2e import promoting  # noqa: F401 - the fixture

from airflow_provider_bos.warehouse.tables.schema import companion_table_name

pytestmark = [pytest.mark.airflow, pytest.mark.snowflake]


def test_promoting_attributes_of_a_synced_table_fills_them_from_what_is_stored(promoting, run_dag) -> None:  # noqa: F811
    suite.test_promoting_attributes_of_a_synced_table_fills_them_from_what_is_stored(promoting, run_dag)


def test_a_promoted_value_of_the_wrong_type_fails_the_run_or_is_stored_as_null(promoting, run_dag) -> None:  # noqa: F811
    suite.test_a_promoted_value_of_the_wrong_type_fails_the_run_or_is_stored_as_null(promoting, run_dag)


def test_a_read_value_of_the_wrong_type_is_quarantined_and_the_check_fails(promoting, run_dag) -> None:  # noqa: F811
    suite.test_a_read_value_of_the_wrong_type_is_quarantined_and_the_check_fails(promoting, run_dag)


def test_a_stored_value_of_the_wrong_type_fails_the_first_fill_and_leaves_the_column_unfilled(
        promoting, run_dag) -> None:  # noqa: F811
    suite.test_a_stored_value_of_the_wrong_type_fails_the_first_fill_and_leaves_the_column_unfilled(promoting, run_dag)


def test_a_stored_value_of_the_wrong_type_is_null_and_the_run_partial_under_quarantine(
        promoting, run_dag) -> None:  # noqa: F811
    suite.test_a_stored_value_of_the_wrong_type_is_null_and_the_run_partial_under_quarantine(promoting, run_dag)


def test_a_stored_value_of_the_wrong_type_is_null_and_counted_with_type_errors_null(
        promoting, run_dag) -> None:  # noqa: F811
    suite.test_a_stored_value_of_the_wrong_type_is_null_and_counted_with_type_errors_null(promoting, run_dag)


def test_a_promoted_attribute_that_goes_empty_fails_the_check(bos_airflow, run_dag) -> None:
    try:
        coverage.test_a_promoted_attribute_that_goes_empty_fails_the_check(bos_airflow, run_dag)
    finally:
        with bos_airflow["engine"].begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {companion_table_name(bos_airflow['table'], 'columns')}")
