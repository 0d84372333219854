"""The feed's ceiling: one streamed federated read, its bytes drained and discarded (no parsing).

Plain httpx, no project client code. Like the client's ``era="auto"`` it probes ``server/discover``
and speaks the stateless 2026-07-28 protocol when offered, else ``initialize`` + ``initialized``,
so it sends the same tools/call shape as the sync (which is also what primes the replay feed).
Its records/s is the most any client can reach from that feed on this machine.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from bench.grant import BearerAuth
from bench.ours import TOOLS, CountingTransport

__all__ = ["drain_once"]

STATELESS = "2026-07-28"
HANDSHAKE = "2025-11-25"
_ACCEPT = "application/json, text/event-stream"
_CAPS = "io.modelcontextprotocol/clientCapabilities"
_OPT_IN = {"experimental": {"bos/source-results/v1": {}}}
_CLIENT_INFO = {"name": "bos-bench-drain", "version": "0"}


class _Rpc:
    def __init__(self, client: httpx.Client, url: str) -> None:
        self.client, self.url = client, url
        self.version: str | None = None
        self.session_id: str | None = None
        self._next = 0

    def envelope(self, method: str, params: dict[str, Any] | None, *, notify: bool = False,
                 opt_in: bool = False) -> tuple[dict[str, Any], dict[str, str]]:
        params = dict(params or {})
        headers = {"Accept": _ACCEPT, "Content-Type": "application/json"}
        if self.version == STATELESS:
            params["_meta"] = {"io.modelcontextprotocol/protocolVersion": STATELESS,
                               "io.modelcontextprotocol/clientInfo": _CLIENT_INFO,
                               _CAPS: _OPT_IN if opt_in else {}}
            headers.update({"MCP-Protocol-Version": STATELESS, "Mcp-Method": method})
            if method == "tools/call":
                headers["Mcp-Name"] = params["name"]
        else:
            if opt_in:
                params["_meta"] = {_CAPS: _OPT_IN}
            if self.version:
                headers["MCP-Protocol-Version"] = self.version
            if self.session_id:
                headers["Mcp-Session-Id"] = self.session_id
        body: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params:
            body["params"] = params
        if not notify:
            self._next += 1
            body["id"] = f"drain-{self._next}"
        return body, headers

    def call(self, method: str, params: dict[str, Any] | None = None) -> httpx.Response:
        body, headers = self.envelope(method, params)
        return self.client.post(self.url, json=body, headers=headers)


def _result(response: httpx.Response) -> dict[str, Any]:
    text = response.text
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        text = next(line[5:].strip() for line in text.splitlines() if line.startswith("data:"))
    message = json.loads(text)
    if "result" not in message:
        raise RuntimeError(f"JSON-RPC error: {message.get('error')}")
    return message["result"]


def _connect(rpc: _Rpc) -> None:
    rpc.version = STATELESS
    probe = rpc.call("server/discover")
    if probe.status_code == 200:
        try:
            if STATELESS in _result(probe).get("supportedVersions", []):
                return
        except (ValueError, RuntimeError, StopIteration):
            pass
    rpc.version = None
    init = rpc.call("initialize", {"protocolVersion": HANDSHAKE, "capabilities": {}, "clientInfo": _CLIENT_INFO})
    init.raise_for_status()
    rpc.version = HANDSHAKE
    rpc.session_id = init.headers.get("mcp-session-id")
    body, headers = rpc.envelope("notifications/initialized", None, notify=True)
    rpc.client.post(rpc.url, json=body, headers=headers)


def drain_once(mcp_url: str, token: str, *, style: str = "execute") -> dict[str, Any]:
    """Stream one federated read from ``mcp_url`` and discard it; returns seconds and wire bytes."""
    transport = CountingTransport()
    timeout = httpx.Timeout(60.0, read=1800.0)  # a cold replay feed captures the whole read first
    with httpx.Client(transport=transport, auth=BearerAuth(token), timeout=timeout) as client:
        rpc = _Rpc(client, mcp_url)
        _connect(rpc)
        if style == "execute":
            contexts = _result(rpc.call("tools/call", {"name": "bos_get_context", "arguments": {}}))
            contexts = contexts["structuredContent"]["contexts"]
            handle = next((c for c in contexts if c.get("is_default")), contexts[0])["context_handle"]
            params = {"name": "bos_execute",
                      "arguments": {"context_handle": handle, "tool_name": TOOLS["execute"], "arguments": {}}}
        else:
            params = {"name": TOOLS["direct"], "arguments": {}}
        body, headers = rpc.envelope("tools/call", params, opt_in=True)
        before = transport.received_bytes
        start, cpu_start = time.perf_counter(), time.process_time()
        with client.stream("POST", mcp_url, json=body, headers=headers) as resp:
            resp.raise_for_status()
            if not resp.headers.get("content-type", "").startswith("text/event-stream"):
                raise RuntimeError(f"expected an event stream, got {resp.headers.get('content-type')!r}")
            for _ in resp.iter_raw(1 << 20):
                pass
        seconds = time.perf_counter() - start
        cpu_seconds = time.process_time() - cpu_start
        if rpc.session_id:
            client.delete(mcp_url, headers={"Mcp-Session-Id": rpc.session_id, "MCP-Protocol-Version": HANDSHAKE})
    return {"cpu_seconds": cpu_seconds, "seconds": seconds, "wire_bytes": transport.received_bytes - before,
            "era": rpc.version}
