"""Live progress of a streamed read: per-source log lines from source-result notifications.

Pages are provisional observations; they are logged and counted here and never written anywhere.
"""

from __future__ import annotations

import logging
from typing import Any


class ProgressLogger:
    """``on_progress`` callback that logs each notification as one line per source event."""

    def __init__(self, log: logging.Logger | Any) -> None:
        self.log = log
        self.notifications = 0

    def __call__(self, progress: Any) -> None:
        # Only the source's snapshot and the page's record count: reading ``progress.notification``
        # would decode every provisional record just to log a line.
        self.notifications += 1
        stats = progress.stats
        source = f"{stats.source.source_type}/{stats.source.source_identity}"
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
