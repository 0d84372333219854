"""FinalFrameScanner: records out as their bytes complete, content text skipped, the rest validated."""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_bos.exceptions import BosJsonRpcError, BosResultError
from airflow_provider_bos.mcp.final_frame import FinalFrameScanner, WireRecord, check_record
from airflow_provider_bos.mcp.final_result import FinalResultParser

RID = "rid-1"
CONTEXT = {"context_handle": "ctx", "organization_name": "O", "application_name": "A",
           "installation_name": "I", "role_label": "R", "is_default": True}
META = {"completeness": "complete", "result_count": 3, "observed_at": "2026-10-08T12:00:00Z"}


def record(i: int, name: str = "P") -> dict[str, Any]:
    return {"record_ref": f"bos:person:{i}", "display_name": f"{name} {i}", "email": None, "phone": None,
            "lifecycle": None, "identity_match": None, "attributes": {"n": [i, {"k": "}],{\"x"}]},
            "sources": [{"source_type": "crm", "source_identity": "crm-eu", "external_id": str(i),
                         "record_type": "person", "observed_at": "2026-10-08T12:00:00Z",
                         "capabilities": ["read"], "version": None}]}


RECORDS = [record(1, 'q"uo\\te \\" é 😀'), record(2, "\\\\"), record(3, "\u2028\n")]


def frame(style: str = "execute", *, records: list[Any] = RECORDS, meta: dict | None = None,
          order: tuple[str, ...] = ("content", "structuredContent", "isError", "_meta"),
          inner_order: tuple[str, ...] = ("result", "metadata"),
          top_order: tuple[str, ...] = ("jsonrpc", "id", "result"),
          text: str | None = None, indent: int | None = None, ensure_ascii: bool = False) -> bytes:
    meta = meta or {**META, "result_count": len(records)}
    operation = {k: {"result": records, "metadata": meta}[k] for k in inner_order}
    structured = ({"contract_version": "bos-identity-mcp/v2", "context": CONTEXT, "result": operation}
                  if style == "execute" else operation)
    result_parts = {
        "content": [{"type": "text", "text": text if text is not None else json.dumps(structured)}],
        "structuredContent": structured,
        "isError": False,
        "_meta": {"bos/context": CONTEXT},
    }
    result = {k: result_parts[k] for k in order}
    top = {"jsonrpc": "2.0", "id": RID, "result": result}
    message = {k: top[k] for k in top_order}
    return json.dumps(message, indent=indent, ensure_ascii=ensure_ascii).encode()


def assert_complete_result(skeleton: dict[str, Any], style: str, count: int) -> None:
    """The skeleton of a valid frame parses to its complete result (metadata and context intact)."""
    final = FinalResultParser(RID, tool_style=style).parse_message(skeleton, record_count=count)  # type: ignore[arg-type]
    assert (final.completeness, final.result_count, final.is_error, final.warnings) == ("complete", count, False, [])
    if style == "execute":
        assert final.context is not None and final.context.context_handle == "ctx"


def scan(
    data: bytes, style: str = "execute", sizes: list[int] | None = None
) -> tuple[list[Any], dict, FinalFrameScanner]:
    scanner = FinalFrameScanner(tool_style=style)  # type: ignore[arg-type]
    out: list[Any] = []
    pos = 0
    sizes = sizes or [len(data)]
    k = 0
    while pos < len(data):
        size = max(1, sizes[k % len(sizes)])
        out += scanner.feed(data[pos : pos + size])
        pos += size
        k += 1
    out += scanner.flush()
    return out, scanner.finish(), scanner


ORDERS = [("content", "structuredContent", "isError", "_meta"), ("_meta", "isError", "structuredContent", "content"),
          ("structuredContent", "content", "_meta", "isError")]


