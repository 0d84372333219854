"""An MCP client session over Streamable HTTP on a sync :class:`httpx.Client`: :class:`McpSession`.

The session holds one connection's state and runs its operations: era negotiation (the rules are
:mod:`.eras`'s: ``initialize`` or ``server/discover``, ``era="auto"`` probing, headers and
``_meta`` per era), requests with retries (:mod:`.retry`), the re-initialisation of a forgotten
2025 session (HTTP 404, once), cancellation from another thread, and the public calls. Every
operation runs under an overall :class:`~.calls.Deadline`: the read's ``deadline_s`` (default
:data:`DEFAULT_READ_DEADLINE`) or the session's ``operation_deadline_s`` (default
:data:`DEFAULT_OPERATION_DEADLINE`), which bounds every request it makes, the handshake, retries,
stream resumptions and keepalive-only streams included.

The HTTP is the :class:`~.exchange.HttpExchange` the session owns (as the MCP SDK's session its
transport), which sends a request, classifies its answer into a typed reply and holds the session
id, protocol version, in-flight response and cancel flag; an event stream is :mod:`.event_stream`'s,
a read's final frame :mod:`.final_stream`'s and :mod:`.final_frame`'s, its result :mod:`.final_result`'s.
Why this module is above ~500 lines: it is one object over one state (the era, the running
operation's deadline); the rules it applies live in the modules named here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import httpx

from airflow_provider_bos import __version__
from airflow_provider_bos.exceptions import (
    BosConfigurationError,
    BosHttpError,
    BosJsonRpcError,
    BosProtocolError,
    BosReadCancelled,
    BosResultError,
    BosSessionExpired,
    excerpt,
)
from airflow_provider_bos.mcp.calls import CallOptions, Deadline
from airflow_provider_bos.mcp.eras import (
    ERAS,
    HANDSHAKE_VERSIONS,
    NotStateless,
    ServerDescription,
    check_discovered,
    check_handshake_version,
    probe_verdict,
)
from airflow_provider_bos.mcp.exchange import DEFAULT_MAX_ANSWER_BYTES, HttpExchange, OpenFinalFrame, Reply
from airflow_provider_bos.mcp.final_result import FinalResult, FinalResultParser
from airflow_provider_bos.mcp.final_stream import memory_result, streaming_result
from airflow_provider_bos.mcp.interactive import input_required_error
from airflow_provider_bos.mcp.jsonrpc import CLIENT_CAPABILITIES_META_KEY, rpc_error
from airflow_provider_bos.mcp.reads import check_via, resolve_context_handle
from airflow_provider_bos.mcp.retry import RetryPolicy, run_with_retries
from airflow_provider_bos.mcp.source_results import SourceProgress, SourceResultsTracker, ToolStyle
from airflow_provider_bos.mcp.sse import DEFAULT_MAX_EVENT_BYTES
from airflow_provider_bos.models import PROTOCOL_2025, PROTOCOL_2026, SOURCE_RESULTS_EXTENSION, BosContext

__all__ = ["McpSession", "RetryPolicy", "BosReadCancelled", "HANDSHAKE_VERSIONS", "DEFAULT_MAX_ANSWER_BYTES"]

logger = logging.getLogger(__name__)

#: The longest silence between bytes of an open response stream, as the MCP SDK's
#: ``sse_read_timeout``: a server may assemble a large final response for a long while.
DEFAULT_STREAM_IDLE_TIMEOUT = 300.0

#: The overall deadline of every operation that is not a read (connect, call_tool, list_tools,
#: get_contexts, ...): retries, resumptions and keepalive-only streams included. A hostile or
#: stuck endpoint cannot hold a task longer.
DEFAULT_OPERATION_DEADLINE = 300.0
#: The deadline of a federated read given none (the operator's read_deadline default).
DEFAULT_READ_DEADLINE = 1800.0

#: Events larger than this are streamed (stream_records=True): their data goes to a
#: FrameRouter (:mod:`.final_stream`) as it arrives instead of being buffered. Notifications are
#: far smaller.
DEFAULT_STREAM_THRESHOLD = 1024 * 1024


class _ReadConsumer:
    """Feeds a read's notifications to its tracker, then to ``on_progress`` (same thread, wire order)."""

    def __init__(
        self, tracker: SourceResultsTracker, on_progress: Callable[[SourceProgress], None] | None,
        on_context: Callable[[str], None] | None = None,
    ) -> None:
        self.tracker = tracker
        self._on_progress = on_progress
        self._on_context = on_context  # told the first page's context (a direct read names none)

    def __call__(self, params: Any) -> None:
        progress = self.tracker.observe(params)
        if self._on_context is not None:
            context = params.get("context") if isinstance(params, dict) else None
            handle = context.get("context_handle") if isinstance(context, dict) else None
            if isinstance(handle, str) and handle:
                on_context, self._on_context = self._on_context, None
                on_context(handle)
        if self._on_progress is not None:
            self._on_progress(progress)


