"""One BOS sync, without Airflow: streamed read -> staged upsert + audit row -> outcome.

The operator and the benchmark both run this, so what is measured is what ships. Typed against
the Protocols of :mod:`airflow_provider_bos.wire`: the read is a :class:`~..wire.FederatedRead`
(``McpSession.federated_read`` or ``BosHook``'s) returning a :class:`~..wire.StreamingRead`, the
writer a :class:`~..wire.RecordSink` (``WarehouseWriter``). It imports neither mcp/ nor warehouse/.
"""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_provider_bos.exceptions import BosError, BosResultError
from airflow_provider_bos.pii.stream import PolicyRun
from airflow_provider_bos.redaction import redact, redacted_prefix
from airflow_provider_bos.wire import (
    FederatedRead,
    KnownWireHashes,
    ReadObservations,
    ReconcileOptions,
    RecordSink,
    RunInfo,
    StreamingRead,
    WriteCounts,
    WriteOptions,
)

if TYPE_CHECKING:
    from airflow_provider_bos.warehouse.tables.attribute_columns import AttributeColumns

__all__ = [
    "KNOWN_COMPLETENESS", "SyncOutcome", "contradiction_message", "cyclic_gc_paused", "failure_message",
    "run_status", "run_sync",
]

log = logging.getLogger(__name__)

# completeness -> audit status; anything else fails closed.
KNOWN_COMPLETENESS = {"complete": "complete", "partial": "partial"}


@dataclass
class SyncOutcome:
    run: RunInfo
    result: StreamingRead  # fully consumed
    counts: WriteCounts
    status: str

    def summary(self, destination: str) -> dict[str, Any]:
        """The small, secret-free summary a task returns (never records)."""
        result, counts = self.result, self.counts
        return {
            "run_id": self.run.run_id,
            "status": self.status,
            "completeness": result.completeness,
            "result_count": result.result_count,
            "inserted": counts.inserted,
            "updated": counts.updated,
            "unchanged": counts.unchanged,
            "skipped_stale": counts.skipped_stale,
            "duplicates": counts.duplicates,
            # Records quarantined in <table>_rejects (invalid_records="quarantine").
            "rejected": counts.rejected,
            # Rows retired (a complete full read did not return them) and superseded (merged or split
            # into other records of a complete result); rows max_retire_fraction kept from retiring.
            "retired": counts.retired,
            "superseded": counts.superseded,
            "retire_withheld": counts.retire_withheld,
            "withheld": counts.withheld,
            # Promoted attribute values of the wrong type stored as NULL (attribute_type_errors="null").
            "attribute_type_errors": getattr(counts, "attribute_type_errors", 0),
            "provisional_records": result.observations.provisional_records,
            # Final records that arrived byte-identical to stored rows and were not decoded.
            "records_known": result.known_records,
            # Times the response stream dropped and was resumed (the read still landed once).
            "stream_resumptions": result.observations.stream_resumptions,
            "source_errors": [
                {"source": f"{e.source.source_type}/{e.source.source_identity}", "code": e.error.code}
                for e in result.source_errors
            ],
            "destination": destination,
        }


def run_status(result: StreamingRead) -> str:
    """The audit status of a validated final result; fails closed.

    An unknown completeness raises; a result that contradicts itself is ``partial`` whatever its
    completeness claims (it cannot be trusted as complete).
    """
    status = KNOWN_COMPLETENESS.get(result.completeness)
    if status is None:
        # A completeness we do not know cannot be trusted as complete.
        raise BosResultError(f"Unknown completeness {result.completeness!r} in the final result.")
    return "partial" if result.contradictions else status


def contradiction_message(result: StreamingRead) -> str | None:
    """The audit row's note naming what a self-contradicting result claimed, or ``None``."""
    if not result.contradictions:
        return None
    return "The final result contradicts itself or cannot be checked, so the run is partial: " + " ".join(
        result.contradictions)


