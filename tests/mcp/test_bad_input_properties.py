"""Bad input, property-based: whatever BOS (or a proxy) sends, the client answers with valid results
or a typed ``BosError`` — never another exception, a hang, or unbounded memory.

Covered: the notification validator (``SourceResultsTracker.observe``: arbitrary JSON-ish params,
arbitrary sequences, and each contract rule with its own ``rule``), the final-result parser
(``parse_final_response`` / ``FinalResultParser.parse_data``), the incremental final-frame scanner
(``mcp/final_frame.py``, arbitrary bytes in arbitrary chunks), the SSE parser's event-size bound,
and the whole read path (``McpSession.federated_read`` over ``httpx.MockTransport`` fed arbitrary
event streams). Profiles: ``bos-ci`` (default) and ``bos-long`` (``BOS_HYPOTHESIS_PROFILE``), from
tests/mcp/conftest.py.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from airflow_provider_bos.exceptions import (
    BosError,
    BosEventTooLarge,
    BosResultError,
    BosStreamValidationError,
)
from airflow_provider_bos.mcp import McpSession, RetryPolicy
from airflow_provider_bos.mcp.final_result import FinalResultParser, parse_final_response
from airflow_provider_bos.mcp.source_results import SourceResultsTracker
from airflow_provider_bos.mcp.sse import SseParser
from airflow_provider_bos.models import SOURCE_ERROR_CODES

PROFILE = settings.get_profile(os.environ.get("BOS_HYPOTHESIS_PROFILE", "bos-ci"))
# The end-to-end property builds a session per example: a tenth of the examples is plenty.
SESSION_PROFILE = settings(PROFILE, max_examples=max(20, PROFILE.max_examples // 10))

RULES = {"shape", "request-id", "sequence", "status", "source", "after-terminal", "page-index",
         "terminal-page-index", "error-code", "error-without-status", "error-records", "records"}
RID = "req-1"
SOURCES = [{"source_type": "crm", "source_identity": "crm-eu"}, {"source_type": "hr", "source_identity": "hr-main"}]


def record(ref: str, observed_at: str = "2026-10-08T12:00:00Z") -> dict[str, Any]:
    return {"record_ref": ref, "display_name": "Zoë Ünal", "email": None, "phone": None, "lifecycle": None,
            "identity_match": None, "attributes": {"nested": {"a": [1, "x"]}},
            "sources": [{**SOURCES[0], "external_id": ref, "record_type": "person", "observed_at": observed_at,
                         "capabilities": ["read"], "version": None}]}


# --- JSON-ish values --------------------------------------------------------------------------------

json_scalars = (st.none() | st.booleans() | st.integers(-2**63, 2**63) | st.floats(allow_nan=False)
                | st.text(max_size=20))
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=20,
)


def valid_stream(pages: list[int], errors: list[str | None]) -> list[dict[str, Any]]:
    """A contract-valid notification sequence: per source its pages then one terminal status."""
    out: list[dict[str, Any]] = []
    seq = 0
    for source, n_pages, error in zip(SOURCES, pages, errors, strict=False):
        for page in range(1, n_pages + 1):
            seq += 1
            out.append({"requestId": RID, "sequence": seq, "pageIndex": page, "source": dict(source),
                        "records": [record(f"bos:person:{source['source_identity']}:{page}")], "status": "page"})
        seq += 1
        terminal: dict[str, Any] = {"requestId": RID, "sequence": seq, "pageIndex": n_pages, "source": dict(source),
                                    "records": [], "status": "error" if error else "complete"}
        if error:
            terminal["error"] = {"code": error}
        out.append(terminal)
    return out


valid_streams = st.builds(
    valid_stream,
    st.lists(st.integers(0, 3), min_size=1, max_size=2),
    st.lists(st.none() | st.sampled_from(sorted(SOURCE_ERROR_CODES)), min_size=2, max_size=2),
)

_KEYS = ["requestId", "sequence", "pageIndex", "source", "records", "status", "error"]


@st.composite
def mutated(draw: st.DrawFn, note: dict[str, Any]) -> dict[str, Any]:
    note = copy.deepcopy(note)
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(_KEYS))
        action = draw(st.sampled_from(["drop", "replace"]))
        if action == "drop":
            note.pop(key, None)
        else:
            note[key] = draw(json_values | st.sampled_from(["page", "complete", "error", RID, 0, -1, 1.5]))
    return note


def _observe(tracker: SourceResultsTracker, params: Any) -> bool:
    """observe(); True if accepted. A rejection must be a typed, rule-named error that changes nothing."""
    before = (tracker.summary(), tracker.notifications, tracker.provisional_records, tracker.pages,
              tracker.last_sequence)
    try:
        progress = tracker.observe(params)
    except BosStreamValidationError as exc:
        assert exc.rule in RULES, exc.rule
        after = (tracker.summary(), tracker.notifications, tracker.provisional_records, tracker.pages,
                 tracker.last_sequence)
        assert after == before  # a rejected notification leaves no trace
        return False
    assert progress.sequence == params["sequence"]
    return True


# --- the notification validator ------------------------------------------------------------------------


@PROFILE
@given(json_values)
def test_any_params_are_accepted_or_rejected_with_a_rule(params: Any) -> None:
    _observe(SourceResultsTracker(RID), params)


@PROFILE
@given(valid_streams, st.data())
def test_any_sequence_of_valid_and_mutated_notifications(stream: list[dict[str, Any]], data: st.DataObject) -> None:
    tracker = SourceResultsTracker(RID)
    for note in stream:
        if data.draw(st.booleans()):
            note = data.draw(mutated(note))  # noqa: PLW2901 - the mutated note replaces the valid one
        _observe(tracker, note)
    # Invariants of whatever was accepted.
    assert tracker.provisional_records == sum(s.records for s in tracker.sources.values())
    assert tracker.pages == sum(s.pages for s in tracker.sources.values())
    for stats in tracker.sources.values():
        assert stats.status in ("running", "complete", "error")
        assert (stats.error_code is not None) == (stats.status == "error")
        assert stats.last_page_index == stats.pages


@PROFILE
@given(valid_streams)
def test_a_valid_stream_is_accepted_whole(stream: list[dict[str, Any]]) -> None:
    tracker = SourceResultsTracker(RID)
    assert all(_observe(tracker, note) for note in stream)
    assert not tracker.running_sources


def _rejected(tracker: SourceResultsTracker, params: dict[str, Any]) -> str:
    with pytest.raises(BosStreamValidationError) as excinfo:
        tracker.observe(params)
    return str(excinfo.value.rule)


@PROFILE
@given(valid_streams, json_values)
def test_wrong_request_id_is_rejected(stream: list[dict[str, Any]], other: Any) -> None:
    assume(not (type(other) is str and other == RID))
    assert _rejected(SourceResultsTracker(RID), {**stream[0], "requestId": other}) == "request-id"
    # JSON-RPC ids are typed: the integer 1 is not the string "1".
    assert _rejected(SourceResultsTracker("1"), {**stream[0], "requestId": 1}) == "request-id"


@PROFILE
@given(valid_streams, st.data())
def test_sequence_going_backwards_or_repeating_is_rejected(stream: list[dict[str, Any]], data: st.DataObject) -> None:
    assume(len(stream) >= 2)
    tracker = SourceResultsTracker(RID)
    cut = data.draw(st.integers(1, len(stream) - 1))
    for note in stream[:cut]:
        tracker.observe(note)
    stale = data.draw(st.integers(-5, tracker.last_sequence or 0))
    assert _rejected(tracker, {**stream[cut], "sequence": stale}) == "sequence"


@PROFILE
@given(st.sampled_from(["complete", "error"]), st.sampled_from(["page", "complete", "error"]))
def test_anything_after_a_terminal_status_is_rejected(terminal: str, then: str) -> None:
    tracker = SourceResultsTracker(RID)
    src = SOURCES[0]
    tracker.observe({"requestId": RID, "sequence": 1, "pageIndex": 1, "source": src, "records": [record("r1")],
                     "status": "page"})
    end: dict[str, Any] = {"requestId": RID, "sequence": 2, "pageIndex": 1, "source": src, "records": [],
                           "status": terminal}
    if terminal == "error":
        end["error"] = {"code": "source_timeout"}
    tracker.observe(end)
    late: dict[str, Any] = {"requestId": RID, "sequence": 3, "pageIndex": 2 if then == "page" else 1,
                            "source": src, "records": [], "status": then}
    if then == "error":
        late["error"] = {"code": "rate_limited"}
    assert _rejected(tracker, late) == "after-terminal"


@PROFILE
@given(json_values)
def test_unknown_status_is_rejected(status: Any) -> None:
    assume(status not in ("page", "complete", "error"))
    note = {"requestId": RID, "sequence": 1, "pageIndex": 1, "source": SOURCES[0], "records": [], "status": status}
    assert _rejected(SourceResultsTracker(RID), note) == "status"


@PROFILE
@given(json_values)
def test_unknown_error_code_is_rejected(code: Any) -> None:
    assume(not (isinstance(code, str) and code in SOURCE_ERROR_CODES))
    note = {"requestId": RID, "sequence": 1, "pageIndex": 0, "source": SOURCES[0], "records": [], "status": "error",
            "error": {"code": code}}
    assert _rejected(SourceResultsTracker(RID), note) == "error-code"


@pytest.mark.parametrize("code", [[], {"a": 1}, ["source_timeout"]])
def test_an_unhashable_error_code_is_a_typed_rejection(code: Any) -> None:
    """Regression (found by hypothesis): a list/object code raised TypeError from a frozenset lookup."""
    note = {"requestId": RID, "sequence": 1, "pageIndex": 0, "source": SOURCES[0], "records": [], "status": "error",
            "error": {"code": code}}
    assert _rejected(SourceResultsTracker(RID), note) == "error-code"


# --- the final-result parser ---------------------------------------------------------------------------


def final_message(records: list[dict[str, Any]], *, style: str, rid: Any = RID,
                  completeness: str = "complete") -> dict[str, Any]:
    operation = {"result": records, "metadata": {"completeness": completeness, "result_count": len(records),
                                                 "observed_at": "2026-10-08T12:00:00Z"}}
    context = {"context_handle": "ctx", "organization_name": "O", "application_name": "A",
               "installation_name": "I", "role_label": "R", "is_default": True}
    structured = operation if style == "direct" else {"contract_version": "bos-identity-mcp/v2", "context": context,
                                                      "result": operation}
    result: dict[str, Any] = {"content": [{"type": "text", "text": json.dumps(structured)}],
                              "structuredContent": structured, "isError": completeness != "complete"}
    if style == "execute":
        result["_meta"] = {"bos/context": context}
    return {"jsonrpc": "2.0", "id": rid, "result": result}


styles = st.sampled_from(["direct", "execute"])
record_lists = st.lists(st.integers(0, 10**6).map(lambda i: record(f"bos:person:{i}")), max_size=5)


@st.composite
def mutated_message(draw: st.DrawFn) -> tuple[str, Any]:
    """A valid final message with random values replaced somewhere in its tree."""
    style = draw(styles)
    message: Any = final_message(draw(record_lists), style=style)
    for _ in range(draw(st.integers(0, 4))):
        node, path = message, []
        while isinstance(node, (dict, list)) and node and draw(st.booleans()):
            key = draw(st.sampled_from(sorted(node) if isinstance(node, dict) else list(range(len(node)))))
            path.append(key)
            node = node[key]
        replacement = draw(json_values)
        if not path:
            message = replacement
        else:
            parent = message
            for key in path[:-1]:
                parent = parent[key]
            if draw(st.booleans()) and isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = replacement
    return style, message


def _consume(result: Any) -> int:
    """Records are consumed once; streaming versions may fail late, with a BosError."""
    return sum(1 for _ in result.records)


@PROFILE
@given(mutated_message())
def test_any_final_message_parses_or_fails_typed(case: tuple[str, Any]) -> None:
    style, message = case
    try:
        result = parse_final_response(message, request_id=RID, tool_style=style)  # type: ignore[arg-type]
        count = _consume(result)
    except BosError:
        return
    assert result.completeness in ("complete", "partial") or isinstance(result.completeness, str)
    assert count >= 0


@PROFILE
@given(styles, st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_any_final_bytes_parse_or_fail_typed(style: str, data: bytes) -> None:
    try:
        _consume(FinalResultParser(RID, tool_style=style).parse_data(data))  # type: ignore[arg-type]
    except BosError:
        pass


@PROFILE
@given(styles, record_lists, json_values)
def test_a_final_response_to_another_id_is_rejected(style: str, records: list[dict[str, Any]], other: Any) -> None:
    assume(not (type(other) is str and other == RID))
    with pytest.raises(BosError):
        parse_final_response(final_message(records, style=style, rid=other), request_id=RID,
                             tool_style=style)  # type: ignore[arg-type]


@PROFILE
@given(styles, record_lists, st.integers(0, 4))
def test_a_record_without_record_ref_is_rejected(style: str, records: list[dict[str, Any]], where: int) -> None:
    broken = record("x")
    del broken["record_ref"]
    records = [*records[:where], broken, *records[where:]]
    with pytest.raises(BosError, match="record_ref"):
        _consume(parse_final_response(final_message(records, style=style), request_id=RID,
                                      tool_style=style))  # type: ignore[arg-type]


def _with_source_error(message: dict[str, Any], style: str, code: Any) -> dict[str, Any]:
    structured = message["result"]["structuredContent"]
    metadata = (structured if style == "direct" else structured["result"])["metadata"]
    metadata["source_errors"] = [{"source": SOURCES[1], "error": {"code": code}}]
    message["result"]["content"][0]["text"] = json.dumps(structured)
    return message


@PROFILE
@given(styles, record_lists, json_values)
def test_a_final_source_error_code_outside_the_contract_is_rejected(style: str, records: list[dict[str, Any]],
                                                                    code: Any) -> None:
    """The final's codes are the stream's five (contract: "one of source_timeout, ..."), as a page's are."""
    message = _with_source_error(final_message(records, style=style, completeness="partial"), style, code)
    if isinstance(code, str) and code in SOURCE_ERROR_CODES:
        result = parse_final_response(message, request_id=RID, tool_style=style)  # type: ignore[arg-type]
        assert [e.as_stored()["error"] for e in result.source_errors] == [{"code": code}]
        return
    with pytest.raises(BosResultError, match="source_errors"):
        parse_final_response(message, request_id=RID, tool_style=style)  # type: ignore[arg-type]


