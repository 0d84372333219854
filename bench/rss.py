"""Peak resident memory of the current process."""

from __future__ import annotations

import resource
import sys

__all__ = ["peak_rss_mib"]


def peak_rss_mib() -> float:
    """Peak RSS (VmHWM) of this process in MiB; falls back to ``getrusage`` off Linux."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0  # kB
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024.0 * 1024.0) if sys.platform == "darwin" else peak / 1024.0  # bytes on macOS, kB elsewhere
