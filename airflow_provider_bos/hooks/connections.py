"""Airflow connections and settings as the core needs them: SQL engines and the Fernet cipher.

For the types we support (sqlite, postgres, mysql/MariaDB, duckdb) the URL is built from the
connection fields with the drivers we depend on: psycopg 3 (COPY), PyMySQL (pure Python; the
official MySQL provider needs a C client library) and duckdb-engine (the fields read as the duckdb
provider's ``DuckDBHook`` reads them). Other types fall back to their hook's engine (snowflake: SnowflakeHook's, see
:func:`snowflake_engine_kwargs`); either way an
engine on a database the warehouse cannot write is refused here, naming the supported ones, before
anything is read.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import URL, make_url

from airflow_provider_bos.exceptions import BosConfigurationError, BosWarehouseError
from airflow_provider_bos.warehouse.dialects import SUPPORTED_DESTINATIONS, dialect_class

# conn_type -> SQLAlchemy driver used when the connection's own hook cannot give an engine.
_FALLBACK_DRIVERS = {
    "postgres": "postgresql+psycopg",
    "postgresql": "postgresql+psycopg",
    "mysql": "mysql+pymysql",
    "mariadb": "mysql+pymysql",
}


#: How long a DuckDB engine's connects wait for another process's lock on the file (a writer's
#: ``lock_timeout_s`` replaces it for the writer).
DUCKDB_LOCK_WAIT_S = 300.0
#: The connection types a destination may have (others must give a supported engine through their hook).
DESTINATION_TYPES = "sqlite, postgres, mysql (MariaDB), duckdb or snowflake"


def _unsupported(conn_id: str, what: str) -> BosConfigurationError:
    return BosConfigurationError(
        f"Connection {conn_id!r} {what}; BOS writes to {SUPPORTED_DESTINATIONS} (connection types "
        f"{DESTINATION_TYPES}). Point destination_conn_id at one of those."
    )


def duckdb_database(conn: Any) -> tuple[str, dict[str, Any]]:
    """The database a ``duckdb`` Connection opens and its connect config, as ``DuckDBHook`` reads it.

    Precedence: extra ``database``, MotherDuck (``md:<schema>``) when a token is given (password or
    extra ``motherduck_token``), the host (a file path), else ``:memory:`` (gone when the task
    ends). The token travels in the config, never in the URL (which is logged and put in lineage).
    """
    extra = conn.extra_dejson if hasattr(conn, "extra_dejson") else {}
    config: dict[str, Any] = {k: extra[k] for k in ("memory_limit", "threads", "temp_directory") if extra.get(k)}
    config.update(extra.get("settings") or {})
    token = extra.get("motherduck_token") or conn.password
    if extra.get("database"):
        return str(extra["database"]), config
    if token:
        return f"md:{conn.schema or ''}", {**config, "motherduck_token": token}
    return conn.host or ":memory:", config


def url_from_connection(conn: Any) -> URL:
    """A SQLAlchemy URL from an Airflow Connection's fields (no hook needed)."""
    conn_type = (conn.conn_type or "").lower()
    if conn_type == "sqlite":
        return URL.create("sqlite", database=conn.host or conn.schema or ":memory:")
    if conn_type == "duckdb":
        return URL.create("duckdb", database=duckdb_database(conn)[0])
    driver = _FALLBACK_DRIVERS.get(conn_type)
    if driver is None:
        raise _unsupported(conn.conn_id, f"has type {conn_type!r}")
    query = {"charset": "utf8mb4"} if driver.startswith("mysql") else {}
    return URL.create(
        driver,
        username=conn.login or None,
        password=conn.password or None,
        host=conn.host or None,
        port=conn.port or None,
        database=conn.schema or None,
        query=query,
    )


def airflow_connection(conn_id: str) -> Any | None:
    """Airflow Connection ``conn_id`` wherever Airflow keeps it, or None.

    In a task the SDK asks the API server, which reads the metadata database too. Outside a task (the
    CLI) the SDK reads only ``AIRFLOW_CONN_*`` and the secrets backends, so the metadata database is
    asked next, as ``airflow connections get`` does: a connection made with ``airflow connections add``,
    in the UI or by ``connect --save-connection`` is found as well.
    """
    from airflow.sdk import BaseHook

    from airflow_provider_bos.airflow_compat import AirflowNotFoundException

    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        pass
    try:
        from airflow.models.connection import Connection

        return Connection.get_connection_from_secrets(conn_id)
    except Exception:  # noqa: BLE001 - not there, or no metadata database from here (a worker): not found
        return None


def not_found(conn_id: str, holding: str = "") -> BosConfigurationError:
    """The error of a connection Airflow does not have, saying where it was looked for."""
    return BosConfigurationError(
        f"The Airflow connection {conn_id!r}{holding} does not exist: it is in neither AIRFLOW_CONN_"
        f"{conn_id.upper()}, a secrets backend, nor the metadata database of this Airflow "
        f"(AIRFLOW_HOME / [database] sql_alchemy_conn). Create it (airflow connections add, or Admin -> "
        f"Connections) or name another one."
    )


