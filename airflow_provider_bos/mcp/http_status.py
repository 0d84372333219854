"""The HTTP layer of an MCP answer: status to typed error, content type, bounded error bodies.

Every response is checked here (status, then Content-Type) before anything is parsed; nothing
of an error body beyond :data:`ERROR_BODY_LIMIT` is read. :func:`abort` closes a response's
socket from another thread (``McpSession.cancel``).
"""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Mapping
from typing import Any

import httpx

from airflow_provider_bos.exceptions import (
    BosAuthError,
    BosHttpError,
    BosIncompleteStreamError,
    BosProtocolError,
    BosRetryableHttpError,
    BosSessionExpired,
    excerpt,
)
from airflow_provider_bos.mcp.jsonrpc import loads, rpc_error
from airflow_provider_bos.mcp.retry import parse_retry_after

__all__ = [
    "ERROR_BODY_LIMIT", "abort", "body_too_large", "body_read_failed", "declared_length", "error_excerpt",
    "media_type", "raise_for_status", "read_limited",
]

logger = logging.getLogger(__name__)

ERROR_BODY_LIMIT = 64 * 1024


def raise_for_status(response: httpx.Response, method: str, url: str, *, in_session: bool) -> None:
    """Raise the typed error an HTTP status means for ``method``; return for a usable 2xx.

    ``in_session``: a 2025-era session id was sent, so a 404 means the server forgot the session.
    """
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
    if status == 404 and in_session:
        raise BosSessionExpired(f"BOS no longer knows this MCP session (HTTP 404 on {method}).")
    if status in (429, 502, 503, 504):
        raise BosRetryableHttpError(
            f"BOS is busy or unavailable for {method}",
            retry_after=parse_retry_after(response.headers.get("retry-after")),
            status_code=status,
            content_type=response.headers.get("content-type"),
            body_excerpt=error_excerpt(response),
            url=url,
        )
    body = read_limited(response, ERROR_BODY_LIMIT)
    if media_type(response) == "application/json":
        try:
            message = loads(body)
        except ValueError:
            message = None
        if isinstance(message, Mapping) and isinstance(message.get("error"), Mapping):
            err = rpc_error(message["error"], method)
            err.http_status = status
            raise err
    raise BosHttpError(
        f"BOS answered {method} with an unexpected status",
        status_code=status,
        content_type=response.headers.get("content-type"),
        body_excerpt=excerpt(body) if body else None,
        url=url,
    )


def media_type(response: httpx.Response) -> str:
    content_type: str = response.headers.get("content-type", "")
    return content_type.split(";", 1)[0].strip().lower()


def read_limited(response: httpx.Response, limit: int) -> bytes:
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


def declared_length(response: httpx.Response) -> int | None:
    """The size of the body as read, by its Content-Length; None if absent, not a number, or encoded.

    A compressed body's Content-Length counts the compressed bytes, not what is read: unknown.
    """
    if response.headers.get("content-encoding", "identity").strip().lower() != "identity":
        return None
    length = response.headers.get("content-length", "")
    return int(length) if length.isdigit() else None


def body_too_large(method: str, limit: int) -> BosProtocolError:
    """A JSON body that would be held whole is over ``limit`` (the session's ``max_event_bytes``)."""
    return BosProtocolError(
        f"BOS answered {method} with a JSON body over the maximum size of {limit} bytes; raise "
        "max_event_bytes (a bos Connection's 'Largest event (MiB)' field, max_event_mib) if answers this "
        "large are expected (a read with stream_records=True holds no whole body)."
    )


def body_read_failed(method: str, exc: httpx.HTTPError, http_timeout: object, *,
                     observations: Any = None) -> BosIncompleteStreamError:
    """The error of a body that stopped arriving (or decoding) before its end: nothing is confirmed."""
    limit = (f" within the HTTP timeout of {http_timeout}s; raise the connection's 'HTTP timeout' "
             "if the server is slow to answer" if isinstance(exc, httpx.ReadTimeout) else "")
    return BosIncompleteStreamError(
        f"The connection failed while reading the response to {method} ({type(exc).__name__}){limit}.",
        observations=observations,
    )


def error_excerpt(response: httpx.Response) -> str | None:
    body = read_limited(response, ERROR_BODY_LIMIT)
    return excerpt(body) if body else None


def _challenge_param(challenge: str, name: str) -> str | None:
    """A parameter of a WWW-Authenticate challenge (e.g. ``error``); the header holds no secret."""
    match = re.search(rf'{name}="([^"]*)"', challenge) or re.search(rf"{name}=([^,\s]+)", challenge)
    return excerpt(match.group(1), 80) if match else None


def abort(response: httpx.Response) -> None:
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
    except Exception:  # best effort from a foreign thread
        logger.debug("Closing the in-flight response failed.", exc_info=True)
