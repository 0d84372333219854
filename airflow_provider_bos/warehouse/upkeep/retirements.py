"""A person's decision on the retirements a complete full read held (``on_retire_guard="ask"``).

:func:`held_retirements` says what a run held: how many rows, which share of its scope, per
source, and a sample of refs (refs only: never a person's values). :func:`apply_held_retirements`
retires them, in one transaction under the writers' lock, only if no newer read wrote the table
since the run that held them: a newer read saw the table later and decided for itself (it retired
what it did not return, or held its own), so the older decision is void and nothing is retired.
:func:`reject_held_retirements` retires nothing. Each decision forgets what the run held and writes
an audit row of its own saying what it did and why (tool ``airflow-provider-bos retirement
decision``); no decision names a ref.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from airflow_provider_bos.exceptions import BosConfigurationError, BosWarehouseError
from airflow_provider_bos.warehouse.dialects import dialect_for
from airflow_provider_bos.warehouse.dialects import retirements as sql
from airflow_provider_bos.warehouse.run.audit import SyncRunInfo, audit_insert, utcnow
from airflow_provider_bos.warehouse.run.history import record_history
from airflow_provider_bos.warehouse.run.reconcile import Lifecycle, retire_listed
from airflow_provider_bos.warehouse.run.transaction import RunTransaction, db_detail
from airflow_provider_bos.warehouse.tables.companions import HISTORY, LINEAGE, PENDING_RETIREMENTS, SOURCES
from airflow_provider_bos.warehouse.tables.records import parse_timestamp
from airflow_provider_bos.warehouse.tables.schema import audit_table as audit_table_definition
from airflow_provider_bos.warehouse.upkeep.erase import ERASE_TOOL_NAME
from airflow_provider_bos.warehouse.upkeep.pii_apply import PII_APPLY_TOOL_NAME
from airflow_provider_bos.warehouse.writer import WarehouseWriter
from airflow_provider_bos.wire import DELETIONS_MODES, ReconcileOptions

__all__ = [
    "DECISION_TOOL_NAME", "HeldRetirements", "RetirementDecision", "apply_held_retirements", "held_retirements",
    "reject_held_retirements",
]

log = logging.getLogger(__name__)

#: The tool name of a decision's audit row.
DECISION_TOOL_NAME = "airflow-provider-bos retirement decision"
#: Audit rows that are no read: they neither move the table under a held decision nor count as one.
_NOT_READS = (ERASE_TOOL_NAME, PII_APPLY_TOOL_NAME, DECISION_TOOL_NAME)
#: How many refs a summary shows at most.
MAX_SAMPLE = 50
#: Where a held row has no provenance entry.
NO_SOURCE = "(no source)"


@dataclass(frozen=True)
class HeldRetirements:
    """What one run held: ``held`` of its scope's ``scope_rows`` current rows, per source (a row
    with entries from several sources counts under each), and the first ``sample`` refs in order."""

    run_id: str
    destination_table: str
    held: int
    scope_rows: int
    share: float
    per_source: dict[str, int]
    sample_refs: list[str]
    read_at: str
    held_at: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RetirementDecision:
    """What a decision did: ``outcome`` ``"applied"`` (``retired`` rows retired), ``"rejected"`` or
    ``"overtaken"`` (a newer read wrote the table: nothing retired, ``newer_run_id`` says which)."""

    run_id: str
    decision_run_id: str
    outcome: str
    held: int
    retired: int = 0
    newer_run_id: str | None = None
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def held_retirements(engine: sa.Engine, *, table: str, run_id: str, schema: str | None = None,
                     sample: int = 10) -> HeldRetirements | None:
    """What ``run_id`` held in ``table``'s pending retirements, or None (nothing held, or decided)."""
    if not 0 <= sample <= MAX_SAMPLE:
        raise BosConfigurationError(f"sample must be from 0 to {MAX_SAMPLE} refs, not {sample!r}.")
    writer = WarehouseWriter(engine, table=table, schema=schema)
    d, metadata = dialect_for(engine).name, sa.MetaData()
    pending = PENDING_RETIREMENTS.table(writer.table, d, writer.schema, metadata)
    sources = SOURCES.table(writer.table, d, writer.schema, metadata)
    try:
        with engine.connect() as conn:
            if not sa.inspect(conn).has_table(pending.name, schema=writer.schema):
                return None
            mine = pending.c.run_id == run_id
            head = conn.execute(sa.select(sa.func.count(), sa.func.max(pending.c.scope_rows),
                                          sa.func.min(pending.c.read_at), sa.func.min(pending.c.held_at))
                                .where(mine)).one()
            held, scope_rows, read_at, held_at = int(head[0]), int(head[1] or 0), head[2], head[3]
            if not held:
                return None
            refs = list(conn.execute(sa.select(pending.c.record_ref).where(mine)
                                     .order_by(pending.c.record_ref).limit(sample)).scalars()) if sample else []
            label = sa.func.coalesce(sources.c.source_identity, sources.c.source_type)
            by_source = conn.execute(
                sa.select(label, sa.func.count(sa.distinct(pending.c.record_ref)))
                .select_from(pending.join(sources, sources.c.record_ref == pending.c.record_ref))
                .where(mine, sources.c.is_current).group_by(label)).all()
            with_entries = int(conn.execute(
                sa.select(sa.func.count(sa.distinct(pending.c.record_ref)))
                .select_from(pending.join(sources, sources.c.record_ref == pending.c.record_ref))
                .where(mine, sources.c.is_current)).scalar_one())
    except sa.exc.SQLAlchemyError as exc:
        raise BosWarehouseError(f"Could not read the retirements held in {writer.destination_table}: "
                                f"{db_detail(exc)}") from exc
    per_source = {str(name or NO_SOURCE): int(n) for name, n in sorted(by_source, key=lambda r: str(r[0]))}
    if held > with_entries:
        per_source[NO_SOURCE] = per_source.get(NO_SOURCE, 0) + held - with_entries
    return HeldRetirements(
        run_id=run_id, destination_table=writer.destination_table, held=held, scope_rows=scope_rows,
        share=round(held / max(scope_rows, 1), 4), per_source=per_source, sample_refs=refs,
        read_at=_iso(read_at), held_at=_iso(held_at),
    )


