"""BosHook: an Airflow Connection of type ``bos`` turned into a connected MCP session.

Thin by design (like ``providers/http``): it reads the Connection, builds the auth (OAuth grant
from the token store, or an API key), opens an :class:`~airflow_provider_bos.mcp.McpSession` and
exposes the calls a TaskFlow user needs. All protocol logic lives in ``auth/`` and ``mcp/``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import httpx
from airflow.sdk import BaseHook

from airflow_provider_bos.auth.grants import DEFAULT_SCOPES, check_api_key
from airflow_provider_bos.auth.urls import require_credential_url
from airflow_provider_bos.exceptions import BosConfigurationError, BosError
from airflow_provider_bos.mcp.sse import DEFAULT_MAX_EVENT_BYTES
from airflow_provider_bos.models import BosContext
from airflow_provider_bos.redaction import add_secret_sink, register_secret

if TYPE_CHECKING:
    from airflow_provider_bos.wire import FederatedRead

__all__ = ["BosHook", "BosConnectionConfig"]

PROTOCOLS = ("auto", "2025-11-25", "2026-07-28")
AUTH_TYPES = ("oauth", "api_key")
MIB = 1024 * 1024
# The "Largest event" field's ceiling: an event is held in memory whole; a larger number is most
# likely bytes typed into a MiB field.
MAX_EVENT_MIB = 16 * 1024


def _install_airflow_masker() -> None:
    """Forward every secret the core registers to Airflow's secrets masker."""
    from airflow.sdk.log import mask_secret

    add_secret_sink(mask_secret)


@dataclass(frozen=True)
class BosConnectionConfig:
    """The fields of a ``bos`` Connection, validated. ``secret`` is never shown in ``repr``."""

    conn_id: str
    resource_url: str
    auth_type: str
    secret: str
    client_id: str | None
    protocol: str
    scopes: str
    token_store_conn_id: str | None
    token_store_url: str | None
    context_handle: str | None
    timeout: float
    stream_idle_timeout: float = 300.0
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES
    operation_deadline: float = 300.0  # McpSession's DEFAULT_OPERATION_DEADLINE

    def __repr__(self) -> str:
        return (
            f"BosConnectionConfig(conn_id={self.conn_id!r}, resource_url={self.resource_url!r}, "
            f"auth_type={self.auth_type!r}, protocol={self.protocol!r}, secret='***')"
        )

    @classmethod
    def from_connection(cls, conn: Any) -> BosConnectionConfig:
        extra = extra_of(conn)
        conn_id = conn.conn_id
        host = resource_url_of(conn)
        if not host:
            raise BosConfigurationError(f"Connection {conn_id!r}: host must be the BOS MCP resource URL.")
        auth_type = str(extra.get("auth_type") or "oauth").lower()
        if auth_type not in AUTH_TYPES:
            raise BosConfigurationError(f"Connection {conn_id!r}: auth_type must be one of {AUTH_TYPES}.")
        protocol = str(extra.get("protocol") or "auto").lower()
        if protocol not in PROTOCOLS:
            raise BosConfigurationError(f"Connection {conn_id!r}: protocol must be one of {PROTOCOLS}.")
        register_secret(conn.password or "")
        secret = (conn.password or "").strip()  # a pasted key or token with its line break
        if not secret and auth_type == "api_key":
            raise BosConfigurationError(f"Connection {conn_id!r}: the password field must hold the API key.")
        if auth_type == "api_key":
            check_api_key(secret, f"Connection {conn_id!r}: the API key in the password field")
            # (OAuth URLs are checked by discovery, before any token exists.)
            require_credential_url(host, f"the API key of Connection {conn_id!r}")
        # OAuth: an empty or masked password is not an error here. The grant layer uses the grant
        # already in the token store (and says how to fix the Connection), or fails if there is none.
        client_id = extra.get("client_id") or None
        if auth_type == "oauth" and not client_id:
            raise BosConfigurationError(
                f"Connection {conn_id!r}: OAuth needs client_id in extra (printed by the connect command)."
            )
        register_secret(secret)
        return cls(
            conn_id=conn_id,
            resource_url=host,
            auth_type=auth_type,
            secret=secret,
            client_id=client_id,
            protocol=protocol,
            scopes=extra.get("scopes") or DEFAULT_SCOPES,
            token_store_conn_id=extra.get("token_store_conn_id") or None,
            token_store_url=extra.get("token_store_url") or None,
            context_handle=extra.get("context_handle") or None,
            timeout=_seconds(conn_id, "HTTP timeout (timeout)", extra.get("timeout"), 30.0),
            stream_idle_timeout=_seconds(conn_id, "Stream idle timeout (stream_idle_timeout)",
                                         extra.get("stream_idle_timeout"), 300.0),
            max_event_bytes=_max_event_bytes(conn_id, extra.get("max_event_mib")),
            operation_deadline=_seconds(conn_id, "Operation deadline (operation_deadline)",
                                        extra.get("operation_deadline"), 300.0),
        )


