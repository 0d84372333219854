"""What a companion table declares: a table kept beside the records table, as one object.

Each companion says, in one place, how it is defined, when a run creates and writes it, what an
erasure removes from it, what ``pii-apply`` does to it and whether the space its deleted rows held
is reclaimed. The writer, erasure, ``pii-apply``, reclaim and the DDL-vs-code test iterate the
registry (:data:`~.COMPANIONS`) instead of naming tables, so a new companion is a module declaring
one more object, plus its place in the registry.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from airflow_provider_bos.warehouse.tables.identifiers import validate_identifier
from airflow_provider_bos.warehouse.tables.schema import companion_table_name

__all__ = ["Companion", "Created", "PolicyRewrite", "RunPart"]

#: ``(metadata, dialect name, table name, schema)`` -> the table's definition (:mod:`..schema`).
Definition = Callable[[sa.MetaData, str, str, "str | None"], sa.Table]


class Created(enum.StrEnum):
    """When the writer creates the table."""

    ALWAYS = "with the records table"
    HISTORY = "by the first run with history=True"
    QUARANTINE = "by the first run with invalid_records='quarantine'"
    POLICY = "by the first run under a personal-data policy (and by pii-apply)"
    PROMOTED = "by the first run with attribute_columns"
    RETIRE_GUARD = "by the first run with on_retire_guard='ask'"

    def asked_by(self, options: Any) -> bool:
        """Whether a run with these ``WriteOptions`` makes the table before its load (the writer asks
        every companion; those made with the records table, under a policy or for promoted columns
        are made where those are)."""
        reconcile = options.reconcile
        if self is Created.HISTORY:
            return bool(reconcile.history)
        if self is Created.QUARANTINE:
            return bool(options.invalid_records == "quarantine")
        if self is Created.RETIRE_GUARD:
            return bool(reconcile.on_retire_guard == "ask" and reconcile.sync_mode == "full")
        return False


class RunPart(enum.StrEnum):
    """When a run writes the table, in the order of the run's steps (docs/architecture.md)."""

    BEFORE_LOAD = "before the load, under the writers' lock"
    AFTER_MERGE = "after the merge"
    SUPERSEDE = "when supersession retires rows (reconcile)"
    RETIRE = "when a full read's retirements pass max_retire_fraction under on_retire_guard='ask' (reconcile)"
    AFTER_RECONCILE = "after reconcile"


class PolicyRewrite(enum.StrEnum):
    """What ``pii-apply`` does to the table so it holds nothing the new policy hashes or drops."""

    ROWS = "its rows rewritten as the records table's are"
    REBUILT = "built again from the rewritten records table"
    RECORDS_EMPTIED = "the quarantined records emptied (ref and reason stay)"
    COLUMNS_REFILLED = "the promoted columns filled again; those no longer promoted cleared"
    POLICY_STORED = "the new policy stored"
    NO_VALUES = "holds refs and timestamps only: nothing a policy names"


@dataclass(frozen=True)
class Companion:
    """One table beside the records table. Every field is required: a companion that does not say
    what erasure and ``pii-apply`` do to it cannot be declared."""

    #: ``<table>_<suffix>``.
    suffix: str
    #: What it is, in messages ("history table").
    kind: str
    define: Definition
    created: Created
    #: When a run writes it (empty: only commands do).
    written: tuple[RunPart, ...]
    #: The columns holding a record_ref by which an erasure deletes a person's rows (every one of them);
    #: empty: it holds nothing of any person (a policy, column names).
    erased_by: tuple[str, ...]
    #: The erasure deletes by refs of any length (a ref too long for the records table's key is
    #: only ever here: it was quarantined for its length).
    any_ref_length: bool
    #: The erasure's finders (email, phone, external id) look through its rows as through the records table's.
    searched_by_finders: bool
    pii_apply: PolicyRewrite
    #: Its key columns, where ``pii-apply`` rewrites its rows one by one (:attr:`PolicyRewrite.ROWS`).
    row_key: tuple[str, ...]
    #: The space its deleted or rewritten rows held is reclaimed after an erasure or ``pii-apply``.
    reclaimed: bool

    def name(self, records_table: str) -> str:
        """The table's name beside ``records_table`` (a long name shortened, see :func:`companion_table_name`)."""
        return companion_table_name(records_table, self.suffix)

    def table(self, records_table: str, dialect_name: str, schema: str | None,
              metadata: sa.MetaData | None = None) -> sa.Table:
        """The table's definition beside ``records_table``, its name validated."""
        name = validate_identifier(self.name(records_table), kind=self.kind)
        return self.define(metadata if metadata is not None else sa.MetaData(), dialect_name, name, schema)

    @property
    def holds_people(self) -> bool:
        """True when its rows belong to people (an erasure removes them)."""
        return bool(self.erased_by)
