"""What every response of the page carries, and what the access log may learn of the OAuth callback.

Headers: the page is never framed (``X-Frame-Options: DENY``, CSP ``frame-ancestors 'none'``; the
Admin menu opens it in its own tab), loads nothing (``default-src 'none'``) but its one inline style
sheet (allowed by hash), runs no script, and sends no referrer off-site. ``form-action`` is not
restricted: after Connect the browser is redirected to BOS's sign-in, which it would block.

The callback's query carries the authorization code. The API server's access log line is written
from the request's ASGI scope by Airflow's ``HttpAccessLogMiddleware`` (logger ``http.access``),
after the response, whatever refused the request (no session, no edit right, an unknown state).
Before the response starts this middleware replaces the callback's query string in that shared
scope with its parameter names only, so the line says ``code=***&state=***`` and no value is
registered with the secrets masker on a visitor's say-so. The route has read the query by then.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from airflow_provider_bos.plugins.pages import style_hash

__all__ = ["PageHeadersMiddleware", "names_only"]


def _policy() -> str:
    return (
        f"default-src 'none'; style-src {style_hash()}; img-src 'self'; frame-ancestors 'none'; "
        "base-uri 'none'"
    )


def names_only(query: bytes) -> bytes:
    """``code=abc&state=xyz`` -> ``code=***&state=***``: what a log line may say about a query."""
    pairs = parse_qsl(query.decode("latin-1"), keep_blank_values=True)
    return urlencode([(name[:40], "***") for name, _value in pairs[:20]], safe="*").encode("ascii")


class PageHeadersMiddleware:
    def __init__(self, app: ASGIApp, *, callback_path: str) -> None:
        self.app = app
        self.callback_path = callback_path
        self.headers: list[tuple[bytes, bytes]] = [
            (b"x-frame-options", b"DENY"),
            (b"content-security-policy", _policy().encode("ascii")),
            (b"x-content-type-options", b"nosniff"),
            (b"referrer-policy", b"same-origin"),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path, root = str(scope.get("path", "")), str(scope.get("root_path", ""))
        is_callback = path.removeprefix(root).rstrip("/") == self.callback_path

        def scrub() -> None:
            if is_callback and scope.get("query_string"):
                scope["query_string"] = names_only(scope["query_string"])

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                scrub()
                names = {name.lower() for name, _value in message.get("headers", [])}
                extra = [(name, value) for name, value in self.headers if name not in names]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        finally:
            scrub()  # also when no response was started (an exception on the way out)
