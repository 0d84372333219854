"""The HTTP transport an :class:`~.session.McpSession` owns: :class:`HttpExchange`.

As the MCP SDK's ``StreamableHTTPTransport``, it holds the connection's state (URL, client, bounds,
protocol version and session id, the in-flight response, the cancel flag). :meth:`~HttpExchange.request`
is one attempt in two steps: :meth:`~HttpExchange.send` POSTs a JSON-RPC message (headers and ``_meta``
per era, timeouts within the deadline); :meth:`~HttpExchange.classify` maps the answer's status and
Content-Type (:mod:`.http_status`) and reads it into one :data:`Reply`. A request is never answered
with 202/204 (:func:`~.http_status.raise_for_status` refuses it), a :meth:`~HttpExchange.notify` is.
Also: the ``GET`` + ``Last-Event-ID`` resuming a dropped stream, the ``DELETE`` ending a session.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import httpx

from airflow_provider_bos.exceptions import (
    BosAnswerTooLarge,
    BosAuthError,
    BosConfigurationError,
    BosDeadlineExceeded,
    BosEventTooLarge,
    BosHttpError,
    BosIncompleteStreamError,
    BosProtocolError,
    BosReadCancelled,
    BosTransportError,
    excerpt,
)
from airflow_provider_bos.mcp.calls import CallOptions, Consumer, Deadline, StreamedCall
from airflow_provider_bos.mcp.eras import envelope_params, request_headers
from airflow_provider_bos.mcp.event_stream import Reconnect, ResponseEvents, ResumeRefused
from airflow_provider_bos.mcp.final_stream import FinalFrameStream, JsonBodyFrame
from airflow_provider_bos.mcp.http_status import (
    abort,
    body_read_failed,
    body_too_large,
    declared_length,
    error_excerpt,
    media_type,
    raise_for_status,
)
from airflow_provider_bos.mcp.jsonrpc import (
    IdGenerator,
    dumps,
    loads,
    notification_envelope,
    request_envelope,
)
from airflow_provider_bos.mcp.retry import RetryableTransportError, RetryPolicy, run_with_retries
from airflow_provider_bos.models import PROTOCOL_2026

__all__ = ["HttpExchange", "Reply", "JsonReply", "EventStreamReply", "OpenFinalFrame", "DEFAULT_MAX_ANSWER_BYTES"]

logger = logging.getLogger("airflow_provider_bos.mcp.session")  # the DELETE's lines, where they always were

#: The bound of every answer held and decoded whole: the handshake, tools/list, the contexts, a
#: plain call. A JSON answer of tiny objects decodes to about 34 times its size, so this stays a
#: few MiB whatever ``max_event_bytes`` (the bound of a federated read's result, which is scanned
#: record by record) allows.
DEFAULT_MAX_ANSWER_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class JsonReply:
    """An ``application/json`` answer, read whole (bounded, by the deadline) and decoded."""

    request_id: str
    message: Any  # the decoded JSON-RPC response object
    raw: bytes | None  # its JSON text, kept for a read's result (scanned record by record)
    streamed: ClassVar[bool] = False


@dataclass(frozen=True)
class EventStreamReply:
    """A ``text/event-stream`` answer whose final response was held whole."""

    request_id: str
    message: Any
    raw: bytes | None  # its JSON text, when kept
    streamed: ClassVar[bool] = True


@dataclass(frozen=True)
class OpenFinalFrame:
    """A read's final frame, still arriving: ``stream`` owns the response (and releases it)."""

    request_id: str
    stream: FinalFrameStream | JsonBodyFrame
    streamed: bool  # in an event stream, not a JSON body


Reply = JsonReply | EventStreamReply | OpenFinalFrame


