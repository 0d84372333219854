"""Quarantine: records the table cannot store, kept in ``<table>_rejects`` instead of failing the run.

With ``invalid_records="quarantine"`` the loads hand a record that fails its encoding check
(:func:`~.records._checked` / :func:`~.records.record_to_row`: an over-long ``record_ref``, a
non-finite number, a field of the wrong shape) to :class:`Rejects` instead of raising; the writer
inserts them in the run's transaction, counts them, and the run becomes ``partial``. With
``"fail"`` (the default) the first such record rolls the whole run back, as before.

Under a personal-data policy (``keep_records=False``) a row holds only the ref and a reason that
quotes no value of the record (``record`` is empty): the policy is about what is stored, and a
record that failed its check may not have been through it the way a stored one is. Without a
policy the rows hold the record (its personal data) and its ref; the run's audit note counts them and gives
the first reasons without the refs (:meth:`Rejects.note`), so an erasure, which deletes the rows by
ref, leaves nothing of the person in the audit table.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from airflow_provider_bos.exceptions import BosWarehouseError
from airflow_provider_bos.warehouse.run.audit import without_refs

__all__ = ["MAX_REJECT_BYTES", "Rejects", "record_bytes"]

#: A quarantined record's bytes are kept up to this size (64 KiB); longer ones are cut, ``truncated`` set.
MAX_REJECT_BYTES = 64 * 1024
_REASON_MAX = 2000
_NOTE_REASONS = 3


def record_bytes(record: Any) -> bytes:
    """The record as JSON bytes, whatever it holds (NaN, odd types): what the rejects table keeps."""
    data = record
    if not isinstance(record, Mapping):
        dump = getattr(record, "model_dump", None)
        data = dump(mode="python") if dump is not None else record
    try:
        text = _as_text(data)
    except RecursionError:  # nested deeper than any encoder follows: the reason says so, no bytes kept
        return b""
    return text.encode("utf-8", errors="backslashreplace")


def _as_text(data: Any) -> str:
    try:
        return json.dumps(data, ensure_ascii=False, default=repr, allow_nan=True, sort_keys=True)
    except (TypeError, ValueError):  # e.g. keys of mixed types, which cannot be sorted: still JSON, unsorted
        try:
            return json.dumps(data, ensure_ascii=False, default=repr, allow_nan=True)
        except (TypeError, ValueError):  # e.g. a key that is no string, number or bool
            return repr(data)


class Rejects:
    """The records one run quarantined, as rows of ``<table>_rejects`` (held until the run's commit)."""

    def __init__(self, *, keep_records: bool = True) -> None:
        self.keep_records = keep_records
        self.rows: list[dict[str, Any]] = []
        self._reasons: list[str] = []  # the note's: the first few, without their refs

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, record: Any, error: BosWarehouseError) -> None:
        """Keep ``record``, refused with ``error``, for the rejects table."""
        get = getattr(record, "get", None)
        ref = get("record_ref") if get is not None else getattr(record, "record_ref", None)
        data = record_bytes(record) if self.keep_records else b""
        reason = (str(error) if self.keep_records else getattr(error, "without_values", str(error)))[:_REASON_MAX]
        self.rows.append({
            "record_ref": ref if isinstance(ref, str) else None,
            "reason": reason,
            "record": data[:MAX_REJECT_BYTES],
            "truncated": len(data) > MAX_REJECT_BYTES,
        })
        if len(self._reasons) < _NOTE_REASONS:
            # The ref out before the cut: a cut inside a long ref would leave its start.
            self._reasons.append(without_refs(reason, [ref] if isinstance(ref, str) else [], "<record_ref>")[:200])

    def table_rows(self, run_id: str, rejected_at: datetime) -> list[dict[str, Any]]:
        return [{**row, "run_id": run_id, "rejected_at": rejected_at} for row in self.rows]

    def note(self, table: str) -> str:
        """The audit row's note: how many records were quarantined, where, and the first reasons.

        It names no record: the audit row outlives an erasure (which deletes the rejects rows, each
        with its ref and full reason), and the sensor's verdicts and alerts repeat it.
        """
        reasons = "; ".join(self._reasons)
        more = f" (and {len(self.rows) - len(self._reasons)} more)" if len(self.rows) > len(self._reasons) else ""
        return f"{len(self.rows)} record(s) quarantined in {table}: {reasons}{more}"
