"""The companion tables: each table beside the records table as one object (:mod:`.base`), and the
registry the writer, erasure, ``pii-apply`` and reclaim iterate."""

from airflow_provider_bos.warehouse.tables.companions.base import Companion, Created, PolicyRewrite, RunPart
from airflow_provider_bos.warehouse.tables.companions.columns import COLUMNS
from airflow_provider_bos.warehouse.tables.companions.history import HISTORY
from airflow_provider_bos.warehouse.tables.companions.lineage import LINEAGE
from airflow_provider_bos.warehouse.tables.companions.pending_retirements import PENDING_RETIREMENTS
from airflow_provider_bos.warehouse.tables.companions.policy import POLICY
from airflow_provider_bos.warehouse.tables.companions.rejects import REJECTS
from airflow_provider_bos.warehouse.tables.companions.sources import SOURCES

__all__ = ["COLUMNS", "COMPANIONS", "HISTORY", "LINEAGE", "PENDING_RETIREMENTS", "POLICY", "REJECTS", "SOURCES",
           "Companion", "Created", "PolicyRewrite", "RunPart"]

#: Every companion table, in the order an erasure deletes from them.
COMPANIONS: tuple[Companion, ...] = (HISTORY, SOURCES, LINEAGE, REJECTS, PENDING_RETIREMENTS, POLICY, COLUMNS)
