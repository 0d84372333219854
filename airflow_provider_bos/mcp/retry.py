"""Bounded retries for MCP requests (tenacity): connect errors, 429 and 502/503/504.

A request is retried only while nothing of its response has been consumed; once the server
answered 2xx, failures are final (a stream that broke is a
:class:`~airflow_provider_bos.exceptions.BosIncompleteStreamError`, re-run by the caller).
Attempts AND total time are bounded; ``Retry-After`` (seconds or an HTTP-date) is honoured, and a
wait that would overrun the budget or the operation deadline ends the retries instead.
"""

from __future__ import annotations

import email.utils
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC
from typing import TypeVar

import tenacity
import tenacity.stop

from airflow_provider_bos.exceptions import BosError, BosRetryableHttpError, BosTransportError

__all__ = ["RetryPolicy", "parse_retry_after", "is_retryable", "run_with_retries", "RetryableTransportError"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to retry: at most ``attempts`` tries within ``max_total_s`` seconds.

    Without ``Retry-After`` the wait is exponential with full jitter:
    ``uniform(0, min(backoff_max_s, backoff_base_s * 2 ** (attempt - 1)))``.
    """

    attempts: int = 5
    max_total_s: float = 60.0
    backoff_base_s: float = 0.5
    backoff_max_s: float = 10.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("RetryPolicy.attempts must be at least 1")
        if self.max_total_s < 0 or self.backoff_base_s < 0 or self.backoff_max_s < 0:
            raise ValueError("RetryPolicy times must not be negative")


class RetryableTransportError(BosTransportError):
    """The request never reached a response (connect failure, connection closed before any byte)."""


def is_retryable(exc: BaseException) -> bool:
    return isinstance(exc, (BosRetryableHttpError, RetryableTransportError))


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP-date); ``None`` if absent/bad."""
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        current = now if now is not None else time.time()
        return max(0.0, when.timestamp() - current)
    if seconds != seconds or seconds in (float("inf"), float("-inf")):  # NaN / inf
        return None
    return max(0.0, seconds)


def _backoff(policy: RetryPolicy, attempt: int) -> float:
    ceiling = min(policy.backoff_max_s, policy.backoff_base_s * (2 ** (attempt - 1)))
    return random.uniform(0, ceiling)  # noqa: S311 - backoff jitter, not a secret


class _PastDeadline(tenacity.stop.stop_base):
    """Stop when the next wait would cross ``deadline`` (a :func:`time.monotonic` instant; None: never)."""

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        return self.deadline is not None and time.monotonic() + retry_state.upcoming_sleep >= self.deadline


def run_with_retries(
    fn: Callable[[], T],
    policy: RetryPolicy,
    *,
    deadline: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    describe: str = "request",
) -> T:
    """Call ``fn`` until it succeeds, raises a non-retryable error, or the policy is exhausted.

    ``deadline`` is a :func:`time.monotonic` instant no wait may cross. On exhaustion the last
    error is re-raised with a message saying how many attempts were made.
    """

    def wait(rs: tenacity.RetryCallState) -> float:
        exc = rs.outcome.exception() if rs.outcome else None
        retry_after = getattr(exc, "retry_after", None)
        return retry_after if retry_after is not None else _backoff(policy, rs.attempt_number)

    past_deadline = _PastDeadline(deadline)

    def before_sleep(rs: tenacity.RetryCallState) -> None:
        exc = rs.outcome.exception() if rs.outcome else None
        logger.info(
            "BOS %s failed (%s); retry %d/%d in %.2fs.",
            describe,
            _short(exc),
            rs.attempt_number,
            policy.attempts - 1,
            rs.upcoming_sleep,
        )

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception(is_retryable),
        stop=(
            tenacity.stop_after_attempt(policy.attempts)
            | tenacity.stop_before_delay(policy.max_total_s)
            | past_deadline
        ),
        wait=wait,
        sleep=sleep,
        before_sleep=before_sleep,
        reraise=False,
    )
    start = time.monotonic()
    try:
        return retrying(fn)
    except tenacity.RetryError as exhausted:
        last = exhausted.last_attempt.exception()
        attempts = exhausted.last_attempt.attempt_number
        assert isinstance(last, BosError)
        raise _exhausted(last, attempts, time.monotonic() - start) from last


def _short(exc: BaseException | None) -> str:
    status = getattr(exc, "status_code", None)
    return f"HTTP {status}" if status else type(exc).__name__


def _exhausted(last: BosError, attempts: int, elapsed: float) -> BosError:
    prefix = f"Gave up after {attempts} attempt{'s' if attempts != 1 else ''} in {elapsed:.1f}s"
    if isinstance(last, BosRetryableHttpError):
        err: BosError = BosRetryableHttpError(f"{prefix}; last error: {last}", retry_after=last.retry_after)
        for name in ("status_code", "content_type", "body_excerpt", "url"):
            setattr(err, name, getattr(last, name))
        return err
    return RetryableTransportError(f"{prefix}; last error: {last}")