def audit_fields(run: RunInfo, result: StreamingRead, logger: logging.Logger | Any = log) -> dict[str, Any]:
    """Audit fields of a validated final result (status from :func:`run_status`)."""
    # The run is labelled with the context the read asked for (noted by on_context): a result
    # stating another one is a contradiction (the run is partial), never a new label, or a server
    # could file the run, and steer what a full read retires, under another context.
    if result.context is not None and run.context_handle is None:
        run.context_handle = result.context.context_handle
    status = run_status(result)
    for warning in result.warnings:
        logger.warning("BOS final result cross-check: %s", warning)
    return {
        "completeness": result.completeness,
        "status": status,
        "error_message": contradiction_message(result),
        "result_count": result.result_count,
        "source_errors": [e.as_stored() for e in result.source_errors],
        "source_summary": result.observations.summary(),
        "provisional_records": result.observations.provisional_records,
        "provisional_pages": result.observations.pages,
        "observed_at": getattr(result.metadata, "observed_at", None),
    }


def _with_policy_report(audit: dict[str, Any], pii: PolicyRun | None, logger: Any) -> dict[str, Any]:
    """``audit`` with the policy's report (what each rule met in the records decoded) noted, and logged;
    a rule that met nothing is warned about: it names a path the records do not have."""
    if pii is None:
        return audit
    report = pii.rule_report()
    unmatched = pii.plan.records and not all(pii.plan.matched.values())
    (logger.warning if unmatched else logger.info)("BOS personal-data policy: %s", report)
    note = audit.get("notes")
    return {**audit, "notes": f"{note} {report}" if note else report}


def failure_message(exc: BaseException) -> str:
    """The audit row's error text: the error type and a bounded, secret-scrubbed message."""
    if isinstance(exc, (KeyboardInterrupt, SystemExit)):
        return f"{type(exc).__name__}: the task was interrupted"
    limit = 2000 if isinstance(exc, BosError) else 500
    text = str(exc)
    # Redacted before the cut: a secret across it is taken whole, so no prefix of it survives
    # (the masker and redact() match whole secrets only).
    shown = redacted_prefix(text, limit)
    cut = "…" if len(redact(text)) > len(shown) else ""
    return f"{type(exc).__name__}: {shown}{cut}"


def _audit_failure(
    writer: RecordSink, run: RunInfo, exc: BaseException, result: StreamingRead | None, logger: Any,
) -> None:
    """Write the ``failed`` audit row; never let a failure to audit hide the original error."""
    # A read that failed before its result carries what it observed (BosError.observations).
    observations: ReadObservations | None = (
        result.observations if result is not None else getattr(exc, "observations", None)
    )
    try:
        writer.record_failure(
            run,
            error=failure_message(exc),
            source_summary=observations.summary() if observations is not None else [],
            provisional_records=observations.provisional_records if observations is not None else 0,
            provisional_pages=observations.pages if observations is not None else 0,
        )
    except Exception as audit_exc:  # noqa: BLE001 - the database may be what failed; logged, the read's error raised
        logger.error("Could not write the failed audit row for run %s: %s", run.run_id, audit_exc)


@contextlib.contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the duration of a sync.

    A sync allocates millions of short-lived containers (every decoded page and record), which
    keeps triggering collections that rescan every live object of the task process (Airflow's
    included); the containers are acyclic and freed by reference counting anyway. Measured: half
    the time of decoding the records. The collector's previous state is restored on exit.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextlib.contextmanager
def _known_wire_hashes(writer: RecordSink) -> Iterator[Future[KnownWireHashes]]:
    """The writer's stored wire hashes, loaded on a thread while the read starts.

    The load is a query of its own (a fraction of a second per 200k stored rows); the read's
    handshake and page notifications come first anyway, so it costs the sync no time. Leaving
    waits for the load, so no connection outlives the sync.
    """
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="bos-known-records") as pool:
        yield pool.submit(writer.known_wire_hashes)


