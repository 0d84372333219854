"""One HTTP exchange of an :class:`~.session.McpSession`: a request sent, its answer read.

:class:`HttpExchange` is the part of the session that talks HTTP: it builds the POST of one
JSON-RPC message (headers and ``_meta`` per era, timeouts within the operation's deadline), sends
it, maps the status and Content-Type before anything is parsed (:mod:`.http_status`), reads a
JSON body (bounded, by the deadline) or hands an event stream to :mod:`.event_stream`, and
reopens a dropped stream with ``GET`` + ``Last-Event-ID``. It keeps the in-flight response that
``cancel()`` aborts. What the session does with the answers (era negotiation, retries and the
re-initialisation of a forgotten session, the public calls) stays in :mod:`.session`, which
inherits this class and owns the state declared here.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from airflow_provider_bos.exceptions import (
    BosAnswerTooLarge,
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
from airflow_provider_bos.mcp.source_results import SourceResultsTracker
from airflow_provider_bos.models import PROTOCOL_2026

__all__ = ["HttpExchange", "Reply", "set_read_timeout", "observations_of", "DEFAULT_MAX_ANSWER_BYTES"]

#: The bound of every answer held and decoded whole: the handshake, tools/list, the contexts, a
#: plain call. A JSON answer of tiny objects decodes to about 34 times its size, so this stays a
#: few MiB whatever ``max_event_bytes`` (the bound of a federated read's result, which is scanned
#: record by record) allows.
DEFAULT_MAX_ANSWER_BYTES = 4 * 1024 * 1024


@dataclass
class Reply:
    message: Any  # the decoded JSON-RPC response object (None when ``stream`` is set)
    request_id: str
    streamed: bool  # the server answered with text/event-stream
    raw: bytes | None = None  # the message's JSON text, when the caller streams records
    stream: FinalFrameStream | JsonBodyFrame | None = None  # the final frame, still arriving (owns the response)


class HttpExchange:
    """The HTTP half of a session (see the module docstring); the session sets every attribute."""

    url: str
    timeout: float
    stream_idle_timeout: float
    retry: RetryPolicy
    max_event_bytes: int
    max_answer_bytes: int
    stream_threshold_bytes: int
    client_info: dict[str, Any]
    protocol_version: str | None
    _session_id: str | None
    _auth: httpx.Auth | None
    _client: httpx.Client
    _ids: IdGenerator
    _lock: threading.Lock
    _inflight: httpx.Response | None
    _cancel: threading.Event
    _deadline: Deadline | None
    _reconnect: Reconnect

    @property
    def stateless(self) -> bool:
        """True when speaking the 2026-07-28 stateless protocol."""
        return self.protocol_version == PROTOCOL_2026

    def _sleep(self, seconds: float) -> None:
        if self._cancel.wait(seconds):
            raise BosReadCancelled("The request was cancelled while waiting to retry.")

    def _headers(self, method: str, params: Mapping[str, Any] | None) -> dict[str, str]:
        return request_headers(method, params, protocol_version=self.protocol_version, session_id=self._session_id)

    def _envelope_params(self, params: Mapping[str, Any] | None) -> dict[str, Any] | None:
        return envelope_params(params, stateless=self.stateless, client_info=self.client_info)

    def _auth_kwargs(self) -> dict[str, Any]:
        return {"auth": self._auth} if self._auth is not None else {}

    def _timeout(self, deadline: Deadline | None) -> httpx.Timeout:
        limit = self.timeout
        if deadline is not None:
            limit = max(0.001, min(limit, deadline.remaining()))
        return httpx.Timeout(limit)

    def _stream_read_timeout(self, deadline: Deadline | None) -> float:
        """The idle limit between bytes of an open stream: the stream idle timeout, within the deadline."""
        if deadline is None:
            return self.stream_idle_timeout
        return max(0.001, min(self.stream_idle_timeout, deadline.remaining()))

    def _notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        body = notification_envelope(method, self._envelope_params(params))
        deadline = self._deadline

        def send() -> None:
            if deadline is not None and deadline.reached():
                raise deadline.error(method)
            request = self._client.build_request(
                "POST", self.url, content=dumps(body), headers=self._headers(method, params),
                timeout=self._timeout(deadline),
            )
            response = self._send(request, method)
            try:
                if response.status_code in (200, 202, 204):
                    return
                self._raise_for_status(response, method)
            finally:
                response.close()

        run_with_retries(send, self.retry, deadline=deadline.at if deadline is not None else None,
                         sleep=self._sleep, describe=method)

    def _send(self, request: httpx.Request, method: str) -> httpx.Response:
        """Send and return the streaming response; failures before any response byte are retryable."""
        if self._cancel.is_set():
            raise BosReadCancelled(f"{method} was cancelled before it was sent.")
        try:
            return self._client.send(request, stream=True, **self._auth_kwargs())
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

    def _attempt(self, method: str, params: dict[str, Any] | None, options: CallOptions) -> Reply:
        deadline, make_consumer, final_style = options.deadline, options.make_consumer, options.final_style
        # Only a read's result may be large; anything else is held and decoded whole (a JSON
        # answer of tiny objects decodes to ~34x its size), so it gets the small bound.
        read_result = options.read_result
        limit = self.max_event_bytes if read_result else self.max_answer_bytes
        if deadline is not None and deadline.reached():
            raise BosDeadlineExceeded(
                f"The {method} deadline of {deadline.seconds}s passed before the request was sent."
            )
        request_id = self._ids.next()
        envelope = request_envelope(request_id, method, self._envelope_params(params))
        request = self._client.build_request(
            "POST", self.url, content=dumps(envelope), headers=self._headers(method, params),
            timeout=self._timeout(deadline),
        )
        consumer = make_consumer(request_id) if make_consumer is not None else None
        try:
            response = self._send(request, method)
        except BosTransportError as exc:
            if deadline is not None and deadline.passed():
                raise deadline.error(method) from exc
            raise
        with self._lock:
            self._inflight = response
        handed_over = False
        try:
            if self._cancel.is_set():
                abort(response)
                raise BosReadCancelled(f"{method} was cancelled.")
            self._raise_for_status(response, method)
            if method == "initialize":
                session_id = response.headers.get("mcp-session-id")
                if session_id:
                    self._session_id = session_id
            content_type = media_type(response)
            if content_type == "application/json":
                try:
                    if final_style is not None:
                        length = declared_length(response)
                        if length is None or length > self.stream_threshold_bytes:  # scanned as it arrives
                            call = StreamedCall(method, request_id, deadline, observations_of(consumer), self._cancel)
                            frame = JsonBodyFrame(response, call, final_style, max_event_bytes=limit,
                                                  max_whole_bytes=self.max_answer_bytes,
                                                  release=self._release, read_timeout=self.timeout)
                            body = frame.start()
                            if body is None:
                                handed_over = True
                                return Reply(None, request_id, streamed=False, stream=frame)
                        else:
                            body = self._read_body(response, method, deadline, read_result=read_result)
                        return Reply(self._decode_json(body, method), request_id, streamed=False, raw=body)
                    body = self._read_body(response, method, deadline, read_result=read_result)
                    return Reply(self._decode_json(body, method), request_id, streamed=False)
                except BosIncompleteStreamError as exc:
                    if deadline is not None and deadline.passed() and not isinstance(exc, BosReadCancelled):
                        raise deadline.error(method) from exc
                    raise
            if content_type == "text/event-stream":
                set_read_timeout(response, self._stream_read_timeout(deadline))
                call = StreamedCall(method, request_id, deadline, observations_of(consumer), self._cancel,
                                    idle_timeout=self.stream_idle_timeout)
                events = ResponseEvents(response, call, consumer, final_style=final_style,
                                        max_event_bytes=limit,
                                        stream_threshold=self.stream_threshold_bytes, reconnect=self._reconnect)
                try:
                    try:
                        start = events.until_final()
                    except BosEventTooLarge:
                        if read_result:
                            raise
                        raise BosAnswerTooLarge(method, limit) from None
                    if start.scanner is not None:
                        handed_over = True
                        stream = FinalFrameStream(events, start.scanner, finished=start.finished)
                        return Reply(None, request_id, streamed=True, stream=stream)
                    return Reply(start.message, request_id, streamed=True, raw=start.raw)
                finally:
                    if not handed_over:
                        events.close()
            raise BosHttpError(
                f"BOS answered {method} with an unexpected content type",
                status_code=response.status_code,
                content_type=response.headers.get("content-type"),
                body_excerpt=error_excerpt(response),
                url=self.url,
            )
        finally:
            if not handed_over:
                with self._lock:
                    self._inflight = None
                response.close()

    def _raise_for_status(self, response: httpx.Response, method: str) -> None:
        raise_for_status(response, method, self.url, in_session=self._session_id is not None and not self.stateless)

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
            if self._cancel.is_set():
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

    def _release(self, response: httpx.Response) -> None:
        """A handed-over response is done with: it is no longer the in-flight one, and is closed."""
        with self._lock:
            if self._inflight is response:
                self._inflight = None
        response.close()

    def _reopen_stream(self, last_event_id: str, call: StreamedCall) -> httpx.Response:
        """Resume a dropped response stream: ``GET`` + ``Last-Event-ID`` (MCP 2025-11-25)."""
        what = f"the GET resuming {call.method}"
        headers = self._headers(call.method, None)
        headers.pop("Content-Type", None)
        headers["Accept"] = "text/event-stream"
        headers["Last-Event-ID"] = last_event_id
        request = self._client.build_request("GET", self.url, headers=headers, timeout=self._timeout(call.deadline))
        response = self._send(request, what)
        with self._lock:
            self._inflight = response
        status = response.status_code
        if self._cancel.is_set():
            self._release(response)
            raise call.cancelled()
        if status == 200 and media_type(response) == "text/event-stream":
            set_read_timeout(response, self._stream_read_timeout(call.deadline))
            return response
        detail = error_excerpt(response)
        self._release(response)
        if 400 <= status < 500 and status not in (408, 429):
            raise ResumeRefused(f"HTTP {status}" + (f": {detail}" if detail else ""))
        if status == 200:
            raise ResumeRefused(f"its answer is {response.headers.get('content-type')!r}, not an event stream")
        raise BosTransportError(f"BOS answered {what} with HTTP {status}.")


def set_read_timeout(response: httpx.Response, seconds: float) -> None:
    """Set the per-read timeout of a response's body, before its first byte is read.

    httpx times each socket read with the request's ``timeout`` extension, which httpcore takes
    when the body is first iterated: the response headers waited for the HTTP timeout, the open
    stream's reads use this one. (MockTransport responses have no timeouts to set.)
    """
    timeouts = response.request.extensions.get("timeout")
    if isinstance(timeouts, dict):
        timeouts["read"] = seconds


def observations_of(consumer: Consumer | None) -> SourceResultsTracker | None:
    return getattr(consumer, "tracker", None)
