"""Secret registration without importing Airflow.

The protocol core calls :func:`register_secret` the moment it reads or mints a secret (token, key,
code, verifier). The Airflow adapters install a sink that forwards to Airflow's secrets masker, so
the core stays free of Airflow imports while every secret still reaches the masker.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable

__all__ = [
    "MAX_SECRETS", "add_secret_sink", "known_secret_count", "longest_secret", "printable", "redact",
    "redacted_prefix", "register_secret",
]

# Sinks such as Airflow's masker keep every value forever and recompile one pattern over all of
# them per new value: a long-lived process (the API server) must not feed them without bound.
MAX_SECRETS = 1000

_log = logging.getLogger(__name__)
_lock = threading.Lock()
_sinks: list[Callable[[str], None]] = []
_known: OrderedDict[str, None] = OrderedDict()  # the most recent MAX_SECRETS values, for redact()
_forwarded = 0  # distinct values sent to the sinks, at most MAX_SECRETS
_warned = False


def add_secret_sink(sink: Callable[[str], None]) -> None:
    """Install a sink (e.g. Airflow's ``mask_secret``); it receives every secret seen so far."""
    with _lock:
        if sink in _sinks:
            return
        _sinks.append(sink)
        backlog = list(_known)
    for secret in backlog:
        sink(secret)


def register_secret(value: str | None) -> None:
    """Tell every sink that ``value`` is a secret. Short or empty values are ignored.

    At most :data:`MAX_SECRETS` distinct values per process reach the sinks; past that, only the
    most recent ones are kept for :func:`redact`, and one warning says so.
    """
    global _forwarded, _warned  # noqa: PLW0603 - process-wide bound shared by every caller, under _lock
    if not value or len(value) < 6:
        return
    with _lock:
        if value in _known:
            _known.move_to_end(value)
            return
        _known[value] = None
        if len(_known) > MAX_SECRETS:
            _known.popitem(last=False)
        forward = _forwarded < MAX_SECRETS
        _forwarded += forward
        sinks = list(_sinks) if forward else []
        warn = not forward and not _warned
        _warned = _warned or warn
    for sink in sinks:
        sink(value)
    if warn:
        _log.warning(
            "airflow-provider-bos registered more than %d secrets in this process; later ones are no "
            "longer sent to Airflow's secrets masker (restart long-running processes to reset).",
            MAX_SECRETS,
        )


def known_secret_count() -> int:
    with _lock:
        return len(_known)


def longest_secret() -> int:
    """The length of the longest registered secret (0 when none)."""
    with _lock:
        return max(map(len, _known), default=0)


def redact(text: str) -> str:
    """``text`` with every registered secret replaced by ``***`` (for messages that get stored)."""
    with _lock:
        secrets = sorted(_known, key=len, reverse=True)
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
        secrets = sorted(_known, key=len, reverse=True)
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
