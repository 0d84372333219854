"""How the BOS page opens a token store: only one the operator allowed, read-only to look, guarded to connect.

A Connection's editor names its token store (``token_store_conn_id``, ``token_store_url``), and so
would choose the database the API server opens: a SQLite path (created, chmod-ed), or a host and
port to dial (a port scanner whose driver errors tell what answers). So the page opens:

- **Only a store the operator allowed** (:func:`require_store_allowed`): the default SQLite file;
  a store named by an Airflow connection whose id is in ``[bos] token_store_conn_ids``; and any
  other store (another connection id, or a ``token_store_url``) only when ``[bos]
  allow_token_store_urls`` is ``True``. Per user, :func:`.access.check_token_store` also asks the
  auth manager for read access to the store connection.
- **Read-only to look** (the page's list): a SQLite file is opened ``mode=ro`` (a missing file is
  "not connected", never created; no chmod), a missing table is "not connected" (no ``CREATE
  TABLE``), and a PostgreSQL or MySQL session is read-only. Only Connect's callback and
  the live probe or Check (a refresh) open a store to write, after the same gate.
- **Guarded to connect**: a PostgreSQL or MySQL/MariaDB store is dialled only over TCP, to a host
  :class:`.outbound.OutboundPolicy` allows (``[bos] allowed_hosts``, else public addresses only),
  on the very address that was checked; with a short connect timeout
  (:data:`STORE_CONNECT_TIMEOUT_S`, never past the page action's deadline) and statement and lock
  timeouts (:data:`STORE_STATEMENT_TIMEOUT_S`). Only the drivers this package ships are used
  (psycopg 3, PyMySQL), and only the connection types ``sqlite``, ``postgres`` and ``mysql``.

What the page shows of a failing store is :func:`.grant_status.store_error_text`: never the
driver's text, which stays in the API server's log.
"""

from __future__ import annotations

import ipaddress
import math
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.pool import NullPool

from airflow_provider_bos.auth.token_store import (
    SqlTokenStore,
    default_token_store_path,
    default_token_store_url,
)
from airflow_provider_bos.exceptions import BosConfigurationError
from airflow_provider_bos.plugins.outbound import Deadline, OutboundPolicy
from airflow_provider_bos.plugins.pending import ConnectTarget
from airflow_provider_bos.plugins.settings import allowed_token_store_conn_ids, token_store_urls_allowed

__all__ = [
    "STORE_CONNECT_TIMEOUT_S",
    "STORE_STATEMENT_TIMEOUT_S",
    "guarded_store_engine",
    "open_page_store",
    "require_store_allowed",
]

#: The longest the page waits to connect to a token store's database (and for SQLite's lock).
STORE_CONNECT_TIMEOUT_S = 5.0
#: The longest one statement, or one wait for a row lock, may take on a store the page opened.
STORE_STATEMENT_TIMEOUT_S = 10.0
# Connection types a token store may have, and the SQLAlchemy backend each one is.
_STORE_TYPES = {"sqlite": "sqlite", "postgres": "postgresql", "postgresql": "postgresql", "mysql": "mysql",
                "mariadb": "mysql"}
_DRIVERS = {"postgresql": "postgresql+psycopg", "mysql": "mysql+pymysql", "mariadb": "mysql+pymysql"}
# Driver parameters that would take the connection somewhere other than the checked host.
_REDIRECTING_PARAMS = {
    "postgresql": ("hostaddr", "service", "servicefile"),
    "mysql": ("unix_socket", "read_default_file", "read_default_group", "named_pipe"),
}


def require_store_allowed(target: ConnectTarget) -> None:
    """Refuse a store the operator did not allow the page to open (see the module docstring)."""
    if target.token_store_conn_id:
        if target.token_store_conn_id in allowed_token_store_conn_ids() or token_store_urls_allowed():
            return
        raise BosConfigurationError(
            f"Connection {target.conn_id!r} names the token store connection {target.token_store_conn_id!r}, "
            "which the API server opens only when an operator lists it in [bos] token_store_conn_ids "
            "(whoever may create Connections could otherwise point the page at any database)."
        )
    if target.token_store_url and not token_store_urls_allowed():
        raise BosConfigurationError(
            f"Connection {target.conn_id!r} names its token store by a SQL URL (extra token_store_url); "
            "the API server opens such stores only when [bos] allow_token_store_urls is True. Use "
            "token_store_conn_id with a connection listed in [bos] token_store_conn_ids instead."
        )


def _connection_url(conn_id: str) -> URL:
    from airflow.sdk import BaseHook

    from airflow_provider_bos.airflow_compat import AirflowNotFoundException
    from airflow_provider_bos.hooks.connections import url_from_connection

    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        raise BosConfigurationError(f"The token store connection {conn_id!r} does not exist.") from None
    conn_type = (conn.conn_type or "").lower()
    if conn_type not in _STORE_TYPES:
        raise BosConfigurationError(
            f"The token store connection {conn_id!r} has type {conn_type!r}; a token store is a sqlite, "
            "postgres or mysql connection."
        )
    if conn_type == "sqlite" and not (conn.host or conn.schema):
        raise BosConfigurationError(f"The token store connection {conn_id!r} names no SQLite file.")
    return url_from_connection(conn)


