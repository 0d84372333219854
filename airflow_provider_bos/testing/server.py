"""The BOS reference server: OAuth + MCP on loopback, in a background thread or from the CLI.

    server = BosReferenceServer(scenario="partial", access_token_ttl_s=2)
    server.start()                      # returns once the port is listening
    ... server.mcp_url, server.mint_grant(), server.counters.refreshes ...
    server.stop()

CLI: ``python -m airflow_provider_bos.testing.server --port 8765 [--scenario NAME|FILE] [--day N]``.

A scenario with ``days`` is served one day at a time: ``BosReferenceServer(day=n)``,
:meth:`BosReferenceServer.set_day` or ``POST /_bos/admin/day {"day": n}``.

Every instance has fresh in-memory state (clients, grants, sessions, counters).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import logging
import signal
import socket
import sys
import threading
from typing import Any

import uvicorn
from mcp.server.auth.routes import create_protected_resource_routes
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from airflow_provider_bos.exceptions import BosConfigurationError
from airflow_provider_bos.testing.counters import ServerCounters
from airflow_provider_bos.testing.mcp_app import MCP_PATH, McpApp
from airflow_provider_bos.testing.oauth import (
    SCOPES,
    BearerGate,
    BosOAuthProvider,
    build_as_metadata,
    metadata_endpoint,
    registration_endpoint,
    token_endpoint,
)
from airflow_provider_bos.testing.scenario import BUILTIN_SCENARIOS, Scenario, load_scenario

__all__ = ["BosReferenceServer", "ServerCounters", "main"]

logger = logging.getLogger(__name__)

SOURCE_RESULTS_DOC_PATH = "/docs/source-results-v1"
OAUTH_DOC_PATH = "/docs/oauth-client"


class _AbortFilter(logging.Filter):
    """Hide uvicorn's traceback for responses the server aborts on purpose (fault injection)."""

    def filter(self, record: logging.LogRecord) -> bool:
        from airflow_provider_bos.testing.mcp_app import StreamAborted

        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, StreamAborted)


logging.getLogger("uvicorn.error").addFilter(_AbortFilter())


def _resolve_scenario(scenario: Scenario | str) -> Scenario:
    return scenario if isinstance(scenario, Scenario) else load_scenario(scenario)


class _Uvicorn(uvicorn.Server):
    """uvicorn in a background thread that stops as soon as :meth:`request_exit` is called.

    Stock uvicorn notices ``should_exit`` on a 0.1 s tick and then sleeps another fixed 0.1 s before
    it waits, in 0.1 s steps, for open connections to close: about 0.2 s per stop, paid by every test
    that starts a reference server. Here the exit wakes the main loop at once and the drain polls
    every few milliseconds; the drain is still graceful (in-flight responses finish, up to
    ``timeout_graceful_shutdown``, then their tasks are cancelled) and the app's lifespan shutdown runs.
    """

    _DRAIN_POLL_S = 0.005

    def __init__(self, config: uvicorn.Config, started: threading.Event) -> None:
        super().__init__(config)
        self._started_event = started
        self._loop: asyncio.AbstractEventLoop | None = None
        self._exit_requested: asyncio.Event | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._exit_requested = asyncio.Event()
        await super().startup(sockets=sockets)
        self._started_event.set()

    def install_signal_handlers(self) -> None:  # the embedding thread/CLI owns signals
        pass

    def request_exit(self) -> None:
        """Stop serving (from any thread): wakes the main loop now rather than at its next tick."""
        self.should_exit = True
        loop, event = self._loop, self._exit_requested
        if loop is not None and event is not None and not loop.is_closed():
            # RuntimeError: the loop closed in between, so the server has already stopped.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(event.set)

    async def main_loop(self) -> None:
        assert self._exit_requested is not None
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 1) % 864000
            # uvicorn's 0.1 s tick (the Date header, limits), cut short by request_exit().
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exit_requested.wait(), timeout=0.1)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()  # idle keep-alive connections close now, busy ones after their response
        try:
            await asyncio.wait_for(self._drain(), timeout=self.config.timeout_graceful_shutdown)
        except TimeoutError:
            for task in self.server_state.tasks:
                task.cancel(msg="Task cancelled, timeout graceful shutdown exceeded")
        if not self.force_exit:
            await self.lifespan.shutdown()

    async def _drain(self) -> None:
        # uvicorn's connection and task sets have no event to await: a poll of a few milliseconds.
        while self.server_state.connections or self.server_state.tasks:  # noqa: ASYNC110
            await asyncio.sleep(self._DRAIN_POLL_S)
        for server in self.servers:
            await server.wait_closed()


