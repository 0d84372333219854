"""A server that needs a person or a model in the loop fails the read at once.

Server-to-client requests on the response stream (2025-11-25: elicitation, sampling, roots) and
``resultType: "input_required"`` (2026-07-28) cannot be answered by an unattended task: the read
must not log the request and wait, until its deadline, for a final that never comes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from test_session_faults import FakeBos, final_result, make, notification, ok, read, record, sse, streamed

from airflow_provider_bos.exceptions import BosUnsupportedServerRequestError


def waits_after(*messages: dict) -> Iterator[bytes]:
    """The messages, then a server that waits (keepalives only) for an answer that never comes."""
    yield sse(*messages)
    for _ in range(200):
        time.sleep(0.05)
        yield b": keepalive\n\n"
    raise AssertionError("the client kept waiting after the server's request")


@pytest.mark.parametrize("method", ["elicitation/create", "sampling/createMessage", "roots/list"])
@pytest.mark.parametrize("stream_records", [False, True], ids=["whole", "records"])
def test_a_server_request_on_the_stream_fails_at_once_naming_it(method: str, stream_records: bool) -> None:
    fake = FakeBos()
    fake.queue("tools/call", streamed(lambda rid: waits_after(
        notification(rid, 1, 1, records=[record("bos:person:crm-eu:1")]),
        {"jsonrpc": "2.0", "id": 7, "method": method, "params": {"message": "Which tenant?"}},
    )))
    started = time.monotonic()
    with make(fake) as session, pytest.raises(BosUnsupportedServerRequestError) as caught:
        read(session, deadline_s=30, stream_records=stream_records)
    assert time.monotonic() - started < 5  # at once, not at the deadline
    assert caught.value.request == method
    assert method in str(caught.value) and "cannot answer interactive requests" in str(caught.value)


def test_a_ping_from_the_server_does_not_end_the_read() -> None:
    fake = FakeBos()
    fake.queue("tools/call", streamed(lambda rid: sse(
        {"jsonrpc": "2.0", "id": 5, "method": "ping"},
        {"jsonrpc": "2.0", "id": rid, "result": final_result([record("bos:person:9")])})))
    with make(fake) as session:
        assert [r.record_ref for r in read(session).records] == ["bos:person:9"]


INPUT_REQUIRED = {
    "resultType": "input_required",
    "inputRequests": {"tenant": {"method": "elicitation/create", "params": {"message": "Which tenant?"}}},
    "requestState": "opaque",
}


@pytest.mark.parametrize("stream_records", [False, True], ids=["whole", "records"])
@pytest.mark.parametrize("answer", ["json", "sse"])
def test_input_required_fails_at_once_naming_what_is_asked(answer: str, stream_records: bool) -> None:
    fake = FakeBos(stateless=True)
    if answer == "json":
        fake.queue("tools/call", lambda body: ok(body["id"], INPUT_REQUIRED))
    else:
        fake.queue("tools/call", streamed(lambda rid: sse({"jsonrpc": "2.0", "id": rid, "result": INPUT_REQUIRED})))
    with make(fake, era="2026-07-28") as session, pytest.raises(BosUnsupportedServerRequestError) as caught:
        result = read(session, stream_records=stream_records)
        list(result.records)
        result.completeness  # noqa: B018 - the end-of-frame attributes parse the result
    message = str(caught.value)
    assert caught.value.request == "input_required"
    assert "input_required" in message and "tenant (elicitation/create)" in message


def test_input_required_on_a_plain_request_is_the_same_typed_error() -> None:
    fake = FakeBos(stateless=True)
    fake.queue("tools/call", lambda body: ok(body["id"], INPUT_REQUIRED))
    with make(fake, era="2026-07-28") as session, pytest.raises(BosUnsupportedServerRequestError):
        session.call_tool("search_people", {})
