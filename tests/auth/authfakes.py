"""An in-process fake of BOS discovery responses (httpx.MockTransport), for the validation rules
the real reference server cannot be made to break."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx

ORIGIN = "https://bos.example"
RESOURCE = f"{ORIGIN}/mcp/apps/bos/platform"
PRM_URL = f"{ORIGIN}/.well-known/oauth-protected-resource/mcp/apps/bos/platform"


@dataclass
class FakeBos:
    """Serves a valid discovery chain; tests break one piece of it."""

    challenge_status: int = 401
    challenge_header: str | None = f'Bearer resource_metadata="{PRM_URL}"'
    protected: dict[str, Any] = field(
        default_factory=lambda: {"resource": RESOURCE, "authorization_servers": [ORIGIN]}
    )
    as_metadata: dict[str, Any] = field(
        default_factory=lambda: {
            "issuer": ORIGIN,
            "authorization_endpoint": f"{ORIGIN}/authorize",
            "token_endpoint": f"{ORIGIN}/token",
            "registration_endpoint": f"{ORIGIN}/register",
            "code_challenge_methods_supported": ["S256"],
            "scopes_supported": ["mcp:tools", "offline_access"],
        }
    )
    overrides: dict[str, httpx.Response] = field(default_factory=dict)  # url -> canned response
    requests: list[httpx.Request] = field(default_factory=list)

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        url = str(request.url)
        if url in self.overrides:
            return self.overrides[url]
        if request.method == "POST" and url == RESOURCE:
            headers = {"WWW-Authenticate": self.challenge_header} if self.challenge_header else {}
            return httpx.Response(self.challenge_status, headers=headers, json={"error": "unauthorized"})
        if request.method == "GET" and url == PRM_URL:
            return httpx.Response(200, json=self.protected)
        if request.method == "GET" and url == f"{ORIGIN}/.well-known/oauth-authorization-server":
            return httpx.Response(200, json=self.as_metadata)
        return httpx.Response(404, text="not found")

    def client(self) -> httpx.Client:
        return httpx.Client(transport=httpx.MockTransport(self.handler))


def json_response(status: int, payload: Any) -> httpx.Response:
    return httpx.Response(
        status, content=json.dumps(payload).encode(), headers={"content-type": "application/json"}
    )