@pytest.mark.parametrize("style", ["direct", "execute"])
def test_a_rejected_final_source_error_code_is_not_quoted(style: str) -> None:
    """A code that is not one of the contract's may be anything a server wrote, a person's address too."""
    code = "locked out: alice@example.com"
    message = _with_source_error(final_message([record("bos:person:1")], style=style, completeness="partial"),
                                 style, code)
    with pytest.raises(BosResultError) as caught:
        parse_final_response(message, request_id=RID, tool_style=style)  # type: ignore[arg-type]
    assert "alice@example.com" not in str(caught.value)
    assert all(known in str(caught.value) for known in SOURCE_ERROR_CODES)


def test_a_rejected_page_error_code_is_not_quoted_unless_it_looks_like_a_code() -> None:
    def rejection(code: str) -> str:
        note = {"requestId": RID, "sequence": 1, "pageIndex": 0, "source": SOURCES[0], "records": [],
                "status": "error", "error": {"code": code}}
        with pytest.raises(BosStreamValidationError) as caught:
            SourceResultsTracker(RID).observe(note)
        return str(caught.value)

    assert "alice@example.com" not in rejection("locked out: alice@example.com")
    assert "'source_gone'" in rejection("source_gone")  # a code-shaped value is named, to diagnose a new code


# --- the incremental final-frame scanner (PERF helper's mcp/final_frame.py) ------------------------------

