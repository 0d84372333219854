"""Peak resident memory of the current process."""

from __future__ import annotations

import resource
import sys

__all__ = ["peak_rss_mib", "reset_peak_rss", "rss_mib"]


def _status_mib(field: str) -> float | None:
    """A memory figure of ``/proc/self/status`` in MiB (None off Linux)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0  # kB
    except OSError:
        pass
    return None


def peak_rss_mib() -> float:
    """Peak RSS (VmHWM) of this process in MiB; falls back to ``getrusage`` off Linux."""
    peak = _status_mib("VmHWM")
    if peak is not None:
        return peak
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss / (1024.0 * 1024.0) if sys.platform == "darwin" else maxrss / 1024.0  # bytes on macOS, kB elsewhere


def rss_mib() -> float | None:
    """Current RSS (VmRSS) of this process in MiB (None off Linux)."""
    return _status_mib("VmRSS")


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS to its current RSS (Linux ``clear_refs``); False where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as clear:
            clear.write("5")
    except OSError:
        return False
    return True
