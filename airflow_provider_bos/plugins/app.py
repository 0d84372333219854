"""The BOS page: a FastAPI app the API server mounts at ``/bos`` (see :mod:`.plugin`).

Routes (all behind Airflow's auth manager: connection *edit* permission, and per connection id):

- ``GET /``: every ``bos`` Connection the user may edit, with its grant state (store facts, and a
  live probe when ``[core] test_connection`` is Enabled).
- ``POST /connections/{id}/connect``: Connect / Reconnect an existing Connection (303 to BOS sign-in).
- ``POST /connect``: Connect a new Connection (also needs connection *create* permission).
- ``GET /callback``: the OAuth redirect URI; finishes the sign-in, stores the grant, saves the Connection.
- ``POST /connections/{id}/check``: discovery + ``bos_get_context``, shows the contexts.
- ``GET /health/...``: the sync-health page (:mod:`.health_routes`; DAG read permission, per DAG).

POSTs need the page's CSRF token (and a same-origin ``Origin`` when sent); the callback is bound to
its pending sign-in (state, single use, expiry) and to the user who started it. Every request the
page makes to BOS follows :mod:`.outbound` (allowed hosts, public addresses, one deadline per action);
token stores are opened only as :func:`.access.check_token_store` allows, read-only to list them,
and their databases are dialled under the same host policy (:mod:`.stores`); the page never shows a
database driver's error text (:func:`.grant_status.store_error_text`). Responses forbid framing
and carry a strict Content-Security-Policy; the callback's query never reaches the access log.
What the page logs of a request (its path, a resource URL, an error) is escaped to printable text.
The "Connected" notice is shown only for a Connection the user may edit, when the callback signed it.
"""

from __future__ import annotations

import logging
import re
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Annotated, Any

import httpx
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_connection
from fastapi import Depends, FastAPI, Form, HTTPException, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from airflow_provider_bos.auth.urls import parse_url
from airflow_provider_bos.exceptions import (
    BosConfigurationError,
    BosError,
    BosTokenStoreError,
    BosTransportError,
)
from airflow_provider_bos.plugins import connections as airflow_conns
from airflow_provider_bos.plugins.access import check_token_store, is_authorized
from airflow_provider_bos.plugins.checks import check_contexts, probe
from airflow_provider_bos.plugins.csrf import (
    csrf_token,
    csrf_valid,
    notice_token,
    notice_valid,
    page_csrf_key,
    same_origin,
)
from airflow_provider_bos.plugins.grant_status import GrantStatus, grant_status, store_error_text
from airflow_provider_bos.plugins.headers import PageHeadersMiddleware
from airflow_provider_bos.plugins.health_routes import health_router
from airflow_provider_bos.plugins.outbound import Deadline, OutboundPolicy, page_client
from airflow_provider_bos.plugins.pages import PERMISSION_NOTE, contexts_page, message_page, status_page
from airflow_provider_bos.plugins.pending import ConnectTarget, PendingConnectStore
from airflow_provider_bos.plugins.settings import (
    TEST_CONNECTION_ENABLED,
    outbound_policy,
    test_connection_mode,
)
from airflow_provider_bos.plugins.stores import open_page_store
from airflow_provider_bos.plugins.web_connect import begin_web_connect, finish_web_connect
from airflow_provider_bos.redaction import add_secret_sink, printable

if TYPE_CHECKING:
    pass

__all__ = ["URL_PREFIX", "create_app"]

URL_PREFIX = "/bos"
log = logging.getLogger(__name__)
# Airflow's own rule for connection ids (airflow.utils.helpers.validate_key).
_CONN_ID = re.compile(r"^[\w.-]{1,250}$")
# The most of one request-supplied value a log line carries.
_LOG_LIMIT = 500


def _loggable(value: object) -> str:
    """``value`` as a log line may carry it: secrets redacted, control and format characters escaped
    (no forged lines, no terminal escapes), cut to :data:`_LOG_LIMIT`."""
    return printable(str(value), limit=_LOG_LIMIT)


def _shown(exc: BosError) -> str:
    """What the page shows of an error: a token store's failure generically (its text may be a
    database driver's, about a database the Connection's editor chose), anything else as it is."""
    return store_error_text(exc) if isinstance(exc, BosTokenStoreError) else str(exc)


# --- request helpers ------------------------------------------------------------------------------


