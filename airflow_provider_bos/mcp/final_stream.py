"""The streamed final frame handed over: from the open response to a :class:`StreamingFinalResult`.

A federated read with ``stream_records=True`` does not wait for its final frame (over 1 GB at 1M
records). The session's SSE parser streams each large event's data into a :class:`FrameRouter`,
which feeds one :class:`~.final_frame.FinalFrameScanner` per event. As soon as a scanner's first
key says the event is the response, the still-open response is handed over as a
:class:`FinalFrameStream` (:mod:`.event_stream` routes the events before it), and
:func:`streaming_result` wraps it: the caller pulls records as the bytes arrive (constant memory),
and the result's metadata is parsed from the scanner's skeleton once they are consumed. A large
``application/json`` answer (a read that did not opt in to the extension, or a server without it)
is scanned the same way as its body arrives
(:class:`JsonBodyFrame`). A response small enough to arrive whole goes through
:func:`memory_result` (the same scanner, fed from memory), so callers see one behaviour.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import httpx

from airflow_provider_bos.exceptions import BosAnswerTooLarge, BosFinalFrameRestarted, BosResultError
from airflow_provider_bos.mcp.final_frame import FinalFrameScanner, check_record, value_bound
from airflow_provider_bos.mcp.final_result import FinalResult, FinalResultParser, StreamingFinalResult
from airflow_provider_bos.mcp.http_status import body_read_failed
from airflow_provider_bos.mcp.jsonrpc import dumps
from airflow_provider_bos.mcp.source_results import ToolStyle

if TYPE_CHECKING:
    from airflow_provider_bos.mcp.calls import StreamedCall
    from airflow_provider_bos.mcp.sse import SseParser

__all__ = [
    "FinalFrameStream", "FrameEvents", "FrameRouter", "JsonBodyFrame", "ResumedFrame", "memory_result",
    "streaming_result",
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


class ResumedFrame(Protocol):
    """Where a cut final frame begins again (:class:`~.event_stream.FinalStart`)."""

    @property
    def scanner(self) -> FinalFrameScanner | None: ...

    @property
    def finished(self) -> bool: ...


class FrameEvents(Protocol):
    """What a :class:`FinalFrameStream` uses of the SSE answer it reads on
    (:class:`~.event_stream.ResponseEvents`, which hands the stream over)."""

    @property
    def call(self) -> StreamedCall: ...

    @property
    def router(self) -> FrameRouter | None: ...

    @property
    def chunks(self) -> Iterator[bytes]: ...

    @property
    def parser(self) -> SseParser: ...

    def close(self) -> None: ...

    def raise_if_stopped(self, exc: Exception, where: str) -> None: ...

    def resume_final(self, dropped: str, known: Any) -> ResumedFrame: ...


class _HandedOverFrame:
    """A final frame whose response was handed over: its skeleton once read, and letting it go once."""

    scanner: FinalFrameScanner
    _let_go: Callable[[], None]  # releases the response (set by each kind of frame)
    _closed = False

    def skeleton(self) -> dict[str, Any]:
        return self.scanner.finish()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._let_go()


class FinalFrameStream(_HandedOverFrame):
    """Pulls the rest of a streamed final frame from the open response, record by record.

    If the connection drops inside the frame and the stream can be resumed (:mod:`.event_stream`),
    the frame is read again from its start; records handed out before the cut are void, which
    the iterator says by raising :class:`~airflow_provider_bos.exceptions.BosFinalFrameRestarted`
    (its ``records`` go on from the frame's first record).
    """

    def __init__(self, events: FrameEvents, scanner: FinalFrameScanner, *, finished: bool) -> None:
        self._events = events
        self.scanner = scanner
        self._call = events.call
        self._finished = finished  # the frame's last byte has been fed already
        self._let_go = events.close

    def records(self) -> Iterator[Any]:
        events, call = self._events, self._call
        where = self.scanner.records_where
        index = 0
        restarted = False
        try:
            while True:
                router = events.router
                assert router is not None
                if router.records:
                    batch, router.records = router.records, []
                    for raw in batch:
                        # WireRecord: tells the warehouse it may take its orjson fast path (a
                        # KnownRecord claim passes check_record as it is).
                        yield check_record(raw, index, where)
                        index += 1
                if self._finished:
                    break
                try:
                    chunk = next(events.chunks, None)
                    if chunk is not None:
                        for event in events.parser.feed(chunk):
                            if event.streamed:
                                self._finished = True
                        call.check()
                        continue
                    events.parser.close()
                    dropped = "the event stream ended"
                except (httpx.TransportError, httpx.StreamError) as exc:
                    events.raise_if_stopped(exc, "inside the final response to")
                    dropped = f"the connection failed ({type(exc).__name__})"
                start = events.resume_final(dropped, self.scanner.known)
                assert start.scanner is not None
                self.scanner, self._finished = start.scanner, start.finished
                where = self.scanner.records_where
                if index:  # records of the cut frame were handed out: they are void
                    restarted = True
                    raise BosFinalFrameRestarted(self.records(), observations=call.observations)
        finally:
            if not restarted:
                self.close()


class JsonBodyFrame(_HandedOverFrame):
    """A final response answered as one ``application/json`` body, scanned as the body arrives.

    Without the extension (not advertised, or the read did not opt in) the server answers a read
    with one JSON body: over 1 GB at 1M records, so it is not read whole (that held the body and
    its decoded tree at once). :meth:`start` feeds the scanner until the first key that tells
    says what the body is; a response is then handed over like a streamed SSE frame, anything
    else (a JSON-RPC error, bytes that are not JSON) is read whole and decoded as before, so its
    error stays the same. A POST's body cannot be resumed: a connection lost inside it raises
    :class:`~airflow_provider_bos.exceptions.BosIncompleteStreamError` from :meth:`records`.
    """

    def __init__(self, response: httpx.Response, call: StreamedCall, tool_style: ToolStyle, *,
                 max_event_bytes: int, max_whole_bytes: int, release: Callable[[httpx.Response], None],
                 read_timeout: float | None = None) -> None:
        self._call = call
        self.scanner = FinalFrameScanner(tool_style=tool_style, max_value_bytes=value_bound(max_event_bytes))
        # The most a body read whole (an error, bytes that are not a response) may hold: it is
        # decoded whole, so it has the small bound of any answer, not the result's.
        self._limit = max_whole_bytes
        self._let_go = lambda: release(response)
        self._read_timeout = read_timeout  # only for the message of a read timeout
        self._chunks: Iterator[bytes] = response.iter_bytes()
        self._pending: list[Any] = []  # records the scanner completed, not yet handed out
        self._finished = False  # the body's last byte has been fed

    def start(self) -> bytes | None:
        """Feed the body until it is known to be a response: None; else all of the body, read whole."""
        limit = self._limit
        head = bytearray()
        scanned = True
        while self.scanner.kind is None and len(head) <= limit:
            chunk = self._next_chunk()
            if chunk is None:
                break
            head += chunk
            try:
                self._pending.extend(self.scanner.feed(chunk))
            except BosResultError:  # not JSON, or not an object: decoded whole, the decoding says why
                scanned = False
                break
        if scanned and self.scanner.kind == "response":
            self._call.check_id(self.scanner.message)  # before any record, as on the SSE path
            return None
        while len(head) <= limit and (chunk := self._next_chunk()) is not None:
            head += chunk
        if len(head) > limit:
            raise BosAnswerTooLarge(self._call.method, limit)
        return bytes(head)

    def _next_chunk(self) -> bytes | None:
        try:
            chunk = next(self._chunks, None)
        except httpx.HTTPError as exc:  # the connection, or a body that does not decode (Content-Encoding)
            raise self._call.interrupted() or body_read_failed(
                self._call.method, exc, self._read_timeout, observations=self._call.observations) from exc
        self._call.check()
        if chunk is None:
            self._finished = True
        return chunk

    def _pull(self) -> None:
        """One more chunk of the body into the scanner (its completed records kept for :meth:`records`)."""
        chunk = self._next_chunk()
        records = self.scanner.feed(chunk) if chunk is not None else self.scanner.flush()
        if records:
            self._pending.extend(records)

    def records(self) -> Iterator[Any]:
        where = self.scanner.records_where
        index = 0
        try:
            while True:
                if self._pending:
                    batch, self._pending = self._pending, []
                    for raw in batch:
                        yield check_record(raw, index, where)
                        index += 1
                if self._finished:
                    break
                self._pull()
        finally:
            self.close()


def streaming_result(stream: FinalFrameStream | JsonBodyFrame, parser: FinalResultParser) -> StreamingFinalResult:
    """The deferred result whose records are pulled from ``stream``."""

    def finish_stream(count: int) -> FinalResult:
        return parser.parse_message(stream.skeleton(), record_count=count)

    return StreamingFinalResult(
        request_id=parser.request_id, tool_style=parser.tool_style, streamed=parser.streamed,
        observations=parser.observations, records=stream.records(), finish=finish_stream,
        on_close=stream.close, frame=stream,
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
