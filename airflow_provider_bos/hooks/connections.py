"""Airflow connections and settings as the core needs them: SQL engines and the Fernet cipher.

For the types we support (sqlite, postgres, mysql/MariaDB) the URL is built from the connection
fields with the drivers we depend on: psycopg 3 (COPY) and PyMySQL (pure Python; the official MySQL
provider needs a C client library). Other types fall back to their hook's engine (snowflake: SnowflakeHook's, see
:func:`snowflake_engine_kwargs`).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import URL

from airflow_provider_bos.exceptions import BosConfigurationError

# conn_type -> SQLAlchemy driver used when the connection's own hook cannot give an engine.
_FALLBACK_DRIVERS = {
    "postgres": "postgresql+psycopg",
    "postgresql": "postgresql+psycopg",
    "mysql": "mysql+pymysql",
    "mariadb": "mysql+pymysql",
}


def url_from_connection(conn: Any) -> URL:
    """A SQLAlchemy URL from an Airflow Connection's fields (no hook needed)."""
    conn_type = (conn.conn_type or "").lower()
    if conn_type == "sqlite":
        return URL.create("sqlite", database=conn.host or conn.schema or ":memory:")
    driver = _FALLBACK_DRIVERS.get(conn_type)
    if driver is None:
        raise BosConfigurationError(
            f"Connection {conn.conn_id!r} has type {conn_type!r}; supported destinations are "
            "sqlite, postgres and mysql (MariaDB)."
        )
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


def engine_for_connection(conn_id: str) -> Engine:
    """The SQLAlchemy engine for ``conn_id`` (any Airflow SQL connection).

    Known types get a URL with the driver we depend on (psycopg 3 for COPY, PyMySQL); any other
    type is asked for its hook's engine, and the warehouse dialect then says if it is supported.
    """
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        raise BosConfigurationError(
            f"The Airflow connection {conn_id!r} does not exist; create it (Admin -> Connections or "
            f"AIRFLOW_CONN_{conn_id.upper()}) or name another one."
        ) from None
    conn_type = (conn.conn_type or "").lower()
    if conn_type == "sqlite" or conn_type in _FALLBACK_DRIVERS:
        return create_engine(url_from_connection(conn), pool_pre_ping=True)
    hook = conn.get_hook()
    if not hasattr(hook, "get_sqlalchemy_engine"):
        raise BosConfigurationError(
            f"Connection {conn_id!r} (type {conn_type!r}) is not a SQL connection with a SQLAlchemy engine."
        )
    if conn_type == "snowflake":
        return hook.get_sqlalchemy_engine(engine_kwargs=snowflake_engine_kwargs(conn.extra_dejson))
    return hook.get_sqlalchemy_engine()


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