def _home(request: Request) -> str:
    """This app's own root URL path (the mount prefix, whatever Airflow mounted it under)."""
    return str(request.scope.get("root_path", "")).rstrip("/") + "/"


def _server_url(request: Request) -> str:
    from airflow.configuration import conf

    base = conf.get("api", "base_url", fallback="") or ""
    return base.rstrip("/") if base.startswith(("http://", "https://")) else str(request.base_url).rstrip("/")


def _callback_uri(request: Request) -> str:
    from airflow.configuration import conf

    base = conf.get("api", "base_url", fallback="") or ""
    if base.startswith(("http://", "https://")):
        return f"{base.rstrip('/')}{URL_PREFIX}/callback"
    return str(request.url_for("bos_callback"))


async def _require_csrf(
    request: Request, user: GetUserDep, csrf_token: Annotated[str | None, Form()] = None
) -> None:
    if not same_origin(request.headers.get("origin"), _server_url(request)):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "This form was posted from another site (CSRF).")
    if not csrf_valid(str(user.get_id()), csrf_token, key=page_csrf_key()):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            "The form's CSRF token is missing or expired, or was issued to another user; reload the page.",
        )


CsrfDep = Depends(_require_csrf)


def _authorize(user: Any, conn_id: str, method: str) -> None:
    if not is_authorized(user, conn_id, method):
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"Forbidden: {PERMISSION_NOTE}")


def _require_test_connection() -> None:
    # Airflow's own connection test answers the same way when [core] test_connection is not Enabled.
    if test_connection_mode() != TEST_CONNECTION_ENABLED:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            "Testing connections is disabled in Airflow configuration ([core] test_connection). "
            "Contact your deployment admin to enable it.",
        )


def _pending_store() -> PendingConnectStore:
    from airflow import settings

    from airflow_provider_bos.hooks.connections import airflow_fernet_cipher

    if settings.engine is None:  # Airflow's ORM is not configured in this process
        raise BosConfigurationError(
            "The BOS page keeps pending sign-ins in Airflow's metadata database, which this process "
            "has not configured; open the page through the Airflow API server."
        )
    return PendingConnectStore(settings.engine, cipher=airflow_fernet_cipher())


def _html(content: str, status_code: int = 200) -> HTMLResponse:
    return HTMLResponse(content, status_code=status_code, headers={"Cache-Control": "no-store"})


# --- grant state ----------------------------------------------------------------------------------


def _status_of(conn: Any, user: Any, *, probed: bool, policy: OutboundPolicy, deadline: Deadline) -> GrantStatus:
    target = airflow_conns.target_of(conn)
    extra = airflow_conns.extra_of(conn)
    auth_type = str(extra.get("auth_type") or "oauth").lower()
    label = airflow_conns.token_store_label(target)
    if auth_type == "api_key":
        return grant_status(
            conn.conn_id, target.resource_url, auth_type=auth_type, row=None, token_store=label
        )
    try:
        check_token_store(user, target)
        store = open_page_store(target, read_only=True, policy=policy, deadline=deadline)
        try:
            row = store.raw_row(conn.conn_id)
        finally:
            store.dispose()
    except Exception as exc:  # noqa: BLE001 - an unreadable store is shown, not raised
        log.warning(
            "BOS page: the token store of %r could not be read: %s: %s",
            conn.conn_id, type(exc).__name__, _loggable(exc),
        )
        return grant_status(
            conn.conn_id,
            target.resource_url,
            auth_type=auth_type,
            row=None,
            token_store=label,
            store_error=exc,
        )
    live = probed and row is not None and bool(row.get("refresh_token"))
    probe_error = (
        probe(conn.conn_id, target.resource_url, policy=policy, deadline=deadline) if live else None
    )
    return grant_status(
        conn.conn_id,
        target.resource_url,
        auth_type=auth_type,
        row=row,
        token_store=label,
        probe_error=probe_error,
        probed=probed,
    )


# --- the app --------------------------------------------------------------------------------------


def _feed_api_server_masker() -> None:
    """Send our secrets to airflow-core's masker: the API server's access log redacts with it (not with
    the Task SDK's), and it logs the callback's query, authorization code included."""
    from airflow._shared.secrets_masker import mask_secret

    add_secret_sink(mask_secret)


