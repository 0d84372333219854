"""End to end: a server that states another context in a ``bos_execute`` result cannot relabel the run.

The operator's full sync asks for the default context; on day 2 the reference server answers the
read naming another authorized context. The run stays filed under the context it asked for (the
audit row and the full-mode scope key), is ``partial`` with a message naming both handles, and
retires and supersedes nothing.
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from afhelpers import audit_rows, task_states

from airflow_provider_bos.testing.federation import expected_final
from airflow_provider_bos.testing.scenario import FaultSpec, load_scenario

pytestmark = [pytest.mark.airflow, pytest.mark.parametrize("warehouse_url", ["sqlite"], indirect=True)]

SCENARIO = "people_over_time"
ASKED = "ctx_acme_people_prod"  # the scenario's default context, which the operator reads
STATED = "ctx_acme_itsm_sandbox"


def current(env: dict[str, Any]) -> set[str]:
    with env["engine"].connect() as conn:
        return set(conn.execute(sa.text(
            f"SELECT record_ref FROM {env['table']} WHERE _bos_deleted_at IS NULL")).scalars())


def test_a_result_naming_another_context_is_partial_and_retires_nothing(bos_airflow_audit, run_dag) -> None:
    env = bos_airflow_audit
    full = {"BOS_TEST_SYNC_MODE": "full"}
    env["server"].set_scenario(load_scenario(SCENARIO), day=1)
    first = run_dag("bos_test_days", "bos_test_days.py", **full)
    assert task_states(first) == {"sync": "success", "check": "success"}
    day_one = current(env)
    assert day_one == expected_final(SCENARIO, 1).refs

    relabelling = load_scenario(SCENARIO).model_copy(update={"faults": FaultSpec(final_context_handle=STATED)})
    env["server"].set_scenario(relabelling, day=2)  # day 2 has leavers and merges a full read would retire
    second = run_dag("bos_test_days", "bos_test_days.py", **full)
    assert task_states(second)["check"] == "failed"  # partial: the sensor stops it

    assert day_one <= current(env)  # the records land; none of day 1 is retired or superseded
    first_row, second_row = audit_rows(env["engine"], env["table"], env["audit"])
    assert (second_row["status"], second_row["retired"], second_row["superseded"]) == ("partial", 0, 0)
    assert second_row["context_handle"] == first_row["context_handle"] == ASKED
    assert second_row["scope"] == first_row["scope"]
    message = second_row["error_message"]
    assert f"states context '{STATED}'" in message and f"asked for '{ASKED}'" in message
    assert "Nothing was retired" in second_row["notes"]  # information, apart from why the run is partial
