"""After the merge, before the audit row: supersede, retire and keep history, in the run's transaction.

What a result may do to the rows it did not return (docs/sync-modes.md):

- only a **complete** result (and not a contradictory one, nor one with quarantined records: the
  writer has made those ``partial`` by now) does anything; a partial one retires and supersedes
  nothing, whatever the mode;
- **supersede** (both modes): a current row, observed no later than the read, ALL of whose
  provenance entries ``(source_type, source_identity, external_id)`` belong to records of the
  result is retired as superseded, its
  ``_bos_superseded_by`` the smallest successor record_ref; every (ref, successor) pair goes to
  ``<table>_lineage``; an entry several records of the result hold (a contradiction: BOS merges a
  source's record into one) supersedes nothing, so the lineage stays linear in the result;
- **retire** (``sync_mode="full"``): a current row of the read's scope that the result did not
  return, observed no later than the read, is retired (``_bos_deleted_at``), unless that would
  retire more than ``max_retire_fraction`` of the scope's current rows: then nothing is retired
  and the run is ``partial`` (``on_retire_guard="fail"``), or the run stays ``complete`` and those
  retirements are held for a person to approve or reject (``"ask"``, :mod:`.retire_hold`).

The read's observation time is ``metadata.observed_at``, else the run's start; a retired row's
``_bos_deleted_at`` is the retiring read's, and the writer keeps a record out of the merge when
its row was retired by a read newer than this one (:meth:`RunTransaction.withhold`): a late retry
or backfill of an older read neither brings back nor supersedes what a newer one reconciled.

Rows are rewritten only when their content changes, so a row's ``_bos_observed_at`` is when its
content was observed, not when it was last seen. A complete full read confirms every current row
of its scope: its audit row's ``confirmed_at`` is its read time. A read older than its scope's
newest ``confirmed_at`` (a backfill, a late retry) writes nothing that newer read answered for
and retires and supersedes nothing. A partial read revives no ref a complete read merged away
while the successor is current (counted ``withheld``).

A row's scope is the scope of the run that last wrote it: ``_bos_run_id`` joined to the audit
table's ``scope`` column; a complete full read takes into its scope the current rows it returned
that another scope wrote (their ``_bos_run_id`` only). Rows written before scopes existed (their
run has no scope) are outside every scope unless the read opts in with ``adopt_unscoped_rows``.

Every statement is the dialect's (:class:`~.dialects.lifecycle.LifecycleSql`), set-based against
the staging table, which holds every record_ref of the run, or against the current rows the run
did not return, found from the claims kept out of staging (unless the table's state token proves
the result returned every current row: then none of this runs).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from airflow_provider_bos.warehouse.dialects.lifecycle import RunKeys, ScopeFilter
from airflow_provider_bos.warehouse.run.audit import SyncRunInfo, utcnow
from airflow_provider_bos.warehouse.run.audit_fields import partial_with, with_note
from airflow_provider_bos.warehouse.run.claims import KeptClaims, stage_kept_claims
from airflow_provider_bos.warehouse.run.history import record_history
from airflow_provider_bos.warehouse.run.provenance import record_provenance
from airflow_provider_bos.warehouse.run.retire_hold import forget_older_holds, hold_retirements
from airflow_provider_bos.warehouse.run.settle import DirectLoad, LoadOutcome, StagedWithKeptClaims
from airflow_provider_bos.warehouse.run.transaction import RunTransaction, UpsertCounts
from airflow_provider_bos.warehouse.tables.records import canonical_json, parse_timestamp
from airflow_provider_bos.warehouse.tables.schema import CONFIRMED_AT_COLUMN, SCOPE_COLUMN
from airflow_provider_bos.wire import ReconcileOptions

__all__ = ["Lifecycle", "read_guards", "read_time", "reconcile", "retire_listed", "scope_key"]

log = logging.getLogger(__name__)


def scope_key(options: ReconcileOptions, run: SyncRunInfo) -> str:
    """The scope key a run's audit row records: SHA-256 of the explicit ``scope`` name, or of the
    read's (BOS resource, context, tool, arguments hash)."""
    if options.scope is not None:
        identity: Any = {"scope": options.scope}
    else:
        identity = {"resource": options.resource or run.conn_id, "context": run.context_handle,
                    "tool": run.tool_name, "arguments": run.arguments_hash}
    return hashlib.sha256(canonical_json(identity).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Lifecycle:
    """What the writer gives the lifecycle steps: the options and the tables beside the records."""

    options: ReconcileOptions
    audit_table: str
    lineage_table: str
    history_table: str | None
    #: ``<table>_sources``: the provenance entries (see :mod:`.provenance`).
    sources_table: str
    #: Which of the audit table's added columns it has (a table made before them lacks some).
    audit_columns: frozenset[str] = frozenset()


def read_guards(tx: RunTransaction, audit: dict[str, Any], life: Lifecycle, run: SyncRunInfo) -> None:
    """What the final result tells the merge about this read (set on ``tx`` before it classifies).

    Its read time; whether it is partial (it then revives nothing merged away); and whether a newer
    complete read of its scope answered for it already (it is then a backfill or a late retry).
    """
    tx.read_time = read_time(audit, run, utcnow())
    tx.partial_read = audit["status"] != "complete"
    scope = _scope_filter(life.options, run)
    if SCOPE_COLUMN not in life.audit_columns or CONFIRMED_AT_COLUMN not in life.audit_columns:
        return
    newest = tx.exec(tx.dialect.scope_confirmed_at(life.audit_table, tx.schema, scope.scope)).scalar_one_or_none()
    if newest is not None and tx.read_time < parse_timestamp(newest):
        tx.answered_by_newer = (life.audit_table, scope)


def reconcile(
    tx: RunTransaction, counts: UpsertCounts, audit: dict[str, Any], *, life: Lifecycle, run: SyncRunInfo,
    loaded: LoadOutcome,
) -> dict[str, Any]:
    """Supersede, retire (full reads) and record history after the merge; return the audit fields.

    ``counts`` gets ``superseded``, ``retired`` and ``retire_withheld``; the audit fields may turn
    ``partial`` with a note (the guard), or get a note saying why nothing was retired. ``loaded``:
    how the records were loaded (a direct load, or claims kept out of staging, changes the steps).
    """
    direct = isinstance(loaded, DirectLoad)
    kept = loaded.kept if isinstance(loaded, StagedWithKeptClaims) else None
    options = life.options
    now = utcnow()
    observed = tx.read_time if tx.read_time is not None else read_time(audit, run, now)
    complete = audit["status"] == "complete"
    full = options.sync_mode == "full"
    keys: RunKeys | None = None
    if counts.withheld:
        audit = with_note(audit, f"{counts.withheld} records of this partial read came under refs that a complete read "
                             "merged away (their successor is current); they were withheld, not revived.")
    # Before supersession, which finds the entries of the rows this run wrote in the provenance table.
    record_provenance(tx, life.sources_table, direct=direct, counts=counts)
    if tx.answered_by_newer is not None:
        audit = with_note(audit, "A newer complete read of this scope answered for this read's records: nothing was "
                             "written over it, retired or superseded.")
    # An empty table loaded directly holds only this run's rows: nothing to supersede or retire.
    elif complete and not direct and not _returned_every_current_row(tx, counts, kept):
        for statement in tx.dialect.reconcile_settings():
            tx.exec(statement)
        keys = tx.run_keys = run_keys(tx, kept)
        counts.superseded, shared = _supersede(tx, life, now, observed, keys)
        if shared:
            audit = with_note(audit, f"{shared} provenance entr{'y' if shared == 1 else 'ies'} of this result "
                                 "belonged to several records (BOS merges a source's record into one): nothing "
                                 "was superseded through them.")
        if full:
            audit = _retire(tx, counts, audit, life, run, now, observed, keys)
    elif full and not complete:
        audit = with_note(audit, "Nothing was retired or superseded: only a complete read retires rows.")
    if life.history_table is not None:
        touched = counts.inserted + counts.updated + counts.retired + counts.superseded > 0
        record_history(tx, life.history_table, run_id=tx.run_id, at=now, touched=touched)
    # Confirmed at the read's own observation time (metadata.observed_at) only: a run's start is no
    # observation of BOS, and a later read observed before it must not pass for a backfill.
    stated = audit.get("observed_at") is not None
    if full and audit["status"] == "complete" and tx.answered_by_newer is None:
        # After the history: taking rows into the scope is no new version of them.
        # Only a row the run returned and did not write can be another scope's: a run that wrote
        # every key it returned (a first sync into a table of other rows) has none to take.
        if not direct and (counts.unchanged or counts.skipped_stale):
            adopted = _rows(tx.exec(tx.dialect.adopt_into_scope(
                tx.table, life.audit_table, tx.schema, scope=_scope_filter(options, run), run_id=tx.run_id, keys=keys,
            )))
            if adopted:
                log.info("BOS run %s: took %d unchanged rows written by another scope into this read's scope.",
                         tx.run_id, adopted)
        if options.on_retire_guard == "ask":  # this read decided for its scope: older holds are void
            forget_older_holds(tx, _scope_filter(options, run).scope)
        if stated:
            audit = {**audit, "confirmed_at": observed}
    return audit


def _returned_every_current_row(tx: RunTransaction, counts: UpsertCounts, kept: KeptClaims | None) -> bool:
    """True when the result provably holds every current row (nothing to supersede or retire).

    After the merge every record_ref of the run is a row of the table, current unless it was a
    stale copy of a retired row; so with no stale record the run's distinct keys (inserted +
    updated + unchanged) are all current rows, and if the table has exactly that many, no other.
    When the claims were kept, the table's state token (confirmed under the lock) holds the number
    of current rows before the merge, and answers without a query: an unchanged re-run whose every
    record was a claim is the whole table if that number is its keys' number; and since a merge
    only adds current rows (it inserts or revives, never retires), fewer keys than that number
    never are.
    """
    if counts.skipped_stale:
        return False
    keys = counts.inserted + counts.updated + counts.unchanged
    if kept is not None and kept.state_unchanged and tx.dialect.capabilities.wire_state_counts_current:
        state = kept.known.state
        if isinstance(state, tuple) and state:
            before = int(state[-1])
            if keys < before:
                return False
            if not counts.inserted and not counts.updated and counts.unchanged == kept.rows:
                return before == keys
    return int(tx.exec(tx.dialect.count_current(tx.table, tx.schema)).scalar_one()) == keys


def run_keys(tx: RunTransaction, kept: KeptClaims | None) -> RunKeys:
    """Where the anti-joins read the run's record_refs from: staging (or a keyed copy of it), or,
    when claims were kept out of staging, the current rows neither staged nor claimed."""
    # The prefixes sent are the unclaimed ones, or (staging the claims) the claimed ones, whichever
    # are fewer: a run holds at most half the table's rows' prefixes as text.
    if kept is not None and kept.count and not kept.staged:
        if 2 * kept.rows >= len(kept.known):
            missing = tx.work_table("_m", "keys")
            statement = tx.dialect.collect_unreturned(missing, tx.stage, tx.table, tx.schema,
                                                      kept.unclaimed_prefixes())
            if statement is not None:
                tx.exec(statement)
                for settings in tx.dialect.unreturned_settings(missing, tx.schema):
                    tx.exec(settings)
                return RunKeys(missing, missing=True)
        stage_kept_claims(tx, kept)  # the anti-joins need every record_ref of the run staged
    if not tx.dialect.capabilities.keyed_run_keys:
        return RunKeys(tx.stage)
    keys = tx.work_table("_k", "keys")
    tx.exec(tx.dialect.collect_run_keys(keys, tx.stage, tx.schema))
    return RunKeys(keys)


def _supersede(tx: RunTransaction, life: Lifecycle, now: datetime, observed: datetime,
               keys: RunKeys) -> tuple[int, int]:
    """Supersede the rows the result's records took over; (rows superseded, entries of the result
    held by several of its records, through which nothing was superseded)."""
    d, schema = tx.dialect, tx.schema
    sources = life.sources_table
    candidates = tx.work_table("_c", "keys")
    lookup_settings = d.entry_lookup_settings()
    for statement in lookup_settings:
        tx.exec(statement)
    found = _rows(tx.exec(d.collect_candidates(candidates, sources, schema)))
    for statement in d.reconcile_settings() if lookup_settings else ():
        tx.exec(statement)
    if not found:
        return 0, 0
    others = tx.work_table("_o", "provenance")
    if not _rows(tx.exec(d.collect_others(others, candidates, keys, tx.table, sources, schema,
                                          observed_before=observed))):
        return 0, 0
    shared = int(tx.exec(d.count_shared_entries(others, keys, sources, schema)).scalar_one())
    successors = tx.work_table("_n", "provenance")
    if not _rows(tx.exec(d.collect_successors(successors, others, keys, sources, schema))):
        return 0, shared
    superseded = tx.work_table("_s", "successors")
    count = _rows(tx.exec(d.pick_superseded(superseded, others, successors, schema)))
    if not count:
        return 0, shared
    tx.exec(d.insert_lineage(life.lineage_table, others, successors, superseded, schema, run_id=tx.run_id,
                             recorded_at=now))
    retire_listed(tx, superseded, life, now, observed, successor=True, expected=count)
    return count, shared


def _retire(
    tx: RunTransaction, counts: UpsertCounts, audit: dict[str, Any], life: Lifecycle, run: SyncRunInfo,
    now: datetime, observed: datetime, keys: RunKeys,
) -> dict[str, Any]:
    d, schema, options = tx.dialect, tx.schema, life.options
    scope = _scope_filter(options, run)
    retired = tx.work_table("_r", "keys")
    count = _rows(tx.exec(d.collect_retired(retired, keys, tx.table, life.audit_table, schema, scope=scope,
                                            observed_before=observed)))
    if not count:
        return audit
    limit = options.max_retire_fraction
    # The scope holds at least the rows to retire and the rows this run wrote (its own now): when
    # even that many would keep within the limit, the exact count is not needed.
    if limit is not None and count > limit * (count + counts.inserted + counts.updated):
        current = int(tx.exec(d.count_scope_rows(tx.table, life.audit_table, schema, scope=scope,
                                                 run_id=tx.run_id)).scalar_one())
        if count > limit * current:
            counts.retire_withheld = count
            if options.on_retire_guard == "ask":  # the read's other work lands; a person decides these
                return hold_retirements(tx, audit, retired, scope=scope.scope, count=count, current=current,
                                        limit=limit, read_at=min(observed, now), held_at=now)
            note = (
                f"Nothing was retired: this complete full read did not return {count} of its scope's {current} "
                f"current rows ({count / max(current, 1):.0%}), more than max_retire_fraction={limit:g}. "
                "Check the read (an empty result, a wrong context or scope, an outage reported as complete); "
                "if the rows really left, raise max_retire_fraction for one run (None turns the guard off)."
            )
            log.warning("BOS run %s: %s", tx.run_id, note)
            return partial_with(audit, note)  # why the run is partial: its error_message
    retire_listed(tx, retired, life, now, observed, successor=False, expected=count)
    counts.retired = count
    return audit


def retire_listed(tx: RunTransaction, keys: str, life: Lifecycle, now: datetime, observed: datetime, *,
                  successor: bool, expected: int) -> None:
    """Retire the rows listed in the work table ``keys`` as ``life.options.deletions`` says, their
    provenance entries with them; exactly ``expected`` rows, or the transaction is rolled back."""
    d = tx.dialect
    if life.options.deletions == "hard":
        if life.history_table is not None:  # now: record_history finds rows by their run, and these go
            tx.exec(d.history_close_listed(life.history_table, keys, tx.schema, closed_at=now))
        statement = d.delete_listed(tx.table, keys, tx.schema)
    else:
        # _bos_deleted_at is when the read saw the rows gone (never later than now): what a later
        # read's observation time is compared with before it brings a row back.
        statement = d.mark_retired(tx.table, keys, tx.schema, successor=successor, retired_at=min(observed, now),
                                   synced_at=now, run_id=tx.run_id)
    changed = tx.exec(statement).rowcount
    if changed is not None and 0 <= changed != expected:
        from airflow_provider_bos.exceptions import BosWarehouseError

        raise BosWarehouseError(f"Retiring rows of {tx.destination_table} changed {changed} rows where {expected} "
                                "were expected; rolled back.")
    if life.options.deletions == "hard":
        tx.exec(d.delete_listed(life.sources_table, keys, tx.schema))
    else:
        tx.exec(d.retire_provenance(life.sources_table, keys, tx.schema))


def _scope_filter(options: ReconcileOptions, run: SyncRunInfo) -> ScopeFilter:
    legacy: dict[str, str | None] | None = None
    if options.adopt_unscoped_rows:
        legacy = {"conn_id": run.conn_id, "context_handle": run.context_handle, "tool_name": run.tool_name}
        if options.scope is None:
            legacy["arguments_hash"] = run.arguments_hash
    return ScopeFilter(scope_key(options, run), legacy)


def read_time(audit: dict[str, Any], run: SyncRunInfo, now: datetime) -> datetime:
    """When the read observed its records: ``metadata.observed_at``, else when the run started."""
    for value in (audit.get("observed_at"), run.started_at):
        if value is None:
            continue
        try:
            return parse_timestamp(value)
        except ValueError:
            continue
    return now


def _rows(result: Any) -> int:
    rowcount = result.rowcount
    return int(rowcount) if rowcount is not None and rowcount > 0 else 0
