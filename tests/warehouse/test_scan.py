"""Reading every row of a table a batch at a time (``rows_in_batches``), as ``pii-apply``, the erasure
finders and the re-hash do: every row exactly once, in key order, whatever the batch boundaries."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from airflow_provider_bos.warehouse.upkeep.scan import rows_in_batches, rows_in_one_pass


@pytest.mark.parametrize(("batch_size", "first_batch_size"), [(1, None), (2, None), (3, None), (7, None), (100, None),
                                                           (3, 1), (2, 5)])
def test_every_row_of_a_two_column_key_comes_once_in_key_order(engine, batch_size: int,
                                                               first_batch_size: int | None) -> None:
    """Versions of one ref span batch boundaries (three refs with 1, 4 and 2 versions); a first batch
    of its own size (pii-apply's first round) is followed by batches of ``batch_size``."""
    table = sa.Table(f"scan_test_{batch_size}_{first_batch_size}", sa.MetaData(),
                     sa.Column("record_ref", sa.String(64), primary_key=True),
                     sa.Column("_bos_valid_from", sa.DateTime(timezone=True), primary_key=True),
                     sa.Column("n", sa.Integer))
    start = datetime(2026, 10, 1, tzinfo=UTC)
    rows = [{"record_ref": ref, "_bos_valid_from": start + timedelta(days=d), "n": i}
            for i, (ref, d) in enumerate([("b", 0), ("a", 3), ("a", 1), ("c", 2), ("a", 0), ("c", 0), ("a", 2)])]
    table.create(engine)
    try:
        with engine.begin() as conn:
            conn.execute(table.insert(), rows)
        with engine.connect() as conn:
            batches = list(rows_in_batches(conn, table, ["n"], key=("record_ref", "_bos_valid_from"),
                                           batch_size=batch_size, first_batch_size=first_batch_size))
        sizes = [first_batch_size or batch_size, *[batch_size] * (len(batches) - 1)]
        assert [len(b) for b in batches[:-1]] == sizes[:-1] and len(batches[-1]) <= sizes[-1]
        in_key_order = [r["n"] for r in sorted(rows, key=lambda r: (r["record_ref"], r["_bos_valid_from"]))]
        assert [r["n"] for b in batches for r in b] == in_key_order
    finally:
        table.drop(engine)


@pytest.mark.parametrize("batch_size", [1, 3, 100])
def test_two_tables_in_one_pass_come_once_each_ordered_by_ref_the_first_tables_row_first(
        engine, batch_size: int) -> None:
    """``rows_in_one_pass`` (DuckDB's pii-apply reads): a ref's row of the first table, then its versions;
    a column a table lacks is absent from its rows; a column read as text comes as text."""
    metadata = sa.MetaData()
    rows_table = sa.Table("scan_rows_test", metadata, sa.Column("record_ref", sa.String(64), primary_key=True),
                          sa.Column("wire", sa.String(64)))
    versions = sa.Table("scan_versions_test", metadata,
                        sa.Column("record_ref", sa.String(64), primary_key=True),
                        sa.Column("_bos_valid_from", sa.DateTime(timezone=True), primary_key=True),
                        sa.Column("n", sa.Integer))
    start = datetime(2026, 10, 1, tzinfo=UTC)
    metadata.create_all(engine)
    try:
        with engine.begin() as conn:
            conn.execute(rows_table.insert(), [{"record_ref": ref, "wire": f"w-{ref}"} for ref in ("c", "a", "d")])
            conn.execute(versions.insert(), [{"record_ref": ref, "_bos_valid_from": start + timedelta(days=d), "n": i}
                                             for i, (ref, d) in enumerate([("b", 0), ("a", 1), ("c", 0), ("a", 0)])])
        with engine.connect() as conn:
            read = list(rows_in_one_pass(conn, [(rows_table, ["record_ref", "wire"]),
                                                (versions, ["record_ref", "_bos_valid_from", "n"])],
                                         order_by="record_ref", batch_size=batch_size, as_text=("n",)))
        assert [(part, row["record_ref"]) for part, row in read] == [
            (0, "a"), (1, "a"), (1, "a"), (1, "b"), (0, "c"), (1, "c"), (0, "d")]
        assert [row for part, row in read if part == 0] == [{"record_ref": ref, "wire": f"w-{ref}"} for ref in "acd"]
        assert sorted(row["n"] for part, row in read if part == 1) == ["0", "1", "2", "3"]
        assert all(set(row) == {"record_ref", "_bos_valid_from", "n"} for part, row in read if part == 1)
    finally:
        metadata.drop_all(engine)