def _store_url(target: ConnectTarget) -> URL | None:
    """The store's URL, or None for the default SQLite file."""
    if target.token_store_conn_id:
        return _connection_url(target.token_store_conn_id)
    if target.token_store_url:
        try:
            return make_url(target.token_store_url)
        except sa.exc.ArgumentError:
            raise BosConfigurationError(f"Connection {target.conn_id!r}: token_store_url is not a SQL URL.") from None
    return None


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return False
    return True


def _pin(backend: str, cparams: dict[str, Any], policy: OutboundPolicy) -> None:
    """Check the host a store connection is about to dial, and make it dial the checked address."""
    for name in _REDIRECTING_PARAMS[backend]:
        if cparams.get(name):
            raise BosConfigurationError(
                f"The BOS page does not open a token store whose connection sets {name!r}: it connects only "
                "over TCP to the named host."
            )
    host = str(cparams.get("host") or "")
    if backend == "postgresql" and (not host or host.startswith(("/", "@")) or "," in host):
        # libpq's default (no host) and a path are Unix sockets: the API server's own databases.
        raise BosConfigurationError(
            "The BOS page opens a PostgreSQL token store only over TCP to one named host; this one names "
            "none, several, or a Unix socket."
        )
    host = host or "localhost"  # PyMySQL's default, over TCP
    default_port = 5432 if backend == "postgresql" else 3306
    try:
        port = int(cparams.get("port") or default_port)
    except (TypeError, ValueError):
        raise BosConfigurationError("The token store's port is not a number.") from None
    address = policy.addresses_for(host, port)[0]
    if _is_address(address) and address != host:
        # The address the policy checked, not a second resolution (which could answer differently).
        if backend == "postgresql":
            cparams["hostaddr"] = address  # libpq connects there; TLS still verifies ``host``
        else:
            cparams["host"] = address


def guarded_store_engine(url: URL, *, policy: OutboundPolicy, deadline: Deadline, read_only: bool) -> Engine:
    """An engine on a PostgreSQL or MySQL/MariaDB store that dials only where ``policy`` allows, with
    short timeouts; no pool (every page action connects anew, within its deadline)."""
    backend = url.get_backend_name()
    if backend not in _DRIVERS:
        raise BosConfigurationError(f"The BOS page does not open a token store on {backend!r}.")
    kind = "postgresql" if backend == "postgresql" else "mysql"
    connect_s = max(1.0, min(STORE_CONNECT_TIMEOUT_S, deadline.remaining()))
    statement_ms = int(STORE_STATEMENT_TIMEOUT_S * 1000)
    url = url.set(drivername=_DRIVERS[backend])
    if kind == "postgresql":
        options = f"-c statement_timeout={statement_ms} -c lock_timeout={statement_ms}"
        if read_only:
            options += " -c default_transaction_read_only=on"
        connect_args: dict[str, Any] = {"connect_timeout": max(2, math.ceil(connect_s)), "options": options}
    else:
        connect_args = {
            "connect_timeout": connect_s,
            "read_timeout": STORE_STATEMENT_TIMEOUT_S + 5,  # the store's own lock wait comes first
            "write_timeout": STORE_STATEMENT_TIMEOUT_S,
        }
        if read_only:
            connect_args["init_command"] = "SET SESSION TRANSACTION READ ONLY"
    engine = sa.create_engine(url, connect_args=connect_args, poolclass=NullPool, hide_parameters=True)

    @sa.event.listens_for(engine, "do_connect")
    def _guard(_dialect: Any, _record: Any, _cargs: Any, cparams: dict[str, Any]) -> None:
        deadline.remaining()  # no new connection once the page action's deadline has passed
        _pin(kind, cparams, policy)

    return engine


def open_page_store(
    target: ConnectTarget, *, read_only: bool, policy: OutboundPolicy, deadline: Deadline
) -> SqlTokenStore:
    """The token store of ``target`` as the page may open it (see the module docstring).

    ``read_only``: for looking (the page's list); Connect's callback and the probe or Check open it
    to write. The caller disposes the store.
    """
    from airflow_provider_bos.hooks.connections import airflow_fernet_cipher

    require_store_allowed(target)
    cipher = airflow_fernet_cipher()
    url = _store_url(target)
    if url is None:  # the default SQLite file under AIRFLOW_HOME
        default = f"sqlite:///{default_token_store_path()}" if read_only else default_token_store_url()
        return SqlTokenStore(default, cipher=cipher, read_only=read_only, busy_timeout_s=STORE_CONNECT_TIMEOUT_S)
    backend = url.get_backend_name()
    if backend == "sqlite":
        return SqlTokenStore(
            url, cipher=cipher, read_only=read_only, busy_timeout_s=STORE_CONNECT_TIMEOUT_S,
            lock_timeout_s=STORE_STATEMENT_TIMEOUT_S,
        )
    if backend not in _DRIVERS:
        raise BosConfigurationError(
            f"The token store cannot live in {backend!r}: use SQLite, PostgreSQL or MySQL/MariaDB."
        )
    engine = guarded_store_engine(url, policy=policy, deadline=deadline, read_only=read_only)
    return SqlTokenStore(engine, cipher=cipher, read_only=read_only, lock_timeout_s=STORE_STATEMENT_TIMEOUT_S)