@pytest.mark.parametrize("style", ["execute", "direct"])
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("inner", [("result", "metadata"), ("metadata", "result")])
@pytest.mark.parametrize("top", [("jsonrpc", "id", "result"), ("result", "jsonrpc", "id")])
@pytest.mark.parametrize("indent", [None, 1])
def test_every_key_order_and_layout(style: str, order: tuple, inner: tuple, top: tuple, indent: int | None) -> None:
    data = frame(style, order=order, inner_order=inner, top_order=top, indent=indent, ensure_ascii=indent is not None)
    for sizes in ([len(data)], [1], [7, 3, 64]):
        records, skeleton, scanner = scan(data, style, sizes)
        assert records == RECORDS and scanner.kind == "response" and scanner.records_seen == 3
        final = FinalResultParser(RID, tool_style=style).parse_message(skeleton, record_count=len(records))  # type: ignore[arg-type]
        assert final.completeness == "complete" and final.result_count == 3 and final.warnings == []
        if style == "execute":
            assert final.context is not None and final.context.context_handle == "ctx"


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_chunk_splits_at_every_position(data: st.DataObject) -> None:
    raw = frame(data.draw(st.sampled_from(["execute", "direct"])), order=data.draw(st.sampled_from(ORDERS)))
    style = "execute" if b"contract_version" in raw else "direct"
    split = data.draw(st.integers(1, len(raw) - 1))
    sizes = data.draw(st.lists(st.integers(1, 40), min_size=1, max_size=5))
    scanner = FinalFrameScanner(tool_style=style)  # type: ignore[arg-type]
    out = scanner.feed(raw[:split])
    pos, k = split, 0
    while pos < len(raw):
        out += scanner.feed(raw[pos : pos + sizes[k % len(sizes)]])
        pos += sizes[k % len(sizes)]
        k += 1
    out += scanner.flush()
    skeleton = scanner.finish()
    assert out == RECORDS
    assert_complete_result(skeleton, style, len(RECORDS))


@pytest.mark.parametrize("style", ["execute", "direct"])
def test_identical_records_are_all_yielded_whatever_the_first_chunk(style: str) -> None:
    """With the second record's first key split across chunks, the boundary must not be learnt from
    the gap after the FIRST record (the whole second record inside it): identical records later in
    the array would then match it and one would be silently dropped."""
    a, b = record(10000), record(10)
    records = [a, b, a, b, a]
    data = frame(style, records=records)
    starts = [i for i in range(len(data)) if data.startswith(b'{"record_ref": "bos:person:', i)]
    second = starts[len(starts) - len(records) + 1]  # structuredContent's second record
    for cut in range(second - 2, second + 16):
        got, _, _ = scan(data, style, sizes=[cut, len(data)])
        assert [r["record_ref"] for r in got] == [r["record_ref"] for r in records], cut


def test_many_records_come_out_in_batches_and_in_order() -> None:
    many = [record(i) for i in range(3000)]
    data = frame("direct", records=many)
    records, _, _ = scan(data, "direct", [65536])
    assert records == many


def test_content_text_is_skipped_but_an_excerpt_kept() -> None:
    text = 'He said "hi" \\ and \\" ' * 50
    _, skeleton, _ = scan(frame("direct", text=text), "direct", [5])
    kept = skeleton["result"]["content"][0]["text"]
    assert text.startswith(kept) and 0 < len(kept) <= len(text)


def test_a_50mb_text_is_never_materialised() -> None:
    big = '{"k": "v\\"\\\\"}, ' * (50 * 1024 * 1024 // 16)
    data = frame("direct", text=big)
    assert len(data) > 50 * 1024 * 1024
    chunk = 64 * 1024
    tracemalloc.start()
    try:
        scanner = FinalFrameScanner(tool_style="direct")
        view = memoryview(data)
        out: list[Any] = []
        for pos in range(0, len(data), chunk):
            out += scanner.feed(view[pos : pos + chunk])
        out += scanner.flush()
        scanner.finish()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out == RECORDS
    assert peak < 5 * 1024 * 1024, peak


def test_error_frame_is_captured_and_raised_as_the_typed_error() -> None:
    data = json.dumps({"jsonrpc": "2.0", "id": RID, "error": {"code": -32000, "message": "boom"}}).encode()
    records, skeleton, scanner = scan(data, "direct", [3])
    assert records == [] and scanner.kind == "error"
    with pytest.raises(BosJsonRpcError, match="boom"):
        FinalResultParser(RID, tool_style="direct").parse_message(skeleton)


def test_notification_is_captured_whole() -> None:
    message = {"jsonrpc": "2.0", "method": "notifications/bos/source_result", "params": {"records": [record(1)]}}
    records, skeleton, scanner = scan(json.dumps(message).encode(), "direct", [4])
    assert records == [] and scanner.kind == "notification" and skeleton == message


def test_failed_call_without_structured_content_reports_its_text() -> None:
    message = {"jsonrpc": "2.0", "id": RID, "result": {"content": [{"type": "text", "text": "upstream said no"}],
                                                      "isError": True}}
    _, skeleton, _ = scan(json.dumps(message).encode(), "execute")
    with pytest.raises(BosResultError, match="upstream said no"):
        FinalResultParser(RID, tool_style="execute").parse_message(skeleton, record_count=0)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b'{"jsonrpc":"2.0","id":"rid-1","result":{"structuredContent":{"result":[{"a":1},]}}}', "not valid JSON"),
        (b'{"jsonrpc":"2.0","id":"rid-1","result":{"structuredContent":{"result":[{"a":1}', "ended before"),
        (b'["not", "an", "object"]', "not a JSON object"),
        (b'{"jsonrpc":"2.0" "id":1}', "not valid JSON"),
        (b'{"id":"rid-1","result":{}} trailing', "not valid JSON"),
        (b"", "empty"),
        (b'{"id":"rid-1","result":{"structuredContent":{"result":[{"a":tru}]}}}', "not valid JSON"),
    ],
)
def test_malformed_frames_are_typed_errors(data: bytes, match: str) -> None:
    scanner = FinalFrameScanner(tool_style="direct")
    with pytest.raises(BosResultError, match=match):
        scanner.feed(data)
        scanner.finish()


