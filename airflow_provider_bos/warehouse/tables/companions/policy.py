"""``<table>_policy``: the personal-data policy the table was written with (its fingerprint)."""

from airflow_provider_bos.warehouse.tables.companions.base import Companion, Created, PolicyRewrite, RunPart
from airflow_provider_bos.warehouse.tables.schema import policy_table

POLICY = Companion(
    suffix="policy", kind="policy table", define=policy_table, created=Created.POLICY,
    written=(RunPart.BEFORE_LOAD,),
    erased_by=(), any_ref_length=False, searched_by_finders=False,
    pii_apply=PolicyRewrite.POLICY_STORED, row_key=(), reclaimed=False,
)
