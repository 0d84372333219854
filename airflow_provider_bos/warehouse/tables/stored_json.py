"""Stored JSON columns read back as the JSON values that were stored.

Whether a read hands a JSON column back as JSON text or as the value already decoded is decided by
the column's SQLAlchemy type, never by the value: SQLAlchemy's JSON types (PostgreSQL's JSONB,
MySQL's JSON, DuckDB's JSON) decode on the way out, or let the driver do it; SQLite's text column
and Snowflake's VARIANT hand back JSON text. Guessing from the Python type instead mistakes a stored
JSON *string* (``"onboarding"``, which the contract allows for ``lifecycle``) handed back decoded
(the Python string ``onboarding``) for JSON text, and decodes it a second time.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import sqlalchemy as sa

__all__ = ["JsonColumns", "arrives_decoded"]


def arrives_decoded(column: sa.ColumnElement[Any]) -> bool:
    """True when a read of ``column`` hands back the decoded JSON value, False when JSON text."""
    return isinstance(column.type, sa.JSON)


class JsonColumns:
    """Decodes the JSON columns of rows read from one table: each exactly once, where the read hands
    back text (a SQL NULL stays ``None``)."""

    __slots__ = ("_as_text",)

    def __init__(self, table: sa.Table, names: Iterable[str]) -> None:
        self._as_text = frozenset(name for name in names if name in table.c and not arrives_decoded(table.c[name]))

    def row(self, row: Mapping[Any, Any], names: Iterable[str]) -> dict[str, Any]:
        """``names`` of ``row`` as a dict, the JSON columns among them as their stored JSON values."""
        return {name: self.value(name, row[name]) for name in names}

    def value(self, name: str, stored: Any) -> Any:
        """``stored``, as read from the table's column ``name``, as its JSON value."""
        if name not in self._as_text or stored is None:
            return stored
        return json.loads(bytes(stored) if isinstance(stored, memoryview) else stored)
