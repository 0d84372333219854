"""An MCP client session over Streamable HTTP on a sync :class:`httpx.Client`.

Speaks both protocol eras:

- **2025-11-25** (handshake): ``initialize`` + ``notifications/initialized``; the
  ``Mcp-Session-Id`` and ``MCP-Protocol-Version`` headers on every later request; an HTTP 404 on
  a known session means the server forgot it, so the session is re-initialised once and the
  request retried; ``DELETE`` ends the session on :meth:`McpSession.close`.
- **2026-07-28** (stateless): ``server/discover``; every request carries
  ``params._meta`` protocolVersion / clientInfo / clientCapabilities and the
  ``MCP-Protocol-Version``, ``Mcp-Method`` and (for ``tools/call``, ``resources/read``,
  ``prompts/get``) ``Mcp-Name`` headers, the latter base64-wrapped when not plain ASCII.

``era="auto"`` probes ``server/discover`` and falls back to ``initialize`` when the answer is
not positive evidence of a stateless server (the official SDK's rule): any JSON-RPC error except
``-32022`` naming only stateless versions we do not speak; HTTP 400/404/405 without a JSON-RPC
body; or a discover result whose ``supportedVersions`` lacks 2026-07-28. Auth failures, 5xx
after retries and transport errors are not era verdicts: they propagate.

Every response is checked (status, then Content-Type) before anything is parsed. Federated
reads opt in to ``bos/source-results/v1`` per call and consume the event stream incrementally,
handing each validated notification to ``on_progress`` synchronously, in wire order.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from airflow_provider_bos import __version__
from airflow_provider_bos.exceptions import (
    BosAuthError,
    BosConfigurationError,
    BosDeadlineExceeded,
    BosHttpError,
    BosIncompleteStreamError,
    BosJsonRpcError,
    BosProtocolError,
    BosReadCancelled,
    BosResultError,
    BosRetryableHttpError,
    BosSessionExpired,
    BosTransportError,
    excerpt,
)
from airflow_provider_bos.mcp.jsonrpc import (
    CLIENT_CAPABILITIES_META_KEY,
    CLIENT_INFO_META_KEY,
    NAME_BEARING_METHODS,
    PROTOCOL_VERSION_META_KEY,
    UNSUPPORTED_PROTOCOL_VERSION,
    IdGenerator,
    encode_header_value,
    loads,
    notification_envelope,
    request_envelope,
    rpc_error,
)
from airflow_provider_bos.mcp.retry import RetryableTransportError, RetryPolicy, parse_retry_after, run_with_retries
from airflow_provider_bos.mcp.final_frame import DEFAULT_MAX_VALUE_BYTES, FinalFrameScanner, check_record
from airflow_provider_bos.mcp.page_records import decode_source_result
from airflow_provider_bos.mcp.source_results import (
    FinalFrameParser,
    FinalResult,
    SourceProgress,
    SourceResultsTracker,
    StreamingFinalResult,
    ToolStyle,
    _same_id,
)
from airflow_provider_bos.mcp.sse import DEFAULT_MAX_EVENT_BYTES, SseParser
from airflow_provider_bos.models import (
    PROTOCOL_2025,
    PROTOCOL_2026,
    SOURCE_RESULT_METHOD,
    SOURCE_RESULTS_EXTENSION,
    BosContext,
)

__all__ = ["McpSession", "RetryPolicy", "BosReadCancelled", "HANDSHAKE_VERSIONS"]

logger = logging.getLogger(__name__)

#: Handshake-era versions this client can speak (initialize may negotiate any of them).
HANDSHAKE_VERSIONS = (PROTOCOL_2025, "2025-06-18", "2025-03-26")
_ERAS = {"auto": "auto", "2025": PROTOCOL_2025, PROTOCOL_2025: PROTOCOL_2025, "2026": PROTOCOL_2026,
         PROTOCOL_2026: PROTOCOL_2026, "stateless": PROTOCOL_2026, "legacy": PROTOCOL_2025}
_ACCEPT = "application/json, text/event-stream"
_ERROR_BODY_LIMIT = 64 * 1024
#: Events larger than this are streamed (stream_records=True): their data goes to a
#: FinalFrameScanner as it arrives instead of being buffered. Notifications are far smaller.
DEFAULT_STREAM_THRESHOLD = 1024 * 1024

# Where a source-result notification names its method (the fast path's cue; anything else is
# still decoded in full, so the cue only has to be cheap, not exhaustive).
_SOURCE_RESULT_TOKEN = f'"{SOURCE_RESULT_METHOD}"'.encode("ascii")
_SOURCE_RESULT_TOKEN_WITHIN = 256


class _Consumer(Protocol):
    def __call__(self, params: Any) -> None: ...


class _ReadConsumer:
    """Feeds a read's notifications to its tracker, then to ``on_progress`` (same thread, wire order)."""

    def __init__(self, tracker: SourceResultsTracker, on_progress: Callable[[SourceProgress], None] | None) -> None:
        self.tracker = tracker
        self._on_progress = on_progress

    def __call__(self, params: Any) -> None:
        progress = self.tracker.observe(params)
        if self._on_progress is not None:
            self._on_progress(progress)


