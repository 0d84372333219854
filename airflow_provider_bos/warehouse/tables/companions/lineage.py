"""``<table>_lineage``: which record_ref was superseded by which, in which run."""

from airflow_provider_bos.warehouse.tables.companions.base import Companion, Created, PolicyRewrite, RunPart
from airflow_provider_bos.warehouse.tables.schema import lineage_table

LINEAGE = Companion(
    suffix="lineage", kind="lineage table", define=lineage_table, created=Created.ALWAYS,
    written=(RunPart.SUPERSEDE,),
    # A pair names two refs of one person: erased from either side.
    erased_by=("record_ref", "successor_ref"), any_ref_length=False, searched_by_finders=False,
    pii_apply=PolicyRewrite.NO_VALUES, row_key=(), reclaimed=True,
)
