"""The MCP endpoint ``/mcp/apps/bos/platform``: the official MCP SDK plus a thin streaming layer.

What the SDK (mcp 2.3.0) does here, unmodified:
- ``mcp.server.lowlevel.Server`` with our handlers: ``tools/list`` (cursor pagination),
  ``tools/call`` for the non-streaming tools (``bos_get_context``, ``bos_list_context_tools``,
  ``bos_execute`` of ``service.describe``), ``resources/read``, and ``server/discover``;
- ``StreamableHTTPSessionManager`` for every request it can answer: ``initialize`` +
  ``Mcp-Session-Id`` (404 on unknown/deleted sessions, DELETE ends one, sessions bound to the
  credential that created them), the 2025-11-25 handshake era and the stateless 2026-07-28 era
  (``server/discover``, the header/``_meta`` validation ladder with -32020 header mismatch and
  -32022 unsupported version, ``resultType``). It runs in JSON-response mode: every reply it
  produces is one ``application/json`` body, which is exactly the contract for a request that did
  not negotiate streaming.

What :class:`McpApp` does itself (raw ASGI, in ``__call__`` and ``_federated``), and why:
the federated reads (``bos_execute`` of ``people.search`` and the direct ``search_people``).
The SDK fixes JSON-vs-SSE per transport, while ``bos/source-results/v1`` negotiates per request
(object opt-in in ``params._meta`` AND ``Accept: text/event-stream``); it serialises a result in
one piece (the "large" scenario must be written incrementally), has no leading ``: bos/...``
comment nor ``: keepalive`` cadence, cannot inject transport faults (drops, mid-frame resets,
stalls, wire-mode framing), and does not cancel a 2025-era handler on client disconnect. For these
calls the layer applies the same request validation the SDK would — for the 2026 era it calls the
SDK's own ladder (``find_duplicated_routing_header``, ``classify_inbound_request``, the SDK's
error-code-to-HTTP-status table); for the 2025 era it checks the ``Mcp-Session-Id`` against the
sessions the SDK issued (learned from its ``initialize`` responses and DELETEs) and the principal
that created them — and then writes the response itself (:mod:`.streaming`).

Resumable response streams (2025-11-25 session era, as the SDK does them with an ``EventStore``
and ``retry_interval``): a streamed read opens with a priming event (``id``, empty ``data``,
``retry``; only for clients at 2025-11-25 or later, like the SDK's ``_mint_priming_event``) and
every event carries an id ``<stream key>.<k>``; GET with ``Last-Event-ID`` (same session, same
principal) sends the events after ``k`` again and then the rest as they come due. The SDK's
in-memory event store would keep every event, the multi-hundred-megabyte final frame included;
here the stream is a pure function of the planned read and its start time, so the store keeps
those (:class:`_StoredStream`) and regenerates any event. The stateless 2026-07-28 era has no
resumption: like the SDK's stateless transport, no ids and GET answers 405. ``FaultSpec`` knobs
(:mod:`.scenario`) turn resumption off, close streams early, and shape silence and keepalives.

``-32021`` (missing required client capability) is never sent: no BOS tool requires a client
capability (streaming is an opt-in that falls back to JSON, never a requirement).

Why this module is above ~500 lines: it is a test and demo server, not provider code; the raw ASGI
layer's era checks, session bookkeeping and the resumable response streams (priming events, the
event store replayed by GET + ``Last-Event-ID``) share one request path and its state.
"""

from __future__ import annotations

import contextlib
import json
import math
import secrets
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import mcp_types as types
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, authorization_context
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http import LAST_EVENT_ID_HEADER, MCP_SESSION_ID_HEADER, check_accept_headers
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import (
    ERROR_CODE_HTTP_STATUS,
    InboundLadderRejection,
    classify_inbound_request,
    find_duplicated_routing_header,
)
from mcp_types import (
    CLIENT_CAPABILITIES_META_KEY,
    HEADER_MISMATCH,
    INVALID_PARAMS,
    INVALID_REQUEST,
)
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, is_version_at_least
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send