@dataclass
class _Reply:
    message: Any  # the decoded JSON-RPC response object (None when ``stream`` is set)
    request_id: str
    streamed: bool  # the server answered with text/event-stream
    raw: bytes | None = None  # the message's JSON text, when the caller streams records
    stream: _FrameStream | None = None  # the final frame, still arriving (owns the response)


class _FrameRouter:
    """The SSE data sink of streamed events: one :class:`FinalFrameScanner` per event."""

    def __init__(self, tool_style: ToolStyle, max_value_bytes: int) -> None:
        self.tool_style = tool_style
        self.max_value_bytes = max_value_bytes
        self.current: FinalFrameScanner | None = None
        self.finished: list[FinalFrameScanner] = []
        self.records: list[Any] = []

    def open(self) -> _FrameRouter:
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


class _FrameStream:
    """Pulls the rest of a streamed final frame from the open response, record by record."""

    def __init__(
        self,
        session: McpSession,
        response: httpx.Response,
        chunks: Iterator[bytes],
        parser: SseParser,
        router: _FrameRouter,
        scanner: FinalFrameScanner,
        *,
        method: str,
        request_id: str,
        deadline: float | None,
        deadline_s: float | None,
        observations: SourceResultsTracker | None,
        finished: bool,
    ) -> None:
        self._session = session
        self._response = response
        self._chunks = chunks
        self._parser = parser
        self._router = router
        self.scanner = scanner
        self._method = method
        self.request_id = request_id
        self._deadline = deadline
        self._deadline_s = deadline_s
        self._observations = observations
        self._finished = finished
        self._closed = False

    def records(self) -> Iterator[Any]:
        session, router = self._session, self._router
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
                chunk = next(self._chunks, None)
                if chunk is None:
                    self._parser.close()
                    raise self._incomplete("the event stream ended")
                for event in self._parser.feed(chunk):
                    if event.streamed:
                        self._finished = True
                if session._cancel.is_set():
                    raise BosReadCancelled(f"{self._method} was cancelled; there is no result.",
                                           observations=self._observations)
                if self._deadline is not None and time.monotonic() >= self._deadline:
                    raise _deadline_error(self._method, self._deadline_s, self._observations)
        except (httpx.TransportError, httpx.StreamError) as exc:
            if session._cancel.is_set():
                raise BosReadCancelled(f"{self._method} was cancelled; there is no result.",
                                       observations=self._observations) from exc
            if _past(self._deadline):
                raise _deadline_error(self._method, self._deadline_s, self._observations) from exc
            raise self._incomplete(f"the connection failed ({type(exc).__name__})") from exc
        finally:
            self.close()

    def _incomplete(self, why: str) -> BosIncompleteStreamError:
        return BosIncompleteStreamError(
            f"{why.capitalize()} inside the final response to {self._method}; there is no confirmed "
            "result and the records received are not authoritative. Re-run the read.",
            observations=self._observations,
        )

    def skeleton(self) -> dict[str, Any]:
        return self.scanner.finish()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        session = self._session
        with session._lock:
            if session._inflight is self._response:
                session._inflight = None
        self._response.close()


class _NotStateless(Exception):
    """Internal: the discover probe says the server is not a 2026-07-28 server."""


