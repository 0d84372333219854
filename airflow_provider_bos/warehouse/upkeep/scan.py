"""Every row of a table in key order: a batch at a time by keyset pagination (no cursor stays open while
the caller's statements run on the same connection), or several tables' rows in one ordered pass."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from typing import Any

import sqlalchemy as sa

__all__ = ["rows_in_batches", "rows_in_one_pass"]


def rows_in_batches(
    conn: sa.Connection, table: sa.Table, columns: Sequence[str], *, key: Sequence[str], batch_size: int = 1000,
    as_text: Collection[str] = (), within: tuple[Any, Any] = (None, None),
    where: sa.ColumnElement[bool] | sa.TextClause | None = None, first_batch_size: int | None = None,
) -> Iterator[list[sa.RowMapping]]:
    """``columns`` (the ``key`` columns included) of every row of ``table``, ordered by ``key`` (one
    column, or two: a record_ref and its version), ``batch_size`` rows at a time (the first batch
    ``first_batch_size``, if given); the columns named in ``as_text`` (JSON ones) read as their text,
    undecoded. ``within``: only the rows whose first key column is above the first bound and up to
    the second (``None``: unbounded); ``where``: only the rows it holds for."""
    selected = [sa.cast(table.c[name], sa.Text()).label(name) if name in as_text else table.c[name]
                for name in dict.fromkeys([*key, *columns])]
    keys = [table.c[name] for name in key]
    above, up_to = within
    bounds = [*(() if above is None else (keys[0] > above,)), *(() if up_to is None else (keys[0] <= up_to,)),
              *(() if where is None else (where,))]
    last: tuple[Any, ...] | None = None
    size = first_batch_size or batch_size
    while True:
        query = sa.select(*selected).where(*bounds).order_by(*keys).limit(size)
        if last is not None:
            query = query.where(_after(keys, last))
        rows = list(conn.execute(query).mappings())
        if not rows:
            return
        yield rows
        last, size = tuple(rows[-1][name] for name in key), batch_size


def _after(keys: Sequence[sa.Column[Any]], last: tuple[Any, ...]) -> sa.ColumnElement[bool]:
    """``keys > last`` in key order, written without row values (portable). The first key's bound
    stands alone too: without it a planner reads the OR from the table's start on every batch."""
    first, *rest = keys
    later: sa.ColumnElement[bool] = first > last[0]
    if not rest:
        return later
    return sa.and_(first >= last[0], sa.or_(later, sa.and_(first == last[0], _after(rest, last[1:]))))


def rows_in_one_pass(
    conn: sa.Connection, parts: Sequence[tuple[sa.Table, Sequence[str]]], *, order_by: str, batch_size: int = 1000,
    as_text: Collection[str] = (), where: Sequence[sa.ColumnElement[bool] | sa.TextClause | None] = (),
) -> Iterator[tuple[int, dict[str, Any]]]:
    """The rows of every table of ``parts`` (``(table, columns)``), as ``(index of its part, its columns)``,
    from one query ordered by the column ``order_by`` that every table has, a part's rows before the
    next part's at the same value; fetched ``batch_size`` at a time. The columns named in ``as_text``
    are read as their text. ``where``: a condition per part (``None``, or no more items: every row).
    The query's result stays open until the last row: nothing else may run on ``conn`` meanwhile."""
    names = list(dict.fromkeys(name for _, columns in parts for name in columns))
    types: dict[str, sa.types.TypeEngine[Any]] = {}
    for table, columns in parts:
        for name in columns:
            types.setdefault(name, sa.Text() if name in as_text else table.c[name].type)
    conditions = [*where, *[None] * (len(parts) - len(where))]
    selects = [
        sa.select(sa.literal(index).label("_part"), *(
            ((sa.cast(table.c[name], sa.Text()) if name in as_text else table.c[name]) if name in columns
             else sa.cast(sa.null(), types[name])).label(name) for name in names)
        ).where(*(() if condition is None else (condition,)))
        for index, ((table, columns), condition) in enumerate(zip(parts, conditions, strict=True))]
    every = sa.union_all(*selects).subquery()
    query = sa.select(every).order_by(every.c[order_by], every.c["_part"])
    wanted = [[(names.index(name) + 1, name) for name in columns] for _, columns in parts]
    for rows in conn.execute(query).partitions(batch_size):
        for row in rows:
            index = row[0]
            yield index, {name: row[at] for at, name in wanted[index]}
