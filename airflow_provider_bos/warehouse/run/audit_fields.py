"""A run's audit row fields as the writer takes them (``WriteOptions.audit``) and adds notes to them."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from airflow_provider_bos.exceptions import BosWarehouseError
from airflow_provider_bos.warehouse.run.audit import RUN_STATUSES

__all__ = ["audit_row_fields", "partial_with", "with_note", "with_rehash_note"]

log = logging.getLogger(__name__)

# The audit row's fields a run supplies (WriteOptions.audit); the rest are the writer's.
AUDIT_FIELDS = {
    "status": None,
    "completeness": None,
    "result_count": None,
    "source_errors": None,
    "source_summary": None,
    "provisional_records": 0,
    "provisional_pages": 0,
    "error_message": None,  # why a run is partial, e.g. what a self-contradicting result claimed
    "notes": None,  # what the run says for information (the status stays)
    "observed_at": None,  # the read's metadata.observed_at: a full read retires no row observed after it
}


def partial_with(audit: dict[str, Any], note: str) -> dict[str, Any]:
    """A run that quarantined records (or left invalid stored values as NULL) is at best ``partial``;
    the note says how many and why."""
    status = "partial" if audit["status"] == "complete" else audit["status"]
    error = f"{audit['error_message']} {note}" if audit["error_message"] else note
    return {**audit, "status": status, "error_message": error}


def with_note(audit: dict[str, Any], note: str) -> dict[str, Any]:
    """The audit row's notes with ``note`` added (the status stays; ``error_message`` is for why a run
    is partial or failed: :func:`partial_with`)."""
    notes = audit.get("notes")
    return {**audit, "notes": f"{notes} {note}" if notes else note}


def with_rehash_note(audit: dict[str, Any], rehashed: int, run_id: str) -> dict[str, Any]:
    """The audit note of a run that re-hashed stored rows once (their hashes covered observation times)."""
    note = (f"Re-hashed {rehashed} rows once: their stored hashes covered provenance observation "
            "times; no content changed.")
    log.info("BOS run %s: %s", run_id, note)
    return with_note(audit, note)


def audit_row_fields(given: Mapping[str, Any]) -> dict[str, Any]:
    """A run's audit fields, defaults filled in; refuses unknown fields and an unknown status."""
    unknown = set(given) - set(AUDIT_FIELDS)
    if unknown:
        raise BosWarehouseError(f"Unknown audit fields {sorted(unknown)}.")
    fields = {**AUDIT_FIELDS, **given}
    if fields["status"] not in RUN_STATUSES:
        raise BosWarehouseError(f"status must be one of {RUN_STATUSES}, not {fields['status']!r}.")
    return fields