class McpSession:
    """A JSON-RPC client for one BOS MCP endpoint. Use as a context manager or call :meth:`close`."""

    def __init__(
        self,
        url: str,
        *,
        auth: httpx.Auth | None = None,
        era: str = "auto",
        http_client: httpx.Client | None = None,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        client_name: str = "airflow-provider-bos",
        stream_threshold_bytes: int = DEFAULT_STREAM_THRESHOLD,
    ) -> None:
        if era not in _ERAS:
            raise BosConfigurationError(
                f"Unknown MCP era {era!r}; use 'auto', '{PROTOCOL_2025}' or '{PROTOCOL_2026}'."
            )
        self.url = url
        self.era = _ERAS[era]
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self.max_event_bytes = max_event_bytes
        self.stream_threshold_bytes = stream_threshold_bytes
        self.client_info = {"name": client_name, "version": __version__}
        self._auth = auth
        self._own_client = http_client is None
        self._client = http_client or httpx.Client(timeout=timeout, follow_redirects=False)
        self._ids = IdGenerator()
        # Negotiated state.
        self.protocol_version: str | None = None
        self.server_capabilities: dict[str, Any] = {}
        self.server_info: dict[str, Any] | None = None
        self.instructions: str | None = None
        self._session_id: str | None = None
        self._connected = False
        self._closed = False
        self._tool_names: set[str] | None = None
        # Cancellation: cancel() may run on another thread.
        self._lock = threading.Lock()
        self._inflight: httpx.Response | None = None
        self._cancel = threading.Event()
        self._op_depth = 0

    def __repr__(self) -> str:
        return f"McpSession(url={self.url!r}, era={self.era!r}, protocol_version={self.protocol_version!r})"

    # --- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> McpSession:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def stateless(self) -> bool:
        """True when speaking the 2026-07-28 stateless protocol."""
        return self.protocol_version == PROTOCOL_2026

    @property
    def session_id(self) -> str | None:
        return self._session_id

    @property
    def source_results(self) -> dict[str, Any] | None:
        """The server's advertised ``bos/source-results/v1`` capability object, if any."""
        experimental = self.server_capabilities.get("experimental")
        if isinstance(experimental, Mapping):
            value = experimental.get(SOURCE_RESULTS_EXTENSION)
            if isinstance(value, Mapping):
                return dict(value)
        return None

    def connect(self) -> None:
        """Negotiate the era: ``initialize`` + ``initialized``, or ``server/discover``. Idempotent."""
        if self._connected:
            return
        if self._closed:
            raise BosConfigurationError("This MCP session is closed; create a new one.")
        if self.era == PROTOCOL_2026:
            self._discover(probe=False)
        elif self.era == PROTOCOL_2025:
            self._initialize()
        else:
            try:
                self._discover(probe=True)
            except _NotStateless as reason:
                logger.debug("server/discover probe: %s; using the initialize handshake.", reason)
                self._initialize()
        self._connected = True

    def close(self) -> None:
        """End the session (``DELETE`` in the 2025 era) and release the HTTP client if we own it."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._session_id is not None and not self.stateless:
                headers = {"Mcp-Session-Id": self._session_id}
                if self.protocol_version:
                    headers["MCP-Protocol-Version"] = self.protocol_version
                response = self._client.delete(self.url, headers=headers, timeout=min(self.timeout, 10.0),
                                               **self._auth_kwargs())
                logger.debug("MCP session DELETE answered HTTP %s.", response.status_code)
        except (httpx.HTTPError, BosAuthError) as exc:  # best effort: the server expires sessions anyway
            logger.debug("MCP session DELETE failed: %s", type(exc).__name__)
        finally:
            self._session_id = None
            if self._own_client:
                self._client.close()

    def cancel(self) -> None:
        """Abort the in-flight request from any thread; the server sees the client disconnect.

        The reading thread then raises :class:`BosReadCancelled`. A no-op when nothing is running.
        """
        self._cancel.set()
        with self._lock:
            response = self._inflight
        if response is not None:
            _abort(response)

    # --- requests ------------------------------------------------------------------------------

    def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send one JSON-RPC request and return its ``result`` (errors raise :class:`BosJsonRpcError`)."""
        with self._operation():
            self.connect()
            return self._request(method, params)

    def list_tools(self) -> list[dict[str, Any]]:
        """All tools, following ``nextCursor`` pagination."""
        with self._operation():
            self.connect()
            return self._list_tools(None)

    def call_tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """``tools/call`` without streaming; returns the plain ``CallToolResult`` object."""
        with self._operation():
            self.connect()
            return self._request("tools/call", {"name": name, "arguments": arguments})

    def read_resource(self, uri: str) -> dict[str, Any]:
        with self._operation():
            self.connect()
            return self._request("resources/read", {"uri": uri})

    def get_contexts(self) -> list[BosContext]:
        """The authorized BOS contexts (``bos_get_context``)."""
        with self._operation():
            self.connect()
            return self._get_contexts(None)

    def list_context_tools(self, context_handle: str) -> dict[str, Any]:
        """The operations and resources of one context (``bos_list_context_tools``)."""
        with self._operation():
            self.connect()
            result = self._request(
                "tools/call", {"name": "bos_list_context_tools", "arguments": {"context_handle": context_handle}}
            )
            return _structured(result, "bos_list_context_tools")

    def federated_read(
        self,
        tool_name: str,
        arguments: dict[str, Any],
        *,
        context_handle: str | None = None,
        via: str = "auto",
        stream: bool = True,
        on_progress: Callable[[SourceProgress], None] | None = None,
        deadline_s: float | None = None,
        stream_records: bool = False,
    ) -> FinalResult:
        """Run a federated read and return its authoritative :class:`FinalResult`.

        ``via="direct"`` calls ``tool_name`` itself; ``"execute"`` wraps it in ``bos_execute``
        (``context_handle`` defaults to the default context); ``"auto"`` is direct when
        ``tool_name`` is in ``tools/list``. With ``stream=True`` (and the server advertising the
        extension) the call opts in to ``bos/source-results/v1``; each notification is validated
        and handed to ``on_progress`` in wire order; an exception from the callback ends the read.
        ``deadline_s`` bounds the whole operation (retries and keepalive-only stalls included).

        ``stream_records=True``: return as soon as the final frame starts, with a
        :class:`StreamingFinalResult` whose ``records`` is a one-shot iterator of plain dicts
        pulled from the still-open response in constant memory; end-of-frame attributes
        (completeness, metadata, ...) are available once it is exhausted; EOF or a connection
        failure mid-frame raises :class:`BosIncompleteStreamError` from the iterator. Consume or
        close the result before the next call on this session (:meth:`cancel` still works). A
        JSON or small SSE answer behaves the same (its records are iterated from memory).
        """
        if via not in ("auto", "direct", "execute"):
            raise BosConfigurationError(f"via must be 'auto', 'direct' or 'execute', not {via!r}.")
        deadline = time.monotonic() + deadline_s if deadline_s is not None else None
        with self._operation():
            self.connect()
            style: ToolStyle
            if via == "auto":
                style = "direct" if tool_name in self._tool_name_set(deadline) else "execute"
            else:
                style = "direct" if via == "direct" else "execute"
            if style == "execute":
                handle = context_handle or self._default_context_handle(deadline)
                params: dict[str, Any] = {
                    "name": "bos_execute",
                    "arguments": {"context_handle": handle, "tool_name": tool_name, "arguments": arguments},
                }
            else:
                params = {"name": tool_name, "arguments": arguments}
            opt_in = stream and self.source_results is not None
            if stream and not opt_in:
                logger.info("The server does not advertise %s; reading without streaming.", SOURCE_RESULTS_EXTENSION)
            if opt_in:
                params["_meta"] = {CLIENT_CAPABILITIES_META_KEY: {"experimental": {SOURCE_RESULTS_EXTENSION: {}}}}

            consumers: list[_ReadConsumer] = []

            def make_consumer(request_id: str) -> _ReadConsumer:
                consumers.append(_ReadConsumer(SourceResultsTracker(request_id), on_progress))
                return consumers[-1]

            reply = self._call(
                "tools/call",
                params,
                deadline=deadline,
                make_consumer=make_consumer,
                deadline_s=deadline_s,
                final_style=style if stream_records else None,
            )
            tracker = consumers[-1].tracker if consumers else SourceResultsTracker(reply.request_id)
            parser = FinalFrameParser(
                reply.request_id, tool_style=style, observations=tracker, streamed=reply.streamed and opt_in
            )
            if stream_records:
                return self._streaming_result(reply, parser)
            return parser.parse_message(reply.message)

    def _streaming_result(self, reply: _Reply, parser: FinalFrameParser) -> StreamingFinalResult:
        """The deferred result of ``federated_read(stream_records=True)``."""
        stream = reply.stream
        if stream is None:
            # The whole frame is here (JSON body or a small SSE event): scan it from memory.
            message = reply.message
            if isinstance(message, Mapping) and "error" in message:
                parser.parse_message(message)  # raises the typed JSON-RPC error at once
            raw = reply.raw if reply.raw is not None else _dumps(message)
            scanner = FinalFrameScanner(tool_style=parser.tool_style, max_value_bytes=len(raw) + 1)
            records = scanner.feed(raw)
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

        def finish_stream(count: int) -> FinalResult:
            return parser.parse_message(stream.skeleton(), record_count=count)

        return StreamingFinalResult(
            request_id=parser.request_id, tool_style=parser.tool_style, streamed=parser.streamed,
            observations=parser.observations, records=stream.records(), finish=finish_stream,
            on_close=stream.close, scanner=stream.scanner,
        )

    # --- internals: operations -----------------------------------------------------------------

    @contextmanager
    def _operation(self) -> Iterator[None]:
        # cancel() aims at the running operation: a cancel left over from an idle moment is dropped.
        if self._op_depth == 0:
            self._cancel.clear()
        self._op_depth += 1
        try:
            yield
        finally:
            self._op_depth -= 1

    def _request(self, method: str, params: dict[str, Any] | None, deadline: float | None = None) -> dict[str, Any]:
        reply = self._call(method, params, deadline=deadline)
        message = reply.message
        if not isinstance(message, Mapping):
            raise BosProtocolError(f"The response to {method} is not a JSON object.")
        if "error" in message and message.get("id") in (None, reply.request_id):
            # A server that could not read our id answers with id null (JSON-RPC 2.0 §5).
            raise rpc_error(message["error"], method)
        if message.get("id") != reply.request_id:
            raise BosResultError(
                f"The response id {message.get('id')!r} does not match the request id of {method}."
            )
        result = message.get("result")
        if not isinstance(result, Mapping):
            raise BosProtocolError(f"The response to {method} has no result object.")
        result_type = result.get("resultType")
        if result_type is not None and result_type != "complete":
            raise BosProtocolError(
                f"The server answered {method} with resultType {result_type!r}; "
                "this client only handles complete results."
            )
        return dict(result)

    def _list_tools(self, deadline: float | None) -> list[dict[str, Any]]:
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        seen: set[str] = set()
        while True:
            result = self._request("tools/list", {"cursor": cursor} if cursor else None, deadline)
            page = result.get("tools")
            if not isinstance(page, list):
                raise BosProtocolError("tools/list returned no tools array.")
            tools.extend(t for t in page if isinstance(t, Mapping))
            cursor = result.get("nextCursor")
            if not cursor:
                break
            if cursor in seen:
                raise BosProtocolError("tools/list returned the same cursor twice.")
            seen.add(cursor)
        self._tool_names = {t["name"] for t in tools if isinstance(t.get("name"), str)}
        return tools

    def _tool_name_set(self, deadline: float | None) -> set[str]:
        if self._tool_names is None:
            self._list_tools(deadline)
        assert self._tool_names is not None
        return self._tool_names

    def _get_contexts(self, deadline: float | None) -> list[BosContext]:
        result = self._request("tools/call", {"name": "bos_get_context", "arguments": {}}, deadline)
        structured = _structured(result, "bos_get_context")
        contexts = structured.get("contexts")
        if not isinstance(contexts, list):
            raise BosResultError("bos_get_context returned no contexts array.")
        try:
            return [BosContext.model_validate(c) for c in contexts]
        except ValueError as exc:
            raise BosResultError(f"bos_get_context returned a malformed context: {excerpt(str(exc))}") from None

    def _default_context_handle(self, deadline: float | None) -> str:
        contexts = self._get_contexts(deadline)
        defaults = [c for c in contexts if c.is_default]
        if defaults:
            return defaults[0].context_handle
        if len(contexts) == 1:
            return contexts[0].context_handle
        raise BosConfigurationError(
            f"No default BOS context among {len(contexts)} authorized contexts; pass context_handle."
        )

    # --- internals: era negotiation ------------------------------------------------------------

    def _discover(self, *, probe: bool) -> None:
        self.protocol_version = PROTOCOL_2026  # the envelope and headers of the probe
        try:
            result = self._request("server/discover", None)
        except BosJsonRpcError as exc:
            self.protocol_version = None
            if not probe:
                raise
            if exc.code == UNSUPPORTED_PROTOCOL_VERSION:
                supported = exc.data.get("supported") if isinstance(exc.data, Mapping) else None
                if isinstance(supported, list) and not any(v in HANDSHAKE_VERSIONS for v in supported):
                    raise  # a stateless-only server that speaks none of our versions
            raise _NotStateless(f"JSON-RPC error {exc.code}") from None
        except BosHttpError as exc:
            self.protocol_version = None
            if probe and not isinstance(exc, BosRetryableHttpError) and exc.status_code in (400, 404, 405):
                raise _NotStateless(f"HTTP {exc.status_code}") from None
            raise
        except BaseException:
            self.protocol_version = None
            raise
        supported = result.get("supportedVersions")
        if not isinstance(supported, list) or PROTOCOL_2026 not in supported:
            self.protocol_version = None
            if probe:
                raise _NotStateless(f"supportedVersions {supported!r}")
            raise BosProtocolError(
                f"The server does not support MCP {PROTOCOL_2026} (supportedVersions: {supported!r}); "
                f"use era '{PROTOCOL_2025}' or 'auto'."
            )
        capabilities = result.get("capabilities")
        self.server_capabilities = dict(capabilities) if isinstance(capabilities, Mapping) else {}
        info = result.get("serverInfo")
        if info is None and isinstance(result.get("_meta"), Mapping):
            info = result["_meta"].get("io.modelcontextprotocol/serverInfo")
        self.server_info = dict(info) if isinstance(info, Mapping) else None
        self.instructions = result.get("instructions") if isinstance(result.get("instructions"), str) else None
        logger.debug("MCP: stateless %s via server/discover.", PROTOCOL_2026)

    def _initialize(self) -> None:
        self.protocol_version = None
        self._session_id = None
        params = {"protocolVersion": PROTOCOL_2025, "capabilities": {}, "clientInfo": self.client_info}
        result = self._request("initialize", params)
        version = result.get("protocolVersion")
        if version not in HANDSHAKE_VERSIONS:
            raise BosProtocolError(
                f"The server chose MCP protocol version {version!r}, which this client does not speak "
                f"(it speaks {', '.join(HANDSHAKE_VERSIONS)} and {PROTOCOL_2026})."
            )
        self.protocol_version = version
        capabilities = result.get("capabilities")
        self.server_capabilities = dict(capabilities) if isinstance(capabilities, Mapping) else {}
        info = result.get("serverInfo")
        self.server_info = dict(info) if isinstance(info, Mapping) else None
        self.instructions = result.get("instructions") if isinstance(result.get("instructions"), str) else None
        self._notify("notifications/initialized")
        logger.debug("MCP: initialized %s (session id %s).", version, "set" if self._session_id else "none")

    # --- internals: HTTP -----------------------------------------------------------------------

    def _call(
        self,
        method: str,
        params: dict[str, Any] | None,
        *,
        deadline: float | None = None,
        make_consumer: Callable[[str], _Consumer] | None = None,
        deadline_s: float | None = None,
        final_style: ToolStyle | None = None,
    ) -> _Reply:
        """One request with retries; a stale 2025 session is re-initialised once."""

        def attempt() -> _Reply:
            return run_with_retries(
                lambda: self._attempt(method, params, deadline, make_consumer, deadline_s, final_style),
                self.retry,
                deadline=deadline,
                sleep=self._sleep,
                describe=method,
            )

        try:
            return attempt()
        except BosSessionExpired:
            if method == "initialize":
                raise
            logger.info("MCP session expired (HTTP 404); re-initialising once.")
            self._initialize()
            return attempt()

    def _sleep(self, seconds: float) -> None:
        if self._cancel.wait(seconds):
            raise BosReadCancelled("The request was cancelled while waiting to retry.")

    def _headers(self, method: str, params: Mapping[str, Any] | None) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": _ACCEPT}
        if self.stateless:
            headers["MCP-Protocol-Version"] = PROTOCOL_2026
            headers["Mcp-Method"] = method
            key = NAME_BEARING_METHODS.get(method)
            if key and params is not None and isinstance(params.get(key), str):
                headers["Mcp-Name"] = encode_header_value(params[key])
        elif self.protocol_version is not None:
            headers["MCP-Protocol-Version"] = self.protocol_version
            if self._session_id is not None:
                headers["Mcp-Session-Id"] = self._session_id
        return headers

    def _envelope_params(self, params: Mapping[str, Any] | None) -> dict[str, Any] | None:
        if not self.stateless:
            return dict(params) if params is not None else None
        out = dict(params or {})
        meta = dict(out.get("_meta") or {})
        capabilities = dict(meta.get(CLIENT_CAPABILITIES_META_KEY) or {})
        meta[PROTOCOL_VERSION_META_KEY] = PROTOCOL_2026
        meta[CLIENT_INFO_META_KEY] = self.client_info
        meta[CLIENT_CAPABILITIES_META_KEY] = capabilities  # our normal capabilities are {} + any opt-in
        out["_meta"] = meta
        return out

    def _auth_kwargs(self) -> dict[str, Any]:
        return {"auth": self._auth} if self._auth is not None else {}

    def _timeout(self, deadline: float | None) -> httpx.Timeout:
        read = self.timeout
        if deadline is not None:
            read = max(0.001, min(read, deadline - time.monotonic()))
        return httpx.Timeout(self.timeout, read=read)

    def _notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        body = notification_envelope(method, self._envelope_params(params))

        def send() -> None:
            request = self._client.build_request(
                "POST", self.url, content=_dumps(body), headers=self._headers(method, params),
                timeout=self._timeout(None),
            )
            response = self._send(request, method)
            try:
                if response.status_code in (200, 202, 204):
                    return
                self._raise_for_status(response, method)
            finally:
                response.close()

        run_with_retries(send, self.retry, sleep=self._sleep, describe=method)

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
            raise BosTransportError(f"BOS did not answer {method} in time ({type(exc).__name__}).") from exc
        except httpx.TransportError as exc:
            raise BosTransportError(f"The request {method} to {self.url} failed ({type(exc).__name__}).") from exc

    def _attempt(
        self,
        method: str,
        params: dict[str, Any] | None,
        deadline: float | None,
        make_consumer: Callable[[str], _Consumer] | None,
        deadline_s: float | None,
        final_style: ToolStyle | None = None,
    ) -> _Reply:
        if deadline is not None and time.monotonic() >= deadline:
            raise BosDeadlineExceeded(f"The {method} deadline of {deadline_s}s passed before the request was sent.")
        request_id = self._ids.next()
        body = request_envelope(request_id, method, self._envelope_params(params))
        request = self._client.build_request(
            "POST", self.url, content=_dumps(body), headers=self._headers(method, params),
            timeout=self._timeout(deadline),
        )
        consumer = make_consumer(request_id) if make_consumer is not None else None
        try:
            response = self._send(request, method)
        except BosTransportError as exc:
            if _past(deadline):
                raise _deadline_error(method, deadline_s, None) from exc
            raise
        with self._lock:
            self._inflight = response
        handed_over = False
        try:
            if self._cancel.is_set():
                _abort(response)
                raise BosReadCancelled(f"{method} was cancelled.")
            self._raise_for_status(response, method)
            if method == "initialize":
                session_id = response.headers.get("mcp-session-id")
                if session_id:
                    self._session_id = session_id
            media_type = _media_type(response)
            if media_type == "application/json":
                try:
                    if final_style is not None:
                        body = self._read_body(response, method)
                        return _Reply(self._decode_json(body, method), request_id, streamed=False, raw=body)
                    return _Reply(self._read_json(response, method), request_id, streamed=False)
                except BosIncompleteStreamError as exc:
                    if _past(deadline) and not isinstance(exc, BosReadCancelled):
                        raise _deadline_error(method, deadline_s, None) from exc
                    raise
            if media_type == "text/event-stream":
                reply = self._read_stream(response, method, request_id, consumer, deadline, deadline_s, final_style)
                handed_over = reply.stream is not None
                return reply
            raise BosHttpError(
                f"BOS answered {method} with an unexpected content type",
                status_code=response.status_code,
                content_type=response.headers.get("content-type"),
                body_excerpt=_error_excerpt(response),
                url=self.url,
            )
        finally:
            if not handed_over:
                with self._lock:
                    self._inflight = None
                response.close()

    def _raise_for_status(self, response: httpx.Response, method: str) -> None:
        status = response.status_code
        if 200 <= status < 300:
            if status in (202, 204) and not method.startswith("notifications/"):
                raise BosProtocolError(f"BOS answered the request {method} with HTTP {status} and no response.")
            return
        if status == 401:
            challenge = response.headers.get("www-authenticate", "")
            error = _challenge_param(challenge, "error")
            raise BosAuthError(
                f"BOS rejected the credentials for {method} (HTTP 401"
                + (f", {error}" if error else "")
                + "). Check the connection's token or API key; an OAuth grant may need reconnecting."
            )
        if status == 403:
            error = _challenge_param(response.headers.get("www-authenticate", ""), "error")
            raise BosAuthError(
                f"BOS refused {method} (HTTP 403" + (f", {error}" if error else "") + "): the grant lacks access."
            )
        if status == 404 and self._session_id is not None and not self.stateless:
            raise BosSessionExpired(f"BOS no longer knows this MCP session (HTTP 404 on {method}).")
        if status in (429, 502, 503, 504):
            raise BosRetryableHttpError(
                f"BOS is busy or unavailable for {method}",
                retry_after=parse_retry_after(response.headers.get("retry-after")),
                status_code=status,
                content_type=response.headers.get("content-type"),
                body_excerpt=_error_excerpt(response),
                url=self.url,
            )
        body = _read_limited(response, _ERROR_BODY_LIMIT)
        if _media_type(response) == "application/json":
            try:
                message = loads(body)
            except ValueError:
                message = None
            if isinstance(message, Mapping) and isinstance(message.get("error"), Mapping):
                err = rpc_error(message["error"], method)
                err.http_status = status  # type: ignore[attr-defined]
                raise err
        raise BosHttpError(
            f"BOS answered {method} with an unexpected status",
            status_code=status,
            content_type=response.headers.get("content-type"),
            body_excerpt=excerpt(body) if body else None,
            url=self.url,
        )

    def _read_json(self, response: httpx.Response, method: str) -> Any:
        return self._decode_json(self._read_body(response, method), method)

    def _read_body(self, response: httpx.Response, method: str) -> bytes:
        try:
            return response.read()
        except httpx.HTTPError as exc:
            if self._cancel.is_set():
                raise BosReadCancelled(f"{method} was cancelled.") from exc
            raise BosIncompleteStreamError(
                f"The connection failed while reading the response to {method} ({type(exc).__name__})."
            ) from exc

    def _decode_json(self, body: bytes, method: str) -> Any:
        try:
            return loads(body)
        except ValueError:
            raise BosProtocolError(
                f"BOS answered {method} with a body that is not valid JSON: {excerpt(body)!r}"
            ) from None

    def _read_stream(
        self,
        response: httpx.Response,
        method: str,
        request_id: str,
        consumer: _Consumer | None,
        deadline: float | None,
        deadline_s: float | None,
        final_style: ToolStyle | None = None,
    ) -> _Reply:
        router: _FrameRouter | None = None
        if final_style is not None:
            router = _FrameRouter(final_style, min(self.max_event_bytes, DEFAULT_MAX_VALUE_BYTES))
            parser = SseParser(max_event_bytes=self.max_event_bytes, stream_threshold=self.stream_threshold_bytes,
                               open_stream=router.open, raw_data=True)
        else:
            parser = SseParser(max_event_bytes=self.max_event_bytes, raw_data=True)
        observations = _observations_of(consumer)
        chunks = response.iter_bytes()
        try:
            for chunk in chunks:
                for event in parser.feed(chunk):
                    if event.streamed:
                        assert router is not None
                        scanner = router.finished.pop(0)
                        if scanner.kind == "response":
                            return self._frame_reply(response, chunks, parser, router, scanner, method, request_id,
                                                     deadline, deadline_s, observations, finished=True)
                        message = self._dispatch_message(scanner.finish(), request_id, consumer)
                        if message is not None:
                            return _Reply(message, request_id, streamed=True)
                        continue
                    message = self._dispatch_event(event.event, event.data, request_id, consumer, parser.text)
                    if message is not None:
                        raw = event.data if router is not None else None
                        return _Reply(message, request_id, streamed=True, raw=raw)
                if router is not None and router.current is not None and router.current.kind == "response":
                    return self._frame_reply(response, chunks, parser, router, router.current, method, request_id,
                                             deadline, deadline_s, observations, finished=False)
                # Checked per chunk, so keepalive comments alone cannot outlive the deadline, and a
                # cancel() is honoured even where the socket could not be shut down under us.
                if self._cancel.is_set():
                    raise BosReadCancelled(f"{method} was cancelled; there is no result.", observations=observations)
                if deadline is not None and time.monotonic() >= deadline:
                    raise _deadline_error(method, deadline_s, observations)
            parser.close()
        except (httpx.TransportError, httpx.StreamError) as exc:
            if self._cancel.is_set():
                raise BosReadCancelled(f"{method} was cancelled; there is no result.", observations=observations) from exc
            if _past(deadline):
                raise _deadline_error(method, deadline_s, observations) from exc
            raise BosIncompleteStreamError(
                f"The connection failed before the final response to {method} ({type(exc).__name__}); "
                "there is no confirmed result. Re-run the read.",
                observations=observations,
            ) from exc
        if self._cancel.is_set():
            raise BosReadCancelled(f"{method} was cancelled; there is no result.", observations=observations)
        raise BosIncompleteStreamError(
            f"The event stream ended before the final response to {method}; there is no confirmed result. "
            "Re-run the read.",
            observations=observations,
        )

    def _frame_reply(
        self,
        response: httpx.Response,
        chunks: Iterator[bytes],
        parser: SseParser,
        router: _FrameRouter,
        scanner: FinalFrameScanner,
        method: str,
        request_id: str,
        deadline: float | None,
        deadline_s: float | None,
        observations: SourceResultsTracker | None,
        *,
        finished: bool,
    ) -> _Reply:
        """The final frame has started (its first key says it is a result): hand the response over."""
        if "id" in scanner.message and not _same_id(scanner.message["id"], request_id):
            raise BosResultError(
                f"The response id {scanner.message['id']!r} does not match the request id {request_id!r}; "
                "the server answered some other request."
            )
        stream = _FrameStream(
            self, response, chunks, parser, router, scanner, method=method, request_id=request_id,
            deadline=deadline, deadline_s=deadline_s, observations=observations, finished=finished,
        )
        return _Reply(None, request_id, streamed=True, stream=stream)

    def _dispatch_event(
        self, event: str, data: bytes, request_id: str, consumer: _Consumer | None,
        text: Callable[[bytes], str],
    ) -> Any:
        """Route one SSE event; return the final response message, or None to keep reading.

        ``data`` is the undecoded bytes (``SseParser(raw_data=True)``): a page is decoded straight
        from them; anything else goes through ``text`` (the parser's UTF-8 policy) first.
        """
        if event != "message":
            logger.debug("Ignoring SSE event of type %r.", event)
            return None
        if not data:  # a priming event (id + retry, SEP-1699): no message; the parser keeps its id
            return None
        if consumer is not None and _SOURCE_RESULT_TOKEN in data[:_SOURCE_RESULT_TOKEN_WITHIN]:
            # A page: checked and counted without decoding its records (None: the general path).
            params = decode_source_result(data, SOURCE_RESULT_METHOD)
            if params is not None:
                consumer(params)
                return None
        data = text(data)
        try:
            message = loads(data)
        except ValueError:
            raise BosProtocolError(f"An SSE message event is not valid JSON ({len(data)} characters).") from None
        return self._dispatch_message(message, request_id, consumer)

    def _dispatch_message(self, message: Any, request_id: str, consumer: _Consumer | None) -> Any:
        """Route one decoded SSE message; return the final response message, or None to keep reading."""
        if not isinstance(message, Mapping):
            raise BosProtocolError("An SSE message event is not a JSON-RPC object.")
        method = message.get("method")
        if isinstance(method, str):
            if "id" in message:
                logger.debug("Ignoring server-to-client request %r in the response stream.", method)
            elif method == SOURCE_RESULT_METHOD and consumer is not None:
                consumer(message.get("params"))
            else:
                logger.debug("Ignoring notification %r in the response stream.", method)
            return None
        if "id" in message and ("result" in message or "error" in message):
            if message["id"] != request_id:
                raise BosResultError(
                    f"The response id {message['id']!r} does not match the request id {request_id!r}; "
                    "the server answered some other request."
                )
            return message
        logger.debug("Ignoring an SSE message that is neither a request, notification nor response.")
        return None


