"""P4: the SSE framing layer alone (``airflow_provider_bos.mcp.sse.SseParser``), fed 64 KiB chunks.

Inputs are built before the timer starts, from real record JSON (non-ASCII names included), and
checked after it stops: the payload must come out byte-identical, and the notifications all there,
in order.
"""

from __future__ import annotations

import json
import time
from typing import Any

from bench.data import ScenarioParams, iter_final_records
from bench.ours import Unavailable

__all__ = ["CHUNK", "bench_data_line", "bench_notifications"]

CHUNK = 64 * 1024


def _parser_class() -> Any:
    try:
        from airflow_provider_bos.mcp.sse import SseParser
    except Exception as exc:
        raise Unavailable(f"not available yet ({type(exc).__name__}: {exc})") from exc
    return SseParser


def _chunks(stream: bytes) -> list[bytes]:
    return [stream[i:i + CHUNK] for i in range(0, len(stream), CHUNK)]


def _records_json(approx_bytes: int) -> str:
    """A JSON array text of real final records, about ``approx_bytes`` long (repeated to size)."""
    unit_records = []
    size = 0
    for record in iter_final_records(ScenarioParams(records=2000)):
        text = json.dumps(record, ensure_ascii=False, separators=(",", ":"))
        unit_records.append(text)
        size += len(text.encode()) + 1
        if size >= min(approx_bytes, 1 << 20):
            break
    unit = ",".join(unit_records)
    repeats = max(1, approx_bytes // (len(unit.encode()) + 1))
    return "[" + ",".join([unit] * repeats) + "]"


def bench_data_line(megabytes: int) -> dict[str, Any]:
    """One ``event: message`` whose single data line is ~``megabytes`` MB of JSON."""
    parser_cls = _parser_class()
    payload = '{"jsonrpc":"2.0","id":"bench-1","result":{"structuredContent":{"result":' + _records_json(
        megabytes * 1_000_000) + "}}}"
    stream = b"event: message\ndata: " + payload.encode() + b"\n\n"
    chunks = _chunks(stream)
    parser = parser_cls(max_event_bytes=max(len(stream) * 2, 512 * 1024 * 1024))
    events = []
    start = time.perf_counter()
    for chunk in chunks:
        events.extend(parser.feed(chunk))
    events.extend(parser.close())
    seconds = time.perf_counter() - start
    ok = len(events) == 1 and events[0].event == "message" and events[0].data == payload
    return {"bytes": len(stream), "seconds": seconds, "events": len(events), "intact": ok,
            "detail": "payload intact" if ok else f"{len(events)} events; payload differs"}


def bench_notifications(count: int, records_per_page: int) -> dict[str, Any]:
    """``count`` source notifications (sequence 1..count, keepalive comments between), in order."""
    parser_cls = _parser_class()
    records = list(iter_final_records(ScenarioParams(records=max(records_per_page, 1))))[:records_per_page]
    parts: list[bytes] = []
    for seq in range(1, count + 1):
        message = {"jsonrpc": "2.0", "method": "notifications/bos/source_result",
                   "params": {"requestId": "bench-1", "sequence": seq, "pageIndex": seq,
                              "source": {"source_type": "crm", "source_identity": "crm-1"},
                              "records": records, "status": "page"}}
        parts.append(b"event: message\ndata: " + json.dumps(message, ensure_ascii=False).encode() + b"\n\n")
        if seq % 100 == 0:
            parts.append(b": keepalive\n\n")
    stream = b"".join(parts)
    chunks = _chunks(stream)
    parser = parser_cls()
    events = []
    start = time.perf_counter()
    for chunk in chunks:
        events.extend(parser.feed(chunk))
    events.extend(parser.close())
    seconds = time.perf_counter() - start
    sequences = [json.loads(e.data)["params"]["sequence"] for e in events]
    ok = len(events) == count and sequences == list(range(1, count + 1))
    if ok:
        detail = f"{count} events, in order"
    else:
        detail = f"{len(events)}/{count} events" + ("" if sequences == sorted(sequences) else ", REORDERED")
    return {"bytes": len(stream), "seconds": seconds, "events": len(events), "intact": ok, "detail": detail}