def extra_of(conn: Any) -> dict[str, Any]:
    """A ``bos`` Connection's extra as every reader of it sees it (the hook, the connect command,
    the Admin -> BOS page): the legacy ``extra__bos__`` prefix removed, pasted values' edge
    whitespace removed (a client_id with a trailing space would be sent as is), empty values dropped.
    """
    raw = conn.extra_dejson or {}
    extra = {k.removeprefix("extra__bos__"): v.strip() if isinstance(v, str) else v for k, v in raw.items()}
    return {k: v for k, v in extra.items() if v not in ("", None)}


def resource_url_of(conn: Any) -> str:
    """The MCP resource URL of a ``bos`` Connection: its host field, or Airflow's URI form of it.

    Airflow parses ``bos://dfsm.ai/mcp/apps/bos/platform`` into host ``dfsm.ai`` and schema
    ``mcp/apps/bos/platform`` (the path), and ``bos://http://127.0.0.1:8765/mcp/...`` into host
    ``http://127.0.0.1``, port 8765 and that schema; a schema of just ``http`` or ``https`` is the
    scheme. A host that is a whole URL with no port or schema beside it is taken as it is.
    """
    host = (conn.host or "").strip()
    if not host:
        return ""
    path = (conn.schema or "").strip()
    if "://" not in host:
        scheme = "https"
        if path.lower() in ("http", "https"):
            scheme, path = path.lower(), ""
        host = f"{scheme}://{host}"
    authority = host.split("://", 1)[1]
    has_port = ":" in authority.rsplit("]", 1)[-1]  # after an IPv6 literal's "]", if any
    if conn.port and "/" not in authority and not has_port:
        host = f"{host}:{conn.port}"
    if path:
        host = f"{host.rstrip('/')}/{path.lstrip('/')}"
    return host


def _number_field(
    conn_id: str, label: str, value: Any, default: float, ok: Callable[[float], bool], must: str
) -> float:
    """A number from a Connection field (``default`` when it is empty), refused unless ``ok`` (nan never is)."""
    try:
        number = float(default if value is None else value)
    except (TypeError, ValueError):
        number = float("nan")
    if isinstance(value, bool) or not ok(number):  # JSON true is not a number here
        raise BosConfigurationError(f"Connection {conn_id!r}: {label} must be {must}, not {value!r}.")
    return number


def _seconds(conn_id: str, label: str, value: Any, default: float) -> float:
    """A positive number of seconds from a Connection field, ``default`` when it is empty."""
    return _number_field(conn_id, label, value, default, lambda s: 0 < s < float("inf"),
                         "a positive number of seconds")


def _max_event_bytes(conn_id: str, value: Any) -> int:
    """The "Largest event (MiB)" field: a number of MiB, 512 when empty."""
    mib = _number_field(conn_id, "Largest event (max_event_mib)", value, DEFAULT_MAX_EVENT_BYTES / MIB,
                        lambda m: 1 <= m <= MAX_EVENT_MIB, f"a number of MiB from 1 to {MAX_EVENT_MIB}")
    return int(mib * MIB)


