"""Promoted attributes: chosen ``attributes`` paths kept as typed columns of the records table.

The operator's ``attribute_columns`` maps a column name to an ``attributes`` path and a type::

    {"department": "attributes.department",
     "fte": {"path": "attributes.employment.fte", "type": "number"}}

It is parsed once, when the DAG is parsed, into :class:`AttributeColumns`. The writer adds each
column to the records table (and ``<table>_history``) the first time it is configured and fills it
from the stored ``attributes`` JSON in SQL: the whole table once (the backfill), then the rows each
run writes. One SQL expression per dialect gives the value in both cases, so a column never
depends on when its row was written. :meth:`AttributeColumn.wrong_type` is the same rule in Python,
checked on each decoded record before it is stored, so a value of the wrong type follows
``invalid_records`` (or ``attribute_type_errors="null"``) instead of silently becoming NULL.

Types (a missing path or JSON null is NULL, never an error):

- ``text``: a JSON string (numbers and booleans are the wrong type, not coerced);
- ``integer``: a JSON number without fraction or exponent, at most 18 digits;
- ``number``: any JSON number (stored as a double);
- ``boolean``: ``true`` or ``false``;
- ``timestamp``: a string ``YYYY-MM-DDTHH:MM:SS[.ffffff][Z|+HH:MM]`` (or a space for ``T``; no
  offset means UTC) naming a real date and time, stored as UTC;
- ``json``: any JSON value, in the dialect's JSON type.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from airflow_provider_bos.exceptions import BosConfigurationError, BosWarehouseError
from airflow_provider_bos.warehouse.tables.identifiers import IDENTIFIER_PATTERN
from airflow_provider_bos.warehouse.tables.schema import (
    LIFECYCLE_COLUMNS,
    RECORD_COLUMNS,
    WIRE_HASH_COLUMN,
    column_type,
)

__all__ = [
    "ATTRIBUTE_TYPES",
    "ATTRIBUTE_TYPE_ERRORS",
    "AttributeColumn",
    "AttributeColumns",
    "AttributeTypeError",
    "attribute_column",
    "check_attribute_columns",
    "column_type",
]

ATTRIBUTE_TYPES = ("text", "integer", "number", "boolean", "timestamp", "json")
#: ``"invalid_records"``: a wrong type is an invalid record (fail or quarantine, as the run says);
#: ``"null"``: the column is NULL for that record, the record is stored, the run counts it.
ATTRIBUTE_TYPE_ERRORS = ("invalid_records", "null")
#: The history table's own columns: a promoted column may not take their names either.
_HISTORY_COLUMNS = ("_bos_valid_from", "_bos_valid_to")
_RESERVED = frozenset(c.lower() for c in (*RECORD_COLUMNS, WIRE_HASH_COLUMN, *LIFECYCLE_COLUMNS, *_HISTORY_COLUMNS))
# A key of the path: what every dialect's JSON path takes unquoted ($.a.b).
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_MAX_DEPTH = 8
# The timestamp text every dialect's SQL parses the same way (it checks the same shape). No
# backslash: MariaDB and Snowflake string literals would eat it.
TIMESTAMP_PATTERN = ("^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])[T ]([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"
                     "([.][0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])?$")
_TIMESTAMP = re.compile(TIMESTAMP_PATTERN)
_INTEGER_LIMIT = 10**18  # at most 18 digits: fits BIGINT on every dialect, and the SQL checks digits


@dataclass(frozen=True, slots=True)
class AttributeColumn:
    """One promoted column: ``name`` <- ``attributes.<keys>`` as ``type``."""

    name: str
    keys: tuple[str, ...]
    type: str = "text"

    @property
    def path(self) -> str:
        """``attributes.a.b``: as configured (and as a personal-data rule names it)."""
        return ".".join(("attributes", *self.keys))

    @property
    def json_path(self) -> str:
        """``$.a.b``: the path inside the ``attributes`` column (bound as a parameter)."""
        return "$." + ".".join(self.keys)

    def value(self, attributes: Any) -> Any:
        """The JSON value at the path (None: missing or JSON null)."""
        value = attributes
        for key in self.keys:
            if not isinstance(value, Mapping):
                return None
            value = value.get(key)
        return value

    def wrong_type(self, value: Any) -> bool:
        """True if ``value`` (not None) is not of this column's type (the SQL then gives NULL)."""
        kind = self.type
        if kind == "json" or value is None:
            return False
        if kind == "text":
            return not isinstance(value, str)
        if kind == "boolean":
            return not isinstance(value, bool)
        if kind == "integer":
            return type(value) is not int or not -_INTEGER_LIMIT < value < _INTEGER_LIMIT
        if kind == "number":
            return isinstance(value, bool) or not isinstance(value, int | float)
        # timestamp: the shape every dialect parses, naming a date and time that exist
        if not isinstance(value, str) or _TIMESTAMP.fullmatch(value) is None:
            return True
        try:
            datetime.fromisoformat(value)  # 3.11+ reads Z
        except ValueError:
            return True
        return False


class AttributeTypeError(BosWarehouseError):
    """A promoted attribute of the wrong type; the message names the column and path, never the value."""

    def __init__(self, ref: str, column: AttributeColumn) -> None:
        message = (f"Record {ref!r}: {column.path} is not of type {column.type} (promoted column "
                   f"{column.name!r}); fix the source data, or set attribute_type_errors='null'.")
        super().__init__(message)
        self.column = column
        self.without_values = message  # the ref only: quarantine under a personal-data policy may keep it


