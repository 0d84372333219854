"""Secret registration without importing Airflow.

The protocol core calls :func:`register_secret` the moment it reads or mints a secret (token, key,
code, verifier). The Airflow adapters install a sink that forwards to Airflow's secrets masker, so
the core stays free of Airflow imports while every secret still reaches the masker.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["register_secret", "add_secret_sink", "known_secret_count", "redact", "redacted_prefix", "longest_secret",
           "printable"]

_lock = threading.Lock()
_sinks: list[Callable[[str], None]] = []
_pending: set[str] = set()  # secrets seen before any sink was installed


def add_secret_sink(sink: Callable[[str], None]) -> None:
    """Install a sink (e.g. Airflow's ``mask_secret``); it receives every secret seen so far."""
    with _lock:
        if sink in _sinks:
            return
        _sinks.append(sink)
        backlog = list(_pending)
    for secret in backlog:
        sink(secret)


def register_secret(value: str | None) -> None:
    """Tell every sink that ``value`` is a secret. Short or empty values are ignored."""
    if not value or len(value) < 6:
        return
    with _lock:
        _pending.add(value)
        sinks = list(_sinks)
    for sink in sinks:
        sink(value)


def known_secret_count() -> int:
    with _lock:
        return len(_pending)


def longest_secret() -> int:
    """The length of the longest registered secret (0 when none)."""
    with _lock:
        return max(map(len, _pending), default=0)


def redact(text: str) -> str:
    """``text`` with every registered secret replaced by ``***`` (for messages that get stored)."""
    with _lock:
        secrets = sorted(_pending, key=len, reverse=True)
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, "***")
    return text


def redacted_prefix(text: str, length: int) -> str:
    """The first ``length`` characters of ``text``, redacted, for a scan window over a large body.

    A secret that crosses the cut is taken whole (and so redacted) instead of being cut: a cut
    first would leave a prefix that :func:`redact`, which matches whole secrets, no longer sees.
    """
    with _lock:
        secrets = sorted(_pending, key=len, reverse=True)
    end = min(length, len(text))
    moved = end < len(text)
    while moved:  # a secret taken whole may end across another one: extend until none crosses
        moved = False
        for secret in secrets:
            start = text.find(secret, max(0, end - len(secret) + 1), end + len(secret) - 1)
            if start != -1 and start < end < start + len(secret):
                end, moved = start + len(secret), True
    return redact(text[:end])


def _escape(char: str) -> str:
    return char if char.isprintable() else char.encode("unicode_escape").decode("ascii")


def printable(text: str, *, limit: int | None = None) -> str:
    """Server-supplied ``text`` made safe to show: secrets redacted, control and format characters
    escaped (``\\x1b``, ``\\u202e``; no terminal escapes or forged log lines), then cut to ``limit``.

    Redaction comes first: cutting first could leave a token's prefix that the masker, which
    matches whole secrets, no longer recognises.
    """
    text = "".join(_escape(char) for char in redact(text))
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return text
