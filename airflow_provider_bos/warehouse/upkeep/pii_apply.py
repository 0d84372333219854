"""Re-applying a stricter personal-data policy to a stored table (``airflow-provider-bos pii-apply``).

:func:`apply_stricter_policy` rewrites the records table, ``<table>_history`` and ``<table>_rejects``
as a run under the new policy would have written them, in ONE transaction under the writers' lock,
without reading BOS again: what was kept and is now hashed is hashed, what is now dropped is
dropped; what was hashed already stays as it is. It then stores the new policy's fingerprint.

Why not in SQL: HMAC-SHA-256 is not available in SQLite, MariaDB or DuckDB SQL, and a key bound into
SQL text would reach the server's statement logs. So the rows are read in batches, changed in
Python with the same plan a run applies, and written back in their stored form only
(:mod:`.policy_rewrite`: on PostgreSQL ``COPY``'d into a temporary table, on DuckDB through a
staged file, each applied by one ``UPDATE ... FROM``; elsewhere one bound ``UPDATE`` a row). Each rewritten
row gets its content hash again (the function the writer uses), so the next sync under the policy
finds it unchanged. Wire hashes: a table written without a policy holds each record's raw wire hash;
it is keyed (under the key, as a run under a policy keys it) so the next re-run still skips
byte-identical records; a table written under a policy already has them in its policy's form, and
they are cleared (the next run decodes every record once and stores them again).

A looser policy (hash or drop to keep, drop to hash), another key or recipe cannot be applied to
stored rows: the raw values are gone. It is refused, saying it needs a full re-read.

Promoted attribute columns are filled again from the rewritten attributes. A column a DAG no longer
promotes keeps its values but not its path (``<table>_columns`` forgets it), so it cannot be filled
again: when the policy hashes or drops anything under ``attributes``, such a column is cleared
(NULL) in the records table and its history, and the result names it.

Audit: like an erasure, one row with ``tool_name`` ``airflow-provider-bos pii-apply`` and a note of
the counts and the fields changed (no value, no ref); the sensors look up runs by their read's tool
name, so it is never taken for a sync. After the commit the freed space is reclaimed
(:mod:`.reclaim`): the raw values remain in the database's free pages until then.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import sqlalchemy as sa

from airflow_provider_bos.exceptions import BosConfigurationError, BosWarehouseError
from airflow_provider_bos.pii import PiiKey, PiiPolicy, PiiPolicyMismatch, PolicyFingerprint
from airflow_provider_bos.warehouse.run.audit import SyncRunInfo, audit_insert, utcnow
from airflow_provider_bos.warehouse.run.catalog import column_names
from airflow_provider_bos.warehouse.run.promoted import refill_promoted
from airflow_provider_bos.warehouse.run.provenance import rebuild_provenance
from airflow_provider_bos.warehouse.run.stage_dir import run_stage_directory
from airflow_provider_bos.warehouse.run.transaction import RunTransaction, db_detail
from airflow_provider_bos.warehouse.tables.companions import COMPANIONS, Created, PolicyRewrite
from airflow_provider_bos.warehouse.tables.policy_store import (
    action_changes,
    effective_action,
    loosening,
    read_stored_policy,
    store_policy,
    way_forward,
)
from airflow_provider_bos.warehouse.tables.schema import RECORD_COLUMNS, records_table
from airflow_provider_bos.warehouse.upkeep.policy_rewrite import rewrite_rows
from airflow_provider_bos.warehouse.upkeep.reclaim import reclaim_space
from airflow_provider_bos.warehouse.writer import WarehouseWriter

__all__ = ["PII_APPLY_TOOL_NAME", "PolicyApplied", "apply_stricter_policy", "delta_policy"]

log = logging.getLogger(__name__)

#: The audit row's ``tool_name`` of a re-applied policy.
PII_APPLY_TOOL_NAME = "airflow-provider-bos pii-apply"


@dataclass
class PolicyApplied:
    """What one re-application rewrote."""

    run_id: str
    fingerprint: str
    records: int = 0
    history: int = 0
    rejects: int = 0
    #: Rows whose wire hash was keyed (or cleared).
    wire_hashes: int = 0
    #: Promoted attribute columns filled again from the rewritten attributes.
    promoted_columns: int = 0
    #: Columns no longer promoted (their path forgotten) cleared because the policy changes attributes.
    cleared_columns: list[str] = field(default_factory=list)
    #: What was run after the commit to reclaim the rewritten rows' old space.
    reclaimed: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def delta_policy(stored: PolicyFingerprint | None, new: PolicyFingerprint) -> PiiPolicy:
    """What rows stored under ``stored`` need to be stored as under ``new`` (which is as strict or
    stricter): hash what was kept and is hashed now, drop what is dropped now and was not; leave the
    rest (a hashed value is not hashed again)."""
    was = dict(stored.rules) if stored is not None else {}
    rules: dict[str, str] = {}
    for name in sorted(set(was) | set(new.rules) | {"attributes"}):
        before, after = effective_action(was, name), effective_action(dict(new.rules), name)
        rules[name] = ("hash" if (before, after) == ("keep", "hash")
                        else "drop" if after == "drop" and before != "drop" else "keep")
    return PiiPolicy.parse(rules)


def apply_stricter_policy(
    engine: sa.Engine, *, table: str, policy: PiiPolicy | Mapping[str, str], key: PiiKey | None,
    schema: str | None = None, audit_table: str = "bos_sync_runs", conn_id: str | None = None,
    lock_timeout_s: float = 300.0,
) -> PolicyApplied:
    """Re-apply ``policy`` (with ``key``) to ``table``, its history and rejects in one transaction.

    :raises PiiPolicyMismatch: the policy is looser than the table's, or the key or recipe differs
        (nothing changed; a full re-read is needed).
    :raises BosConfigurationError: no such table, an invalid policy, a policy that hashes without a key.
    :raises BosWarehouseError: the database refused (rolled back), or the space could not be reclaimed
        after the commit.
    """
    policy = PiiPolicy.parse(policy)
    new = policy.fingerprint(key)
    writer = WarehouseWriter(engine, table=table, schema=schema, audit_table=audit_table, lock_timeout_s=lock_timeout_s)
    try:
        inspector = sa.inspect(engine)
        if not inspector.has_table(writer.table, schema=writer.schema):
            raise BosConfigurationError(f"There is no table {writer.destination_table} to apply a policy to.")
        extra_columns = sorted(c for c in column_names(engine, writer.dialect, writer.table, writer.schema)
                               if c not in RECORD_COLUMNS and not c.startswith("_bos_"))
        writer.ensure_tables()
        policy_table = writer.ensure_policy_table()
        present = [c for c in COMPANIONS if c.created is Created.ALWAYS
                   or inspector.has_table(c.name(writer.table), schema=writer.schema)]
    except sa.exc.SQLAlchemyError as exc:
        raise BosWarehouseError(f"Could not inspect {writer.destination_table}: {db_detail(exc)}") from exc
    d = writer.dialect
    run = SyncRunInfo(run_id=str(uuid.uuid4()), conn_id=conn_id, tool_name=PII_APPLY_TOOL_NAME, started_at=utcnow())
    applied = PolicyApplied(run_id=run.run_id, fingerprint=new.text)
    metadata = sa.MetaData()
    records = records_table(metadata, d.name, writer.table, writer.schema)
    tx = RunTransaction(engine, d, table=writer.table, schema=writer.schema, run_id=run.run_id,
                        lock_timeout_s=lock_timeout_s, guard_index=None)
    try:
        with tx.committed(f"Applying the policy to {writer.destination_table} failed and was rolled "
                          f"back (nothing changed)"):
            tx.begin()
            tx.lock()
            stored_text = read_stored_policy(tx.conn, policy_table)
            stored = PolicyFingerprint.parse(stored_text) if stored_text is not None else None
            refused = loosening(stored, new)
            if refused:
                raise PiiPolicyMismatch(writer.destination_table, refused,
                                        way_forward=way_forward(stored, new, table=writer.table))
            if stored_text == new.text or (stored is None and policy.is_empty):
                tx.rollback()
                return applied
            delta = delta_policy(stored, new)
            plan = delta.plan(key if delta.needs_key else None)
            # Raw wire hashes (no policy before) are keyed; a policy's own form is cleared.
            wire_key = key if stored is None else None
            with contextlib.ExitStack() as files:
                directory = files.enter_context(run_stage_directory()) if d.capabilities.updates_from_file else None
                rewritten = [c for c in present if c.pii_apply is PolicyRewrite.ROWS]
                done, *versions_done = rewrite_rows(
                    tx.conn, records, plan, d, key=("record_ref",), wire=(wire_key,) if d.wire_hash_column else None,
                    directory=directory,
                    versions=[(c.table(writer.table, d.name, writer.schema, metadata), c.row_key) for c in rewritten],
                )
                applied.records, applied.wire_hashes = done.rows, done.wire_hashes
                for companion, version_done in zip(rewritten, versions_done, strict=True):
                    setattr(applied, companion.suffix, version_done.rows)
            # Promoted columns live in the records table and the tables of its rows' versions.
            versions = [c.name(writer.table) for c in present if c.pii_apply is PolicyRewrite.ROWS]
            configured: list[str] = []
            rebuilt = "sources" in done.fields  # the provenance entries come from the sources alone
            for companion in present:
                if companion.pii_apply is PolicyRewrite.REBUILT:  # from the rewritten records' JSON
                    if rebuilt:
                        rebuild_provenance(tx, companion.name(writer.table))
                elif companion.pii_apply is PolicyRewrite.COLUMNS_REFILLED:  # from the rewritten attributes
                    configured = refill_promoted(tx, companion.table(writer.table, d.name, writer.schema, metadata),
                                                 versions[0] if versions else None, policy=new.text,
                                                 run_id=run.run_id, at=utcnow())
                    applied.promoted_columns = len(configured)
                elif companion.pii_apply is PolicyRewrite.RECORDS_EMPTIED and not policy.is_empty:
                    setattr(applied, companion.suffix, _empty_quarantined_records(
                        tx.conn, companion.table(writer.table, d.name, writer.schema, metadata)))
                elif companion.pii_apply is PolicyRewrite.POLICY_STORED:
                    store_policy(tx.conn, policy_table, new, run_id=run.run_id, at=utcnow())
            if _changes_attributes(delta):
                applied.cleared_columns = [c for c in extra_columns if c not in configured]
                for table_name in (writer.table, *versions):
                    if applied.cleared_columns:
                        tx.exec(d.clear_columns(table_name, writer.schema, applied.cleared_columns))
            note = _note(stored, new, applied, writer.destination_table)
            tx.exec(audit_insert(d, writer.audit_table, writer.schema, run, status="complete", finished_at=utcnow(),
                                 completeness=None, result_count=applied.records, notes=note,
                                 destination_table=writer.destination_table, present=writer.audit_columns))
    finally:
        tx.close()
    log.info("BOS pii-apply %s: %s", run.run_id, note)
    changed = (PolicyRewrite.ROWS, *((PolicyRewrite.REBUILT,) if rebuilt else ()), PolicyRewrite.RECORDS_EMPTIED)
    tables = [writer.table, *(c.name(writer.table) for c in present if c.reclaimed and c.pii_apply in changed)]
    applied.reclaimed = reclaim_space(engine, d, tables, writer.schema)
    return applied


def _empty_quarantined_records(conn: sa.Connection, rejects: sa.Table) -> int:
    """Under a policy a quarantined record keeps only its ref and reason: empty the stored records."""
    empty = sa.bindparam("empty", b"", type_=rejects.c.record.type)
    result = conn.execute(sa.update(rejects).where(rejects.c.record != empty).values(record=b"", truncated=False))
    return int(result.rowcount or 0)


def _changes_attributes(delta: PiiPolicy) -> bool:
    """True when ``delta`` hashes or drops something under ``attributes``."""
    return any(name == "attributes" or name.startswith("attributes.") for name, action in delta.rules
               if action != "keep")


def _note(stored: PolicyFingerprint | None, new: PolicyFingerprint, applied: PolicyApplied, table: str) -> str:
    changes = ", ".join(f"{name} {a} -> {b}" for name, (a, b) in action_changes(stored, new).items())
    cleared = (f"; cleared the column(s) {', '.join(applied.cleared_columns)}, no longer promoted (their path is "
               "not known, so they could not be filled again)" if applied.cleared_columns else "")
    return (f"Re-applied a stricter personal-data policy ({changes}) without a re-read: rewrote "
            f"{applied.records} row(s) of {table}, {applied.history} history version(s), emptied "
            f"{applied.rejects} quarantined record(s); {applied.wire_hashes} wire hash(es) keyed or cleared"
            f"{cleared}.")