# --- helpers ---------------------------------------------------------------------------------------


def _dumps(body: Any) -> bytes:
    try:
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise BosConfigurationError(f"The request cannot be sent as JSON: {exc}") from None


def _media_type(response: httpx.Response) -> str:
    return response.headers.get("content-type", "").split(";", 1)[0].strip().lower()


def _read_limited(response: httpx.Response, limit: int) -> bytes:
    """At most ``limit`` bytes of a (streaming) error body; never raises."""
    if response.is_stream_consumed:
        try:
            return response.content[:limit]
        except httpx.ResponseNotRead:
            return b""
    data = bytearray()
    try:
        for chunk in response.iter_bytes():
            data += chunk
            if len(data) >= limit:
                break
    except httpx.HTTPError:
        pass
    return bytes(data[:limit])


def _error_excerpt(response: httpx.Response) -> str | None:
    body = _read_limited(response, _ERROR_BODY_LIMIT)
    return excerpt(body) if body else None


def _challenge_param(challenge: str, name: str) -> str | None:
    """A parameter of a WWW-Authenticate challenge (e.g. ``error``); the header holds no secret."""
    match = re.search(rf'{name}="([^"]*)"', challenge) or re.search(rf"{name}=([^,\s]+)", challenge)
    return excerpt(match.group(1), 80) if match else None


