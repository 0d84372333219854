"""A built SQL statement: text in the driver's paramstyle and its positional parameters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Statement"]


@dataclass(frozen=True, slots=True)
class Statement:
    """SQL text in the driver's paramstyle plus its positional parameters."""

    sql: str
    params: tuple[Any, ...] = ()
