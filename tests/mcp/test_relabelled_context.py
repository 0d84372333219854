"""A ``bos_execute`` result that states another context than the one requested contradicts the read.

The reference server (fault ``final_context_handle``) answers the read naming another authorized
context. The result is kept, but its contradiction names both handles (printable, cut), so
:func:`~airflow_provider_bos.sync.run_status` makes the run ``partial``, and the audit label stays
the requested handle (:func:`~airflow_provider_bos.sync.audit_fields`).
"""

from __future__ import annotations

from typing import Any

import pytest
from mcphelpers import Bearer

from airflow_provider_bos.mcp import McpSession
from airflow_provider_bos.sync import audit_fields, run_status
from airflow_provider_bos.testing.scenario import FaultSpec, load_scenario

ASKED = "ctx_acme_people_prod"


def read(server: Any, stated: str, *, stream_records: bool) -> Any:
    server.set_scenario(load_scenario("complete").model_copy(update={
        "faults": FaultSpec(final_context_handle=stated)}))
    session = McpSession(server.mcp_url, auth=Bearer(server.mint_grant()["access_token"]))
    with session:
        result = session.federated_read("people.search", {}, via="execute", context_handle=ASKED,
                                        stream_records=stream_records)
        if stream_records:
            with result:
                assert sum(1 for _ in result.records) > 0
        return result


class _Run:
    run_id = "r-1"
    context_handle: str | None = ASKED  # noted by on_context before the call


@pytest.mark.parametrize("stream_records", [True, False])
def test_a_result_naming_another_context_is_a_contradiction(bos_server: Any, stream_records: bool) -> None:
    result = read(bos_server, "ctx_acme_itsm_sandbox", stream_records=stream_records)
    assert result.context.context_handle == "ctx_acme_itsm_sandbox"  # what the server said, kept
    [contradiction] = result.contradictions
    assert "states context 'ctx_acme_itsm_sandbox'" in contradiction and f"asked for '{ASKED}'" in contradiction
    assert run_status(result) == "partial"
    run = _Run()
    fields = audit_fields(run, result)
    assert run.context_handle == ASKED  # the run is not relabelled
    assert fields["status"] == "partial" and contradiction in fields["error_message"]


def test_a_hostile_handle_is_shown_printable_and_cut(bos_server: Any) -> None:
    hostile = "ctx\nERROR forged line\x1b[2J" + "x" * 500
    [contradiction] = read(bos_server, hostile, stream_records=True).contradictions
    assert "\n" not in contradiction and "\x1b" not in contradiction
    assert "x" * 200 not in contradiction and len(contradiction) < 400


def test_the_requested_context_stated_back_is_no_contradiction(bos_server: Any) -> None:
    result = read(bos_server, ASKED, stream_records=True)
    assert result.contradictions == [] and run_status(result) == "complete"
