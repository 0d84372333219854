"""The native loopback callback: a one-shot HTTP listener on 127.0.0.1 for the OAuth redirect.

It works when the browser runs on the same machine as the listener (RFC 8252 §7.3). The server
supplies no remote relay; on a headless host use the paste mode of the connect command instead.

Anything on the machine can send a request to the listener's port. Only a request carrying the
``state`` of this sign-in (see :meth:`LoopbackCallbackListener.expect_state`) is taken as the
callback; any other gets HTTP 400 and the listener keeps waiting for the real one.
"""

from __future__ import annotations

import hmac
import socket
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from airflow_provider_bos.exceptions import BosCallbackError, BosConfigurationError

__all__ = ["LoopbackCallbackListener", "RULE_CALLBACK_TIMEOUT"]

RULE_CALLBACK_TIMEOUT = "callback-timeout"

_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>BOS connect</title></head>
<body style="font-family: sans-serif; margin: 3em"><h1>{title}</h1><p>{text}</p></body></html>"""


class _Server(HTTPServer):
    # A port the last sign-in's connection left in TIME_WAIT can be bound again at once (SO_REUSEADDR);
    # a port another listener holds is still refused (that needs SO_REUSEPORT, never set).
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], listener: LoopbackCallbackListener) -> None:
        self.listener = listener
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "airflow-provider-bos"
    sys_version = ""

    def do_GET(self) -> None:  # http.server naming
        listener = self.server.listener
        if urlsplit(self.path).path != listener.path:
            self._answer(404, "Not found", "This listener only serves the BOS sign-in callback.")
            return
        query = parse_qsl(urlsplit(self.path).query, keep_blank_values=True)
        if not listener._carries_expected_state(query):
            self._answer(400, "Not this sign-in", "This request does not belong to the sign-in in progress.")
            return
        first = listener._deliver(f"{listener.base_url}{self.path}")
        if not first:
            self._answer(
                409, "Already received", "The sign-in callback was already received; close this tab."
            )
        elif any(name == "error" for name, _ in query):
            # Never echo query values back into the page: they are untrusted and may be secret.
            self._answer(200, "Sign-in was not completed", "Return to the terminal for details.")
        else:
            self._answer(200, "Sign-in received", "You can close this tab and return to the terminal.")

    def _answer(self, status: int, title: str, text: str) -> None:
        body = _PAGE.format(title=title, text=text).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("Referrer-Policy", "no-referrer")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # `format`: the base class names it so
        # The default logs the request line, which holds the authorization code: stay silent.
        return


class LoopbackCallbackListener:
    """Serve ``http://127.0.0.1:<port><path>`` in a thread until one callback arrives.

    ``redirect_uri`` is the exact URI to register; :meth:`wait` returns the full callback URL the
    browser was sent to. Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, path: str = "/callback") -> None:
        if not path.startswith("/"):
            path = "/" + path
        self.host = host
        self.path = path
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callback_url: str | None = None
        self._expected_state: str | None = None
        try:
            self._server = _Server((host, port), self)
        except OSError as exc:
            raise BosConfigurationError(
                f"Cannot listen for the OAuth callback on {host}:{port} ({exc.strerror or exc}); "
                "pass another --port (or 0 for any free one), or stop what holds it."
            ) from None
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="bos-oauth-callback",
            daemon=True,
        )
        self._thread.start()

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def redirect_uri(self) -> str:
        return f"{self.base_url}{self.path}"

    def expect_state(self, state: str) -> None:
        """Accept only a callback whose single ``state`` parameter is ``state`` (set before the
        authorization URL is shown; until then every request is refused)."""
        with self._lock:
            self._expected_state = state

    def _carries_expected_state(self, query: list[tuple[str, str]]) -> bool:
        with self._lock:
            expected = self._expected_state
        states = [value for name, value in query if name == "state"]
        return (
            expected is not None
            and len(states) == 1
            and hmac.compare_digest(states[0].encode("utf-8"), expected.encode("utf-8"))
        )

    def _deliver(self, url: str) -> bool:
        with self._lock:
            if self._callback_url is not None:
                return False
            self._callback_url = url
        self._event.set()
        return True

    def wait(self, timeout: float | None = None) -> str:
        """The callback URL; :class:`BosCallbackError` (rule ``callback-timeout``) if none arrives."""
        if not self._event.wait(timeout):
            raise BosCallbackError(
                f"No sign-in callback arrived at {self.redirect_uri} within {timeout:g} s; "
                "run connect again.",
                rule=RULE_CALLBACK_TIMEOUT,
            )
        assert self._callback_url is not None
        return self._callback_url

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> LoopbackCallbackListener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"LoopbackCallbackListener({self.redirect_uri!r})"
