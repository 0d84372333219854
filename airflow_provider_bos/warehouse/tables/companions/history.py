"""``<table>_history`` (``history=True``): every version of every record (SCD2)."""

from airflow_provider_bos.warehouse.tables.companions.base import Companion, Created, PolicyRewrite, RunPart
from airflow_provider_bos.warehouse.tables.schema import history_table

HISTORY = Companion(
    suffix="history", kind="history table", define=history_table, created=Created.HISTORY,
    # Seeded with the current rows before the load; a version closed and opened per changed row after reconcile.
    written=(RunPart.BEFORE_LOAD, RunPart.AFTER_RECONCILE),
    erased_by=("record_ref",), any_ref_length=False, searched_by_finders=True,
    pii_apply=PolicyRewrite.ROWS, row_key=("record_ref", "_bos_valid_from"), reclaimed=True,
)