def apply_held_retirements(
    engine: sa.Engine, *, table: str, run_id: str, schema: str | None = None, audit_table: str = "bos_sync_runs",
    deletions: str = "soft", history: bool = False, decided_by: str | None = None, lock_timeout_s: float = 300.0,
) -> RetirementDecision:
    """Retire what ``run_id`` held, unless a newer read wrote ``table`` since (then nothing, and the
    decision says which run). ``deletions`` and ``history`` as the read that held them.

    :raises BosConfigurationError: nothing is held under ``run_id`` (decided already, or a newer read
        of the scope held its own instead), or a ``deletions`` value that is not one.
    :raises BosWarehouseError: the database refused; nothing was retired.
    """
    if deletions not in DELETIONS_MODES:
        raise BosConfigurationError(f"deletions must be one of {DELETIONS_MODES}, not {str(deletions)[:40]!r}.")
    return _decide(engine, table=table, schema=schema, audit_table=audit_table, run_id=run_id,
                   decided_by=decided_by, lock_timeout_s=lock_timeout_s,
                   act=lambda tx, writer, holder: _apply(tx, writer, holder, deletions=deletions, history=history))


def reject_held_retirements(
    engine: sa.Engine, *, table: str, run_id: str, schema: str | None = None, audit_table: str = "bos_sync_runs",
    decided_by: str | None = None, lock_timeout_s: float = 300.0,
) -> RetirementDecision:
    """Retire nothing of what ``run_id`` held; forget it and say so in the audit table.

    :raises BosConfigurationError: nothing is held under ``run_id``.
    """
    return _decide(engine, table=table, schema=schema, audit_table=audit_table, run_id=run_id,
                   decided_by=decided_by, lock_timeout_s=lock_timeout_s, act=_reject)


@dataclass(frozen=True)
class _Holder:
    """The run that held the retirements, as its pending rows and audit row say."""

    run_id: str
    held: int
    #: None when nothing is held any more (a newer read of the scope dropped it).
    scope: str | None
    read_at: datetime
    pending: str
    audit: sa.Table


_Act = Callable[[RunTransaction, WarehouseWriter, _Holder], RetirementDecision]


def _decide(engine: sa.Engine, *, table: str, schema: str | None, audit_table: str, run_id: str,
            decided_by: str | None, lock_timeout_s: float, act: _Act) -> RetirementDecision:
    if not isinstance(run_id, str) or not run_id.strip():
        raise BosConfigurationError("run_id must name the run that held the retirements (its XCom "
                                    "pending_retirements.run_id).")
    writer = WarehouseWriter(engine, table=table, schema=schema, audit_table=audit_table,
                             lock_timeout_s=lock_timeout_s)
    writer.ensure_tables()  # the audit table's columns, for the decision's row
    d = writer.dialect
    pending = PENDING_RETIREMENTS.table(writer.table, d.name, writer.schema)
    audit = audit_table_definition(sa.MetaData(), d.name, writer.audit_table, writer.schema)
    decision_run = SyncRunInfo(run_id=str(uuid.uuid4()), tool_name=DECISION_TOOL_NAME, started_at=utcnow())
    tx = RunTransaction(engine, d, table=writer.table, schema=writer.schema, run_id=decision_run.run_id,
                        lock_timeout_s=lock_timeout_s, guard_index=None)
    try:
        with tx.committed(f"Deciding the retirements held in {writer.destination_table} failed and "
                          f"was rolled back (nothing was retired)"):
            tx.begin()
            tx.lock()  # no run writes the table between the check and the retirement
            head: Any = (0, None, None)
            if sa.inspect(tx.conn).has_table(pending.name, schema=writer.schema):
                head = tx.conn.execute(sa.select(sa.func.count(), sa.func.min(pending.c.scope),
                                                 sa.func.min(pending.c.read_at))
                                       .where(pending.c.run_id == run_id)).one()
            holder = _Holder(run_id, int(head[0]), head[1], _utc(head[2]), pending.name, audit)
            newer = _newer_read(tx, writer, holder)
            if newer is not None and (not holder.held or act is not _reject):
                decision = _overtaken(writer, holder, newer)
            elif holder.held:
                decision = act(tx, writer, holder)
            else:
                raise _nothing_held(run_id, writer)
            decision.decision_run_id = decision_run.run_id
            if decided_by:  # an Airflow user id: who decided belongs in the audit
                decision.note += f" Decided by {decided_by[:100]!r}."
            tx.exec(sql.drop_held(d, pending.name, writer.schema, run_id=run_id))
            if not d.capabilities.ddl_commits:
                tx.drop_staging()
            tx.exec(audit_insert(d, writer.audit_table, writer.schema, decision_run, status="complete",
                                 finished_at=utcnow(), counts={"retired": decision.retired},
                                 destination_table=writer.destination_table, present=writer.audit_columns,
                                 scope=holder.scope, notes=decision.note))
        if d.capabilities.ddl_commits:
            tx.drop_committed_staging()
    finally:
        tx.close()
    log.info("BOS retirement decision %s on run %s: %s", decision.decision_run_id, run_id, decision.note)
    return decision


