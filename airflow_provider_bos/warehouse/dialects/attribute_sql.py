"""The SQL of promoted attributes (a part of every dialect): a column's value from ``attributes``.

Each dialect gives one expression per type (:meth:`AttributeSql._attribute_value`) that reads the
path from the stored ``attributes`` JSON, tests its JSON type, and casts: a value of another type
is NULL, as a missing path or JSON null is. The same expression fills the whole table once (the
backfill) and then each run's written rows, so a column never depends on when its row was
written. Paths are bound parameters; the patterns in the SQL are this module's own constants.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_bos.warehouse.dialects.statement import Statement
from airflow_provider_bos.warehouse.tables.schema import DELETED_AT_COLUMN

if TYPE_CHECKING:
    from airflow_provider_bos.warehouse.tables.attribute_columns import AttributeColumn

__all__ = ["AttributeSql", "Expression"]

#: An SQL expression and its parameters, in order.
Expression = tuple[str, tuple[Any, ...]]
_PART = re.compile(r"\{([a-z_]+)\}")


class AttributeSql:
    """Mixed into :class:`~.base.WarehouseDialect`: fill and count promoted columns."""

    # Provided by WarehouseDialect.
    placeholder: str
    if TYPE_CHECKING:
        def quote(self, identifier: str) -> str: ...
        def table_ref(self, table: str, schema: str | None) -> str: ...

    def _attribute_value(self, column: AttributeColumn) -> Expression:
        """The column's value from the row's ``attributes`` (NULL unless the JSON type fits)."""
        raise NotImplementedError(f"{type(self).__name__} has no promoted attributes")

    def _attribute_present(self, column: AttributeColumn) -> Expression:
        """True where the row's ``attributes`` holds a non-null value at the column's path."""
        raise NotImplementedError(f"{type(self).__name__} has no promoted attributes")

    def fill_attribute_columns(
        self, target: str, schema: str | None, columns: Sequence[AttributeColumn], *, run_id: str | None = None,
    ) -> Statement:
        """``UPDATE`` the columns from ``attributes``: the rows ``run_id`` wrote, or (None) every row."""
        sets: list[str] = []
        params: list[Any] = []
        for column in columns:
            sql, values = self._attribute_value(column)
            sets.append(f"{self.quote(column.name)} = {sql}")
            params.extend(values)
        where = ""
        if run_id is not None:
            where = f" WHERE {self.quote('_bos_run_id')} = {self.placeholder}"
            params.append(run_id)
        return Statement(f"UPDATE {self.table_ref(target, schema)} SET {', '.join(sets)}{where}", tuple(params))

    def clear_columns(self, target: str, schema: str | None, names: Sequence[str]) -> Statement:
        """``UPDATE`` every row of ``target``: ``names`` (promoted columns no longer filled) to NULL."""
        sets = ", ".join(f"{self.quote(name)} = NULL" for name in names)
        return Statement(f"UPDATE {self.table_ref(target, schema)} SET {sets}", ())

    def count_attribute_type_errors(self, target: str, schema: str | None, column: AttributeColumn) -> Statement:
        """One row: how many current (not retired) rows of the records table ``target`` hold a value at
        the column's path that the column could not take."""
        sql, params = self._attribute_present(column)
        return Statement(f"SELECT COUNT(*) FROM {self.table_ref(target, schema)} "
                         f"WHERE {sql} AND {self.quote(column.name)} IS NULL "
                         f"AND {self.quote(DELETED_AT_COLUMN)} IS NULL", params)


def expand(template: str, **parts: Expression) -> Expression:
    """``template`` with each ``{name}`` replaced by that part's SQL, its parameters in the order the
    parts appear (a part used twice binds its parameters twice). Braces around anything else (a
    regular expression's ``{1,18}``) stay."""
    params: list[Any] = []

    def part(match: re.Match[str]) -> str:
        sql, values = parts[match.group(1)]
        params.extend(values)
        return sql

    return _PART.sub(part, template), tuple(params)