try:
    from airflow_provider_bos.mcp import final_frame
except ImportError:  # the scanner is new; the other properties must still run without it
    final_frame = None  # type: ignore[assignment]
needs_scanner = pytest.mark.skipif(final_frame is None, reason="airflow_provider_bos.mcp.final_frame is not there")


def _chunks(data: bytes, cuts: list[int]) -> Iterator[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    for a, b in itertools.pairwise(points):
        yield data[a:b]


def _scan(style: str, data: bytes, cuts: list[int], **kwargs: Any) -> tuple[list[Any], dict[str, Any]]:
    scanner = final_frame.FinalFrameScanner(tool_style=style, **kwargs)
    records: list[Any] = []
    for chunk in _chunks(data, cuts):
        records += scanner.feed(chunk)
    records += scanner.flush()
    return records, scanner.finish()


def _as_dict(rec: Any) -> Any:
    for attr in ("raw", "data", "value"):
        if isinstance(getattr(rec, attr, None), dict):
            return getattr(rec, attr)
    return rec if isinstance(rec, dict) else getattr(rec, "__dict__", rec)


def _records_at(message: Any, style: str) -> list[Any]:
    """The record array of a decoded final message ([] where there is none)."""
    path = ("result", "structuredContent", "result") + (("result",) if style == "execute" else ())
    node = message
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return []
        node = node[key]
    return node if isinstance(node, list) else []


def _assert_yields_what_the_json_holds(style: str, data: bytes, got: list[Any], skeleton: dict[str, Any]) -> None:
    """A frame the scanner accepted, whose bytes are JSON: its records are exactly the JSON's record
    array, in order, and its skeleton gives the same result as the whole message parsed at once.

    (Bytes the scanner accepted need not be JSON: it skips content text without validating it.)
    """
    try:
        message = orjson.loads(data)
    except ValueError:
        return
    assert [_as_dict(r) for r in got] == _records_at(message, style)
    try:
        whole = parse_final_response(message, request_id=RID, tool_style=style)  # type: ignore[arg-type]
        count = _consume(whole)
    except BosError:
        return
    assert count == len(got)
    part = FinalResultParser(RID, tool_style=style).parse_message(skeleton, record_count=len(got))  # type: ignore[arg-type]
    assert (part.is_error, part.completeness, part.metadata, part.context, part.warnings) == (
        whole.is_error, whole.completeness, whole.metadata, whole.context, whole.warnings)


@needs_scanner
@PROFILE
@given(styles, record_lists, st.lists(st.integers(0, 10**6), max_size=12), st.booleans())
def test_scanner_yields_exactly_the_records_whatever_the_chunking(style: str, records: list[dict[str, Any]],
                                                                  cuts: list[int], pretty: bool) -> None:
    message = final_message(records, style=style)
    data = json.dumps(message, indent=1 if pretty else None, ensure_ascii=pretty).encode()
    got, skeleton = _scan(style, data, cuts)
    assert [_as_dict(r) for r in got] == records
    assert skeleton.get("id") == RID
    final = FinalResultParser(RID, tool_style=style).parse_message(skeleton, record_count=len(got))  # type: ignore[arg-type]
    assert (final.completeness, final.result_count, final.is_error, final.warnings) == ("complete", len(records),
                                                                                         False, [])
    _assert_yields_what_the_json_holds(style, data, got, skeleton)


@needs_scanner
@PROFILE
@given(styles, st.binary(max_size=400), st.lists(st.integers(0, 10**6), max_size=8))
def test_scanner_on_arbitrary_bytes_yields_records_or_a_typed_error(style: str, data: bytes, cuts: list[int]) -> None:
    try:
        got, skeleton = _scan(style, data, cuts)
    except BosError:
        return
    _assert_yields_what_the_json_holds(style, data, got, skeleton)


@needs_scanner
@PROFILE
@given(styles, record_lists, st.data())
def test_scanner_on_a_damaged_frame_yields_records_or_a_typed_error(style: str, records: list[dict[str, Any]],
                                                                    data: st.DataObject) -> None:
    frame = json.dumps(final_message(records, style=style)).encode()
    pos = data.draw(st.integers(0, len(frame)))
    damage = data.draw(st.sampled_from(["truncate", "insert", "delete", "flip"]))
    if damage == "truncate":
        frame = frame[:pos]
    elif damage == "insert":
        frame = frame[:pos] + data.draw(st.binary(min_size=1, max_size=4)) + frame[pos:]
    elif damage == "delete":
        frame = frame[:pos] + frame[pos + data.draw(st.integers(1, 8)):]
    elif pos < len(frame):
        frame = frame[:pos] + bytes([frame[pos] ^ data.draw(st.integers(1, 255))]) + frame[pos + 1:]
    try:
        got, skeleton = _scan(style, frame, data.draw(st.lists(st.integers(0, 10**6), max_size=6)))
    except BosError:
        return
    _assert_yields_what_the_json_holds(style, frame, got, skeleton)


@needs_scanner
@PROFILE
@given(styles, st.integers(0, 4), st.integers(1, 512), st.sampled_from(["attributes", "text"]))
def test_scanner_bounds_what_it_buffers(style: str, n: int, chunk_size: int, where: str) -> None:
    """A value that keeps growing across network chunks past ``max_value_bytes`` is refused (typed)
    instead of being buffered without bound; memory stays ~ limit + one chunk."""
    records = [record(f"bos:person:{i}") for i in range(n)]
    message = final_message(records, style=style)
    if where == "attributes":  # one oversized record
        big = record("bos:person:big")
        big["attributes"] = {"blob": "x" * 6000}
        message = final_message([*records, big], style=style)
    else:  # an oversized captured value outside the records (metadata)
        operation = message["result"]["structuredContent"]
        operation = operation if style == "direct" else operation["result"]
        operation["metadata"]["note"] = "y" * 6000
    frame = json.dumps(message).encode()
    scanner = final_frame.FinalFrameScanner(tool_style=style, max_value_bytes=1024)
    with pytest.raises(BosError):
        for start in range(0, len(frame), chunk_size):
            scanner.feed(frame[start:start + chunk_size])
            # limit + the scanner's 64 KiB trim threshold + one chunk: bounded, whatever the frame size.
            assert len(getattr(scanner, "_buf", b"")) <= 1024 + 65536 + chunk_size
        scanner.finish()


# --- the SSE parser's size bound -----------------------------------------------------------------------


@PROFILE
@given(st.integers(1, 4096), st.integers(1, 64), st.lists(st.integers(0, 10**6), max_size=10), st.booleans())
def test_an_oversized_event_is_refused_with_bounded_buffering(limit: int, extra: int, cuts: list[int],
                                                              many_lines: bool) -> None:
    payload = b"y" * (limit + extra)
    if many_lines:  # the limit counts the event, not one line
        body = b"".join(b"data: " + payload[i:i + 7] + b"\n" for i in range(0, len(payload), 7)) + b"\n"
    else:
        body = b"data: " + payload + b"\n\n"
    parser = SseParser(max_event_bytes=limit)
    with pytest.raises(BosEventTooLarge):
        for chunk in _chunks(body, cuts):
            parser.feed(chunk)
            # Never buffers much more than the limit (plus one line's framing and one chunk).
            assert parser.buffered_bytes <= limit + len(chunk) + 16 if hasattr(parser, "buffered_bytes") else True
        parser.close()


# --- the whole read path: arbitrary event streams into McpSession.federated_read ---------------------------

URL = "https://bos.example/mcp/apps/bos/platform"
CAPS = {"tools": {}, "experimental": {"bos/source-results/v1": {"pageSize": 100, "maxConcurrentSources": 8,
                                                                "contractUri": "x"}}}


def _event(obj: Any) -> bytes:
    return b"event: message\ndata: " + json.dumps(obj).encode() + b"\n\n"


@st.composite
def event_streams(draw: st.DrawFn) -> tuple[list[Any], list[int]]:
    """Pieces of an event stream (filled in with the real request id later) plus chunk cuts."""
    pieces: list[Any] = []
    for note in draw(valid_streams):
        choice = draw(st.sampled_from(["keep", "keep", "mutate", "garbage", "drop"]))
        if choice == "keep":
            pieces.append(("note", note))
        elif choice == "mutate":
            pieces.append(("note", draw(mutated(note))))
        elif choice == "garbage":
            pieces.append(("raw", draw(st.binary(max_size=40))))
    final_kind = draw(st.sampled_from(["final", "final", "mutated-final", "truncated-final", "none", "error"]))
    pieces.append(("final", final_kind, draw(record_lists), draw(st.integers(0, 10**6))))
    return pieces, draw(st.lists(st.integers(0, 10**6), max_size=10))


def _body(pieces: list[Any], rid: Any) -> bytes:
    out = b": bos/source-results/v1\n\n"
    for piece in pieces:
        if piece[0] == "raw":
            out += piece[1]
        elif piece[0] == "note":
            params = dict(piece[1]) if isinstance(piece[1], dict) else piece[1]
            if isinstance(params, dict) and params.get("requestId") == RID:
                params["requestId"] = rid
            out += _event({"jsonrpc": "2.0", "method": "notifications/bos/source_result", "params": params})
        else:
            _, kind, records, cut = piece
            if kind == "none":
                continue
            if kind == "error":
                out += _event({"jsonrpc": "2.0", "id": rid, "error": {"code": -32603, "message": "boom"}})
                continue
            frame = json.dumps(final_message(records, style="direct", rid=rid)).encode()
            if kind == "mutated-final":
                frame = frame.replace(b'"record_ref"', b'"record_rex"', 1) if cut % 2 else frame[: cut % len(frame)]
            elif kind == "truncated-final":
                out += b"event: message\ndata: " + frame[: cut % len(frame)]
                continue
            out += b"event: message\ndata: " + frame + b"\n\n"
    return out


def _session_for(pieces: list[Any], cuts: list[int]) -> McpSession:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "DELETE":
            return httpx.Response(200)
        body = json.loads(request.content)
        method, rid = body.get("method"), body.get("id")
        if method == "initialize":
            return httpx.Response(200, json={"jsonrpc": "2.0", "id": rid, "result": {
                "protocolVersion": "2025-11-25", "capabilities": CAPS, "serverInfo": {"name": "f", "version": "1"}}},
                headers={"mcp-session-id": "s"})
        if method == "notifications/initialized":
            return httpx.Response(202)
        data = _body(pieces, rid)
        return httpx.Response(200, headers={"content-type": "text/event-stream"},
                              stream=httpx.ByteStream(data) if not cuts else _Chunked(list(_chunks(data, cuts))))

    return McpSession(URL, http_client=httpx.Client(transport=httpx.MockTransport(handler)), era="2025-11-25",
                      retry=RetryPolicy(attempts=1, max_total_s=5, backoff_base_s=0, backoff_max_s=0))


def test_the_fake_stream_is_accepted_when_nothing_is_damaged() -> None:
    """Guards the property below: undamaged pieces must give the final records, in any chunking."""
    records = [record(f"bos:person:{i}") for i in range(3)]
    pieces: list[Any] = [("note", n) for n in valid_stream([2, 1], [None, "rate_limited"])]
    pieces.append(("final", "final", records, 0))
    for cuts in ([], [1, 7, 50, 51, 300, 10**5]):
        with _session_for(pieces, cuts) as session:
            result = session.federated_read("search_people", {"q": 1}, via="direct", deadline_s=30)
            assert [r.record_ref for r in result.records] == [r["record_ref"] for r in records]
            assert result.observations.pages == 3


@SESSION_PROFILE
@given(event_streams())
def test_any_event_stream_yields_a_final_result_or_a_typed_error(case: tuple[list[Any], list[int]]) -> None:
    pieces, cuts = case
    with _session_for(pieces, cuts) as session:
        try:
            result = session.federated_read("search_people", {"q": 1}, via="direct", deadline_s=30)
            _consume(result)
        except BosError:
            return


class _Chunked(httpx.SyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks

    def __iter__(self) -> Iterator[bytes]:
        yield from self._chunks