class _PageApp(FastAPI):
    """The page's FastAPI app, with its headers and the callback's log scrubbing outermost, so that
    they apply to every response, the internal-error page included (added with ``add_middleware``
    they would sit inside Starlette's error handler)."""

    def build_middleware_stack(self) -> Any:
        return PageHeadersMiddleware(super().build_middleware_stack(), callback_path="/callback")


def create_app() -> FastAPI:
    _feed_api_server_masker()
    app = _PageApp(title="BOS connections", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == status.HTTP_401_UNAUTHORIZED and request.method == "GET":
            from airflow.api_fastapi.app import get_auth_manager

            # Back to the page after the login, but never to the callback: its query (the code)
            # would travel through the login page's URL and its access log line.
            back = f"{_server_url(request)}{_home(request)}" if request.url.path.rstrip("/").endswith(
                "/callback"
            ) else str(request.url)
            return RedirectResponse(get_auth_manager().get_url_login(next_url=back), status_code=303)
        title = "Not allowed" if exc.status_code in (401, 403) else "Request failed"
        detail = exc.detail if isinstance(exc.detail, str) else "The request was refused."
        if (
            exc.status_code == status.HTTP_403_FORBIDDEN
            and "Forbidden" in detail
            and "auth manager" not in detail
        ):
            detail = f"{detail}. {PERMISSION_NOTE}"
        return _html(message_page(title, detail, home=_home(request)), exc.status_code)

    @app.exception_handler(BosError)
    async def _bos_error(request: Request, exc: BosError) -> Response:
        code = (
            status.HTTP_502_BAD_GATEWAY if isinstance(exc, BosTransportError) else status.HTTP_400_BAD_REQUEST
        )
        log.warning("BOS page: %s failed: %s", _loggable(request.url.path), _loggable(exc))
        return _html(message_page("BOS request failed", _shown(exc), home=_home(request)), code)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.error("BOS page: %s failed with %s", _loggable(request.url.path), type(exc).__name__, exc_info=exc)
        message = f"Unexpected {type(exc).__name__}; the API server log has the details."
        return _html(message_page("Internal error", message, home=_home(request)), 500)

    edit = Depends(requires_access_connection(method="PUT"))

    @app.get("/", dependencies=[edit], response_class=HTMLResponse)
    def index(
        request: Request, user: GetUserDep, connected: str | None = None, sig: str | None = None
    ) -> HTMLResponse:
        conns = [c for c in airflow_conns.bos_connections() if is_authorized(user, c.conn_id, "PUT")]
        mode = test_connection_mode()
        policy, deadline = outbound_policy(), Deadline()  # one deadline for every probe of this view

        def status_of(conn: Any) -> GrantStatus:
            return _status_of(
                conn, user, probed=mode == TEST_CONNECTION_ENABLED, policy=policy, deadline=deadline
            )

        with ThreadPoolExecutor(max_workers=min(8, max(1, len(conns)))) as pool:
            statuses = list(pool.map(status_of, conns))
        notice = None
        # Only a notice the callback signed for this user, about a Connection this page lists: a
        # link cannot put text of its choosing into the success notice.
        if connected and notice_valid(str(user.get_id()), connected, sig, key=page_csrf_key()) and any(
            conn.conn_id == connected for conn in conns
        ):
            notice = f"Connected {connected!r}: the grant is in the token store."
        csrf = csrf_token(str(user.get_id()), key=page_csrf_key())
        return _html(status_page(statuses, csrf=csrf, home=_home(request), notice=notice, check_mode=mode))

    def _start(request: Request, user: Any, target: ConnectTarget) -> RedirectResponse:
        try:  # validated before it reaches a log line (it is whatever the form or the Connection said)
            parse_url(target.resource_url)
        except ValueError:
            raise HTTPException(
                status.HTTP_400_BAD_REQUEST,
                "The MCP resource URL must be an absolute http(s) URL without spaces or control characters.",
            ) from None
        log.info(
            "BOS connect started for %r by user %r (resource %s)",
            target.conn_id,
            user.get_id(),
            _loggable(target.resource_url),
        )
        check_token_store(user, target)
        with page_client(outbound_policy(), Deadline()) as client:
            url = begin_web_connect(
                target,
                redirect_uri=_callback_uri(request),
                user_id=str(user.get_id()),
                pending=_pending_store(),
                http_client=client,
            )
        return RedirectResponse(url, status_code=status.HTTP_303_SEE_OTHER)

    @app.post("/connections/{connection_id:path}/connect", dependencies=[edit, CsrfDep])
    def reconnect(request: Request, connection_id: str, user: GetUserDep) -> RedirectResponse:
        _authorize(user, connection_id, "PUT")
        conn = airflow_conns.find_connection(connection_id)
        if conn is None or conn.conn_type != "bos":
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"No bos Connection {connection_id!r}.")
        return _start(request, user, airflow_conns.target_of(conn))

    @app.post("/connect", dependencies=[CsrfDep])
    def connect_new(
        request: Request,
        user: GetUserDep,
        conn_id: Annotated[str, Form()],
        resource_url: Annotated[str, Form()],
        token_store_conn_id: Annotated[str | None, Form()] = None,
    ) -> RedirectResponse:
        conn_id, resource_url = conn_id.strip(), resource_url.strip()
        if not _CONN_ID.match(conn_id):
            raise HTTPException(
                status.HTTP_400_BAD_REQUEST, "A connection id is 1-250 letters, digits, '_', '.' or '-'."
            )
        existing = airflow_conns.find_connection(conn_id)
        _authorize(user, conn_id, "PUT" if existing is not None else "POST")
        if existing is not None and existing.conn_type != "bos":
            raise HTTPException(
                status.HTTP_409_CONFLICT,
                f"Connection {conn_id!r} exists with type {existing.conn_type!r}; pick another id.",
            )
        target = ConnectTarget(
            conn_id=conn_id,
            resource_url=resource_url,
            token_store_conn_id=(token_store_conn_id or "").strip() or None,
        )
        if existing is not None:  # keep its token store settings unless a new one is given
            current = airflow_conns.target_of(existing)
            target = ConnectTarget(
                conn_id,
                resource_url,
                target.token_store_conn_id or current.token_store_conn_id,
                None if target.token_store_conn_id else current.token_store_url,
            )
        return _start(request, user, target)

    @app.get("/callback", name="bos_callback", dependencies=[edit])
    def callback(request: Request, user: GetUserDep) -> RedirectResponse:
        def authorize(target: ConnectTarget) -> None:
            _authorize(user, target.conn_id, "PUT")
            check_token_store(user, target)

        policy, deadline = outbound_policy(), Deadline()

        def open_store(target: ConnectTarget) -> Any:
            return open_page_store(target, read_only=False, policy=policy, deadline=deadline)

        with page_client(policy, deadline) as client:
            try:
                target, outcome, grant = finish_web_connect(
                    str(request.url),
                    user_id=str(user.get_id()),
                    pending=_pending_store(),
                    open_token_store=open_store,
                    http_client=client,
                    authorize=authorize,
                )
            except BosError as exc:
                log.warning("BOS connect failed for user %r: %s", user.get_id(), _loggable(exc))
                raise
        airflow_conns.save_connected(target, outcome)
        log.info(
            "BOS connect finished for %r by user %r: client %s, grant generation %d",
            target.conn_id,
            user.get_id(),
            outcome.client_id,
            grant.generation,
        )
        home = _home(request)
        signed = notice_token(str(user.get_id()), target.conn_id, key=page_csrf_key())
        return RedirectResponse(
            f"{home}?{httpx.QueryParams(connected=target.conn_id, sig=signed)}", status_code=status.HTTP_303_SEE_OTHER
        )

    @app.post("/connections/{connection_id:path}/check", dependencies=[edit, CsrfDep], response_class=HTMLResponse)
    def check(request: Request, connection_id: str, user: GetUserDep) -> HTMLResponse:
        _authorize(user, connection_id, "PUT")
        _require_test_connection()
        conn = airflow_conns.find_connection(connection_id)
        if conn is None or conn.conn_type != "bos":
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"No bos Connection {connection_id!r}.")
        target = airflow_conns.target_of(conn)
        if str(airflow_conns.extra_of(conn).get("auth_type") or "oauth").lower() != "api_key":
            check_token_store(user, target)
        contexts = check_contexts(
            connection_id, target.resource_url, policy=outbound_policy(), deadline=Deadline()
        )
        return _html(contexts_page(connection_id, contexts, home=_home(request)))

    app.include_router(health_router(URL_PREFIX))
    return app