class BosReferenceServer:
    """A faithful BOS (OAuth authorization server + MCP resource) for tests and local development."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, scenario: Scenario | str = "complete",
                 access_token_ttl_s: float = 3600, local_user: str = "demo.user@example.com",
                 time_scale: float = 1.0, allow_remote: bool = False, day: int = 1) -> None:
        if not allow_remote and not _is_loopback(host):
            raise BosConfigurationError(f"Refusing to bind the reference server to non-loopback host {host!r}; "
                                        "pass allow_remote=True (CLI: --allow-remote) if you mean it.")
        self.host = host
        self.counters = ServerCounters()
        self._lock = threading.Lock()  # the scenario and its day change together
        self._scenario = _resolve_scenario(scenario)
        self._day = self._scenario.check_day(day)
        self._reads: dict[int, int] = {}  # federated reads served per day of the current scenario
        self._access_token_ttl_s = float(access_token_ttl_s)
        self.local_user = local_user
        self.time_scale = float(time_scale)
        self._allow_remote = allow_remote
        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self._sock.listen(128)
        self.port: int = self._sock.getsockname()[1]
        url_host = f"[{host}]" if ":" in host else host
        self.base_url = f"http://{url_host}:{self.port}"
        self.issuer = self.base_url
        self.mcp_url = self.base_url + MCP_PATH
        self.resource_metadata_url = f"{self.base_url}/.well-known/oauth-protected-resource{MCP_PATH}"
        self.oauth = BosOAuthProvider(issuer=self.issuer, resource=self.mcp_url, local_user=local_user,
                                      counters=self.counters, access_token_ttl_s=self._access_token_ttl_s)
        self._apply_scenario_auth_faults()
        self.mcp = McpApp(self)
        self.app = self._build_app()
        self._thread: threading.Thread | None = None
        self._uvicorn: _Uvicorn | None = None
        self._default_client_id: str | None = None

    # -- configuration ---------------------------------------------------------------------------
    @property
    def scenario(self) -> Scenario:
        return self._scenario

    @property
    def day(self) -> int:
        """The scenario's day that reads return (1 unless set)."""
        return self._day

    @property
    def allow_remote(self) -> bool:
        """Whether the server may be reached from another host (else it binds and answers loopback only)."""
        return self._allow_remote

    def scenario_and_day(self) -> tuple[Scenario, int]:
        """The scenario and its day, read together (what one request serves)."""
        with self._lock:
            return self._scenario, self._day

    def next_read(self) -> tuple[Scenario, int, int]:
        """The scenario, its day, and how many federated reads of that day this server served before
        this one (each read of a day is observed a minute after the one before it)."""
        with self._lock:
            index = self._reads.get(self._day, 0)
            self._reads[self._day] = index + 1
            return self._scenario, self._day, index

    def set_scenario(self, scenario: Scenario | str, *, day: int = 1) -> None:
        """Replace the scenario for subsequent requests, at ``day`` (fault counters restart)."""
        resolved = _resolve_scenario(scenario)
        resolved.check_day(day)
        with self._lock:
            self._scenario, self._day = resolved, day
            self._reads = {}
        self._apply_scenario_auth_faults()
        self.mcp.reset_faults()

    def set_day(self, day: int) -> None:
        """Serve ``day`` of the scenario from the next request on (fault counters carry on).

        :raises BosConfigurationError: the scenario has no such day.
        """
        with self._lock:
            self._day = self._scenario.check_day(day)

    def set_access_token_ttl(self, seconds: float) -> None:
        """Lifetime of access tokens issued from now on."""
        self._access_token_ttl_s = float(seconds)
        self.oauth.access_token_ttl_s = float(seconds)

    def _apply_scenario_auth_faults(self) -> None:
        self.oauth.expire_after_requests = self._scenario.faults.expire_access_token_after_requests

    # -- grants and keys -------------------------------------------------------------------------
    def register_client(self, redirect_uris: list[str]) -> str:
        """Register a public client (as DCR would) and return its client_id."""
        return self.oauth.register_public_client(redirect_uris)

    def mint_grant(self, *, client_id: str | None = None, scope: str = "mcp:tools offline_access") -> dict:
        """Issue tokens directly, as if the local user had completed the browser flow."""
        if client_id is None:
            if self._default_client_id is None:
                self._default_client_id = self.register_client(["http://127.0.0.1/callback"])
            client_id = self._default_client_id
        return self.oauth.mint_grant(client_id=client_id, scope=scope)

    def create_api_key(self) -> str:
        return self.oauth.create_api_key()

    def revoke_grant_of(self, refresh_token: str) -> None:
        self.oauth.revoke_grant_of(refresh_token)

    def wait_for_cancelled_calls(self, n: int, timeout: float) -> bool:
        """Block until at least ``n`` calls were cancelled by their client (False on timeout)."""
        return self.counters.wait_until("cancelled_calls", n, timeout)

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        """Serve in a background thread; returns once the server accepts requests."""
        if self._thread is not None:
            raise RuntimeError("server already started")
        started = threading.Event()
        # log_config=None: leave the host's logging alone (pytest's capture, Airflow's handlers)
        config = uvicorn.Config(self.app, log_config=None, log_level="warning", lifespan="on",
                                timeout_graceful_shutdown=1, access_log=False, ws="none")
        self._uvicorn = _Uvicorn(config, started)
        failure: list[BaseException] = []

        def run() -> None:
            try:
                asyncio.run(self._uvicorn.serve(sockets=[self._sock]))  # type: ignore[union-attr]
            except BaseException as exc:  # noqa: BLE001 - surfaced by start()
                failure.append(exc)
            finally:
                started.set()

        self._thread = threading.Thread(target=run, name=f"bos-reference-server-{self.port}", daemon=True)
        self._thread.start()
        started.wait()
        if failure or not self._uvicorn.started:
            raise RuntimeError(f"BOS reference server failed to start: {failure[0] if failure else 'unknown'}")

    def stop(self) -> None:
        if self._thread is None:
            self._sock.close()
            return
        assert self._uvicorn is not None
        self.mcp.shutdown()  # end stalls and keepalive waits first, so the drain does not wait on them
        self._uvicorn.request_exit()
        self._thread.join(timeout=10)
        self._thread = None
        self._sock.close()

    def serve_forever(self) -> None:
        """Serve in the calling (main) thread until SIGINT/SIGTERM (the CLI)."""
        mcp = self.mcp

        class _CliServer(uvicorn.Server):
            def handle_exit(self, sig: int, frame: Any) -> None:
                mcp.shutdown()  # end stalls and keepalive waits now, not after the grace period
                super().handle_exit(sig, frame)

        config = uvicorn.Config(self.app, log_level="info", lifespan="on", timeout_graceful_shutdown=2,
                                access_log=False, ws="none")
        # uvicorn re-raises the captured signal after its graceful shutdown, to the handler that was
        # installed before it started: make that a no-op so a signal means a clean exit (status 0).
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda signum, frame: None)
        asyncio.run(_CliServer(config).serve(sockets=[self._sock]))
        self._sock.close()

    def __enter__(self) -> BosReferenceServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the ASGI app ----------------------------------------------------------------------------
    def _build_app(self) -> Starlette:
        routes: list[Route] = []
        routes += create_protected_resource_routes(
            resource_url=self.mcp_url,  # type: ignore[arg-type]  # validated by the metadata model
            authorization_servers=[self.issuer],  # type: ignore[list-item]
            scopes_supported=list(SCOPES),
            resource_name="BOS Platform",
            resource_documentation=self.base_url + OAUTH_DOC_PATH,  # type: ignore[arg-type]
        )
        as_metadata = build_as_metadata(issuer=self.issuer, docs_url=self.base_url + OAUTH_DOC_PATH)
        routes += [
            Route("/.well-known/oauth-authorization-server", metadata_endpoint(as_metadata), methods=["GET"]),
            Route("/authorize", _sdk_authorize(self.oauth), methods=["GET", "POST"]),
            Route("/token", token_endpoint(self.oauth), methods=["POST"]),
            Route("/register", registration_endpoint(self.oauth), methods=["POST"]),
            Route(MCP_PATH, BearerGate(self.mcp, self.oauth, resource_metadata_url=self.resource_metadata_url,
                                       counters=self.counters), methods=["GET", "POST", "DELETE"]),
            Route(SOURCE_RESULTS_DOC_PATH, self._doc_source_results, methods=["GET"]),
            Route(OAUTH_DOC_PATH, self._doc_oauth, methods=["GET"]),
            Route("/_bos/admin/scenario", self._admin_scenario, methods=["POST"]),
            Route("/_bos/admin/day", self._admin_day, methods=["GET", "POST"]),
            Route("/_bos/admin/counters", self._admin_counters, methods=["GET"]),
        ]
        return Starlette(routes=routes, lifespan=lambda app: self.mcp.lifespan())

    async def _doc_source_results(self, request: Request) -> Response:
        return PlainTextResponse(
            "BOS Service - bos/source-results/v1 (reference server)\n\n"
            "This local server implements the bos/source-results/v1 MCP delivery extension as specified in\n"
            "the BOS public API contract 'Stream authorized source results', version 1.\n")

    async def _doc_oauth(self, request: Request) -> Response:
        return PlainTextResponse(
            "BOS Platform - OAuth client reference (reference server)\n\n"
            f"MCP resource: {self.mcp_url}\nIssuer: {self.issuer}\n"
            f"The authorization endpoint auto-consents for the local user {self.local_user}.\n")

    async def _admin_scenario(self, request: Request) -> Response:
        try:
            document = await request.json()
        except ValueError:
            return JSONResponse({"error": "body must be JSON"}, status_code=400)
        try:
            if isinstance(document, dict) and set(document) == {"name"}:
                # Builtin names only: over HTTP, a name must never be read as a server-side file path.
                name = document["name"]
                if not isinstance(name, str) or name not in BUILTIN_SCENARIOS:
                    return JSONResponse({"error": "unknown builtin scenario; builtins: "
                                         f"{', '.join(sorted(BUILTIN_SCENARIOS))}"}, status_code=400)
                self.set_scenario(name)
            else:
                self.set_scenario(Scenario.model_validate(document))
        except (BosConfigurationError, ValidationError) as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        return JSONResponse({"scenario": self._scenario.name})

    async def _admin_day(self, request: Request) -> Response:
        if request.method == "GET":
            scenario, day = self.scenario_and_day()
            return JSONResponse({"scenario": scenario.name, "day": day, "days": scenario.day_count})
        try:
            document = await request.json()
        except ValueError:
            return JSONResponse({"error": "body must be JSON"}, status_code=400)
        if not isinstance(document, dict) or set(document) != {"day"}:
            return JSONResponse({"error": 'body must be {"day": <day number>}'}, status_code=400)
        try:
            self.set_day(document["day"])
        except BosConfigurationError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        scenario, day = self.scenario_and_day()
        return JSONResponse({"scenario": scenario.name, "day": day, "days": scenario.day_count})

    async def _admin_counters(self, request: Request) -> Response:
        return JSONResponse(self.counters.snapshot())


