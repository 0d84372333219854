"""``<table>_rejects``: the records ``invalid_records="quarantine"`` kept out of the table."""

from airflow_provider_bos.warehouse.tables.companions.base import Companion, Created, PolicyRewrite, RunPart
from airflow_provider_bos.warehouse.tables.schema import rejects_table

REJECTS = Companion(
    suffix="rejects", kind="rejects table", define=rejects_table, created=Created.QUARANTINE,
    written=(RunPart.AFTER_MERGE,),
    # Its finders are its own (the kept record, raw): erase_finders.find_quarantined.
    erased_by=("record_ref",), any_ref_length=True, searched_by_finders=False,
    pii_apply=PolicyRewrite.RECORDS_EMPTIED, row_key=(), reclaimed=True,
)
