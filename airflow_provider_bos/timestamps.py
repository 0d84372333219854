"""ISO 8601 observation times as aware UTC datetimes: the one parse the read and the warehouse share."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import lru_cache

__all__ = ["parse_timestamp"]


@lru_cache(maxsize=4096)  # a result shares a few observation times: each is parsed once
def _parse_timestamp_cached(text: str) -> datetime:
    parsed = datetime.fromisoformat(text.strip())
    if parsed.tzinfo is None:  # a timestamp without offset is taken as UTC
        return parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def parse_timestamp(value: str | datetime) -> datetime:
    """Parse an ISO 8601 timestamp (``Z`` or offset; naive means UTC) into an aware UTC datetime.

    :raises ValueError: if the text is not an ISO 8601 timestamp.
    """
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    if not isinstance(value, str):
        raise ValueError(f"not a timestamp: {type(value).__name__}")
    return _parse_timestamp_cached(value)
