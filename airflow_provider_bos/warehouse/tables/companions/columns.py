"""``<table>_columns``: the promoted attribute columns the records table is filled for."""

from airflow_provider_bos.warehouse.tables.companions.base import Companion, Created, PolicyRewrite, RunPart
from airflow_provider_bos.warehouse.tables.schema import promoted_table

COLUMNS = Companion(
    suffix="columns", kind="promoted columns table", define=promoted_table, created=Created.PROMOTED,
    # A column filled from the stored attributes before the load; the run's rows after the merge.
    written=(RunPart.BEFORE_LOAD, RunPart.AFTER_MERGE),
    erased_by=(), any_ref_length=False, searched_by_finders=False,
    pii_apply=PolicyRewrite.COLUMNS_REFILLED, row_key=(), reclaimed=False,
)
