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
        self.notifications += 1
        note = progress.notification
        stats = progress.stats
        source = f"{note.source.source_type}/{note.source.source_identity}"
        if note.status == "page":
            self.log.info(
                "BOS progress: %s page %d (+%d provisional records, %d so far)",
                source, note.pageIndex, len(note.records), stats.records,
            )
        elif note.status == "complete":
            self.log.info(
                "BOS progress: %s complete after %d page(s), %d provisional records",
                source, stats.pages, stats.records,
            )
        else:
            code = note.error.code if note.error else "unknown"
            self.log.warning(
                "BOS progress: %s ERROR %s after %d page(s), %d provisional records",
                source, code, stats.pages, stats.records,
            )
