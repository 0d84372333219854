"""BosCompletenessSensor(min_coverage=...): a complete run whose watched column went (nearly) empty is
treated like a partial read: it fails, alerts (notifiers and callback) or skips as ``on_partial`` says,
and a threshold the run's coverage cannot answer never passes silently."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from unittest import mock

import pytest

from airflow_provider_bos.airflow_compat import AirflowFailException, AirflowSkipException
from airflow_provider_bos.exceptions import BosConfigurationError
from airflow_provider_bos.sensors.completeness import BosCompletenessSensor
from airflow_provider_bos.sensors.verdict import LOW_COVERAGE, NO_COVERAGE, PARTIAL, PASS, TOO_FEW, judge


def audit_row(*, records: int = 20, email: int = 20, status: str = "complete", **extra: Any) -> dict[str, Any]:
    row = {"run_id": "r1", "tool_name": "people.search", "context_handle": "ctx", "status": status,
           "result_count": records, "finished_at": datetime.now(UTC), "source_errors": [],
           "coverage": {"records": records, "columns": {"display_name": records, "email": email, "phone": 0}}}
    row.update(extra)
    return row


def sensor(**kwargs: Any) -> BosCompletenessSensor:
    return BosCompletenessSensor(task_id="check", destination_conn_id="w", sync_task_id="sync", **kwargs)


def test_a_column_below_its_threshold_is_judged_like_a_partial_read() -> None:
    verdict = judge(audit_row(email=1), min_coverage={"email": 0.9})
    assert verdict.outcome == LOW_COVERAGE
    assert "email had a value in 1 of 20 record(s) (5.0%), below min_coverage 90%" in verdict.message
    assert verdict.low_coverage == [("email", 0.05, 0.9)]


def test_columns_at_or_above_their_thresholds_pass() -> None:
    assert judge(audit_row(email=18), min_coverage={"email": 0.9, "display_name": 1}).outcome == PASS
    assert judge(audit_row(email=1)).outcome == PASS  # no min_coverage: not checked


def test_every_column_below_its_threshold_is_named() -> None:
    verdict = judge(audit_row(email=3), min_coverage={"email": 0.5, "phone": 0.1, "display_name": 0.5})
    assert [c for c, _, _ in verdict.low_coverage] == ["email", "phone"]
    assert "phone had a value in 0 of 20" in verdict.message and "display_name" not in verdict.message


def test_the_message_holds_counts_never_values() -> None:
    verdict = judge(audit_row(email=1, error_message="p1@example.com"), min_coverage={"email": 0.9})
    assert "@" not in verdict.message


@pytest.mark.parametrize(("row", "says"), [
    (audit_row(coverage=None), "records no coverage"),  # an audit row written before coverage
    (audit_row(), "counted no coverage of department"),  # a column the run did not count
])
def test_a_threshold_the_run_cannot_answer_fails(row: dict[str, Any], says: str) -> None:
    verdict = judge(row, min_coverage={"department": 0.9, "email": 0.5})
    assert verdict.outcome == NO_COVERAGE and says in verdict.message
    with pytest.raises(AirflowFailException, match=says):  # whatever on_partial says
        sensor(on_partial="alert", min_coverage={"department": 0.9})._act({}, verdict)


def test_a_run_of_no_records_is_left_to_min_records() -> None:
    empty = audit_row(records=0, email=0)
    assert judge(empty, min_coverage={"email": 0.9}).outcome == TOO_FEW
    assert judge(empty, min_records=0, min_coverage={"email": 0.9}).outcome == PASS


def test_a_partial_run_stays_partial() -> None:
    assert judge(audit_row(status="partial", email=0), min_coverage={"email": 0.9}).outcome == PARTIAL


@pytest.mark.parametrize("value", [
    {}, ["email"], "email", {"email": 0}, {"email": 1.5}, {"email": -0.1}, {"email": True}, {"email": "0.9"},
    {"e-mail": 0.9}, {"": 0.5}, {1: 0.5},
])
def test_the_sensor_refuses_a_wrong_min_coverage(value: Any) -> None:
    with pytest.raises(BosConfigurationError, match="min_coverage"):
        sensor(min_coverage=value)


def test_shares_up_to_one_are_accepted() -> None:
    assert sensor(min_coverage={"email": 1, "department": 0.25}).min_coverage == {"email": 1.0, "department": 0.25}


def test_on_partial_decides_what_low_coverage_does() -> None:
    verdict = judge(audit_row(email=1), min_coverage={"email": 0.9})
    with pytest.raises(AirflowFailException, match="email had a value in 1 of 20"):
        sensor(min_coverage={"email": 0.9})._act({}, verdict)
    with pytest.raises(AirflowSkipException):
        sensor(on_partial="skip", min_coverage={"email": 0.9})._act({}, verdict)
    notifier, callback = mock.Mock(), mock.Mock()
    context: dict[str, Any] = {}
    sensor(on_partial="alert", notifiers=[notifier], on_partial_callback=callback,
           min_coverage={"email": 0.9})._act(context, verdict)  # type: ignore[arg-type]
    notifier.assert_called_once_with(context)
    callback.assert_called_once_with(context, verdict)
    assert context["bos_verdict"] is verdict
