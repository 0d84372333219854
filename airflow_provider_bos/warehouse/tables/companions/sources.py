"""``<table>_sources``: the provenance table, one row per provenance entry of every row."""

from airflow_provider_bos.warehouse.tables.companions.base import Companion, Created, PolicyRewrite, RunPart
from airflow_provider_bos.warehouse.tables.schema import sources_table

SOURCES = Companion(
    suffix="sources", kind="provenance table", define=sources_table, created=Created.ALWAYS,
    # Built from a table written before it, before the load; the entries of the rows a run wrote
    # after the merge (supersession reads them).
    written=(RunPart.BEFORE_LOAD, RunPart.AFTER_MERGE),
    erased_by=("record_ref",), any_ref_length=False, searched_by_finders=False,
    # Its external ids are the records' JSON ones: rebuilt from them once they are rewritten.
    pii_apply=PolicyRewrite.REBUILT, row_key=(), reclaimed=True,
)