@dataclass(frozen=True, slots=True)
class AttributeColumns:
    """The promoted columns of one table (empty: none) and what a wrong type does."""

    columns: tuple[AttributeColumn, ...] = ()
    type_errors: str = "invalid_records"

    def __bool__(self) -> bool:
        return bool(self.columns)

    @property
    def names(self) -> tuple[str, ...]:
        """The column names, in configured order (e.g. for per-column coverage counts)."""
        return tuple(c.name for c in self.columns)

    def check_policy(self, rules: Mapping[str, str]) -> None:
        """Refuse a path a personal-data policy drops, or hashes into a column that is not text.

        ``rules``: field -> ``keep``/``hash``/``drop`` (a policy's rules or its fingerprint's).
        """
        from airflow_provider_bos.warehouse.tables.policy_store import effective_action

        for column in self.columns:
            action = effective_action(dict(rules), column.path)
            if action == "drop":
                raise BosConfigurationError(
                    f"attribute_columns: {column.name!r} promotes {column.path}, which the personal-data "
                    f"policy drops; remove the column or the 'drop' rule."
                )
            if action == "hash" and column.type != "text":
                raise BosConfigurationError(
                    f"attribute_columns: {column.name!r} promotes {column.path}, which the personal-data "
                    f"policy hashes; a hashed value is text, so its type must be 'text', not {column.type!r}."
                )

    def checked(
        self, records: Iterable[Any], on_wrong_type: Callable[[Any, AttributeTypeError], bool],
    ) -> Iterator[Any]:
        """``records``, each decoded one checked: each wrong-typed value calls ``on_wrong_type(record,
        error)``, which returns True to keep the record (that column NULL), False to leave it out, or
        raises. Claims (undecoded records) pass: their stored row is already filled."""
        columns = self.columns
        for record in records:
            attributes = _attributes(record)
            if attributes is not None and not all(
                    on_wrong_type(record, AttributeTypeError(_ref(record), column)) for column in columns
                    if column.wrong_type(column.value(attributes))):
                continue
            yield record


def _attributes(record: Any) -> Mapping[str, Any] | None:
    # A FederatedRecord has the attribute; a claim has neither.
    value = record.get("attributes") if isinstance(record, Mapping) else getattr(record, "attributes", None)
    return value if isinstance(value, Mapping) else None


def _ref(record: Any) -> str:
    ref = record.get("record_ref") if isinstance(record, Mapping) else getattr(record, "record_ref", None)
    return str(ref)[:80]


def attribute_column(name: Any, spec: Any) -> AttributeColumn:
    """One promoted column: ``name`` and its path, or ``{"path": ..., "type": ...}`` (checked)."""
    if not isinstance(name, str) or not IDENTIFIER_PATTERN.fullmatch(name):
        raise BosConfigurationError(
            f"attribute_columns: {str(name)[:70]!r} is not a valid column name (letters, digits and "
            "underscores, starting with a letter or underscore, at most 63 characters)."
        )
    if name.lower() in _RESERVED or name.lower().startswith("_bos_"):
        raise BosConfigurationError(
            f"attribute_columns: {name!r} is one of the records table's own column names (or starts "
            "with _bos_); choose another name."
        )
    if isinstance(spec, str):
        path, kind = spec, "text"
    elif isinstance(spec, Mapping) and set(spec) <= {"path", "type"} and "path" in spec:
        path, kind = spec["path"], spec.get("type", "text")
    else:
        raise BosConfigurationError(
            f"attribute_columns[{name!r}] must be a path such as 'attributes.department' or "
            "{'path': 'attributes.employment.fte', 'type': 'number'}."
        )
    if not isinstance(kind, str) or kind not in ATTRIBUTE_TYPES:
        raise BosConfigurationError(
            f"attribute_columns[{name!r}]: type must be one of {ATTRIBUTE_TYPES}, not {str(kind)[:40]!r}."
        )
    parts = path.split(".") if isinstance(path, str) else []
    if (len(parts) < 2 or parts[0] != "attributes" or len(parts) > _MAX_DEPTH + 1
            or not all(_KEY.fullmatch(p) for p in parts[1:])):
        raise BosConfigurationError(
            f"attribute_columns[{name!r}]: the path must start with 'attributes.' and name keys of "
            f"letters, digits and underscores (at most {_MAX_DEPTH} deep), e.g. 'attributes.employment.fte'; "
            f"not {str(path)[:80]!r}."
        )
    return AttributeColumn(name=name, keys=tuple(parts[1:]), type=kind)


def check_attribute_columns(spec: Any, *, type_errors: Any = "invalid_records") -> AttributeColumns:
    """The :class:`AttributeColumns` of the operator's ``attribute_columns`` (None or {}: none).

    :raises BosConfigurationError: saying which entry is wrong and how to write it.
    """
    if not isinstance(type_errors, str) or type_errors not in ATTRIBUTE_TYPE_ERRORS:
        raise BosConfigurationError(
            f"attribute_type_errors must be one of {ATTRIBUTE_TYPE_ERRORS}, not {str(type_errors)[:40]!r}."
        )
    if spec is None:
        return AttributeColumns(type_errors=type_errors)
    if not isinstance(spec, Mapping):
        raise BosConfigurationError(
            "attribute_columns must map column names to attributes paths, e.g. "
            "{'department': 'attributes.department'}."
        )
    columns = tuple(attribute_column(name, value) for name, value in spec.items())
    lowered = [c.name.lower() for c in columns]
    if len(set(lowered)) != len(lowered):
        raise BosConfigurationError("attribute_columns: two columns have the same name (names are case-insensitive).")
    return AttributeColumns(columns=columns, type_errors=type_errors)


