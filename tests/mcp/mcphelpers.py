"""Helpers shared by the mcp tests."""

from __future__ import annotations

from collections.abc import Generator

import httpx


class Bearer(httpx.Auth):
    """The minimal auth this room needs: a fixed bearer token (the OAuth classes live in auth/)."""

    def __init__(self, token: str) -> None:
        self._token = token

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = f"Bearer {self._token}"
        yield request
