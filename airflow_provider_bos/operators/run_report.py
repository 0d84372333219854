"""What a sync task's log ends with: one line per source and the totals, as an on-call engineer reads it.

Source names and counts only (the source pairs BOS names, pages, records, status, error code): no
record value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow_provider_bos.redaction import printable

__all__ = ["source_report"]


def _source_line(source: Mapping[str, Any]) -> str:
    name = printable(f"{source.get('source_type')}/{source.get('source_identity')}", limit=120)
    pages, records = source.get("pages") or 0, source.get("records") or 0
    status = str(source.get("status") or "unknown")
    code = source.get("error_code")
    ended = f"{status} ({printable(str(code), limit=64)})" if code else status
    return f"  {name}: {ended}, {pages} page(s), {records} record(s)"


def source_report(summary: Mapping[str, Any], sources: Sequence[Mapping[str, Any]]) -> list[str]:
    """The per-source lines (``sources``: the read's per-source statistics) and the totals of a
    sync's ``summary`` (the task's XCom summary)."""
    failing = [s for s in sources if s.get("error_code")]
    pages = sum(s.get("pages") or 0 for s in sources)
    lines = ["Sources:", *(_source_line(s) for s in sources)] if sources else ["Sources: none reported pages."]
    lines.append(
        f"Totals: {len(sources)} source(s), {len(failing)} failing, {pages} page(s), "
        f"{summary.get('provisional_records') or 0} provisional record(s); {summary.get('result_count')} final "
        f"record(s), status {summary.get('status')}: inserted {summary.get('inserted')}, updated "
        f"{summary.get('updated')}, unchanged {summary.get('unchanged')}, retired {summary.get('retired')}, "
        f"superseded {summary.get('superseded')}, rejected {summary.get('rejected')}.")
    return lines