def engine_for_connection(conn_id: str) -> Engine:
    """The SQLAlchemy engine for ``conn_id`` (any Airflow SQL connection).

    Known types get a URL with the driver we depend on (psycopg 3 for COPY, PyMySQL); any other
    type is asked for its hook's engine, and the warehouse dialect then says if it is supported.
    """
    conn = airflow_connection(conn_id)
    if conn is None:
        raise not_found(conn_id)
    conn_type = (conn.conn_type or "").lower()
    if conn_type == "sqlite" or conn_type in _FALLBACK_DRIVERS:
        return create_engine(url_from_connection(conn), pool_pre_ping=True)
    if conn_type == "duckdb":
        from airflow_provider_bos.warehouse.dialects.duckdb import wait_for_file_lock

        database, config = duckdb_database(conn)
        engine = create_engine(URL.create("duckdb", database=database), connect_args={"config": config})
        wait_for_file_lock(engine, DUCKDB_LOCK_WAIT_S)  # readers (sensor, monitor) wait for a writer too
        return engine
    try:
        hook = conn.get_hook()
    except Exception:  # noqa: BLE001 - no provider for this type: say what is supported instead
        raise _unsupported(
            conn_id, f"has type {conn_type!r}, which no installed provider makes a SQL hook of"
        ) from None
    if not hasattr(hook, "get_sqlalchemy_engine"):
        raise _unsupported(conn_id, f"(type {conn_type!r}) is not a SQL connection with a SQLAlchemy engine")
    if conn_type == "snowflake":
        engine = hook.get_sqlalchemy_engine(engine_kwargs=snowflake_engine_kwargs(conn.extra_dejson))
    else:
        engine = hook.get_sqlalchemy_engine()
    try:
        dialect_class(engine)
    except BosWarehouseError:
        engine.dispose()
        raise _unsupported(conn_id, f"(type {conn_type!r}) is a {engine.dialect.name!r} database") from None
    return engine


def refuse_embedded_token_store(target: Any) -> None:
    """Refuse a token store on DuckDB: rotating a refresh token takes a row lock that every task of a
    deployment must be able to wait for, and a DuckDB file admits one process at a time (a second
    task's refresh would wait for a whole sync, or fail)."""
    url = target.url if isinstance(target, Engine) else make_url(target)
    if url.get_backend_name() == "duckdb":
        raise BosConfigurationError(
            "The token store cannot be a DuckDB database (one process at a time; a token refresh "
            "needs a row lock every task can wait for). Set token_store_conn_id to a PostgreSQL or "
            "MySQL/MariaDB connection, or leave it empty for the local SQLite store."
        )


def snowflake_engine_kwargs(extra: dict[str, Any]) -> dict[str, Any]:
    """What SnowflakeHook's engine needs beyond the hook for a connection with its own endpoint.

    The hook puts an extra ``host``/``port`` (a private endpoint, a local emulator) into the URL's
    query, which snowflake-sqlalchemy >= 1.11 refuses unless its legacy URL parameters are on; and
    the hook has no field for ``protocol`` (``http`` for an emulator such as fakesnow).
    """
    kwargs: dict[str, Any] = {}
    if extra.get("host") or extra.get("port"):
        kwargs["legacy_url_params"] = True
    protocol = str(extra.get("protocol") or "").strip().lower()
    if protocol:
        if protocol not in ("http", "https"):
            raise BosConfigurationError(f"The snowflake connection's protocol must be http or https, not {protocol!r}.")
        kwargs["connect_args"] = {"protocol": protocol}
    return kwargs


def airflow_fernet_cipher() -> Any:
    """Airflow's Fernet when ``[core] fernet_key`` is set, else ``None`` (tokens stored unencrypted).

    Uses ``airflow.models.crypto`` (what encrypts Connections in the metadata DB). The Task SDK's
    ``airflow.sdk.crypto`` reads the same setting, but without an airflow.cfg it sees the literal
    template ``{FERNET_KEY}`` and fails; it is only the fallback when airflow-core is absent. The
    connect CLI and the hook must agree here, or the hook cannot read what the CLI stored.
    """
    try:
        from airflow.models.crypto import get_fernet
    except Exception:  # noqa: BLE001 - fall back to the Task SDK accessor
        try:
            from airflow.sdk.crypto import get_fernet
        except Exception:  # noqa: BLE001 - Airflow not importable: no key to use
            return None
    try:
        fernet = get_fernet()
    except Exception as exc:  # noqa: BLE001 - AirflowException on a malformed key
        raise BosConfigurationError(
            f"Airflow's [core] fernet_key is not a valid Fernet key ({type(exc).__name__}); "
            "fix it before storing tokens."
        ) from None
    return fernet if getattr(fernet, "is_encrypted", False) else None
