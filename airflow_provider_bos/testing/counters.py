"""The reference server's event counters: what a test waits on and asserts (refreshes, tool calls...).

The server's parts (:mod:`.oauth`, :mod:`.mcp_app`) increment them from the server's threads; a
test reads the int attributes, takes a :meth:`ServerCounters.snapshot`, or waits for a count.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields

__all__ = ["ServerCounters"]


@dataclass
class ServerCounters:
    """Thread-safe event counters for tests. Read the int attributes; the server increments them."""

    refreshes: int = 0
    refresh_reuse_detected: int = 0
    grants_revoked: int = 0
    tool_calls: int = 0
    streamed_calls: int = 0
    cancelled_calls: int = 0
    completed_streams: int = 0
    resumed_streams: int = 0
    primed_streams: int = 0
    initializes: int = 0
    sessions_deleted: int = 0
    unauthorized: int = 0
    discover_calls: int = 0
    _cond: threading.Condition = field(default_factory=threading.Condition, repr=False, compare=False)

    def incr(self, name: str, n: int = 1) -> None:
        with self._cond:
            setattr(self, name, getattr(self, name) + n)
            self._cond.notify_all()

    def snapshot(self) -> dict[str, int]:
        with self._cond:
            return {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}

    def wait_until(self, name: str, n: int, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: getattr(self, name) >= n, timeout=timeout)