from airflow_provider_bos.models import SOURCE_RESULT_METHOD, SOURCE_RESULTS_EXTENSION
from airflow_provider_bos.testing.federation import plan_read
from airflow_provider_bos.testing.streaming import (
    BodyWriter,
    SseEmitter,
    StreamAborted,
    StreamClosed,
    final_frame_pieces,
)
from airflow_provider_bos.testing.tools import (
    DIRECT_READ_TOOLS,
    FEDERATED_OPERATIONS,
    TOOLS,
    ToolCallError,
    federated_target,
    find_context,
    get_context_result,
    list_context_tools_result,
    person_schema,
    schema_uri,
    service_describe_result,
)

if TYPE_CHECKING:
    from airflow_provider_bos.testing.counters import ServerCounters
    from airflow_provider_bos.testing.scenario import Scenario

__all__ = ["MCP_PATH", "TOOLS_PAGE_SIZE", "McpApp", "McpAppOwner", "StreamAborted"]

MCP_PATH = "/mcp/apps/bos/platform"
TOOLS_PAGE_SIZE = 2  # small on purpose: clients must follow nextCursor
SERVER_NAME = "bos-reference-server"
SERVER_VERSION = "1.0.0"
STORED_STREAMS = 64  # resumable streams kept (oldest dropped first)
PRIMING_SINCE = "2025-11-25"  # older clients cannot parse an empty-data event (as in the SDK)
_SHUTDOWN_POLL_S = 0.25
INSTRUCTIONS = ("BOS Platform (reference server). Call bos_get_context, then bos_list_context_tools with a "
                "returned context_handle; read operations support the bos/source-results/v1 extension.")