def _sdk_authorize(provider: BosOAuthProvider) -> Any:
    from mcp.server.auth.handlers.authorize import AuthorizationHandler

    return AuthorizationHandler(provider).handle


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m airflow_provider_bos.testing.server",
                                     description="Run the BOS reference server (OAuth + MCP) locally.")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--scenario", default="complete", help="builtin scenario name or a scenario JSON file")
    parser.add_argument("--day", type=int, default=1, metavar="N", help="the scenario's day to serve (default 1)")
    parser.add_argument("--access-token-ttl", type=float, default=3600.0, metavar="S")
    parser.add_argument("--time-scale", type=float, default=1.0, help="multiplier for simulated source delays")
    parser.add_argument("--allow-remote", action="store_true", help="allow a non-loopback --host")
    args = parser.parse_args(argv)
    try:
        server = BosReferenceServer(host=args.host, port=args.port, scenario=args.scenario,
                                    access_token_ttl_s=args.access_token_ttl, time_scale=args.time_scale,
                                    allow_remote=args.allow_remote, day=args.day)
    except (BosConfigurationError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"BOS reference server: MCP URL {server.mcp_url}", flush=True)
    print(f"scenario {server.scenario.name!r}, day {server.day} of {server.scenario.day_count}; Ctrl-C to stop",
          flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
