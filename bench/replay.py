"""Replay feed: a loopback proxy in front of the reference server that serves federated reads at wire speed.

``python -m bench.replay --upstream MCP_URL --cache-dir DIR`` prints ``REPLAY URL <url>`` first.

Why: the reference server generates and JSON-encodes every record three times per read, which on
this machine caps any client far below a raw COPY. The replay feed records the server's exact
response bytes once (a priming read, untimed) and serves them again for every later identical
read, with the caller's JSON-RPC id put back in. What the client receives is byte-for-byte what
the reference server would send; only the server's generation cost is gone.

Everything else (discovery, ``tools/list``, context calls, DELETE) is forwarded to the server as is.
Cache key: protocol version header, tool name, wrapped ``tool_name`` and business arguments.
Admin (loopback only): ``POST /_bench/reset`` drops the cache (call it after a scenario switch);
``GET /_bench/stats`` -> ``{"hits": n, "misses": n}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import uvicorn

SENTINEL = "bench-replay-sentinel-7f3a9c"
_QUOTED = f'"{SENTINEL}"'.encode()
_BLOCK = 256 * 1024
_OPT_IN_META = "io.modelcontextprotocol/clientCapabilities"
_HOP = {b"host", b"content-length", b"transfer-encoding", b"connection", b"keep-alive", b"accept-encoding"}
_DROP_RESPONSE = {"content-length", "transfer-encoding", "connection", "date", "server", "content-encoding"}


def _find_all(path: Path) -> list[int]:
    """Offsets of the quoted sentinel in the file (chunked scan; matches may straddle blocks)."""
    offsets: list[int] = []
    overlap = len(_QUOTED) - 1
    with open(path, "rb") as f:
        base, tail = 0, b""
        while block := f.read(8 * 1024 * 1024):
            data = tail + block
            start = 0
            while (i := data.find(_QUOTED, start)) != -1:
                offsets.append(base - len(tail) + i)
                start = i + len(_QUOTED)
            tail = data[-overlap:] if len(data) >= overlap else data
            # Never report a match twice: the kept tail is shorter than the pattern.
            base += len(block)
    return offsets


class _Entry:
    def __init__(self, path: Path, status: int, headers: list[tuple[str, str]], offsets: list[int]) -> None:
        self.path, self.status, self.headers, self.offsets = path, status, headers, offsets


class ReplayApp:
    """Raw ASGI app: replay cached federated reads, forward everything else upstream."""

    def __init__(self, upstream_mcp_url: str, cache_dir: Path) -> None:
        parts = urlsplit(upstream_mcp_url)
        self.upstream_base = f"{parts.scheme}://{parts.netloc}"
        self.mcp_path = parts.path
        self.cache_dir = cache_dir
        self.cache: dict[str, _Entry] = {}
        self.hits = 0
        self.misses = 0
        self._lock = asyncio.Lock()
        self._client: httpx.AsyncClient | None = None
        self._files = 0

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(base_url=self.upstream_base,
                                             timeout=httpx.Timeout(60.0, read=1800.0), follow_redirects=False)
        return self._client

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    if self._client is not None:
                        await self._client.aclose()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        path, method = scope["path"], scope["method"]
        if path == "/_bench/reset" and method == "POST":
            async with self._lock:
                for entry in self.cache.values():
                    entry.path.unlink(missing_ok=True)
                self.cache.clear()
            await self._json(send, 200, {"reset": True})
            return
        if path == "/_bench/stats":
            await self._json(send, 200, {"hits": self.hits, "misses": self.misses})
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if method == "POST" and path == self.mcp_path:
            key, message = self._federated_key(body, headers)
            if key is not None:
                await self._replay(key, message, body, scope, headers, send)
                return
        await self._forward(scope, body, send)

    # -- replay ----------------------------------------------------------------------------------
    @staticmethod
    def _federated_key(body: bytes, headers: dict[str, str]) -> tuple[str | None, dict[str, Any]]:
        try:
            message = json.loads(body)
        except ValueError:
            return None, {}
        if not isinstance(message, dict) or message.get("method") != "tools/call" or "id" not in message:
            return None, {}
        params = message.get("params") or {}
        meta = params.get("_meta") or {}
        caps = meta.get(_OPT_IN_META) or {}
        if "bos/source-results/v1" not in (caps.get("experimental") or {}):
            return None, {}
        arguments = params.get("arguments") or {}
        inner = arguments.get("tool_name") if params.get("name") == "bos_execute" else None
        business = arguments.get("arguments") if inner is not None else arguments
        key = json.dumps([headers.get("mcp-protocol-version"), params.get("name"), inner, business],
                         sort_keys=True, default=str)
        return key, message

    async def _replay(self, key: str, message: dict[str, Any], body: bytes, scope: dict[str, Any],
                      headers: dict[str, str], send: Any) -> None:
        async with self._lock:
            entry = self.cache.get(key)
            if entry is None:
                self.misses += 1
                entry = await self._capture(message, scope)
                if entry is None:  # not cacheable (error answer): pass the live answer through
                    await self._forward(scope, body, send)
                    return
                self.cache[key] = entry
            else:
                self.hits += 1
        out_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in entry.headers]
        if "mcp-session-id" in headers:
            out_headers.append((b"mcp-session-id", headers["mcp-session-id"].encode("latin-1")))
        await send({"type": "http.response.start", "status": entry.status, "headers": out_headers})
        real_id = json.dumps(message["id"], ensure_ascii=False).encode()
        position = 0
        with open(entry.path, "rb") as f:
            for offset in [*entry.offsets, None]:
                stop = offset if offset is not None else os.fstat(f.fileno()).st_size
                while position < stop:
                    block = f.read(min(_BLOCK, stop - position))
                    if not block:
                        break
                    position += len(block)
                    await send({"type": "http.response.body", "body": block, "more_body": True})
                if offset is not None:
                    f.seek(offset + len(_QUOTED))
                    position = offset + len(_QUOTED)
                    await send({"type": "http.response.body", "body": real_id, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _capture(self, message: dict[str, Any], scope: dict[str, Any]) -> _Entry | None:
        captured = dict(message, id=SENTINEL)
        self._files += 1
        path = self.cache_dir / f"read-{self._files}.sse"
        request_headers = self._upstream_headers(scope)
        async with self.client.stream("POST", scope["path"], content=json.dumps(captured).encode(),
                                      headers=request_headers) as response:
            if response.status_code != 200 or not response.headers.get("content-type", "").startswith(
                    "text/event-stream"):
                await response.aread()
                return None
            with open(path, "wb") as f:
                async for chunk in response.aiter_raw():
                    f.write(chunk)
            kept = [(k, v) for k, v in response.headers.items() if k.lower() not in _DROP_RESPONSE
                    and k.lower() != "mcp-session-id"]
        offsets = await asyncio.to_thread(_find_all, path)
        return _Entry(path, 200, kept, offsets)

    # -- forwarding ------------------------------------------------------------------------------
    @staticmethod
    def _upstream_headers(scope: dict[str, Any]) -> list[tuple[bytes, bytes]]:
        return [(k, v) for k, v in scope["headers"] if k.lower() not in _HOP]

    async def _forward(self, scope: dict[str, Any], body: bytes, send: Any) -> None:
        target = scope["path"] + (("?" + scope["query_string"].decode("latin-1")) if scope.get("query_string") else "")
        try:
            response = await self.client.request(scope["method"], target, content=body or None,
                                                 headers=self._upstream_headers(scope))
        except httpx.HTTPError as exc:
            await self._json(send, 502, {"error": f"upstream: {type(exc).__name__}"})
            return
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers.items()
                   if k.lower() not in _DROP_RESPONSE]
        headers.append((b"content-length", str(len(response.content)).encode()))
        await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
        await send({"type": "http.response.body", "body": response.content, "more_body": False})

    @staticmethod
    async def _json(send: Any, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data, "more_body": False})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.replay")
    parser.add_argument("--upstream", required=True, help="the reference server's MCP URL")
    parser.add_argument("--cache-dir", type=Path, required=True)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    if urlsplit(args.upstream).hostname not in ("127.0.0.1", "localhost", "::1"):
        print("error: the replay feed only fronts a loopback server", file=sys.stderr)
        return 2
    args.cache_dir.mkdir(parents=True, exist_ok=True)
    app = ReplayApp(args.upstream, args.cache_dir)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    sock.listen(128)
    port = sock.getsockname()[1]
    print(f"REPLAY URL http://127.0.0.1:{port}{app.mcp_path}", flush=True)
    config = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False, ws="none",
                            timeout_graceful_shutdown=2)
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
