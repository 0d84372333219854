"""The SQL of held retirements (``on_retire_guard="ask"``): holding them, finding them again, dropping them.

Statements against ``<table>_pending_retirements`` (:mod:`~..tables.companions.pending_retirements`),
built with each dialect's quoting and placeholders; the run's steps (:mod:`~..run.retire_hold`) and
the decision (:mod:`~..upkeep.retirements`) execute them.
"""

from __future__ import annotations

from datetime import datetime

from airflow_provider_bos.warehouse.dialects.base import Statement, WarehouseDialect
from airflow_provider_bos.warehouse.tables.schema import DELETED_AT_COLUMN

__all__ = ["collect_held", "drop_held", "drop_older_holds", "hold", "set_scope_rows"]


def hold(d: WarehouseDialect, pending: str, keys: str, schema: str | None, *, run_id: str, scope: str,
         read_at: datetime, held_at: datetime) -> Statement:
    """Into ``pending``: every ref of the work table ``keys`` (the rows the read would retire), held by ``run_id``."""
    ref = d.quote("record_ref")
    columns = ", ".join(d.quote(c) for c in ("run_id", "scope", "record_ref", "read_at", "held_at"))
    return Statement(
        f"INSERT INTO {d.table_ref(pending, schema)} ({columns}) "
        f"SELECT {d.bind_id()}, {d.bind_id()}, k.{ref}, {d.bind_ts()}, {d.bind_ts()} "
        f"FROM {d.stage_ref(keys, schema)} k",
        (run_id, scope, d.bind_timestamp(read_at), d.bind_timestamp(held_at)),
    )


def set_scope_rows(d: WarehouseDialect, pending: str, schema: str | None, *, run_id: str, rows: int) -> Statement:
    """The scope's current rows when ``run_id`` held its refs (what the share is of)."""
    return Statement(
        f"UPDATE {d.table_ref(pending, schema)} SET {d.quote('scope_rows')} = {d.placeholder} "
        f"WHERE {d.quote('run_id')} = {d.placeholder}",
        (rows, run_id),
    )


def drop_older_holds(d: WarehouseDialect, pending: str, schema: str | None, *, scope: str, run_id: str) -> Statement:
    """Forget what earlier runs of ``scope`` held: ``run_id``, a newer complete read of it, decided instead."""
    return Statement(
        f"DELETE FROM {d.table_ref(pending, schema)} WHERE {d.quote('scope')} = {d.placeholder} "
        f"AND {d.quote('run_id')} <> {d.placeholder}",
        (scope, run_id),
    )


def drop_held(d: WarehouseDialect, pending: str, schema: str | None, *, run_id: str) -> Statement:
    """Forget what ``run_id`` held (decided: applied, rejected or overtaken)."""
    return Statement(f"DELETE FROM {d.table_ref(pending, schema)} WHERE {d.quote('run_id')} = {d.placeholder}",
                     (run_id,))


def collect_held(d: WarehouseDialect, keys: str, pending: str, target: str, schema: str | None, *, run_id: str,
                 read_at: datetime) -> Statement:
    """Into the work table ``keys``: the refs ``run_id`` held whose rows are still current and were
    observed no later than its read (a row written since is not the one the read saw gone)."""
    ref, obs = d.quote("record_ref"), d.quote("_bos_observed_at")
    return Statement(
        f"INSERT INTO {d.stage_ref(keys, schema)} ({ref}) SELECT p.{ref} FROM {d.table_ref(pending, schema)} p "
        f"JOIN {d.table_ref(target, schema)} t ON t.{ref} = p.{ref} "
        f"WHERE p.{d.quote('run_id')} = {d.placeholder} AND t.{d.quote(DELETED_AT_COLUMN)} IS NULL "
        f"AND t.{obs} <= {d.placeholder}",
        (run_id, d.bind_timestamp(read_at)),
    )
