"""One call's event-stream answer, across the connections it takes: routing and resumption.

:class:`ResponseEvents` reads the SSE answer of one request. Each event is routed in wire order:
a source-result page to the read's tracker (counted, not decoded: :mod:`.page_records`), other
notifications and priming events (``id`` + empty ``data``, SEP-1699) are passed over, a server
request gets its typed error (:mod:`.interactive`), and the final response goes back to the
caller, whole or, when the caller streams records, as soon as its frame starts
(:mod:`.final_stream`).

Resumption (MCP 2025-11-25, "Resumability and Redelivery"): when a stream that carried event ids
closes or drops before the final response, the call is not lost. After the server's ``retry``
delay the stream is reopened with ``GET`` + ``Last-Event-ID`` and read on: the server sends the
events after that id again, then the rest. So:

- a notification is never counted twice: one whose ``sequence`` is not above the last one seen
  is a replay and is skipped;
- a final frame cut midway is taken again from its start (a partly received event has no id
  yet, so the server replays it whole); if records of it were handed out already, the caller
  is told to discard them (:class:`~airflow_provider_bos.exceptions.BosFinalFrameRestarted`);
- attempts are bounded (:data:`MAX_RESUME_ATTEMPTS` in a row without a new event id, and
  :data:`MAX_RESUMPTIONS_PER_CALL` in all, which new event ids do not reset: a server that sends
  an id and closes, forever, is given up), wait at least :data:`MIN_RETRY_MS` (a ``retry: 0``
  cannot make them a busy loop) and are kept within the read's deadline; a server that refuses
  (no event ids, or 4xx on the ``GET``, e.g. 405 from a stateless server) leaves the call as it
  was: no confirmed result.

Deadlines, cancels and the stream idle timeout are never resumed: they are the client's own
decision to stop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from airflow_provider_bos.exceptions import (
    BosError,
    BosHttpError,
    BosIncompleteStreamError,
    BosProtocolError,
    BosTransportError,
)
from airflow_provider_bos.mcp.calls import Consumer, StreamedCall
from airflow_provider_bos.mcp.final_frame import FinalFrameScanner, value_bound
from airflow_provider_bos.mcp.final_stream import FrameRouter
from airflow_provider_bos.mcp.interactive import ANSWERED_WITHOUT_A_REPLY, server_request_error
from airflow_provider_bos.mcp.jsonrpc import dumps, loads
from airflow_provider_bos.mcp.page_records import decode_source_result
from airflow_provider_bos.mcp.source_results import ToolStyle
from airflow_provider_bos.mcp.sse import SseParser
from airflow_provider_bos.models import SOURCE_RESULT_METHOD
from airflow_provider_bos.redaction import printable

__all__ = ["ResponseEvents", "Reconnect", "ResumeRefused", "FinalStart", "MAX_RESUME_ATTEMPTS",
           "MAX_RESUMPTIONS_PER_CALL", "MIN_RETRY_MS"]

logger = logging.getLogger(__name__)

#: Reconnections in a row that may fail, or bring no new event, before the call is given up.
MAX_RESUME_ATTEMPTS = 5
#: The wait before reconnecting when the server never sent ``retry`` (the MCP SDK's default).
DEFAULT_RETRY_MS = 1000
#: A server's ``retry`` is honoured up to this (a longer wait would be spent better failing).
MAX_RETRY_MS = 30_000
#: ... and from this up: the shortest wait before a reconnect, whatever ``retry`` says.
MIN_RETRY_MS = 250
#: Reconnections one call may make in all (a long read over a flaky network needs a few dozen).
MAX_RESUMPTIONS_PER_CALL = 100

# Where a source-result notification names its method (the fast path's cue; anything else is
# still decoded in full, so the cue only has to be cheap, not exhaustive).
_SOURCE_RESULT_TOKEN = f'"{SOURCE_RESULT_METHOD}"'.encode("ascii")
_SOURCE_RESULT_TOKEN_WITHIN = 256


class ResumeRefused(BosError):
    """The server answered the resuming ``GET`` with a refusal (it cannot resume this stream)."""


@dataclass(frozen=True)
class Reconnect:
    """What resumption needs from the HTTP exchange, which owns the client and the in-flight state."""

    #: ``GET`` + ``Last-Event-ID``: the open event-stream response (now the exchange's in-flight
    #: one). Raises :class:`ResumeRefused` when the server refuses, another :class:`BosError` for
    #: a failure worth another attempt, or the call's cancel error.
    reopen: Callable[[str, StreamedCall], httpx.Response]
    #: Wait, or raise the call's cancel error.
    sleep: Callable[[float], None]
    #: Close a response and clear the exchange's in-flight reference to it.
    release: Callable[[httpx.Response], None]


@dataclass(frozen=True)
class FinalStart:
    """Where the final response begins: a whole ``message`` (``raw``: its JSON text when kept), or
    a streamed frame's ``scanner`` (``finished``: its last byte was fed already)."""

    message: Any = None
    raw: bytes | None = None
    scanner: FinalFrameScanner | None = None
    finished: bool = False