class HttpExchange:
    """The connection to one MCP endpoint and its state (see the module docstring)."""

    def __init__(
        self, url: str, *, auth: httpx.Auth | None, http_client: httpx.Client | None, timeout: float,
        stream_idle_timeout: float, retry: RetryPolicy, max_event_bytes: int, max_answer_bytes: int,
        stream_threshold_bytes: int, client_info: dict[str, Any],
    ) -> None:
        for name, value in (("max_event_bytes", max_event_bytes), ("max_answer_bytes", max_answer_bytes)):
            if value <= 0:
                raise BosConfigurationError(f"{name} must be a positive number of bytes, not {value!r}.")
        self.url = url
        self.timeout = timeout
        self.stream_idle_timeout = stream_idle_timeout
        self.retry = retry
        self.max_event_bytes = max_event_bytes
        # Every answer but a read's result; never above the event bound.
        self.max_answer_bytes = min(max_answer_bytes, max_event_bytes)
        # Below the bound, or a small max_event_bytes would refuse the events streaming exists for.
        self.stream_threshold_bytes = min(stream_threshold_bytes, max_event_bytes // 2)
        self.client_info = client_info
        self._auth: dict[str, Any] = {"auth": auth} if auth is not None else {}  # httpx's keyword
        self._own_client = http_client is None
        self._client = http_client or httpx.Client(timeout=timeout, follow_redirects=False)
        self._ids = IdGenerator()
        # Negotiated by the session's handshake (the session id from the initialize answer's header).
        self.protocol_version: str | None = None
        self.session_id: str | None = None
        # Cancellation: McpSession.cancel() may run on another thread.
        self.cancelled = threading.Event()
        self._lock = threading.Lock()
        self._inflight: httpx.Response | None = None
        self.reconnect = Reconnect(reopen=self.reopen_stream, sleep=self.sleep, release=self.release)

    @property
    def stateless(self) -> bool:
        """True when speaking the 2026-07-28 stateless protocol."""
        return self.protocol_version == PROTOCOL_2026

    def sleep(self, seconds: float) -> None:
        """Wait between attempts; a cancel ends the wait."""
        if self.cancelled.wait(seconds):
            raise BosReadCancelled("The request was cancelled while waiting to retry.")

    def cancel(self) -> None:
        """Set the cancel flag and abort the in-flight response, if any (from any thread)."""
        self.cancelled.set()
        with self._lock:
            response = self._inflight
        if response is not None:
            abort(response)

    # --- one request: send, then classify ----------------------------------------------------------

    def request(self, method: str, params: dict[str, Any] | None, options: CallOptions) -> Reply:
        """One attempt: :meth:`send`, then :meth:`classify`; the response is let go of unless an
        :class:`OpenFinalFrame` took it."""
        request_id, response = self.send(method, params, options.deadline)
        reply: Reply | None = None
        try:
            reply = self.classify(response, method, request_id, options)
            return reply
        finally:
            if not isinstance(reply, OpenFinalFrame):
                with self._lock:
                    self._inflight = None
                response.close()

    def send(self, method: str, params: dict[str, Any] | None, deadline: Deadline | None) -> tuple[str, httpx.Response]:
        """POST one JSON-RPC request: its id and the response (now the in-flight one), body unread."""
        if deadline is not None and deadline.reached():
            raise BosDeadlineExceeded(
                f"The {method} deadline of {deadline.seconds}s passed before the request was sent.")
        request_id = self._ids.next()
        try:
            response = self._post(method, params, request_envelope(request_id, method, self._envelope_params(params)),
                                  deadline)
        except BosTransportError as exc:
            if deadline is not None and deadline.passed():
                raise deadline.error(method) from exc
            raise
        with self._lock:
            self._inflight = response
        return request_id, response

    def classify(self, response: httpx.Response, method: str, request_id: str, options: CallOptions) -> Reply:
        """The :data:`Reply` an answer is, by its status and Content-Type; or the error they mean."""
        if self.cancelled.is_set():
            abort(response)
            raise BosReadCancelled(f"{method} was cancelled.")
        self._raise_for_status(response, method)
        if method == "initialize" and (session_id := response.headers.get("mcp-session-id")):
            self.session_id = session_id
        consumer = options.make_consumer(request_id) if options.make_consumer is not None else None
        call = StreamedCall(method, request_id, options.deadline, getattr(consumer, "tracker", None), self.cancelled)
        content_type = media_type(response)
        if content_type == "application/json":
            return self._json_reply(response, call, options)
        if content_type == "text/event-stream":
            return self._event_stream_reply(response, replace(call, idle_timeout=self.stream_idle_timeout), consumer,
                                            options)
        raise BosHttpError(f"BOS answered {method} with an unexpected content type", url=self.url,
                           status_code=response.status_code, content_type=response.headers.get("content-type"),
                           body_excerpt=error_excerpt(response))

    def _json_reply(self, response: httpx.Response, call: StreamedCall,
                    options: CallOptions) -> JsonReply | OpenFinalFrame:
        """A read's result not known to be small is scanned as it arrives; any other body is read whole."""
        method, deadline, style = call.method, call.deadline, options.final_style
        try:
            if style is not None and ((length := declared_length(response)) is None
                                      or length > self.stream_threshold_bytes):
                frame = JsonBodyFrame(response, call, style, max_event_bytes=self._limit(options),
                                      max_whole_bytes=self.max_answer_bytes, release=self.release,
                                      read_timeout=self.timeout)
                body = frame.start()
                if body is None:
                    return OpenFinalFrame(call.request_id, frame, streamed=False)
            else:
                body = self._read_body(response, method, deadline, read_result=options.read_result)
            return JsonReply(call.request_id, self._decode_json(body, method), body if style is not None else None)
        except BosIncompleteStreamError as exc:
            if deadline is not None and deadline.passed() and not isinstance(exc, BosReadCancelled):
                raise deadline.error(method) from exc
            raise

    def _event_stream_reply(self, response: httpx.Response, call: StreamedCall, consumer: Consumer | None,
                            options: CallOptions) -> EventStreamReply | OpenFinalFrame:
        """Route the events until the final response, or the start of a read's large final frame."""
        limit = self._limit(options)
        set_read_timeout(response, within(self.stream_idle_timeout, call.deadline))
        events = ResponseEvents(response, call, consumer, final_style=options.final_style, max_event_bytes=limit,
                                stream_threshold=self.stream_threshold_bytes, reconnect=self.reconnect)
        try:
            start = events.until_final()
        except BaseException as exc:
            events.close()
            if isinstance(exc, BosEventTooLarge) and not options.read_result:
                raise BosAnswerTooLarge(call.method, limit) from None
            raise
        if start.scanner is not None:
            stream = FinalFrameStream(events, start.scanner, finished=start.finished)
            return OpenFinalFrame(call.request_id, stream, streamed=True)
        events.close()
        return EventStreamReply(call.request_id, start.message, start.raw)

    # --- notifications, resumption, the end of a session ---------------------------------------------

    def notify(self, method: str, params: dict[str, Any] | None, deadline: Deadline | None) -> None:
        """POST one JSON-RPC notification (with retries); 200, 202 or 204 accept it."""
        body = notification_envelope(method, self._envelope_params(params))

        def send() -> None:
            if deadline is not None and deadline.reached():
                raise deadline.error(method)
            response = self._post(method, params, body, deadline)
            try:
                if response.status_code not in (200, 202, 204):
                    self._raise_for_status(response, method)
            finally:
                response.close()

        run_with_retries(send, self.retry, deadline=deadline.at if deadline is not None else None,
                         sleep=self.sleep, describe=method)

    def reopen_stream(self, last_event_id: str, call: StreamedCall) -> httpx.Response:
        """Resume a dropped response stream: ``GET`` + ``Last-Event-ID`` (MCP 2025-11-25)."""
        what = f"the GET resuming {call.method}"
        headers = {**self._headers(call.method, None), "Accept": "text/event-stream", "Last-Event-ID": last_event_id}
        headers.pop("Content-Type", None)
        request = self._client.build_request("GET", self.url, headers=headers,
                                             timeout=within(self.timeout, call.deadline))
        response = self._send(request, what)
        with self._lock:
            self._inflight = response
        status = response.status_code
        if self.cancelled.is_set():
            self.release(response)
            raise call.cancelled()
        if status == 200 and media_type(response) == "text/event-stream":
            set_read_timeout(response, within(self.stream_idle_timeout, call.deadline))
            return response
        detail = error_excerpt(response)
        self.release(response)
        if 400 <= status < 500 and status not in (408, 429):
            raise ResumeRefused(f"HTTP {status}" + (f": {detail}" if detail else ""))
        if status == 200:
            raise ResumeRefused(f"its answer is {response.headers.get('content-type')!r}, not an event stream")
        raise BosTransportError(f"BOS answered {what} with HTTP {status}.")

    def release(self, response: httpx.Response) -> None:
        """A handed-over response is done with: it is no longer the in-flight one, and is closed."""
        with self._lock:
            if self._inflight is response:
                self._inflight = None
        response.close()

    def close(self) -> None:
        """End a 2025 session (``DELETE``) and let go of the HTTP client if we own it."""
        try:
            if self.session_id is not None and not self.stateless:
                headers = {"Mcp-Session-Id": self.session_id}
                if self.protocol_version:
                    headers["MCP-Protocol-Version"] = self.protocol_version
                response = self._client.delete(self.url, headers=headers, timeout=min(self.timeout, 10.0),
                                               **self._auth)
                logger.debug("MCP session DELETE answered HTTP %s.", response.status_code)
        except (httpx.HTTPError, BosAuthError) as exc:  # best effort: the server expires sessions anyway
            logger.debug("MCP session DELETE failed: %s", type(exc).__name__)
        finally:
            self.session_id = None
            if self._own_client:
                self._client.close()

    # --- helpers --------------------------------------------------------------------------------------

    def _post(self, method: str, params: Mapping[str, Any] | None, body: dict[str, Any],
              deadline: Deadline | None) -> httpx.Response:
        request = self._client.build_request(
            "POST", self.url, content=dumps(body), headers=self._headers(method, params),
            timeout=within(self.timeout, deadline),
        )
        return self._send(request, method)

    def _send(self, request: httpx.Request, method: str) -> httpx.Response:
        """Send and return the streaming response; failures before any response byte are retryable."""
        if self.cancelled.is_set():
            raise BosReadCancelled(f"{method} was cancelled before it was sent.")
        try:
            return self._client.send(request, stream=True, **self._auth)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError) as exc:
            raise RetryableTransportError(
                f"Could not reach BOS for {method} at {self.url} ({type(exc).__name__})."
            ) from exc
        except httpx.TimeoutException as exc:
            raise BosTransportError(
                f"BOS did not answer {method} within the HTTP timeout of {self.timeout}s "
                f"({type(exc).__name__}); raise the connection's 'HTTP timeout' if the server is slow to answer."
            ) from exc
        except httpx.TransportError as exc:
            raise BosTransportError(f"The request {method} to {self.url} failed ({type(exc).__name__}).") from exc

    def _headers(self, method: str, params: Mapping[str, Any] | None) -> dict[str, str]:
        return request_headers(method, params, protocol_version=self.protocol_version, session_id=self.session_id)

    def _envelope_params(self, params: Mapping[str, Any] | None) -> dict[str, Any] | None:
        return envelope_params(params, stateless=self.stateless, client_info=self.client_info)

    def _limit(self, options: CallOptions) -> int:
        """A read's result may be large; any other answer is decoded whole (~34x its size): the small bound."""
        return self.max_event_bytes if options.read_result else self.max_answer_bytes

    def _raise_for_status(self, response: httpx.Response, method: str) -> None:
        raise_for_status(response, method, self.url, in_session=self.session_id is not None and not self.stateless)

    def _read_body(self, response: httpx.Response, method: str, deadline: Deadline | None, *,
                   read_result: bool) -> bytes:
        """The whole body, by the deadline (checked per chunk: a body trickled within the HTTP
        timeout cannot outlive it), within the bound an SSE event of the same answer has: a read's
        result ``max_event_bytes``, any other answer ``max_answer_bytes``."""
        limit = self.max_event_bytes if read_result else self.max_answer_bytes
        too_large = body_too_large if read_result else BosAnswerTooLarge
        length = declared_length(response)
        if length is not None and length > limit:
            raise too_large(method, limit)
        try:
            body = bytearray()
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > limit:
                    raise too_large(method, limit)
                if deadline is not None and deadline.reached():
                    raise deadline.error(method)
            return bytes(body)
        except httpx.HTTPError as exc:
            if self.cancelled.is_set():
                raise BosReadCancelled(f"{method} was cancelled.") from exc
            if deadline is not None and deadline.passed():
                raise deadline.error(method) from exc
            raise body_read_failed(method, exc, self.timeout) from exc

    def _decode_json(self, body: bytes, method: str) -> Any:
        try:
            return loads(body)
        except ValueError:
            raise BosProtocolError(
                f"BOS answered {method} with a body that is not valid JSON: {excerpt(body)!r}"
            ) from None


def within(seconds: float, deadline: Deadline | None) -> float:
    """``seconds`` (an HTTP timeout, a stream's idle limit), or what is left of the deadline if less."""
    return seconds if deadline is None else max(0.001, min(seconds, deadline.remaining()))


def set_read_timeout(response: httpx.Response, seconds: float) -> None:
    """Set the per-read timeout of a response's body, before its first byte is read.

    httpx times each socket read with the request's ``timeout`` extension, which httpcore takes
    when the body is first iterated: the response headers waited for the HTTP timeout, the open
    stream's reads use this one. (MockTransport responses have no timeouts to set.)
    """
    timeouts = response.request.extensions.get("timeout")
    if isinstance(timeouts, dict):
        timeouts["read"] = seconds

