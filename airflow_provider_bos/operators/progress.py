"""Live progress of a streamed read: per-source log lines from source-result notifications.

Pages are provisional observations; they are logged and counted here and never written anywhere.
Source names are the server's: they are logged escaped (:func:`~airflow_provider_bos.mcp.source_results.source_label`),
so a name cannot forge a log line or send terminal escapes. Sources beyond the tracker's bound get
one line saying so, not one line each.
"""

from __future__ import annotations

import logging
from typing import Any

from airflow_provider_bos.mcp.source_results import MAX_TRACKED_SOURCES, source_label


class ProgressLogger:
    """``on_progress`` callback that logs each notification as one line per source event."""

    def __init__(self, log: logging.Logger | Any) -> None:
        self.log = log
        self.notifications = 0
        self._told_untracked = False

    def __call__(self, progress: Any) -> None:
        # Only the source's snapshot and the page's record count: reading ``progress.notification``
        # would decode every provisional record just to log a line.
        self.notifications += 1
        stats = progress.stats
        if not getattr(progress, "tracked", True):
            if not self._told_untracked:
                self._told_untracked = True
                self.log.warning(
                    "BOS progress: the server named more sources than the %d this task tracks; the "
                    "sources beyond are counted, not logged, and the run cannot be audited complete.",
                    MAX_TRACKED_SOURCES,
                )
            return
        source = source_label(stats.source.source_type, stats.source.source_identity)
        if stats.status == "running":  # a page
            self.log.info(
                "BOS progress: %s page %d (+%d provisional records, %d so far)",
                source, stats.last_page_index, progress.page_records, stats.records,
            )
        elif stats.status == "complete":
            self.log.info(
                "BOS progress: %s complete after %d page(s), %d provisional records",
                source, stats.pages, stats.records,
            )
        else:
            self.log.warning(
                "BOS progress: %s ERROR %s after %d page(s), %d provisional records",
                source, stats.error_code or "unknown", stats.pages, stats.records,
            )