class _BosServer(Server[Any]):
    """The SDK server, advertising ``bos/source-results/v1`` in initialize AND server/discover."""

    def __init__(self, capability: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(SERVER_NAME, version=SERVER_VERSION, instructions=INSTRUCTIONS, **kwargs)
        self._bos_capability = capability

    def get_capabilities(self, notification_options: Any = None,
                         experimental_capabilities: dict[str, dict[str, Any]] | None = None,
                         extensions: dict[str, dict[str, Any]] | None = None, *,
                         protocol_version: str | None = None) -> types.ServerCapabilities:
        experimental = dict(experimental_capabilities or {})
        experimental.setdefault(SOURCE_RESULTS_EXTENSION, dict(self._bos_capability))
        return super().get_capabilities(notification_options, experimental, extensions,
                                        protocol_version=protocol_version)


def _principal(scope: Scope) -> Any:
    user = scope.get("user")
    return authorization_context(user) if isinstance(user, AuthenticatedUser) else None


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _json_response(send: Send, status: int, payload: Any, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    body = json.dumps(payload, separators=(",", ":")).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _error(req_id: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": req_id, "error": error}


def _opt_in(msg: dict[str, Any]) -> Any:
    """The request-local ``bos/source-results/v1`` opt-in value (None when absent)."""
    params = msg.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    caps = meta.get(CLIENT_CAPABILITIES_META_KEY) if isinstance(meta, dict) else None
    experimental = caps.get("experimental") if isinstance(caps, dict) else None
    return experimental.get(SOURCE_RESULTS_EXTENSION) if isinstance(experimental, dict) else None


class McpAppOwner(Protocol):
    """What :class:`McpApp` uses of the server that owns it (:class:`~.server.BosReferenceServer`)."""

    counters: ServerCounters
    base_url: str
    time_scale: float

    @property
    def scenario(self) -> Scenario: ...
    @property
    def allow_remote(self) -> bool: ...
    def next_read(self) -> tuple[Scenario, int, int]: ...


class McpApp:
    """ASGI app of the MCP endpoint (behind :class:`~.oauth.BearerGate`)."""

    def __init__(self, owner: McpAppOwner) -> None:
        self.owner = owner
        self.counters = owner.counters
        capability = {"pageSize": 100, "maxConcurrentSources": 8,
                      "contractUri": owner.base_url + "/docs/source-results-v1"}
        # on_list_resources: the SDK declares the resources capability when resources/list is served.
        self.server = _BosServer(capability, on_list_tools=self._list_tools, on_call_tool=self._call_tool,
                                 on_list_resources=self._list_resources, on_read_resource=self._read_resource)
        self.server.add_request_handler("server/discover", types.RequestParams, self._discover)
        security = None if owner.allow_remote else TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
            allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
        )
        self.manager = StreamableHTTPSessionManager(app=self.server, json_response=True, stateless=False,
                                                    security_settings=security, session_idle_timeout=None)
        self._lock = threading.Lock()
        self._sessions: dict[str, Any] = {}  # session id -> principal that created it
        self._tool_posts = 0
        self._closing = threading.Event()
        self._streams: OrderedDict[str, _StoredStream] = OrderedDict()  # resumable streams by key

    # -- lifecycle -------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        async with self.manager.run():
            yield

    def reset_faults(self) -> None:
        with self._lock:
            self._tool_posts = 0

    def shutdown(self) -> None:
        """Ask open streams (stalls, keepalive waits) to end now."""
        self._closing.set()

    def _contexts(self) -> list[dict[str, Any]]:
        return self.owner.scenario.resolved_contexts()

    # -- SDK handlers ----------------------------------------------------------------------------
    async def _discover(self, ctx: Any, params: Any) -> types.DiscoverResult:
        self.counters.incr("discover_calls")
        return await self.server._handle_discover(ctx, params)

    async def _list_tools(self, ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        cursor = params.cursor if params is not None else None
        try:
            start = int(cursor) if cursor else 0
        except ValueError:
            raise MCPError(code=INVALID_PARAMS, message="Invalid cursor") from None
        if start < 0 or start > len(TOOLS):
            raise MCPError(code=INVALID_PARAMS, message="Invalid cursor")
        page = TOOLS[start:start + TOOLS_PAGE_SIZE]
        end = start + len(page)
        return types.ListToolsResult(
            tools=[types.Tool(name=t["name"], description=t["description"], input_schema=t["inputSchema"])
                   for t in page],
            next_cursor=str(end) if end < len(TOOLS) else None,
        )

    async def _call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        name = params.name
        arguments = dict(params.arguments or {})
        contexts = self._contexts()
        meta: dict[str, Any] | None = None
        try:
            if name == "bos_get_context":
                structured = get_context_result(contexts)
            elif name == "bos_list_context_tools":
                structured = list_context_tools_result(contexts, arguments)
            elif name == "bos_execute":
                operation = arguments.get("tool_name")
                context = find_context(contexts, arguments.get("context_handle"))
                if operation == "service.describe":
                    structured = service_describe_result(context)
                    meta = {"bos/context": context}
                elif operation in FEDERATED_OPERATIONS:  # served by McpApp._federated; never reaches here
                    raise MCPError(code=INVALID_REQUEST, message="Federated reads are served by the BOS stream")
                else:
                    raise ToolCallError("Unknown operation; see bos_list_context_tools for this context")
            elif name in DIRECT_READ_TOOLS:
                raise MCPError(code=INVALID_REQUEST, message="Federated reads are served by the BOS stream")
            else:
                raise MCPError(code=INVALID_PARAMS, message=f"Unknown tool: {name}")
        except ToolCallError as exc:
            raise MCPError(code=INVALID_PARAMS, message=str(exc)) from None
        return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(structured))],
                                    structured_content=structured, is_error=False, meta=meta)

    async def _list_resources(self, ctx: Any,
                              params: types.PaginatedRequestParams | None) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[
            types.Resource(name=f"person-schema-{c['context_handle']}", title="FederatedRecord JSON Schema",
                           uri=schema_uri(c["context_handle"]), mime_type="application/schema+json")
            for c in self._contexts()])

    async def _read_resource(self, ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        uri = str(params.uri)
        for context in self._contexts():
            if uri == schema_uri(context["context_handle"]):
                return types.ReadResourceResult(contents=[types.TextResourceContents(
                    uri=uri, mime_type="application/schema+json", text=person_schema())])
        raise MCPError(code=INVALID_PARAMS, data={"uri": uri},
                       message="Unknown resource URI; use one listed by bos_list_context_tools")

    # -- ASGI ------------------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.manager.handle_request(scope, receive, send)
            return
        method = scope["method"]
        if method == "DELETE":
            await self.manager.handle_request(scope, receive, self._watch_delete(scope, send))
            return
        if method == "GET" and await self._get(scope, receive, send):
            return
        if method != "POST":
            await self.manager.handle_request(scope, receive, send)
            return
        body = await _read_body(receive)
        replay = _replay(body, receive)
        try:
            msg = json.loads(body)
        except (ValueError, RecursionError):
            msg = None
        if isinstance(msg, dict) and "id" in msg:
            rpc_method = msg.get("method")
            if rpc_method == "initialize":
                self.counters.incr("initializes")
                await self.manager.handle_request(scope, replay, self._watch_initialize(scope, send))
                return
            if rpc_method == "tools/call":
                if await self._http_fault(send, msg.get("id")):
                    return
                self.counters.incr("tool_calls")
                params = msg.get("params")
                name = params.get("name") if isinstance(params, dict) else None
                arguments = params.get("arguments") if isinstance(params, dict) else None
                if isinstance(name, str) and isinstance(arguments or {}, dict):
                    try:
                        target: Any = federated_target(self._contexts(), name, arguments or {})
                    except ToolCallError as exc:
                        target = exc
                    if target is not None:
                        await self._federated(scope, receive, send, msg, target)
                        return
        await self.manager.handle_request(scope, replay, send)

    def _watch_initialize(self, scope: Scope, send: Send) -> Send:
        async def watched(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 200:
                sid = Headers(raw=list(message.get("headers", []))).get(MCP_SESSION_ID_HEADER)
                if sid:
                    with self._lock:
                        self._sessions[sid] = _principal(scope)
            await send(message)

        return watched

    def _watch_delete(self, scope: Scope, send: Send) -> Send:
        sid = Headers(scope=scope).get(MCP_SESSION_ID_HEADER)

        async def watched(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] < 300 and sid:
                with self._lock:
                    known = self._sessions.pop(sid, None) is not None
                if known:
                    self.counters.incr("sessions_deleted")
            await send(message)

        return watched

    async def _http_fault(self, send: Send, req_id: Any) -> bool:
        faults = self.owner.scenario.faults
        with self._lock:
            self._tool_posts += 1
            n = self._tool_posts
        if n <= faults.http_429:
            retry_after = str(max(0, math.ceil(faults.retry_after_s)))
            await _json_response(send, 429, _error(req_id, -32000, "Too many requests; retry later"),
                                 [(b"retry-after", retry_after.encode())])
            return True
        if n <= faults.http_429 + faults.http_503:
            body = b"<html><body><h1>503 Service Unavailable</h1>upstream is restarting</body></html>"
            await send({"type": "http.response.start", "status": 503,
                        "headers": [(b"content-type", b"text/html; charset=utf-8"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return True
        return False

    # -- the federated read path (raw ASGI; see the module docstring) -----------------------------
    async def _federated(self, scope: Scope, receive: Receive, send: Send, msg: dict[str, Any],
                         target: Any) -> None:
        headers = Headers(scope=scope)
        req_id = msg.get("id")
        version = headers.get("mcp-protocol-version")
        stateless = version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS
        extra_headers: list[tuple[bytes, bytes]] = []
        sid: str | None = None
        if stateless:
            rejection: InboundLadderRejection | None = None
            raw = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
            duplicated = find_duplicated_routing_header(raw)
            if duplicated is not None:
                rejection = InboundLadderRejection(code=HEADER_MISMATCH,
                                                   message=f"{duplicated} header appears more than once")
            else:
                verdict = classify_inbound_request(msg, headers=dict(headers.items()))
                if isinstance(verdict, InboundLadderRejection):
                    rejection = verdict
            if rejection is not None:
                await _json_response(send, ERROR_CODE_HTTP_STATUS.get(rejection.code, 200),
                                     _error(req_id, rejection.code, rejection.message, rejection.data))
                return
        else:
            sid = await self._session_of(scope, send)
            if sid is None:
                return
            extra_headers.append((MCP_SESSION_ID_HEADER.encode(), sid.encode()))
        if req_id is None or isinstance(req_id, bool) or not isinstance(req_id, str | int):
            await _json_response(send, 400, _error(None, INVALID_REQUEST, "id must be a string or integer"))
            return
        has_json, has_sse = check_accept_headers(Request(scope))
        negotiated = isinstance(_opt_in(msg), dict) and has_sse
        if not negotiated and not has_json:
            await _json_response(send, 406, _error(req_id, INVALID_REQUEST,
                                                   "Not Acceptable: Client must accept application/json"))
            return
        if isinstance(target, ToolCallError):
            await _json_response(send, 400 if stateless else 200, _error(req_id, INVALID_PARAMS, str(target)),
                                 extra_headers)
            return
        style, context, arguments = target
        scenario, day, read_index = self.owner.next_read()
        read = plan_read(scenario, request_id=req_id, context=context, arguments=arguments, day=day,
                         read_index=read_index)
        if negotiated:
            self.counters.incr("streamed_calls")
        arguments_of_call = {"read": read, "request_id": req_id, "style": style, "context": context,
                             "stateless": stateless, "faults": scenario.faults, "headers": extra_headers}
        call = _Call(self, send, **arguments_of_call)
        # Resumable: session era, a client that can parse priming events, and the scenario allows it.
        if (negotiated and sid is not None and scenario.faults.resumable
                and is_version_at_least(version or "", PRIMING_SINCE)):
            stored = self._store_stream(arguments_of_call, session_id=sid, principal=_principal(scope))
            call.stream_key, call.started = stored.key, stored.started
        await call.run(receive, streamed=negotiated)

    async def _session_of(self, scope: Scope, send: Send) -> str | None:
        """The request's known 2025-era session id, created by this principal; None after answering 400/404."""
        sid = Headers(scope=scope).get(MCP_SESSION_ID_HEADER)
        if not sid:
            await _json_response(send, 400, _error(None, INVALID_REQUEST, "Bad Request: Missing session ID"))
            return None
        with self._lock:
            known = sid in self._sessions
            owner = self._sessions.get(sid)
        if not known or owner != _principal(scope):
            await _json_response(send, 404, _error(None, INVALID_REQUEST, "Session not found"))
            return None
        return sid

    # -- resumption (2025-11-25 era; the event store) ----------------------------------------------
    def _store_stream(self, call: dict[str, Any], *, session_id: str, principal: Any) -> _StoredStream:
        stored = _StoredStream(key=secrets.token_hex(8), call=call, started=anyio.current_time(),
                               session_id=session_id, principal=principal)
        with self._lock:
            self._streams[stored.key] = stored
            while len(self._streams) > STORED_STREAMS:
                self._streams.popitem(last=False)
        return stored

    async def _get(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """Answer a 2025-era GET ourselves when it resumes a stream or resumption is off; False: the SDK's."""
        headers = Headers(scope=scope)
        version = headers.get("mcp-protocol-version")
        if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
            return False  # the stateless era: the SDK answers 405 (no GET streams, no resumption)
        if not self.owner.scenario.faults.resumable:
            await _json_response(send, 405, _error(None, INVALID_REQUEST, "Method Not Allowed: this server "
                                                   "does not offer GET streams or stream resumption"),
                                 [(b"allow", b"POST, DELETE")])
            return True
        last_event_id = headers.get(LAST_EVENT_ID_HEADER)
        if last_event_id is None:
            return False
        await self._resume(scope, receive, send, last_event_id)
        return True

    async def _resume(self, scope: Scope, receive: Receive, send: Send, last_event_id: str) -> None:
        """GET + ``Last-Event-ID``: the events after it again, then the rest live, up to the final."""
        _, has_sse = check_accept_headers(Request(scope))
        if not has_sse:
            await _json_response(send, 406, _error(None, INVALID_REQUEST,
                                                   "Not Acceptable: Client must accept text/event-stream"))
            return
        sid = await self._session_of(scope, send)
        if sid is None:
            return
        key, _, index_text = last_event_id.partition(".")
        with self._lock:
            stored = self._streams.get(key)
        if (stored is None or stored.session_id != sid or stored.principal != _principal(scope)
                or not index_text.isdigit()):
            await _json_response(send, 400, _error(None, INVALID_REQUEST,
                                                   "Unknown Last-Event-ID: no stream of this session to resume"))
            return
        self.counters.incr("resumed_streams")
        call = _Call(self, send, **stored.call, stream_key=key, started=stored.started,
                     resume_after=int(index_text))
        await call.run(receive, streamed=True)


@dataclass
class _StoredStream:
    """What a resumable response stream needs to be sent again (the "event store" of one call).

    The stream is a pure function of the planned read and the time it started, so storing these
    is storing every event: a resume regenerates the events after ``Last-Event-ID``, the final
    frame included, byte-identical in JSON.
    """

    key: str
    call: dict[str, Any]  # the _Call keyword arguments
    started: float  # anyio.current_time() when the POST began
    session_id: str
    principal: Any


class _Call:
    """One federated tools/call being answered (SSE or JSON), with cancellation on disconnect.

    Stream events are numbered: 0 is the priming event, 1..n the source notifications, n + 1 the
    final response. On a resumable stream event k has the id ``<stream key>.<k>``.
    """

    def __init__(self, app: McpApp, send: Send, *, read: Any, request_id: Any, style: str, context: dict[str, Any],
                 stateless: bool, faults: Any, headers: list[tuple[bytes, bytes]],
                 stream_key: str | None = None, started: float | None = None,
                 resume_after: int | None = None) -> None:
        self.app = app
        self.send = send
        self.read = read
        self.request_id = request_id
        self.style = style
        self.context = context
        self.stateless = stateless
        self.faults = faults
        self.headers = headers
        self.time_scale = app.owner.time_scale
        self.final_written = False
        self.stream_key = stream_key  # None: the stream carries no ids and cannot be resumed
        self.started = started
        self.resume_after = resume_after  # None: this is the POST; k: a GET resuming after event k

    def _frame(self, *, newlines: bool) -> Any:
        return final_frame_pieces(self.read, request_id=self.request_id, style=self.style, context=self.context,
                                  stateless=self.stateless, server_info=self.app.server.server_info_stamp,
                                  faults=self.faults, newlines=newlines)

    def _event_id(self, index: int) -> str | None:
        return None if self.stream_key is None else f"{self.stream_key}.{index}"

    async def run(self, receive: Receive, *, streamed: bool) -> None:
        disconnected = False
        aborted = False
        async with anyio.create_task_group() as tg:

            async def watch_disconnect() -> None:
                nonlocal disconnected
                while (await receive())["type"] != "http.disconnect":
                    pass
                disconnected = True
                tg.cancel_scope.cancel()

            tg.start_soon(watch_disconnect)
            try:
                if streamed:
                    await self._stream()
                else:
                    await self._json()
            except StreamAborted:
                aborted = True
            except StreamClosed:
                pass  # ended cleanly on purpose; the client resumes
            finally:
                tg.cancel_scope.cancel()
        if disconnected and not self.final_written:
            self.app.counters.incr("cancelled_calls")
        if aborted:
            raise StreamAborted("response aborted on purpose (fault injection)")

    def _check_closing(self) -> None:
        if self.app._closing.is_set():
            raise StreamAborted("server shutting down")

    async def _wait_until(self, emitter: SseEmitter | None, due: float) -> None:
        """Sleep until ``due``, with ``: keepalive`` comments on an idle stream (if any are configured)."""
        interval = self.faults.keepalive_interval_ms
        keepalive_s = None if interval is None or emitter is None else interval / 1000.0
        while True:
            now = anyio.current_time()
            if now >= due:
                return
            wake = due if keepalive_s is None or emitter is None else min(due, emitter.last_write + keepalive_s)
            # Short naps, so a server stop is not held up by a long silence.
            await anyio.sleep(max(0.0, min(wake - now, _SHUTDOWN_POLL_S)))
            self._check_closing()
            if (keepalive_s is not None and emitter is not None
                    and anyio.current_time() >= emitter.last_write + keepalive_s):
                await emitter.comment("keepalive")

    async def _stream(self) -> None:
        faults = self.faults
        resuming = self.resume_after is not None
        emitter = SseEmitter(self.send, wire=faults.wire_mode, retry_ms=faults.sse_retry_ms)
        content_type = b"text/event-stream; charset=utf-8" if faults.wire_mode else b"text/event-stream"
        await self.send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", content_type), (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no"),
            *self.headers]})
        after = self.resume_after or 0
        first_id = self._event_id(after)  # None: a stream without ids
        if first_id is not None:
            # Like the SDK, every connection opens with a priming event; a resumed one repeats the
            # position it resumes from, so resuming from it again is exact.
            await emitter.priming(first_id)
            self.app.counters.incr("primed_streams")
        if not resuming:
            await emitter.comment(SOURCE_RESULTS_EXTENSION)
        start = self.started if self.started is not None else anyio.current_time()
        if faults.stall and not resuming:
            while True:
                await self._wait_until(emitter, anyio.current_time() + _SHUTDOWN_POLL_S)
        sent = 0
        last_ms = 0.0
        index = 0
        for index, (at_ms, params) in enumerate(self.read.iter_notifications(), start=1):
            last_ms = at_ms
            if index <= after:
                continue
            await self._wait_until(emitter, start + at_ms / 1000.0 * self.time_scale)
            if not resuming:
                if faults.drop_after_notifications is not None and sent >= faults.drop_after_notifications:
                    await emitter.abort()
                if faults.close_after_events is not None and sent >= faults.close_after_events:
                    await emitter.close_early()
            await emitter.message({"jsonrpc": "2.0", "method": SOURCE_RESULT_METHOD, "params": params},
                                  event_id=self._event_id(index))
            sent += 1
        if not resuming:
            if faults.drop_after_notifications is not None or faults.drop_before_final:
                await emitter.abort()
            if faults.close_after_events is not None and sent >= faults.close_after_events:
                await emitter.close_early()
        if after > index:  # resumed after the final response itself: nothing is left
            await emitter.finish()
            return
        await self._wait_until(emitter, start + (last_ms + faults.final_delay_ms) / 1000.0 * self.time_scale)
        await emitter.final(self._frame(newlines=faults.wire_mode),
                            drop_mid=faults.drop_mid_final and not resuming, event_id=self._event_id(index + 1),
                            close_after_bytes=None if resuming else faults.close_mid_final_bytes,
                            close_after_records_bytes=None if resuming else faults.close_mid_records_bytes,
                            # Counted before the event's last byte: the client may look right after it.
                            on_complete=lambda: self.app.counters.incr("completed_streams"))
        self.final_written = True
        await emitter.finish()

    async def _json(self) -> None:
        faults = self.faults
        if faults.stall:
            while True:  # no response at all until the client gives up
                await anyio.sleep(_SHUTDOWN_POLL_S)
                self._check_closing()
        # The read takes its simulated time even when nobody watches the pages.
        last_ms = 0.0
        for at_ms, _ in self.read.iter_notifications():
            last_ms = at_ms
        ready = anyio.current_time() + (last_ms + faults.final_delay_ms) / 1000.0 * self.time_scale
        await self._wait_until(None, ready)
        await self.send({"type": "http.response.start", "status": 200,
                         "headers": [(b"content-type", b"application/json"), *self.headers]})
        writer = BodyWriter(self.send, tiny=False)
        if faults.drop_after_notifications is not None or faults.drop_before_final:
            await writer.abort()
        await writer.pieces(self._frame(newlines=False), drop_mid=faults.drop_mid_final)
        self.final_written = True
        await writer.finish()
