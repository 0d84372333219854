"""Snowflake column types by role (imported only when a Snowflake destination is used).

``snowflake-sqlalchemy`` is the optional ``[snowflake]`` extra: nothing imports it until a
Snowflake engine or the Snowflake DDL is asked for.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.types import TypeEngine

from airflow_provider_bos.exceptions import BosConfigurationError

__all__ = ["snowflake_column_types", "snowflake_sa_dialect"]

_MISSING = (
    "Snowflake destinations need the snowflake extra: pip install 'airflow-provider-bos[snowflake]'."
)


def snowflake_column_types() -> dict[str, TypeEngine[Any]]:
    """VARCHAR for text (Snowflake has one string type), VARIANT for JSON, TIMESTAMP_TZ for time."""
    try:
        from snowflake.sqlalchemy import TIMESTAMP_TZ, VARIANT  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        raise BosConfigurationError(_MISSING) from None
    return {
        "key": sa.String(512),
        "text": sa.Text(),
        "json": VARIANT(),
        "ts": TIMESTAMP_TZ(),
        "id": sa.String(64),
        "hash": sa.String(64),
        "name": sa.String(250),
        "int": sa.BigInteger(),
    }


def snowflake_sa_dialect() -> sa.Dialect:
    """snowflake-sqlalchemy's dialect, for compiling DDL without a connection."""
    try:
        from snowflake.sqlalchemy.snowdialect import (  # type: ignore[import-not-found, unused-ignore]
            SnowflakeDialect,
        )
    except ImportError:
        raise BosConfigurationError(_MISSING) from None
    dialect: sa.Dialect = SnowflakeDialect()
    return dialect