def test_malformed_structure_is_reported_at_validation() -> None:
    data = json.dumps({"jsonrpc": "2.0", "id": RID, "result": {"structuredContent": {"result": {"oops": 1},
                                                                                   "metadata": META}}}).encode()
    records, skeleton, _ = scan(data, "direct")
    assert records == []
    with pytest.raises(BosResultError, match="no record array"):
        FinalResultParser(RID, tool_style="direct").parse_message(skeleton, record_count=0)


def test_a_captured_value_over_the_limit_is_refused() -> None:
    data = json.dumps({"jsonrpc": "2.0", "id": RID, "result": {"_meta": {"x": "y" * 5000}}}).encode()
    scanner = FinalFrameScanner(tool_style="direct", max_value_bytes=1000)
    with pytest.raises(BosResultError, match="exceeds 1000 bytes"):
        for pos in range(0, len(data), 100):
            scanner.feed(data[pos : pos + 100])


def test_check_record_is_light_but_firm() -> None:
    ok = check_record(record(1), 0, "x")
    assert isinstance(ok, WireRecord) and ok.from_json and ok == record(1)
    for bad, words in [([], "not an object"), ({"record_ref": ""}, "no record_ref"),
                       ({"record_ref": "r", "sources": []}, "no sources"),
                       ({"record_ref": "r", "sources": [{"x": 1}]}, "without observed_at")]:
        with pytest.raises(BosResultError, match=words):
            check_record(bad, 0, "x")


def _text_end_reference(buf: bytes, start: int) -> int:
    i = start
    while i < len(buf):
        if buf[i] == 0x5C:
            i += 2
        elif buf[i] == 0x22:
            return i
        else:
            i += 1
    return -1


@settings(max_examples=500, deadline=None)
@given(body=st.lists(st.sampled_from([b"\\", b'"', b"a", b"\\u00e9", b'\\"', b"\\\\"]), max_size=40).map(b"".join),
       start=st.integers(0, 3))
def test_the_text_skip_finds_the_same_closing_quote_as_a_byte_by_byte_scan(body: bytes, start: int) -> None:
    """_text_end's shortcuts (counts, backslash runs, filler) agree with the plain definition."""
    from airflow_provider_bos.mcp.json_bytes import text_end as _text_end

    buf = b"x" * start + body
    # Start where the reference scan says a string body may start: at an escape boundary.
    assert _text_end(buf, start) == _text_end_reference(buf, start)
    assert _text_end(bytearray(buf), start) == _text_end_reference(buf, start)


@settings(max_examples=60, deadline=None)
@given(parts=st.lists(st.sampled_from(['"', "\\", "a", "é", "😀", "\u2028", "\n", '\\"', "\\u00e9", "}],{"]),
                      min_size=1, max_size=30),
       repeat=st.integers(1, 800), sizes=st.lists(st.integers(1, 20000), min_size=1, max_size=4),
       ensure_ascii=st.booleans())
def test_long_texts_are_skipped_whole_whatever_the_chunks(parts: list[str], repeat: int, sizes: list[int],
                                                           ensure_ascii: bool) -> None:
    """Texts long enough for the validated fast path (pieces proven quote-free by a parse), with
    escapes, raw UTF-8 and backslash runs cut anywhere by the network: the records and the
    excerpt come out exactly as with a byte-by-byte reading."""
    text = "".join(parts) * repeat
    data = frame("direct", text=text, ensure_ascii=ensure_ascii)
    records, skeleton, _ = scan(data, "direct", sizes)
    assert records == RECORDS
    excerpt = skeleton["result"]["content"][0]["text"]

    def wire_len(value: str) -> int:  # bytes of the value as the frame carries it (escaped, no quotes)
        return len(json.dumps(value, ensure_ascii=ensure_ascii).encode()) - 2

    # The first 2 KiB of the wire text are kept (up to 12 bytes less: an escape or a character cut).
    assert text.startswith(excerpt) and wire_len(excerpt) >= min(wire_len(text), 2048 - 12)
    assert_complete_result(skeleton, "direct", len(RECORDS))