_PLAIN = CallOptions()


def _exchanged(name: str) -> Any:  # a read-only attribute of the session: its exchange's
    return property(lambda session: getattr(session._exchange, name), doc=f"The exchange's ``{name}``.")


class McpSession:
    """A JSON-RPC client for one BOS MCP endpoint. Use as a context manager or call :meth:`close`."""

    url: str = _exchanged("url")
    timeout: float = _exchanged("timeout")
    stream_idle_timeout: float = _exchanged("stream_idle_timeout")
    retry: RetryPolicy = _exchanged("retry")
    max_event_bytes: int = _exchanged("max_event_bytes")
    max_answer_bytes: int = _exchanged("max_answer_bytes")
    stream_threshold_bytes: int = _exchanged("stream_threshold_bytes")
    client_info: dict[str, Any] = _exchanged("client_info")
    protocol_version: str | None = _exchanged("protocol_version")
    session_id: str | None = _exchanged("session_id")
    stateless: bool = _exchanged("stateless")  # speaking the 2026-07-28 stateless protocol

    def __init__(
        self,
        url: str,
        *,
        auth: httpx.Auth | None = None,
        era: str = "auto",
        http_client: httpx.Client | None = None,
        timeout: float = 30.0,
        stream_idle_timeout: float = DEFAULT_STREAM_IDLE_TIMEOUT,
        retry: RetryPolicy | None = None,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        client_name: str = "airflow-provider-bos",
        stream_threshold_bytes: int = DEFAULT_STREAM_THRESHOLD,
        operation_deadline_s: float = DEFAULT_OPERATION_DEADLINE,
        max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
    ) -> None:
        if era not in ERAS:
            raise BosConfigurationError(f"Unknown MCP era {era!r}; use 'auto', '{PROTOCOL_2025}' or '{PROTOCOL_2026}'.")
        if not stream_idle_timeout > 0:
            raise BosConfigurationError(
                f"The stream idle timeout must be a positive number of seconds, not {stream_idle_timeout!r}.")
        if not 0 < operation_deadline_s < float("inf"):
            raise BosConfigurationError(
                f"The operation deadline must be a positive number of seconds, not {operation_deadline_s!r}.")
        self.operation_deadline_s = operation_deadline_s
        self.era = ERAS[era]
        self._exchange = HttpExchange(
            url, auth=auth, http_client=http_client, timeout=timeout, stream_idle_timeout=stream_idle_timeout,
            retry=retry or RetryPolicy(), max_event_bytes=max_event_bytes, max_answer_bytes=max_answer_bytes,
            stream_threshold_bytes=stream_threshold_bytes, client_info={"name": client_name, "version": __version__},
        )
        # Negotiated state (the protocol version and session id are the exchange's).
        self.server_capabilities: dict[str, Any] = {}
        self.server_info: dict[str, Any] | None = None
        self.instructions: str | None = None
        self._connected = False
        self._closed = False
        self._tool_names: set[str] | None = None
        self._op_depth = 0
        self._deadline: Deadline | None = None  # the running operation's

    def __repr__(self) -> str:
        return f"McpSession(url={self.url!r}, era={self.era!r}, protocol_version={self.protocol_version!r})"

    # --- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> McpSession:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

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
        with self._operation():
            self._negotiate()

    def _negotiate(self) -> None:
        if self.era == PROTOCOL_2026:
            self._discover(probe=False)
        elif self.era == PROTOCOL_2025:
            self._initialize()
        else:
            try:
                self._discover(probe=True)
            except NotStateless as reason:
                logger.debug("server/discover probe: %s; using the initialize handshake.", reason)
                self._initialize()
        self._connected = True

    def close(self) -> None:
        """End the session (``DELETE`` in the 2025 era) and release the HTTP client if we own it."""
        if self._closed:
            return
        self._closed = True
        self._exchange.close()

    def cancel(self) -> None:
        """Abort the in-flight request from any thread; the server sees the client disconnect.

        The reading thread then raises :class:`BosReadCancelled`. A no-op when nothing is running.
        """
        self._exchange.cancel()

    # --- requests ------------------------------------------------------------------------------

    def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send one JSON-RPC request and return its ``result`` (errors raise :class:`BosJsonRpcError`)."""
        with self._operation(connect=True):
            return self._request(method, params)

    def list_tools(self) -> list[dict[str, Any]]:
        """All tools, following ``nextCursor`` pagination."""
        with self._operation(connect=True):
            return self._list_tools(None)

    def call_tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """``tools/call`` without streaming; returns the plain ``CallToolResult`` object."""
        with self._operation(connect=True):
            return self._request("tools/call", {"name": name, "arguments": arguments})

    def read_resource(self, uri: str) -> dict[str, Any]:
        with self._operation(connect=True):
            return self._request("resources/read", {"uri": uri})

    def get_contexts(self) -> list[BosContext]:
        """The authorized BOS contexts (``bos_get_context``)."""
        with self._operation(connect=True):
            return self._get_contexts(None)

    def list_context_tools(self, context_handle: str) -> dict[str, Any]:
        """The operations and resources of one context (``bos_list_context_tools``)."""
        with self._operation(connect=True):
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
        on_context: Callable[[str], None] | None = None,
    ) -> FinalResult:
        """Run a federated read and return its authoritative :class:`FinalResult`.

        ``via="direct"`` calls ``tool_name`` itself; ``"execute"`` wraps it in ``bos_execute``
        (``context_handle`` defaults to the default context); ``"auto"`` is direct when
        ``tool_name`` is in ``tools/list``. With ``stream=True`` (and the server advertising the
        extension) the call opts in to ``bos/source-results/v1``; each notification is validated
        and handed to ``on_progress`` in wire order; an exception from the callback ends the read.
        ``deadline_s`` bounds the whole operation (retries and keepalive-only stalls included).

        The final frame is scanned record by record in both modes: with ``stream_records=False``
        its records are built into ``FederatedRecord`` objects one at a time (nothing larger than
        the stream threshold is decoded whole), and the whole result is returned.

        ``stream_records=True``: return as soon as the final frame starts, with a
        :class:`StreamingFinalResult` whose ``records`` is a one-shot iterator of plain dicts
        pulled from the still-open response in constant memory; end-of-frame attributes
        (completeness, metadata, ...) are available once it is exhausted; EOF or a connection
        failure mid-frame raises :class:`BosIncompleteStreamError` from the iterator. Consume or
        close the result before the next call on this session (:meth:`cancel` still works). A
        JSON or small SSE answer behaves the same (its records are iterated from memory).

        ``on_context``: called once with the context the read runs in as soon as it is known, so a
        failure's audit row can name it too: ``bos_execute``, the resolved handle before the call; a
        direct tool (sent no context), the context of its first page notification.
        """
        check_via(via)
        deadline = Deadline.after(DEFAULT_READ_DEADLINE if deadline_s is None else deadline_s)
        with self._operation(deadline, connect=True):
            style: ToolStyle
            if via == "auto":
                style = "direct" if tool_name in self._tool_name_set(deadline) else "execute"
            else:
                style = "direct" if via == "direct" else "execute"
            page_context = None
            requested: str | None = None
            if style == "execute":
                handle = resolve_context_handle(context_handle, contexts=lambda: self._get_contexts(deadline))
                requested = handle
                params: dict[str, Any] = {
                    "name": "bos_execute",
                    "arguments": {"context_handle": handle, "tool_name": tool_name, "arguments": arguments},
                }
                if on_context is not None:
                    on_context(handle)
            else:
                # A direct tool is sent no context: BOS picks it, and says which on every page.
                params = {"name": tool_name, "arguments": arguments}
                page_context = on_context
            opt_in = stream and self.source_results is not None
            if stream and not opt_in:
                logger.info("The server does not advertise %s; reading without streaming.", SOURCE_RESULTS_EXTENSION)
            if opt_in:
                params["_meta"] = {CLIENT_CAPABILITIES_META_KEY: {"experimental": {SOURCE_RESULTS_EXTENSION: {}}}}

            consumers: list[_ReadConsumer] = []

            def make_consumer(request_id: str) -> _ReadConsumer:
                consumers.append(_ReadConsumer(SourceResultsTracker(request_id), on_progress, page_context))
                return consumers[-1]

            # The final frame is always scanned record by record: a result held whole (stream_records
            # False) is built from the scanned records, so no answer larger than the stream
            # threshold is decoded whole (JSON of tiny objects decodes to ~34x its size).
            options = CallOptions(deadline, make_consumer, final_style=style, read_result=True)
            reply = self._call("tools/call", params, options)
            tracker = consumers[-1].tracker if consumers else SourceResultsTracker(reply.request_id)
            parser = FinalResultParser(
                reply.request_id, tool_style=style, observations=tracker, streamed=reply.streamed and opt_in,
                requested_context=requested,
            )
            result = (streaming_result(reply.stream, parser) if isinstance(reply, OpenFinalFrame)
                      else memory_result(reply.message, reply.raw, parser))
            return result if stream_records else result.materialised()

    # --- internals: operations -----------------------------------------------------------------

    @contextmanager
    def _operation(self, deadline: Deadline | None = None, *, connect: bool = False) -> Iterator[None]:
        """One public operation, under its deadline (``deadline``, else the operation deadline):
        every request it makes, the handshake included (``connect``: first), ends by then."""
        # cancel() aims at the running operation: a cancel left over from an idle moment is dropped.
        if self._op_depth == 0:
            self._exchange.cancelled.clear()
            self._deadline = deadline or Deadline.after(self.operation_deadline_s, "operation_deadline")
        self._op_depth += 1
        try:
            if connect:
                self.connect()
            yield
        finally:
            self._op_depth -= 1
            if self._op_depth == 0:
                self._deadline = None

    def _request(
        self, method: str, params: dict[str, Any] | None, deadline: Deadline | None = None
    ) -> dict[str, Any]:
        reply = self._call(method, params, CallOptions(deadline))
        message = None if isinstance(reply, OpenFinalFrame) else reply.message
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
        if result_type == "input_required":
            raise input_required_error(result, method)
        if result_type is not None and result_type != "complete":
            raise BosProtocolError(
                f"The server answered {method} with resultType {result_type!r}; "
                "this client only handles complete results."
            )
        return dict(result)

    def _list_tools(self, deadline: Deadline | None) -> list[dict[str, Any]]:
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        seen: set[str] = set()
        while True:
            result = self._request("tools/list", {"cursor": cursor} if cursor else None, deadline)
            page = result.get("tools")
            if not isinstance(page, list):
                raise BosProtocolError("tools/list returned no tools array.")
            tools.extend(t for t in page if isinstance(t, dict))  # decoded JSON objects
            cursor = result.get("nextCursor")
            if not cursor:
                break
            if cursor in seen:
                raise BosProtocolError("tools/list returned the same cursor twice.")
            seen.add(cursor)
        self._tool_names = {t["name"] for t in tools if isinstance(t.get("name"), str)}
        return tools

    def _tool_name_set(self, deadline: Deadline | None) -> set[str]:
        if self._tool_names is None:
            self._list_tools(deadline)
        assert self._tool_names is not None
        return self._tool_names

    def _get_contexts(self, deadline: Deadline | None) -> list[BosContext]:
        result = self._request("tools/call", {"name": "bos_get_context", "arguments": {}}, deadline)
        structured = _structured(result, "bos_get_context")
        contexts = structured.get("contexts")
        if not isinstance(contexts, list):
            raise BosResultError("bos_get_context returned no contexts array.")
        try:
            return [BosContext.model_validate(c) for c in contexts]
        except ValueError as exc:
            raise BosResultError(f"bos_get_context returned a malformed context: {excerpt(str(exc))}") from None

    # --- internals: era negotiation ------------------------------------------------------------

    def _discover(self, *, probe: bool) -> None:
        self._exchange.protocol_version = PROTOCOL_2026  # the envelope and headers of the probe
        try:
            result = self._request("server/discover", None)
            check_discovered(result, probe=probe)
        except (BosJsonRpcError, BosHttpError) as exc:
            self._exchange.protocol_version = None
            verdict = probe_verdict(exc) if probe else None
            if verdict is None:
                raise
            raise verdict from None
        except BaseException:
            self._exchange.protocol_version = None
            raise
        self._describe(ServerDescription.from_result(result, discover=True))
        logger.debug("MCP: stateless %s via server/discover.", PROTOCOL_2026)

    def _initialize(self) -> None:
        self._exchange.protocol_version = self._exchange.session_id = None
        params = {"protocolVersion": PROTOCOL_2025, "capabilities": {}, "clientInfo": self.client_info}
        result = self._request("initialize", params)
        self._exchange.protocol_version = check_handshake_version(result.get("protocolVersion"))
        self._describe(ServerDescription.from_result(result, discover=False))
        self._exchange.notify("notifications/initialized", None, self._deadline)
        logger.debug("MCP: initialized %s (session id %s).", self.protocol_version,
                     "set" if self.session_id else "none")

    def _describe(self, server: ServerDescription) -> None:
        self.server_capabilities = server.capabilities
        self.server_info = server.server_info
        self.instructions = server.instructions

    # --- internals: requests with retries -------------------------------------------------------

    def _call(
        self,
        method: str,
        params: dict[str, Any] | None,
        options: CallOptions = _PLAIN,
    ) -> Reply:
        """One request with retries; a stale 2025 session is re-initialised once."""
        if options.deadline is None and self._deadline is not None:
            options = replace(options, deadline=self._deadline)
        deadline = options.deadline

        def attempt() -> Reply:
            return run_with_retries(
                lambda: self._exchange.request(method, params, options),
                self.retry,
                deadline=deadline.at if deadline is not None else None,
                sleep=self._exchange.sleep,
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

# --- helpers ---------------------------------------------------------------------------------------


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
