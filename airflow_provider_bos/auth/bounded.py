"""Reading the authorization server's JSON answers (token, registration, discovery) safely.

Those answers are small documents. They are read with a size bound (a hostile or broken server
cannot make the client buffer an endless body) and parsed so that any malformed document,
including one nested deeply enough to exhaust Python's recursion limit, is a ``ValueError`` the
caller turns into its own :class:`~airflow_provider_bos.exceptions.BosError`. Redirects are never
followed: a token or metadata request must reach exactly the URL discovery validated.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

__all__ = ["MAX_JSON_BYTES", "BodyTooLarge", "send_bounded", "parse_json"]

MAX_JSON_BYTES = 1024 * 1024


class BodyTooLarge(Exception):
    """The response body exceeded the bound; ``limit`` is the bound in bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"the response body is larger than {limit} bytes")


def send_bounded(
    client: httpx.Client, method: str, url: str, *, limit: int = MAX_JSON_BYTES, **kwargs: Any
) -> tuple[httpx.Response, bytes]:
    """Send one request without auth or redirects; the response and at most ``limit`` body bytes.

    Raises :class:`BodyTooLarge` past the bound and ``httpx.HTTPError`` for transport failures.
    """
    request = client.build_request(method, url, **kwargs)
    response = client.send(request, stream=True, auth=None, follow_redirects=False)
    try:
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise BodyTooLarge(limit)
        chunks: list[bytes] = []
        size = 0
        for chunk in response.iter_bytes():
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge(limit)
            chunks.append(chunk)
    finally:
        response.close()
    return response, b"".join(chunks)


def parse_json(body: bytes) -> Any:
    """``json.loads`` where every failure, too-deep nesting included, is a ``ValueError``."""
    try:
        return json.loads(body)
    except RecursionError:
        raise ValueError("the JSON document is nested too deeply") from None
