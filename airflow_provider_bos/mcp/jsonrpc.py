"""JSON-RPC 2.0 pieces of MCP: request ids, envelopes, error mapping, routing-header values.

No I/O. The header-value codec follows the MCP 2026-07-28 rule (as the official SDK implements
it): printable ASCII without edge whitespace passes verbatim, anything else is sent as
``=?base64?<base64 of UTF-8>?=``.
"""

from __future__ import annotations

import base64
import itertools
import json
import math
import re
import threading
import uuid
from collections.abc import Mapping
from typing import Any

import msgspec
import orjson

from airflow_provider_bos.exceptions import BosConfigurationError, BosJsonRpcError, BosProtocolError, excerpt
from airflow_provider_bos.json_numbers import NumberBeyondDouble

__all__ = [
    "IdGenerator",
    "request_envelope",
    "notification_envelope",
    "rpc_error",
    "encode_header_value",
    "decode_header_value",
    "loads",
    "dumps",
    "same_id",
    "PROTOCOL_VERSION_META_KEY",
    "CLIENT_INFO_META_KEY",
    "CLIENT_CAPABILITIES_META_KEY",
    "NAME_BEARING_METHODS",
    "METHOD_NOT_FOUND",
    "HEADER_MISMATCH",
    "MISSING_REQUIRED_CLIENT_CAPABILITY",
    "UNSUPPORTED_PROTOCOL_VERSION",
]

PROTOCOL_VERSION_META_KEY = "io.modelcontextprotocol/protocolVersion"
CLIENT_INFO_META_KEY = "io.modelcontextprotocol/clientInfo"
CLIENT_CAPABILITIES_META_KEY = "io.modelcontextprotocol/clientCapabilities"

#: Method -> params key mirrored in the ``Mcp-Name`` header (2026-07-28).
NAME_BEARING_METHODS: Mapping[str, str] = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}

METHOD_NOT_FOUND = -32601
HEADER_MISMATCH = -32020
MISSING_REQUIRED_CLIENT_CAPABILITY = -32021
UNSUPPORTED_PROTOCOL_VERSION = -32022

_HINTS = {
    HEADER_MISMATCH: "the server says our MCP routing headers do not match the request body (a client bug)",
    MISSING_REQUIRED_CLIENT_CAPABILITY: "the server requires a client capability this client does not offer",
    UNSUPPORTED_PROTOCOL_VERSION: "the server does not support our MCP protocol version",
}

_decode_exactly = msgspec.json.Decoder().decode


def loads(data: str | bytes | bytearray | memoryview) -> Any:
    """Decode JSON: msgspec's decoder, as fast as orjson's and exact for integers beyond 64 bits, which
    orjson turns into floats (a record's attributes may hold any JSON number). A number beyond a
    64-bit float's range is a :class:`~airflow_provider_bos.json_numbers.NumberBeyondDouble` (the
    writer refuses a record holding one). Bad input raises a ``ValueError`` like :func:`json.loads` does."""
    try:
        return _decode_exactly(data)
    except RecursionError:  # nested deeper than msgspec's recursion reaches: orjson reads up to its limit
        return orjson.loads(data)
    except msgspec.ValidationError as exc:
        if "out of range" not in str(exc):
            raise
    try:  # msgspec again, every float through the hook: its checks of the text stay the same
        return _decode_beyond_doubles(data)
    except RecursionError:
        raise ValueError("a number beyond a 64-bit float's range in JSON nested too deep to read") from None


def _float_or_beyond(text: str) -> float | NumberBeyondDouble:
    number = float(text)
    return number if math.isfinite(number) else NumberBeyondDouble(text)


_decode_beyond_doubles = msgspec.json.Decoder(float_hook=_float_or_beyond).decode


def dumps(body: Any) -> bytes:
    """A request body as compact UTF-8 JSON (stdlib ``json``: NaN and non-JSON values refused)."""
    try:
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise BosConfigurationError(f"The request cannot be sent as JSON: {exc}") from None


def same_id(a: object, b: object) -> bool:
    """JSON-RPC id equality: ``1`` and ``"1"`` differ, and a boolean is never an id."""
    return type(a) is type(b) and a == b and not isinstance(a, bool)


class IdGenerator:
    """Non-null, unique request ids: ``"bos-<uuid4 hex>-<n>"`` (thread-safe)."""

    def __init__(self) -> None:
        self._prefix = f"bos-{uuid.uuid4().hex}-"
        self._counter = itertools.count(1)
        self._lock = threading.Lock()

    def next(self) -> str:
        with self._lock:
            n = next(self._counter)
        return f"{self._prefix}{n}"


def request_envelope(request_id: str | int, method: str, params: Mapping[str, Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        body["params"] = dict(params)
    return body


def notification_envelope(method: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        body["params"] = dict(params)
    return body


def rpc_error(error: Any, method: str | None) -> BosJsonRpcError:
    """A :class:`BosJsonRpcError` from a JSON-RPC ``error`` object, with a hint for MCP's -3202x codes."""
    if not isinstance(error, Mapping) or not isinstance(error.get("code"), int) or isinstance(
        error.get("code"), bool
    ):
        raise BosProtocolError(f"Malformed JSON-RPC error object: {excerpt(str(error))}")
    code: int = error["code"]
    raw_message = error.get("message")
    message = raw_message if isinstance(raw_message, str) else ""
    data = error.get("data")
    hint = _HINTS.get(code)
    if hint:
        if code == UNSUPPORTED_PROTOCOL_VERSION and isinstance(data, Mapping) and data.get("supported"):
            hint += f" (supported: {', '.join(map(str, data['supported']))})"
        message = f"{hint}: {message}" if message else hint
    return BosJsonRpcError(code, message, data, method=method)


_B64_SENTINEL = re.compile(r"^=\?base64\?(?P<payload>.*)\?=$")
_HEADER_SAFE = re.compile(r"^[\x20-\x7E]*$")


def encode_header_value(value: str) -> str:
    """A header-safe form of ``value``: verbatim if printable ASCII without edge spaces, else base64."""
    if _HEADER_SAFE.fullmatch(value) and value == value.strip() and not _B64_SENTINEL.fullmatch(value):
        return value
    return f"=?base64?{base64.b64encode(value.encode('utf-8')).decode('ascii')}?="


def decode_header_value(value: str) -> str | None:
    """Inverse of :func:`encode_header_value`; ``None`` for a malformed sentinel."""
    match = _B64_SENTINEL.fullmatch(value)
    if match is None:
        return value
    try:
        raw = base64.b64decode(match.group("payload"), validate=True)
        return raw.decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return None
