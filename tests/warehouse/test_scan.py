"""Reading every row of a table a batch at a time (``rows_in_batches``), as ``pii-apply``, the erasure
finders and the re-hash do: every row exactly once, in key order, whatever the batch boundaries."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from airflow_provider_bos.warehouse.upkeep.scan import rows_in_batches


@pytest.mark.parametrize("batch_size", [1, 2, 3, 7, 100])
def test_every_row_of_a_two_column_key_comes_once_in_key_order(engine, batch_size: int) -> None:
    """Versions of one ref span batch boundaries (three refs with 1, 4 and 2 versions)."""
    table = sa.Table(f"scan_test_{batch_size}", sa.MetaData(), sa.Column("record_ref", sa.String(64), primary_key=True),
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
                                           batch_size=batch_size))
        assert all(len(b) <= batch_size for b in batches)
        in_key_order = [r["n"] for r in sorted(rows, key=lambda r: (r["record_ref"], r["_bos_valid_from"]))]
        assert [r["n"] for b in batches for r in b] == in_key_order
    finally:
        table.drop(engine)