def _abort(response: httpx.Response) -> None:
    """Close the socket under a response from any thread; a blocked read then returns at once."""
    stream = response.extensions.get("network_stream")
    sock = None
    if stream is not None:
        try:
            sock = stream.get_extra_info("socket")
        except Exception:  # noqa: BLE001 - transports differ; fall back below
            sock = None
    if isinstance(sock, socket.socket):
        try:
            sock.shutdown(socket.SHUT_RDWR)
            return
        except OSError:
            pass
    try:
        response.close()
    except Exception:  # noqa: BLE001 - best effort from a foreign thread
        logger.debug("Closing the in-flight response failed.", exc_info=True)


def _observations_of(consumer: _Consumer | None) -> SourceResultsTracker | None:
    return getattr(consumer, "tracker", None)


def _past(deadline: float | None) -> bool:
    # A read timeout sized to the deadline may wake a hair early: allow for timer slack.
    return deadline is not None and time.monotonic() >= deadline - 0.05


def _deadline_error(method: str, deadline_s: float | None, observations: Any) -> BosDeadlineExceeded:
    return BosDeadlineExceeded(
        f"{method} did not finish within its {deadline_s}s deadline; the call was cancelled.",
        observations=observations,
    )


def _structured(result: Mapping[str, Any], tool: str) -> dict[str, Any]:
    if result.get("isError"):
        text = None
        content = result.get("content")
        if isinstance(content, list) and content and isinstance(content[0], Mapping):
            text = content[0].get("text")
        raise BosResultError(f"{tool} failed" + (f": {excerpt(text)}" if isinstance(text, str) else "."))
    structured = result.get("structuredContent")
    if not isinstance(structured, Mapping):
        raise BosResultError(f"{tool} returned no structuredContent.")
    return dict(structured)