class ResponseEvents:
    """The SSE answer of one call: its current connection, parser and frame router.

    ``final_style`` set: events larger than ``stream_threshold`` stream into a
    :class:`~.final_stream.FrameRouter` and the final frame is handed out as soon as it starts.
    ``reconnect`` None: a dropped stream is never resumed.
    """

    def __init__(
        self, response: httpx.Response, call: StreamedCall, consumer: Consumer | None, *,
        final_style: ToolStyle | None, max_event_bytes: int, stream_threshold: int, reconnect: Reconnect | None,
    ) -> None:
        self.call = call
        self.consumer = consumer
        self.final_style = final_style
        self.max_event_bytes = max_event_bytes
        self.stream_threshold = stream_threshold
        self.reconnect = reconnect
        self._resumed = False  # a stream was reopened: a notification may come twice from here on
        self._failed_attempts = 0  # reconnections in a row without a new event
        self._resumptions = 0  # reconnections of this call in all
        self._resumed_from: str | None = None
        self._open(response, None)

    # --- the connection ---------------------------------------------------------------------------

    def _open(self, response: httpx.Response, previous: SseParser | None) -> None:
        self.response = response
        self.router = FrameRouter(self.final_style, value_bound(self.max_event_bytes)) \
            if self.final_style is not None else None
        carried: dict[str, Any] = {}
        if previous is not None:
            carried = {"last_event_id": previous.last_event_id, "retry": previous.retry}
        if self.router is not None:
            self.parser = SseParser(max_event_bytes=self.max_event_bytes, stream_threshold=self.stream_threshold,
                                    open_stream=self.router.open, raw_data=True, **carried)
        else:
            self.parser = SseParser(max_event_bytes=self.max_event_bytes, raw_data=True, **carried)
        self.chunks: Iterator[bytes] = response.iter_bytes()

    def close(self) -> None:
        """Let go of the current connection (the original one is also closed by its sender)."""
        if self.reconnect is not None:
            self.reconnect.release(self.response)
        else:
            self.response.close()

    # --- reading ----------------------------------------------------------------------------------

    def until_final(self) -> FinalStart:
        """Route events until the final response (or its frame's start), resuming the stream if it drops."""
        while True:
            try:
                start = self._route()
                if start is not None:
                    return start
                self.parser.close()
                dropped = "the event stream ended"
            except (httpx.TransportError, httpx.StreamError) as exc:
                self.raise_if_stopped(exc, "before the final response to")
                dropped = f"the connection failed ({type(exc).__name__})"
            self.resume(dropped, "before")

    def raise_if_stopped(self, exc: Exception, where: str) -> None:
        """After a transport error: raise the cancel, deadline or idle timeout that caused it."""
        call = self.call
        interrupted = call.interrupted()
        if interrupted is not None:
            raise interrupted from exc
        if isinstance(exc, httpx.ReadTimeout):
            raise call.idle_timed_out(where) from exc

    def _route(self) -> FinalStart | None:
        """Read the current connection until the final response starts; None at its EOF."""
        call, router, parser = self.call, self.router, self.parser
        for chunk in self.chunks:
            for event in parser.feed(chunk):
                if event.streamed:
                    assert router is not None
                    scanner = router.finished.pop(0)
                    if scanner.kind == "response":
                        return self._frame(scanner, finished=True)
                    message = self.dispatch_message(scanner.finish())
                    if message is not None:
                        return FinalStart(message=message)
                    continue
                data = event.data
                assert isinstance(data, bytes)  # the parser is made with raw_data=True
                message = self.dispatch_event(event.event, data)
                if message is not None:
                    return FinalStart(message=message, raw=data if router is not None else None)
            if router is not None and router.current is not None and router.current.kind == "response":
                return self._frame(router.current, finished=False)
            # Checked per chunk, so keepalive comments alone cannot outlive the deadline, and a
            # cancel() is honoured even where the socket could not be shut down under us.
            call.check()
        if call.cancel.is_set():
            raise call.cancelled()
        return None

    def _frame(self, scanner: FinalFrameScanner, *, finished: bool) -> FinalStart:
        self.call.check_id(scanner.message)
        return FinalStart(scanner=scanner, finished=finished)

    # --- resumption -------------------------------------------------------------------------------

    def resume(self, dropped: str, where: str) -> None:
        """Reopen the stream after its last event id, or raise: there is no confirmed result."""
        call = self.call
        last_id = self.parser.last_event_id
        if self.reconnect is None or not last_id:
            raise self._incomplete(dropped, where)
        if last_id != self._resumed_from:
            self._failed_attempts = 0  # the last connection brought new events
        refused: str | None = None
        while True:
            if self._resumptions >= MAX_RESUMPTIONS_PER_CALL:
                raise self._incomplete(dropped, where, f"the stream was resumed {MAX_RESUMPTIONS_PER_CALL} times, "
                                       "the most one call may be")
            if self._failed_attempts >= MAX_RESUME_ATTEMPTS:
                raise self._incomplete(dropped, where, f"resuming the stream failed {MAX_RESUME_ATTEMPTS} times in "
                                       f"a row{f' ({refused})' if refused else ''}")
            self._failed_attempts += 1
            self._resumptions += 1
            retry_ms = self.parser.retry if self.parser.retry is not None else DEFAULT_RETRY_MS
            delay = min(max(retry_ms, MIN_RETRY_MS), MAX_RETRY_MS) / 1000
            if call.deadline is not None and call.deadline.remaining() <= delay:
                raise call.deadline.error(call.method, call.observations)
            logger.warning("The event stream of %s dropped (%s); resuming after event %s in %.1fs (attempt %d of %d).",
                           call.method, dropped, printable(last_id, limit=80), delay, self._failed_attempts,
                           MAX_RESUME_ATTEMPTS)
            self.reconnect.sleep(delay)
            try:
                response = self.reconnect.reopen(last_id, call)
            except ResumeRefused as exc:
                raise self._incomplete(dropped, where, f"the server refused to resume it: {exc}") from None
            except (BosTransportError, BosHttpError) as exc:  # unreachable, 5xx, 408, 429: another attempt
                if call.deadline is not None and call.deadline.passed():
                    raise call.deadline.error(call.method, call.observations) from exc
                refused = str(exc)
                continue
            previous = self.response
            self._open(response, self.parser)
            self.reconnect.release(previous)
            self._resumed = True
            if call.observations is not None:
                call.observations.stream_resumptions += 1
            self._resumed_from = last_id
            return

    def resume_final(self, dropped: str, known: Any) -> FinalStart:
        """The final frame was cut: resume and read until it starts again (a streamed frame).

        ``known``: the cut frame's known wire hashes, given to the new scanner. A final that now
        arrives whole (small) is fed to a scanner at once (its records wait in the router).
        """
        self.resume(dropped, "inside")
        start = self.until_final()
        if start.scanner is not None:
            start.scanner.known = known
            return start
        assert self.router is not None
        data = start.raw if start.raw is not None else dumps(start.message)
        scanner = FinalFrameScanner(tool_style=self.router.tool_style, max_value_bytes=len(data) + 1)
        scanner.known = known
        self.router.records.extend(scanner.feed(data))
        self.router.records.extend(scanner.flush())
        return self._frame(scanner, finished=True)

    def _incomplete(self, dropped: str, where: str, why: str | None = None) -> BosIncompleteStreamError:
        method = self.call.method
        dropped = dropped[:1].upper() + dropped[1:]
        if where == "inside":
            text = (f"{dropped} inside the final response to {method}; there is no confirmed result "
                    "and the records received are not authoritative")
        else:
            text = f"{dropped} before the final response to {method}; there is no confirmed result"
        if why is not None:
            text += f" ({why})"
        elif self.reconnect is not None and not self.parser.last_event_id:
            text += " (the stream carried no event ids, so it cannot be resumed)"
        return BosIncompleteStreamError(f"{text}. Re-run the read.", observations=self.call.observations)

    # --- events -----------------------------------------------------------------------------------

    def dispatch_event(self, event: str, data: bytes) -> Any:
        """Route one SSE event; return the final response message, or None to keep reading.

        ``data`` is the undecoded bytes (``SseParser(raw_data=True)``): a page is decoded straight
        from them; anything else goes through the parser's UTF-8 policy first.
        """
        if event != "message":
            logger.debug("Ignoring SSE event of type %r.", printable(event, limit=80))
            return None
        if not data:  # a priming event (id + retry, SEP-1699): no message; the parser keeps its id
            return None
        consumer = self.consumer
        if consumer is not None and _SOURCE_RESULT_TOKEN in data[:_SOURCE_RESULT_TOKEN_WITHIN]:
            # A page: checked and counted without decoding its records (None: the general path).
            params = decode_source_result(data, SOURCE_RESULT_METHOD)
            if params is not None:
                self._notify(params)
                return None
        text = self.parser.text(data)
        try:
            message = loads(text)
        except ValueError:
            raise BosProtocolError(f"An SSE message event is not valid JSON ({len(text)} characters).") from None
        return self.dispatch_message(message)

    def dispatch_message(self, message: Any) -> Any:
        """Route one decoded SSE message; return the final response message, or None to keep reading."""
        if not isinstance(message, Mapping):
            raise BosProtocolError("An SSE message event is not a JSON-RPC object.")
        method = message.get("method")
        if isinstance(method, str):
            if "id" in message:
                if method not in ANSWERED_WITHOUT_A_REPLY:
                    raise server_request_error(method)
                logger.debug("Ignoring server-to-client request %r in the response stream.",
                             printable(method, limit=80))
            elif method == SOURCE_RESULT_METHOD and self.consumer is not None:
                self._notify(message.get("params"))
            else:
                logger.debug("Ignoring notification %r in the response stream.", printable(method, limit=80))
            return None
        if "id" in message and ("result" in message or "error" in message):
            if message["id"] != self.call.request_id:
                raise self.call.wrong_id(message["id"])
            return message
        logger.debug("Ignoring an SSE message that is neither a request, notification nor response.")
        return None

    def _notify(self, params: Any) -> None:
        assert self.consumer is not None
        tracker = self.call.observations
        if self._resumed and tracker is not None and _replayed(params, tracker.last_sequence):
            tracker.replays_skipped += 1
            return
        self.consumer(params)


def _replayed(params: Any, last_sequence: int | None) -> bool:
    """A notification a resumed stream sent again: its sequence is not above the last one seen."""
    if last_sequence is None or not isinstance(params, Mapping):
        return False
    sequence = params.get("sequence")
    return isinstance(sequence, int) and not isinstance(sequence, bool) and sequence <= last_sequence