class BosHook(BaseHook):
    """Talk to BOS through a ``bos`` Connection.

    :param bos_conn_id: the Connection id (default ``bos_default``).
    """

    conn_name_attr = "bos_conn_id"
    default_conn_name = "bos_default"
    conn_type = "bos"
    hook_name = "BOS (MCP)"

    def __init__(self, bos_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bos_conn_id = bos_conn_id
        self._session: Any = None
        # Everything get_conn() opens, closed again by close(): pools must not wait for the GC.
        self._resources: list[Callable[[], None]] = []
        _install_airflow_masker()

    # --- configuration -------------------------------------------------------------------------

    @cached_property
    def config(self) -> BosConnectionConfig:
        return BosConnectionConfig.from_connection(self.get_connection(self.bos_conn_id))

    def _token_store(self) -> Any:
        from airflow_provider_bos.auth import SqlTokenStore, default_token_store_url
        from airflow_provider_bos.hooks.connections import (
            airflow_fernet_cipher,
            engine_for_connection,
            refuse_embedded_token_store,
        )

        cfg = self.config
        if cfg.token_store_conn_id:
            engine = engine_for_connection(cfg.token_store_conn_id)
            self._resources.append(engine.dispose)
            target: Any = engine
        else:
            target = cfg.token_store_url or default_token_store_url()
        refuse_embedded_token_store(target)
        store = SqlTokenStore(target, cipher=airflow_fernet_cipher())
        self._resources.append(store.dispose)
        return store

    def _auth(self, http_client: httpx.Client) -> httpx.Auth:
        from airflow_provider_bos.auth import ApiKeyAuth, OAuthGrantAuth, discover

        cfg = self.config
        if cfg.auth_type == "api_key":
            return ApiKeyAuth(cfg.secret)
        if not cfg.client_id:  # from_connection refuses this; a config built by hand may not
            raise BosConfigurationError(f"Connection {cfg.conn_id!r}: OAuth needs client_id in extra.")
        info = discover(cfg.resource_url, http_client=http_client)
        return OAuthGrantAuth(
            self._token_store(),
            cfg.conn_id,
            token_endpoint=info.token_endpoint,
            client_id=cfg.client_id,
            resource=info.resource,
            http_client=http_client,
            seed_refresh_token=cfg.secret or None,
            scope=cfg.scopes,
        )

    # --- session -------------------------------------------------------------------------------

    def get_conn(self) -> Any:
        """A connected :class:`McpSession` (created once per hook)."""
        if self._session is None:
            from airflow_provider_bos.mcp import McpSession

            cfg = self.config
            http_client = self._new_http_client(cfg.timeout)
            self._resources.append(http_client.close)
            session = McpSession(
                cfg.resource_url,
                auth=self._auth(http_client),
                era=cfg.protocol,
                http_client=http_client,
                timeout=cfg.timeout,
                stream_idle_timeout=cfg.stream_idle_timeout,
                max_event_bytes=self._max_event_bytes(),
                operation_deadline_s=cfg.operation_deadline,
            )
            session.connect()
            self._session = session
        return self._session

    def _max_event_bytes(self) -> int:
        """The bound of a federated read's result: the Connection's 'Largest event' (the Admin -> BOS
        page's hook reads no result, and keeps every answer at the small bound)."""
        return self.config.max_event_bytes

    def _new_http_client(self, timeout: float) -> httpx.Client:
        """The session's HTTP client (the Admin -> BOS page's hook narrows where it may connect)."""
        return httpx.Client(timeout=timeout, follow_redirects=False)

    def close(self) -> None:
        """End the MCP session, then release the HTTP client and the token store's connections."""
        session, self._session = self._session, None
        resources, self._resources = self._resources, []
        try:
            if session is not None:
                session.close()
        finally:
            for release in reversed(resources):
                release()

    def cancel(self) -> None:
        """Close the in-flight stream (server-side cancel); safe from another thread."""
        if self._session is not None:
            self._session.cancel()

    def __enter__(self) -> BosHook:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- calls a TaskFlow user makes -----------------------------------------------------------

    def list_contexts(self) -> list[BosContext]:
        return self.get_conn().get_contexts()

    def resolve_context_handle(self, explicit: str | None = None) -> str:
        """The explicit handle, else the connection default, else the context BOS marks default
        (or the only one): :func:`~airflow_provider_bos.mcp.reads.resolve_context_handle`."""
        from airflow_provider_bos.mcp.reads import resolve_context_handle

        return resolve_context_handle(explicit, self.config.context_handle, contexts=self.list_contexts)

    def list_context_tools(self, context_handle: str | None = None) -> dict[str, Any]:
        return self.get_conn().list_context_tools(self.resolve_context_handle(context_handle))

    def list_tools(self) -> list[dict[str, Any]]:
        return self.get_conn().list_tools()

    def read_resource(self, uri: str) -> dict[str, Any]:
        return self.get_conn().read_resource(uri)

    def federated_read(
        self,
        tool_name: str,
        arguments: dict[str, Any] | None = None,
        *,
        context_handle: str | None = None,
        via: str = "auto",
        stream: bool = True,
        on_progress: Callable[[Any], None] | None = None,
        deadline_s: float | None = None,
        stream_records: bool = False,
        on_context: Callable[[str], None] | None = None,
    ) -> Any:
        """Run a federated read; returns the authoritative ``FinalResult``.

        With ``stream_records=True`` the final records are a one-shot iterator read from the open
        response (constant memory); the result's metadata is available once they are consumed.

        ``via="auto"`` calls ``tool_name`` directly when it is a listed tool, else through
        ``bos_execute`` in ``context_handle`` (default: the connection's, else BOS's default).
        """
        return self.get_conn().federated_read(
            tool_name,
            arguments or {},
            context_handle=context_handle or self.config.context_handle,
            via=via,
            stream=stream,
            on_progress=on_progress,
            deadline_s=deadline_s,
            stream_records=stream_records,
            on_context=on_context,
        )

    def test_connection(self) -> tuple[bool, str]:
        """Discovery + token + ``bos_get_context``; the message says what worked or what failed."""
        try:
            contexts = self.list_contexts()
        except BosError as exc:
            return False, str(exc)
        except httpx.HTTPError as exc:
            return False, f"Could not reach BOS: {type(exc).__name__}: {exc}"
        finally:
            self.close()
        names = ", ".join(c.context_handle + (" (default)" if c.is_default else "") for c in contexts)
        return True, f"Connected to BOS; {len(contexts)} authorized context(s): {names}"


if TYPE_CHECKING:
    # Checked by mypy, never run: the hook's read is the FederatedRead that run_sync is typed against.
    def _read_for_run_sync(hook: BosHook) -> FederatedRead:
        return hook.federated_read
