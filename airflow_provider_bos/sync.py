"""One BOS sync, without Airflow: streamed read -> staged upsert + audit row -> outcome.

The operator and the benchmark both run this, so what is measured is what ships. The read is any
callable with ``McpSession.federated_read``'s signature (the session itself, or ``BosHook``'s).
"""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from airflow_provider_bos.exceptions import BosError, BosResultError
from airflow_provider_bos.redaction import redact

__all__ = ["KNOWN_COMPLETENESS", "SyncOutcome", "cyclic_gc_paused", "run_sync", "failure_message"]

log = logging.getLogger(__name__)

# completeness -> audit status; anything else fails closed.
KNOWN_COMPLETENESS = {"complete": "complete", "partial": "partial"}


@dataclass
class SyncOutcome:
    run: Any  # SyncRunInfo
    result: Any  # FinalResult, fully consumed
    counts: Any  # UpsertCounts
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
            "provisional_records": result.observations.provisional_records,
            # Final records that arrived byte-identical to stored rows and were not decoded.
            "records_known": getattr(result, "known_records", 0),
            "source_errors": [
                {"source": f"{e.source.source_type}/{e.source.source_identity}", "code": e.error.code}
                for e in result.source_errors
            ],
            "destination": destination,
        }


def audit_fields(run: Any, result: Any, logger: logging.Logger | Any = log) -> dict[str, Any]:
    """Audit fields of a validated final result; fails closed on an unknown completeness."""
    if result.context is not None:
        run.context_handle = result.context.context_handle
    status = KNOWN_COMPLETENESS.get(result.completeness)
    if status is None:
        # A completeness we do not know cannot be trusted as complete.
        raise BosResultError(f"Unknown completeness {result.completeness!r} in the final result.")
    for warning in result.warnings:
        logger.warning("BOS final result cross-check: %s", warning)
    return {
        "completeness": result.completeness,
        "status": status,
        "result_count": result.result_count,
        "source_errors": [e.model_dump(mode="json") for e in result.source_errors],
        "source_summary": result.observations.summary(),
        "provisional_records": result.observations.provisional_records,
        "provisional_pages": result.observations.pages,
    }


def failure_message(exc: BaseException) -> str:
    """The audit row's error text: the error type and a bounded, secret-scrubbed message."""
    if isinstance(exc, (KeyboardInterrupt, SystemExit)):
        return f"{type(exc).__name__}: the task was interrupted"
    limit = 2000 if isinstance(exc, BosError) else 500
    return redact(f"{type(exc).__name__}: {str(exc)[:limit]}")


def _audit_failure(writer: Any, run: Any, exc: BaseException, result: Any, logger: Any) -> None:
    """Write the ``failed`` audit row; never let a failure to audit hide the original error."""
    observations = result.observations if result is not None else getattr(exc, "observations", None)
    try:
        writer.record_failure(
            run,
            error=failure_message(exc),
            source_summary=observations.summary() if observations is not None else [],
            provisional_records=getattr(observations, "provisional_records", 0),
            provisional_pages=getattr(observations, "pages", 0),
        )
    except Exception as audit_exc:  # the database may be what failed
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
def _known_wire_hashes(writer: Any) -> Iterator[Future[Any] | None]:
    """The writer's stored wire hashes, loaded on a thread while the read starts (None: no such writer).

    The load is a query of its own (a fraction of a second per 200k stored rows); the read's
    handshake and page notifications come first anyway, so it costs the sync no time. Leaving
    waits for the load, so no connection outlives the sync.
    """
    load = getattr(writer, "known_wire_hashes", None)
    if load is None:
        yield None
        return
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="bos-known-records") as pool:
        yield pool.submit(load)


def run_sync(
    read: Callable[..., Any],
    writer: Any,
    run: Any,
    *,
    tool_name: str,
    arguments: dict[str, Any],
    logger: logging.Logger | Any = log,
    **read_options: Any,
) -> SyncOutcome:
    """Read ``tool_name`` and land its final records with ``writer`` in one transaction.

    ``read_options`` go to ``read`` (context_handle, via, stream, on_progress, deadline_s). On any
    failure the records table is untouched, a ``failed`` audit row is written, and the error is
    re-raised.
    """
    result = None
    try:
        with cyclic_gc_paused(), _known_wire_hashes(writer) as known:
            result = read(tool_name, arguments, stream_records=True, **read_options)
            # Records arriving byte-identical to stored ones are not decoded (the writer verifies
            # each such claim in SQL before it counts the record unchanged).
            matched = None
            if known is not None:
                hashes = known.result()  # always awaited: the load must not overlap the write
                if hasattr(result, "use_known_wire_hashes") and result.use_known_wire_hashes(hashes):
                    matched = hashes  # the writer confirms the claims against the same hashes
            # The final records flow straight from the response into staging; the audit fields
            # exist only once the frame is complete and validated, so the writer asks for them
            # then, inside the same transaction (an error there rolls everything back).
            with result:
                options = {"known": matched} if matched is not None else {}
                counts = writer.write_run(run, result.records, audit=lambda: audit_fields(run, result, logger),
                                          **options)
    except BaseException as exc:
        _audit_failure(writer, run, exc, result, logger)
        raise
    return SyncOutcome(run=run, result=result, counts=counts, status=KNOWN_COMPLETENESS[result.completeness])
