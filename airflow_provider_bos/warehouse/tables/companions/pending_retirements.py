"""``<table>_pending_retirements``: retirements a complete full read held for a person to decide.

Written only under ``on_retire_guard="ask"``, when the read's retirements pass
``max_retire_fraction`` (:mod:`~..run.retire_hold`); read, applied or dropped on a person's
decision (:mod:`~..upkeep.retirements`). One row per held ref and holding run: refs and times only.
"""

from __future__ import annotations

import sqlalchemy as sa

from airflow_provider_bos.warehouse.tables.companions.base import Companion, Created, PolicyRewrite, RunPart
from airflow_provider_bos.warehouse.tables.schema import _table_kwargs, column_types

__all__ = ["PENDING_RETIREMENTS", "pending_retirements_table"]


def pending_retirements_table(metadata: sa.MetaData, dialect_name: str, name: str,
                              schema: str | None = None) -> sa.Table:
    """One row per ref a run held: the run (its audit row), its scope key, when the read observed
    the rows gone (their ``_bos_deleted_at`` if approved), when it held them and how many current
    rows its scope had then."""
    t = column_types(dialect_name)
    return sa.Table(
        name,
        metadata,
        sa.Column("run_id", t["id"], primary_key=True, nullable=False),
        sa.Column("record_ref", t["key"], primary_key=True, nullable=False),
        sa.Column("scope", t["hash"], nullable=False),
        sa.Column("read_at", t["ts"], nullable=False),
        sa.Column("held_at", t["ts"], nullable=False),
        sa.Column("scope_rows", t["int"], nullable=True),
        schema=schema,
        **_table_kwargs(dialect_name),
    )


PENDING_RETIREMENTS = Companion(
    suffix="pending_retirements", kind="pending retirements table", define=pending_retirements_table,
    created=Created.RETIRE_GUARD, written=(RunPart.RETIRE,),
    # A held ref is a person's: an erasure takes it out of the decision too.
    erased_by=("record_ref",), any_ref_length=False, searched_by_finders=False,
    pii_apply=PolicyRewrite.NO_VALUES, row_key=(), reclaimed=True,
)