def _apply(tx: RunTransaction, writer: WarehouseWriter, holder: _Holder, *, deletions: str,
           history: bool) -> RetirementDecision:
    d, now = tx.dialect, utcnow()
    keys = tx.work_table("_r", "keys")
    count = tx.exec(sql.collect_held(d, keys, holder.pending, writer.table, writer.schema, run_id=holder.run_id,
                                     read_at=holder.read_at)).rowcount
    count = int(count) if count is not None and count > 0 else 0
    history_table = HISTORY.name(writer.table) if history else None
    life = Lifecycle(ReconcileOptions(sync_mode="full", deletions=deletions, history=history), writer.audit_table,
                     LINEAGE.name(writer.table), history_table, SOURCES.name(writer.table),
                     frozenset(writer.audit_columns))
    if count:
        retire_listed(tx, keys, life, now, min(holder.read_at, now), successor=False, expected=count)
        if history_table is not None and deletions == "soft":
            record_history(tx, history_table, run_id=tx.run_id, at=now, touched=True)
    gone = holder.held - count
    note = (f"Approved: retired {count} of the {holder.held} rows run {holder.run_id} held"
            + (f" ({gone} were no longer current or were written since, and stay as they are)" if gone else "")
            + ".")
    return RetirementDecision(holder.run_id, "", "applied", holder.held, retired=count, note=note)


def _overtaken(writer: WarehouseWriter, holder: _Holder, newer: tuple[str, str, Any]) -> RetirementDecision:
    newer_id, status, finished = newer
    what = f"the {holder.held} retirements" if holder.held else "the retirements"
    note = (f"Not applied: {what} run {holder.run_id} held were overtaken by run {newer_id} ({status}, finished "
            f"{_iso(finished)}), a newer read that wrote {writer.destination_table} since and decided for itself "
            "(it retired or held what it did not return). Nothing was retired; decide on the newest run's hold, "
            "if it has one.")
    return RetirementDecision(holder.run_id, "", "overtaken", holder.held, newer_run_id=newer_id, note=note)


def _reject(tx: RunTransaction, writer: WarehouseWriter, holder: _Holder) -> RetirementDecision:
    note = (f"Rejected: the {holder.held} retirements run {holder.run_id} held were not applied; those rows "
            "stay current. The next complete full read of the scope decides again.")
    return RetirementDecision(holder.run_id, "", "rejected", holder.held, note=note)


def _newer_read(tx: RunTransaction, writer: WarehouseWriter, holder: _Holder) -> tuple[str, str, Any] | None:
    """The newest run that wrote the table after the holding run (a read: not an erasure, a
    ``pii-apply`` or a decision), or None."""
    a = holder.audit
    held_finished = sa.select(a.c.finished_at).where(a.c.run_id == holder.run_id).scalar_subquery()
    row = tx.conn.execute(
        sa.select(a.c.run_id, a.c.status, a.c.finished_at)
        .where(a.c.destination_table == writer.destination_table, a.c.run_id != holder.run_id,
               a.c.status.in_(("complete", "partial")), a.c.finished_at >= held_finished,
               sa.or_(a.c.tool_name.is_(None), a.c.tool_name.not_in(_NOT_READS)))
        .order_by(a.c.finished_at.desc()).limit(1)).first()
    return (str(row[0]), str(row[1]), row[2]) if row is not None else None


def _nothing_held(run_id: str, writer: WarehouseWriter) -> BosConfigurationError:
    return BosConfigurationError(
        f"No retirements are held under run {run_id} in {writer.destination_table}: they were decided already, "
        "or the run held none (check the run id: XCom pending_retirements.run_id of the read). Nothing was retired."
    )


def _utc(value: Any) -> datetime:
    """A stored timestamp (a driver may hand back text, or a naive UTC datetime) as aware UTC."""
    return parse_timestamp(value) if value is not None else utcnow()


def _iso(value: Any) -> str:
    return _utc(value).isoformat() if value is not None else ""
