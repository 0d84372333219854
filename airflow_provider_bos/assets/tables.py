"""Asset URIs for destination tables, following each database's existing provider convention.

PostgreSQL: ``postgres://host:port/database/schema/table`` (handled by the postgres provider).
MySQL/MariaDB: ``mysql://host:port/database/table`` (the mysql provider's convention).
Snowflake: ``snowflake://<account>/<DATABASE>/<SCHEMA>/<TABLE>`` (the snowflake provider's), names
as Snowflake stores them (an unquoted lower-case name is upper-cased).
SQLite has no provider convention; ours is ``sqlite://host/<absolute db path>/<table>`` with the
host of the machine that owns the file, registered in ``get_provider_info`` under ``asset-uris``.
DuckDB: the duckdb provider registers no asset URIs; ours follows the SQLite one with the schema
DuckDB puts tables in: ``duckdb://host/<absolute db path>/<schema>/<table>`` (``main`` by default),
and MotherDuck's ``motherduck://<database>/<schema>/<table>`` (no host: the service is the place).
"""

from __future__ import annotations

import os
import socket
from urllib.parse import SplitResult, quote

from sqlalchemy.engine import URL


def sanitize_sqlite_uri(uri: SplitResult) -> SplitResult:
    """Asset URI handler for ``sqlite://``: a host and a path ending in the database file and table."""
    if not uri.netloc:
        raise ValueError("URI format sqlite:// must contain the host that owns the database file")
    parts = [p for p in uri.path.split("/") if p]
    if len(parts) < 2:
        raise ValueError("URI format sqlite:// must contain the database file path and the table name")
    return uri


def sanitize_duckdb_uri(uri: SplitResult) -> SplitResult:
    """Asset URI handler for ``duckdb://host/<db path>/<schema>/<table>``."""
    if not uri.netloc:
        raise ValueError("URI format duckdb:// must contain the host that owns the database file")
    if len([p for p in uri.path.split("/") if p]) < 3:
        raise ValueError("URI format duckdb:// must contain the database file path, the schema and the table")
    return uri


def sanitize_motherduck_uri(uri: SplitResult) -> SplitResult:
    """Asset URI handler for ``motherduck://<database>/<schema>/<table>``."""
    if not uri.netloc or len([p for p in uri.path.split("/") if p]) != 2:
        raise ValueError("URI format motherduck:// must contain database, schema and table names")
    return uri


def sanitize_mysql_uri(uri: SplitResult) -> SplitResult:
    """Asset URI handler for ``mysql://host:port/database/table`` (used when no mysql provider is installed)."""
    if not uri.netloc:
        raise ValueError("URI format mysql:// must contain a host")
    if uri.port is None:
        uri = uri._replace(netloc=f"{uri.netloc.rstrip(':')}:3306")
    if len([p for p in uri.path.split("/") if p]) != 2:
        raise ValueError("URI format mysql:// must contain database and table names")
    return uri


def table_asset_uri(url: URL, schema: str | None, table: str) -> str:
    """The asset URI of ``schema.table`` in the database at SQLAlchemy ``url``."""
    backend = url.get_backend_name()
    if backend == "postgresql":
        return f"postgres://{url.host or 'localhost'}:{url.port or 5432}/{url.database}/{schema or 'public'}/{table}"
    if backend in {"mysql", "mariadb"}:
        return f"mysql://{url.host or 'localhost'}:{url.port or 3306}/{schema or url.database}/{table}"
    if backend == "snowflake":
        return snowflake_asset_uri(url, schema, table)
    if backend == "sqlite":
        path = url.database or ":memory:"
        return f"sqlite://{socket.gethostname()}/{quote(path.lstrip('/'))}/{table}"
    if backend == "duckdb":
        path = url.database or ":memory:"
        if path.startswith("md:"):  # MotherDuck: md:<database> (the token is never in the URL)
            return f"motherduck://{quote(path[3:].split('?')[0] or 'my_db')}/{schema or 'main'}/{table}"
        if path != ":memory:":
            path = os.path.abspath(path)
        return f"duckdb://{socket.gethostname()}/{quote(path.lstrip('/'))}/{schema or 'main'}/{table}"
    raise ValueError(f"No asset URI convention for database backend {backend!r}")


def _snowflake_name(name: str) -> str:
    # As Snowflake stores it: snowflake-sqlalchemy leaves an all-lower-case name unquoted (folded to
    # upper case); any other name is quoted, so kept as written.
    return name.upper() if name == name.lower() else name


def snowflake_asset_uri(url: URL, schema: str | None, table: str) -> str:
    """``snowflake://<account>/<database>/<schema>/<table>``: the account from the URL, its
    path ``database[/schema]`` (the schema argument wins; Snowflake's default schema is PUBLIC)."""
    database, _, url_schema = (url.database or "").partition("/")
    if not database:
        raise ValueError("A Snowflake destination's asset URI needs the connection's database")
    parts = [_snowflake_name(p) for p in (database, schema or url_schema or "public", table)]
    # With a custom endpoint (the connection's host extra) the URL's host is that endpoint and the
    # account travels in the query (snowflake-sqlalchemy's URL).
    account = url.query.get("account") or url.host or ""
    return f"snowflake://{str(account).lower()}/{'/'.join(parts)}"


def table_lineage_dataset(url: URL, schema: str | None, table: str) -> tuple[str, str]:
    """OpenLineage ``(namespace, name)`` of the table: the asset URI split before the table, except
    where the database's provider converts its asset URIs otherwise (Snowflake:
    ``snowflake://<account>`` and ``DATABASE.SCHEMA.TABLE``)."""
    uri = table_asset_uri(url, schema, table)
    if url.get_backend_name() == "snowflake":
        account, _, path = uri.removeprefix("snowflake://").partition("/")
        return f"snowflake://{account}", path.replace("/", ".")
    namespace, _, name = uri.rpartition("/")
    return namespace, name
