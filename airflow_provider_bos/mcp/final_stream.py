"""The streamed final frame handed over: from the open response to a :class:`StreamingFinalResult`.

A federated read with ``stream_records=True`` does not wait for its final frame (over 1 GB at 1M
records). The session's SSE parser streams each large event's data into a :class:`FrameRouter`,
which feeds one :class:`~.final_frame.FinalFrameScanner` per event. As soon as a scanner's first
key says the event is the response, :func:`hand_over` turns the still-open response into a
:class:`FinalFrameStream`, and :func:`streaming_result` wraps it: the caller pulls records as the
bytes arrive (constant memory), and the result's metadata is parsed from the scanner's skeleton
once they are consumed. A response small enough to arrive whole goes through
:func:`memory_result` (the same scanner, fed from memory), so callers see one behaviour.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from airflow_provider_bos.exceptions import BosIncompleteStreamError, BosResultError
from airflow_provider_bos.mcp.calls import StreamedCall
from airflow_provider_bos.mcp.final_frame import FinalFrameScanner, check_record
from airflow_provider_bos.mcp.final_result import FinalResult, FinalResultParser, StreamingFinalResult
from airflow_provider_bos.mcp.jsonrpc import dumps, same_id
from airflow_provider_bos.mcp.source_results import ToolStyle
from airflow_provider_bos.mcp.sse import SseParser

__all__ = [
    "FrameRouter", "OpenResponse", "FinalFrameStream", "hand_over", "streaming_result", "memory_result",
]


class FrameRouter:
    """The SSE data sink of streamed events: one :class:`FinalFrameScanner` per event."""

    def __init__(self, tool_style: ToolStyle, max_value_bytes: int) -> None:
        self.tool_style = tool_style
        self.max_value_bytes = max_value_bytes
        self.current: FinalFrameScanner | None = None
        self.finished: list[FinalFrameScanner] = []
        self.records: list[Any] = []

    def open(self) -> FrameRouter:
        self.current = FinalFrameScanner(tool_style=self.tool_style, max_value_bytes=self.max_value_bytes)
        return self

    def write(self, data: bytes) -> None:
        assert self.current is not None
        records = self.current.feed(data)
        if records:
            self.records.extend(records)

    def end(self) -> None:
        assert self.current is not None
        records = self.current.flush()
        if records:
            self.records.extend(records)
        self.finished.append(self.current)
        self.current = None


@dataclass(frozen=True)
class OpenResponse:
    """An event-stream response still being read: its chunks, its parser and router, how to let go."""

    response: httpx.Response
    chunks: Iterator[bytes]
    parser: SseParser
    router: FrameRouter
    #: Closes the response and clears the session's in-flight reference to it.
    release: Callable[[httpx.Response], None]


class FinalFrameStream:
    """Pulls the rest of a streamed final frame from the open response, record by record."""

    def __init__(
        self, source: OpenResponse, scanner: FinalFrameScanner, call: StreamedCall, *, finished: bool
    ) -> None:
        self._source = source
        self.scanner = scanner
        self._call = call
        self._finished = finished  # the frame's last byte has been fed already
        self._closed = False

    def records(self) -> Iterator[Any]:
        source, call = self._source, self._call
        router = source.router
        where = self.scanner.records_where
        index = 0
        try:
            while True:
                if router.records:
                    batch, router.records = router.records, []
                    for raw in batch:
                        # WireRecord: tells the warehouse it may take its orjson fast path (a
                        # KnownRecord claim passes check_record as it is).
                        yield check_record(raw, index, where)
                        index += 1
                if self._finished:
                    break
                chunk = next(source.chunks, None)
                if chunk is None:
                    source.parser.close()
                    raise self._incomplete("the event stream ended")
                for event in source.parser.feed(chunk):
                    if event.streamed:
                        self._finished = True
                call.check()
        except (httpx.TransportError, httpx.StreamError) as exc:
            failure = call.interrupted() or (
                call.idle_timed_out("inside the final response to") if isinstance(exc, httpx.ReadTimeout)
                else self._incomplete(f"the connection failed ({type(exc).__name__})")
            )
            raise failure from exc
        finally:
            self.close()

    def _incomplete(self, why: str) -> BosIncompleteStreamError:
        return BosIncompleteStreamError(
            f"{why.capitalize()} inside the final response to {self._call.method}; there is no confirmed "
            "result and the records received are not authoritative. Re-run the read.",
            observations=self._call.observations,
        )

    def skeleton(self) -> dict[str, Any]:
        return self.scanner.finish()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._source.release(self._source.response)


def hand_over(
    source: OpenResponse, scanner: FinalFrameScanner, call: StreamedCall, *, finished: bool
) -> FinalFrameStream:
    """The final frame has started (its first key says it is a result): hand the response over."""
    if "id" in scanner.message and not same_id(scanner.message["id"], call.request_id):
        raise BosResultError(
            f"The response id {scanner.message['id']!r} does not match the request id {call.request_id!r}; "
            "the server answered some other request."
        )
    return FinalFrameStream(source, scanner, call, finished=finished)


def streaming_result(stream: FinalFrameStream, parser: FinalResultParser) -> StreamingFinalResult:
    """The deferred result whose records are pulled from ``stream``."""

    def finish_stream(count: int) -> FinalResult:
        return parser.parse_message(stream.skeleton(), record_count=count)

    return StreamingFinalResult(
        request_id=parser.request_id, tool_style=parser.tool_style, streamed=parser.streamed,
        observations=parser.observations, records=stream.records(), finish=finish_stream,
        on_close=stream.close, scanner=stream.scanner,
    )


def memory_result(message: Any, raw: bytes | None, parser: FinalResultParser) -> StreamingFinalResult:
    """The same deferred result for a frame that arrived whole (JSON body or a small SSE event).

    ``raw``: the message's JSON text when the session kept it (else it is re-encoded).
    """
    if isinstance(message, Mapping) and "error" in message:
        parser.parse_message(message)  # raises the typed JSON-RPC error at once
    data = raw if raw is not None else dumps(message)
    scanner = FinalFrameScanner(tool_style=parser.tool_style, max_value_bytes=len(data) + 1)
    records = scanner.feed(data)
    records += scanner.flush()
    where = scanner.records_where

    def from_memory() -> Iterator[Any]:
        for index, raw_record in enumerate(records):
            yield check_record(raw_record, index, where)
        records.clear()

    def finish_memory(count: int) -> FinalResult:
        return parser.parse_message(scanner.finish(), record_count=count)

    return StreamingFinalResult(
        request_id=parser.request_id, tool_style=parser.tool_style, streamed=parser.streamed,
        observations=parser.observations, records=from_memory(), finish=finish_memory,
    )