def run_sync(
    read: FederatedRead,
    writer: RecordSink,
    run: RunInfo,
    *,
    tool_name: str,
    arguments: dict[str, Any],
    logger: logging.Logger | Any = log,
    invalid_records: str = "fail",
    reconcile: ReconcileOptions | None = None,
    pii: PolicyRun | None = None,
    attribute_columns: AttributeColumns | None = None,
    coverage_columns: tuple[str, ...] = (),
    **read_options: Any,
) -> SyncOutcome:
    """Read ``tool_name`` and land its final records with ``writer`` in one transaction.

    ``read_options`` go to ``read`` (context_handle, via, stream, on_progress, deadline_s), with
    ``on_context`` (notes the read's context on ``run`` as soon as it is known). On any
    failure the records table is untouched, a ``failed`` audit row is written, and the error is
    re-raised. ``invalid_records``: ``"fail"`` or ``"quarantine"`` (see :class:`~..wire.WriteOptions`);
    a run that quarantined records is ``partial``. ``reconcile``: sync mode, scope, deletions, the
    retire guard and history (:class:`~..wire.ReconcileOptions`; default: incremental); a run whose
    retirements the guard withheld is ``partial``. ``pii``: the run's personal-data policy with its
    key (:class:`~.pii.stream.PolicyRun`; None: no policy): the table must have been written under
    the same one (checked before the read), and every record is stored as the policy says, with
    keyed wire hashes (:mod:`airflow_provider_bos.pii.stream`). ``attribute_columns``: chosen
    ``attributes`` paths kept as typed columns of the records table
    (:mod:`~.warehouse.tables.attribute_columns`; None: none). ``coverage_columns``: columns of the records
    table whose coverage the audit row records besides ``display_name``, ``email``, ``phone`` and
    the promoted columns.
    """
    result: StreamingRead | None = None
    fingerprint = pii.fingerprint if pii is not None else None
    try:
        # Before any request to BOS: a table written under another policy (or key) is never read for.
        writer.require_pii_policy(fingerprint)
        with cyclic_gc_paused(), _known_wire_hashes(writer) as known:
            # The context is noted on the run as soon as the read knows it: a read that fails
            # before its final result is then audited under it (a sensor watching that context
            # sees the failure).
            streaming: StreamingRead = read(tool_name, arguments, stream_records=True,
                                            on_context=lambda handle: setattr(run, "context_handle", handle),
                                            **read_options)
            result = streaming
            # Records arriving byte-identical to stored ones are not decoded (the writer verifies
            # each such claim in SQL before it counts the record unchanged).
            hashes = known.result()  # always awaited: the load must not overlap the write
            # Under a policy the stored hashes are keyed: the read matches through the key.
            keyed = pii.known_wire_hashes(hashes) if pii is not None else None
            matcher: KnownWireHashes | None = hashes if pii is None else keyed
            # The writer confirms the claims against the same hashes the read matched them in.
            matched = hashes if matcher is not None and streaming.use_known_wire_hashes(matcher) else None
            # The final records flow straight from the response into staging; the audit fields
            # exist only once the frame is complete and validated, so the writer asks for them
            # then, inside the same transaction (an error there rolls everything back).
            with streaming:
                def audit() -> dict[str, Any]:
                    return _with_policy_report(audit_fields(run, streaming, logger), pii, logger)

                options = WriteOptions(audit=audit, known=matched,
                                       invalid_records=invalid_records, reconcile=reconcile or ReconcileOptions(),
                                       pii=fingerprint, attribute_columns=attribute_columns,
                                       coverage_columns=coverage_columns)
                records = streaming.records
                if pii is not None:  # applied before the writer: nothing raw is staged or stored
                    records = pii.stored_records(records, keyed if matched is not None else None)
                counts = writer.write_run(run, records, options)
    except BaseException as exc:
        _audit_failure(writer, run, exc, result, logger)
        raise
    status = "partial" if counts.rejected or counts.retire_withheld else run_status(streaming)
    return SyncOutcome(run=run, result=streaming, counts=counts, status=status)
