"""The two MCP protocol eras: the versions spoken, how ``era="auto"`` decides, what each puts on the wire.

- **2025-11-25** (handshake): ``initialize`` + ``notifications/initialized``; the
  ``Mcp-Session-Id`` and ``MCP-Protocol-Version`` headers on every later request.
- **2026-07-28** (stateless): ``server/discover``; every request carries ``params._meta``
  protocolVersion / clientInfo / clientCapabilities and the ``MCP-Protocol-Version``,
  ``Mcp-Method`` and (for ``tools/call``, ``resources/read``, ``prompts/get``) ``Mcp-Name``
  headers, the latter base64-wrapped when not plain ASCII.

``era="auto"`` probes ``server/discover`` and falls back to ``initialize`` when the answer is not
positive evidence of a stateless server (the official SDK's rule, :func:`probe_verdict` and
:func:`check_discovered`). The session (:class:`~.session.McpSession`) holds the negotiated state;
these are the rules it applies.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_provider_bos.exceptions import (
    BosError,
    BosHttpError,
    BosJsonRpcError,
    BosProtocolError,
    BosRetryableHttpError,
)
from airflow_provider_bos.mcp.jsonrpc import (
    CLIENT_CAPABILITIES_META_KEY,
    CLIENT_INFO_META_KEY,
    NAME_BEARING_METHODS,
    PROTOCOL_VERSION_META_KEY,
    UNSUPPORTED_PROTOCOL_VERSION,
    encode_header_value,
)
from airflow_provider_bos.models import PROTOCOL_2025, PROTOCOL_2026

__all__ = ["ERAS", "HANDSHAKE_VERSIONS", "NotStateless", "ServerDescription", "check_discovered",
           "check_handshake_version", "envelope_params", "probe_verdict", "request_headers"]

#: Handshake-era versions this client can speak (initialize may negotiate any of them).
HANDSHAKE_VERSIONS = (PROTOCOL_2025, "2025-06-18", "2025-03-26")
#: The accepted spellings of ``era`` and the protocol version each means.
ERAS = {"auto": "auto", "2025": PROTOCOL_2025, PROTOCOL_2025: PROTOCOL_2025, "2026": PROTOCOL_2026,
        PROTOCOL_2026: PROTOCOL_2026, "stateless": PROTOCOL_2026, "legacy": PROTOCOL_2025}
_ACCEPT = "application/json, text/event-stream"


class NotStateless(Exception):
    """Internal: the discover probe says the server is not a 2026-07-28 server."""


def probe_verdict(exc: BosError) -> NotStateless | None:
    """What a failed ``server/discover`` probe means: a handshake server, or None (propagate ``exc``).

    Any JSON-RPC error except ``-32022`` naming only stateless versions we do not speak, and
    HTTP 400/404/405 without a JSON-RPC body, mean a handshake server. Auth failures, 5xx after
    retries and transport errors are not era verdicts.
    """
    if isinstance(exc, BosJsonRpcError):
        if exc.code == UNSUPPORTED_PROTOCOL_VERSION:
            supported = exc.data.get("supported") if isinstance(exc.data, Mapping) else None
            if isinstance(supported, list) and not any(v in HANDSHAKE_VERSIONS for v in supported):
                return None  # a stateless-only server that speaks none of our versions
        return NotStateless(f"JSON-RPC error {exc.code}")
    if (
        isinstance(exc, BosHttpError)
        and not isinstance(exc, BosRetryableHttpError)
        and exc.status_code in (400, 404, 405)
    ):
        return NotStateless(f"HTTP {exc.status_code}")
    return None


def check_discovered(result: Mapping[str, Any], *, probe: bool) -> None:
    """A ``server/discover`` result must list 2026-07-28: else not stateless (probe), or an error."""
    supported = result.get("supportedVersions")
    if not isinstance(supported, list) or PROTOCOL_2026 not in supported:
        if probe:
            raise NotStateless(f"supportedVersions {supported!r}")
        raise BosProtocolError(
            f"The server does not support MCP {PROTOCOL_2026} (supportedVersions: {supported!r}); "
            f"use era '{PROTOCOL_2025}' or 'auto'."
        )


def check_handshake_version(version: Any) -> str:
    """The version ``initialize`` negotiated, if this client speaks it."""
    if version not in HANDSHAKE_VERSIONS:
        raise BosProtocolError(
            f"The server chose MCP protocol version {version!r}, which this client does not speak "
            f"(it speaks {', '.join(HANDSHAKE_VERSIONS)} and {PROTOCOL_2026})."
        )
    return str(version)


@dataclass(frozen=True)
class ServerDescription:
    """What a server says about itself in ``initialize`` or ``server/discover``."""

    capabilities: dict[str, Any]
    server_info: dict[str, Any] | None
    instructions: str | None

    @classmethod
    def from_result(cls, result: Mapping[str, Any], *, discover: bool) -> ServerDescription:
        capabilities = result.get("capabilities")
        info = result.get("serverInfo")
        if discover and info is None and isinstance(result.get("_meta"), Mapping):  # or in discover's _meta
            info = result["_meta"].get("io.modelcontextprotocol/serverInfo")
        instructions = result.get("instructions")
        return cls(
            capabilities=dict(capabilities) if isinstance(capabilities, Mapping) else {},
            server_info=dict(info) if isinstance(info, Mapping) else None,
            instructions=instructions if isinstance(instructions, str) else None,
        )


def request_headers(
    method: str, params: Mapping[str, Any] | None, *, protocol_version: str | None, session_id: str | None
) -> dict[str, str]:
    """The HTTP headers of a request in the negotiated era (none of the era's before negotiation)."""
    headers = {"Content-Type": "application/json", "Accept": _ACCEPT}
    if protocol_version == PROTOCOL_2026:
        headers["MCP-Protocol-Version"] = PROTOCOL_2026
        headers["Mcp-Method"] = method
        key = NAME_BEARING_METHODS.get(method)
        if key and params is not None and isinstance(params.get(key), str):
            headers["Mcp-Name"] = encode_header_value(params[key])
    elif protocol_version is not None:
        headers["MCP-Protocol-Version"] = protocol_version
        if session_id is not None:
            headers["Mcp-Session-Id"] = session_id
    return headers


def envelope_params(
    params: Mapping[str, Any] | None, *, stateless: bool, client_info: Mapping[str, Any]
) -> dict[str, Any] | None:
    """A request's ``params``; stateless: with the ``_meta`` every 2026-07-28 request carries."""
    if not stateless:
        return dict(params) if params is not None else None
    out = dict(params or {})
    meta = dict(out.get("_meta") or {})
    capabilities = dict(meta.get(CLIENT_CAPABILITIES_META_KEY) or {})
    meta[PROTOCOL_VERSION_META_KEY] = PROTOCOL_2026
    meta[CLIENT_INFO_META_KEY] = client_info
    meta[CLIENT_CAPABILITIES_META_KEY] = capabilities  # our normal capabilities are {} + any opt-in
    out["_meta"] = meta
    return out
